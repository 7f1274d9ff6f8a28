//! Whose evaluation gets the next sandbox worker: fair turns between tenants. Pure state,
//! no I/O; the pool in `sandbox` holds it under its lock.
//!
//! Every tenant (an application) may hold at most `share` workers at once, so a tenant
//! whose expressions run to the deadline on a busy stream leaves the other workers to
//! everyone else. A free worker goes to a waiting tenant below its share, tenants taking
//! turns (round robin), and within a tenant its evaluations go first come, first served.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// One waiting evaluation, named by the pool.
pub type WaiterId = u64;

pub struct Turns<T> {
    free: usize,
    share: usize,
    held: HashMap<T, usize>,
    waiting: HashMap<T, VecDeque<WaiterId>>,
    /// Tenants with waiting evaluations, in turn order (each at most once).
    rotation: VecDeque<T>,
}

impl<T: Clone + Eq + Hash> Turns<T> {
    /// `workers` in all, at most `share` of them held by one tenant (both at least one).
    pub fn new(workers: usize, share: usize) -> Self {
        let workers = workers.max(1);
        Self {
            free: workers,
            share: share.clamp(1, workers),
            held: HashMap::new(),
            waiting: HashMap::new(),
            rotation: VecDeque::new(),
        }
    }

    /// `tenant` asks for a worker for `waiter`: true when it holds one now, false when the
    /// waiter is queued (it gets one from [`Turns::release`] later, or leaves with
    /// [`Turns::cancel`]).
    pub fn take(&mut self, tenant: &T, waiter: WaiterId) -> bool {
        let queued = self.waiting.get(tenant).is_some_and(|q| !q.is_empty());
        if self.free > 0 && !queued && self.held_by(tenant) < self.share {
            self.free -= 1;
            *self.held.entry(tenant.clone()).or_default() += 1;
            return true;
        }
        let queue = self.waiting.entry(tenant.clone()).or_default();
        if queue.is_empty() {
            self.rotation.push_back(tenant.clone());
        }
        queue.push_back(waiter);
        false
    }

    /// `tenant` gives a worker back. Returns who holds it now, if anyone waits for it: the
    /// next tenant in turn below its share, and its longest-waiting evaluation.
    pub fn release(&mut self, tenant: &T) -> Option<(T, WaiterId)> {
        if let Some(held) = self.held.get_mut(tenant) {
            *held -= 1;
            if *held == 0 {
                self.held.remove(tenant);
            }
        }
        self.free += 1;
        self.hand_over()
    }

    /// A queued waiter leaves before it got a worker (its caller went away).
    pub fn cancel(&mut self, tenant: &T, waiter: WaiterId) {
        let Some(queue) = self.waiting.get_mut(tenant) else { return };
        queue.retain(|w| *w != waiter);
        if queue.is_empty() {
            self.waiting.remove(tenant);
            self.rotation.retain(|t| t != tenant);
        }
    }

    pub fn held_by(&self, tenant: &T) -> usize {
        self.held.get(tenant).copied().unwrap_or(0)
    }

    /// Gives a free worker to the next eligible waiter, if there is one.
    fn hand_over(&mut self) -> Option<(T, WaiterId)> {
        if self.free == 0 {
            return None;
        }
        for _ in 0..self.rotation.len() {
            let tenant = self.rotation.pop_front()?;
            if self.held_by(&tenant) >= self.share {
                self.rotation.push_back(tenant);
                continue;
            }
            let queue = self.waiting.get_mut(&tenant).expect("tenants in the rotation wait");
            let waiter = queue.pop_front().expect("queues in the rotation are not empty");
            if queue.is_empty() {
                self.waiting.remove(&tenant);
            } else {
                self.rotation.push_back(tenant.clone());
            }
            self.free -= 1;
            *self.held.entry(tenant.clone()).or_default() += 1;
            return Some((tenant, waiter));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_holds_at_most_its_share_and_the_rest_stays_free_for_others() {
        let mut turns = Turns::new(4, 2);
        assert!(turns.take(&"noisy", 1));
        assert!(turns.take(&"noisy", 2));
        assert!(!turns.take(&"noisy", 3), "a third worker is beyond its share");
        assert!(turns.take(&"quiet", 4), "two workers are still free for everyone else");
        assert!(turns.take(&"other", 5));
        assert_eq!(turns.held_by(&"noisy"), 2);
    }

    #[test]
    fn a_freed_worker_goes_to_the_next_tenant_in_turn_not_to_the_busiest() {
        let mut turns = Turns::new(2, 2);
        assert!(turns.take(&"noisy", 1));
        assert!(turns.take(&"noisy", 2));
        for w in 3..10 {
            assert!(!turns.take(&"noisy", w));
        }
        assert!(!turns.take(&"quiet", 100));
        // noisy queued first, so it has the first turn; quiet the next one.
        assert_eq!(turns.release(&"noisy"), Some(("noisy", 3)));
        assert_eq!(turns.release(&"noisy"), Some(("quiet", 100)), "quiet waits one turn, not seven");
        assert_eq!(turns.release(&"noisy"), Some(("noisy", 4)));
    }

    #[test]
    fn a_tenant_at_its_share_is_passed_over_until_one_of_its_own_finishes() {
        let mut turns = Turns::new(3, 1);
        assert!(turns.take(&"a", 1));
        assert!(!turns.take(&"a", 2));
        assert!(turns.take(&"b", 3));
        assert!(turns.take(&"c", 4));
        assert!(!turns.take(&"d", 5));
        // c finishes: a is first in the rotation but at its share, so d gets the worker.
        assert_eq!(turns.release(&"c"), Some(("d", 5)));
        assert_eq!(turns.release(&"a"), Some(("a", 2)));
    }

    #[test]
    fn a_cancelled_waiter_is_never_handed_a_worker() {
        let mut turns = Turns::new(1, 1);
        assert!(turns.take(&"a", 1));
        assert!(!turns.take(&"b", 2));
        assert!(!turns.take(&"b", 3));
        turns.cancel(&"b", 2);
        assert_eq!(turns.release(&"a"), Some(("b", 3)));
        turns.cancel(&"b", 3); // already granted: nothing to cancel
        assert_eq!(turns.release(&"b"), None);
        assert!(turns.take(&"c", 4), "the worker is free again");
    }

    #[test]
    fn a_tenant_with_waiters_does_not_jump_its_own_queue() {
        let mut turns = Turns::new(2, 1);
        assert!(turns.take(&"a", 1));
        assert!(!turns.take(&"a", 2));
        assert!(turns.take(&"b", 3));
        assert_eq!(turns.release(&"a"), Some(("a", 2)));
        assert!(!turns.take(&"a", 4), "at its share again");
        assert_eq!(turns.release(&"b"), None, "a is at its share: the worker stays free");
        assert!(turns.take(&"c", 5));
    }
}
