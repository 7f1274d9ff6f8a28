//! Operations on one endpoint besides CRUD: its signing secret (get, rotate), its custom
//! headers, delivery stats, `recover` (replay dead letters of a time range) and
//! `send-example`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::auth::Principal;
use super::endpoint::{modify, open_headers, parse_secret, seal_headers};
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap, body_time};
use super::message::MessageOut;
use super::routes::Routes;
use super::validate::Problems;
use super::{AppState, VisibleEndpoint};
use crate::clock::{now_ms, to_rfc3339};
use crate::headers::is_sensitive_header;
use crate::ids::{MessageId, TaskId};
use crate::ingest::Route;
use crate::signing::EndpointKey;
use crate::store::{Endpoint, EndpointStats, IngestResult, Message, PreviousSecret, Requeue, Secrets};
use utoipa_axum::routes;

pub fn routes() -> Routes {
    Routes::new()
        .operations(routes!(get_secret))
        .operations(routes!(rotate_secret))
        .operations(routes!(get_headers, update_headers, patch_headers))
        .operations(routes!(get_stats))
        .operations(routes!(recover))
        .operations(routes!(send_example))
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSecretOut {
    pub key: String,
    /// Herald extension, for the admin token only: the earlier secrets that still sign
    /// after a rotation, oldest first, each with the end of its overlap (what `herald
    /// import svix` carries over, so receivers that have not switched keep verifying).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_keys: Option<Vec<PreviousKeyOut>>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviousKeyOut {
    pub key: String,
    pub expires_at: String,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSecretRotateIn {
    /// The new secret; generated when absent.
    pub key: Option<String>,
    /// How long the previous secret keeps signing (default 24 h, at most 7 days).
    pub grace_period_seconds: Option<u32>,
}

/// Previous secrets still signing at most: the next rotation waits for one to expire.
const MAX_PREVIOUS_SECRETS: usize = 10;

/// The longest time range `recover` takes, as in Svix.
const RECOVER_WINDOW: Duration = Duration::from_secs(14 * 24 * 3600);
/// The longest time range endpoint `stats` covers, as in Svix.
const STATS_WINDOW: Duration = Duration::from_secs(28 * 24 * 3600);
/// The slack Svix gives both windows (and a clock's `until` "now").
const SLACK_MS: i64 = 5 * 60 * 1000;

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/secret", operation_id = "v1.endpoint.get-secret",
    tag = "Endpoint", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointSecretOut)))]
pub async fn get_secret(
    State(state): State<AppState>,
    principal: Principal,
    endpoint: VisibleEndpoint,
) -> ApiResult<Json<EndpointSecretOut>> {
    let (_, endpoint) = endpoint.into_parts();
    let previous_keys = match principal {
        Principal::Admin => Some(previous_keys(&state, &endpoint)?),
        Principal::App { .. } => None,
    };
    Ok(Json(EndpointSecretOut { key: shown_secret(&state, &endpoint)?, previous_keys }))
}

/// The secrets that still sign beside the current one, oldest first.
fn previous_keys(state: &AppState, endpoint: &Endpoint) -> ApiResult<Vec<PreviousKeyOut>> {
    let now = now_ms();
    let mut previous = open_secrets(state, endpoint)?.previous;
    previous.retain(|p| p.expires_at > now);
    previous.sort_by_key(|p| p.expires_at);
    previous
        .into_iter()
        .map(|p| {
            let key = EndpointKey::shown(&p.key)
                .map_err(|e| anyhow::anyhow!("a stored signing secret does not parse: {e}"))?;
            Ok(PreviousKeyOut { key, expires_at: to_rfc3339(p.expires_at) })
        })
        .collect()
}

/// The signing secret as `GET …/secret` shows it (`whsec_…`, or `whpk_…` for a key pair).
pub fn shown_secret(state: &AppState, endpoint: &Endpoint) -> ApiResult<String> {
    Ok(EndpointKey::shown(&open_secrets(state, endpoint)?.current)
        .map_err(|e| anyhow::anyhow!("the stored signing secret does not parse: {e}"))?)
}

/// The names of the endpoint's own headers (their values are write-only in the portal).
pub fn header_names(state: &AppState, endpoint: &Endpoint) -> ApiResult<Vec<String>> {
    Ok(open_headers(state, endpoint)?.into_keys().collect())
}

/// Replaces the signing secret; the previous one keeps signing for the grace period, so
/// receivers see two signatures until they switch. At most 10 previous secrets sign at
/// once (a 400 `limit_reached` otherwise). Answers 204 with no body, as the Svix server
/// does: the new key is read with `GET …/secret`.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/secret/rotate", operation_id = "v1.endpoint.rotate-secret",
    tag = "Endpoint", request_body = EndpointSecretRotateIn, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 204)))]
