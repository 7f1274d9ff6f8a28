//! Herald's extensions around endpoint filters and transforms:
//! `POST /api/v1/app/{app_id}/endpoint/{endpoint_id}/transformation/simulate` shows what the
//! endpoint's filter and transform would make of a message, and the request that would be
//! sent, built by the same code an attempt uses (nothing is stored or sent; credentials in
//! the endpoint's headers are shown by name only); `GET /api/v1/app/{app_id}/msg/{msg_id}/filtered`
//! says which endpoints a message's filters kept it from, and why.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiResult};
use super::extract::JsonBody;
use super::routes::Routes;
use super::validate::Problems;
use super::{AppState, VisibleEndpoint, VisibleMessage};
use crate::clock::now_ms;
use crate::deliver::Outgoing;
use crate::headers::is_sensitive_header;
use crate::ids::{AppId, MessageId};
use crate::scripts::{CheckError, Verdict};
use crate::store::{Message, PageQuery};
use utoipa_axum::routes;

pub fn routes() -> Routes {
    Routes::new().operations(routes!(simulate)).operations(routes!(filtered))
}

/// Checks tenant expressions about to be set, as (field, code): within their bounds and
/// valid jq, compiled by a sandbox worker under `app`'s share of the pool (never in this
/// process: an expression built to exhaust the parser's stack ends a worker, not Herald).
/// A 422 names every field at fault.
pub(crate) async fn check_expressions(state: &AppState, app: &AppId, fields: &[(&str, &str)]) -> ApiResult<()> {
    let mut p = Problems::default();
    for (field, code) in fields {
        match state.sandbox.check(app, code).await {
            Ok(()) => {}
            Err(CheckError::Invalid(why)) => p.push(field, why),
            Err(CheckError::Unavailable(why)) => return Err(ApiError::Unavailable(why)),
        }
    }
    p.finish()
}

/// An endpoint a message's event type and channels route to, which its filter kept out.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FilteredOut {
    pub endpoint_id: String,
    pub reason: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FilteredList {
    pub data: Vec<FilteredOut>,
}

/// The endpoints of the message's application that its event type and channels route to but
/// that got no delivery of it because of their filter, each with the filter's verdict. The
/// filters are evaluated again, as they are now, on the message as stored (an expired
/// payload says so instead).
#[utoipa::path(get, path = "/api/v1/app/{app_id}/msg/{msg_id}/filtered", operation_id = "herald.message.filtered",
    tag = "Message", params(("app_id" = String, Path), ("msg_id" = String, Path)),
    responses((status = 200, body = FilteredList)))]
pub async fn filtered(State(state): State<AppState>, message: VisibleMessage) -> ApiResult<Json<FilteredList>> {
    let (app, message) = message.into_parts();
    let everything = PageQuery { limit: 100_000, iterator: None, descending: false };
    let destinations = state.store.message_deliveries(&message.id, &everything).await?;
    let mut data = Vec::new();
    for target in state.catalog.targets_of(&app.id).await?.iter() {
        let routed = target.accepts(&message.event_type, message.channels.as_deref());
        let delivered = destinations.iter().any(|d| d.endpoint_id == target.endpoint.id);
        if !routed || delivered || target.endpoint.scripts.filter.is_none() {
            continue;
        }
        let reason = match (&message.payload, target.filter(&state.sandbox, &message).await) {
            (None, _) => "the payload has expired: the filter cannot be evaluated again".to_owned(),
            (Some(_), Verdict::Drop(why) | Verdict::Unavailable(why)) => why,
            (Some(_), Verdict::Pass) => "the filter lets it through now (it was changed since)".to_owned(),
        };
        data.push(FilteredOut { endpoint_id: target.endpoint.id.to_string(), reason });
    }
    Ok(Json(FilteredList { data }))
}

/// A message as it would be created.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SimulateIn {
    pub event_type: String,
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    pub channels: Option<Vec<String>>,
}

