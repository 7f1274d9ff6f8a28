//! Attempts and per-destination delivery status: the record of what happened to each
//! message at each endpoint, and `resend`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;

use super::auth::Principal;
use super::endpoint::EndpointOut;
use super::error::{ApiError, ApiResult, ValidationItem};
use super::extract::QueryMap;
use super::list::{Cursor, ListResponse, Order, Page};
use super::message::{MessageOut, message_filter};
use super::routes::Routes;
use super::{AppState, VisibleEndpoint, VisibleMessage};
use crate::clock::to_rfc3339;
use crate::ids::{AttemptId, EndpointId, MessageId};
use crate::store::{Attempt, AttemptFilter, DeliveryStatus, DeliveryView, Endpoint, Message, Requeue};
use utoipa_axum::routes;

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageAttemptOut {
    pub id: String,
    pub msg_id: String,
    pub endpoint_id: String,
    pub url: String,
    /// The start of the response body (up to 16 KiB).
    pub response: String,
    pub response_status_code: u16,
    pub response_duration_ms: u64,
    pub status: u8,
    pub status_text: String,
    pub timestamp: String,
    pub trigger_type: u8,
    /// Herald extension: 1 for the first attempt of the delivery's current round.
    pub attempt: u32,
    /// Herald extension: why the attempt failed (`http_status`, `timeout`,
    /// `blocked_destination`, …); absent on success.
    pub error_class: Option<String>,
    /// Herald extension: a human-readable reason when no response arrived.
    pub error: Option<String>,
}

impl From<Attempt> for MessageAttemptOut {
    fn from(a: Attempt) -> Self {
        let status = if a.delivered { DeliveryStatus::Success } else { DeliveryStatus::Fail };
        Self {
            id: a.id.to_string(),
            msg_id: a.msg_id.to_string(),
            endpoint_id: a.endpoint_id.to_string(),
            url: a.url,
            response: a.response,
            response_status_code: a.status_code,
            response_duration_ms: a.duration_ms,
            status: status.code(),
            status_text: status.text().into(),
            timestamp: to_rfc3339(a.created_at),
            trigger_type: a.trigger.code(),
            attempt: a.attempt_no,
            error_class: a.error_class,
            error: a.error,
        }
    }
}

/// A message as delivered to one endpoint.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointMessageOut {
    #[serde(flatten)]
    pub message: MessageOut,
    pub status: u8,
    pub status_text: String,
    pub next_attempt: Option<String>,
}

/// An endpoint a message was sent to, with that delivery's status.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageEndpointOut {
    #[serde(flatten)]
    pub endpoint: EndpointOut,
    pub status: u8,
    pub status_text: String,
    pub next_attempt: Option<String>,
}

fn status_fields(d: &DeliveryView) -> (u8, String, Option<String>) {
    let status = d.status();
    (status.code(), status.text().to_owned(), d.next_at.map(to_rfc3339))
}

pub fn routes() -> Routes {
    Routes::new()
        .operations(routes!(list_by_endpoint))
        .operations(routes!(list_by_msg))
        .operations(routes!(list_attempted_messages))
        .operations(routes!(list_attempted_destinations))
        .operations(routes!(get_attempt))
        .operations(routes!(expunge_attempt_content))
        .operations(routes!(resend))
}

/// Reads the `status` query parameter (0 success, 1 pending, 2 fail, 3 sending).
fn status_param(query: &QueryMap) -> ApiResult<Option<DeliveryStatus>> {
    match query.get::<i64>("status")? {
        None => Ok(None),
        Some(code) => DeliveryStatus::from_code(code)
            .map(Some)
            .ok_or_else(|| ApiError::Validation(vec![ValidationItem::query("status", "must be 0, 1, 2 or 3")])),
    }
}

fn attempt_filter(query: &QueryMap, app: &crate::ids::AppId) -> ApiResult<AttemptFilter> {
    let status_code_class = query.get::<u16>("status_code_class")?;
    if let Some(class) = status_code_class
        && !matches!(class, 0 | 100 | 200 | 300 | 400 | 500)
    {
        return Err(ApiError::Validation(vec![ValidationItem::query(
            "status_code_class",
            "must be 0, 100, 200, 300, 400 or 500",
        )]));
    }
    Ok(AttemptFilter {
        app: app.clone(),
        msg: None,
        endpoint: None,
        status: status_param(query)?,
        status_code_class,
        messages: message_filter(query)?,
        with_content: query.flag("with_content", true)?,
    })
}