pub async fn rotate_secret(
    State(state): State<AppState>,
    principal: Principal,
    endpoint: VisibleEndpoint,
    body: JsonBody<EndpointSecretRotateIn>,
) -> ApiResult<StatusCode> {
    let new_secret = parse_secret("key", body.value.key.as_deref())?;
    let grace = match body.value.grace_period_seconds {
        None => state.settings.secret_rotation_overlap,
        Some(secs) if secs <= 7 * 24 * 3600 => Duration::from_secs(secs.into()),
        Some(_) => {
            return Err(ApiError::invalid("gracePeriodSeconds", "must be at most 604800"));
        }
    };
    modify(&state, &principal, &endpoint, |endpoint| {
        let now = now_ms();
        let mut secrets = open_secrets(&state, endpoint)?;
        secrets.previous.retain(|p| p.expires_at > now);
        if secrets.previous.len() >= MAX_PREVIOUS_SECRETS {
            let next = secrets.previous.iter().map(|p| p.expires_at).min().unwrap_or(now);
            return Err(ApiError::Refused(
                "limit_reached",
                format!(
                    "You can only rotate a key {MAX_PREVIOUS_SECRETS} times; please wait for old keys to expire. \
                     Your next key expires at {}.",
                    to_rfc3339(next)
                ),
            ));
        }
        let old = std::mem::replace(&mut secrets.current, new_secret.clone());
        secrets.previous.push(PreviousSecret { key: old, expires_at: now + grace.as_millis() as i64 });
        endpoint.secrets = state.catalog.keyring().seal_secrets(&secrets, &endpoint.id);
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The endpoint's secrets in the clear; a row the server key cannot open is a server-side
/// configuration problem (a key missing from `auth.previous_secret_keys`).
fn open_secrets(state: &AppState, endpoint: &Endpoint) -> ApiResult<Secrets> {
    state.catalog.keyring().open_secrets(&endpoint.secrets, &endpoint.id).map_err(|e| {
        tracing::error!(endpoint = %endpoint.id, error = %e, "the endpoint's signing secrets do not open");
        ApiError::Internal(anyhow::anyhow!(
            "the endpoint's signing secret cannot be read with the configured server key"
        ))
    })
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct EndpointHeadersOut {
    pub headers: BTreeMap<String, String>,
    /// Names of headers whose values are kept secret.
    pub sensitive: Vec<String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct EndpointHeadersIn {
    pub headers: BTreeMap<String, String>,
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct EndpointHeadersPatchIn {
    /// A `null` value removes the header.
    #[schema(value_type = BTreeMap<String, Option<String>>)]
    pub headers: BTreeMap<String, Option<String>>,
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers", operation_id = "v1.endpoint.get-headers",
    tag = "Endpoint", params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointHeadersOut)))]
pub async fn get_headers(
    State(state): State<AppState>,
    endpoint: VisibleEndpoint,
) -> ApiResult<Json<EndpointHeadersOut>> {
    let (_, endpoint) = endpoint.into_parts();
    let (sensitive, headers): (BTreeMap<_, _>, BTreeMap<_, _>) =
        open_headers(&state, &endpoint)?.into_iter().partition(|(name, _)| is_sensitive_header(name));
    Ok(Json(EndpointHeadersOut { headers, sensitive: sensitive.into_keys().collect() }))
}

#[utoipa::path(put, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers", operation_id = "v1.endpoint.update-headers",
    tag = "Endpoint", request_body = EndpointHeadersIn, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 204)))]
pub async fn update_headers(
    State(state): State<AppState>,
    principal: Principal,
    endpoint: VisibleEndpoint,
    body: JsonBody<EndpointHeadersIn>,
) -> ApiResult<StatusCode> {
    modify(&state, &principal, &endpoint, |endpoint| {
        endpoint.headers = seal_headers(&state, &body.value.headers, &endpoint.id)?;
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(patch, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/headers", operation_id = "v1.endpoint.patch-headers",
    tag = "Endpoint", request_body = EndpointHeadersPatchIn, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 204)))]
