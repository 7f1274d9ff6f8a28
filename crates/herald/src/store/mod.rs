//! Storage: one interface, implemented once per database. Everything durable goes through
//! the [`Store`] trait; nothing else in Herald speaks SQL.
//!
//! The interface is split by domain into seven sub-traits: [`CatalogStore`] (applications,
//! endpoints, event types), [`MessageStore`] (ingest and the history of messages and
//! attempts), [`QueueStore`] (claiming work, recording outcomes), [`AccessStore`] (tokens,
//! sessions, idempotency records and retention), [`HealthStore`] (breakers, latency,
//! summary counts), [`HistoryStore`] (the charts' per-minute and per-hour totals) and
//! [`PollStore`] (pollers and their consumers). They mean something: a part of Herald that
//! works in one domain takes only that sub-trait (the catalog a `CatalogStore`, the latency
//! tracker and the health reads a `HealthStore`, bulk replay a `QueueStore`, retention an
//! `AccessStore`, the history recorder a `HistoryStore`); only those that work across
//! several (the API's state, the dispatcher, ingest, alerts, the server's wiring) hold the
//! whole [`Store`]. Backends live in submodules (`sqlite`, `postgres`).

#[cfg(test)]
pub mod conformance;
mod model;
mod packing;
pub mod postgres;
mod sql;
pub mod sqlite;
mod wakeups;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{Notify, broadcast};

pub use model::*;
pub use wakeups::{AppWakeups, AppWatch, RECHECK as LOG_RECHECK};

use crate::breaker::Breaker;
use crate::clock::Millis;
use crate::ids::{AppId, EndpointId, MessageId, PollerId};
use crate::latency::Histogram;

/// Storage failures. Callers distinguish conflicts (the caller's mistake) from the rest.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A uniqueness rule was violated (uid, event id, event type name).
    #[error("conflict: {0}")]
    Conflict(&'static str),
    /// The database cannot be reached or refused the operation (disk full, locked, down).
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// Anything else: a bug or corrupted data.
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Waits between tries of `keep_trying`; the last repeats.
const KEEP_TRYING_DELAYS_MS: &[u64] = &[100, 250, 500, 1000, 2000, 5000];
/// Tries before `keep_trying` gives up (about five minutes).
const KEEP_TRYING_TRIES: usize = 64;

/// Repeats a store call until it answers, for work that must not be dropped while the
/// store is briefly away (a restart, a lost connection): deliveries just claimed, repairs
/// after an uncertain commit. Gives up after about five minutes with the last error.
pub async fn keep_trying<T, F, Fut>(what: &str, mut call: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<T>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Err(e) if attempt + 1 < KEEP_TRYING_TRIES => {
                tracing::warn!(error = %e, what, "the store is not answering; retrying");
                let delay = KEEP_TRYING_DELAYS_MS[attempt.min(KEEP_TRYING_DELAYS_MS.len() - 1)];
                tokio::time::sleep(Duration::from_millis(delay)).await;
                attempt += 1;
            }
            Err(e) => {
                tracing::error!(error = %e, what, "the store did not answer for minutes; giving up");
                return Err(e);
            }
            done => return done,
        }
    }
}

/// Applications, endpoints and event types.
#[async_trait]
pub trait CatalogStore: Send + Sync {
    async fn insert_app(&self, app: &App) -> StoreResult<()>;
    /// Finds an application by id or by uid.
    async fn app(&self, id_or_uid: &str) -> StoreResult<Option<App>>;
    async fn list_apps(&self, page: &PageQuery) -> StoreResult<Vec<App>>;
    /// Replaces an application's row if it is still the version last read (its
    /// `updated_at` is `read_at`); false when another write came first (read it again).
    async fn update_app(&self, app: &App, read_at: Millis) -> StoreResult<bool>;
    /// Deletes an application with its endpoints, messages, deliveries and attempts.
    async fn delete_app(&self, id: &AppId) -> StoreResult<()>;

