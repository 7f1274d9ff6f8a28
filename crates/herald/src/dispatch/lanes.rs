//! The dispatcher's in-memory state and its fair choice of what to send next. Pure data
//! structure: no I/O, and the time is passed in.
//!
//! One lane per application, one queue per endpoint inside it. The next job comes from the
//! application at the front of the rotation, never from a global "oldest first" queue: an
//! application may take `weight` jobs in a row before yielding its turn (weighted fair
//! sharing), and one at its `maxConcurrency` leaves the rotation until an attempt of its
//! own finishes, so a slow endpoint holds at most its application's cap. Within an
//! application, endpoints take turns, and while several have work none holds more than its
//! share of the application's cap (the cap divided among the endpoints with work or
//! attempts in flight): a slow or dead endpoint cannot take every slot from a fast
//! neighbour. Within an endpoint, first attempts and retries alternate, so a mass of late
//! retries cannot starve new messages.
//!
//! Gates that park an endpoint (its deliveries wait, no attempt is used): its circuit
//! breaker while open, and the token buckets of `throttleRate` (endpoint and application).
//! A parked endpoint is looked at again when its wake-up time comes.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use crate::breaker::{Admission, Breaker, BreakerSettings, Transition};
use crate::catalog::{AppLimits, Target};
use crate::clock::Millis;
use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::{ClaimedDelivery, Message, Trigger};
use crate::throttle::TokenBucket;

/// How long an endpoint counts as active after its last job, for the shares of its
/// application's cap: long enough to span the gaps between a steady endpoint's messages.
pub const ACTIVE_MS: Millis = 10_000;

/// A delivery held in memory, ready to be attempted.
#[derive(Debug, Clone)]
pub struct Job {
    pub delivery_id: i64,
    pub endpoint_id: EndpointId,
    pub message: Arc<Message>,
    /// Attempts already made in this round.
    pub attempts: u32,
    pub trigger: Trigger,
    /// The endpoint as it was when the job arrived (for the lane's limits and gates; the
    /// attempt itself reads the current endpoint).
    pub target: Arc<Target>,
    /// The owner name the delivery was claimed under; its outcome is recorded under it.
    pub owner: Arc<str>,
    /// When the job became due (its commit, or its retry's time): where its wait in the
    /// dispatcher starts, as traces show it.
    pub ready_at: Millis,
}

impl Job {
    pub fn app(&self) -> &AppId {
        &self.message.app_id
    }

    pub fn from_claim(c: ClaimedDelivery, target: Arc<Target>, owner: Arc<str>) -> Self {
        Self {
            delivery_id: c.delivery_id,
            endpoint_id: c.endpoint_id,
            message: c.message,
            attempts: c.attempts,
            trigger: c.trigger,
            target,
            owner,
            ready_at: c.next_at,
        }
    }
}

/// Per endpoint: its queues and its gates.
#[derive(Default)]
struct EndpointQueue {
    first: VecDeque<Job>,
    retries: VecDeque<Job>,
    /// Alternates between first attempts and retries when both wait.
    retry_next: bool,
    /// Attempts of this endpoint in flight.
    in_flight: u32,
    /// When it last had a job to send (see [`ACTIVE_MS`]).
    last_active: Millis,
    /// In the application's list of endpoints that may send.
    queued: bool,
}

impl EndpointQueue {
    fn is_empty(&self) -> bool {
        self.first.is_empty() && self.retries.is_empty()
    }

    fn push(&mut self, job: Job) {
        if job.attempts == 0 { self.first.push_back(job) } else { self.retries.push_back(job) }
    }

    fn pop(&mut self) -> Option<Job> {
        let job = match (self.retry_next, self.first.is_empty(), self.retries.is_empty()) {
            (_, false, true) => self.first.pop_front(),
            (_, true, false) => self.retries.pop_front(),
            (true, false, false) => self.retries.pop_front(),
            (false, false, false) => self.first.pop_front(),
            (_, true, true) => None,
        };
        self.retry_next = !self.retry_next;
        job
    }
}

/// An endpoint's circuit breaker and rate limit; kept while the process runs.
struct Gate {
    /// Whose endpoint it is (`None` for a breaker restored before any job of it arrived).
    app: Option<AppId>,
    breaker: Breaker,
    settings: BreakerSettings,
    bucket: Option<TokenBucket>,
    /// How the endpoint was reached when the breaker last judged it ([`Target::reach`]);
    /// `None` until a job of it arrives (a breaker restored after a restart).
    reach: Option<u64>,
}

struct Lane {
    limits: AppLimits,
    in_flight: u32,
    /// Jobs the application may still take before yielding its turn.
    credit: u32,
    bucket: Option<TokenBucket>,
    endpoints: HashMap<EndpointId, EndpointQueue>,
    /// Endpoints with work that are not parked, in turn order.
    ready: VecDeque<EndpointId>,
    /// In the rotation (at most once).
    queued: bool,
}

impl Lane {
    fn new(limits: AppLimits) -> Self {
        Self {
            limits,
            in_flight: 0,
            credit: limits.weight,
            bucket: None,
            endpoints: HashMap::new(),
            ready: VecDeque::new(),
            queued: false,
        }
    }

