//! OAuth2 client credentials (RFC 6749 §4.4) for endpoints whose receivers want a bearer
//! token: one token per endpoint, fetched when first needed, shared by every delivery to
//! that endpoint and kept until shortly before it expires. Concurrent deliveries wait for
//! the one fetch in flight and share its outcome, so a burst makes one token request and a
//! token endpoint that is down is asked once per waiting round, not once per delivery.
//! A token the receiver refuses (401) is dropped, and the next delivery fetches another.
//! The token endpoint is reached like a receiver: through the destination guard and the
//! application's proxy. The fetch has its own budget ([`FETCH_BUDGET`], since it serves
//! every delivery waiting for it); each delivery waits for it at most until its own
//! attempt's deadline.
//!
//! The cache reads the time from a [`Clock`] it is given (the runtime's in production), so
//! its unit tests move time by hand instead of waiting for a token to expire.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderValue, Request, header};
use http_body_util::Full;
use serde::Deserialize;
use tokio::time::Instant;

use super::{Body, HttpClient, classify_client_error, read_bounded};
use crate::delivery_auth::{ClientAuthMethod, OAuth2Grant};
use crate::ids::EndpointId;

/// Bytes of a token response read at most.
const MAX_TOKEN_RESPONSE: usize = 64 * 1024;
/// How long a token without `expires_in` is used at most (a 401 drops it sooner).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);
/// Refreshed this long before expiry at most (a fifth of its lifetime for short ones).
const EARLY_REFRESH: Duration = Duration::from_secs(60);
/// Characters of the token endpoint's `error` code quoted in an attempt's reason, at most.
const MAX_ERROR_CODE: usize = 64;
/// How long one token request may take, whichever delivery started it: the deliveries
/// waiting for it share its outcome, so it is not bounded by one of their deadlines (each
/// stops waiting at its own).
const FETCH_BUDGET: Duration = Duration::from_secs(10);

/// What time it is, for the cache's bookkeeping: whether a token is still fresh, and which
/// waiting deliveries a fetch answered. Timeouts are not bookkeeping: they stay on the
/// runtime's timers.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// A token ready to send.
#[derive(Clone)]
pub struct Token {
    /// `Bearer …`, marked sensitive (never printed by `http`'s Debug).
    pub header: HeaderValue,
    fetched_at: Instant,
    refresh_at: Instant,
    /// Which fetch made it: a 401 drops the cached token only if it is this one.
    serial: u64,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token(#{}, <redacted>)", self.serial)
    }
}

#[derive(Default)]
struct Slot {
    token: Option<Token>,
    /// The last fetch's failure and when it ended: deliveries that waited for it share it.
    failed: Option<(Instant, String)>,
}

/// One endpoint's token, for one grant (a changed grant starts afresh).
struct Entry {
    grant: [u8; 32],
    slot: Arc<tokio::sync::Mutex<Slot>>,
}

/// The tokens of every OAuth2 endpoint, in memory only.
pub struct TokenCache {
    entries: Mutex<HashMap<EndpointId, Entry>>,
    fetches: AtomicU64,
    clock: Clock,
}

impl Default for TokenCache {
    /// A cache on the runtime's clock.
    fn default() -> Self {
        Self::with_clock(Arc::new(Instant::now))
    }
}

impl TokenCache {
    /// A cache that reads the time from `clock`.
    pub fn with_clock(clock: Clock) -> Self {
        Self { entries: Mutex::default(), fetches: AtomicU64::new(0), clock }
    }

    fn now(&self) -> Instant {
        (self.clock)()
    }

    fn slot(&self, endpoint: &EndpointId, grant: &OAuth2Grant) -> Arc<tokio::sync::Mutex<Slot>> {
        let fingerprint = grant.fingerprint();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry =
            entries.entry(endpoint.clone()).or_insert_with(|| Entry { grant: fingerprint, slot: Arc::default() });
        if entry.grant != fingerprint {
            *entry = Entry { grant: fingerprint, slot: Arc::default() };
        }
        entry.slot.clone()
    }

