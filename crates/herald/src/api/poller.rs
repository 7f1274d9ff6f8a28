//! Pollers (Herald extension): `/api/v1/app/{app_id}/poller` for consumers that cannot
//! receive webhooks and pull their messages instead. A poller filters like an endpoint
//! (event types, channels, a jq filter); each named consumer keeps its own position server
//! side, which moves only when the consumer asks for the next page with the iterator it was
//! given (at-least-once), or seeks. A long-poll (`wait_ms`) waits on the store's wake-ups,
//! not on a loop of queries.

use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::DateTime;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap};
use super::list::{Cursor, ListResponse, Order, Page};
use super::routes::Routes;
use super::validate::{Problems, double_option};
use super::{AppState, visible_app};
use crate::clock::{now_ms, to_rfc3339};
use crate::ids::{MessageId, PollerId};
use crate::scripts::{self, Verdict};
use crate::store::{App, LogPosition, Message, Metadata, Poller};

/// Messages a page holds at most (and by default).
const MAX_LIMIT: usize = 250;
const DEFAULT_LIMIT: usize = 50;
/// The longest long-poll.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// How often a waiting long-poll on a shared database looks again without a wake-up:
/// messages committed by other processes, or through the outbox in producers' own
/// transactions, and the end of a transaction that held the log's horizon, send none.
const SHARED_RECHECK: Duration = Duration::from_secs(1);
/// Messages one request looks at at most, matching or not: a poller that matches little
/// of a busy application answers with fewer (or none) and an iterator past what it read.
const SCAN_BUDGET: usize = 2_000;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PollerIn {
    pub uid: Option<String>,
    pub description: Option<String>,
    #[serde(alias = "filterTypes")]
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    /// A jq expression on `{eventType, channels, payload}`; the poller holds a message only
    /// if it yields `true`.
    pub filter: Option<String>,
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PollerPatch {
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub uid: Option<Option<String>>,
    pub description: Option<String>,
    #[serde(default, alias = "filterTypes", deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<String>>)]
    pub event_types: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<String>>)]
    pub channels: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub filter: Option<Option<String>>,
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PollerOut {
    pub id: String,
    pub uid: Option<String>,
    pub description: String,
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    pub metadata: Metadata,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&Poller> for PollerOut {
    fn from(p: &Poller) -> Self {
        Self {
            id: p.id.to_string(),
            uid: p.uid.clone(),
            description: p.description.clone(),
            event_types: p.event_types.clone(),
            channels: p.channels.clone(),
            filter: p.filter.clone(),
            metadata: p.metadata.clone(),
            created_at: to_rfc3339(p.created_at),
            updated_at: to_rfc3339(p.updated_at),
        }
    }
}

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

pub fn routes() -> Routes {
    Routes::new()
        .get("/api/v1/app/{app_id}/poller", list_pollers)
        .post("/api/v1/app/{app_id}/poller", create_poller)
        .get("/api/v1/app/{app_id}/poller/{poller_id}", get_poller)
        .patch("/api/v1/app/{app_id}/poller/{poller_id}", patch_poller)
        .delete("/api/v1/app/{app_id}/poller/{poller_id}", delete_poller)
        .get("/api/v1/app/{app_id}/poller/{poller_id}/consumer/{consumer_id}", consume)
        .post("/api/v1/app/{app_id}/poller/{poller_id}/consumer/{consumer_id}/seek", seek)
}

/// A poller of a visible application (404 otherwise, as for every other id).
async fn visible_poller(
    state: &AppState,
    principal: &Principal,
    app_id: &str,
    poller_id: &str,
) -> ApiResult<(std::sync::Arc<App>, Poller)> {
    let app = visible_app(state, principal, app_id).await?;
    match state.store.poller(&app.id, poller_id).await? {
        Some(poller) => Ok((app, poller)),
        None => Err(ApiError::NotFound("poller")),
    }
}

/// Checks every field of a poller about to be stored.
fn check_poller(p: &Poller) -> ApiResult<()> {
    let mut problems = Problems::default();
    if let Some(uid) = &p.uid {
        problems.uid("uid", uid, PollerId::PREFIX);
    }
    match &p.event_types {
        Some(types) if types.is_empty() => problems.push("eventTypes", "must have at least one item"),
        Some(types) => problems.slug_list("eventTypes", types, 256, 1000),
        None => {}
    }
    if let Some(channels) = &p.channels {
        problems.slug_list("channels", channels, 128, 10);
    }
    if let Some(code) = &p.filter
        && let Err(problem) = scripts::check(code)
    {
        problems.push("filter", problem.to_string());
    }
    problems.finish()
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller", operation_id = "herald.poller.list", tag = "Poller",
    params(("app_id" = String, Path)), responses((status = 200, body = ListResponse<PollerOut>)))]
