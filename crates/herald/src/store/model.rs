//! The records the store keeps, independent of any database.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::endpoint_settings::DeliverySettings;
use crate::ids::{AppId, AttemptId, EndpointId, MessageId, PollerId};

pub type Metadata = BTreeMap<String, String>;

/// One of our user's customers.
#[derive(Debug, Clone, PartialEq)]
pub struct App {
    pub id: AppId,
    pub uid: Option<String>,
    pub name: String,
    pub metadata: Metadata,
    pub throttle_rate: Option<u16>,
    /// Attempts in flight at most (Herald extension; default 16).
    pub max_concurrency: Option<u32>,
    /// Share of contended delivery capacity (Herald extension; default 1).
    pub weight: Option<u32>,
    /// The portal's brand for this application, over the server's (Herald extension).
    pub portal_brand: Option<crate::brand::Brand>,
    /// The egress proxy this application's attempts go through, over the server's
    /// (Herald extension; operator only): its URL without credentials, and those sealed.
    pub proxy: Option<AppProxy>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// An application's egress proxy as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppProxy {
    /// `http://host:port`, without credentials.
    pub url: String,
    /// `user:password`, sealed (empty text: none).
    pub credentials: SealedAuth,
}

/// An endpoint's signing secrets: the current one, and earlier ones that keep signing until
/// their overlap after a rotation ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Secrets {
    pub current: String,
    #[serde(default)]
    pub previous: Vec<PreviousSecret>,
}

/// An endpoint's [`Secrets`] as stored: sealed under the server key, bound to the endpoint's
/// id (see `crate::sealing`). Stores keep it as opaque text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSecrets(pub String);

/// An endpoint's own request headers (e.g. `Authorization` for the receiver), by name.
pub type Headers = BTreeMap<String, String>;

/// An endpoint's [`Headers`] as stored: sealed like its secrets (empty text: none). Rows
/// written before headers were sealed hold plain JSON until the start-up pass seals them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealedHeaders(pub String);

/// What an endpoint presents to its receiver (`delivery_auth::Credentials`: `auth` and
/// `tls`) as stored: sealed (empty text: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealedAuth(pub String);

impl SealedHeaders {
    /// Whether this is a plain JSON object left from before headers were sealed.
    pub fn is_plaintext(&self) -> bool {
        self.0.starts_with('{')
    }
}

/// An endpoint's jq expressions, as set through the API (stored with the endpoint).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scripts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<String>,
}

impl Scripts {
    pub fn is_empty(&self) -> bool {
        self.filter.is_none() && self.transform.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviousSecret {
    pub key: String,
    pub expires_at: Millis,
}

/// A URL of an application that receives messages, with its filters and settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub id: EndpointId,
    pub app_id: AppId,
    pub uid: Option<String>,
    pub url: String,
    pub description: String,
    pub disabled: bool,
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    pub metadata: Metadata,
    pub throttle_rate: Option<u16>,
    pub headers: SealedHeaders,
    pub secrets: SealedSecrets,
    pub delivery: DeliverySettings,
    /// Herald extension: the request's method, URL template and body format (postbacks).
    pub request: Option<crate::postback::RequestSettings>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Herald extension: the jq filter and transform.
    pub scripts: Scripts,
    /// Herald extension: the credentials presented to the receiver.
    pub auth: SealedAuth,
    /// Svix's deprecated `version`: set by callers (at least 1), read back, used by nothing.
    pub version: i32,
}

/// An application's messages for consumers that pull them (Herald extension): the same
/// event-type, channel and jq filters as an endpoint, and named consumers that each keep
/// their own position.
#[derive(Debug, Clone, PartialEq)]
pub struct Poller {
    pub id: PollerId,
    pub app_id: AppId,
    pub uid: Option<String>,
    pub description: String,
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    pub filter: Option<String>,
    pub metadata: Metadata,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A place in an application's message log, in commit order: every message committed
/// later sorts after it. SQLite: the message's seq (one writer commits in seq order).
/// PostgreSQL: (the inserting transaction's id, the message id), read only below the
/// oldest transaction still running, so a transaction that commits late cannot land
/// behind a reader's position.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    pub major: i64,
    pub minor: String,
}

/// How a consumer's position may move (see `PollStore::move_consumer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Only to a later position.
    Forward,
    /// To any position.
    To,
}