    /// The endpoint is gone: its token goes with it.
    pub fn forget(&self, endpoint: &EndpointId) {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).remove(endpoint);
    }

    /// The endpoint's current token, fetched through `client` if there is none (or it is
    /// about to expire); `Err` with the reason when none can be had before `deadline`.
    pub async fn token(
        &self,
        endpoint: &EndpointId,
        grant: &OAuth2Grant,
        client: &HttpClient,
        deadline: Instant,
    ) -> Result<Token, String> {
        // The request's own budget is a timer, so it is counted on the runtime's clock.
        self.token_with(endpoint, grant, deadline, || fetch(client, grant, Instant::now() + FETCH_BUDGET)).await
    }

    /// [`Self::token`], with the token request given: `fetch` is called (once) only when
    /// neither a fresh token nor the outcome of a fetch this delivery waited for answers.
    async fn token_with<F, Fut>(
        &self,
        endpoint: &EndpointId,
        grant: &OAuth2Grant,
        deadline: Instant,
        fetch: F,
    ) -> Result<Token, String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Granted, String>>,
    {
        let asked = self.now();
        let slot = self.slot(endpoint, grant);
        let Ok(mut slot) = tokio::time::timeout_at(deadline, slot.lock()).await else {
            return Err("timed out waiting for another delivery's token request".into());
        };
        // A token still fresh, or one fetched while this delivery waited (even if it is
        // already due for replacement: a short-lived one), is shared.
        if let Some(token) = slot.token.as_ref().filter(|t| self.now() < t.refresh_at || t.fetched_at >= asked) {
            return Ok(token.clone());
        }
        if let Some((at, why)) = &slot.failed
            && *at >= asked
        {
            return Err(why.clone());
        }
        let serial = self.fetches.fetch_add(1, Ordering::Relaxed) + 1;
        let requested = self.now();
        // Stopping at this delivery's deadline drops the request and records nothing: the
        // next waiter asks again.
        match tokio::time::timeout_at(deadline, fetch()).await {
            Err(_) => Err("the token endpoint did not answer within the attempt's time".into()),
            Ok(Ok(granted)) => {
                let refresh_at = requested + used_for(granted.lifetime);
                let token = Token { header: granted.header, fetched_at: self.now(), refresh_at, serial };
                *slot = Slot { token: Some(token.clone()), failed: None };
                Ok(token)
            }
            Ok(Err(why)) => {
                *slot = Slot { token: None, failed: Some((self.now(), why.clone())) };
                Err(why)
            }
        }
    }

    /// Drops `token` because the receiver refused it, unless a newer one replaced it
    /// (waiting for the endpoint's token at most until `deadline`).
    pub async fn refused(&self, endpoint: &EndpointId, grant: &OAuth2Grant, token: &Token, deadline: Instant) {
        let slot = self.slot(endpoint, grant);
        if let Ok(mut slot) = tokio::time::timeout_at(deadline, slot.lock()).await
            && slot.token.as_ref().is_some_and(|t| t.serial == token.serial)
        {
            slot.token = None;
        }
    }
}

/// The fields of a token response Herald uses (RFC 6749 §5.1, §5.2).
#[derive(Deserialize)]
struct TokenResponse {
    access_token: Option<String>,
    token_type: Option<String>,
    /// Seconds; some servers send it as a string.
    expires_in: Option<serde_json::Value>,
    error: Option<String>,
}

/// What the token endpoint granted.
struct Granted {
    /// `Bearer …`, marked sensitive.
    header: HeaderValue,
    /// `expires_in`, when it said.
    lifetime: Option<Duration>,
}

