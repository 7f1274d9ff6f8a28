//! The `idempotency-key` header on POST requests of the API: a repeated key (same caller,
//! same method and URI) returns the first successful response instead of doing the work
//! twice; the same key with a different body is a 422. Message creation handles its key
//! inside the ingest transaction instead (see `message::create_message`), so a crash can
//! never separate the message from its key.
//!
//! The caller is authenticated before anything is looked up, and the key is scoped to who
//! the caller is (the admin, or one portal token), never to the raw header. Stored bodies
//! are sealed with the server key: some of them carry a token or a secret (app-portal
//! access, secret rotation), and none may rest in plaintext.

use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, ApiResult, ValidationItem};
use super::message::replay;
use crate::clock::now_ms;
use crate::sealing::Purpose;
use crate::store::StoredResponse;

/// The longest key accepted (the Svix SDKs send UUIDs or short random strings).
pub const MAX_KEY_BYTES: usize = 256;

/// Concurrent requests with the same key wait for each other: lock striping by key hash.
pub struct KeyLocks([Mutex<()>; 64]);

impl Default for KeyLocks {
    fn default() -> Self {
        Self(std::array::from_fn(|_| Mutex::new(())))
    }
}

impl KeyLocks {
    fn for_key(&self, scope: &str, key: &str) -> &Mutex<()> {
        let digest = Sha256::digest(format!("{scope}\n{key}").as_bytes());
        &self.0[digest[0] as usize % self.0.len()]
    }
}

/// The request's idempotency key, if it has a non-empty one: at most [`MAX_KEY_BYTES`] of
/// visible ASCII, else a 422.
pub fn key(headers: &HeaderMap) -> ApiResult<Option<&str>> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let problem = |msg: &str| {
        let item = ValidationItem {
            loc: vec!["header".into(), "idempotency-key".into()],
            msg: msg.into(),
            kind: "value_error".into(),
        };
        ApiError::Validation(vec![item])
    };
    let key = value.to_str().map_err(|_| problem("must be visible ASCII"))?;
    if key.len() > MAX_KEY_BYTES {
        return Err(problem("must be at most 256 characters"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(problem("must be visible ASCII"));
    }
    Ok(Some(key).filter(|k| !k.is_empty()))
}

/// Who a key belongs to: the admin, or one portal token (by its hash).
fn caller_scope(principal: &Principal) -> String {
    match principal {
        Principal::Admin => "admin".to_owned(),
        Principal::App { token_hash, .. } => format!("token:{token_hash}"),
    }
}

pub async fn layer(State(state): State<AppState>, matched: Option<MatchedPath>, req: Request, next: Next) -> Response {
    let handled_by_ingest = matched.as_ref().is_some_and(|m| m.as_str() == "/api/v1/app/{app_id}/msg");
    if req.method() != Method::POST || handled_by_ingest {
        return next.run(req).await;
    }
    match key(req.headers()) {
        Ok(Some(key)) => {
            let key = key.to_owned();
            replay_or_run(state, key, req, next).await.unwrap_or_else(IntoResponse::into_response)
        }
        Ok(None) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

async fn replay_or_run(state: AppState, key: String, req: Request, next: Next) -> ApiResult<Response> {
    let (mut parts, body) = req.into_parts();
    // Authenticated first: an unknown caller learns nothing and leaves nothing behind.
    let principal = Principal::from_request_parts(&mut parts, &state).await?;
    parts.extensions.insert(principal.clone());
    let scope = format!("{}\n{} {}", caller_scope(&principal), parts.method, parts.uri);
    let bytes = axum::body::to_bytes(body, state.limits.body_bytes).await.map_err(|_| {
        ApiError::PayloadTooLarge(format!("the request body exceeds {} bytes", state.limits.body_bytes))
    })?;
    let fingerprint = format!("{:x}", Sha256::digest(&bytes));
    let _serialized = state.key_locks.for_key(&scope, &key).lock().await;
    let sealed_for = format!("{scope}\n{key}");
    if let Some(mut stored) = state.store.idempotent_response(&scope, &key).await? {
        let body = state
            .keyring
            .open(Purpose::StoredResponse, &stored.body, &sealed_for)
            .map_err(|e| anyhow::anyhow!("opening a stored idempotent response: {e}"))?;
        stored.body = String::from_utf8(body).map_err(anyhow::Error::from)?;
        return replay(stored, &fingerprint);
    }
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    if !response.status().is_success() {
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    let body =
        axum::body::to_bytes(body, usize::MAX).await.map_err(|_| anyhow::anyhow!("reading a response body failed"))?;
    let stored = StoredResponse {
        fingerprint,
        status: parts.status.as_u16(),
        body: state.keyring.seal(Purpose::StoredResponse, &body, &sealed_for),
        created_at: now_ms(),
    };
    if let Err(e) = state.store.save_idempotent_response(&scope, &key, &stored).await {
        tracing::warn!(error = %e, "saving an idempotent response failed");
    }
    Ok(Response::from_parts(parts, Body::from(body)))
}
