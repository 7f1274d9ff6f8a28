//! How endpoints and the queue are doing (Herald extensions): an endpoint's circuit
//! breaker and latency percentiles, the endpoints slower than a threshold, the queue
//! summary, and the same numbers for Prometheus at `/metrics`.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use serde::Serialize;

use super::auth::Principal;
use super::error::ApiResult;
use super::extract::QueryMap;
use super::routes::Routes;
use super::{AppState, VisibleEndpoint};
use crate::breaker::{Breaker, BreakerState};
use crate::clock::{Millis, now_ms, to_rfc3339};
use crate::health;
use crate::ids::EndpointId;
use crate::latency::{Histogram, LatencySummary, MIN_SAMPLES};
use crate::metrics::Gauges;
use utoipa_axum::routes;

pub fn routes() -> Routes {
    Routes::new()
        .operations(routes!(endpoint_health))
        .operations(routes!(retry_now))
        .operations(routes!(slow_endpoints))
        .operations(routes!(summary))
        .operations(routes!(metrics))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHealthOut {
    pub state: BreakerState,
    pub consecutive_failures: u32,
    /// When the breaker last opened (absent while closed).
    pub opened_at: Option<String>,
    /// The cooldown the breaker waits (or will wait) before a probe.
    pub cooldown_ms: u64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Attempts in the rolling 24-hour window.
    pub sample_count: u64,
    /// p95 above 5 s with at least 20 samples (the breaker then opens after half as many
    /// failures).
    pub slow: bool,
}

/// An endpoint's circuit breaker and its latency over the last 24 hours.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/health",
    operation_id = "herald.endpoint.health", tag = "Endpoint",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointHealthOut), (status = 404, body = super::error::HttpErrorOut)))]
pub async fn endpoint_health(
    State(state): State<AppState>,
    endpoint: VisibleEndpoint,
) -> ApiResult<Json<EndpointHealthOut>> {
    let (_, endpoint) = endpoint.into_parts();
    Ok(Json(health_of(&state, &endpoint).await?))
}

/// "Retry now": the endpoint's open circuit breaker lets its probe go at once, in every
/// process, instead of at the end of its cooldown; answers the health as it stands.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}/health/retry",
    operation_id = "herald.endpoint.retry-now", tag = "Endpoint",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 202, body = EndpointHealthOut), (status = 404, body = super::error::HttpErrorOut)))]
pub async fn retry_now(
    State(state): State<AppState>,
    endpoint: VisibleEndpoint,
) -> ApiResult<(StatusCode, Json<EndpointHealthOut>)> {
    let (app, endpoint) = endpoint.into_parts();
    state.dispatcher.retry_now(&app.id, &endpoint.id).await;
    state.store.announce_retry_now(&app.id, &endpoint.id).await?;
    Ok((StatusCode::ACCEPTED, Json(health_of(&state, &endpoint).await?)))
}

/// An endpoint's breaker (this process's, else the saved one) and its latency.
pub async fn health_of(state: &AppState, endpoint: &crate::store::Endpoint) -> ApiResult<EndpointHealthOut> {
    let now = now_ms();
    let settings = endpoint.delivery.circuit_breaker.unwrap_or_default();
    let breaker = breakers(state, Some(&endpoint.id)).await?.remove(&endpoint.id);
    let breaker = breaker.unwrap_or_else(|| Breaker::new(&settings));
    let only = std::slice::from_ref(&endpoint.id);
    let latency = latency(state, Some(only), now).await?.remove(&endpoint.id).unwrap_or_default().summary();
    Ok(EndpointHealthOut {
        state: breaker.state,
        consecutive_failures: breaker.consecutive_failures,
        opened_at: breaker.opened_at.filter(|_| breaker.state != BreakerState::Closed).map(to_rfc3339),
        cooldown_ms: breaker.cooldown_ms,
        p50_ms: latency.p50_ms,
        p95_ms: latency.p95_ms,
        p99_ms: latency.p99_ms,
        sample_count: latency.sample_count,
        slow: latency.slow,
    })
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SlowEndpointOut {
    pub app_id: String,
    pub endpoint_id: String,
    pub url: String,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub sample_count: u64,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SlowEndpointsOut {
    pub data: Vec<SlowEndpointOut>,
}

/// p95 threshold when the query names none.
const DEFAULT_P95_THRESHOLD_MS: f64 = 2000.0;

/// Endpoints whose p95 over the last 24 hours is above `p95ThresholdMs` (default 2000),
/// with at least 20 samples, slowest first. A portal token sees its application's only.
#[utoipa::path(get, path = "/api/v1/stats/slow-endpoints", operation_id = "herald.stats.slow-endpoints",
    tag = "Statistics", params(("p95ThresholdMs" = Option<f64>, Query)),
    responses((status = 200, body = SlowEndpointsOut)))]
