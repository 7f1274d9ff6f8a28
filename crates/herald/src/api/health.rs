//! Liveness (`/api/v1/health/ping`) and readiness (`/api/v1/health`, which also checks
//! that the store answers). Neither needs a token.

use axum::extract::State;
use axum::http::StatusCode;

use super::AppState;
use super::routes::Routes;

pub fn routes() -> Routes {
    Routes::new()
        .get("/api/v1/health", health)
        .head("/api/v1/health", health_head)
        .get("/api/v1/health/ping", ping)
        .head("/api/v1/health/ping", ping_head)
}

/// 204 when the API and its store work, 503 otherwise.
#[utoipa::path(get, path = "/api/v1/health", operation_id = "v1.health.get", tag = "Health",
    responses((status = 204), (status = 503)))]
pub async fn health(State(state): State<AppState>) -> StatusCode {
    match state.store.app("health-probe").await {
        Ok(_) => StatusCode::NO_CONTENT,
        Err(e) => {
            tracing::warn!(error = %e, "health check: store unavailable");
            StatusCode::SERVICE_UNAVAILABLE
        }
    }
}

#[utoipa::path(head, path = "/api/v1/health", operation_id = "v1.health.head", tag = "Health",
    responses((status = 204), (status = 503)))]
pub async fn health_head(state: State<AppState>) -> StatusCode {
    health(state).await
}

#[utoipa::path(get, path = "/api/v1/health/ping", operation_id = "v1.health.ping", tag = "Health", responses((status = 204)))]
pub async fn ping() -> StatusCode {
    StatusCode::NO_CONTENT
}

#[utoipa::path(head, path = "/api/v1/health/ping", operation_id = "v1.health.ping-head", tag = "Health", responses((status = 204)))]
pub async fn ping_head() -> StatusCode {
    StatusCode::NO_CONTENT
}
