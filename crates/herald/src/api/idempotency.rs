//! The `idempotency-key` header on POST requests of the API, as Svix has it: a repeated key
//! (same caller, same method and URI) within the TTL gets the first 2xx answer back —
//! status and body, whatever the new body is — instead of doing the work twice. Answers
//! other than 2xx are not kept, so a failed request can be retried with its key.
//!
//! The caller is authenticated before anything is looked up, and the key belongs to who the
//! caller is (the admin, or one portal token), never to the raw header. Concurrent requests
//! with one key wait for each other, and only those: the request body is read before the
//! key is held, so a client that sends it slowly holds nothing anyone else needs. Stored
//! bodies are sealed with the server key: some of them carry a token or a secret
//! (app-portal access), and none may rest in plaintext.
//! Message creation saves its answer inside the ingest transaction instead (see
//! `message::create_message`), so a crash can never separate the message from its key.
//! That transaction also looks the key up, so the layer does not: it hands the handler its
//! [`Keyed`], and looks up only when the handler refused (a repeated key replays the first
//! answer even with a body that would not pass). The answer it keeps is where the message
//! is, not a copy of it: no second payload on disk and nothing to seal, and a replay shows
//! the message as it is now (expunged content stays expunged).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex as StdMutex};

use axum::body::Body;
use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use tokio::sync::{Mutex, OwnedMutexGuard};

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, ApiResult, ValidationItem};
use super::extract::read_body;
use crate::clock::now_ms;
use crate::ids::{AppId, MessageId};
use crate::sealing::{Keyring, Purpose};
use crate::store::{IdempotencyRecord, StoredResponse};

/// The longest key accepted (the Svix SDKs send UUIDs or short random strings).
pub const MAX_KEY_BYTES: usize = 256;

/// Concurrent requests with the same key (of the same caller) wait for each other; requests
/// with other keys never do. An entry lives while a request holds or waits for its key.
#[derive(Default)]
pub struct KeyLocks(StdMutex<HashMap<String, Arc<Mutex<()>>>>);

/// A request's hold on its key (or its place in the queue for it). Dropping it, whether the
/// request finished or its client went away, lets the next one in and forgets the key when
/// nobody else wants it.
pub struct KeyHold<'a> {
    locks: &'a KeyLocks,
    name: String,
    lock: Arc<Mutex<()>>,
    held: Option<OwnedMutexGuard<()>>,
}

impl KeyLocks {
    /// Waits until no other request holds `keyed`'s key.
    async fn hold(&self, keyed: &Keyed) -> KeyHold<'_> {
        let name = keyed.sealed_for();
        let lock = self.map().entry(name.clone()).or_default().clone();
        let mut hold = KeyHold { locks: self, name, lock, held: None };
        hold.held = Some(hold.lock.clone().lock_owned().await);
        hold
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Mutex<()>>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map().len()
    }
}

impl Drop for KeyHold<'_> {
    fn drop(&mut self) {
        self.held.take();
        let mut map = self.locks.map();
        // The map's reference and this one: nobody else holds or waits for the key.
        if Arc::strong_count(&self.lock) == 2 {
            map.remove(&self.name);
        }
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
        // A trailing slash names the same route, so the same request (as Svix trims it).
        let path = uri.path();
        let path = if path.len() > 1 { path.trim_end_matches('/') } else { path };
        // `caller\nMETHOD path?query`, written into one allocation (this is on every keyed POST).
        let mut scope = String::with_capacity(80 + path.len() + uri.query().map_or(0, str::len));
        // Writing into a String cannot fail.
        let _ = match principal {
            Principal::Admin => write!(scope, "admin"),
            Principal::App { token_hash, .. } => write!(scope, "token:{token_hash}"),
        };
        let _ = write!(scope, "\n{method} {path}");
        if let Some(query) = uri.query() {
            let _ = write!(scope, "?{query}");
        }
        Self { scope, key: key.to_owned() }
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

    /// The record that keeps a message create's 202: which message it made, and whether the
    /// answer showed its payload.
    pub fn record_message(&self, app: &AppId, msg: &MessageId, with_content: bool) -> IdempotencyRecord {
        let body = format!("{MESSAGE_ANSWER}{app}:{msg}:{}", u8::from(with_content));
        let response = StoredResponse { status: StatusCode::ACCEPTED.as_u16(), body, created_at: now_ms() };
        IdempotencyRecord { scope: self.scope.clone(), key: self.key.clone(), response }
    }

    /// The first answer, again.
    pub async fn replay(&self, state: &AppState, stored: StoredResponse) -> ApiResult<Response> {
        if let Some(reference) = stored.body.strip_prefix(MESSAGE_ANSWER) {
            return replay_message(state, stored.status, reference).await;
        }
        let body = state
            .keyring
            .open(Purpose::StoredResponse, &stored.body, &self.sealed_for())
            .map_err(|e| anyhow::anyhow!("opening a stored idempotent response: {e}"))?;
        Ok(json_answer(stored.status, body))
    }
}

