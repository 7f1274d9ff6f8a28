//! Serving HTTP connections, with the bounds a server facing its own customers needs:
//! at most `http.max_connections` at once (more wait to be accepted), and per connection
//! three clocks that nobody can hold open:
//!
//! - a request's **head** must arrive within `header_read_timeout` of its first byte (or of
//!   the connection's start);
//! - its **body** within `body_read_timeout` of the head (a late body fails the read, and
//!   the API answers 408);
//! - a connection with no request in progress is closed after `idle_timeout`.
//!
//! A request head is at most 64 KiB and 100 headers (431 beyond).
//!
//! The head and idle clocks live in [`Guarded`], a wrapper around the socket that knows
//! from [`Activity`] whether a request is in progress; the body clock in [`TimedBody`].
//! Each request also carries its client's address ([`ClientAddress`]): the peer's, or,
//! from a trusted reverse proxy, the one the proxy names.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::config::HttpConfig;

/// The address a request came from, as the failed-authentication budget counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(pub IpAddr);

/// Why a request body stopped: it did not arrive within `http.body_read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// The largest request head (request line and headers) read, and the most headers: a
/// larger one is answered 431.
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;

/// How long to wait before accepting again after `accept` failed (out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Serves `router` on `listener` until `stop` is cancelled; then every connection finishes
/// the request it is on (none starts another) and this returns once all are closed.
pub async fn serve(listener: TcpListener, router: axum::Router, config: HttpConfig, stop: CancellationToken) {
    let config = Arc::new(config);
    let slots = Arc::new(Semaphore::new(config.max_connections));
    let connections = TaskTracker::new();
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = stop.cancelled() => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let (router, config, stop) = (router.clone(), config.clone(), stop.clone());
        connections.spawn(async move {
            serve_connection(stream, peer, router, config, stop).await;
            drop(slot);
        });
    }
    connections.close();
    connections.wait().await;
}

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: axum::Router,
    config: Arc<HttpConfig>,
    stop: CancellationToken,
) {
    let _ = stream.set_nodelay(true);
    let activity = Arc::new(Activity::new(&config));
    let io = TokioIo::new(Guarded::new(stream, activity.clone()));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let request = activity.start();
        let client = client_address(peer.ip(), req.headers(), &config.trusted_proxies, &config.client_address_header);
        let mut req = req.map(|body| Body::new(TimedBody::new(body, config.body_read_timeout)));
        req.extensions_mut().insert(ConnectInfo(peer));
        req.extensions_mut().insert(ClientAddress(client));
        let answer = router.clone().oneshot(req);
        async move {
            let answer = answer.await;
            drop(request);
            answer
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(MAX_HEAD_BYTES).max_headers(MAX_HEADERS);
    builder.http2().max_header_list_size(MAX_HEAD_BYTES as u32);
    let connection = builder.serve_connection_with_upgrades(io, service);
    tokio::pin!(connection);
    tokio::select! {
        _ = connection.as_mut() => return,
        () = stop.cancelled() => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

/// The client's address: the peer's, unless the peer is a trusted proxy, in which case the
/// right-most address in `header` that is not itself a trusted proxy (what the nearest
/// untrusted hop told the first trusted one); the peer's if the header names none.
pub fn client_address(peer: IpAddr, headers: &HeaderMap, proxies: &[ipnet::IpNet], header: &str) -> IpAddr {
    let trusted = |ip: &IpAddr| proxies.iter().any(|net| net.contains(ip));
    if !trusted(&peer) {
        return peer;
    }
    let hops = headers.get_all(header).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(','));
    let hops: Vec<IpAddr> = hops.filter_map(|hop| hop.trim().parse().ok()).collect();
    hops.into_iter().rev().find(|ip| !trusted(ip)).unwrap_or(peer)
}

/// What a connection is doing, for its clocks: requests in progress, when it last became
/// idle, and when the head of the request it is waiting for began.
struct Activity {
    in_progress: AtomicUsize,
    /// (idle since, first byte of the next head), while no request is in progress.
    waiting: Mutex<(Instant, Option<Instant>)>,
    /// Who waits to read while a request is in progress: woken when the connection becomes
    /// idle, so its clock starts even if nothing arrives (or it would wait unclocked).
    reader: Mutex<Option<Waker>>,
    header_timeout: Duration,
    idle_timeout: Duration,
}

/// One request in progress; dropping it (the answer is done, or the connection went away)
/// makes the connection idle again when it was the last.
struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        if self.0.in_progress.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self.0.waiting.lock().unwrap_or_else(|p| p.into_inner()) = (Instant::now(), None);
            if let Some(reader) = self.0.reader.lock().unwrap_or_else(|p| p.into_inner()).take() {
                reader.wake();
            }
        }
    }
}

