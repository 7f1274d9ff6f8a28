//! Who is calling: the admin (the operator's token) or an application's portal token.
//! Tokens are compared by SHA-256 hash in constant time; portal tokens are stored only as
//! hashes. Also the two auth routes: app-portal access and logout.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use super::application::{ApplicationIn, create_app_from};
use super::error::{ApiError, ApiResult};
use super::extract::JsonBody;
use crate::clock::now_ms;
use crate::ids::{AppId, random_token};
use crate::store::{App, PortalToken};

/// Prefix of app-portal tokens.
pub const PORTAL_TOKEN_PREFIX: &str = "appsk_";

/// The admin token's hash, kept in memory.
pub struct AdminToken([u8; 32]);

impl AdminToken {
    pub fn new(token: &str) -> Self {
        Self(Sha256::digest(token.as_bytes()).into())
    }

    fn matches(&self, token: &str) -> bool {
        let given: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        given.ct_eq(&self.0).into()
    }

    /// Whether a stored token hash (hex, as [`token_hash`] makes it) is this token's.
    pub fn hash_matches(&self, hex: &str) -> bool {
        let own: String = self.0.iter().map(|b| format!("{b:02x}")).collect();
        own.as_bytes().ct_eq(hex.as_bytes()).into()
    }
}

/// Hex SHA-256 of a token: the form portal tokens are stored and looked up in.
pub fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Admin,
    /// A portal token scoped to one application.
    App {
        app_id: AppId,
        token_hash: String,
        /// Issued with the `sensitive` permission: sees payload fields unmasked.
        sensitive: bool,
    },
}

impl Principal {
    pub fn require_admin(&self) -> ApiResult<()> {
        self.require_admin_because("this operation needs the admin token")
    }

    /// The admin only; a portal token is refused saying `why`.
    pub fn require_admin_because(&self, why: &'static str) -> ApiResult<()> {
        match self {
            Self::Admin => Ok(()),
            Self::App { .. } => Err(ApiError::Forbidden(why)),
        }
    }

    /// Whether this principal sees sensitive payload fields unmasked.
    pub fn sees_sensitive(&self) -> bool {
        match self {
            Self::Admin => true,
            Self::App { sensitive, .. } => *sensitive,
        }
    }

    /// Whether this principal may see `app`.
    pub fn can_see(&self, app: &AppId) -> bool {
        match self {
            Self::Admin => true,
            Self::App { app_id, .. } => app_id == app,
        }
    }
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    /// The caller of an API request, authenticated once per request (the idempotency layer
    /// may have done it already, and left the result in the request's extensions).
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        if let Some(known) = parts.extensions.get::<Principal>() {
            return Ok(known.clone());
        }
        let token = bearer_token(&parts.headers).ok_or(ApiError::Unauthorized)?;
        Self::from_token(state, token, client_address(parts)).await
    }
}

/// The token of an `Authorization: Bearer <token>` header; the scheme's case does not
/// matter (RFC 9110).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The address the request came from (for the failed-authentication budget).
pub fn client_address(parts: &Parts) -> Option<IpAddr> {
    parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0.ip())
}

impl Principal {
    /// Who `token` belongs to (the API's bearer token, or the token a dashboard sign-in
    /// presents), charged to its request budget. A client whose failed authentications
    /// used up their budget is refused before the token is even looked at.
    pub async fn from_token(state: &AppState, token: &str, client: Option<IpAddr>) -> Result<Self, ApiError> {
        if let Some(client) = client {
            state.rate_limiter.may_authenticate(client).map_err(ApiError::TooManyFailedAuthentications)?;
        }
        match Self::identify(state, token).await? {
            Some(principal) => Ok(principal),
            None => {
                if let Some(client) = client {
                    state.rate_limiter.failed_authentication(client);
                }
                Err(ApiError::Unauthorized)
            }
        }
    }

    async fn identify(state: &AppState, token: &str) -> Result<Option<Self>, ApiError> {
        if state.admin.matches(token) {
            state.rate_limiter.admit("admin", true).map_err(ApiError::RateLimited)?;
            return Ok(Some(Self::Admin));
        }
        if !token.starts_with(PORTAL_TOKEN_PREFIX) {
            return Ok(None);
        }
        let hash = token_hash(token);
        match state.store.token(&hash).await? {
            Some(found) if found.expires_at > now_ms() => {
                state.rate_limiter.admit(&hash, false).map_err(ApiError::RateLimited)?;
                Ok(Some(Self::App { app_id: found.app_id, token_hash: hash, sensitive: found.sensitive }))
            }
            _ => Ok(None),
        }
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppPortalAccessIn {
    /// Creates the application if it does not exist yet.
    pub application: Option<ApplicationIn>,
    /// Token lifetime in seconds (1 hour to 7 days; default: `auth.portal_token_ttl_secs`).
    pub expiry: Option<u64>,
    /// Herald extension: the token may read payload fields configured as sensitive
    /// (`redaction` settings); without it they are masked. Default false.
    #[serde(default)]
    pub sensitive: bool,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AppPortalAccessOut {
    pub url: String,
    pub token: String,
}

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
    super::require_admin_for(&state, &principal, &app_id, "portal access is issued by the operator's admin token")
        .await?;
    let app: Arc<App> = match (state.catalog.app(&app_id).await?, body.value.application) {
        (Some(app), _) => app,
        (None, Some(input)) => Arc::new(create_app_from(&state, input, Some(&app_id)).await?),
        (None, None) => return Err(ApiError::NotFound("application")),
    };
    let ttl_secs = match body.value.expiry {
        None => state.settings.portal_token_ttl.as_secs(),
        Some(secs) if (3600..=7 * 24 * 3600).contains(&secs) => secs,
        Some(_) => {
            return Err(ApiError::invalid("expiry", "must be between 3600 and 604800 seconds"));
        }
    };
    let token = format!("{PORTAL_TOKEN_PREFIX}{}", random_token(32));
    let now = now_ms();
    state
        .store
        .insert_token(&PortalToken {
            hash: token_hash(&token),
            app_id: app.id.clone(),
            expires_at: now + (ttl_secs as i64) * 1000,
            created_at: now,
            sensitive: body.value.sensitive,
        })
        .await?;
    let url = format!("{}/portal#token={token}", state.settings.public_url.trim_end_matches('/'));
    Ok(Json(AppPortalAccessOut { url, token }))
}

/// Revokes the portal token used to call it.
#[utoipa::path(post, path = "/api/v1/auth/logout", operation_id = "logout_api_v1_auth_logout__post",
    tag = "Authentication", responses((status = 204)))]
pub async fn logout(State(state): State<AppState>, principal: Principal) -> ApiResult<StatusCode> {
    match principal {
        Principal::Admin => {
            Err(ApiError::Forbidden("the admin token is configured, not issued, and cannot be revoked"))
        }
        Principal::App { token_hash, .. } => {
            state.store.revoke_token(&token_hash).await?;
            Ok(StatusCode::NO_CONTENT)
        }
    }
}
