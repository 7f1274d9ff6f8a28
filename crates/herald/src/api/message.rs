//! `/api/v1/app/{app_id}/msg`: creating messages (durable ingest) and reading them back.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

use super::application::{ApplicationIn, create_app_from};
use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap};
use super::list::{ListResponse, Page};
use super::routes::Routes;
use super::validate::Problems;
use super::{AppState, require_admin_for, visible_app, visible_message};
use crate::clock::{now_ms, to_rfc3339};
use crate::ids::MessageId;
use crate::ingest::Route;
use crate::redaction::Redactor;
use crate::store::{IdempotencyRecord, IngestResult, Message, MessageFilter, StoredResponse};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageIn {
    pub event_type: String,
    pub event_id: Option<String>,
    pub channels: Option<Vec<String>>,
    /// Any JSON object; sent to endpoints byte for byte as given.
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    /// Accepted for compatibility (5 to 90 days); retention is configured server-side.
    pub payload_retention_period: Option<i64>,
    /// Creates the application (with the path as its uid) if it does not exist yet.
    pub application: Option<ApplicationIn>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageOut {
    pub id: String,
    pub event_type: String,
    pub event_id: Option<String>,
    pub channels: Option<Vec<String>>,
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
    pub timestamp: String,
    /// Herald extension: the payload was expunged (it reads as `{}`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub payload_expunged: bool,
}

/// The payload as JSON, or `{}` when left out or expunged.
fn payload_json(m: &Message, with_content: bool) -> Box<RawValue> {
    let text = m.payload.as_deref().filter(|_| with_content).unwrap_or("{}");
    RawValue::from_string(text.to_owned()).unwrap_or_else(|_| RawValue::from_string("{}".into()).expect("valid JSON"))
}

impl MessageOut {
    pub fn new(m: &Message, with_content: bool) -> Self {
        Self {
            id: m.id.to_string(),
            event_type: m.event_type.clone(),
            event_id: m.event_id.clone(),
            channels: m.channels.clone(),
            payload: payload_json(m, with_content),
            timestamp: to_rfc3339(m.created_at),
            payload_expunged: m.payload.is_none(),
        }
    }

    /// The message as a reader sees it: with `mask` (readers without the `sensitive`
    /// permission), configured sensitive payload fields read as `[redacted]`.
    pub fn shown(m: &Message, with_content: bool, mask: Option<&Redactor>) -> Self {
        let mut out = Self::new(m, with_content);
        if let (Some(redactor), true, Some(payload)) = (mask, with_content, m.payload.as_deref())
            && let Some(masked) = redactor.mask(&m.event_type, payload)
            && let Ok(raw) = RawValue::from_string(masked)
        {
            out.payload = raw;
        }
        out
    }
}

pub fn routes() -> Routes {
    Routes::new()
        .get("/api/v1/app/{app_id}/msg", list_messages)
        .post("/api/v1/app/{app_id}/msg", create_message)
        .get("/api/v1/app/{app_id}/msg/{msg_id}", get_message)
        .delete("/api/v1/app/{app_id}/msg/{msg_id}/content", expunge_content)
}

fn check(state: &AppState, input: &MessageIn) -> ApiResult<()> {
    let payload = input.payload.get();
    let limit = state.limits.max_payload_bytes;
    if payload.len() > limit {
        return Err(ApiError::PayloadTooLarge(format!(
            "the message payload is {} bytes; the limit is {limit} bytes (server.max_payload_bytes)",
            payload.len()
        )));
    }
    let mut p = Problems::default();
    p.slug("eventType", &input.event_type, 256);
    if let Some(event_id) = &input.event_id {
        p.slug("eventId", event_id, 256);
    }
    if let Some(channels) = &input.channels {
        p.slug_list("channels", channels, 128, 5);
    }
    p.check(payload.trim_start().starts_with('{'), "payload", "must be a JSON object");
    if let Some(days) = input.payload_retention_period {
        p.check((5..=90).contains(&days), "payloadRetentionPeriod", "must be between 5 and 90");
    }
    p.finish()
}

fn json_response(status: StatusCode, body: String) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("static parts are valid")
}