    /// Adds an endpoint unless its application has `cap` endpoints already (false then).
    async fn insert_endpoint(&self, endpoint: &Endpoint, cap: usize) -> StoreResult<bool>;
    /// Finds an endpoint of `app` by id or by uid.
    async fn endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>>;
    async fn endpoint_by_id(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>>;
    /// An endpoint deleted since, as it was (without secrets and headers): what a message's
    /// attempted destinations still show.
    async fn deleted_endpoint(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>>;
    async fn list_endpoints(&self, app: &AppId, page: &PageQuery) -> StoreResult<Vec<Endpoint>>;
    /// Every endpoint of an application (for routing).
    async fn app_endpoints(&self, app: &AppId) -> StoreResult<Vec<Endpoint>>;
    /// Replaces an endpoint's row if it is still the version last read (its `updated_at` is
    /// `read_at`); false when another write came first (read it again).
    async fn update_endpoint(&self, endpoint: &Endpoint, read_at: Millis) -> StoreResult<bool>;
    /// Deletes an endpoint; its pending deliveries are cancelled.
    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<()>;

    /// Inserts or replaces an event type; returns whether it was created.
    async fn upsert_event_type(&self, event_type: &EventType) -> StoreResult<bool>;
    async fn insert_event_type(&self, event_type: &EventType) -> StoreResult<()>;
    /// Replaces an event type if it is still the version last read (its `updated_at` is
    /// `read_at`); false when another write came first, or it is gone.
    async fn update_event_type(&self, event_type: &EventType, read_at: Millis) -> StoreResult<bool>;
    async fn event_type(&self, name: &str) -> StoreResult<Option<EventType>>;
    async fn list_event_types(&self, page: &PageQuery, include_archived: bool) -> StoreResult<Vec<EventType>>;
    /// Archives an event type, or removes it when `expunge`; returns whether it existed.
    async fn delete_event_type(&self, name: &str, expunge: bool) -> StoreResult<bool>;

    /// The operator's search: applications whose name contains `text` (any case) or whose
    /// id or uid is `text`, and endpoints whose URL contains it; at most `limit` of each.
    async fn search_catalog(&self, text: &str, limit: usize) -> StoreResult<(Vec<App>, Vec<Endpoint>)>;
}

/// Ingest and the record of messages, deliveries and attempts.
#[async_trait]
pub trait MessageStore: Send + Sync {
    /// Commits a message with its deliveries (and its idempotency record) in one transaction.
    async fn ingest(&self, new: NewMessage) -> StoreResult<IngestResult>;
    /// A message of `app` by id or by `eventId`.
    async fn message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>>;
    async fn list_messages(&self, app: &AppId, filter: &MessageFilter, page: &PageQuery) -> StoreResult<Vec<Message>>;
    /// Messages of any application whose id or `eventId` is `id_or_event_id`, newest first.
    async fn find_messages(&self, id_or_event_id: &str, limit: usize) -> StoreResult<Vec<Message>>;
    /// Removes a message's payload, keeping its metadata; returns whether it existed.
    async fn expunge_message(&self, app: &AppId, id: &MessageId) -> StoreResult<bool>;

    async fn list_attempts(&self, filter: &AttemptFilter, page: &PageQuery) -> StoreResult<Vec<Attempt>>;
    async fn attempt(&self, app: &AppId, msg: &MessageId, id: &str) -> StoreResult<Option<Attempt>>;
    async fn expunge_attempt(&self, app: &AppId, msg: &MessageId, id: &str) -> StoreResult<bool>;
    /// The messages sent to an endpoint with that endpoint's delivery state, newest first.
    async fn endpoint_messages(
        &self,
        endpoint: &EndpointId,
        filter: &MessageFilter,
        status: Option<DeliveryStatus>,
        page: &PageQuery,
    ) -> StoreResult<Vec<(Message, DeliveryView)>>;
    /// The deliveries of one message (one per destination endpoint).
    async fn message_deliveries(&self, msg: &MessageId, page: &PageQuery) -> StoreResult<Vec<DeliveryView>>;
    async fn endpoint_stats(
        &self,
        endpoint: &EndpointId,
        since: Option<Millis>,
        until: Option<Millis>,
    ) -> StoreResult<EndpointStats>;
}

/// The work queue: claiming deliveries, recording outcomes, requeueing.
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Claims up to `limit` unowned pending deliveries due at or before `due_before`
    /// (strictly ordered endpoints excepted: see `claim_heads`).
    async fn claim(&self, owner: &str, due_before: Millis, limit: usize) -> StoreResult<Vec<ClaimedDelivery>>;
    /// For strictly ordered endpoints: claims the oldest pending delivery of each endpoint
    /// whose oldest pending delivery is unowned and due (so at most one per endpoint is ever
    /// held, anywhere).
    async fn claim_heads(&self, owner: &str, due_before: Millis, limit: usize) -> StoreResult<Vec<ClaimedDelivery>>;
    /// Records attempts and the deliveries' next states in one transaction, each only if
    /// `owner` still holds that delivery; returns, per record, what became of it.
    async fn record_outcomes(&self, owner: &str, outcomes: Vec<OutcomeRecord>) -> StoreResult<Vec<Recorded>>;
    /// Gives deliveries back to the queue (graceful shutdown, memory pressure).
    async fn release(&self, owner: &str, deliveries: Vec<i64>) -> StoreResult<()>;
    /// Gives back the pending deliveries of one message that `owner` holds: after an
    /// ingest whose answer was lost, the commit may have happened with nobody working on
    /// its deliveries. Returns how many were given back (0: it did not commit).
    async fn release_message(&self, owner: &str, msg: &MessageId) -> StoreResult<u64>;
    /// Gives back every delivery `owner` still holds (end of a graceful shutdown).
    async fn release_owner(&self, owner: &str) -> StoreResult<u64>;
    /// Drops every claim: used at start-up by a backend that only one process can open.
    async fn release_all(&self) -> StoreResult<u64>;
    /// Announces a process that will claim deliveries under `owner`.
    async fn register_node(&self, owner: &str) -> StoreResult<()>;
    /// Renews `owner`'s lease; false when it expired and its deliveries were given to
    /// others (the process must then drop everything it holds and register anew).
    async fn heartbeat(&self, owner: &str) -> StoreResult<bool>;
    /// Releases the deliveries of processes whose lease expired more than `lease` ago and
    /// forgets those processes; returns how many deliveries were released.
    async fn reap_expired(&self, lease: Duration) -> StoreResult<u64>;
    /// Releases pending deliveries claimed under a name no registered process holds (a
    /// claim that raced its owner's expiry); returns how many. Nothing to do on a store
    /// only one process opens.
    async fn release_orphans(&self) -> StoreResult<u64> {
        Ok(0)
    }
    /// Puts deliveries back to pending for a manual retry; returns how many.
    async fn requeue(&self, request: Requeue) -> StoreResult<u64>;
    /// Dead letters matching `filter`, most recently dead first.
    async fn dead_letters(&self, filter: &DeadLetterFilter) -> StoreResult<Vec<DeadLetter>>;
}

/// Access tokens and dashboard sessions, and the upkeep that removes old data: idempotency
/// records and the retention purges.
#[async_trait]
pub trait AccessStore: Send + Sync {
    async fn insert_token(&self, token: &PortalToken) -> StoreResult<()>;
    async fn token(&self, hash: &str) -> StoreResult<Option<PortalToken>>;
    async fn revoke_token(&self, hash: &str) -> StoreResult<()>;
    /// Makes every portal token of `app` expire at `at` at the latest; returns how many
    /// were still valid then.
    async fn expire_tokens(&self, app: &AppId, at: Millis) -> StoreResult<u64>;
    /// The portal tokens of `app` that have not expired at `now`, newest first.
    async fn app_tokens(&self, app: &AppId, now: Millis) -> StoreResult<Vec<PortalToken>>;
    async fn insert_session(&self, session: &Session) -> StoreResult<()>;
    /// The session whose cookie secret has this hash, expired or not.
    async fn session(&self, hash: &str) -> StoreResult<Option<Session>>;
    /// Every session (of one application, or all), newest first.
    async fn list_sessions(&self, app: Option<&AppId>) -> StoreResult<Vec<Session>>;
    /// Ends sessions; returns how many.
    async fn end_sessions(&self, which: EndSessions) -> StoreResult<u64>;
    async fn idempotent_response(&self, scope: &str, key: &str) -> StoreResult<Option<StoredResponse>>;
    async fn save_idempotent_response(&self, scope: &str, key: &str, response: &StoredResponse) -> StoreResult<()>;
    /// Forgets up to `limit` idempotency records created before `before`; returns how many.
    async fn prune_idempotency(&self, before: Millis, limit: usize) -> StoreResult<u64>;
    /// Removes up to `limit` of what `what` names, created before `before`; returns how many.
    async fn purge(&self, what: Purge, before: Millis, limit: usize) -> StoreResult<u64>;
}

/// Health data: circuit breakers, latency histograms and the summary counts.
#[async_trait]
pub trait HealthStore: Send + Sync {
    /// Saves a breaker's state (`None`: plainly closed, nothing to remember).
    async fn save_breaker(&self, endpoint: &EndpointId, breaker: Option<&Breaker>) -> StoreResult<()>;
    /// Every saved breaker.
    async fn breakers(&self) -> StoreResult<Vec<(EndpointId, Breaker)>>;
    /// Adds histogram counts to the stored ones (endpoint, hour, counts).
    async fn merge_latency(&self, deltas: Vec<(EndpointId, i64, Histogram)>) -> StoreResult<()>;
    /// Stored histograms from `since_hour` on, of these endpoints or of all.
    async fn latency_since(
        &self,
        since_hour: i64,
        endpoints: Option<&[EndpointId]>,
    ) -> StoreResult<Vec<(EndpointId, i64, Histogram)>>;
    async fn summary(&self, now: Millis) -> StoreResult<SummaryCounts>;
    /// Drops latency hours, endpoint hours, breaker events and summary minutes older than
    /// `before`.
    async fn prune_health(&self, before: Millis) -> StoreResult<u64>;
    /// Tells the other processes sharing the store to let the probe of the endpoint's open
    /// breaker go now ("retry now"); nothing to do for a store of one process.
    async fn announce_retry_now(&self, app: &AppId, endpoint: &EndpointId) -> StoreResult<()>;
}

/// The history the charts draw and the breakers' log: written as it happens (counts with
/// the outcomes that make them, accepted counts and queue samples by each process's
/// [`crate::history::Recorder`]), read back per minute or hour for at most seven days.
#[async_trait]
pub trait HistoryStore: Send + Sync {
    /// Adds messages accepted per minute (minute, count), as each process flushes them.
    async fn add_accepted(&self, counts: Vec<(i64, u64)>) -> StoreResult<()>;
    /// Records the queue's depth in `minute` (the largest sample of the minute stays).
    async fn sample_queue(&self, minute: i64, pending: u64, retrying: u64) -> StoreResult<()>;
    /// Per-minute totals from `since_minute` on, oldest first (quiet minutes are absent).
    async fn minute_totals(&self, since_minute: i64) -> StoreResult<Vec<MinuteTotals>>;
    /// Succeeded and failed attempts per hour from `since_hour` on, of these endpoints.
    async fn endpoint_hours(
        &self,
        since_hour: i64,
        endpoints: &[EndpointId],
    ) -> StoreResult<Vec<(EndpointId, i64, HourCounts)>>;
    /// Appends a circuit breaker transition to the endpoint's log.
    async fn log_breaker(&self, endpoint: &EndpointId, event: &BreakerEvent) -> StoreResult<()>;
    /// The endpoint's breaker log from `since` on, newest first, at most `limit`.
    async fn breaker_events(
        &self,
        endpoint: &EndpointId,
        since: Millis,
        limit: usize,
    ) -> StoreResult<Vec<BreakerEvent>>;
}

/// Pollers and their consumers' positions (Herald extension: pull consumers), and the
/// application's message log read in commit order.
#[async_trait]
pub trait PollStore: Send + Sync {
    /// Adds a poller unless its application has `cap` pollers already (false then).
    async fn insert_poller(&self, poller: &Poller, cap: usize) -> StoreResult<bool>;
    /// A poller by id or uid.
    async fn poller(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Poller>>;
    async fn list_pollers(&self, app: &AppId, page: &PageQuery) -> StoreResult<Vec<Poller>>;
    /// Replaces a poller if it is still the version last read (its `updated_at` is
    /// `read_at`); false when another write came first, or it is gone.
    async fn update_poller(&self, poller: &Poller, read_at: Millis) -> StoreResult<bool>;
    /// Deletes the poller and its consumers' positions.
    async fn delete_poller(&self, app: &AppId, id: &PollerId) -> StoreResult<()>;
    /// Where a consumer stands; `None` for a consumer never seen (it starts at the
    /// beginning of what is retained).
    async fn consumer_position(&self, poller: &PollerId, consumer: &str) -> StoreResult<Option<LogPosition>>;
    /// Moves a consumer to `at`: only forward with [`Move::Forward`] (an acknowledgement: a
    /// position it passed stays, whatever the order of concurrent requests), anywhere with
    /// [`Move::To`] (a seek). A consumer not seen before is added only while the poller has
    /// fewer than `cap`; false when it was refused for that.
    async fn move_consumer(
        &self,
        poller: &PollerId,
        consumer: &str,
        at: &LogPosition,
        how: Move,
        cap: usize,
    ) -> StoreResult<bool>;
    /// Up to `limit` of the poller's consumers, the most recently moved first.
    async fn consumers(&self, poller: &PollerId, limit: usize) -> StoreResult<Vec<ConsumerState>>;
    /// Up to `limit` messages of `app` after `after`, in commit order, each with its
    /// position. Only messages no earlier transaction can still join are returned.
    async fn messages_after(
        &self,
        app: &AppId,
        after: &LogPosition,
        limit: usize,
    ) -> StoreResult<Vec<(LogPosition, Message)>>;
    /// The position of a message of `app` (for seeking past it).
    async fn message_position(&self, app: &AppId, id: &MessageId) -> StoreResult<Option<LogPosition>>;
    /// The position just before the first retained message of `app` created at or after
    /// `at` (for seeking to a time).
    async fn position_at(&self, app: &AppId, at: Millis) -> StoreResult<LogPosition>;
    /// The position of `app`'s last readable message, for a store shared by processes
    /// whose commits this one does not hear of (see `AppWakeups`); `None` elsewhere.
    async fn log_head(&self, _app: &AppId) -> StoreResult<Option<LogPosition>> {
        Ok(None)
    }
}

/// A change another process made to applications or endpoints, announced through the
/// database so every process's catalog forgets its stale copy (and its dispatcher looks
/// at the endpoint's circuit breaker again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogChange {
    App(AppId),
    Endpoint(AppId, EndpointId),
    /// "Retry now" on the endpoint's open circuit breaker.
    RetryNow(AppId, EndpointId),
    /// A resend of a message to an endpoint was accepted while a process held it.
    Resend(AppId, EndpointId, MessageId),
    /// Announcements may have been missed (a reconnect): forget everything.
    All,
}

/// What processes sharing a database tell each other (`work`, `catalog`; a backend used by
/// one process only never fires them), and what the store tells its own process
/// (`messages`).
#[derive(Clone)]
pub struct Signals {
    /// Claimable work appeared (a delivery committed unclaimed, a requeue, a reaped lease).
    pub work: Arc<Notify>,
    pub catalog: broadcast::Sender<CatalogChange>,
    /// This process committed messages of an application (its pollers' long-polls wake).
    pub messages: Arc<AppWakeups>,
}

impl Default for Signals {
    fn default() -> Self {
        Self { work: Arc::new(Notify::new()), catalog: broadcast::channel(1024).0, messages: Arc::default() }
    }
}

/// Everything Herald needs from a database.
pub trait Store:
    CatalogStore + MessageStore + QueueStore + AccessStore + HealthStore + HistoryStore + PollStore + 'static
{
    fn signals(&self) -> &Signals;
    /// Whether several processes may share this store (claims then need live leases).
    fn shared(&self) -> bool;
}
