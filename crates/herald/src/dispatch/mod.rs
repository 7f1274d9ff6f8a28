//! The dispatcher decides what to send next and keeps every accepted delivery moving.
//!
//! Freshly ingested deliveries arrive straight from ingest (no polling on the hot path);
//! the [`loader`] claims everything else from the store: work left by a crashed or
//! stopped process, retries due later than the in-memory horizon, manual requeues. The
//! fair [`lanes`] have one [`owner`], a task that takes every change to them as a message
//! and, whenever a global slot is free, takes the next job and spawns its [`attempt`].
//! Memory is counted apart ([`room`]), so ingest reserves without a message. The loader,
//! the [`outcomes`] writer and the [`lease`] are tasks of their own, each with its own
//! small state, that talk to the lanes only through the owner.

mod attempt;
mod gone;
mod lanes;
pub mod latency;
mod lease;
mod loader;
mod outcomes;
mod owner;
mod resume;
mod room;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use lanes::Job;
use lanes::Lanes;

use crate::catalog::Catalog;
use crate::clock::{Millis, now_ms};
use crate::config::{FaultsConfig, QueueConfig};
use crate::deliver::Deliverer;
use crate::metrics::Metrics;
use crate::scripts::Sandbox;
use crate::store::Store;
use crate::supervisor::{Liveness, StopDeadline, spawn_loop};
use crate::telemetry::Traces;

/// Settings the dispatcher runs with.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// The owner name its claims carry.
    pub owner: String,
    pub queue: QueueConfig,
    /// How long a claim outlives its process's last heartbeat (shared stores).
    pub lease: Duration,
    /// Attempts in flight at once across all applications.
    pub max_in_flight: usize,
    /// Fault injection (test builds only).
    pub faults: FaultsConfig,
    /// Each attempt (and the wait before it) is a span of its message's trace.
    pub traces: Traces,
}

/// How often a pump waiting for its lease to be renewed looks again.
pub(super) const LEASE_RECHECK: Duration = Duration::from_millis(50);

/// How often the latency histograms are flushed to the store.
const LATENCY_FLUSH: Duration = Duration::from_secs(5);

/// The most a process that failed waits for its attempts in flight before it gives back
/// what it holds and exits (the configured grace, if shorter).
const FAILURE_GRACE: Duration = Duration::from_secs(5);
/// The part of a stop's grace kept for recording the last outcomes and giving the rest
/// back: a tenth of what is left, within these bounds.
const STOP_RESERVE_MIN: Duration = Duration::from_millis(100);
const STOP_RESERVE_MAX: Duration = Duration::from_secs(2);

/// The dispatcher's loops while it runs, each with the token that stops it (the loader
/// stops with the dispatcher itself).
struct Running {
    loader: JoinHandle<()>,
    writer: (CancellationToken, JoinHandle<()>),
    flusher: (CancellationToken, JoinHandle<()>),
    owner: (CancellationToken, JoinHandle<()>),
    leases: (CancellationToken, JoinHandle<()>),
}

/// Stops a loop and waits for its end until `deadline`; whether it ended.
async fn stop_and_wait((stop, task): (CancellationToken, JoinHandle<()>), deadline: tokio::time::Instant) -> bool {
    stop.cancel();
    tokio::time::timeout_at(deadline, task).await.is_ok()
}