type Attempts = Json<ListResponse<MessageAttemptOut>>;

#[utoipa::path(get, path = "/api/v1/app/{app_id}/attempt/endpoint/{endpoint_id}", operation_id = "v1.message-attempt.list-by-endpoint",
    tag = "Message Attempt", params(("app_id" = String, Path), ("endpoint_id" = String, Path), ("limit" = Option<usize>, Query),
        ("iterator" = Option<String>, Query), ("status" = Option<i64>, Query), ("status_code_class" = Option<u16>, Query),
        ("channel" = Option<String>, Query), ("before" = Option<String>, Query), ("after" = Option<String>, Query),
        ("with_content" = Option<bool>, Query), ("event_types" = Option<Vec<String>>, Query)),
    responses((status = 200, body = ListResponse<MessageAttemptOut>)))]
pub async fn list_by_endpoint(
    State(state): State<AppState>,
    endpoint: VisibleEndpoint,
    query: QueryMap,
) -> ApiResult<Attempts> {
    let (app, endpoint) = endpoint.into_parts();
    let page = Page::from_query(&query, Order::AlwaysDescending, Cursor::Id(AttemptId::PREFIX))?;
    let filter = AttemptFilter { endpoint: Some(endpoint.id), ..attempt_filter(&query, &app.id)? };
    let found = state.store.list_attempts(&filter, &page.query()).await?;
    Ok(Json(page.finish(found, |a| a.id.to_string(), MessageAttemptOut::from)))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/attempt/msg/{msg_id}", operation_id = "v1.message-attempt.list-by-msg",
    tag = "Message Attempt", params(("app_id" = String, Path), ("msg_id" = String, Path), ("limit" = Option<usize>, Query),
        ("iterator" = Option<String>, Query), ("status" = Option<i64>, Query), ("status_code_class" = Option<u16>, Query),
        ("channel" = Option<String>, Query), ("endpoint_id" = Option<String>, Query), ("before" = Option<String>, Query),
        ("after" = Option<String>, Query), ("with_content" = Option<bool>, Query), ("event_types" = Option<Vec<String>>, Query)),
    responses((status = 200, body = ListResponse<MessageAttemptOut>)))]
pub async fn list_by_msg(
    State(state): State<AppState>,
    principal: Principal,
    message: VisibleMessage,
    query: QueryMap,
) -> ApiResult<Attempts> {
    let (app, message) = message.into_parts();
    let page = Page::from_query(&query, Order::AlwaysDescending, Cursor::Id(AttemptId::PREFIX))?;
    let endpoint = match query.get::<String>("endpoint_id")? {
        Some(id) => {
            Some(VisibleEndpoint::resolve(&state, &principal, app.id.as_str(), &id).await?.endpoint().id.clone())
        }
        None => None,
    };
    let filter = AttemptFilter { msg: Some(message.id), endpoint, ..attempt_filter(&query, &app.id)? };
    let found = state.store.list_attempts(&filter, &page.query()).await?;
    Ok(Json(page.finish(found, |a| a.id.to_string(), MessageAttemptOut::from)))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/msg", operation_id = "v1.message-attempt.list-attempted-messages",
    tag = "Message Attempt", params(("app_id" = String, Path), ("endpoint_id" = String, Path), ("limit" = Option<usize>, Query),
        ("iterator" = Option<String>, Query), ("channel" = Option<String>, Query), ("status" = Option<i64>, Query),
        ("before" = Option<String>, Query), ("after" = Option<String>, Query), ("with_content" = Option<bool>, Query),
        ("event_types" = Option<Vec<String>>, Query)),
    responses((status = 200, body = ListResponse<EndpointMessageOut>)))]