pub async fn list_pollers(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<PollerOut>>> {
    let app = visible_app(&state, &principal, &app_id).await?;
    let page = Page::from_query(&query, Order::Descending, Cursor::Id(PollerId::PREFIX))?;
    let found = state.store.list_pollers(&app.id, &page.query()).await?;
    Ok(Json(page.finish(found, |p| p.id.to_string(), |p| PollerOut::from(&p))))
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/poller", operation_id = "herald.poller.create", tag = "Poller",
    request_body = PollerIn, params(("app_id" = String, Path)),
    responses((status = 201, body = PollerOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn create_poller(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    body: JsonBody<PollerIn>,
) -> ApiResult<(StatusCode, Json<PollerOut>)> {
    let app = visible_app(&state, &principal, &app_id).await?;
    let input = body.value;
    let now = now_ms();
    let poller = Poller {
        id: PollerId::generate(),
        app_id: app.id.clone(),
        uid: input.uid,
        description: input.description.unwrap_or_default(),
        event_types: input.event_types,
        channels: input.channels,
        filter: input.filter,
        metadata: input.metadata.unwrap_or_default(),
        created_at: now,
        updated_at: now,
    };
    check_poller(&poller)?;
    state.store.insert_poller(&poller).await?;
    Ok((StatusCode::CREATED, Json(PollerOut::from(&poller))))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller/{poller_id}", operation_id = "herald.poller.get", tag = "Poller",
    params(("app_id" = String, Path), ("poller_id" = String, Path)), responses((status = 200, body = PollerOut)))]
pub async fn get_poller(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, poller_id)): Path<(String, String)>,
) -> ApiResult<Json<PollerOut>> {
    let (_, poller) = visible_poller(&state, &principal, &app_id, &poller_id).await?;
    Ok(Json(PollerOut::from(&poller)))
}

#[utoipa::path(patch, path = "/api/v1/app/{app_id}/poller/{poller_id}", operation_id = "herald.poller.patch", tag = "Poller",
    request_body = PollerPatch, params(("app_id" = String, Path), ("poller_id" = String, Path)),
    responses((status = 200, body = PollerOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn patch_poller(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, poller_id)): Path<(String, String)>,
    body: JsonBody<PollerPatch>,
) -> ApiResult<Json<PollerOut>> {
    let (_, mut poller) = visible_poller(&state, &principal, &app_id, &poller_id).await?;
    let patch = body.value;
    if let Some(uid) = patch.uid {
        poller.uid = uid;
    }
    if let Some(description) = patch.description {
        poller.description = description;
    }
    if let Some(types) = patch.event_types {
        poller.event_types = types;
    }
    if let Some(channels) = patch.channels {
        poller.channels = channels;
    }
    if let Some(filter) = patch.filter {
        poller.filter = filter;
    }
    if let Some(metadata) = patch.metadata {
        poller.metadata = metadata;
    }
    poller.updated_at = now_ms();
    check_poller(&poller)?;
    state.store.update_poller(&poller).await?;
    Ok(Json(PollerOut::from(&poller)))
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}/poller/{poller_id}", operation_id = "herald.poller.delete", tag = "Poller",
    params(("app_id" = String, Path), ("poller_id" = String, Path)), responses((status = 204)))]