/// What would happen to that message at this endpoint.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SimulateOut {
    /// Whether the endpoint would get the message at all (its filter, if any, yielded
    /// `true`); when not, `reason` says why and nothing else is filled in.
    pub passed_filter: bool,
    /// The transform dropped the delivery (`reason` says why).
    pub skipped: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The transform failed: the delivery would fail as `transform_error` with this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The request's headers, Herald's signature included; credentials show as `<sensitive>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<BTreeMap<String, String>>,
    /// The body, as text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl SimulateOut {
    fn stopped(passed_filter: bool, skipped: bool, reason: Option<String>, error: Option<String>) -> Self {
        Self { passed_filter, skipped, reason, error, method: None, url: None, headers: None, body: None }
    }
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/transformation/simulate",
    operation_id = "herald.endpoint.transformation-simulate", tag = "Endpoint", request_body = SimulateIn,
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = SimulateOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn simulate(
    State(state): State<AppState>,
    endpoint: VisibleEndpoint,
    body: JsonBody<SimulateIn>,
) -> ApiResult<Json<SimulateOut>> {
    let (app, endpoint) = endpoint.into_parts();
    let input = body.value;
    let mut p = Problems::default();
    p.slug("eventType", &input.event_type, 256);
    if let Some(channels) = &input.channels {
        p.slug_list("channels", channels, 128, 10);
    }
    p.finish()?;
    let target = state.catalog.target(&endpoint.id).await?.ok_or(ApiError::NotFound("endpoint"))?;
    let message = Message {
        id: MessageId::generate(),
        app_id: app.id.clone(),
        event_type: input.event_type,
        event_id: None,
        channels: input.channels,
        payload: Some(input.payload.to_string().into()),
        created_at: now_ms(),
        trace: None,
    };
    match target.filter(&state.sandbox, &message).await {
        Verdict::Pass => {}
        Verdict::Drop(why) => return Ok(Json(SimulateOut::stopped(false, false, Some(why), None))),
        Verdict::Unavailable(e) => return Err(ApiError::Unavailable(e)),
    }
    let rewrite = match target.transform(&state.sandbox, &message).await {
        None => None,
        Some(Ok(Some(rewrite))) => Some(rewrite),
        Some(Ok(None)) => {
            return Ok(Json(SimulateOut::stopped(true, true, Some("the transform returned null".into()), None)));
        }
        Some(Err((_, e))) => return Ok(Json(SimulateOut::stopped(true, false, None, Some(e)))),
    };
    let payload = message.payload.clone().unwrap_or_default();
    let out = Outgoing {
        target: &target,
        message: &message,
        payload: &payload,
        rewrite: rewrite.as_ref(),
        attempt_no: 1,
        sequence: 0,
        now: now_ms(),
        traceparent: None,
    };
    let mut request = match out.build(&state.settings.user_agent) {
        Ok(built) => built.request,
        Err((_, e)) => return Ok(Json(SimulateOut::stopped(true, false, None, Some(e)))),
    };
    if target.oauth2.is_some() {
        // The token is fetched when the attempt is made; it shows as sensitive like any.
        request.headers_mut().insert(http::header::AUTHORIZATION, http::HeaderValue::from_static("Bearer"));
    }
    let headers = request
        .headers()
        .iter()
        .map(|(name, value)| {
            let shown = if is_sensitive_header(name.as_str()) {
                "<sensitive>".to_owned()
            } else {
                String::from_utf8_lossy(value.as_bytes()).into_owned()
            };
            (name.to_string(), shown)
        })
        .collect();
    let body = String::from_utf8_lossy(
        &http_body_util::BodyExt::collect(request.body().clone())
            .await
            .map_or_else(|never| match never {}, |collected| collected.to_bytes()),
    )
    .into_owned();
    Ok(Json(SimulateOut {
        passed_filter: true,
        skipped: false,
        reason: None,
        error: None,
        method: Some(request.method().to_string()),
        url: Some(request.uri().to_string()),
        headers: Some(headers),
        body: Some(body),
    }))
}