/// Accepts a message: answers 202 only once the message and one delivery per matching
/// endpoint are durably committed. A repeated `idempotency-key` returns the first
/// response; a repeated `eventId` is a 409.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/msg", operation_id = "v1.message.create", tag = "Message",
    request_body = MessageIn, params(("app_id" = String, Path), ("with_content" = Option<bool>, Query),
        ("idempotency-key" = Option<String>, Header)),
    responses((status = 202, body = MessageOut), (status = 409, body = super::error::HttpErrorOut),
        (status = 413, body = super::error::HttpErrorOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn create_message(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    query: QueryMap,
    headers: HeaderMap,
    body: JsonBody<MessageIn>,
) -> ApiResult<Response> {
    require_admin_for(&state, &principal, &app_id, "messages are created by the operator's admin token").await?;
    if state.liveness.failure().is_some() {
        return Err(ApiError::Stopping);
    }
    let JsonBody { value: mut input, raw } = body;
    check(&state, &input)?;
    let app = match (state.catalog.app(&app_id).await?, input.application.take()) {
        (Some(app), _) => app,
        (None, Some(new_app)) => std::sync::Arc::new(create_app_from(&state, new_app, Some(&app_id)).await?),
        (None, None) => return Err(ApiError::NotFound("application")),
    };
    let with_content = query.flag("with_content", true)?;
    let message = Message {
        id: MessageId::generate(),
        app_id: app.id.clone(),
        event_type: input.event_type,
        event_id: input.event_id,
        channels: input.channels,
        payload: Some(input.payload.get().into()),
        created_at: now_ms(),
    };
    let response_body = serde_json::to_string(&MessageOut::new(&message, with_content)).map_err(anyhow::Error::from)?;
    let idempotency = match super::idempotency::key(&headers)? {
        Some(key) => {
            let scope = format!("msg:{}", app.id);
            let fingerprint = format!("{:x}", Sha256::digest(&raw));
            if let Some(stored) = state.store.idempotent_response(&scope, key).await? {
                return replay(stored, &fingerprint);
            }
            let response = StoredResponse {
                fingerprint,
                status: StatusCode::ACCEPTED.as_u16(),
                body: response_body.clone(),
                created_at: message.created_at,
            };
            Some(IdempotencyRecord { scope, key: key.to_owned(), response })
        }
        None => None,
    };
    let fingerprint = idempotency.as_ref().map(|r| r.response.fingerprint.clone());
    match state.ingestor.ingest(message, Route::Matching, idempotency).await? {
        IngestResult::Created { .. } => Ok(json_response(StatusCode::ACCEPTED, response_body)),
        IngestResult::Replayed(stored) => replay(stored, &fingerprint.unwrap_or_default()),
        IngestResult::DuplicateEventId => {
            Err(ApiError::Conflict("a message with this eventId already exists in this application".into()))
        }
    }
}

/// The first response for an idempotency key, if the request is the same one.
pub fn replay(stored: StoredResponse, fingerprint: &str) -> ApiResult<Response> {
    if stored.fingerprint != fingerprint {
        return Err(ApiError::invalid(
            "",
            "this idempotency-key was already used for a different request; use a new key",
        ));
    }
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    Ok(json_response(status, stored.body))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg", operation_id = "v1.message.list", tag = "Message",
    params(("app_id" = String, Path), ("limit" = Option<usize>, Query), ("iterator" = Option<String>, Query),
        ("channel" = Option<String>, Query), ("before" = Option<String>, Query), ("after" = Option<String>, Query),
        ("with_content" = Option<bool>, Query), ("event_types" = Option<Vec<String>>, Query)),
    responses((status = 200, body = ListResponse<MessageOut>)))]
pub async fn list_messages(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<MessageOut>>> {
    let app = visible_app(&state, &principal, &app_id).await?;
    let page = Page::from_query(&query, true)?;
    let filter = message_filter(&query)?;
    let with_content = query.flag("with_content", true)?;
    let found = state.store.list_messages(&app.id, &filter, &page.query()).await?;
    let mask = state.mask_for(&principal);
    Ok(Json(page.finish(found, |m| m.id.to_string(), |m| MessageOut::shown(&m, with_content, mask))))
}

/// The shared message filters of list endpoints.
pub fn message_filter(query: &QueryMap) -> ApiResult<MessageFilter> {
    Ok(MessageFilter {
        channel: query.get("channel")?,
        event_types: query.list("event_types"),
        before: query.time("before")?,
        after: query.time("after")?,
    })
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg/{msg_id}", operation_id = "v1.message.get", tag = "Message",
    params(("app_id" = String, Path), ("msg_id" = String, Path), ("with_content" = Option<bool>, Query)),
    responses((status = 200, body = MessageOut)))]
pub async fn get_message(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, msg_id)): Path<(String, String)>,
    query: QueryMap,
) -> ApiResult<Json<MessageOut>> {
    let (_, message) = visible_message(&state, &principal, &app_id, &msg_id).await?;
    Ok(Json(MessageOut::shown(&message, query.flag("with_content", true)?, state.mask_for(&principal))))
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}/msg/{msg_id}/content", operation_id = "v1.message.expunge-content",
    tag = "Message", params(("app_id" = String, Path), ("msg_id" = String, Path)), responses((status = 204)))]
pub async fn expunge_content(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, msg_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let (app, message) = visible_message(&state, &principal, &app_id, &msg_id).await?;
    state.store.expunge_message(&app.id, &message.id).await?;
    Ok(StatusCode::NO_CONTENT)
}
