//! Prototype for issue 35's riskiest step toward ≤ 60 µs per message: the per-core shape.
//! The same relay runs on either runtime shape, and nothing else differs:
//!
//! - `multi` (Herald today): one multi-thread runtime, one listener, one client pool; a
//!   message may be answered on one core and delivered from another.
//! - `per-core`: one current-thread runtime per core, each with a listener of its own on
//!   the same port (`SO_REUSEPORT`: the kernel spreads the connections) and a client pool of
//!   its own, so a message never leaves the core that accepted it.
//!
//! The relay speaks just enough of Herald's API for `scripts/harness.py --binary` to drive
//! it as it drives Herald (applications, endpoints, messages answered 202, the health check
//! and the summary the harness drains on), and forwards each message's body to its
//! endpoint's URL. No storage, no signing, no retries: only what the shape changes.
//!
//! ```sh
//! cargo build --release -p herald-bench --example relay_shapes
//! RELAY_SHAPE=per-core scripts/harness.py --binary $CARGO_TARGET_DIR/release/examples/relay_shapes
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

type Forwarder = Client<HttpConnector, Full<Bytes>>;

/// What every core shares: the endpoints (written while the harness sets up, read after)
/// and the counts.
#[derive(Default)]
struct Shared {
    endpoints: RwLock<HashMap<String, hyper::Uri>>,
    made: AtomicUsize,
    in_flight: Arc<AtomicUsize>,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let listen: SocketAddr = flag(&args, "--listen").unwrap_or("127.0.0.1:8071").parse()?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let shared = Arc::new(Shared::default());
    match std::env::var("RELAY_SHAPE").as_deref().unwrap_or("multi") {
        "multi" => {
            let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(cores).enable_all().build()?;
            runtime.block_on(serve(listen, shared))
        }
        "per-core" => {
            let threads: Vec<_> = (0..cores)
                .map(|_| {
                    let shared = shared.clone();
                    std::thread::spawn(move || -> anyhow::Result<()> {
                        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                        runtime.block_on(serve(listen, shared))
                    })
                })
                .collect();
            for thread in threads {
                thread.join().expect("a core's thread")?;
            }
            Ok(())
        }
        other => anyhow::bail!("RELAY_SHAPE is multi or per-core, not {other}"),
    }
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

/// Accepts on a listener of this runtime's own (sharing the port) and serves each
/// connection on this runtime, forwarding through this runtime's client.
async fn serve(listen: SocketAddr, shared: Arc<Shared>) -> anyhow::Result<()> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseport(true)?;
    socket.set_reuseaddr(true)?;
    socket.bind(listen)?;
    let listener = socket.listen(1024)?;
    eprintln!("relay listening addr={listen}");
    let forwarder: Forwarder = Client::builder(TokioExecutor::new()).build_http();
    loop {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let (shared, forwarder) = (shared.clone(), forwarder.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| handle(request, shared.clone(), forwarder.clone()));
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tcp), service).await;
        });
    }
}

async fn handle(
    request: Request<Incoming>,
    shared: Arc<Shared>,
    forwarder: Forwarder,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let answer = match (method, segments.as_slice()) {
        (Method::GET, ["api", "v1", "health", "ping"]) => reply(StatusCode::NO_CONTENT, String::new()),
        (Method::GET, ["api", "v1", "stats", "summary"]) => {
            let in_flight = shared.in_flight.load(Ordering::Acquire);
            reply(StatusCode::OK, format!(r#"{{"pending":0,"awaitingRetry":0,"inFlight":{in_flight}}}"#))
        }
        (Method::POST, ["api", "v1", "app"]) => {
            let n = shared.made.fetch_add(1, Ordering::Relaxed);
            reply(StatusCode::CREATED, format!(r#"{{"id":"app_{n}"}}"#))
        }
        (Method::POST, ["api", "v1", "app", app, "endpoint"]) => {
            let settings: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            let Some(url) = settings["url"].as_str().and_then(|u| u.parse().ok()) else {
                return Ok(reply(StatusCode::UNPROCESSABLE_ENTITY, String::new()));
            };
            shared.endpoints.write().unwrap().insert((*app).to_owned(), url);
            reply(StatusCode::CREATED, r#"{"id":"ep_1"}"#.to_owned())
        }
        (Method::POST, ["api", "v1", "app", app, "msg"]) => {
            let Some(url) = shared.endpoints.read().unwrap().get(*app).cloned() else {
                return Ok(reply(StatusCode::NOT_FOUND, String::new()));
            };
            let n = shared.made.fetch_add(1, Ordering::Relaxed);
            let in_flight = shared.in_flight.clone();
            in_flight.fetch_add(1, Ordering::AcqRel);
            tokio::spawn(async move {
                let request = Request::post(url).header("content-type", "application/json").body(Full::new(body));
                if let Ok(answer) = forwarder.request(request.expect("a valid request")).await {
                    let _ = answer.into_body().collect().await;
                }
                in_flight.fetch_sub(1, Ordering::AcqRel);
            });
            reply(StatusCode::ACCEPTED, format!(r#"{{"id":"msg_{n}"}}"#))
        }
        _ => reply(StatusCode::NOT_FOUND, String::new()),
    };
    Ok(answer)
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert("content-type", http::HeaderValue::from_static("application/json"));
    response
}