impl Activity {
    fn new(config: &HttpConfig) -> Self {
        // A new connection's first head is due `header_timeout` after it opened.
        let opened = Instant::now();
        Self {
            in_progress: AtomicUsize::new(0),
            waiting: Mutex::new((opened, Some(opened))),
            reader: Mutex::new(None),
            header_timeout: config.header_read_timeout,
            idle_timeout: config.idle_timeout,
        }
    }

    fn start(self: &Arc<Self>) -> InProgress {
        self.in_progress.fetch_add(1, Ordering::AcqRel);
        InProgress(self.clone())
    }

    /// Bytes arrived: while idle, the first of them starts the next head's clock.
    fn received(&self) {
        if self.in_progress.load(Ordering::Acquire) == 0 {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            waiting.1.get_or_insert_with(Instant::now);
        }
    }

    /// While a request is in progress, keeps the reader's waker for when it ends (`None`);
    /// if it ended meanwhile, the deadline that applies now.
    fn wake_when_idle(&self, cx: &Context<'_>) -> Option<Instant> {
        *self.reader.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        // Ended between the caller's look and the waker being kept: nobody would wake it.
        self.read_deadline()
    }

    /// When reading must have made progress by: `None` while a request is in progress.
    fn read_deadline(&self) -> Option<Instant> {
        if self.in_progress.load(Ordering::Acquire) > 0 {
            return None;
        }
        let (idle_since, head) = *self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        Some(match head {
            Some(first_byte) => first_byte + self.header_timeout,
            None => idle_since + self.idle_timeout,
        })
    }
}

/// A socket whose reads fail once the connection is idle too long, or a request head takes
/// too long to arrive.
struct Guarded<S> {
    io: S,
    activity: Arc<Activity>,
    clock: Pin<Box<Sleep>>,
}

impl<S> Guarded<S> {
    fn new(io: S, activity: Arc<Activity>) -> Self {
        Self { io, activity, clock: Box::pin(tokio::time::sleep(Duration::ZERO)) }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(done) => {
                if buf.filled().len() > before {
                    self.activity.received();
                }
                Poll::Ready(done)
            }
            Poll::Pending => {
                let Some(deadline) = self.activity.read_deadline().or_else(|| self.activity.wake_when_idle(cx)) else {
                    return Poll::Pending;
                };
                if self.clock.deadline() != deadline {
                    self.clock.as_mut().reset(deadline);
                }
                ready!(self.clock.as_mut().poll(cx));
                Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "the client was too slow or idle too long")))
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A request body that fails once it has taken longer than its budget to arrive.
pub struct TimedBody {
    body: Incoming,
    budget: Duration,
    deadline: Instant,
    /// Made the first time the body is not all there yet (most bodies arrive at once).
    clock: Option<Pin<Box<Sleep>>>,
}

impl TimedBody {
    fn new(body: Incoming, budget: Duration) -> Self {
        Self { body, budget, deadline: Instant::now() + budget, clock: None }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = self.deadline;
        ready!(self.clock.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline))).as_mut().poll(cx));
        Poll::Ready(Some(Err(Box::new(BodyTimedOut(self.budget)))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(forwarded: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in forwarded {
            map.append("x-forwarded-for", value.parse().unwrap());
        }
        map
    }

    #[test]
    fn only_a_trusted_proxy_names_the_client() {
        let proxies = ["10.0.0.0/8".parse().unwrap()];
        let (proxy, stranger): (IpAddr, IpAddr) = ("10.0.0.5".parse().unwrap(), "198.51.100.7".parse().unwrap());
        let forwarded = headers(&["203.0.113.9"]);
        assert_eq!(
            client_address(proxy, &forwarded, &proxies, "x-forwarded-for"),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        assert_eq!(client_address(stranger, &forwarded, &proxies, "x-forwarded-for"), stranger, "a header anyone sent");
        assert_eq!(client_address(proxy, &forwarded, &[], "x-forwarded-for"), proxy, "no proxy is trusted by default");
    }

    #[test]
    fn the_right_most_untrusted_hop_is_the_client_whatever_the_client_prepends() {
        let proxies = ["10.0.0.0/8".parse().unwrap()];
        let proxy: IpAddr = "10.0.0.5".parse().unwrap();
        // The client forged the first entry; the trusted proxy appended the real address,
        // and an inner trusted proxy appended its own.
        let forwarded = headers(&["192.0.2.1, 203.0.113.9", "10.0.0.7"]);
        let client = client_address(proxy, &forwarded, &proxies, "x-forwarded-for");
        assert_eq!(client, "203.0.113.9".parse::<IpAddr>().unwrap());
        let garbage = headers(&["not an address"]);
        assert_eq!(client_address(proxy, &garbage, &proxies, "x-forwarded-for"), proxy);
    }
}