pub async fn delete_poller(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, poller_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let (app, poller) = visible_poller(&state, &principal, &app_id, &poller_id).await?;
    state.store.delete_poller(&app.id, &poller.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The iterator text of a position (opaque to consumers).
fn iterator_of(at: &LogPosition) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", at.major, at.minor))
}

fn position_of(iterator: &str) -> ApiResult<LogPosition> {
    let bad = || ApiError::invalid("iterator", "is not an iterator this poller gave");
    let text = URL_SAFE_NO_PAD.decode(iterator).ok().and_then(|raw| String::from_utf8(raw).ok()).ok_or_else(bad)?;
    let (major, minor) = text.split_once('.').ok_or_else(bad)?;
    Ok(LogPosition { major: major.parse().map_err(|_| bad())?, minor: minor.to_owned() })
}

fn check_consumer(name: &str) -> ApiResult<()> {
    let mut problems = Problems::default();
    problems.slug("consumer_id", name, 64);
    problems.finish()
}

/// Whether the poller holds `message` (its event types, channels and filter).
async fn holds(state: &AppState, poller: &Poller, message: &Message) -> ApiResult<bool> {
    let types_ok = poller.event_types.as_ref().is_none_or(|types| types.contains(&message.event_type));
    let channels_ok = poller
        .channels
        .as_ref()
        .is_none_or(|wanted| message.channels.as_ref().is_some_and(|have| have.iter().any(|c| wanted.contains(c))));
    if !types_ok || !channels_ok {
        return Ok(false);
    }
    let Some(code) = &poller.filter else { return Ok(true) };
    let input = scripts::input(message, &[], "GET", "");
    match Verdict::of(state.sandbox.eval(code, &input).await) {
        Verdict::Pass => Ok(true),
        Verdict::Drop(_) => Ok(false),
        Verdict::Unavailable(why) => Err(ApiError::Unavailable(why)),
    }
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller/{poller_id}/consumer/{consumer_id}",
    operation_id = "herald.poller.consume", tag = "Poller",
    params(("app_id" = String, Path), ("poller_id" = String, Path), ("consumer_id" = String, Path), ConsumerQuery),
    responses((status = 200, body = PolledPage), (status = 410, body = super::error::HttpErrorOut)))]
pub async fn consume(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, poller_id, consumer)): Path<(String, String, String)>,
    Query(query): Query<ConsumerQuery>,
) -> ApiResult<Json<PolledPage>> {
    let (app, poller) = visible_poller(&state, &principal, &app_id, &poller_id).await?;
    check_consumer(&consumer)?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("must be between 1 and {MAX_LIMIT}")));
    }
    let committed = state.store.consumer_position(&poller.id, &consumer).await?.unwrap_or_default();
    // An iterator acknowledges the page before it: the consumer's position moves there (it
    // never moves back; an older iterator reads again from where it points).
    let start = match query.iterator.as_deref() {
        None => committed,
        Some(text) => {
            let at = position_of(text)?;
            if at > committed {
                state.store.save_consumer_position(&poller.id, &consumer, &at).await?;
            }
            at
        }
    };
    let wait = Duration::from_millis(query.wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(ApiError::invalid("wait_ms", "must be at most 30000"));
    }
    let deadline = Instant::now() + wait;
    loop {
        // Subscribed before reading, so a message committed in between still wakes it.
        let signals = state.store.signals();
        let (local, elsewhere) = (signals.messages.notified(), signals.work.notified());
        let page = read_page(&state, &principal, &app, &poller, start.clone(), limit).await?;
        let now = Instant::now();
        if !page.data.is_empty() || !page.done || now >= deadline {
            return Ok(Json(page));
        }
        let recheck = if state.store.shared() { SHARED_RECHECK } else { MAX_WAIT };
        let until = deadline.min(now + recheck);
        tokio::select! {
            () = local => {}
            () = elsewhere => {}
            () = tokio::time::sleep_until(until) => {}
        }
    }
}