/// Asks the token endpoint for a token.
async fn fetch(client: &HttpClient, grant: &OAuth2Grant, deadline: Instant) -> Result<Granted, String> {
    let request = token_request(grant)?;
    let response = match tokio::time::timeout_at(deadline, client.request(request)).await {
        Err(_) => return Err("the token endpoint did not answer in time".into()),
        Ok(Err(e)) => return Err(format!("the token endpoint could not be reached: {}", classify_client_error(&e).1)),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    let body = match read_bounded(response.into_body(), deadline, MAX_TOKEN_RESPONSE).await {
        Body::Complete(body) => body,
        Body::TooLong => return Err(format!("the token endpoint's answer is over {MAX_TOKEN_RESPONSE} bytes")),
        Body::TimedOut => return Err("the token endpoint did not finish its answer in time".into()),
        Body::Broken(e) => return Err(format!("the token endpoint's answer broke off: {e}")),
    };
    let parsed: Option<TokenResponse> = serde_json::from_slice(&body).ok();
    if !status.is_success() {
        // Only the standard error code is quoted: descriptions may echo what was sent.
        let code = parsed.and_then(|p| p.error).filter(|c| {
            c.len() <= MAX_ERROR_CODE && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        });
        return Err(match code {
            Some(code) => format!("the token endpoint answered {} ({code})", status.as_u16()),
            None => format!("the token endpoint answered {}", status.as_u16()),
        });
    }
    let parsed = parsed.ok_or("the token endpoint's answer is not a JSON object")?;
    let access =
        parsed.access_token.filter(|t| !t.is_empty()).ok_or("the token endpoint's answer has no access_token")?;
    if let Some(kind) = parsed.token_type.filter(|k| !k.eq_ignore_ascii_case("bearer")) {
        return Err(format!("the token endpoint gave a {kind:.32} token; only bearer tokens are supported"));
    }
    let mut header = HeaderValue::try_from(format!("Bearer {access}"))
        .map_err(|_| "the token endpoint's access_token is not a valid header value".to_owned())?;
    header.set_sensitive(true);
    let lifetime = match parsed.expires_in {
        Some(serde_json::Value::Number(n)) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64(s.min(DEFAULT_LIFETIME.as_secs_f64() * 24.0))),
        Some(serde_json::Value::String(s)) => s.trim().parse().ok().map(Duration::from_secs),
        _ => None,
    };
    Ok(Granted { header, lifetime })
}

/// How long a token is used: its lifetime (an hour when not given, a day at most) less a
/// fifth of it, at most a minute, so it is replaced before the receiver sees it expire.
fn used_for(lifetime: Option<Duration>) -> Duration {
    let lifetime = lifetime.unwrap_or(DEFAULT_LIFETIME).min(DEFAULT_LIFETIME * 24);
    lifetime - EARLY_REFRESH.min(lifetime / 5)
}

