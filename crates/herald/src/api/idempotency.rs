//! The `idempotency-key` header on POST requests: a repeated key (same caller, same path)
//! returns the first successful response instead of doing the work twice; the same key with
//! a different body is a 422. Message creation handles its key inside the ingest
//! transaction instead (see `message::create_message`), so a crash can never separate the
//! message from its key.

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::AppState;
use super::error::ApiError;
use super::message::replay;
use crate::clock::now_ms;
use crate::store::StoredResponse;

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

pub async fn layer(State(state): State<AppState>, matched: Option<MatchedPath>, req: Request, next: Next) -> Response {
    let key = req.headers().get("idempotency-key").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let handled_by_ingest = matched.as_ref().is_some_and(|m| m.as_str() == "/api/v1/app/{app_id}/msg");
    let Some(key) = key.filter(|k| !k.is_empty() && req.method() == Method::POST && !handled_by_ingest) else {
        return next.run(req).await;
    };
    // Keys are scoped to the caller's token and the path, so callers never see each
    // other's responses.
    let caller = req.headers().get(header::AUTHORIZATION).map(|v| Sha256::digest(v.as_bytes())).unwrap_or_default();
    let scope = format!("{:x}:{}", caller, req.uri().path());
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, state.limits.body_bytes).await else {
        return ApiError::PayloadTooLarge(format!("the request body exceeds {} bytes", state.limits.body_bytes))
            .into_response();
    };
    let fingerprint = format!("{:x}", Sha256::digest(&bytes));
    let _serialized = state.key_locks.for_key(&scope, &key).lock().await;
    match state.store.idempotent_response(&scope, &key).await {
        Ok(Some(stored)) => {
            return replay(stored, &fingerprint).unwrap_or_else(IntoResponse::into_response);
        }
        Ok(None) => {}
        Err(e) => return ApiError::from(e).into_response(),
    }
    let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    if !response.status().is_success() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return ApiError::Internal(anyhow::anyhow!("reading a response body failed")).into_response();
    };
    let stored = StoredResponse {
        fingerprint,
        status: parts.status.as_u16(),
        body: String::from_utf8_lossy(&body).into_owned(),
        created_at: now_ms(),
    };
    if let Err(e) = state.store.save_idempotent_response(&scope, &key, &stored).await {
        tracing::warn!(error = %e, "saving an idempotent response failed");
    }
    Response::from_parts(parts, Body::from(body))
}
