//! The sending side of an attempt: build the signed request, send it through a keep-alive
//! connection pool behind the destination guard, read a bounded part of the answer, and
//! report what happened as data ([`Sent`]), never as an error. An endpoint with an event
//! destination publishes to its broker instead (`brokers`), through the same guarded
//! connector.

mod brokers;
mod clients;
mod connector;
mod oauth2;
mod request;
mod resolver;

use std::borrow::Cow;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

use crate::egress::EgressProxy;
pub use connector::{Budgeted, ConnectError, GuardedConnector, SetupTimeout};
pub use request::{Outgoing, Standard};
pub use resolver::{ResolveError, Resolver};

use brokers::Publishers;
use clients::ClientCache;

use crate::catalog::Target;
use crate::delivery_auth::{OAuth2Grant, client_config};
use crate::outcome::{AttemptResult, Failure};
use crate::retry::parse_retry_after;
use crate::ssrf::Guard;

type HttpClient = Client<Budgeted<HttpsConnector<GuardedConnector>>, Full<Bytes>>;

/// Response headers read at most (count); larger header blocks fail the attempt.
const MAX_RESPONSE_HEADERS: usize = 64;
/// Bytes of response head buffered at most.
const MAX_RESPONSE_HEAD_BYTES: usize = 16 * 1024;
/// Clients (each with its pool) kept for applications' proxies and endpoints' client
/// certificates at most, and per application (see `clients`).
const MAX_CLIENTS: usize = 1024;
const MAX_CLIENTS_PER_APP: usize = 64;

/// What one attempt produced.
#[derive(Debug, Clone)]
pub struct Sent {
    pub result: AttemptResult,
    pub duration: Duration,
    /// The start of the response body (lossy UTF-8), at most the store limit.
    pub body: String,
    /// A human-readable reason when the attempt failed without a response.
    pub error: Option<String>,
    /// The URL to record when it is not the endpoint's (postback templates).
    pub url: Option<String>,
}

impl Sent {
    pub fn failed(failure: Failure, error: impl Into<String>, duration: Duration) -> Self {
        Self {
            result: AttemptResult::Failed(failure),
            duration,
            body: String::new(),
            error: Some(error.into()),
            url: None,
        }
    }
}

/// Limits applied to every attempt. The attempt's own timeout bounds the whole exchange
/// (body included); DNS, TCP connect and TLS each have a budget of their own inside it.
#[derive(Debug, Clone)]
pub struct DelivererConfig {
    pub read_limit: usize,
    pub store_limit: usize,
    pub user_agent: String,
    pub dns_budget: Duration,
    pub connect_budget: Duration,
    pub tls_budget: Duration,
    /// Name servers to ask; empty means the system's.
    pub dns_servers: Vec<SocketAddr>,
    /// Every attempt tunnels through this proxy, if set.
    pub proxy: Option<EgressProxy>,
}

pub struct Deliverer {
    /// Through the server's egress proxy (if any), with no client certificate.
    client: HttpClient,
    /// For applications' own proxies and endpoints' own TLS settings: one client (and
    /// pool) each, made when first used.
    clients: Mutex<ClientCache<ClientKey, HttpClient>>,
    tokens: oauth2::TokenCache,
    /// The TLS settings of connections without a client certificate (public roots).
    plain_tls: rustls::ClientConfig,
    resolver: Resolver,
    guard: Arc<Guard>,
    config: DelivererConfig,
    /// The broker connections of event destinations.
    publishers: Publishers,
}

/// What sets a client apart: the proxy its connections go through and the endpoint TLS
/// settings (client certificate, trusted CAs) they use.
#[derive(Clone, PartialEq, Eq, Hash)]
struct ClientKey {
    proxy: Option<EgressProxy>,
    tls: Option<[u8; 32]>,
}

impl Deliverer {
    pub fn new(guard: Arc<Guard>, config: DelivererConfig) -> Self {
        let resolver = Resolver::new(guard.clone(), &config.dns_servers, config.dns_budget);
        let plain_tls = client_config(None, None).expect("the default TLS settings build");
        let client = Self::client(&resolver, &guard, &config, config.proxy.clone(), plain_tls.clone());
        let clients = Mutex::new(ClientCache::new(MAX_CLIENTS, MAX_CLIENTS_PER_APP));
        let budgets = (config.connect_budget, config.dns_budget + config.connect_budget + config.tls_budget);
        let publishers =
            Publishers::new(resolver.clone(), guard.clone(), budgets, config.proxy.clone(), plain_tls.clone());
        Self { client, clients, tokens: Default::default(), plain_tls, resolver, guard, config, publishers }
    }

    /// The endpoint is gone: what was kept for it (its OAuth2 token) goes with it.
    pub fn forget_endpoint(&self, endpoint: &crate::ids::EndpointId) {
        self.tokens.forget(endpoint);
    }