pub struct Dispatcher {
    /// The owner name this process's claims carry, and its lease on a shared store.
    lease: lease::Lease,
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    deliverer: Deliverer,
    /// Runs endpoint transforms before each attempt.
    sandbox: Arc<Sandbox>,
    config: DispatchConfig,
    /// Messages to the lanes' owner (`owner`).
    mailbox: owner::Mailbox,
    /// The owner's end, and the lanes it will own, taken by `run`.
    inbox: Mutex<Option<(owner::Inbox, Lanes)>>,
    room: room::Room,
    slots: Arc<Semaphore>,
    wake_loader: Notify,
    /// Whether the store may hold claimable work that did not fit in memory: only then does
    /// freed room wake the loader (otherwise every finished attempt would cost a claim).
    work_in_store: AtomicBool,
    attempts: TaskTracker,
    outcomes: outcomes::Sender,
    /// The outcome writer's receiving end, taken by `run`.
    outcomes_rx: Mutex<Option<outcomes::Receiver>>,
    latency: Arc<latency::Tracker>,
    /// Endpoints deleted lately (`gone`).
    gone: gone::Gone,
    metrics: Arc<Metrics>,
    /// Fails the process when one of the dispatcher's loops fails.
    liveness: Arc<Liveness>,
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Store>,
        catalog: Arc<Catalog>,
        deliverer: Deliverer,
        sandbox: Arc<Sandbox>,
        config: DispatchConfig,
        metrics: Arc<Metrics>,
        liveness: Arc<Liveness>,
    ) -> Arc<Self> {
        let (outcomes, outcomes_rx) = outcomes::channel();
        let (mailbox, inbox) = owner::mailbox();
        Arc::new(Self {
            lease: lease::Lease::new(config.owner.clone(), store.shared()),
            store,
            catalog,
            deliverer,
            sandbox,
            mailbox,
            inbox: Mutex::new(Some((inbox, Lanes::new()))),
            room: room::Room::new(config.queue.memory_limit),
            slots: Arc::new(Semaphore::new(config.max_in_flight)),
            wake_loader: Notify::new(),
            work_in_store: AtomicBool::new(true),
            attempts: TaskTracker::new(),
            outcomes,
            outcomes_rx: Mutex::new(Some(outcomes_rx)),
            latency: Arc::default(),
            gone: Default::default(),
            metrics,
            liveness,
            config,
        })
    }

    /// Whether the process is sound: tasks spawned for the dispatcher's work report to it.
    pub fn liveness(&self) -> &Arc<Liveness> {
        &self.liveness
    }

    /// The owner name this process claims deliveries under.
    pub fn owner(&self) -> Arc<str> {
        self.lease.owner()
    }

    /// Reserves memory for `n` deliveries about to be ingested; when this returns false
    /// they are committed unclaimed and the loader picks them up as room frees.
    pub fn try_reserve(&self, n: usize) -> bool {
        self.lease.may_claim() && self.room.try_reserve(n)
    }

    /// Returns a reservation that will not be used (the ingest failed).
    pub fn unreserve(&self, n: usize) {
        self.room.release(n);
        self.room_freed();
    }

    /// Memory was freed: lets the loader fill it if the store may hold work waiting for room.
    fn room_freed(&self) {
        if self.work_in_store.load(Ordering::Acquire) {
            self.wake_loader.notify_one();
        }
    }

    /// Hands over reserved, committed and claimed deliveries for immediate attempts.
    pub fn submit(&self, jobs: impl IntoIterator<Item = Job>) {
        self.hold(jobs.into_iter().map(|job| (job, 0)));
    }

    /// Takes jobs into memory (their room already reserved): each ready now or at its time.
    /// A job claimed under an owner name this process no longer holds (its lease was lost
    /// since) is dropped with its room: the claim is the store's to give to someone else.
    /// The name is checked when the owner applies the message, in order with the lease's
    /// `forfeit`, which renames first and then empties the lanes: no job of an old name can
    /// slip in after the forfeit.
    fn hold(&self, jobs: impl IntoIterator<Item = (Job, Millis)>) {
        let jobs: Vec<(Job, Millis)> = jobs.into_iter().collect();
        if jobs.is_empty() {
            return;
        }
        self.tell(move |lanes, dispatcher| {
            let now = now_ms();
            let owner = dispatcher.owner();
            let mut dropped = 0;
            for (job, due) in jobs {
                if job.owner != owner {
                    dropped += 1;
                } else if due <= now {
                    lanes.add_ready(job, now);
                } else {
                    lanes.add_timer(job, due);
                }
            }
            if dropped > 0 {
                dispatcher.room.release(dropped);
                tracing::info!(dropped, "dropped jobs claimed under a lost lease");
            }
        });
    }

    /// This process's circuit breaker of an endpoint, if it has one.
    pub async fn breaker(&self, endpoint: &crate::ids::EndpointId) -> Option<crate::breaker::Breaker> {
        let endpoint = endpoint.clone();
        self.ask(move |lanes, _| lanes.breaker(&endpoint).cloned()).await.flatten()
    }

    /// Every circuit breaker this process holds (for metrics).
    pub async fn breakers(&self) -> Vec<(crate::ids::EndpointId, crate::breaker::Breaker)> {
        let read =
            |lanes: &mut Lanes, _: &Dispatcher| lanes.breakers().map(|(id, b)| (id.clone(), b.clone())).collect();
        self.ask(read).await.unwrap_or_default()
    }

    /// Attempts in flight in this process.
    pub fn in_flight(&self) -> u32 {
        let free = self.slots.available_permits();
        u32::try_from(self.config.max_in_flight.saturating_sub(free)).unwrap_or(u32::MAX)
    }

    pub fn latency(&self) -> &latency::Tracker {
        &self.latency
    }

    /// Asks the loader to look for claimable work now (after a manual requeue, or an ingest
    /// that left its deliveries in the store).
    pub fn poke(&self) {
        self.work_in_store.store(true, Ordering::Release);
        self.wake_loader.notify_one();
    }

    /// Runs the pump and the loader until `shutdown`, then lets in-flight attempts finish
    /// and gives every held delivery back to the store, all by `deadline` (the grace period
    /// from when the process began to stop). Every loop runs supervised: one that fails
    /// fails the process, which then stops the same way (with a shorter grace).
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken, deadline: StopDeadline) {
        let rx = self.outcomes_rx.lock().unwrap_or_else(|p| p.into_inner()).take().expect("run is called once");
        let (inbox, lanes) = self.inbox.lock().unwrap_or_else(|p| p.into_inner()).take().expect("run once");
        self.restore().await;
        let live = &self.liveness;
        let stop_latency = CancellationToken::new();
        let flush = latency::run(self.latency.clone(), self.store.clone(), LATENCY_FLUSH, stop_latency.clone());
        let flusher = spawn_loop(live, "the latency flush", stop_latency.clone(), flush);
        let stop_outcomes = CancellationToken::new();
        let outcomes = outcomes::run(self.clone(), rx, stop_outcomes.clone());
        let writer = spawn_loop(live, "the outcome writer", stop_outcomes.clone(), outcomes);
        lease::register(&self).await;
        let loader = spawn_loop(live, "the loader", shutdown.clone(), loader::run(self.clone(), shutdown.clone()));
        // The lease is kept until the claims are given back: a lease lapsing while the last
        // attempts finish would let another process send them again.
        let stop_lease = CancellationToken::new();
        let leases =
            spawn_loop(live, "the lease renewal", stop_lease.clone(), lease::keep(self.clone(), stop_lease.clone()));
        // The owner outlives the pumping: attempts still finishing report to it.
        let stop_owner = CancellationToken::new();
        let pumping = owner::run(self.clone(), lanes, inbox, shutdown.clone(), stop_owner.clone());
        let owner = spawn_loop(live, "the pump", stop_owner.clone(), pumping);
        shutdown.cancelled().await;
        let running = Running {
            loader,
            writer: (stop_outcomes, writer),
            flusher: (stop_latency, flusher),
            owner: (stop_owner, owner),
            leases: (stop_lease, leases),
        };
        self.wind_down(running, &deadline).await;
    }

    /// The stop, once the loader has been told to: attempts finish, outcomes are written,
    /// the rest is given back. Every wait ends by the deadline, so a store that does not
    /// answer (locked, full) cannot hold the stop past the grace period, whichever step it
    /// is in; what it could not take stays claimed and is recovered (at the next start on
    /// SQLite, when the lease lapses on PostgreSQL) and sent again, as at-least-once allows.
    async fn wind_down(&self, running: Running, deadline: &StopDeadline) {
        let Running { loader, writer, flusher, owner, leases } = running;
        let now = tokio::time::Instant::now();
        let deadline = match self.liveness.failure() {
            Some(_) => deadline.start(FAILURE_GRACE).min(now + FAILURE_GRACE),
            None => deadline.start(self.config.queue.shutdown_grace),
        };
        let _ = tokio::time::timeout_at(deadline, loader).await;
        self.attempts.close();
        // The attempts get what is left of the grace period but a reserve, in which their
        // outcomes are recorded and the rest is given back.
        let reserve = (deadline.saturating_duration_since(now) / 10).clamp(STOP_RESERVE_MIN, STOP_RESERVE_MAX);
        if tokio::time::timeout_at(deadline - reserve, self.attempts.wait()).await.is_err() {
            tracing::warn!("attempts still in flight at the end of the grace period; their deliveries will be retried");
        }
        // Every finished attempt has handed over its outcome: write them, then stop.
        if !stop_and_wait(writer, deadline).await {
            tracing::error!("the outcomes were still being written at the end of the grace period; left unrecorded");
        }
        stop_and_wait(flusher, deadline).await;
        let drain = |lanes: &mut Lanes, dispatcher: &Dispatcher| {
            let waiting = lanes.drain_waiting().len();
            dispatcher.room.release(waiting);
            waiting
        };
        let waiting = self.ask(drain).await.unwrap_or_default();
        stop_and_wait(owner, deadline).await;
        // Renewals end first: one racing the release below would find the name gone and
        // register a new one for a process that is stopping.
        stop_and_wait(leases, deadline).await;
        match tokio::time::timeout_at(deadline, self.store.release_owner(&self.owner())).await {
            Ok(Ok(released)) => tracing::info!(waiting, released, "dispatcher stopped; deliveries released"),
            Ok(Err(e)) => tracing::error!(error = %e, "releasing deliveries at shutdown failed"),
            Err(_) => tracing::error!("releasing deliveries was not done at the end of the grace period; left claimed"),
        }
    }

    /// Runs the lanes' owner without pumping, until `stop`: in a process that does not
    /// deliver (`role = "api"`), the API's reads and changes find empty lanes and are
    /// answered at once.
    pub async fn run_idle(self: Arc<Self>, stop: CancellationToken) {
        let (inbox, lanes) = self.inbox.lock().unwrap_or_else(|p| p.into_inner()).take().expect("run once");
        let pumping = CancellationToken::new();
        pumping.cancel();
        owner::run(self, lanes, inbox, pumping, stop).await;
    }

    /// Restores what outlives a restart: saved circuit breakers and latency history.
    async fn restore(&self) {
        match self.store.breakers().await {
            Ok(saved) => {
                let mut restored = Vec::new();
                for (endpoint, breaker) in saved {
                    let reach = self.catalog.target(&endpoint).await.ok().flatten().map(|t| t.reach());
                    restored.push((endpoint, breaker, reach));
                }
                self.tell(move |lanes, _| {
                    for (endpoint, breaker, reach) in restored {
                        lanes.restore_breaker(endpoint, breaker, reach);
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "loading circuit breakers failed; they start closed"),
        }
        self.latency.load(self.store.as_ref()).await;
    }
}

/// Sleeps until a wall-clock time in milliseconds, or forever when there is none.
async fn sleep_until_ms(due: Option<Millis>) {
    match due {
        Some(due) => {
            let wait = (due - now_ms()).max(0) as u64;
            tokio::time::sleep(Duration::from_millis(wait)).await
        }
        None => std::future::pending().await,
    }
}