    fn waiting(&self) -> bool {
        !self.ready.is_empty()
    }

    /// Whether `endpoint` holds its share of the application's cap: the cap divided among
    /// the endpoints that are active (work waiting, attempts in flight, or a job within the
    /// last [`ACTIVE_MS`]: a fast endpoint is idle most of the time between its messages,
    /// and must still count). Counted only when it might matter: no endpoint under the cap
    /// divided among all of them is at its share.
    fn at_share(&self, endpoint: &EndpointId, now: Millis) -> bool {
        let cap = self.limits.max_concurrency;
        let Some(queue) = self.endpoints.get(endpoint) else { return false };
        if queue.in_flight < cap.div_ceil(self.endpoints.len().max(1) as u32) {
            return false;
        }
        let active =
            |q: &&EndpointQueue| !q.is_empty() || q.in_flight > 0 || now.saturating_sub(q.last_active) < ACTIVE_MS;
        let active = self.endpoints.values().filter(active).count();
        queue.in_flight >= cap.div_ceil(active.max(1) as u32)
    }
}

/// Something to do at a time: a job coming due, or a parked endpoint (or application, when
/// `endpoint` is `None`) to look at again.
enum Due {
    Job(Box<Job>),
    Wake(AppId, Option<EndpointId>),
}

struct Timer {
    at: Millis,
    seq: u64,
    due: Due,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
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
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
pub struct Lanes {
    lanes: HashMap<AppId, Lane>,
    gates: HashMap<EndpointId, Gate>,
    rotation: VecDeque<AppId>,
    timers: BinaryHeap<Timer>,
    seq: u64,
}

impl Lanes {
    pub fn new() -> Self {
        Self::default()
    }

    /// Jobs held: ready, parked, on a timer (in-flight ones are the attempts' own).
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        let timed = self.timers.iter().filter(|t| matches!(t.due, Due::Job(_))).count();
        timed
            + self
                .lanes
                .values()
                .flat_map(|l| l.endpoints.values())
                .map(|q| q.first.len() + q.retries.len())
                .sum::<usize>()
    }

    /// Adds a job (whose room is already reserved) that is due now.
    pub fn add_ready(&mut self, job: Job, now: Millis) {
        let app = job.app().clone();
        let endpoint = job.endpoint_id.clone();
        self.configure(&job.target, now);
        let lane = self.lanes.entry(app.clone()).or_insert_with(|| Lane::new(job.target.app));
        let queue = lane.endpoints.entry(endpoint.clone()).or_default();
        queue.push(job);
        queue.last_active = now;
        if !queue.queued {
            queue.queued = true;
            lane.ready.push_back(endpoint);
        }
        self.make_eligible(&app);
    }

    /// Adds a job (whose room is already reserved) that is due at `at`.
    pub fn add_timer(&mut self, job: Job, at: Millis) {
        self.push_timer(at, Due::Job(Box::new(job)));
    }

    fn push_timer(&mut self, at: Millis, due: Due) {
        self.seq += 1;
        self.timers.push(Timer { at, seq: self.seq, due });
    }

    /// Keeps the lane's and the gate's settings in step with the latest endpoint.
    fn configure(&mut self, target: &Target, now: Millis) {
        let settings = target.settings.circuit_breaker;
        let gate = self.gates.entry(target.endpoint.id.clone()).or_insert_with(|| Gate {
            app: None,
            breaker: Breaker::new(&settings),
            settings,
            bucket: None,
            reach: None,
        });
        gate.settings = settings;
        gate.app.get_or_insert_with(|| target.endpoint.app_id.clone());
        gate.reach.get_or_insert_with(|| target.reach());
        gate.bucket = rebucket(gate.bucket.take(), target.endpoint.throttle_rate, now);
        let lane = self.lanes.entry(target.endpoint.app_id.clone()).or_insert_with(|| Lane::new(target.app));
        lane.limits = target.app;
        lane.bucket = rebucket(lane.bucket.take(), target.app.throttle_rate, now);
    }

    /// Restores a breaker saved before a restart; `reach` is how the endpoint is reached now.
    pub fn restore_breaker(&mut self, endpoint: EndpointId, breaker: Breaker, reach: Option<u64>) {
        let settings = BreakerSettings { cooldown_ms: breaker.cooldown_ms, ..BreakerSettings::default() };
        self.gates.insert(endpoint, Gate { app: None, breaker, settings, bucket: None, reach });
    }

    /// The endpoint is now reached differently (a new URL or headers, or enabled again): the
    /// breaker's verdict was about the old way, so it closes, and the endpoint's parked
    /// deliveries come forward at once (still through fairness and rate limits). Returns
    /// `Closed` if the breaker was not closed already.
    pub fn reach_changed(&mut self, target: &Target) -> Option<Transition> {
        let reach = target.reach();
        let gate = self.gates.get_mut(&target.endpoint.id)?;
        if gate.reach.replace(reach).is_none_or(|before| before == reach) {
            return None;
        }
        let was = gate.breaker.state;
        gate.settings = target.settings.circuit_breaker;
        gate.breaker = Breaker::new(&gate.settings);
        self.wake(&target.endpoint.app_id, Some(&target.endpoint.id));
        (was != crate::breaker::BreakerState::Closed).then_some(Transition::Closed)
    }

