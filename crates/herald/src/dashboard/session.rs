//! Dashboard sessions and CSRF tokens.
//!
//! Signing in trades a token for a session: a random secret in an `HttpOnly`,
//! `SameSite=Strict` cookie with an expiry (`Secure` when the public URL is https; in an
//! embedding site's frame `SameSite=None; Secure; Partitioned` instead, see `look`). The store
//! keeps only the secret's hash, so a copy of the database opens no session. A session ends
//! at its expiry, at sign-out (its row is deleted), when the operator revokes it
//! (`/api/v1/auth/session`), or as soon as the token it signed in with stops being valid (a
//! revoked or expired portal token, a changed admin token).
//!
//! Every form of a session carries a CSRF token derived from the session secret. The
//! sign-in form has no session yet: it carries a token bound to a short-lived sign-in cookie
//! instead, and a foreign `Origin` is refused, so no other site can sign a browser into a
//! session of its choosing (login CSRF).

use axum::http::{HeaderMap, HeaderValue, header};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::api::{AppState, Principal, token_hash};
use crate::clock::now_ms;
use crate::ids::random_token;
use crate::store::{Session, StoreResult};

/// The session cookie.
pub const COOKIE: &str = "herald_session";
/// The sign-in cookie (its value is the sign-in form's CSRF token).
pub const LOGIN_COOKIE: &str = "herald_login";
/// How long a sign-in form stays usable.
const LOGIN_FORM_SECS: u64 = 3600;

/// Opens a session for `principal`, who presented `token`; returns the cookie's secret and
/// the session's lifetime in seconds.
pub async fn open(state: &AppState, principal: &Principal, token: &str) -> StoreResult<(String, u64)> {
    let now = now_ms();
    let mut expires_at = now + state.settings.session_ttl.as_millis() as i64;
    if let Principal::App { token_hash, .. } = principal
        && let Some(found) = state.store.token(token_hash).await?
    {
        expires_at = expires_at.min(found.expires_at);
    }
    let secret = format!("hs_{}", random_token(32));
    let session = Session {
        hash: token_hash(&secret),
        id: format!("ses_{}", random_token(16)),
        app_id: match principal {
            Principal::Admin => None,
            Principal::App { app_id, .. } => Some(app_id.clone()),
        },
        token_hash: token_hash(token),
        created_at: now,
        expires_at,
    };
    state.store.insert_session(&session).await?;
    Ok((secret, ((expires_at - now).max(0) / 1000) as u64))
}

/// Who the session with this cookie secret belongs to, if it is still valid; charged to the
/// principal's request budget like an API call (`Err`: over it, wait this long).
pub async fn resolve(state: &AppState, secret: &str) -> Option<Result<Principal, std::time::Duration>> {
    let session = state.store.session(&token_hash(secret)).await.ok()??;
    let now = now_ms();
    if session.expires_at <= now {
        return None;
    }
    let principal = match &session.app_id {
        None if state.admin.hash_matches(&session.token_hash) => Principal::Admin,
        None => return None,
        Some(app_id) => {
            let token = state.store.token(&session.token_hash).await.ok()??;
            if token.expires_at <= now || token.app_id != *app_id {
                return None;
            }
            Principal::App {
                app_id: token.app_id,
                token_hash: token.hash,
                sensitive: token.sensitive,
                feature_flags: token.feature_flags,
            }
        }
    };
    let (bucket, admin) = match &principal {
        Principal::Admin => ("admin", true),
        Principal::App { token_hash, .. } => (token_hash.as_str(), false),
    };
    // Over its request budget the session stays signed in; the page says to wait.
    Some(state.rate_limiter.admit(bucket, admin).map(|()| principal))
}

/// A cookie's value from the request, if present and not empty.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|c| {
        let (key, value) = c.trim().split_once('=')?;
        (key == name && !value.is_empty()).then(|| value.to_owned())
    })
}

/// A `Set-Cookie` value for a response to `request`: `HttpOnly`, expiring after `max_age`
/// seconds; `SameSite=Strict` (and `Secure` when Herald's public URL is https), or, inside
/// an embedding site's frame, `SameSite=None; Secure; Partitioned` (see `look`).
pub fn set_cookie(state: &AppState, request: &HeaderMap, name: &str, value: &str, max_age: u64) -> HeaderValue {
    let scope = if super::look::embedded(state, request) {
        "; SameSite=None; Secure; Partitioned"
    } else if state.settings.public_url.starts_with("https://") {
        "; SameSite=Strict; Secure"
    } else {
        "; SameSite=Strict"
    };
    let cookie = format!("{name}={value}; Path=/; HttpOnly; Max-Age={max_age}{scope}");
    HeaderValue::from_str(&cookie).expect("cookie values are base62")
}

/// A fresh sign-in token: the `Set-Cookie` carrying it, and the value for the form.
pub fn login_token(state: &AppState, request: &HeaderMap) -> (HeaderValue, String) {
    let token = random_token(32);
    (set_cookie(state, request, LOGIN_COOKIE, &token, LOGIN_FORM_SECS), token)
}

/// Whether a sign-in form was posted from Herald's own sign-in page: its token matches the
/// sign-in cookie (which another site can neither read nor set), and its `Origin`, when the
/// browser sends one, is Herald's.
pub fn login_is_genuine(state: &AppState, headers: &HeaderMap, form_token: &str) -> bool {
    let Some(expected) = cookie(headers, LOGIN_COOKIE) else { return false };
    let same_token: bool = form_token.as_bytes().ct_eq(expected.as_bytes()).into();
    same_token && origin_is_own(state, headers)
}

/// Whether the request's `Origin` (if any) is Herald's own: the public URL's origin, or the
/// host the request was sent to. `null` (an opaque origin) is not.
fn origin_is_own(state: &AppState, headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else { return true };
    let public = state.settings.public_url.trim_end_matches('/');
    if origin == public {
        return true;
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or_default();
    origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://")) == Some(host)
}

/// The CSRF token of a session: an HMAC of a fixed label under the session's secret, so a
/// page of another site (which cannot read the cookie) cannot forge it.
pub fn csrf_token(secret: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(b"herald-dashboard-csrf");
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
}