/// The page after `start`: up to `limit` held messages within the scan budget.
async fn read_page(
    state: &AppState,
    principal: &Principal,
    app: &App,
    poller: &Poller,
    start: LogPosition,
    limit: usize,
) -> ApiResult<PolledPage> {
    let mask = state.mask_for(principal);
    let (mut data, mut at, mut scanned) = (Vec::new(), start, 0);
    let batch_size = (limit * 2).clamp(50, 500);
    loop {
        let batch = state.store.messages_after(&app.id, &at, batch_size).await?;
        let exhausted = batch.len() < batch_size;
        for (position, message) in batch {
            let Some(payload) = message.payload.as_deref() else {
                // Past the retention window: say where reading can resume.
                if data.is_empty() {
                    return Err(expired(state, app, &position).await);
                }
                return Ok(PolledPage { data, iterator: iterator_of(&at), done: false });
            };
            scanned += 1;
            if holds(state, poller, &message).await? {
                let shown =
                    mask.and_then(|r| r.mask(&message.event_type, payload)).unwrap_or_else(|| payload.to_owned());
                data.push(PolledMessage {
                    id: message.id.to_string(),
                    event_type: message.event_type.clone(),
                    event_id: message.event_id.clone(),
                    channels: message.channels.clone(),
                    timestamp: to_rfc3339(message.created_at),
                    payload: RawValue::from_string(shown).map_err(|e| ApiError::Internal(e.into()))?,
                });
            }
            at = position;
            if data.len() == limit || scanned >= SCAN_BUDGET {
                return Ok(PolledPage { data, iterator: iterator_of(&at), done: false });
            }
        }
        if exhausted {
            return Ok(PolledPage { data, iterator: iterator_of(&at), done: true });
        }
    }
}

/// The answer to a consumer whose next message is past the retention window: where the
/// retained messages begin.
async fn expired(state: &AppState, app: &App, first_gone: &LogPosition) -> ApiError {
    let mut at = first_gone.clone();
    loop {
        match state.store.messages_after(&app.id, &at, 500).await {
            Ok(batch) if batch.is_empty() => break,
            Ok(batch) => match batch.iter().position(|(_, m)| m.payload.is_some()) {
                Some(0) => break,
                Some(i) => {
                    at = batch[i - 1].0.clone();
                    break;
                }
                None => at = batch.last().expect("not empty").0.clone(),
            },
            Err(e) => return e.into(),
        }
    }
    ApiError::Gone(format!(
        "the messages after this position are past the retention window; resume with iterator {}",
        iterator_of(&at)
    ))
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/poller/{poller_id}/consumer/{consumer_id}/seek",
    operation_id = "herald.poller.seek", tag = "Poller", request_body = SeekIn,
    params(("app_id" = String, Path), ("poller_id" = String, Path), ("consumer_id" = String, Path)),
    responses((status = 200, body = SeekOut)))]
pub async fn seek(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, poller_id, consumer)): Path<(String, String, String)>,
    body: JsonBody<SeekIn>,
) -> ApiResult<Json<SeekOut>> {
    let (app, poller) = visible_poller(&state, &principal, &app_id, &poller_id).await?;
    check_consumer(&consumer)?;
    let after = body.value.after;
    let at = if let Ok(time) = DateTime::parse_from_rfc3339(&after) {
        state.store.position_at(&app.id, time.timestamp_millis()).await?
    } else {
        let id = MessageId::parse(&after)
            .ok_or_else(|| ApiError::invalid("after", "must be an RFC 3339 time or a message id"))?;
        state.store.message_position(&app.id, &id).await?.ok_or(ApiError::NotFound("message"))?
    };
    state.store.save_consumer_position(&poller.id, &consumer, &at).await?;
    Ok(Json(SeekOut { iterator: iterator_of(&at) }))
}
