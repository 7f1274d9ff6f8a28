//! The `idempotency-key` header on POST requests of the API, as Svix has it: a repeated key
//! (same caller, same method and URI) within the TTL gets the first 2xx answer back —
//! status and body, whatever the new body is — instead of doing the work twice. Answers
//! other than 2xx are not kept, so a failed request can be retried with its key.
//!
//! The caller is authenticated before anything is looked up, and the key belongs to who the
//! caller is (the admin, or one portal token), never to the raw header. Concurrent requests
//! with one key wait for each other. Stored bodies are sealed with the server key: some of
//! them carry a token or a secret (app-portal access), and none may rest in plaintext.
//! Message creation saves its answer inside the ingest transaction instead (see
//! `message::create_message`), so a crash can never separate the message from its key:
//! for it the layer only looks up and replays, and hands the handler its [`Keyed`].

use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, ApiResult, ValidationItem};
use crate::clock::now_ms;
use crate::sealing::{Keyring, Purpose};
use crate::store::{IdempotencyRecord, StoredResponse};

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
    fn for_key(&self, keyed: &Keyed) -> &Mutex<()> {
        let digest = Sha256::digest(keyed.sealed_for().as_bytes());
        &self.0[digest[0] as usize % self.0.len()]
    }
}

/// A request under an idempotency key: whose it is and what it is for (`scope`: the
/// caller, the method and the URI), and the key.
#[derive(Debug, Clone)]
pub struct Keyed {
    pub scope: String,
    pub key: String,
}

impl Keyed {
    fn new(principal: &Principal, method: &Method, uri: &axum::http::Uri, key: &str) -> Self {
        let caller = match principal {
            Principal::Admin => "admin".to_owned(),
            Principal::App { token_hash, .. } => format!("token:{token_hash}"),
        };
        // A trailing slash names the same route, so the same request (as Svix trims it).
        let path = uri.path();
        let path = if path.len() > 1 { path.trim_end_matches('/') } else { path };
        let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
        Self { scope: format!("{caller}\n{method} {path}{query}"), key: key.to_owned() }
    }

    /// What a stored body is bound to: this caller, request and key.
    fn sealed_for(&self) -> String {
        format!("{}\n{}", self.scope, self.key)
    }

    /// The record that keeps `body` (sealed) as the answer to this key.
    pub fn record(&self, keyring: &Keyring, status: StatusCode, body: &[u8]) -> IdempotencyRecord {
        let response = StoredResponse {
            status: status.as_u16(),
            body: keyring.seal(Purpose::StoredResponse, body, &self.sealed_for()),
            created_at: now_ms(),
        };
        IdempotencyRecord { scope: self.scope.clone(), key: self.key.clone(), response }
    }

    /// The first answer, again.
    pub fn replay(&self, keyring: &Keyring, stored: StoredResponse) -> ApiResult<Response> {
        let body = keyring
            .open(Purpose::StoredResponse, &stored.body, &self.sealed_for())
            .map_err(|e| anyhow::anyhow!("opening a stored idempotent response: {e}"))?;
        let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
        let mut response = (status, body).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().expect("a valid value"));
        Ok(response)
    }
}

/// The request's idempotency key, if it has a non-empty one: at most [`MAX_KEY_BYTES`] of
/// visible ASCII, else a 422.
pub fn key(headers: &HeaderMap) -> ApiResult<Option<&str>> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let problem = |msg: &str| {
        let loc = vec!["header".into(), "idempotency-key".into()];
        ApiError::Validation(vec![ValidationItem { loc, msg: msg.into(), kind: "value_error".into() }])
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

pub async fn layer(State(state): State<AppState>, matched: Option<MatchedPath>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let ingest = matched.as_ref().is_some_and(|m| m.as_str().trim_end_matches('/') == "/api/v1/app/{app_id}/msg");
    match key(req.headers()) {
        Ok(Some(key)) => {
            let key = key.to_owned();
            replay_or_run(state, key, ingest, req, next).await.unwrap_or_else(IntoResponse::into_response)
        }
        Ok(None) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

async fn replay_or_run(state: AppState, key: String, ingest: bool, req: Request, next: Next) -> ApiResult<Response> {
    let (mut parts, body) = req.into_parts();
    // Authenticated first: an unknown caller learns nothing and leaves nothing behind.
    let principal = Principal::from_request_parts(&mut parts, &state).await?;
    let keyed = Keyed::new(&principal, &parts.method, &parts.uri, &key);
    parts.extensions.insert(principal);
    let _serialized = state.key_locks.for_key(&keyed).lock().await;
    if let Some(stored) = state.store.idempotent_response(&keyed.scope, &keyed.key).await? {
        return keyed.replay(&state.keyring, stored);
    }
    if ingest {
        // The handler keeps its answer in the ingest transaction.
        parts.extensions.insert(keyed);
        return Ok(next.run(Request::from_parts(parts, body)).await);
    }
    let response = next.run(Request::from_parts(parts, body)).await;
    if !response.status().is_success() {
        return Ok(response);
    }
    let (parts, body) = response.into_parts();
    let body =
        axum::body::to_bytes(body, usize::MAX).await.map_err(|_| anyhow::anyhow!("reading a response body failed"))?;
    let record = keyed.record(&state.keyring, parts.status, &body);
    if let Err(e) = state.store.save_idempotent_response(&record.scope, &record.key, &record.response).await {
        tracing::warn!(error = %e, "saving an idempotent response failed");
    }
    Ok(Response::from_parts(parts, Body::from(body)))
}
