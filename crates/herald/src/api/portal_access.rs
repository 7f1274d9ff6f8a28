//! Issuing app-portal tokens: `POST /api/v1/auth/app-portal-access/{app_id}`, and the
//! deprecated `POST /api/v1/auth/dashboard-access/{app_id}` that Svix still serves (its body
//! ignored); and revoking them all: `POST /api/v1/auth/app/{app_id}/expire-all`. Only the
//! admin token issues and revokes them. The token is stored only as a hash; the link
//! carries it in the URL fragment, which never reaches a server log.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::application::{ApplicationIn, app_for_inline};
use super::auth::{PORTAL_TOKEN_PREFIX, Principal, token_hash};
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, parse_json};
use super::{AppState, VisibleApp};
use crate::clock::now_ms;
use crate::ids::random_token;
use crate::store::{App, PortalToken};

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppPortalAccessIn {
    /// Creates the application if it does not exist yet (its `uid` must be the path's).
    pub application: Option<ApplicationIn>,
    /// Token lifetime in seconds (1 hour to 7 days; default: `auth.portal_token_ttl_secs`).
    pub expiry: Option<u64>,
    /// Herald extension: the token may read payload fields configured as sensitive
    /// (`redaction` settings); without it they are masked. Default false.
    #[serde(default)]
    pub sensitive: bool,
    /// The feature flags the token has: event types gated by another flag are hidden from
    /// it (at most 64, each up to 256 characters of `a-zA-Z0-9-_.`).
    #[serde(default)]
    pub feature_flags: Vec<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AppPortalAccessOut {
    pub url: String,
    pub token: String,
}

/// Why only the admin token issues portal access.
const OPERATOR_ISSUES: &str = "portal access is issued by the operator's admin token";

/// Issues an app-portal token for one application.
#[utoipa::path(post, path = "/api/v1/auth/app-portal-access/{app_id}", operation_id = "v1.authentication.app-portal-access",
    tag = "Authentication", request_body = AppPortalAccessIn,
    params(("app_id" = String, Path, description = "Application id or uid")),
    responses((status = 200, body = AppPortalAccessOut), (status = 404, body = super::error::HttpErrorOut)))]
pub async fn app_portal_access(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    body: JsonBody<AppPortalAccessIn>,
) -> ApiResult<Json<AppPortalAccessOut>> {
    super::require_admin_for(&state, &principal, &app_id, OPERATOR_ISSUES).await?;
    issue(&state, &app_id, body.value).await.map(Json)
}

/// Svix's deprecated name for the same: a portal link and token with the default lifetime.
/// Like Svix, it reads no body: whatever is sent (nothing, `null`, an object) is ignored.
#[utoipa::path(post, path = "/api/v1/auth/dashboard-access/{app_id}", operation_id = "v1.authentication.dashboard-access",
    tag = "Authentication", params(("app_id" = String, Path, description = "Application id or uid")),
    responses((status = 200, body = AppPortalAccessOut), (status = 404, body = super::error::HttpErrorOut)))]
pub async fn dashboard_access(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
) -> ApiResult<Json<AppPortalAccessOut>> {
    super::require_admin_for(&state, &principal, &app_id, OPERATOR_ISSUES).await?;
    issue(&state, &app_id, AppPortalAccessIn::default()).await.map(Json)
}

async fn issue(state: &AppState, app_id: &str, input: AppPortalAccessIn) -> ApiResult<AppPortalAccessOut> {
    let app: Arc<App> = app_for_inline(state, app_id, input.application).await?;
    let ttl_secs = match input.expiry {
        None => state.settings.portal_token_ttl.as_secs(),
        Some(secs) if (3600..=7 * 24 * 3600).contains(&secs) => secs,
        Some(_) => return Err(ApiError::invalid("expiry", "must be between 3600 and 604800 seconds")),
    };
    check_feature_flags(&input.feature_flags)?;
    let token = format!("{PORTAL_TOKEN_PREFIX}{}", random_token(32));
    let now = now_ms();
    let record = PortalToken {
        hash: token_hash(&token),
        app_id: app.id.clone(),
        expires_at: now + (ttl_secs as i64) * 1000,
        created_at: now,
        sensitive: input.sensitive,
        feature_flags: input.feature_flags,
    };
    state.store.insert_token(&record).await?;
    let url = format!("{}/portal#token={token}", state.settings.public_url.trim_end_matches('/'));
    Ok(AppPortalAccessOut { url, token })
}

/// Feature flags a token may carry at most.
const MAX_FEATURE_FLAGS: usize = 64;

/// Svix's rules for feature flags: names of `a-zA-Z0-9-_.`, up to 256 characters, each once.
fn check_feature_flags(flags: &[String]) -> ApiResult<()> {
    let mut p = super::validate::Problems::default();
    if !flags.is_empty() {
        p.slug_list("featureFlags", flags, 256, MAX_FEATURE_FLAGS);
    }
    p.finish()
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationTokenExpireIn {
    /// Seconds until the tokens expire (0 to 604800; default 0: at once).
    pub expiry: Option<i64>,
    /// Svix's filter by the session a token was issued for; Herald issues tokens without
    /// one, so a non-empty list is refused (422) rather than ignored.
    #[serde(default)]
    pub session_ids: Vec<String>,
}

/// Makes every app-portal token of the application expire (after `expiry` seconds): the
/// links stop working, and the dashboard sessions opened with them end with them.
#[utoipa::path(post, path = "/api/v1/auth/app/{app_id}/expire-all", operation_id = "v1.authentication.expire-all",
    tag = "Authentication", request_body = ApplicationTokenExpireIn,
    params(("app_id" = String, Path, description = "Application id or uid")),
    responses((status = 204), (status = 404, body = super::error::HttpErrorOut),
        (status = 422, body = super::error::HttpValidationError)))]
pub async fn expire_all(
    State(state): State<AppState>,
    principal: Principal,
    app: VisibleApp,
    body: Bytes,
) -> ApiResult<StatusCode> {
    principal.require_admin_because(OPERATOR_ISSUES)?;
    let input: ApplicationTokenExpireIn =
        if body.iter().all(u8::is_ascii_whitespace) { Default::default() } else { parse_json(&body)? };
    let secs = input.expiry.unwrap_or(0);
    if !(0..=7 * 24 * 3600).contains(&secs) {
        return Err(ApiError::invalid("expiry", "must be between 0 and 604800 seconds"));
    }
    if !input.session_ids.is_empty() {
        return Err(ApiError::invalid("sessionIds", "Herald issues portal tokens without session ids"));
    }
    let expired = state.store.expire_tokens(&app.id, now_ms() + secs * 1000).await?;
    tracing::info!(app = %app.id, expired, in_secs = secs, "portal tokens expired by the operator");
    Ok(StatusCode::NO_CONTENT)
}