/// A poller's consumer as the portal shows it: its name and when its position last moved
/// (an acknowledged page, or a seek).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerState {
    pub name: String,
    pub moved_at: Millis,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventType {
    pub name: String,
    pub description: String,
    pub archived: bool,
    pub deprecated: bool,
    pub schemas: Option<serde_json::Value>,
    pub feature_flag: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// An event as accepted. `payload` is the JSON text exactly as received (it is what gets
/// signed and sent); `None` once expunged.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub id: MessageId,
    pub app_id: AppId,
    pub event_type: String,
    pub event_id: Option<String>,
    pub channels: Option<Vec<String>>,
    pub payload: Option<Arc<str>>,
    pub created_at: Millis,
    /// The context of the span that accepted it (OpenTelemetry), which its attempts'
    /// spans hang under; stored as a W3C `traceparent`. `None` when tracing was off.
    pub trace: Option<opentelemetry::trace::SpanContext>,
}

/// One delivery to create with a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    pub endpoint: EndpointId,
    /// The endpoint takes its messages one at a time, in order (never claimed at ingest).
    pub strict: bool,
}

/// A message to commit, with one delivery per matching endpoint.
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub message: Message,
    pub deliveries: Vec<NewDelivery>,
    /// Claim the deliveries for this owner at once (the caller will dispatch them from
    /// memory); `None` leaves them for whoever claims next.
    pub owner: Option<String>,
    /// Stored in the same transaction, so a retried request can never create a second
    /// message.
    pub idempotency: Option<IdempotencyRecord>,
}

#[derive(Debug, Clone)]
pub struct IdempotencyRecord {
    pub scope: String,
    pub key: String,
    pub response: StoredResponse,
}

/// A response kept for an idempotency key: a repeated key gets it back, whatever its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: String,
    pub created_at: Millis,
}

#[derive(Debug, Clone, PartialEq)]
pub enum IngestResult {
    /// Committed; the delivery ids are in the order of `NewMessage::deliveries`.
    Created { deliveries: Vec<i64> },
    /// The idempotency key was used before: here is the first response.
    Replayed(StoredResponse),
    /// Another message of this application already has this `eventId`.
    DuplicateEventId,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Waiting for its first attempt or a retry.
    Pending,
    Delivered,
    /// A dead letter: failed permanently or ran out of attempts.
    Dead,
    /// Its endpoint was deleted before it was delivered.
    Canceled,
}

impl DeliveryState {
    pub fn code(self) -> i64 {
        match self {
            Self::Pending => 0,
            Self::Delivered => 1,
            Self::Dead => 2,
            Self::Canceled => 3,
        }
    }

    pub fn from_code(code: i64) -> Self {
        match code {
            1 => Self::Delivered,
            2 => Self::Dead,
            3 => Self::Canceled,
            _ => Self::Pending,
        }
    }
}

/// The Svix message status: success 0, pending 1, fail 2, sending 3 (retrying after a
/// failed attempt).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStatus {
    Success,
    Pending,
    Fail,
    Sending,
}

impl DeliveryStatus {
    pub fn code(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::Pending => 1,
            Self::Fail => 2,
            Self::Sending => 3,
        }
    }

    pub fn from_code(code: i64) -> Option<Self> {
        Some(match code {
            0 => Self::Success,
            1 => Self::Pending,
            2 => Self::Fail,
            3 => Self::Sending,
            _ => return None,
        })
    }

    pub fn text(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Pending => "pending",
            Self::Fail => "fail",
            Self::Sending => "sending",
        }
    }

    pub fn of(state: DeliveryState, attempts: u32) -> Self {
        match state {
            DeliveryState::Delivered => Self::Success,
            DeliveryState::Dead | DeliveryState::Canceled => Self::Fail,
            DeliveryState::Pending if attempts == 0 => Self::Pending,
            DeliveryState::Pending => Self::Sending,
        }
    }
}

