//! Delivery counts per minute and hour, and circuit breaker events.

use super::*;
use crate::clock::Millis;
use crate::ids::EndpointId;

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
