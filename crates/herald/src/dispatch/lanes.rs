//! The dispatcher's in-memory state: one lane per application, a round-robin over the
//! lanes that have work and spare capacity, and a timer heap for retries due soon. Pure
//! data structure, no I/O and no clock: callers pass the time in.
//!
//! Fairness: the next job comes from the next application in the rotation, never from a
//! global "oldest first" queue, and an application at its in-flight cap leaves the
//! rotation until one of its attempts finishes, so a slow endpoint occupies at most its
//! application's cap while every other application keeps going.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use crate::clock::Millis;
use crate::ids::{AppId, EndpointId};
use crate::store::{ClaimedDelivery, Message, Trigger};

/// A delivery held in memory, ready to be attempted.
#[derive(Debug, Clone)]
pub struct Job {
    pub delivery_id: i64,
    pub endpoint_id: EndpointId,
    pub message: Arc<Message>,
    /// Attempts already made in this round.
    pub attempts: u32,
    pub trigger: Trigger,
}

impl Job {
    pub fn app(&self) -> &AppId {
        &self.message.app_id
    }
}

impl From<ClaimedDelivery> for Job {
    fn from(c: ClaimedDelivery) -> Self {
        Self {
            delivery_id: c.delivery_id,
            endpoint_id: c.endpoint_id,
            message: c.message,
            attempts: c.attempts,
            trigger: c.trigger,
        }
    }
}

#[derive(Default)]
struct Lane {
    ready: VecDeque<Job>,
    in_flight: u32,
    /// Whether the application is in the rotation (at most once).
    queued: bool,
}

