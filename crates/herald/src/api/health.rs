//! Liveness (`/api/v1/health/ping`) and readiness (`/api/v1/health`, which also checks
//! that the store answers). Neither needs a token. A process whose background task failed
//! (see `crate::supervisor`) answers both with 503 from that moment until it exits.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::error::HttpErrorOut;

use super::AppState;
use super::routes::Routes;
use utoipa_axum::routes;

pub fn routes() -> Routes {
    Routes::new().operations(routes!(health, health_head)).operations(routes!(ping, ping_head))
}

/// 204 when the API and its store work, 503 otherwise.
#[utoipa::path(get, path = "/api/v1/health", operation_id = "v1.health.get", tag = "Health",
    responses((status = 204), (status = 503, body = HttpErrorOut)))]
pub async fn health(State(state): State<AppState>) -> Response {
    if let Some(failing) = failing(&state) {
        return failing;
    }
    match state.store.app("health-probe").await {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "health check: store unavailable");
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
    }
}

#[utoipa::path(head, path = "/api/v1/health", operation_id = "v1.health.head", tag = "Health",
    responses((status = 204), (status = 503)))]
pub async fn health_head(state: State<AppState>) -> Response {
    health(state).await
}

#[utoipa::path(get, path = "/api/v1/health/ping", operation_id = "v1.health.ping", tag = "Health",
    responses((status = 204), (status = 503, body = HttpErrorOut)))]
pub async fn ping(State(state): State<AppState>) -> Response {
    failing(&state).unwrap_or_else(|| StatusCode::NO_CONTENT.into_response())
}

#[utoipa::path(head, path = "/api/v1/health/ping", operation_id = "v1.health.ping-head", tag = "Health",
    responses((status = 204), (status = 503)))]
pub async fn ping_head(state: State<AppState>) -> Response {
    ping(state).await
}

/// The answer of a process that failed: 503, and nothing about why (anyone may ask; a
/// panic message can name internals or data). The reason is in the process's log.
fn failing(state: &AppState) -> Option<Response> {
    state.liveness.failure()?;
    let detail = "this process is stopping after an internal failure (see its log); it restarts, or another answers";
    let body = HttpErrorOut { code: "unhealthy".into(), detail: detail.into() };
    Some((StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response())
}