/// `POST tokenUrl` with `grant_type=client_credentials`, the scopes and audience, and the
/// client's credentials as the grant says (form-encoded inside Basic, as §2.3.1 asks).
fn token_request(grant: &OAuth2Grant) -> Result<Request<Full<Bytes>>, String> {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    form.append_pair("grant_type", "client_credentials");
    if !grant.scopes.is_empty() {
        form.append_pair("scope", &grant.scopes.join(" "));
    }
    if let Some(audience) = &grant.audience {
        form.append_pair("audience", audience);
    }
    let mut request = Request::post(grant.token_url.as_str())
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header(header::ACCEPT, "application/json");
    match grant.client_auth_method {
        ClientAuthMethod::ClientSecretBasic => {
            let encode = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let pair = format!("{}:{}", encode(&grant.client_id), encode(&grant.client_secret));
            let mut value = HeaderValue::try_from(format!("Basic {}", STANDARD.encode(pair)))
                .map_err(|_| "the client credentials do not make a header".to_owned())?;
            value.set_sensitive(true);
            request = request.header(header::AUTHORIZATION, value);
        }
        ClientAuthMethod::ClientSecretPost => {
            form.append_pair("client_id", &grant.client_id);
            form.append_pair("client_secret", &grant.client_secret);
        }
    }
    request.body(Full::new(Bytes::from(form.finish()))).map_err(|e| format!("the token URL cannot be requested: {e}"))
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use futures_util::FutureExt;
    use tokio::sync::oneshot;

    use super::*;

    fn grant(method: ClientAuthMethod) -> OAuth2Grant {
        OAuth2Grant {
            token_url: "https://id.example/oauth/token".into(),
            client_id: "herald app".into(),
            client_secret: "s3:cret".into(),
            scopes: vec!["hooks:write".into(), "read".into()],
            audience: Some("https://api.example".into()),
            client_auth_method: method,
        }
    }

    fn body(request: Request<Full<Bytes>>) -> String {
        use http_body_util::BodyExt;
        let collected = request.into_body().collect().now_or_never().unwrap().unwrap();
        String::from_utf8(collected.to_bytes().to_vec()).unwrap()
    }

    #[test]
    fn basic_client_authentication_form_encodes_the_pair() {
        let request = token_request(&grant(ClientAuthMethod::ClientSecretBasic)).unwrap();
        let auth = request.headers()[header::AUTHORIZATION].to_str().unwrap().to_owned();
        assert_eq!(auth, format!("Basic {}", STANDARD.encode("herald+app:s3%3Acret")));
        assert_eq!(
            body(request),
            "grant_type=client_credentials&scope=hooks%3Awrite+read&audience=https%3A%2F%2Fapi.example"
        );
    }

    #[test]
    fn tokens_are_replaced_shortly_before_they_expire() {
        let secs = Duration::from_secs;
        assert_eq!(used_for(Some(secs(3600))), secs(3540), "a minute early");
        assert_eq!(used_for(Some(secs(100))), secs(80), "a fifth early");
        assert_eq!(used_for(Some(secs(1))), Duration::from_millis(800));
        assert_eq!(used_for(Some(secs(0))), secs(0), "used once, never cached");
        assert_eq!(used_for(None), secs(3540), "an hour when the server says nothing");
        assert_eq!(used_for(Some(secs(10 * 86400))), secs(86400 - 60), "a day at most");
    }

    #[test]
    fn post_client_authentication_puts_the_pair_in_the_body() {
        let request = token_request(&grant(ClientAuthMethod::ClientSecretPost)).unwrap();
        assert!(request.headers().get(header::AUTHORIZATION).is_none());
        assert!(body(request).ends_with("&client_id=herald+app&client_secret=s3%3Acret"));
    }

    /// A clock the test moves by hand, and a cache that reads it; the token endpoint is a
    /// closure that counts its calls. Deadlines are the runtime's and far away: no test
    /// here waits for real time.
    struct Rig {
        now: Arc<Mutex<Instant>>,
        cache: TokenCache,
        fetches: Arc<AtomicU64>,
        endpoint: EndpointId,
        grant: OAuth2Grant,
        deadline: Instant,
    }

    impl Rig {
        fn new() -> Self {
            let now = Arc::new(Mutex::new(Instant::now()));
            let hands = now.clone();
            Self {
                now,
                cache: TokenCache::with_clock(Arc::new(move || *hands.lock().unwrap())),
                fetches: Arc::default(),
                endpoint: EndpointId::from_trusted("ep_1".into()),
                grant: grant(ClientAuthMethod::ClientSecretBasic),
                deadline: Instant::now() + Duration::from_secs(60),
            }
        }

        fn advance(&self, by: Duration) {
            *self.now.lock().unwrap() += by;
        }

        /// A delivery asking for the token; a fetch, if it makes one, answers `answer` (a
        /// token's lifetime, or why there is none).
        async fn token(&self, answer: Result<Duration, &str>) -> Result<Token, String> {
            let fetches = &self.fetches;
            let fetch = move || async move {
                let n = fetches.fetch_add(1, Ordering::Relaxed);
                answer.map(|lifetime| granted(n, lifetime)).map_err(str::to_owned)
            };
            self.cache.token_with(&self.endpoint, &self.grant, self.deadline, fetch).await
        }

        /// A delivery asking for the token whose fetch, if it makes one, answers when the
        /// test sends the answer.
        fn waiting_for(
            &self,
            answered: oneshot::Receiver<Result<Granted, String>>,
        ) -> impl Future<Output = Result<Token, String>> + '_ {
            let fetches = &self.fetches;
            let fetch = move || async move {
                fetches.fetch_add(1, Ordering::Relaxed);
                answered.await.expect("the test answers")
            };
            self.cache.token_with(&self.endpoint, &self.grant, self.deadline, fetch)
        }

        fn fetches(&self) -> u64 {
            self.fetches.load(Ordering::Relaxed)
        }
    }

    /// The token endpoint's `n`-th token (from 0), valid for `lifetime`.
    fn granted(n: u64, lifetime: Duration) -> Granted {
        Granted { header: HeaderValue::try_from(format!("Bearer tok-{n}")).unwrap(), lifetime: Some(lifetime) }
    }

    fn bearer(token: &Token) -> &str {
        token.header.to_str().unwrap()
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_token_is_reused_until_its_refresh_time_and_fetched_again_from_then_on() {
        let rig = Rig::new();
        // Ten seconds of life: used for eight (a fifth of its lifetime early).
        let ten = Duration::from_secs(10);
        assert_eq!(bearer(&rig.token(Ok(ten)).await.unwrap()), "Bearer tok-0");
        rig.advance(Duration::from_millis(7999));
        assert_eq!(bearer(&rig.token(Ok(ten)).await.unwrap()), "Bearer tok-0", "still fresh");
        assert_eq!(rig.fetches(), 1);
        rig.advance(Duration::from_millis(1));
        assert_eq!(bearer(&rig.token(Ok(ten)).await.unwrap()), "Bearer tok-1", "due at its refresh time");
        assert_eq!(bearer(&rig.token(Ok(ten)).await.unwrap()), "Bearer tok-1", "and the new one is shared");
        assert_eq!(rig.fetches(), 2);
    }

    #[tokio::test]
    async fn a_token_that_expires_at_once_is_fetched_for_each_delivery() {
        let rig = Rig::new();
        for n in 0..3 {
            rig.advance(Duration::from_millis(1));
            let token = rig.token(Ok(Duration::ZERO)).await.unwrap();
            assert_eq!(bearer(&token), format!("Bearer tok-{n}"));
        }
    }

    #[tokio::test]
    async fn deliveries_that_waited_for_a_failed_fetch_share_its_failure_and_later_ones_ask_again() {
        let rig = Rig::new();
        let (answer, answered) = oneshot::channel();
        let mut first = pin!(rig.waiting_for(answered));
        assert!(first.as_mut().now_or_never().is_none(), "the first delivery's fetch is under way");
        rig.advance(Duration::from_millis(5));
        let mut second = pin!(rig.token(Ok(HOUR)));
        assert!(second.as_mut().now_or_never().is_none(), "the second delivery waits for that fetch");
        rig.advance(Duration::from_millis(5));
        assert!(answer.send(Err("the token endpoint answered 503".into())).is_ok());
        assert_eq!(first.await.unwrap_err(), "the token endpoint answered 503");
        assert_eq!(second.await.unwrap_err(), "the token endpoint answered 503", "shared, not asked again");
        assert_eq!(rig.fetches(), 1);

        rig.advance(Duration::from_millis(5));
        assert_eq!(bearer(&rig.token(Ok(HOUR)).await.unwrap()), "Bearer tok-1", "a delivery after it asks anew");
        assert_eq!(rig.fetches(), 2);
    }

    #[tokio::test]
    async fn a_short_lived_token_is_shared_by_the_deliveries_that_waited_for_it() {
        let rig = Rig::new();
        let (answer, answered) = oneshot::channel();
        let mut first = pin!(rig.waiting_for(answered));
        assert!(first.as_mut().now_or_never().is_none(), "the first delivery's fetch is under way");
        rig.advance(Duration::from_millis(5));
        let mut second = pin!(rig.token(Ok(HOUR)));
        assert!(second.as_mut().now_or_never().is_none(), "the second delivery waits for that fetch");
        rig.advance(Duration::from_millis(5));
        assert!(answer.send(Ok(granted(0, Duration::ZERO))).is_ok());
        assert_eq!(bearer(&first.await.unwrap()), "Bearer tok-0");
        assert_eq!(bearer(&second.await.unwrap()), "Bearer tok-0", "due already, but fetched while it waited");
        assert_eq!(rig.fetches(), 1);
    }

    #[tokio::test]
    async fn a_401_drops_the_token_it_refused_and_no_newer_one() {
        let rig = Rig::new();
        let refused = rig.token(Ok(HOUR)).await.unwrap();
        rig.cache.refused(&rig.endpoint, &rig.grant, &refused, rig.deadline).await;
        rig.advance(Duration::from_millis(1));
        let fresh = rig.token(Ok(HOUR)).await.unwrap();
        assert_eq!(bearer(&fresh), "Bearer tok-1", "the refused token is not used again");
        // A late 401 for the old token (a delivery that was sending it meanwhile).
        rig.cache.refused(&rig.endpoint, &rig.grant, &refused, rig.deadline).await;
        assert_eq!(bearer(&rig.token(Ok(HOUR)).await.unwrap()), "Bearer tok-1", "the newer token stays");
        assert_eq!(rig.fetches(), 2);
    }
}
