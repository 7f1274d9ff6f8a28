//! The HTTP API: the Svix v1 API plus Herald's extensions. One router per resource file;
//! the caller's identity is an extractor ([`auth::Principal`]) and every lookup of an
//! application, endpoint or message goes through the `visible_*` helpers here, which scope
//! it to what the caller may see (other applications' ids answer 404).

mod application;
mod attempt;
mod auth;
mod dead_letters;
mod endpoint;
mod endpoint_ops;
mod error;
mod event_type;
mod extract;
mod health;
mod idempotency;
mod list;
mod message;
pub mod openapi;
mod rate_limit;
mod stats;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::middleware::from_fn_with_state;
use axum::routing::get;

pub use auth::{AdminToken, PORTAL_TOKEN_PREFIX, Principal};
pub use error::{ApiError, ApiResult};
pub use extract::body_time;

use crate::catalog::Catalog;
use crate::dispatch::Dispatcher;
use crate::ingest::Ingestor;
use crate::metrics::Metrics;
use crate::redaction::Redactor;
use crate::replay::ReplayTasks;
use crate::ssrf::Guard;
use crate::store::{App, Endpoint, Message, Store};
use idempotency::KeyLocks;
pub use rate_limit::RateLimiter;

/// Size limits of requests.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest request body read at all.
    pub body_bytes: usize,
    /// Largest message payload (413 above it).
    pub max_payload_bytes: usize,
}

/// Settings the API needs beyond the shared services.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// Base of app-portal links.
    pub public_url: String,
    pub portal_token_ttl: Duration,
    pub secret_rotation_overlap: Duration,
}

/// Everything a handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub catalog: Arc<Catalog>,
    pub ingestor: Arc<Ingestor>,
    pub dispatcher: Arc<Dispatcher>,
    pub metrics: Arc<Metrics>,
    pub guard: Arc<Guard>,
    pub admin: Arc<AdminToken>,
    pub limits: Limits,
    pub settings: Arc<ApiSettings>,
    pub key_locks: Arc<KeyLocks>,
    pub rate_limiter: Arc<RateLimiter>,
    pub redactor: Arc<Redactor>,
    pub replays: Arc<ReplayTasks>,
}

impl AppState {
    /// The masking a principal's reads get: none with the `sensitive` permission.
    pub fn mask_for(&self, principal: &Principal) -> Option<&Redactor> {
        (!principal.sees_sensitive()).then_some(&*self.redactor)
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(application::router())
        .merge(endpoint::router())
        .merge(endpoint_ops::router())
        .merge(message::router())
        .merge(attempt::router())
        .merge(event_type::router())
        .merge(health::router())
        .merge(stats::router())
        .merge(dead_letters::router())
        .route("/api/v1/auth/app-portal-access/{app_id}", axum::routing::post(auth::app_portal_access))
        .route("/api/v1/auth/logout", axum::routing::post(auth::logout))
        .route("/api/v1/openapi.json", get(openapi::serve))
        .merge(crate::dashboard::router())
        .layer(from_fn_with_state(state.clone(), idempotency::layer))
        .fallback(|| async { ApiError::NotFound("route") })
        .with_state(state)
}

/// Parses a message-creation body as `POST /api/v1/app/{app_id}/msg` does (depth cap,
/// JSON, shape); the entry point of the ingest fuzz target.
pub fn parse_message_body(raw: &[u8]) -> ApiResult<()> {
    extract::parse_json::<message::MessageIn>(raw).map(drop)
}

/// The API of a worker process: health checks only.
pub fn health_router(state: AppState) -> Router {
    Router::new().merge(health::router()).fallback(|| async { ApiError::NotFound("route") }).with_state(state)
}

/// The application `id_or_uid`, if the caller may see it (404 otherwise).
pub(crate) async fn visible_app(state: &AppState, principal: &Principal, id_or_uid: &str) -> ApiResult<Arc<App>> {
    match state.catalog.app(id_or_uid).await? {
        Some(app) if principal.can_see(&app.id) => Ok(app),
        _ => Err(ApiError::NotFound("application")),
    }
}

/// For admin-only operations on one application: a portal token gets the same 404 for
/// another application's ids as everywhere else, and 403 only on its own application.
async fn require_admin_for(state: &AppState, principal: &Principal, app_id: &str) -> ApiResult<()> {
    if *principal == Principal::Admin {
        return Ok(());
    }
    visible_app(state, principal, app_id).await?;
    principal.require_admin()
}

/// An endpoint (fresh from the store) of a visible application.
pub(crate) async fn visible_endpoint(
    state: &AppState,
    principal: &Principal,
    app_id: &str,
    endpoint_id: &str,
) -> ApiResult<(Arc<App>, Endpoint)> {
    let app = visible_app(state, principal, app_id).await?;
    let endpoint = state.store.endpoint(&app.id, endpoint_id).await?.ok_or(ApiError::NotFound("endpoint"))?;
    Ok((app, endpoint))
}

/// A message (by id or eventId) of a visible application.
pub(crate) async fn visible_message(
    state: &AppState,
    principal: &Principal,
    app_id: &str,
    msg_id: &str,
) -> ApiResult<(Arc<App>, Message)> {
    let app = visible_app(state, principal, app_id).await?;
    let message = state.store.message(&app.id, msg_id).await?.ok_or(ApiError::NotFound("message"))?;
    Ok((app, message))
}