pub async fn slow_endpoints(
    State(state): State<AppState>,
    principal: Principal,
    query: QueryMap,
) -> ApiResult<Json<SlowEndpointsOut>> {
    let threshold: f64 = query.get("p95ThresholdMs")?.unwrap_or(DEFAULT_P95_THRESHOLD_MS);
    // A portal token's question reads its application's endpoints only.
    let own = match &principal {
        Principal::Admin => None,
        Principal::App { app_id, .. } => {
            Some(state.store.app_endpoints(app_id).await?.into_iter().map(|e| e.id).collect::<Vec<_>>())
        }
    };
    let mut slow: Vec<(LatencySummary, EndpointId)> = latency(&state, own.as_deref(), now_ms())
        .await?
        .into_iter()
        .map(|(endpoint, histogram)| (histogram.summary(), endpoint))
        .filter(|(s, _)| s.sample_count >= MIN_SAMPLES && s.p95_ms.is_some_and(|p| p > threshold))
        .collect();
    slow.sort_by(|(a, _), (b, _)| b.p95_ms.partial_cmp(&a.p95_ms).unwrap_or(std::cmp::Ordering::Equal));
    let mut data = Vec::with_capacity(slow.len());
    for (summary, endpoint) in slow {
        // Endpoints deleted since are left out, and so are other applications' for a portal token.
        let Some(target) = state.catalog.target(&endpoint).await? else { continue };
        if !principal.can_see(&target.endpoint.app_id) {
            continue;
        }
        data.push(SlowEndpointOut {
            app_id: target.endpoint.app_id.to_string(),
            endpoint_id: endpoint.to_string(),
            url: target.endpoint.url.clone(),
            p50_ms: summary.p50_ms,
            p95_ms: summary.p95_ms,
            p99_ms: summary.p99_ms,
            sample_count: summary.sample_count,
        });
    }
    Ok(Json(SlowEndpointsOut { data }))
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SummaryOut {
    /// Deliveries waiting for their first attempt.
    pub pending: u64,
    /// Deliveries waiting for a retry.
    pub awaiting_retry: u64,
    /// Attempts in flight in this process.
    pub in_flight: u32,
    pub dead_letter: u64,
    pub delivered_last_hour: u64,
    /// Failed attempts in the last hour.
    pub failed_last_hour: u64,
    /// When the oldest undelivered message was accepted.
    pub oldest_pending_at: Option<String>,
    /// Mean time from acceptance to successful delivery over the last hour.
    pub avg_delivery_ms_last_hour: Option<f64>,
}

/// The queue at a glance (admin only): counts by state and the last hour's outcomes. Reads
/// indexes and per-minute counters, never the attempts.
#[utoipa::path(get, path = "/api/v1/stats/summary", operation_id = "herald.stats.summary", tag = "Statistics",
    responses((status = 200, body = SummaryOut), (status = 403, body = super::error::HttpErrorOut)))]
pub async fn summary(State(state): State<AppState>, principal: Principal) -> ApiResult<Json<SummaryOut>> {
    principal.require_admin()?;
    let counts = state.store.summary(now_ms()).await?;
    let delivered = counts.delivered_last_hour;
    Ok(Json(SummaryOut {
        pending: counts.pending,
        awaiting_retry: counts.awaiting_retry,
        in_flight: state.dispatcher.in_flight(),
        dead_letter: counts.dead,
        delivered_last_hour: delivered,
        failed_last_hour: counts.failed_last_hour,
        oldest_pending_at: counts.oldest_pending_at.map(to_rfc3339),
        avg_delivery_ms_last_hour: (delivered > 0).then(|| counts.delivery_ms_last_hour as f64 / delivered as f64),
    }))
}

/// Prometheus metrics in the text exposition format (admin token).
#[utoipa::path(get, path = "/metrics", operation_id = "herald.metrics", tag = "Health",
    responses((status = 200, content_type = "text/plain; version=0.0.4", body = String),
        (status = 401, body = super::error::HttpErrorOut), (status = 403, body = super::error::HttpErrorOut)))]
pub async fn metrics(State(state): State<AppState>, principal: Principal) -> ApiResult<impl IntoResponse> {
    principal.require_admin()?;
    let now = now_ms();
    let counts = state.store.summary(now).await?;
    let mut circuits: Vec<(EndpointId, u8)> = breakers(&state, None)
        .await?
        .into_iter()
        .map(|(endpoint, b)| {
            let state = match b.state {
                BreakerState::Closed => 0,
                BreakerState::HalfOpen => 1,
                BreakerState::Open => 2,
            };
            (endpoint, state)
        })
        .collect();
    circuits.sort();
    let gauges = Gauges {
        pending: counts.pending,
        awaiting_retry: counts.awaiting_retry,
        in_flight: u64::from(state.dispatcher.in_flight()),
        dead: counts.dead,
        oldest_pending_age_seconds: counts.oldest_pending_at.map_or(0.0, |at| (now - at).max(0) as f64 / 1000.0),
        circuits,
        sandbox: state.sandbox.usage(),
        long_polls: state.long_polls.waiting(),
    };
    Ok(([(CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render(&gauges)))
}

async fn breakers(state: &AppState, only: Option<&EndpointId>) -> ApiResult<HashMap<EndpointId, Breaker>> {
    Ok(health::breakers(&*state.store, &state.dispatcher, only).await?)
}

async fn latency(
    state: &AppState,
    only: Option<&[EndpointId]>,
    now: Millis,
) -> ApiResult<HashMap<EndpointId, Histogram>> {
    Ok(health::latency(&*state.store, &state.dispatcher, only, now).await?)
}