pub async fn patch_headers(
    State(state): State<AppState>,
    principal: Principal,
    endpoint: VisibleEndpoint,
    body: JsonBody<EndpointHeadersPatchIn>,
) -> ApiResult<StatusCode> {
    modify(&state, &principal, &endpoint, |endpoint| {
        let mut headers = open_headers(&state, endpoint)?;
        for (name, value) in &body.value.headers {
            match value {
                Some(value) => headers.insert(name.clone(), value.clone()),
                None => headers.remove(name),
            };
        }
        endpoint.headers = seal_headers(&state, &headers, &endpoint.id)?;
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/stats", operation_id = "v1.endpoint.get-stats",
    tag = "Endpoint", params(("app_id" = String, Path), ("endpoint_id" = String, Path),
        ("since" = Option<String>, Query), ("until" = Option<String>, Query)),
    responses((status = 200, body = EndpointStats)))]
pub async fn get_stats(
    State(state): State<AppState>,
    endpoint: VisibleEndpoint,
    query: QueryMap,
) -> ApiResult<Json<EndpointStats>> {
    let (_, endpoint) = endpoint.into_parts();
    let now = now_ms();
    let until = query.time("until")?.unwrap_or(now);
    if until > now + SLACK_MS {
        return Err(ApiError::Refused("invalid_range", "'until' cannot be in the future".into()));
    }
    let window = STATS_WINDOW.as_millis() as i64;
    let since = query.time("since")?.unwrap_or(until - window);
    if until - since > window + SLACK_MS {
        let until = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(until).unwrap_or_default();
        return Err(ApiError::Refused(
            "invalid_range",
            format!("'since' cannot be more than 28 days prior to {until}"),
        ));
    }
    Ok(Json(state.store.endpoint_stats(&endpoint.id, Some(since), Some(until)).await?))
}

#[derive(Deserialize, utoipa::ToSchema)]
pub struct RecoverIn {
    /// RFC 3339 start of the range (message time).
    pub since: String,
    /// RFC 3339 end of the range (default: now).
    pub until: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverOut {
    pub id: String,
    pub status: String,
    pub task: String,
    pub updated_at: String,
    /// Herald extension: how many dead letters were put back in the queue.
    pub recovered: u64,
}

/// Puts every dead letter of the endpoint whose message falls in the range back through the
/// normal pipeline (as manual attempts with a fresh retry budget).
#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/recover", operation_id = "v1.endpoint.recover",
    tag = "Endpoint", request_body = RecoverIn, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 202, body = RecoverOut)))]
pub async fn recover(
    State(state): State<AppState>,
    endpoint: VisibleEndpoint,
    body: JsonBody<RecoverIn>,
) -> ApiResult<(StatusCode, Json<RecoverOut>)> {
    let (_, endpoint) = endpoint.into_parts();
    let since = body_time("since", Some(&body.value.since))?.unwrap_or_default();
    if since < now_ms() - RECOVER_WINDOW.as_millis() as i64 - SLACK_MS {
        return Err(ApiError::invalid("since", "Cannot recover messages more than 14 days old."));
    }
    let until = body_time("until", body.value.until.as_deref())?.unwrap_or(i64::MAX);
    let recovered = state.store.requeue(Requeue::Recover { endpoint: endpoint.id.clone(), since, until }).await?;
    state.dispatcher.poke();
    let out = RecoverOut {
        id: TaskId::generate().to_string(),
        status: "running".into(),
        task: "endpoint.recover".into(),
        updated_at: to_rfc3339(now_ms()),
        recovered,
    };
    Ok((StatusCode::ACCEPTED, Json(out)))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventExampleIn {
    pub event_type: String,
}

/// Svix's test event: `send-example` with it delivers exactly `{"success": true}`.
const PING_EVENT_TYPE: &str = "svix.ping";

/// Sends one example message of an event type to this endpoint only. The payload is the
/// event type's first schema example (`{"success": true}` for `svix.ping`); an event type
/// without one is a 400. The endpoint's owner may send it too (Svix allows the admin token
/// only): the payload is the operator's own example and reaches that endpoint alone, which
/// is what the portal's "send a test event" needs.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/send-example", operation_id = "v1.endpoint.send-example",
    tag = "Endpoint", request_body = EventExampleIn, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = MessageOut)))]
pub async fn send_example(
    State(state): State<AppState>,
    endpoint: VisibleEndpoint,
    body: JsonBody<EventExampleIn>,
) -> ApiResult<Json<MessageOut>> {
    let (app, endpoint) = endpoint.into_parts();
    let event_type = body.value.event_type;
    let mut p = Problems::default();
    p.slug("eventType", &event_type, 256);
    p.finish()?;
    let example = if event_type == PING_EVENT_TYPE {
        serde_json::json!({"success": true})
    } else {
        let found = state.store.event_type(&event_type).await?.ok_or(ApiError::NotFound("event type"))?;
        found.schemas.as_ref().and_then(first_example).ok_or_else(|| {
            ApiError::Refused("invalid_scheme", "Unable to generate example message from event-type schema".into())
        })?
    };
    let message = Message {
        id: MessageId::generate(),
        app_id: app.id.clone(),
        event_type,
        event_id: None,
        channels: None,
        payload: Some(example.to_string().into()),
        created_at: now_ms(),
        trace: None,
    };
    match state.ingestor.ingest(message.clone(), Route::Only(&endpoint.id), None).await? {
        IngestResult::Created { .. } => Ok(Json(MessageOut::new(&message, true))),
        other => Err(ApiError::Internal(anyhow::anyhow!("unexpected ingest result {other:?}"))),
    }
}

/// The first `examples[0]` found in an event type's schemas (keyed by version).
pub fn first_example(schemas: &serde_json::Value) -> Option<serde_json::Value> {
    schemas.as_object()?.values().find_map(|schema| schema.get("examples")?.get(0).cloned())
}