    /// "Retry now": an open breaker lets one probe through at once. Returns whether it was
    /// open.
    pub fn probe_now(&mut self, app: &AppId, endpoint: &EndpointId, now: Millis) -> bool {
        let Some(gate) = self.gates.get_mut(endpoint) else { return false };
        if !gate.breaker.probe_now(now) {
            return false;
        }
        self.wake(app, Some(endpoint));
        true
    }

    /// Every endpoint this process keeps a gate for.
    pub fn gated_endpoints(&self) -> Vec<EndpointId> {
        self.gates.keys().cloned().collect()
    }

    /// The endpoints of `app` this process keeps a gate or a queue for.
    pub fn endpoints_of(&self, app: &AppId) -> Vec<EndpointId> {
        let gated = self.gates.iter().filter(|(_, gate)| gate.app.as_ref() == Some(app)).map(|(id, _)| id);
        let queued = self.lanes.get(app).into_iter().flat_map(|lane| lane.endpoints.keys());
        let mut all: Vec<EndpointId> = gated.chain(queued).cloned().collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    pub fn breaker(&self, endpoint: &EndpointId) -> Option<&Breaker> {
        self.gates.get(endpoint).map(|g| &g.breaker)
    }

    /// Every endpoint's breaker (for metrics).
    pub fn breakers(&self) -> impl Iterator<Item = (&EndpointId, &Breaker)> {
        self.gates.iter().map(|(id, g)| (id, &g.breaker))
    }

    /// Moves what came due at or before `now` into the lanes, and wakes parked endpoints.
    pub fn promote(&mut self, now: Millis) {
        while self.timers.peek().is_some_and(|t| t.at <= now) {
            match self.timers.pop().expect("peeked").due {
                Due::Job(job) => self.add_ready(*job, now),
                Due::Wake(app, endpoint) => self.wake(&app, endpoint.as_ref()),
            }
        }
    }

    fn wake(&mut self, app: &AppId, endpoint: Option<&EndpointId>) {
        let Some(lane) = self.lanes.get_mut(app) else { return };
        if let Some(endpoint) = endpoint
            && let Some(queue) = lane.endpoints.get_mut(endpoint)
            && !queue.queued
            && !queue.is_empty()
        {
            queue.queued = true;
            lane.ready.push_back(endpoint.clone());
        }
        self.make_eligible(app);
    }

    pub fn next_due(&self) -> Option<Millis> {
        self.timers.peek().map(|t| t.at)
    }

    /// The next job to attempt, or `None` when every application with work is at its cap,
    /// parked, or out of tokens.
    pub fn pop(&mut self, now: Millis) -> Option<Job> {
        for _ in 0..self.rotation.len() {
            let app = self.rotation.pop_front()?;
            if let Some(job) = self.pop_from(&app, now) {
                return Some(job);
            }
        }
        None
    }

    /// Tries to take a job from one application; re-queues or parks it as needed.
    fn pop_from(&mut self, app: &AppId, now: Millis) -> Option<Job> {
        let lane = self.lanes.get_mut(app).expect("applications in the rotation have lanes");
        lane.queued = false;
        if lane.in_flight >= lane.limits.max_concurrency {
            return None; // back in the rotation when one of its attempts finishes
        }
        if let Some(bucket) = lane.bucket.as_mut()
            && let Err(at) = bucket.check(now)
        {
            self.push_timer(at, Due::Wake(app.clone(), None));
            return None;
        }
        let mut parked = vec![];
        let mut at_share = vec![];
        let mut picked = None;
        while let Some(endpoint) = lane.ready.pop_front() {
            if lane.at_share(&endpoint, now) {
                at_share.push(endpoint); // stays ready: one of its attempts will finish
                continue;
            }
            let queue = lane.endpoints.get_mut(&endpoint).expect("ready endpoints have queues");
            if queue.is_empty() {
                queue.queued = false;
                continue;
            }
            let gate = self.gates.get_mut(&endpoint).expect("endpoints with jobs have gates");
            let admission = gate.breaker.admit(now);
            if let Admission::Wait { until } = admission {
                queue.queued = false;
                parked.push((until, Some(endpoint)));
                continue;
            }
            if let Some(bucket) = gate.bucket.as_mut()
                && let Err(at) = bucket.check(now)
            {
                if admission == Admission::Probe {
                    gate.breaker.abandon_probe();
                }
                queue.queued = false;
                parked.push((at, Some(endpoint)));
                continue;
            }
            if let Some(bucket) = gate.bucket.as_mut() {
                bucket.take(now);
            }
            let job = queue.pop().expect("checked non-empty");
            queue.in_flight += 1;
            if queue.is_empty() {
                queue.queued = false;
            } else {
                lane.ready.push_back(endpoint);
            }
            picked = Some(job);
            break;
        }
        if picked.is_none() && !at_share.is_empty() {
            // Back when one of its attempts finishes, or at the latest when the neighbours
            // that hold it to its share may have gone quiet.
            parked.push((now + ACTIVE_MS, None));
        }
        lane.ready.extend(at_share);
        if let Some(bucket) = lane.bucket.as_mut().filter(|_| picked.is_some()) {
            bucket.take(now);
        }
        if picked.is_some() {
            lane.in_flight += 1;
            lane.credit = lane.credit.saturating_sub(1);
        }
        let keeps_turn = lane.credit > 0;
        if lane.credit == 0 {
            lane.credit = lane.limits.weight;
        }
        if picked.is_some() && lane.waiting() && lane.in_flight < lane.limits.max_concurrency {
            lane.queued = true;
            if keeps_turn { self.rotation.push_front(app.clone()) } else { self.rotation.push_back(app.clone()) }
        }
        for (at, endpoint) in parked {
            self.push_timer(at, Due::Wake(app.clone(), endpoint));
        }
        picked
    }

    /// An attempt of `app` to `endpoint` finished (its slot is free again).
    pub fn finished(&mut self, app: &AppId, endpoint: &EndpointId) {
        if let Some(lane) = self.lanes.get_mut(app) {
            lane.in_flight = lane.in_flight.saturating_sub(1);
            if let Some(queue) = lane.endpoints.get_mut(endpoint) {
                queue.in_flight = queue.in_flight.saturating_sub(1);
            }
        }
        self.make_eligible(app);
    }

    /// Records an attempt's result in the endpoint's breaker; returns a transition worth
    /// saving and reporting. A transition to closed wakes the endpoint.
    pub fn record(
        &mut self,
        app: &AppId,
        endpoint: &EndpointId,
        success: bool,
        slow: bool,
        now: Millis,
    ) -> Option<Transition> {
        let gate = self.gates.get_mut(endpoint)?;
        let transition = gate.breaker.record(success, slow, now, &gate.settings);
        if let Some(Transition::Closed) = transition {
            self.wake(app, Some(endpoint));
        }
        transition
    }

    /// An attempt ended without a verdict on its endpoint (Herald's own failure, a refused
    /// destination, or no attempt at all): if it was the half-open probe, another may go,
    /// or the endpoint would wait for a verdict that never comes.
    pub fn release_probe(&mut self, app: &AppId, endpoint: &EndpointId) {
        if let Some(gate) = self.gates.get_mut(endpoint) {
            gate.breaker.abandon_probe();
            self.wake(app, Some(endpoint));
        }
    }

    /// Takes the waiting job (ready, parked, or on a timer) of `message` to `endpoint`, if
    /// there is one (a resend wants it now, not at its retry time). Its room stays
    /// reserved: the caller gives it back once the job is given back.
    pub fn take_waiting(&mut self, message: &MessageId, endpoint: &EndpointId) -> Option<Job> {
        let is_it = |job: &Job| job.message.id == *message && job.endpoint_id == *endpoint;
        if let Some(job) = self.take_timed(|job| is_it(job)).pop() {
            return Some(job);
        }
        let lane = self.lanes.values_mut().find(|lane| lane.endpoints.contains_key(endpoint))?;
        let queue = lane.endpoints.get_mut(endpoint)?;
        for jobs in [&mut queue.first, &mut queue.retries] {
            if let Some(at) = jobs.iter().position(is_it) {
                return jobs.remove(at);
            }
        }
        None
    }

    /// The endpoint was deleted: takes every job of it that is waiting, and forgets its gate
    /// and queue. In-flight jobs finish (and find it gone); their room stays reserved.
    pub fn remove_endpoint(&mut self, endpoint: &EndpointId) -> Vec<Job> {
        self.gates.remove(endpoint);
        let mut jobs = self.take_timed(|job| job.endpoint_id == *endpoint);
        let app = self.lanes.iter().find(|(_, lane)| lane.endpoints.contains_key(endpoint)).map(|(app, _)| app.clone());
        if let Some(app) = app {
            let lane = self.lanes.get_mut(&app).expect("just found");
            if let Some(mut queue) = lane.endpoints.remove(endpoint) {
                jobs.extend(queue.first.drain(..));
                jobs.extend(queue.retries.drain(..));
            }
            lane.ready.retain(|e| e != endpoint);
            self.make_eligible(&app);
        }
        jobs
    }

    /// Takes the jobs on timers that `which` picks (the heap is rebuilt: a rare operation).
    fn take_timed(&mut self, which: impl Fn(&Job) -> bool) -> Vec<Job> {
        let (taken, kept): (Vec<Timer>, Vec<Timer>) = std::mem::take(&mut self.timers)
            .into_iter()
            .partition(|timer| matches!(&timer.due, Due::Job(job) if which(job)));
        self.timers = kept.into();
        taken
            .into_iter()
            .filter_map(|timer| match timer.due {
                Due::Job(job) => Some(*job),
                Due::Wake(..) => None,
            })
            .collect()
    }

    /// Removes every job that is waiting (ready, parked or on a timer), e.g. to release
    /// them at shutdown (their room is the caller's to give back).
    pub fn drain_waiting(&mut self) -> Vec<Job> {
        let mut jobs: Vec<Job> = std::mem::take(&mut self.timers)
            .into_iter()
            .filter_map(|t| match t.due {
                Due::Job(job) => Some(*job),
                Due::Wake(..) => None,
            })
            .collect();
        for lane in self.lanes.values_mut() {
            for queue in lane.endpoints.values_mut() {
                jobs.extend(queue.first.drain(..));
                jobs.extend(queue.retries.drain(..));
                queue.queued = false;
            }
            lane.ready.clear();
            lane.queued = false;
        }
        self.rotation.clear();
        jobs
    }

    fn make_eligible(&mut self, app: &AppId) {
        let Some(lane) = self.lanes.get_mut(app) else { return };
        if !lane.queued && lane.waiting() && lane.in_flight < lane.limits.max_concurrency {
            lane.queued = true;
            self.rotation.push_back(app.clone());
        } else if !lane.queued && lane.in_flight == 0 && lane.endpoints.values().all(EndpointQueue::is_empty) {
            self.lanes.remove(app);
        }
    }
}

/// A token bucket for `rate`, keeping the existing one's tokens when the rate is unchanged.
fn rebucket(existing: Option<TokenBucket>, rate: Option<u16>, now: Millis) -> Option<TokenBucket> {
    match (existing, rate) {
        (Some(bucket), Some(rate)) if bucket.rate() == rate => Some(bucket),
        (_, Some(rate)) if rate > 0 => Some(TokenBucket::new(rate, now)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint_settings::{Defaults, DeliverySettings};
    use crate::sealing::{Keyring, generate_key};
    use crate::store::{Endpoint, SealedSecrets};

    struct Fixture {
        targets: HashMap<String, Arc<Target>>,
        next: i64,
    }

    impl Fixture {
        fn new() -> Self {
            Self { targets: HashMap::new(), next: 0 }
        }

        /// The endpoint `name` of application `app` (created on first use).
        fn target(
            &mut self,
            app: &str,
            name: &str,
            limits: AppLimits,
            tune: impl FnOnce(&mut Endpoint),
        ) -> Arc<Target> {
            let key = format!("{app}/{name}");
            if let Some(t) = self.targets.get(&key) {
                return t.clone();
            }
            let mut endpoint = Endpoint {
                id: EndpointId::from_trusted(format!("ep_{app}_{name}")),
                app_id: AppId::from_trusted(format!("app_{app}")),
                uid: None,
                url: "https://example.com/".into(),
                description: String::new(),
                disabled: false,
                event_types: None,
                channels: None,
                metadata: Default::default(),
                throttle_rate: None,
                headers: Default::default(),
                secrets: SealedSecrets(String::new()),
                delivery: DeliverySettings::default(),
                request: None,
                created_at: 0,
                updated_at: 0,
                scripts: Default::default(),
                auth: Default::default(),
                version: 1,
                destination: Default::default(),
            };
            tune(&mut endpoint);
            let defaults = Defaults { timeout: std::time::Duration::from_secs(1), retry: Default::default() };
            let keyring = Keyring::new(&generate_key(), &[]).unwrap();
            let target = Arc::new(Target::new(endpoint, limits, &defaults, &keyring));
            self.targets.insert(key, target.clone());
            target
        }

        fn job(&mut self, target: &Arc<Target>, attempts: u32) -> Job {
            self.next += 1;
            Job {
                delivery_id: self.next,
                endpoint_id: target.endpoint.id.clone(),
                message: Arc::new(Message {
                    id: MessageId::generate(),
                    app_id: target.endpoint.app_id.clone(),
                    event_type: "t".into(),
                    event_id: None,
                    channels: None,
                    payload: Some("{}".into()),
                    created_at: 0,
                    trace: None,
                }),
                attempts,
                trigger: Trigger::Scheduled,
                target: target.clone(),
                owner: Arc::from("test-0"),
                ready_at: 0,
            }
        }
    }

    fn limits(cap: u32, weight: u32) -> AppLimits {
        AppLimits { max_concurrency: cap, weight, throttle_rate: None }
    }

    fn add(lanes: &mut Lanes, fx: &mut Fixture, target: &Arc<Target>, n: usize) {
        for _ in 0..n {
            let job = fx.job(target, 0);
            lanes.add_ready(job, 0);
        }
    }

    fn drain_apps(lanes: &mut Lanes, now: Millis) -> Vec<String> {
        std::iter::from_fn(|| lanes.pop(now)).map(|j| j.app().to_string()).collect()
    }

    #[test]
    fn applications_take_turns_instead_of_oldest_first() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let a = fx.target("a", "1", limits(100, 1), |_| {});
        let b = fx.target("b", "1", limits(100, 1), |_| {});
        add(&mut lanes, &mut fx, &a, 4);
        add(&mut lanes, &mut fx, &b, 2);
        assert_eq!(drain_apps(&mut lanes, 0), vec!["app_a", "app_b", "app_a", "app_b", "app_a", "app_a"]);
    }

    #[test]
    fn weights_share_contended_capacity_proportionally() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let heavy = fx.target("h", "1", limits(100, 3), |_| {});
        let light = fx.target("l", "1", limits(100, 1), |_| {});
        add(&mut lanes, &mut fx, &heavy, 30);
        add(&mut lanes, &mut fx, &light, 30);
        let first: Vec<String> = drain_apps(&mut lanes, 0).into_iter().take(16).collect();
        let heavy_share = first.iter().filter(|a| *a == "app_h").count();
        assert_eq!(heavy_share, 12, "3:1 while both have work: {first:?}");
    }

    #[test]
    fn an_application_at_its_cap_is_skipped_not_waited_on() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let slow = fx.target("slow", "1", limits(2, 1), |_| {});
        let fast = fx.target("fast", "1", limits(100, 1), |_| {});
        add(&mut lanes, &mut fx, &slow, 10);
        add(&mut lanes, &mut fx, &fast, 5);
        let taken = drain_apps(&mut lanes, 0);
        assert_eq!(taken.iter().filter(|a| *a == "app_slow").count(), 2, "slow stops at its cap");
        assert_eq!(taken.iter().filter(|a| *a == "app_fast").count(), 5, "fast is never held up");
        lanes.finished(&slow.endpoint.app_id, &slow.endpoint.id);
        assert_eq!(lanes.pop(0).unwrap().app(), &slow.endpoint.app_id, "a finished slot lets it back in");
        assert!(lanes.pop(0).is_none());
    }

