//! What reads ask for (pages, filters, dead letters) and the portal's tokens and sessions.

use serde::Serialize;

use super::*;
use crate::clock::Millis;
use crate::ids::{AppId, EndpointId, MessageId};

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
