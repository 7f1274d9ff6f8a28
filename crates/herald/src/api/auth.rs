//! Who is calling: the admin (the operator's token) or an application's portal token.
//! Tokens are compared by SHA-256 hash in constant time; portal tokens are stored only as
//! hashes (they are issued in `portal_access`). Also `logout`.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use super::error::{ApiError, ApiResult};
use crate::clock::now_ms;
use crate::ids::AppId;
use crate::serving::ClientAddress;

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
        /// Svix's feature flags the token was issued with.
        feature_flags: Vec<String>,
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

    /// Whether this principal sees an event type gated by `flag` (Svix's feature flags: a
    /// portal token only those it was issued with; the admin token all).
    pub fn has_feature(&self, flag: Option<&str>) -> bool {
        match (self, flag) {
            (_, None) | (Self::Admin, _) => true,
            (Self::App { feature_flags, .. }, Some(flag)) => feature_flags.iter().any(|f| f == flag),
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
        let token = bearer_token(&parts.headers)?.ok_or(ApiError::Unauthorized)?;
        let principal = Self::from_token(state, token, client_address(parts)).await?;
        // Later extractors of the same request (the `scope` ones) find it here, so the
        // request is charged to its token's budget once.
        parts.extensions.insert(principal.clone());
        Ok(principal)
    }
}

/// The token of an `Authorization: Bearer <token>` header; the scheme's case does not
/// matter (RFC 9110). A request with two `Authorization` headers is refused (400): which
/// one counts would be a guess, and a proxy and a client may each have added one.
fn bearer_token(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ApiError::BadRequest("a request may carry one Authorization header, not several".into()));
    }
    let Some((scheme, token)) = value.to_str().ok().and_then(|v| v.trim_start().split_once(' ')) else {
        return Ok(None);
    };
    let token = token.trim();
    Ok((scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token))
}

/// The address the request came from, for the failed-authentication budget: the
/// connection's peer, or the client a trusted reverse proxy names (`serving`).
pub fn client_address(parts: &Parts) -> Option<IpAddr> {
    match parts.extensions.get::<ClientAddress>() {
        Some(ClientAddress(ip)) => Some(*ip),
        None => parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|info| info.0.ip()),
    }
}

impl Principal {
    /// Who `token` belongs to (the API's bearer token, or the token a dashboard sign-in
    /// presents), charged to its request budget. A valid token is always accepted: the
    /// failed-authentication budget of the client's address only decides how a *wrong*
    /// one is answered (401 while it lasts, then 429 until it refills), so nobody sharing
    /// an address (behind one proxy, say) can lock out the holders of valid tokens.
    pub async fn from_token(state: &AppState, token: &str, client: Option<IpAddr>) -> Result<Self, ApiError> {
        match Self::identify(state, token).await? {
            Some(principal) => Ok(principal),
            None => match client.map(|client| state.rate_limiter.failed_authentication(client)) {
                Some(Err(wait)) => Err(ApiError::TooManyFailedAuthentications(wait)),
                _ => Err(ApiError::Unauthorized),
            },
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
                Ok(Some(Self::App {
                    app_id: found.app_id,
                    token_hash: hash,
                    sensitive: found.sensitive,
                    feature_flags: found.feature_flags,
                }))
            }
            _ => Ok(None),
        }
    }
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
