//! A poller's consumers (Herald extension): `GET …/poller/{poller}/consumer/{name}` reads the
//! next page of what the poller holds and acknowledges the previous one; `POST …/seek` moves
//! a consumer. Each named consumer keeps its own position server side, which moves only
//! forward when the consumer asks with the iterator it was given (at-least-once), or
//! anywhere with a seek.
//!
//! A long-poll (`wait_ms`) waits on its application's wake-ups only (`store::AppWakeups`),
//! and each wake-up reads on from where the request stopped, never from its start again
//! (`scan`): the poller's filter runs at most once per message per request. Long-polls
//! waiting at once are capped per application and per token (`waiting`).

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use chrono::DateTime;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::iterator::{iterator_of, position_of};
use super::scan::{MAX_WAIT, Scan, long_poll};
use crate::api::AppState;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult, ValidationItem};
use crate::api::extract::JsonBody;
use crate::api::scope::VisiblePoller;
use crate::api::validate::Problems;
use crate::ids::MessageId;
use crate::store::Move;

/// Messages a page holds at most (and by default).
const MAX_LIMIT: usize = 250;
const DEFAULT_LIMIT: usize = 50;
/// One message as a consumer reads it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolledMessage {
    pub id: String,
    pub event_type: String,
    pub event_id: Option<String>,
    pub channels: Option<Vec<String>>,
    pub timestamp: String,
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
}

/// A page of a consumer's messages.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolledPage {
    pub data: Vec<PolledMessage>,
    /// Ask with this next: it acknowledges this page and reads on from its end.
    pub iterator: String,
    /// Whether the consumer has read everything committed so far.
    pub done: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ConsumerQuery {
    /// Messages at most (1–250, default 50).
    pub limit: Option<usize>,
    /// The iterator of the previous page: acknowledges it.
    pub iterator: Option<String>,
    /// When nothing is there yet, wait up to this long (at most 30,000 ms) and answer as
    /// soon as a message arrives.
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct SeekIn {
    /// An RFC 3339 time (read on from the messages created then), or a message id (read on
    /// from the message after it).
    pub after: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SeekOut {
    pub iterator: String,
}

fn check_consumer(name: &str) -> ApiResult<()> {
    let mut problems = Problems::default();
    problems.slug("consumer_id", name, 64);
    problems.finish()
}

/// A new consumer beyond the poller's cap.
fn too_many_consumers(cap: usize) -> ApiError {
    let loc = vec!["path".into(), "consumer_id".into()];
    let msg = format!("this poller has {cap} consumers, the most it may have (tenants.max_consumers_per_poller)");
    ApiError::Validation(vec![ValidationItem { loc, msg, kind: "value_error".into() }])
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller/{poller_id}/consumer/{consumer_id}",
    operation_id = "herald.poller.consume", tag = "Poller",
    params(("app_id" = String, Path), ("poller_id" = String, Path), ("consumer_id" = String, Path), ConsumerQuery),
    responses((status = 200, body = PolledPage), (status = 410, body = crate::api::error::HttpErrorOut),
        (status = 429, body = crate::api::error::HttpErrorOut)))]
pub async fn consume(
    State(state): State<AppState>,
    principal: Principal,
    poller: VisiblePoller,
    Path((_, _, consumer)): Path<(String, String, String)>,
    Query(query): Query<ConsumerQuery>,
) -> ApiResult<Json<PolledPage>> {
    let (app, poller) = poller.into_parts();
    // Everything is checked before anything moves: a refused request leaves the consumer.
    check_consumer(&consumer)?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("must be between 1 and {MAX_LIMIT}")));
    }
    let wait = Duration::from_millis(query.wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(ApiError::invalid("wait_ms", "must be at most 30000"));
    }
    let iterator = query.iterator.as_deref().map(position_of).transpose()?;
    // An iterator acknowledges the page before it: the consumer's position moves there (it
    // never moves back; an older iterator reads again from where it points).
    let start = match iterator {
        Some(at) => {
            let cap = state.settings.tenants.max_consumers_per_poller;
            if !state.store.move_consumer(&poller.id, &consumer, &at, Move::Forward, cap).await? {
                return Err(too_many_consumers(cap));
            }
            at
        }
        None => state.store.consumer_position(&poller.id, &consumer).await?.unwrap_or_default(),
    };
    let mut scan = Scan::new(start, limit);
    long_poll(&state, &principal, &app, &poller, &mut scan, Instant::now() + wait).await?;
    Ok(Json(scan.page()))
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/poller/{poller_id}/consumer/{consumer_id}/seek",
    operation_id = "herald.poller.seek", tag = "Poller", request_body = SeekIn,
    params(("app_id" = String, Path), ("poller_id" = String, Path), ("consumer_id" = String, Path)),
    responses((status = 200, body = SeekOut)))]
pub async fn seek(
    State(state): State<AppState>,
    poller: VisiblePoller,
    Path((_, _, consumer)): Path<(String, String, String)>,
    body: JsonBody<SeekIn>,
) -> ApiResult<Json<SeekOut>> {
    let (app, poller) = poller.into_parts();
    check_consumer(&consumer)?;
    let after = body.value.after;
    let at = if let Ok(time) = DateTime::parse_from_rfc3339(&after) {
        state.store.position_at(&app.id, time.timestamp_millis()).await?
    } else {
        let id = MessageId::parse(&after)
            .ok_or_else(|| ApiError::invalid("after", "must be an RFC 3339 time or a message id"))?;
        state.store.message_position(&app.id, &id).await?.ok_or(ApiError::NotFound("message"))?
    };
    let cap = state.settings.tenants.max_consumers_per_poller;
    if !state.store.move_consumer(&poller.id, &consumer, &at, Move::To, cap).await? {
        return Err(too_many_consumers(cap));
    }
    Ok(Json(SeekOut { iterator: iterator_of(&at) }))
}