/// A delivery as the API shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryView {
    pub endpoint_id: EndpointId,
    pub state: DeliveryState,
    pub attempts: u32,
    pub next_at: Option<Millis>,
}

impl DeliveryView {
    pub fn status(&self) -> DeliveryStatus {
        DeliveryStatus::of(self.state, self.attempts)
    }
}

/// What started an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Scheduled,
    Manual,
}

impl Trigger {
    pub fn code(self) -> u8 {
        match self {
            Self::Scheduled => 0,
            Self::Manual => 1,
        }
    }

    pub fn from_code(code: i64) -> Self {
        if code == 1 { Self::Manual } else { Self::Scheduled }
    }
}

/// One HTTP try, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub id: AttemptId,
    pub msg_id: MessageId,
    pub endpoint_id: EndpointId,
    pub app_id: AppId,
    pub created_at: Millis,
    pub url: String,
    /// 0 when no response arrived.
    pub status_code: u16,
    pub duration_ms: u64,
    pub delivered: bool,
    pub error_class: Option<String>,
    pub error: Option<String>,
    /// The first bytes of the response body (truncated).
    pub response: String,
    pub trigger: Trigger,
    /// 1 for the first attempt of a delivery's current round.
    pub attempt_no: u32,
    /// The delivery it was made for (also its `herald-sequence`).
    pub delivery_id: i64,
}

/// A claimed delivery with what is needed to attempt it (no second read).
#[derive(Debug, Clone)]
pub struct ClaimedDelivery {
    pub delivery_id: i64,
    pub endpoint_id: EndpointId,
    pub message: Arc<Message>,
    pub attempts: u32,
    pub next_at: Millis,
    pub trigger: Trigger,
}

/// The state a delivery moves to after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextState {
    Delivered,
    /// Retry at this time; `keep` keeps the claim (the retry waits in memory).
    Retry {
        at: Millis,
        keep: bool,
    },
    Dead,
    /// The endpoint is gone: no attempt is recorded.
    Canceled,
}

#[derive(Debug, Clone)]
pub struct OutcomeRecord {
    pub delivery_id: i64,
    /// When the message was accepted (for the delivery-time statistics).
    pub message_created_at: Millis,
    /// The attempt to append (absent when nothing was sent, e.g. a cancelled delivery).
    pub attempt: Option<Attempt>,
    pub attempts: u32,
    pub next: NextState,
}

/// What became of an outcome handed to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded: the delivery is in the outcome's next state.
    Applied,
    /// Recorded, but a resend was accepted while the attempt was under way: the attempt may
    /// have started before the request, so it cannot stand for it. The delivery is pending
    /// again, unclaimed, for a manual attempt with a fresh retry budget.
    Resent,
    /// The claim was gone (released or taken over): nothing was recorded.
    ClaimLost,
}

impl Recorded {
    /// Whether the attempt was written.
    pub fn recorded(self) -> bool {
        self != Self::ClaimLost
    }
}

/// A manual retry request.
#[derive(Debug, Clone)]
pub enum Requeue {
    /// Svix `resend`: one message to one endpoint, whatever its state. A delivery held by a
    /// dispatcher is marked instead, and requeued when its attempt's outcome comes in (see
    /// [`Recorded::Resent`]): an accepted resend always leads to an attempt that starts
    /// after it.
    Resend { app: AppId, msg: MessageId, endpoint: EndpointId },
    /// Svix `recover`: every dead letter of an endpoint created in the time range.
    Recover { endpoint: EndpointId, since: Millis, until: Millis },
    /// These deliveries, those of them still dead letters (a filtered bulk replay).
    DeadLetters { ids: Vec<i64> },
}

/// Which dead letters to look at: those that died in `[dead_since, dead_until)`, of one
/// application (or all), optionally narrowed by the last attempt's result and the message.
#[derive(Debug, Clone, Default)]
pub struct DeadLetterFilter {
    pub app: Option<AppId>,
    pub endpoint: Option<EndpointId>,
    pub dead_since: Millis,
    pub dead_until: Option<Millis>,
    pub status_code: Option<u16>,
    pub error_class: Option<String>,
    pub event_type: Option<String>,
    /// Rows returned at most.
    pub limit: usize,
}

