//! The bench's receiver: a lean keep-alive HTTP/1.1 server that records every webhook's id,
//! endpoint and arrival time, verifies the signature of a sample, and can play a slow,
//! silent or paused endpoint on cue.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::Instant;

use herald::signing::{SignedHeaders, SigningKey, verify};

/// How an endpoint of the receiver behaves. The path is `/{behaviour}/{endpoint index}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers 200 at once.
    Fast,
    /// Answers 200 after 500 ms.
    Slow,
    /// Never answers (the sender's timeout ends the attempt).
    Silent,
}

impl Behaviour {
    pub fn path(self, endpoint: usize) -> String {
        let name = match self {
            Self::Fast => "fast",
            Self::Slow => "slow",
            Self::Silent => "silent",
        };
        format!("/{name}/{endpoint}")
    }
}

/// One webhook as received.
#[derive(Debug, Clone)]
pub struct Receipt {
    pub msg_id: Box<str>,
    pub endpoint: u32,
    pub at: Instant,
}

#[derive(Default)]
pub struct Shared {
    receipts: Mutex<Vec<Receipt>>,
    /// Signing secrets by endpoint index, for the sampled verification.
    secrets: Mutex<Vec<Option<SigningKey>>>,
    paused: AtomicBool,
    resumed: Notify,
    received: AtomicU64,
    verified: AtomicU64,
    bad_signatures: AtomicU64,
    /// Requests to silent endpoints: in total, held now, and most held at once.
    silent: SilentCounts,
}

#[derive(Default)]
struct SilentCounts {
    total: AtomicU64,
    open: AtomicU64,
    most: AtomicU64,
}

/// Counts a silent request as held until the sender gives up (the handler is dropped).
struct Held<'a>(&'a SilentCounts);

impl<'a> Held<'a> {
    fn new(counts: &'a SilentCounts) -> Self {
        counts.total.fetch_add(1, Ordering::Relaxed);
        let open = counts.open.fetch_add(1, Ordering::SeqCst) + 1;
        counts.most.fetch_max(open, Ordering::SeqCst);
        Self(counts)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

/// Every `SAMPLE`-th request has its signature verified.
const SAMPLE: u64 = 50;

impl Receiver {
    pub async fn start() -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accept_shared = shared.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let shared = accept_shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(shared.clone(), req));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
        });
        Ok(Self { addr, shared })
    }

    pub fn url(&self, behaviour: Behaviour, endpoint: usize) -> String {
        format!("http://{}{}", self.addr, behaviour.path(endpoint))
    }

    pub fn set_secret(&self, endpoint: usize, secret: &str) {
        let mut secrets = self.shared.secrets.lock().unwrap();
        if secrets.len() <= endpoint {
            secrets.resize(endpoint + 1, None);
        }
        secrets[endpoint] = SigningKey::decode(secret).ok();
    }

    /// Holds every request until `resume` (the backlog scenario).
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
    }

    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
        self.shared.resumed.notify_waiters();
    }

    /// Reads the count of webhooks received so far.
    pub fn counter(&self) -> impl Fn() -> u64 + Send + 'static {
        let shared = self.shared.clone();
        move || shared.received.load(Ordering::Relaxed)
    }

    /// Takes every receipt recorded so far.
    pub fn take_receipts(&self) -> Vec<Receipt> {
        std::mem::take(&mut *self.shared.receipts.lock().unwrap())
    }

    /// (requests, most held at once) of the silent endpoints.
    pub fn silent_counts(&self) -> (u64, u64) {
        (self.shared.silent.total.load(Ordering::Relaxed), self.shared.silent.most.load(Ordering::SeqCst))
    }

    /// (verified, failed) signature checks.
    pub fn signature_checks(&self) -> (u64, u64) {
        (self.shared.verified.load(Ordering::Relaxed), self.shared.bad_signatures.load(Ordering::Relaxed))
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Empty<Bytes>>, Infallible> {
    let path = req.uri().path().trim_start_matches('/').to_owned();
    let (behaviour, endpoint) = path.split_once('/').unwrap_or((path.as_str(), ""));
    let endpoint: u32 = endpoint.parse().unwrap_or(u32::MAX);
    let msg_id: Box<str> = req.headers().get("webhook-id").and_then(|v| v.to_str().ok()).unwrap_or("").into();
    let (head, body) = req.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    while shared.paused.load(Ordering::SeqCst) {
        let resumed = shared.resumed.notified();
        if !shared.paused.load(Ordering::SeqCst) {
            break;
        }
        resumed.await;
    }
    match behaviour {
        "silent" => {
            let _held = Held::new(&shared.silent);
            std::future::pending::<()>().await
        }
        "slow" => tokio::time::sleep(Duration::from_millis(500)).await,
        _ => {}
    }
    let n = shared.received.fetch_add(1, Ordering::Relaxed);
    if n.is_multiple_of(SAMPLE) {
        check_signature(&shared, endpoint, &head.headers, &body);
    }
    shared.receipts.lock().unwrap().push(Receipt { msg_id, endpoint, at: Instant::now() });
    let mut response = Response::new(Empty::new());
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

fn check_signature(shared: &Shared, endpoint: u32, headers: &http::HeaderMap, body: &[u8]) {
    let secrets = shared.secrets.lock().unwrap();
    let Some(Some(key)) = secrets.get(endpoint as usize) else { return };
    let signed = SignedHeaders::from_pairs(headers.iter().filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let counter = if verify(key, &signed, body, now).is_ok() { &shared.verified } else { &shared.bad_signatures };
    counter.fetch_add(1, Ordering::Relaxed);
}
