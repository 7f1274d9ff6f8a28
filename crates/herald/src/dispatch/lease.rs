//! This process's lease on a shared store (PostgreSQL). Every claim carries the owner name
//! of the process that made it; the process renews its lease a few times per lease period,
//! and anyone may release the claims of a process whose lease expired.
//!
//! A process that cannot renew does not know whether others already took its claims, so
//! once its last renewal is older than half the lease it starts no attempt until a renewal
//! succeeds: a store outage or a pause then costs time, not duplicate deliveries. (The other
//! half covers an attempt's way to the wire: DNS, connect and TLS budgets should stay
//! below it.) A renewal that finds the lease gone means the claims now belong to others;
//! the process forgets what it held and continues under a new owner name.
//!
//! Reaping is held back after stalls that may have hit everyone (a database outage, a lock,
//! a paused process): a process reaps others only once its own renewals have run for a
//! whole lease, each within half a lease of the one before, and (PostgreSQL) no lease
//! expires within a lease of the database's start. Renewing and reaping run in separate
//! loops, so a reap stuck behind a lock never delays a renewal.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use crate::store::StoreError;
use crate::supervisor::spawn_loop;

/// Every how many lease beats orphaned claims are swept up regardless.
const ORPHAN_SWEEP_EVERY: u64 = 10;

/// The owner name, whether it is registered, and until when its lease surely holds.
pub struct Lease {
    node: String,
    owner: RwLock<Arc<str>>,
    generation: AtomicU64,
    /// On a shared store, nothing is claimed until the owner name is registered (claims
    /// under a name the store does not know would never be released).
    registered: AtomicBool,
    /// Whether there is a lease at all (a single-process store has none).
    shared: bool,
    /// Milliseconds after `epoch` before which this process's claims are surely its own.
    held_until: AtomicU64,
    /// When the last successful renewal was sent, and when the current run of timely
    /// renewals began (milliseconds after `epoch`, plus one; 0: none).
    last_renewed: AtomicU64,
    steady_since: AtomicU64,
    epoch: Instant,
}