/// How a kept answer that is a message reference begins (a sealed body never does).
const MESSAGE_ANSWER: &str = "message:";

/// A message create's answer rebuilt from its message (`app:msg:with_content`). A message
/// that is gone (its application was deleted) cannot answer: 404.
async fn replay_message(state: &AppState, status: u16, reference: &str) -> ApiResult<Response> {
    let mut parts = reference.splitn(3, ':');
    let (Some(app), Some(msg), Some(with_content)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(anyhow::anyhow!("a kept message answer that does not parse").into());
    };
    let app = AppId::from_trusted(app.to_owned());
    let Some(message) = state.store.message(&app, msg).await? else {
        return Err(ApiError::NotFound("the message this idempotency key created"));
    };
    let out = super::message::MessageOut::new(&message, with_content == "1");
    Ok(json_answer(status, serde_json::to_vec(&out).map_err(anyhow::Error::from)?))
}

fn json_answer(status: u16, body: Vec<u8>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let mut response = (status, body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, "application/json".parse().expect("a valid value"));
    response
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
    let keyed = Arc::new(Keyed::new(&principal, &parts.method, &parts.uri, &key));
    parts.extensions.insert(principal);
    // All of the request is here before its key is held: no I/O with the client under it.
    let body = Body::from(read_body(body, state.limits.body_bytes).await?);
    let _held = state.key_locks.hold(&keyed).await;
    if ingest {
        // The ingest transaction looks the key up and keeps the answer; only a refusal
        // (which wrote nothing) needs the first answer found here.
        parts.extensions.insert(keyed.clone());
        let response = next.run(Request::from_parts(parts, body)).await;
        if response.status().is_success() {
            return Ok(response);
        }
        return match state.store.idempotent_response(&keyed.scope, &keyed.key).await? {
            Some(stored) => keyed.replay(&state, stored).await,
            None => Ok(response),
        };
    }
    if let Some(stored) = state.store.idempotent_response(&keyed.scope, &keyed.key).await? {
        return keyed.replay(&state, stored).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn keyed(key: &str) -> Keyed {
        Keyed { scope: "admin\nPOST /api/v1/app".into(), key: key.into() }
    }

    #[test]
    fn a_key_belongs_to_its_caller_method_and_uri_whatever_the_trailing_slash() {
        let scope = |principal: &Principal, uri: &str| {
            Keyed::new(principal, &Method::POST, &uri.parse().expect("a uri"), "k").scope
        };
        let admin = Principal::Admin;
        let portal = Principal::App {
            app_id: AppId::from_trusted("app_1".into()),
            token_hash: "ab12".into(),
            sensitive: false,
            feature_flags: vec![],
        };
        assert_eq!(scope(&admin, "/api/v1/app/app_1/msg/"), "admin\nPOST /api/v1/app/app_1/msg");
        assert_eq!(scope(&portal, "/api/v1/app/app_1/msg"), "token:ab12\nPOST /api/v1/app/app_1/msg");
        assert_eq!(scope(&admin, "/api/v1/app?with_content=false"), "admin\nPOST /api/v1/app?with_content=false");
        // An empty query is still a query: the URI differs from the one without `?`.
        assert_eq!(scope(&admin, "/api/v1/app?"), "admin\nPOST /api/v1/app?");
        assert_eq!(scope(&admin, "/"), "admin\nPOST /");
    }

    #[tokio::test]
    async fn only_requests_with_the_same_key_wait_and_the_map_forgets_released_keys() {
        let locks = KeyLocks::default();
        let first = locks.hold(&keyed("a")).await;
        // Another key is never behind this one, however many keys are held.
        let other = tokio::time::timeout(std::time::Duration::from_millis(100), locks.hold(&keyed("b"))).await;
        assert!(other.is_ok(), "another key waits for nothing");
        drop(other);
        let a = keyed("a");
        let same = locks.hold(&a);
        tokio::pin!(same);
        assert!(futures_util::poll!(same.as_mut()).is_pending(), "the same key waits");
        drop(first);
        let second = same.await;
        drop(second);
        assert_eq!(locks.len(), 0, "nothing kept once nobody holds or waits");
    }

    #[tokio::test]
    async fn a_waiter_whose_client_left_leaves_nothing_behind() {
        let locks = KeyLocks::default();
        let first = locks.hold(&keyed("a")).await;
        {
            let a = keyed("a");
            let waiting = locks.hold(&a);
            tokio::pin!(waiting);
            assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        } // dropped while waiting
        drop(first);
        assert_eq!(locks.len(), 0);
        drop(locks.hold(&keyed("a")).await);
    }
}