    #[test]
    fn a_slow_endpoint_holds_at_most_its_share_of_the_cap_while_a_neighbour_has_work() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let slow = fx.target("a", "slow", limits(16, 1), |_| {});
        let fast = fx.target("a", "fast", limits(16, 1), |_| {});
        add(&mut lanes, &mut fx, &slow, 100);
        add(&mut lanes, &mut fx, &fast, 100);
        let taken: Vec<Job> = std::iter::from_fn(|| lanes.pop(0)).collect();
        let slow_taken = taken.iter().filter(|j| j.endpoint_id == slow.endpoint.id).count();
        assert_eq!((taken.len(), slow_taken), (16, 8), "half the cap each");
        // The slow attempts never finish; each finished fast one frees a slot for fast only.
        for _ in 0..50 {
            lanes.finished(&fast.endpoint.app_id, &fast.endpoint.id);
            let next = lanes.pop(0).expect("a slot for the fast endpoint");
            assert_eq!(next.endpoint_id, fast.endpoint.id, "never the slow one past its share");
        }
    }

    #[test]
    fn a_fast_neighbour_counts_between_its_messages_and_a_quiet_one_does_not() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let slow = fx.target("a", "slow", limits(16, 1), |_| {});
        let fast = fx.target("a", "fast", limits(16, 1), |_| {});
        add(&mut lanes, &mut fx, &slow, 100);
        add(&mut lanes, &mut fx, &fast, 1);
        let taken: Vec<Job> = std::iter::from_fn(|| lanes.pop(1)).collect();
        assert_eq!(taken.len(), 9, "the slow one's half, and the fast one's message");
        lanes.finished(&fast.endpoint.app_id, &fast.endpoint.id);
        // The fast one has nothing queued now, but had a job a moment ago: it still counts.
        assert!(lanes.pop(2).is_none(), "the slow one stays at its share between the fast one's messages");
        // Quiet for longer than ACTIVE_MS: the slow one may use the whole cap.
        lanes.promote(2 + ACTIVE_MS);
        let more = std::iter::from_fn(|| lanes.pop(2 + ACTIVE_MS)).count();
        assert_eq!(more, 8, "the rest, once the other is quiet (no attempt had to finish first)");
    }

    #[test]
    fn a_deleted_endpoint_gives_up_every_waiting_job_and_its_gate() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let breaker = BreakerSettings { failure_threshold: 1, cooldown_ms: 300_000, max_cooldown_ms: 300_000 };
        let e = fx.target("a", "1", limits(100, 1), |e| e.delivery.circuit_breaker = Some(breaker));
        let other = fx.target("a", "2", limits(100, 1), |_| {});
        add(&mut lanes, &mut fx, &e, 4);
        add(&mut lanes, &mut fx, &other, 1);
        let (app, ep) = (e.endpoint.app_id.clone(), e.endpoint.id.clone());
        let first = lanes.pop(0).unwrap();
        assert_eq!(first.endpoint_id, ep);
        lanes.finished(&app, &ep);
        lanes.record(&app, &ep, false, false, 10);
        let retry = fx.job(&e, 1);
        lanes.add_timer(retry, 60_000);
        let taken = lanes.remove_endpoint(&ep);
        assert_eq!(taken.len(), 4, "three parked and one on a timer");
        assert!(lanes.breaker(&ep).is_none(), "its breaker is forgotten");
        assert_eq!(lanes.endpoints_of(&app), vec![other.endpoint.id.clone()]);
        assert_eq!(lanes.pop(10).unwrap().endpoint_id, other.endpoint.id, "the neighbour goes on");
    }

    #[test]
    fn a_resend_takes_its_waiting_job_from_a_timer_or_a_queue() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let e = fx.target("a", "1", limits(100, 1), |_| {});
        let (later, now) = (fx.job(&e, 1), fx.job(&e, 0));
        let (later_msg, now_msg) = (later.message.id.clone(), now.message.id.clone());
        lanes.add_timer(later, 40_000);
        lanes.add_ready(now, 0);
        assert_eq!(lanes.take_waiting(&later_msg, &e.endpoint.id).unwrap().message.id, later_msg);
        assert_eq!(lanes.take_waiting(&now_msg, &e.endpoint.id).unwrap().message.id, now_msg);
        assert!(lanes.take_waiting(&now_msg, &e.endpoint.id).is_none(), "taken once");
        assert!(lanes.pop(0).is_none());
        lanes.promote(40_000);
        assert!(lanes.pop(40_000).is_none(), "nothing left on the timer");
    }

    #[test]
    fn endpoints_of_one_application_take_turns() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let e1 = fx.target("a", "1", limits(100, 1), |_| {});
        let e2 = fx.target("a", "2", limits(100, 1), |_| {});
        add(&mut lanes, &mut fx, &e1, 3);
        add(&mut lanes, &mut fx, &e2, 1);
        let order: Vec<String> = std::iter::from_fn(|| lanes.pop(0)).map(|j| j.endpoint_id.to_string()).collect();
        assert_eq!(order, vec!["ep_a_1", "ep_a_2", "ep_a_1", "ep_a_1"]);
    }

    #[test]
    fn first_attempts_and_retries_alternate() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let e = fx.target("a", "1", limits(100, 1), |_| {});
        for attempts in [3, 3, 3, 3, 0, 0] {
            let job = fx.job(&e, attempts);
            lanes.add_ready(job, 0);
        }
        let kinds: Vec<bool> = std::iter::from_fn(|| lanes.pop(0)).map(|j| j.attempts == 0).collect();
        assert_eq!(kinds, vec![true, false, true, false, false, false], "new messages are not starved");
    }

    #[test]
    fn an_endpoint_throttle_parks_it_until_tokens_come_back() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let e = fx.target("a", "1", limits(100, 1), |e| e.throttle_rate = Some(2));
        let other = fx.target("b", "1", limits(100, 1), |_| {});
        add(&mut lanes, &mut fx, &e, 5);
        add(&mut lanes, &mut fx, &other, 3);
        let now0 = drain_apps(&mut lanes, 0);
        assert_eq!(now0.iter().filter(|a| *a == "app_a").count(), 2, "a burst of one second's worth");
        assert_eq!(now0.iter().filter(|a| *a == "app_b").count(), 3, "other applications are unaffected");
        assert_eq!(lanes.next_due(), Some(500));
        lanes.promote(499);
        assert!(lanes.pop(499).is_none());
        lanes.promote(500);
        assert!(lanes.pop(500).is_some());
        assert!(lanes.pop(500).is_none());
    }

    #[test]
    fn an_application_throttle_covers_all_its_endpoints() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let app = AppLimits { max_concurrency: 100, weight: 1, throttle_rate: Some(3) };
        let e1 = fx.target("a", "1", app, |_| {});
        let e2 = fx.target("a", "2", app, |_| {});
        add(&mut lanes, &mut fx, &e1, 5);
        add(&mut lanes, &mut fx, &e2, 5);
        assert_eq!(drain_apps(&mut lanes, 0).len(), 3);
        lanes.promote(1000);
        assert_eq!(drain_apps(&mut lanes, 1000).len(), 3);
    }

    #[test]
    fn an_open_breaker_parks_the_endpoint_and_a_probe_reopens_the_way() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let breaker = BreakerSettings { failure_threshold: 2, cooldown_ms: 1000, max_cooldown_ms: 4000 };
        let e = fx.target("a", "1", limits(100, 1), |e| e.delivery.circuit_breaker = Some(breaker));
        add(&mut lanes, &mut fx, &e, 5);
        let (app, ep) = (e.endpoint.app_id.clone(), e.endpoint.id.clone());
        for _ in 0..2 {
            lanes.pop(0).unwrap();
            lanes.finished(&app, &ep);
        }
        assert_eq!(lanes.record(&app, &ep, false, false, 10), None);
        assert_eq!(lanes.record(&app, &ep, false, false, 10), Some(Transition::Opened));
        assert!(lanes.pop(10).is_none(), "open: the remaining jobs wait, no attempt is made");
        assert_eq!(lanes.waiting(), 3, "parked jobs stay in memory");
        lanes.promote(1009);
        assert!(lanes.pop(1009).is_none());
        lanes.promote(1010);
        let probe = lanes.pop(1010).expect("one probe after the cooldown");
        assert!(lanes.pop(1010).is_none(), "exactly one probe");
        lanes.finished(probe.app(), &probe.endpoint_id);
        assert_eq!(lanes.record(&app, &ep, true, false, 1020), Some(Transition::Closed));
        assert_eq!(drain_apps(&mut lanes, 1020).len(), 2, "closed again: the rest flows");
    }

    #[test]
    fn a_silent_endpoint_beside_a_fast_one_under_a_steady_stream_holds_its_share() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let silent = fx.target("b", "silent", limits(16, 1), |_| {});
        let fast = fx.target("b", "fast", limits(16, 1), |_| {});
        let mut silent_in_flight = 0;
        for n in 0..1000 {
            let now = n as Millis;
            for target in [&silent, &fast] {
                let job = fx.job(target, 0);
                lanes.add_ready(job, now);
            }
            while let Some(job) = lanes.pop(now) {
                if job.endpoint_id == fast.endpoint.id {
                    lanes.finished(job.app(), &job.endpoint_id);
                } else {
                    silent_in_flight += 1;
                }
            }
        }
        assert_eq!(silent_in_flight, 8, "the silent endpoint's share of 16");
    }

    #[test]
    fn an_endpoint_reached_differently_closes_its_breaker_and_its_parked_jobs_flow_at_once() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let breaker = BreakerSettings { failure_threshold: 1, cooldown_ms: 300_000, max_cooldown_ms: 300_000 };
        let e = fx.target("a", "1", limits(100, 1), |e| e.delivery.circuit_breaker = Some(breaker));
        add(&mut lanes, &mut fx, &e, 4);
        let (app, ep) = (e.endpoint.app_id.clone(), e.endpoint.id.clone());
        lanes.pop(0).unwrap();
        lanes.finished(&app, &ep);
        assert_eq!(lanes.record(&app, &ep, false, false, 10), Some(Transition::Opened));
        assert!(lanes.pop(10).is_none(), "parked for five minutes");
        let described = fx.target("a", "described", limits(100, 1), |x| {
            x.id = ep.clone();
            x.description = "only the description changed".into();
            x.delivery.circuit_breaker = Some(breaker);
        });
        assert_eq!(lanes.reach_changed(&described), None, "the same way in: the verdict stands");
        assert!(lanes.pop(20).is_none());
        let moved = fx.target("a", "moved", limits(100, 1), |x| {
            x.id = ep.clone();
            x.url = "https://example.com/fixed".into();
            x.delivery.circuit_breaker = Some(breaker);
        });
        assert_eq!(lanes.reach_changed(&moved), Some(Transition::Closed));
        assert_eq!(drain_apps(&mut lanes, 20).len(), 3, "every parked job, long before the cooldown");
        assert_eq!(lanes.reach_changed(&moved), None, "already closed");
    }

    #[test]
    fn retry_now_lets_one_probe_of_an_open_breaker_go_at_once() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let breaker = BreakerSettings { failure_threshold: 1, cooldown_ms: 300_000, max_cooldown_ms: 300_000 };
        let e = fx.target("a", "1", limits(100, 1), |e| e.delivery.circuit_breaker = Some(breaker));
        add(&mut lanes, &mut fx, &e, 3);
        let (app, ep) = (e.endpoint.app_id.clone(), e.endpoint.id.clone());
        assert!(!lanes.probe_now(&app, &ep, 0), "closed: nothing to retry");
        lanes.pop(0).unwrap();
        lanes.finished(&app, &ep);
        lanes.record(&app, &ep, false, false, 10);
        assert!(lanes.pop(10).is_none());
        assert!(lanes.probe_now(&app, &ep, 20));
        assert!(lanes.pop(20).is_some(), "the probe");
        assert!(lanes.pop(20).is_none(), "one probe only");
    }

    #[test]
    fn timers_release_jobs_only_when_due() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let e = fx.target("a", "1", limits(100, 1), |_| {});
        let (j1, j2) = (fx.job(&e, 1), fx.job(&e, 1));
        lanes.add_timer(j1, 200);
        lanes.add_timer(j2, 100);
        lanes.promote(99);
        assert!(lanes.pop(99).is_none());
        lanes.promote(150);
        assert_eq!(lanes.pop(150).unwrap().delivery_id, 2);
        lanes.promote(200);
        assert_eq!(lanes.pop(200).unwrap().delivery_id, 1);
    }

    #[test]
    fn draining_returns_every_waiting_job() {
        let (mut lanes, mut fx) = (Lanes::new(), Fixture::new());
        let e = fx.target("a", "1", limits(1, 1), |_| {});
        add(&mut lanes, &mut fx, &e, 3);
        let later = fx.job(&e, 1);
        lanes.add_timer(later, 1_000);
        let in_flight = lanes.pop(0).unwrap();
        let drained = lanes.drain_waiting();
        assert_eq!(drained.len(), 3);
        assert!(drained.iter().all(|j| j.delivery_id != in_flight.delivery_id));
        assert_eq!(lanes.waiting(), 0, "only the in-flight job is left, and it is the attempt's");
        assert!(lanes.pop(0).is_none());
    }
}
