//! A real HTTP (or HTTPS) receiver on port 0: records every request and answers as its
//! script says, so tests can make an endpoint fail, stall or recover on cue.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use tokio::sync::Notify;
use tokio::time::Instant;

/// One request as received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    /// The query string, when there was one.
    pub query: Option<String>,
    pub method: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

impl Received {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

/// How to answer one request.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub delay: Duration,
    pub body: String,
    pub headers: Vec<(String, String)>,
    /// How long the request counts as in flight at most: for answers slower than the
    /// sender's timeout, the sender has hung up by then, but the handler cannot tell.
    pub counted_for: Option<Duration>,
    /// Held, after the delay, until the gate opens (`Gate::open`).
    pub gate: Option<Gate>,
}

/// Holds the answers given with it until the test opens it: for tests that need attempts in
/// flight until something else has happened, however slow the machine.
#[derive(Debug, Clone)]
pub struct Gate(tokio::sync::watch::Sender<bool>);

impl Default for Gate {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(false))
    }
}

impl Gate {
    /// Lets every held answer go, and every later one through at once.
    pub fn open(&self) {
        self.0.send_replace(true);
    }

    async fn passed(&self) {
        let mut open = self.0.subscribe();
        let _ = open.wait_for(|open| *open).await;
    }
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self { status, delay: Duration::ZERO, body: String::new(), headers: vec![], counted_for: None, gate: None }
    }

    pub fn ok() -> Self {
        Self::status(200)
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Counts the request as in flight for `window` at most (see `counted_for`).
    pub fn counted_for(mut self, window: Duration) -> Self {
        self.counted_for = Some(window);
        self
    }

    /// Holds the answer until `gate` opens.
    pub fn held_by(mut self, gate: &Gate) -> Self {
        self.gate = Some(gate.clone());
        self
    }

    pub fn body(mut self, body: &str) -> Self {
        self.body = body.to_owned();
        self
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// Decides the reply from the request and how many requests that path got before it.
type Script = dyn Fn(&Received, usize) -> Reply + Send + Sync;

struct Shared {
    requests: Mutex<Vec<Received>>,
    per_path: Mutex<HashMap<String, usize>>,
    /// Per path: requests being answered now, and the most there ever were at once.
    concurrency: Mutex<HashMap<String, (usize, usize)>>,
    arrived: Notify,
    /// TLS handshakes completed (`start_tls`): one per connection a client opened.
    handshakes: AtomicUsize,
    script: Box<Script>,
}

pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Receiver {
    /// A receiver that answers 200 to everything.
    pub async fn ok() -> Self {
        Self::start(|_, _| Reply::ok()).await
    }

    pub async fn start(script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static) -> Self {
        Self::start_at("127.0.0.1", script).await
    }

    /// A receiver on another loopback address (e.g. 127.0.0.2, "public" in SSRF tests).
    pub async fn start_at(ip: &str, script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static) -> Self {
        let shared = Self::shared(script);
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { addr, shared }
    }

    /// A receiver that speaks TLS as `config` says (its certificate; whether and whom it
    /// asks for a client certificate). A handshake that fails closes the connection.
    pub async fn start_tls(
        config: Arc<tokio_rustls::rustls::ServerConfig>,
        script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let shared = Self::shared(script);
        let app = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let counted = shared.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, app, shared) = (acceptor.clone(), app.clone(), counted.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    shared.handshakes.fetch_add(1, Ordering::Relaxed);
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                    let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), service).await;
                });
            }
        });
        Self { addr, shared }
    }

    fn shared(script: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static) -> Arc<Shared> {
        Arc::new(Shared {
            requests: Mutex::default(),
            per_path: Mutex::default(),
            concurrency: Mutex::default(),
            arrived: Notify::new(),
            handshakes: AtomicUsize::new(0),
            script: Box::new(script),
        })
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The URL of a path on a TLS receiver (`start_tls`).
    pub fn https_url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    /// TLS connections accepted so far (a TLS receiver's; 0 for a plain one): a client
    /// that reuses a pooled connection adds none.
    pub fn handshakes(&self) -> usize {
        self.shared.handshakes.load(Ordering::Relaxed)
    }

    pub fn requests(&self) -> Vec<Received> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Requests to one path.
    pub fn requests_to(&self, path: &str) -> Vec<Received> {
        self.requests().into_iter().filter(|r| r.path == path).collect()
    }

    /// The most requests to `path` that were being answered at the same time (a request
    /// counts until its answer is sent or the caller hangs up).
    pub fn max_concurrent(&self, path: &str) -> usize {
        self.shared.concurrency.lock().unwrap().get(path).map_or(0, |(_, max)| *max)
    }

    /// Waits until at least `n` requests arrived at `path` (any path when `None`).
    pub async fn wait_for(&self, path: Option<&str>, n: usize) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let notified = self.shared.arrived.notified();
            let got: Vec<Received> = self.requests().into_iter().filter(|r| path.is_none_or(|p| r.path == p)).collect();
            if got.len() >= n {
                return got;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "timed out waiting for {n} requests to {path:?}; got {}", got.len());
            let _ = tokio::time::timeout(left, notified).await;
        }
    }
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let received = Received {
        path: uri.path().to_owned(),
        query: uri.query().map(str::to_owned),
        method: method.to_string(),
        headers,
        body,
        at: Instant::now(),
    };
    let seen = {
        let mut per_path = shared.per_path.lock().unwrap();
        let count = per_path.entry(received.path.clone()).or_default();
        *count += 1;
        *count - 1
    };
    let open = Open::new(&shared, &received.path);
    let reply = (shared.script)(&received, seen);
    shared.requests.lock().unwrap().push(received);
    shared.arrived.notify_waiters();
    if !reply.delay.is_zero() {
        let counted = reply.counted_for.unwrap_or(reply.delay).min(reply.delay);
        tokio::time::sleep(counted).await;
        if reply.counted_for.is_some() {
            drop(open);
        }
        tokio::time::sleep(reply.delay - counted).await;
    }
    if let Some(gate) = &reply.gate {
        gate.passed().await;
    }
    let mut response = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (name, value) in reply.headers {
        response
            .headers_mut()
            .insert(axum::http::HeaderName::try_from(name).unwrap(), axum::http::HeaderValue::try_from(value).unwrap());
    }
    response
}

/// Counts a request as open until dropped: when the answer is sent, or when the caller hung
/// up and the handler was cancelled mid-delay.
struct Open {
    shared: Arc<Shared>,
    path: String,
}

impl Open {
    /// Counts the request under its path and under `*` (every path together).
    fn new(shared: &Arc<Shared>, path: &str) -> Self {
        let mut concurrency = shared.concurrency.lock().unwrap();
        for key in [path, ALL_PATHS] {
            let (now, max) = concurrency.entry(key.to_owned()).or_default();
            *now += 1;
            *max = (*max).max(*now);
        }
        Self { shared: shared.clone(), path: path.to_owned() }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut concurrency = self.shared.concurrency.lock().unwrap();
        for key in [self.path.as_str(), ALL_PATHS] {
            if let Some((now, _)) = concurrency.get_mut(key) {
                *now -= 1;
            }
        }
    }
}

/// The key under which `max_concurrent` counts requests to every path together.
pub const ALL_PATHS: &str = "*";
