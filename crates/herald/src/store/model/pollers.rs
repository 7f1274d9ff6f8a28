//! Pollers and their consumers' positions.

use super::*;
use crate::clock::Millis;
use crate::ids::{AppId, PollerId};

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