    /// The client for `target`'s attempts (`tls`: with its TLS settings), or why there is
    /// none.
    fn client_for(&self, target: &Target, tls: bool) -> Result<Cow<'_, HttpClient>, String> {
        let endpoint_tls = if tls { target.tls.clone()? } else { None };
        if target.proxy.is_none() && endpoint_tls.is_none() {
            return Ok(Cow::Borrowed(&self.client));
        }
        let proxy = target.proxy.clone().or_else(|| self.config.proxy.clone());
        let key = ClientKey { proxy: proxy.clone(), tls: endpoint_tls.as_ref().map(|t| t.fingerprint) };
        let made = || {
            let tls = endpoint_tls.as_ref().map_or_else(|| self.plain_tls.clone(), |e| e.config.clone());
            Self::client(&self.resolver, &self.guard, &self.config, proxy, tls)
        };
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        Ok(Cow::Owned(clients.get_or_make(&target.endpoint.app_id, &key, made)))
    }

    fn client(
        resolver: &Resolver,
        guard: &Arc<Guard>,
        config: &DelivererConfig,
        proxy: Option<EgressProxy>,
        tls: rustls::ClientConfig,
    ) -> HttpClient {
        let tcp = GuardedConnector::new(resolver.clone(), guard.clone(), config.connect_budget, proxy);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(tcp);
        // DNS and TCP have their own budgets inside; the TLS handshake gets its budget on top.
        let connect = Budgeted::new(https, config.dns_budget + config.connect_budget + config.tls_budget);
        // No redirect following, no proxy from the environment, no decompression: hyper
        // does none of them.
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(256)
            .http1_max_headers(MAX_RESPONSE_HEADERS)
            .http1_max_buf_size(MAX_RESPONSE_HEAD_BYTES.max(8192))
            .http2_max_header_list_size(MAX_RESPONSE_HEAD_BYTES as u32)
            .build(connect)
    }

    /// Performs one attempt within the target's timeout: an HTTP request, or a message
    /// published to the endpoint's event destination.
    ///
    /// The destinations' and OAuth2's futures are boxed where they are awaited: they are
    /// kilobytes each, and left inline they would make every plain attempt's task as
    /// large, copied whole each time one is spawned and finished.
    pub async fn send(&self, out: Outgoing<'_>) -> Sent {
        match &out.target.destination {
            Ok(None) => {}
            Ok(Some(destination)) if destination.kind.is_http_api() => {
                return Box::pin(self.publish_to_aws(destination, &out)).await;
            }
            Ok(Some(destination)) => return Box::pin(self.publishers.publish(destination, &out)).await,
            Err(why) => return Sent::failed(Failure::Internal, why.clone(), Duration::ZERO),
        }
        let started = Instant::now();
        let deadline = started + out.timeout();
        let (request, recorded_url) = match out.build(&self.config.user_agent) {
            Ok(built) => (built.request, built.recorded_url),
            Err((failure, reason)) => return Sent::failed(failure, reason, started.elapsed()),
        };
        let client = match self.client_for(out.target, true) {
            Ok(client) => client,
            Err(reason) => return Sent::failed(Failure::Tls, reason, started.elapsed()),
        };
        let mut sent = match &out.target.oauth2 {
            None => self.exchange(&client, request, started, deadline).await,
            Some(grant) => {
                Box::pin(self.exchange_with_token(out.target, grant, &client, request, started, deadline)).await
            }
        };
        sent.url = recorded_url;
        sent
    }

    /// Sends a request with the endpoint's OAuth2 token; a 401 drops the token, and the
    /// request goes once more with a fresh one.
    async fn exchange_with_token(
        &self,
        target: &Target,
        grant: &OAuth2Grant,
        client: &HttpClient,
        request: http::Request<Full<Bytes>>,
        started: Instant,
        deadline: Instant,
    ) -> Sent {
        let endpoint = &target.endpoint.id;
        // The token endpoint is reached through the application's proxy, trusting the
        // public roots (the endpoint's own CAs are for its receiver).
        let token_client = match self.client_for(target, false) {
            Ok(client) => client,
            Err(reason) => return Sent::failed(Failure::Internal, reason, started.elapsed()),
        };
        let with_token = |token: &oauth2::Token| {
            let mut copy = http::Request::new(request.body().clone());
            *copy.method_mut() = request.method().clone();
            *copy.uri_mut() = request.uri().clone();
            *copy.headers_mut() = request.headers().clone();
            copy.headers_mut().insert(http::header::AUTHORIZATION, token.header.clone());
            copy
        };
        let token = match self.tokens.token(endpoint, grant, &token_client, deadline).await {
            Ok(token) => token,
            Err(why) => return Sent::failed(Failure::AuthToken, why, started.elapsed()),
        };
        let sent = self.exchange(client, with_token(&token), started, deadline).await;
        if !matches!(sent.result, AttemptResult::Response { status: 401, .. }) {
            return sent;
        }
        self.tokens.refused(endpoint, grant, &token, deadline).await;
        match self.tokens.token(endpoint, grant, &token_client, deadline).await {
            Ok(fresh) => self.exchange(client, with_token(&fresh), started, deadline).await,
            Err(why) => Sent::failed(
                Failure::AuthToken,
                format!("refused with 401, and no new token: {why}"),
                started.elapsed(),
            ),
        }
    }

    /// Sends a built request and reads the answer within `deadline`.
    async fn exchange(
        &self,
        client: &HttpClient,
        request: http::Request<Full<Bytes>>,
        started: Instant,
        deadline: Instant,
    ) -> Sent {
        let response = match tokio::time::timeout_at(deadline, client.request(request)).await {
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
        let too_large = |what: String| Sent::failed(Failure::ResponseTooLarge, what, started.elapsed());
        let limit = self.config.read_limit;
        if let Some(announced) = response.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok())
            && !announced_length_fits(announced, limit)
        {
            return too_large(format!(
                "status {status} announced a body of {announced} bytes; at most {limit} are read"
            ));
        }
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        let body = match read_bounded(response.into_body(), deadline, limit).await {
            Body::Complete(body) => body,
            Body::TooLong => return too_large(format!("status {status} with a body over {limit} bytes")),
            Body::TimedOut => {
                return Sent::failed(
                    Failure::Timeout,
                    format!("status {status}, but the body was not finished in time"),
                    started.elapsed(),
                );
            }
            Body::Broken(e) => {
                return Sent::failed(
                    Failure::Connection,
                    format!("status {status}, but the body broke off: {e}"),
                    started.elapsed(),
                );
            }
        };
        let stored = &body[..body.len().min(self.config.store_limit)];
        Sent {
            result: AttemptResult::Response { status, retry_after },
            duration: started.elapsed(),
            body: String::from_utf8_lossy(stored).into_owned(),
            error: None,
            url: None,
        }
    }
}