pub async fn list_attempted_messages(
    State(state): State<AppState>,
    principal: Principal,
    endpoint: VisibleEndpoint,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<EndpointMessageOut>>> {
    let (_, endpoint) = endpoint.into_parts();
    let page = Page::from_query(&query, Order::AlwaysDescending, Cursor::Id(MessageId::PREFIX))?;
    let with_content = query.flag("with_content", true)?;
    let found = state
        .store
        .endpoint_messages(&endpoint.id, &message_filter(&query)?, status_param(&query)?, &page.query())
        .await?;
    let mask = state.mask_for(&principal);
    let render = |(m, d): (Message, DeliveryView)| {
        let (status, status_text, next_attempt) = status_fields(&d);
        EndpointMessageOut { message: MessageOut::shown(&m, with_content, mask), status, status_text, next_attempt }
    };
    Ok(Json(page.finish(found, |(m, _)| m.id.to_string(), render)))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg/{msg_id}/endpoint", operation_id = "v1.message-attempt.list-attempted-destinations",
    tag = "Message Attempt", params(("app_id" = String, Path), ("msg_id" = String, Path), ("limit" = Option<usize>, Query),
        ("iterator" = Option<String>, Query)),
    responses((status = 200, body = ListResponse<MessageEndpointOut>)))]
pub async fn list_attempted_destinations(
    State(state): State<AppState>,
    message: VisibleMessage,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<MessageEndpointOut>>> {
    let (_, message) = message.into_parts();
    let page = Page::from_query(&query, Order::AlwaysAscending, Cursor::Id(EndpointId::PREFIX))?;
    let deliveries = state.store.message_deliveries(&message.id, &page.query()).await?;
    let mut rows = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        // An endpoint deleted since is still listed, as it was (as Svix does).
        let endpoint = match state.catalog.target(&d.endpoint_id).await? {
            Some(target) => target.endpoint.clone(),
            None => match state.store.deleted_endpoint(&d.endpoint_id).await? {
                Some(endpoint) => endpoint,
                None => continue,
            },
        };
        rows.push((d, endpoint));
    }
    let render = |(d, endpoint): (DeliveryView, Endpoint)| {
        let (status, status_text, next_attempt) = status_fields(&d);
        MessageEndpointOut { endpoint: EndpointOut::new(&endpoint, &state), status, status_text, next_attempt }
    };
    Ok(Json(page.finish(rows, |(d, _)| d.endpoint_id.to_string(), render)))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}", operation_id = "v1.message-attempt.get",
    tag = "Message Attempt", params(("app_id" = String, Path), ("msg_id" = String, Path), ("attempt_id" = String, Path)),
    responses((status = 200, body = MessageAttemptOut)))]
pub async fn get_attempt(
    State(state): State<AppState>,
    message: VisibleMessage,
    Path((_, _, attempt_id)): Path<(String, String, String)>,
) -> ApiResult<Json<MessageAttemptOut>> {
    let (app, message) = message.into_parts();
    let attempt = state.store.attempt(&app.id, &message.id, &attempt_id).await?.ok_or(ApiError::NotFound("attempt"))?;
    Ok(Json(attempt.into()))
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}/msg/{msg_id}/attempt/{attempt_id}/content",
    operation_id = "v1.message-attempt.expunge-content", tag = "Message Attempt",
    params(("app_id" = String, Path), ("msg_id" = String, Path), ("attempt_id" = String, Path)), responses((status = 204)))]
pub async fn expunge_attempt_content(
    State(state): State<AppState>,
    message: VisibleMessage,
    Path((_, _, attempt_id)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    let (app, message) = message.into_parts();
    if state.store.expunge_attempt(&app.id, &message.id, &attempt_id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound("attempt"))
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EmptyResponse {}

/// Sends a message to an endpoint again through the normal pipeline (a manual attempt with
/// a fresh retry budget), whatever its current state.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend",
    operation_id = "v1.message-attempt.resend", tag = "Message Attempt",
    params(("app_id" = String, Path), ("msg_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 202, body = EmptyResponse)))]
pub async fn resend(
    State(state): State<AppState>,
    message: VisibleMessage,
    endpoint: VisibleEndpoint,
) -> ApiResult<(StatusCode, Json<EmptyResponse>)> {
    let (app, message) = message.into_parts();
    let endpoint = endpoint.endpoint();
    if message.payload.is_none() {
        let why = "Unable to resend message. Payload is missing (probably expired).";
        return Err(ApiError::Refused("missing_payload", why.into()));
    }
    let (msg, endpoint) = (message.id, endpoint.id.clone());
    state.store.requeue(Requeue::Resend { app: app.id.clone(), msg: msg.clone(), endpoint: endpoint.clone() }).await?;
    state.dispatcher.resend_requested(&msg, &endpoint);
    state.dispatcher.poke();
    Ok((StatusCode::ACCEPTED, Json(EmptyResponse {})))
}