/// One dead letter with what its last attempt said.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub delivery_id: i64,
    pub app_id: AppId,
    pub endpoint_id: EndpointId,
    pub msg_id: MessageId,
    pub event_type: String,
    pub dead_at: Millis,
    pub attempts: u32,
    /// The last attempt's status code (0: no response) and error class and message.
    pub status_code: u16,
    pub error_class: Option<String>,
    pub error: Option<String>,
}

/// What the retention purge removes, in batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purge {
    /// Payloads of messages older than the cut-off with nothing left to deliver (their
    /// metadata stays; they read as expunged).
    Payloads,
    /// Response bodies of older attempts.
    Responses,
    /// Older attempt rows, except those of deliveries still pending.
    Attempts,
}

/// Deliveries of an endpoint by Svix status (also the API's `EndpointStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EndpointStats {
    pub success: u64,
    pub pending: u64,
    pub sending: u64,
    pub fail: u64,
    pub canceled: u64,
}

/// `text` as a `LIKE` pattern matching it anywhere (a backslash escapes the wildcards).
pub fn contains_pattern(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
    format!("%{escaped}%")
}

/// Keyset pagination: ids are time-sortable, so "after this id" is the iterator.
#[derive(Debug, Clone, Default)]
pub struct PageQuery {
    pub limit: usize,
    pub iterator: Option<String>,
    pub descending: bool,
}

#[derive(Debug, Clone, Default)]
pub struct MessageFilter {
    pub channel: Option<String>,
    pub event_types: Vec<String>,
    pub before: Option<Millis>,
    pub after: Option<Millis>,
}

#[derive(Debug, Clone)]
pub struct AttemptFilter {
    pub app: AppId,
    pub msg: Option<MessageId>,
    pub endpoint: Option<EndpointId>,
    /// Svix status: 0 success, 2 fail (attempts are never pending).
    pub status: Option<DeliveryStatus>,
    /// 0 for "no response", else 100, 200, … 500.
    pub status_code_class: Option<u16>,
    pub messages: MessageFilter,
    pub with_content: bool,
}

impl AttemptFilter {
    /// Every attempt of the application, newest first, with or without response bodies.
    pub fn of_app(app: &AppId, with_content: bool) -> Self {
        Self {
            app: app.clone(),
            msg: None,
            endpoint: None,
            status: None,
            status_code_class: None,
            messages: MessageFilter::default(),
            with_content,
        }
    }

    /// Every attempt at one endpoint of the application.
    pub fn of_endpoint(app: &AppId, endpoint: &EndpointId, with_content: bool) -> Self {
        Self { endpoint: Some(endpoint.clone()), ..Self::of_app(app, with_content) }
    }

    /// Every attempt of one message of the application.
    pub fn of_message(app: &AppId, msg: &MessageId, with_content: bool) -> Self {
        Self { msg: Some(msg.clone()), ..Self::of_app(app, with_content) }
    }
}

/// An app-portal access token (only its hash is stored).
#[derive(Debug, Clone, PartialEq)]
pub struct PortalToken {
    pub hash: String,
    pub app_id: AppId,
    pub expires_at: Millis,
    pub created_at: Millis,
    /// May read payload fields configured as sensitive (otherwise they are masked).
    pub sensitive: bool,
    /// Svix's feature flags: event types gated by a flag not in this list are hidden.
    pub feature_flags: Vec<String>,
}

/// A dashboard session. The browser holds a random secret in a cookie; the store keeps
/// only its hash. It ends at `expires_at`, at sign-out, when the operator revokes it, or
/// when the token it signed in with stops being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// SHA-256 (hex) of the cookie's secret.
    pub hash: String,
    /// The name it is listed and revoked by (`ses_…`).
    pub id: String,
    /// The application of a portal session; `None` for an operator session.
    pub app_id: Option<AppId>,
    /// SHA-256 (hex) of the token it signed in with.
    pub token_hash: String,
    pub created_at: Millis,
    pub expires_at: Millis,
}