/// Whether a `Content-Length` value announces a body Herald will read (at most `limit`
/// bytes); anything unparsable counts as too long.
pub fn announced_length_fits(value: &str, limit: usize) -> bool {
    value.trim().parse::<u64>().is_ok_and(|n| n <= limit as u64)
}

/// How reading a response body ended.
pub(super) enum Body {
    Complete(Bytes),
    /// More than the read limit: the rest is never read (the connection is dropped).
    TooLong,
    TimedOut,
    Broken(String),
}

/// Reads a whole body of at most `limit` bytes before `deadline`. The status only counts
/// when the exchange completes: a receiver that stalls, streams without end or breaks off
/// mid-body has not answered.
pub(super) async fn read_bounded(mut body: hyper::body::Incoming, deadline: Instant, limit: usize) -> Body {
    let mut buf = BytesMut::new();
    loop {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Body::TimedOut,
            Ok(None) => return Body::Complete(buf.freeze()),
            Ok(Some(Err(e))) => return Body::Broken(e.to_string()),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if buf.len() + data.len() > limit {
                        return Body::TooLong;
                    }
                    buf.extend_from_slice(&data);
                }
            }
        }
    }
}

/// Maps a client error to an outcome by walking its cause chain.
pub(super) fn classify_client_error(e: &hyper_util::client::legacy::Error) -> (Failure, String) {
    let mut cause: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = cause {
        if let Some(connect) = err.downcast_ref::<ConnectError>() {
            return match connect {
                ConnectError::Resolve(ResolveError::Blocked(_)) => (Failure::BlockedDestination, connect.to_string()),
                ConnectError::Resolve(ResolveError::NotFound(_)) => (Failure::DnsNotFound, connect.to_string()),
                ConnectError::Resolve(ResolveError::Temporary(..)) => (Failure::DnsTemporary, connect.to_string()),
                ConnectError::Timeout(_) => (Failure::Timeout, connect.to_string()),
                ConnectError::Io(..) | ConnectError::NoHost | ConnectError::Proxy(_) => {
                    (Failure::Connection, connect.to_string())
                }
            };
        }
        if err.downcast_ref::<SetupTimeout>().is_some() {
            return (Failure::Timeout, err.to_string());
        }
        if err.downcast_ref::<rustls::Error>().is_some() {
            return (Failure::Tls, format!("TLS failure: {err}"));
        }
        // rustls reports through the I/O layer as `InvalidData` (TCP never does), wrapped
        // once more by the connector, or turned into text by HTTP/2 (an alert the receiver
        // sends after the handshake, such as a refused client certificate).
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            let inner = io.get_ref().map(|inner| inner as &(dyn StdError + 'static));
            if io.kind() == std::io::ErrorKind::InvalidData || inner.is_some_and(|e| e.is::<rustls::Error>()) {
                return (Failure::Tls, format!("TLS failure: {io}"));
            }
            // An I/O error's `source` skips the error it wraps: look at that one next.
            if inner.is_some() {
                cause = inner;
                continue;
            }
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
