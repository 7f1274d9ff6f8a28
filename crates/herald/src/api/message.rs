//! `/api/v1/app/{app_id}/msg`: creating messages (durable ingest) and reading them back.

use std::sync::Arc;

use axum::Extension;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::Response;
use opentelemetry::trace::SpanContext;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::application::{ApplicationIn, app_for_inline};
use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap, TraceParent};
use super::idempotency::Keyed;
use super::list::{Cursor, ListResponse, Order, Page};
use super::routes::Routes;
use super::validate::Problems;
use super::{AppState, VisibleApp, VisibleMessage, require_admin_for};
use crate::clock::{now_ms, to_rfc3339};
use crate::ids::MessageId;
use crate::ingest::Route;
use crate::redaction::Redactor;
use crate::store::{IngestResult, Message, MessageFilter};
use utoipa_axum::routes;

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
    /// `rawPayload`: a string sent (and signed) as the request body instead of `payload`.
    pub transformations_params: Option<TransformationsParams>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransformationsParams {
    /// Sent byte for byte as the body of every request, instead of `payload` (which is still
    /// required). Reads show it as JSON when it is JSON, else as `{"expired": true}`.
    pub raw_payload: Option<String>,
}

impl MessageIn {
    /// What is stored, signed and sent: `rawPayload` if given, else the payload as given.
    fn body(&self) -> &str {
        match self.transformations_params.as_ref().and_then(|t| t.raw_payload.as_deref()) {
            Some(raw) => raw,
            None => self.payload.get(),
        }
    }
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
    /// Herald extension: the payload was expunged (it reads as `{"expired": true}`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub payload_expunged: bool,
}

/// What an expunged payload reads as, as in Svix.
const EXPUNGED_PAYLOAD: &str = r#"{"expired":true}"#;

/// The payload as JSON: `{}` when left out, `{"expired": true}` once expunged (or when a
/// `rawPayload` was not JSON).
fn payload_json(m: &Message, with_content: bool) -> Box<RawValue> {
    let text = match (with_content, m.payload.as_deref()) {
        (false, _) => "{}",
        (true, None) => EXPUNGED_PAYLOAD,
        (true, Some(payload)) => payload,
    };
    // A `rawPayload` that is not JSON reads as Svix shows it.
    RawValue::from_string(text.to_owned())
        .unwrap_or_else(|_| RawValue::from_string(EXPUNGED_PAYLOAD.into()).expect("valid JSON"))
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
        .operations(routes!(list_messages, create_message))
        .operations(routes!(get_message))
        .operations(routes!(expunge_content))
}

fn check(state: &AppState, input: &MessageIn) -> ApiResult<()> {
    let payload = input.payload.get();
    let limit = state.limits.max_payload_bytes;
    if input.body().len() > limit {
        return Err(ApiError::PayloadTooLarge(format!(
            "the message payload is {} bytes; the limit is {limit} bytes (server.max_payload_bytes)",
            input.body().len()
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
/// response (the layer in `idempotency` replays it); a repeated `eventId` is a 409.
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
    keyed: Option<Extension<Arc<Keyed>>>,
    TraceParent(traceparent): TraceParent,
    body: JsonBody<MessageIn>,
) -> ApiResult<Response> {
    // A span for the request, under the caller's `traceparent` if it sent one; the message
    // keeps its context, so its commit and attempts join the same trace.
    let span = state.traces.ingest(traceparent.as_ref());
    let trace = span.context();
    let accepted = span.scope(accept(&state, &principal, &app_id, &query, keyed, body.value, trace)).await;
    match &accepted {
        Ok((response, msg)) => span.answered(response.status(), &app_id, msg.as_ref()),
        Err(e) => span.answered(e.status(), &app_id, None),
    }
    accepted.map(|(response, _)| response)
}

/// The answer to a message create, and the id of the message it made (none when an
/// idempotent request got another's answer).
async fn accept(
    state: &AppState,
    principal: &Principal,
    app_id: &str,
    query: &QueryMap,
    keyed: Option<Extension<Arc<Keyed>>>,
    mut input: MessageIn,
    trace: Option<SpanContext>,
) -> ApiResult<(Response, Option<MessageId>)> {
    require_admin_for(state, principal, app_id, "messages are created by the operator's admin token").await?;
    if state.liveness.failure().is_some() {
        return Err(ApiError::Stopping);
    }
    check(state, &input)?;
    let app = app_for_inline(state, app_id, input.application.take()).await?;
    let with_content = query.flag("with_content", true)?;
    let payload = Some(input.body().into());
    let message = Message {
        id: MessageId::generate(),
        app_id: app.id.clone(),
        event_type: input.event_type,
        event_id: input.event_id,
        channels: input.channels,
        payload,
        created_at: now_ms(),
        trace,
    };
    let id = message.id.clone();
    let response_body = serde_json::to_string(&MessageOut::new(&message, with_content)).map_err(anyhow::Error::from)?;
    // The idempotency layer left the key's lookup and its answer to the ingest transaction.
    let idempotency = keyed.as_ref().map(|k| k.record_message(&app.id, &id, with_content));
    match state.ingestor.ingest(message, Route::Matching, idempotency).await? {
        IngestResult::Created { .. } => Ok((json_response(StatusCode::ACCEPTED, response_body), Some(id))),
        // The key was taken before (or by another process meanwhile): its answer is the answer.
        IngestResult::Replayed(stored) => {
            Ok((keyed.expect("a replay follows an idempotency key").replay(state, stored).await?, None))
        }
        IngestResult::DuplicateEventId => {
            Err(ApiError::Conflict("a message with this eventId already exists in this application".into()))
        }
    }
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg", operation_id = "v1.message.list", tag = "Message",
    params(("app_id" = String, Path), ("limit" = Option<usize>, Query), ("iterator" = Option<String>, Query),
        ("channel" = Option<String>, Query), ("before" = Option<String>, Query), ("after" = Option<String>, Query),
        ("with_content" = Option<bool>, Query), ("event_types" = Option<Vec<String>>, Query)),
    responses((status = 200, body = ListResponse<MessageOut>)))]
pub async fn list_messages(
    State(state): State<AppState>,
    principal: Principal,
    app: VisibleApp,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<MessageOut>>> {
    let page = Page::from_query(&query, Order::AlwaysDescending, Cursor::Id(MessageId::PREFIX))?;
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
    message: VisibleMessage,
    query: QueryMap,
) -> ApiResult<Json<MessageOut>> {
    let (_, message) = message.into_parts();
    Ok(Json(MessageOut::shown(&message, query.flag("with_content", true)?, state.mask_for(&principal))))
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}/msg/{msg_id}/content", operation_id = "v1.message.expunge-content",
    tag = "Message", params(("app_id" = String, Path), ("msg_id" = String, Path)), responses((status = 204)))]
pub async fn expunge_content(State(state): State<AppState>, message: VisibleMessage) -> ApiResult<StatusCode> {
    let (app, message) = message.into_parts();
    state.store.expunge_message(&app.id, &message.id).await?;
    Ok(StatusCode::NO_CONTENT)
}