/// Which sessions to end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndSessions {
    /// The one whose cookie secret has this hash (sign-out).
    Hash(String),
    /// The one with this id.
    Id(String),
    /// Every session of one application.
    App(AppId),
    /// Every session.
    All,
    /// Those that expired before this time (housekeeping).
    ExpiredBefore(Millis),
}

/// The counts behind the health summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SummaryCounts {
    /// Pending deliveries not attempted yet.
    pub pending: u64,
    /// Pending deliveries waiting for a retry.
    pub awaiting_retry: u64,
    pub dead: u64,
    pub oldest_pending_at: Option<Millis>,
    pub delivered_last_hour: u64,
    pub failed_last_hour: u64,
    /// Sum of message-to-delivery times of the deliveries of the last hour, in ms.
    pub delivery_ms_last_hour: u64,
}

/// Outcome counts of one minute (summary statistics), folded from recorded outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MinuteCounts {
    pub delivered: i64,
    pub failed: i64,
    pub delivery_ms: i64,
    /// Deliveries whose outcome dead-lettered them.
    pub dead: i64,
}

impl MinuteCounts {
    /// Groups applied outcomes by the minute of their attempt.
    pub fn of<'a>(outcomes: impl Iterator<Item = &'a OutcomeRecord>) -> std::collections::BTreeMap<i64, Self> {
        let mut minutes = std::collections::BTreeMap::<i64, Self>::new();
        for outcome in outcomes {
            let Some(attempt) = &outcome.attempt else { continue };
            let counts = minutes.entry(attempt.created_at.div_euclid(60_000)).or_default();
            if attempt.delivered {
                counts.delivered += 1;
                counts.delivery_ms += (attempt.created_at - outcome.message_created_at).max(0);
            } else {
                counts.failed += 1;
            }
            counts.dead += i64::from(matches!(outcome.next, NextState::Dead));
        }
        minutes
    }
}

/// Attempts of one endpoint in one hour that succeeded and failed (the charts' bars),
/// folded from recorded outcomes in (endpoint, hour) order, the order rows are locked in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HourCounts {
    pub succeeded: i64,
    pub failed: i64,
}

impl HourCounts {
    pub fn of<'a>(
        outcomes: impl Iterator<Item = &'a OutcomeRecord>,
    ) -> std::collections::BTreeMap<(&'a EndpointId, i64), Self> {
        let mut hours = std::collections::BTreeMap::<(&EndpointId, i64), Self>::new();
        for attempt in outcomes.filter_map(|o| o.attempt.as_ref()) {
            let counts = hours.entry((&attempt.endpoint_id, attempt.created_at.div_euclid(3_600_000))).or_default();
            if attempt.delivered {
                counts.succeeded += 1;
            } else {
                counts.failed += 1;
            }
        }
        hours
    }
}

/// What happened in one minute, for the operator's charts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MinuteTotals {
    pub minute: i64,
    /// Messages accepted through the API (outbox messages are not counted here).
    pub accepted: u64,
    pub delivered: u64,
    /// Failed attempts.
    pub failed: u64,
    /// Deliveries dead-lettered.
    pub dead: u64,
    /// The queue's depth when sampled in this minute (waiting for a first attempt, for a
    /// retry), if it was.
    pub queue: Option<(u64, u64)>,
}

/// One circuit breaker transition of an endpoint, as the process that saw it recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakerEvent {
    pub at: Millis,
    pub kind: BreakerEventKind,
    /// Consecutive failures when it happened.
    pub failures: u32,
    /// The cooldown then in force.
    pub cooldown_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerEventKind {
    Opened,
    /// A failed probe opened it again (with the cooldown doubled).
    Reopened,
    /// A probe succeeded.
    Closed,
    /// The endpoint was changed (URL, request settings, headers) or enabled again.
    Reset,
    /// "Retry now": the probe was let go before the cooldown ended.
    RetryNow,
}

impl BreakerEventKind {
    pub const ALL: [Self; 5] = [Self::Opened, Self::Reopened, Self::Closed, Self::Reset, Self::RetryNow];

    pub fn name(self) -> &'static str {
        match self {
            Self::Opened => "opened",
            Self::Reopened => "reopened",
            Self::Closed => "closed",
            Self::Reset => "reset",
            Self::RetryNow => "retryNow",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}