struct Timer {
    due: Millis,
    seq: u64,
    job: Job,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timer {
    /// Reversed, so the max-heap pops the earliest timer.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

pub struct Lanes {
    lanes: HashMap<AppId, Lane>,
    rotation: VecDeque<AppId>,
    timers: BinaryHeap<Timer>,
    seq: u64,
    app_cap: u32,
    /// Jobs in memory (ready, waiting on a timer, in flight) plus reservations.
    held: usize,
    limit: usize,
}

impl Lanes {
    pub fn new(limit: usize, app_cap: u32) -> Self {
        Self {
            lanes: HashMap::new(),
            rotation: VecDeque::new(),
            timers: BinaryHeap::new(),
            seq: 0,
            app_cap: app_cap.max(1),
            held: 0,
            limit,
        }
    }

    /// Reserves room for `n` jobs about to arrive; false when memory is full (the work
    /// then waits in the database).
    pub fn try_reserve(&mut self, n: usize) -> bool {
        if self.held + n <= self.limit {
            self.held += n;
            true
        } else {
            false
        }
    }

    /// Returns reserved room that will not be used, or room of jobs that left memory.
    pub fn forget(&mut self, n: usize) {
        self.held = self.held.saturating_sub(n);
    }

    pub fn free(&self) -> usize {
        self.limit.saturating_sub(self.held)
    }

    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }

    /// Adds a job (whose room is already reserved) that is due now.
    pub fn add_ready(&mut self, job: Job) {
        let app = job.app().clone();
        self.lanes.entry(app.clone()).or_default().ready.push_back(job);
        self.make_eligible(&app);
    }

    /// Adds a job (whose room is already reserved) that is due at `due`.
    pub fn add_timer(&mut self, job: Job, due: Millis) {
        self.seq += 1;
        self.timers.push(Timer { due, seq: self.seq, job });
    }

    /// Moves every timer due at or before `now` into its lane.
    pub fn promote(&mut self, now: Millis) {
        while self.timers.peek().is_some_and(|t| t.due <= now) {
            let timer = self.timers.pop().expect("peeked");
            self.add_ready(timer.job);
        }
    }

    pub fn next_due(&self) -> Option<Millis> {
        self.timers.peek().map(|t| t.due)
    }

    /// The next job to attempt, chosen round-robin among applications under their cap.
    pub fn pop(&mut self) -> Option<Job> {
        while let Some(app) = self.rotation.pop_front() {
            let cap = self.app_cap;
            let lane = self.lanes.get_mut(&app).expect("queued applications have lanes");
            if lane.in_flight >= cap || lane.ready.is_empty() {
                lane.queued = false;
                continue;
            }
            let job = lane.ready.pop_front().expect("checked non-empty");
            lane.in_flight += 1;
            if !lane.ready.is_empty() && lane.in_flight < cap {
                self.rotation.push_back(app);
            } else {
                lane.queued = false;
            }
            return Some(job);
        }
        None
    }

    /// An attempt of `app` finished (its slot is free again).
    pub fn finished(&mut self, app: &AppId) {
        if let Some(lane) = self.lanes.get_mut(app) {
            lane.in_flight = lane.in_flight.saturating_sub(1);
            self.make_eligible(app);
        }
    }

    /// Attempts in flight for `app`.
    #[cfg(test)]
    pub fn in_flight(&self, app: &AppId) -> u32 {
        self.lanes.get(app).map_or(0, |l| l.in_flight)
    }

    /// Removes every job that is waiting (ready or on a timer), e.g. to release them at
    /// shutdown. In-flight jobs stay accounted until they finish.
    pub fn drain_waiting(&mut self) -> Vec<Job> {
        let mut jobs: Vec<Job> = self.timers.drain().map(|t| t.job).collect();
        for lane in self.lanes.values_mut() {
            jobs.extend(lane.ready.drain(..));
            lane.queued = false;
        }
        self.rotation.clear();
        self.held = self.held.saturating_sub(jobs.len());
        jobs
    }

    fn make_eligible(&mut self, app: &AppId) {
        let cap = self.app_cap;
        let Some(lane) = self.lanes.get_mut(app) else {
            return;
        };
        if !lane.queued && !lane.ready.is_empty() && lane.in_flight < cap {
            lane.queued = true;
            self.rotation.push_back(app.clone());
        } else if !lane.queued && lane.ready.is_empty() && lane.in_flight == 0 {
            self.lanes.remove(app);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MessageId;

    fn job(app: &AppId, n: i64) -> Job {
        Job {
            delivery_id: n,
            endpoint_id: EndpointId::from_trusted("ep_test".into()),
            message: Arc::new(Message {
                id: MessageId::generate(),
                app_id: app.clone(),
                event_type: "t".into(),
                event_id: None,
                channels: None,
                payload: Some("{}".into()),
                created_at: 0,
            }),
            attempts: 0,
            trigger: Trigger::Scheduled,
        }
    }

    fn lanes_with(apps: &[(&AppId, i64)], cap: u32) -> Lanes {
        let mut lanes = Lanes::new(10_000, cap);
        for (app, count) in apps {
            for n in 0..*count {
                assert!(lanes.try_reserve(1));
                lanes.add_ready(job(app, n));
            }
        }
        lanes
    }

    #[test]
    fn applications_take_turns_instead_of_oldest_first() {
        let (a, b) = (AppId::generate(), AppId::generate());
        let mut lanes = lanes_with(&[(&a, 5), (&b, 2)], 100);
        let order: Vec<AppId> = std::iter::from_fn(|| lanes.pop()).map(|j| j.app().clone()).collect();
        assert_eq!(order, vec![a.clone(), b.clone(), a.clone(), b.clone(), a.clone(), a.clone(), a]);
    }

    #[test]
    fn an_application_at_its_cap_is_skipped_not_waited_on() {
        let (slow, fast) = (AppId::generate(), AppId::generate());
        let mut lanes = lanes_with(&[(&slow, 10), (&fast, 3)], 2);
        let mut taken = vec![];
        while let Some(j) = lanes.pop() {
            taken.push(j.app().clone());
        }
        assert_eq!(taken.iter().filter(|a| **a == slow).count(), 2, "slow app stops at its cap");
        assert_eq!(taken.iter().filter(|a| **a == fast).count(), 2, "fast app also capped at 2");
        assert_eq!(lanes.in_flight(&slow), 2);
        lanes.finished(&fast);
        assert_eq!(lanes.pop().unwrap().app(), &fast, "a finished slot lets the app back in");
        lanes.finished(&slow);
        assert_eq!(lanes.pop().unwrap().app(), &slow);
        assert!(lanes.pop().is_none());
    }

    #[test]
    fn timers_release_jobs_only_when_due() {
        let app = AppId::generate();
        let mut lanes = Lanes::new(10, 4);
        assert!(lanes.try_reserve(2));
        lanes.add_timer(job(&app, 1), 200);
        lanes.add_timer(job(&app, 2), 100);
        assert_eq!(lanes.next_due(), Some(100));
        lanes.promote(99);
        assert!(lanes.pop().is_none());
        lanes.promote(150);
        assert_eq!(lanes.pop().unwrap().delivery_id, 2);
        lanes.promote(200);
        assert_eq!(lanes.pop().unwrap().delivery_id, 1);
        assert_eq!(lanes.next_due(), None);
    }

    #[test]
    fn reservations_bound_memory() {
        let mut lanes = Lanes::new(3, 4);
        assert!(lanes.try_reserve(2));
        assert!(!lanes.try_reserve(2));
        assert!(lanes.try_reserve(1));
        assert_eq!(lanes.free(), 0);
        lanes.forget(3);
        assert_eq!(lanes.free(), 3);
    }

    #[test]
    fn draining_returns_every_waiting_job_and_their_room() {
        let app = AppId::generate();
        let mut lanes = lanes_with(&[(&app, 3)], 1);
        assert!(lanes.try_reserve(1));
        lanes.add_timer(job(&app, 9), 1_000);
        let in_flight = lanes.pop().unwrap();
        let drained = lanes.drain_waiting();
        assert_eq!(drained.len(), 3);
        assert!(drained.iter().all(|j| j.delivery_id != in_flight.delivery_id));
        assert_eq!(lanes.held(), 1, "the in-flight job is still accounted for");
        assert!(lanes.pop().is_none());
    }
}