impl Lease {
    pub fn new(node: String, shared: bool) -> Self {
        Self {
            owner: RwLock::new(Arc::from(format!("{node}-0"))),
            node,
            generation: AtomicU64::new(0),
            registered: AtomicBool::new(!shared),
            shared,
            held_until: AtomicU64::new(0),
            last_renewed: AtomicU64::new(0),
            steady_since: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// The owner name this process claims deliveries under.
    pub fn owner(&self) -> Arc<str> {
        self.owner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether this process may claim deliveries now.
    pub fn may_claim(&self) -> bool {
        self.registered.load(Ordering::SeqCst)
    }

    /// Whether this process may start an attempt on a delivery it holds: its lease surely
    /// still holds, so no other process can have taken the delivery.
    pub fn may_start(&self) -> bool {
        !self.shared || (self.may_claim() && self.millis(Instant::now()) < self.held_until.load(Ordering::SeqCst))
    }

    /// A renewal sent at `sent` succeeded: the store's expiry is at least `lease` after it.
    /// Attempts may start during the first half of that.
    fn renewed(&self, sent: Instant, lease: Duration) {
        let until = self.millis(sent + lease / 2);
        self.held_until.fetch_max(until, Ordering::SeqCst);
        let at = self.millis(sent) + 1;
        let last = self.last_renewed.swap(at, Ordering::SeqCst);
        if last == 0 || at.saturating_sub(last) > half(lease) {
            self.steady_since.store(at, Ordering::SeqCst);
        }
    }

    /// A renewal failed: the run of timely renewals is over.
    fn broken(&self) {
        self.steady_since.store(0, Ordering::SeqCst);
    }

    /// Whether this process may reap the leases of others: its own renewals have run on time
    /// for a whole lease and are still current, so whatever stalled it is not stalling it now
    /// and every live process had a lease's time to renew since.
    fn may_reap(&self, lease: Duration) -> bool {
        let now = self.millis(Instant::now()) + 1;
        let (since, last) = (self.steady_since.load(Ordering::SeqCst), self.last_renewed.load(Ordering::SeqCst));
        since != 0 && now.saturating_sub(since) >= lease.as_millis() as u64 && now.saturating_sub(last) <= half(lease)
    }

    /// Takes a new owner name and returns the old one.
    fn rename(&self) -> Arc<str> {
        self.registered.store(false, Ordering::SeqCst);
        self.held_until.store(0, Ordering::SeqCst);
        self.broken();
        let generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let owner: Arc<str> = Arc::from(format!("{}-{generation}", self.node));
        std::mem::replace(&mut *self.owner.write().unwrap_or_else(|p| p.into_inner()), owner)
    }

    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64
    }
}

fn half(lease: Duration) -> u64 {
    lease.as_millis() as u64 / 2
}

/// Registers the current owner name; until that succeeds nothing is claimed.
pub async fn register(dispatcher: &Dispatcher) {
    let lease = &dispatcher.lease;
    let sent = Instant::now();
    match within(dispatcher, dispatcher.store.register_node(&lease.owner())).await {
        Ok(()) => {
            lease.renewed(sent, dispatcher.config.lease);
            lease.registered.store(true, Ordering::SeqCst);
            dispatcher.nudge();
        }
        Err(e) => tracing::warn!(error = %e, "registering this process failed; will retry"),
    }
}

/// A lease call that does not answer within half the lease has failed: by then the fence
/// has stopped new attempts anyway, and a hung connection must not stall the renewals.
async fn within<T>(
    dispatcher: &Dispatcher,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let limit = dispatcher.config.lease / 2;
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(StoreError::Other(anyhow::anyhow!("no answer within {limit:?}"))))
}

/// The lease was lost (the process stalled longer than the lease): every delivery it held
/// now belongs to others. Forget the waiting ones and continue under a new owner name, so
/// no outcome of the old claims can land on new ones. Claims made under the old name after
/// its lease ended are given back too.
async fn forfeit(dispatcher: &Dispatcher) {
    let old = dispatcher.lease.rename();
    let drain = |lanes: &mut super::lanes::Lanes, dispatcher: &Dispatcher| {
        let dropped = lanes.drain_waiting().len();
        dispatcher.room.release(dropped);
        dropped
    };
    let dropped = dispatcher.ask(drain).await.unwrap_or_default();
    tracing::warn!(dropped, owner = %dispatcher.lease.owner(), "lease lost; dropped held deliveries and registering anew");
    if let Err(e) = dispatcher.store.release_owner(&old).await {
        tracing::warn!(error = %e, "giving back the old name's claims failed; its lease reaping will");
    }
    register(dispatcher).await;
}

/// On a shared store: renews this process's lease, and (in a loop of its own) releases the
/// deliveries of processes whose lease expired (every process does it; it is idempotent).
pub async fn keep(dispatcher: Arc<Dispatcher>, shutdown: CancellationToken) {
    if !dispatcher.store.shared() {
        // Nothing to renew on a store only this process opens: it runs until told to stop.
        return shutdown.cancelled().await;
    }
    let reaper = spawn_loop(
        &dispatcher.liveness,
        "the lease reaper",
        shutdown.clone(),
        reap(dispatcher.clone(), shutdown.clone()),
    );
    let lease = dispatcher.config.lease;
    let mut beat = tokio::time::interval(lease / 4);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = beat.tick() => {}
            _ = shutdown.cancelled() => break,
        }
        if !dispatcher.lease.may_claim() {
            register(&dispatcher).await;
            continue;
        }
        let sent = Instant::now();
        match within(&dispatcher, dispatcher.store.heartbeat(&dispatcher.lease.owner())).await {
            Ok(true) => {
                dispatcher.lease.renewed(sent, lease);
                dispatcher.nudge();
            }
            Ok(false) => forfeit(&dispatcher).await,
            Err(e) => {
                dispatcher.lease.broken();
                tracing::warn!(error = %e, "renewing the lease failed; will retry");
            }
        }
    }
    let _ = reaper.await;
}

/// Releases the deliveries of processes whose lease expired, while this process's own
/// renewals are steady; sweeps up orphaned claims now and then, and after churn.
async fn reap(dispatcher: Arc<Dispatcher>, shutdown: CancellationToken) {
    let lease = dispatcher.config.lease;
    let mut beat = tokio::time::interval(lease / 4);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beats: u64 = 0;
    let mut generation = dispatcher.lease.generation.load(Ordering::SeqCst);
    loop {
        tokio::select! {
            _ = beat.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        beats += 1;
        let now = dispatcher.lease.generation.load(Ordering::SeqCst);
        let mut sweep = beats.is_multiple_of(ORPHAN_SWEEP_EVERY) || std::mem::replace(&mut generation, now) != now;
        if dispatcher.lease.may_reap(lease) {
            match dispatcher.store.reap_expired(lease).await {
                Ok(released) => sweep |= released > 0,
                Err(e) => tracing::warn!(error = %e, "releasing expired leases failed; will retry"),
            }
        }
        if sweep && let Err(e) = dispatcher.store.release_orphans().await {
            tracing::warn!(error = %e, "releasing orphaned claims failed; will retry");
        }
    }
}
