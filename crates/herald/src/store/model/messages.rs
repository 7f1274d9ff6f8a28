//! Messages, their deliveries and attempts, and what ingest and outcomes write.

use std::sync::Arc;

use crate::clock::Millis;
use crate::ids::{AppId, AttemptId, EndpointId, MessageId};

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
