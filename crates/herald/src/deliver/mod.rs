//! The HTTP side of an attempt: build the signed request, send it through a keep-alive
//! connection pool behind the destination guard, read a bounded part of the answer, and
//! report what happened as data ([`Sent`]), never as an error.

mod request;
mod resolver;

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

pub use request::{Outgoing, RESERVED_HEADERS};
pub use resolver::{GuardedResolver, ResolveError};

use crate::outcome::{AttemptResult, Failure};
use crate::retry::parse_retry_after;
use crate::ssrf::Guard;

type HttpClient = Client<HttpsConnector<HttpConnector<GuardedResolver>>, Full<Bytes>>;

/// What one attempt produced.
#[derive(Debug, Clone)]
pub struct Sent {
    pub result: AttemptResult,
    pub duration: Duration,
    /// The start of the response body (lossy UTF-8), at most the store limit.
    pub body: String,
    /// A human-readable reason when the attempt failed without a response.
    pub error: Option<String>,
}

impl Sent {
    pub fn failed(failure: Failure, error: impl Into<String>, duration: Duration) -> Self {
        Self { result: AttemptResult::Failed(failure), duration, body: String::new(), error: Some(error.into()) }
    }
}

/// Limits applied to every attempt.
#[derive(Debug, Clone)]
pub struct DelivererConfig {
    pub read_limit: usize,
    pub store_limit: usize,
    pub user_agent: String,
}

pub struct Deliverer {
    client: HttpClient,
    guard: Arc<Guard>,
    config: DelivererConfig,
}

impl Deliverer {
    pub fn new(guard: Arc<Guard>, config: DelivererConfig) -> Self {
        let mut http = HttpConnector::new_with_resolver(GuardedResolver::new(guard.clone()));
        http.enforce_http(false);
        http.set_nodelay(true);
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() })
            .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        // No redirect following and no proxy: hyper does neither, by design.
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .build(https);
        Self { client, guard, config }
    }

    /// Performs one attempt within the target's timeout.
    pub async fn send(&self, out: Outgoing<'_>) -> Sent {
        let started = Instant::now();
        let deadline = started + out.timeout();
        let request = match out.build(&self.guard, &self.config.user_agent) {
            Ok(request) => request,
            Err((failure, reason)) => return Sent::failed(failure, reason, started.elapsed()),
        };
        let response = match tokio::time::timeout_at(deadline, self.client.request(request)).await {
            Err(_) => {
                return Sent::failed(Failure::Timeout, "timed out waiting for a response", started.elapsed());
            }
            Ok(Err(e)) => {
                let (failure, reason) = classify_client_error(&e);
                return Sent::failed(failure, reason, started.elapsed());
            }
            Ok(Ok(response)) => response,
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        // The status is what counts; a body that is slow or broken is kept as far as it came.
        let body = read_bounded(response.into_body(), deadline, self.config.read_limit).await;
        let stored = &body[..body.len().min(self.config.store_limit)];
        Sent {
            result: AttemptResult::Response { status, retry_after },
            duration: started.elapsed(),
            body: String::from_utf8_lossy(stored).into_owned(),
            error: None,
        }
    }
}

/// Reads at most `limit` bytes of a body before `deadline`, then stops (dropping the rest,
/// and with it the connection if the body was not finished).
async fn read_bounded(mut body: hyper::body::Incoming, deadline: Instant, limit: usize) -> Bytes {
    let mut buf = BytesMut::new();
    while buf.len() < limit {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    let room = limit - buf.len();
                    buf.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
            _ => break,
        }
    }
    buf.freeze()
}

/// Maps a client error to an outcome by walking its cause chain.
fn classify_client_error(e: &hyper_util::client::legacy::Error) -> (Failure, String) {
    let mut cause: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cause {
        if let Some(resolve) = err.downcast_ref::<ResolveError>() {
            let failure = match resolve {
                ResolveError::Blocked(_) => Failure::BlockedDestination,
                ResolveError::NotFound(_) => Failure::DnsNotFound,
                ResolveError::Temporary(..) => Failure::DnsTemporary,
            };
            return (failure, resolve.to_string());
        }
        if err.downcast_ref::<rustls::Error>().is_some() {
            return (Failure::Tls, format!("TLS failure: {err}"));
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.get_ref().is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
        {
            return (Failure::Tls, format!("TLS failure: {io}"));
        }
        cause = err.source();
    }
    (Failure::Connection, describe(e))
}

/// The error and its causes on one line.
fn describe(e: &dyn StdError) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(err) = cause {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cause = err.source();
    }
    text
}
