//! Attacks with the connection itself: heads and bodies sent slowly or never, connections
//! left open, more connections than the server takes, two `Authorization` headers, and
//! wrong tokens from an address others share.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{Tenant, still_serving};
use crate::support::TestServer;
use crate::support::server::ADMIN_TOKEN;

/// Writes `text` on a new connection to `addr` and leaves it open.
async fn send_raw(addr: SocketAddr, text: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(text.as_bytes()).await.unwrap();
    stream
}

/// Reads until the server closes the connection (or `safety` passes: a hang, not a
/// measurement); what it sent.
async fn read_to_close(stream: &mut TcpStream, safety: Duration) -> String {
    let mut text = Vec::new();
    let read = tokio::time::timeout(safety, stream.read_to_end(&mut text)).await;
    assert!(read.is_ok(), "the server kept the connection open: {}", String::from_utf8_lossy(&text));
    String::from_utf8_lossy(&text).into_owned()
}

#[tokio::test]
async fn slow_bodies_hold_nothing_that_keyed_posts_need() {
    let server = TestServer::start_with(|c| {
        c.http.body_read_timeout = Duration::from_secs(3);
        // Unthrottled, so that every one of the hundreds below stalls (none is answered 429).
        c.auth.portal_requests_per_second = None;
    })
    .await;
    let (mallory, alice) = (Tenant::new(&server, "mallory").await, Tenant::new(&server, "alice").await);
    // Hundreds of keyed POSTs that announce a body and never send it: each used to hold one
    // of the 64 stripes of the idempotency lock, until every keyed POST waited behind them.
    let mut stalled = Vec::new();
    for i in 0..300 {
        let head = format!(
            "POST {} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\nidempotency-key: stall-{i}\r\n\
             content-type: application/json\r\ncontent-length: 100\r\n\r\n",
            mallory.path("/msg"),
            mallory.token
        );
        stalled.push(send_raw(server.addr, &head).await);
    }
    let keyed = server
        .request_as_admin(reqwest::Method::POST, &alice.path("/msg"))
        .header("idempotency-key", "alice-1")
        .json(&json!({"eventType": "e", "payload": {}}));
    let answer = tokio::time::timeout(Duration::from_secs(2), keyed.send()).await;
    let answer = answer.expect("a keyed POST is not held up by the stalled ones").unwrap();
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    // The stalled requests end at the body timeout: 408, and the connection closes.
    let answer = read_to_close(&mut stalled[0], Duration::from_secs(20)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    still_serving(&server, &alice).await;
}

#[tokio::test]
async fn a_head_never_finished_and_a_connection_left_idle_are_closed() {
    let server = TestServer::start_with(|c| {
        c.http.header_read_timeout = Duration::from_millis(500);
        c.http.idle_timeout = Duration::from_secs(1);
    })
    .await;
    let safety = Duration::from_secs(15);
    // A head begun and never finished.
    let mut partial = send_raw(server.addr, "GET /api/v1/health HTTP/1.1\r\nHo").await;
    // A connection that never sends a byte.
    let mut silent = send_raw(server.addr, "").await;
    // A connection that asks once and then idles.
    let mut idle = send_raw(server.addr, "GET /api/v1/health/ping HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(read_to_close(&mut partial, safety).await.is_empty(), "no answer to half a request");
    assert!(read_to_close(&mut silent, safety).await.is_empty());
    let answered = read_to_close(&mut idle, safety).await;
    assert!(answered.starts_with("HTTP/1.1 204"), "answered, then closed when idle: {answered}");
}

#[tokio::test]
async fn a_request_head_is_bounded_in_size_and_header_count() {
    let server = TestServer::start().await;
    let alice = Tenant::new(&server, "alice").await;
    let big = format!("GET /api/v1/health/ping HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n", "a".repeat(70 * 1024));
    let answer = read_to_close(&mut send_raw(server.addr, &big).await, Duration::from_secs(15)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "a 70 KiB head: {}", &answer[..answer.len().min(60)]);
    let many: String = (0..101).map(|i| format!("x-h{i}: 1\r\n")).collect();
    let many = format!("GET /api/v1/health/ping HTTP/1.1\r\nhost: x\r\n{many}\r\n");
    let answer = read_to_close(&mut send_raw(server.addr, &many).await, Duration::from_secs(15)).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "102 headers: {}", &answer[..answer.len().min(60)]);
    still_serving(&server, &alice).await;
}

#[tokio::test]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let server = TestServer::start_with(|c| c.http.max_connections = 2).await;
    // Two connections take both places (each asks once and stays open).
    let ping = "GET /api/v1/health/ping HTTP/1.1\r\nhost: x\r\n\r\n";
    let (mut first, mut second) = (send_raw(server.addr, ping).await, send_raw(server.addr, ping).await);
    let mut head = [0u8; 12];
    first.read_exact(&mut head).await.unwrap();
    second.read_exact(&mut head).await.unwrap();
    let third = tokio::spawn({
        let url = server.url("/api/v1/health/ping");
        async move {
            let answer = reqwest::Client::new().get(url).send().await.unwrap();
            (answer.status(), tokio::time::Instant::now())
        }
    });
    // The third waits to be accepted; once a place is free, it is served.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let freed_at = tokio::time::Instant::now();
    drop(first);
    let (status, answered_at) = tokio::time::timeout(Duration::from_secs(10), third).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(answered_at >= freed_at, "served only once a connection closed");
}

#[tokio::test]
async fn two_authorization_headers_are_refused_whoever_sends_them() {
    let server = TestServer::start().await;
    let alice = Tenant::new(&server, "alice").await;
    let both = server
        .request_as(&alice.token, reqwest::Method::GET, "/api/v1/app")
        .header("authorization", format!("Bearer {ADMIN_TOKEN}"));
    let answer = both.send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST, "neither token is guessed at");
    let body: serde_json::Value = answer.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("one Authorization header"), "{body}");
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_client_has_its_own_failed_authentication_budget() {
    let trusted = TestServer::start_with(|c| {
        c.auth.failed_auth_per_minute = Some(3);
        c.http.trusted_proxies = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    let get = |server: &TestServer, client: &str, token: &str| {
        let request = reqwest::Client::new().get(server.url("/api/v1/app")).bearer_auth(token);
        request.header("x-forwarded-for", client.to_owned()).send()
    };
    for _ in 0..3 {
        assert_eq!(get(&trusted, "203.0.113.1", "wrong").await.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    assert_eq!(get(&trusted, "203.0.113.1", "wrong").await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        get(&trusted, "203.0.113.2", "wrong").await.unwrap().status(),
        StatusCode::UNAUTHORIZED,
        "its own budget"
    );
    assert_eq!(
        get(&trusted, "203.0.113.1", ADMIN_TOKEN).await.unwrap().status(),
        StatusCode::OK,
        "a valid token passes"
    );

    // Without a trusted proxy the header is anyone's to write, and is ignored.
    let direct = TestServer::start_with(|c| c.auth.failed_auth_per_minute = Some(3)).await;
    for i in 0..3 {
        let forged = format!("198.51.100.{i}");
        assert_eq!(get(&direct, &forged, "wrong").await.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    let answer = get(&direct, "198.51.100.200", "wrong").await.unwrap().status();
    assert_eq!(answer, StatusCode::TOO_MANY_REQUESTS, "a forged header buys no new budget");
}
