//! The HTTP API: the Svix v1 API plus Herald's extensions. One router per resource file;
//! the caller's identity is an extractor ([`auth::Principal`]), and so is every
//! application, endpoint, message and poller a path names ([`scope`]): a handler receives
//! only rows the caller may see (other applications' ids answer 404).

mod application;
mod attempt;
mod auth;
mod dead_letters;
pub(crate) mod endpoint;
pub(crate) mod endpoint_ops;
mod error;
mod event_type;
pub(crate) mod extract;
mod health;
mod idempotency;
mod list;
mod message;
pub mod openapi;
mod optimistic;
pub(crate) mod poller;
pub(crate) mod portal_access;
mod rate_limit;
mod routes;
pub(crate) mod scope;
mod session;
pub(crate) mod stats;
pub(crate) mod transformation;
mod validate;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::middleware::from_fn_with_state;

pub use auth::{AdminToken, PORTAL_TOKEN_PREFIX, Principal, client_address, token_hash};
pub use error::{ApiError, ApiResult};
pub use extract::body_time;

use crate::catalog::Catalog;
use crate::dispatch::Dispatcher;
use crate::ingest::Ingestor;
use crate::metrics::Metrics;
use crate::redaction::Redactor;
use crate::replay::ReplayTasks;
use crate::sealing::Keyring;
use crate::ssrf::Guard;
use crate::store::Store;
use crate::supervisor::Liveness;
use idempotency::KeyLocks;
pub use poller::WaitingPolls;
pub use rate_limit::RateLimiter;
pub use routes::{Route, Routes};
pub use scope::{VisibleApp, VisibleEndpoint, VisibleMessage, VisiblePoller};
use utoipa_axum::routes;

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
    /// Lifetime of a dashboard session.
    pub session_ttl: Duration,
    /// The `User-Agent` of every attempt (the dashboard shows it in an attempt's request).
    pub user_agent: String,
    /// Who may frame the portal, and its brand.
    pub portal: crate::config::PortalConfig,
    /// What one application may have and hold at once.
    pub tenants: crate::config::TenantLimits,
}

/// Everything a handler can reach: one shared allocation, so the extractors' clones cost an
/// atomic increment, not one per service.
#[derive(Clone)]
pub struct AppState(Arc<Services>);

impl AppState {
    pub fn new(services: Services) -> Self {
        Self(Arc::new(services))
    }
}

impl std::ops::Deref for AppState {
    type Target = Services;

    fn deref(&self) -> &Services {
        &self.0
    }
}

/// The services behind [`AppState`].
pub struct Services {
    pub store: Arc<dyn Store>,
    pub catalog: Arc<Catalog>,
    pub ingestor: Arc<Ingestor>,
    /// Runs endpoint filters and transforms (the simulate call).
    pub sandbox: Arc<crate::scripts::Sandbox>,
    pub dispatcher: Arc<Dispatcher>,
    pub metrics: Arc<Metrics>,
    pub guard: Arc<Guard>,
    pub admin: Arc<AdminToken>,
    /// The server key: seals what the API keeps that must not rest in plaintext.
    pub keyring: Arc<Keyring>,
    pub limits: Limits,
    pub settings: Arc<ApiSettings>,
    pub key_locks: Arc<KeyLocks>,
    pub rate_limiter: Arc<RateLimiter>,
    pub redactor: Arc<Redactor>,
    /// Long-polls waiting now, within the per-application and per-token caps.
    pub long_polls: Arc<poller::WaitingPolls>,
    pub replays: Arc<ReplayTasks>,
    /// Whether the process is sound (health checks and ingest read it).
    pub liveness: Arc<Liveness>,
    /// Ingest requests are spans of OpenTelemetry traces.
    pub traces: crate::telemetry::Traces,
}

impl Services {
    /// The masking a principal's reads get: none with the `sensitive` permission.
    pub fn mask_for(&self, principal: &Principal) -> Option<&Redactor> {
        (!principal.sees_sensitive()).then_some(&*self.redactor)
    }
}

/// Every route of the API (the Svix routes and Herald's extensions).
pub fn routes() -> Routes {
    Routes::new()
        .merge(application::routes())
        .merge(endpoint::routes())
        .merge(endpoint_ops::routes())
        .merge(transformation::routes())
        .merge(message::routes())
        .merge(attempt::routes())
        .merge(event_type::routes())
        .merge(health::routes())
        .merge(stats::routes())
        .merge(dead_letters::routes())
        .merge(poller::routes())
        .merge(session::routes())
        .operations(routes!(portal_access::app_portal_access))
        .operations(routes!(portal_access::dashboard_access))
        .operations(routes!(portal_access::expire_all))
        .operations(routes!(auth::logout))
        .operations(routes!(openapi::serve))
}

/// The API's routes as served: its POSTs under the `idempotency-key` layer.
pub fn router(state: &AppState) -> Router<AppState> {
    routes().into_router().layer(from_fn_with_state(state.clone(), idempotency::layer))
}

/// Parses a message-creation body as `POST /api/v1/app/{app_id}/msg` does (depth cap,
/// JSON, shape); the entry point of the ingest fuzz target.
pub fn parse_message_body(raw: &[u8]) -> ApiResult<()> {
    extract::parse_json::<message::MessageIn>(raw).map(drop)
}

/// The API of a worker process: health checks only.
pub fn health_router(state: AppState) -> Router {
    health::routes().into_router().fallback(|| async { ApiError::NotFound("route") }).with_state(state)
}

/// For admin-only operations on one application: a portal token gets the same 404 for
/// another application's ids as everywhere else, and 403 (saying `why`) only on its own
/// application, so it learns nothing about anyone else's.
async fn require_admin_for(state: &AppState, principal: &Principal, app_id: &str, why: &'static str) -> ApiResult<()> {
    if *principal == Principal::Admin {
        return Ok(());
    }
    VisibleApp::resolve(state, principal, app_id).await?;
    Err(ApiError::Forbidden(why))
}
