//! The TCP side of an attempt: resolve the host through the guarded [`Resolver`] (its own
//! DNS budget), then connect to one of the vetted addresses (each within the connect
//! budget), directly or through the configured egress proxy (`proxy`). IP literals take
//! the same path as names. Nothing here reads proxy settings from the environment, and
//! Herald's own listening address is refused.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::resolver::{ResolveError, Resolver};
use crate::egress::EgressProxy;
use crate::ssrf::Guard;

#[derive(Clone)]
pub struct GuardedConnector {
    resolver: Resolver,
    guard: Arc<Guard>,
    connect_budget: Duration,
    /// Tunnels to the vetted addresses go through this proxy, if set.
    proxy: Option<EgressProxy>,
}

impl GuardedConnector {
    pub fn new(resolver: Resolver, guard: Arc<Guard>, connect_budget: Duration, proxy: Option<EgressProxy>) -> Self {
        Self { resolver, guard, connect_budget, proxy }
    }

    /// A connection to a vetted address: directly, or tunnelled through the egress proxy.
    async fn dial(&self, addr: SocketAddr) -> Result<TcpStream, ConnectError> {
        let connected = match &self.proxy {
            None => tokio::time::timeout(self.connect_budget, TcpStream::connect(addr))
                .await
                .map(|r| r.map_err(|e| ConnectError::Io(addr, e))),
            Some(proxy) => tokio::time::timeout(self.connect_budget, proxy.connect(addr))
                .await
                .map(|r| r.map_err(ConnectError::Proxy)),
        };
        connected.unwrap_or(Err(ConnectError::Timeout(addr)))
    }

    async fn connect(self, uri: Uri) -> Result<TokioIo<TcpStream>, ConnectError> {
        let host = uri.host().ok_or(ConnectError::NoHost)?;
        let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        self.open(host, port).await.map(TokioIo::new)
    }

    /// A TCP connection to `host:port` (a name or an IP literal) through the guard: only to
    /// the addresses the guarded resolver vetted, never to Herald itself. Event
    /// destinations' brokers are reached through here too.
    pub async fn open(&self, host: &str, port: u16) -> Result<TcpStream, ConnectError> {
        let addrs = self.resolver.resolve(host).await?;
        let mut last = None;
        for ip in addrs {
            let addr = SocketAddr::new(ip, port);
            if self.guard.is_own(addr) {
                return Err(ResolveError::Blocked(format!("{addr} is Herald itself")).into());
            }
            match self.dial(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(ConnectError::NoHost))
    }
}

/// Why no connection was made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error("connecting to {0}: {1}")]
    Io(SocketAddr, std::io::Error),
    #[error("connecting to {0} took longer than the connect budget")]
    Timeout(SocketAddr),
    #[error("the URL has no host")]
    NoHost,
    #[error("{0}")]
    Proxy(String),
}

impl tower::Service<Uri> for GuardedConnector {
    type Response = TokioIo<TcpStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ConnectError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Bounds a whole connection set-up (TCP, then TLS) by one budget.
#[derive(Clone)]
pub struct Budgeted<S> {
    inner: S,
    budget: Duration,
}

impl<S> Budgeted<S> {
    pub fn new(inner: S, budget: Duration) -> Self {
        Self { inner, budget }
    }
}

/// The connection was not ready (TLS handshake included) within its budget.
#[derive(Debug, thiserror::Error)]
#[error("setting up the connection (TLS handshake included) took longer than its budget")]
pub struct SetupTimeout;

impl<S> tower::Service<Uri> for Budgeted<S>
where
    S: tower::Service<Uri> + Send,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let setup = self.inner.call(uri);
        let budget = self.budget;
        Box::pin(async move {
            match tokio::time::timeout(budget, setup).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(Box::new(SetupTimeout) as BoxError),
            }
        })
    }
}
