//! Hostile receivers: a raw TCP server that never answers, trickles, streams without end,
//! announces 10 GB, sends a gzip bomb, garbage, a header flood, resets mid-body, or asks
//! for an absurd `Retry-After`. Each must be a failed attempt within its budget, with
//! memory bounded and the worker slot returned; and a panic inside an attempt is contained.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{Receiver, TestServer, eventually};

const FAIL: i64 = 2;
const TIMEOUT_MS: u64 = 1500;

/// Serves each connection according to its request path.
async fn hostile_receiver() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(misbehave(stream));
        }
    });
    base
}

async fn misbehave(mut stream: TcpStream) {
    let Some(path) = read_request_path(&mut stream).await else { return };
    let _ = match path.as_str() {
        "/silent" => hold(&mut stream).await,
        "/trickle" => {
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" {
                if stream.write_all(&[*byte]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(())
        }
        "/endless" => {
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n").await;
            let chunk = format!("4000\r\n{}\r\n", "x".repeat(0x4000));
            while stream.write_all(chunk.as_bytes()).await.is_ok() {}
            Ok(())
        }
        "/ten-gigabytes" => {
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10737418240\r\n\r\n").await;
            let block = vec![b'x'; 64 * 1024];
            while stream.write_all(&block).await.is_ok() {}
            Ok(())
        }
        "/gzip-bomb" => {
            let bomb = gzip_bomb();
            let head = format!("HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n", bomb.len());
            let _ = stream.write_all(head.as_bytes()).await;
            stream.write_all(&bomb).await
        }
        "/garbage" => stream.write_all(b"HTTP/1.1 2OO NOPE\r\n\x00\x01garbage\r\n\r\n").await,
        "/header-flood" => {
            let mut head = String::from("HTTP/1.1 200 OK\r\n");
            for i in 0..500 {
                head.push_str(&format!("X-Flood-{i}: {}\r\n", "y".repeat(100)));
            }
            head.push_str("Content-Length: 0\r\n\r\n");
            stream.write_all(head.as_bytes()).await
        }
        "/reset" => {
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n").await;
            let _ = stream.write_all(&[b'x'; 100]).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = stream.set_zero_linger(); // close with RST
            drop(stream);
            return;
        }
        "/retry-after-float" => {
            stream.write_all(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1e300\r\nContent-Length: 0\r\n\r\n").await
        }
        "/retry-after-huge" => {
            let head = "HTTP/1.1 503 Busy\r\nRetry-After: 99999999999999999999999999\r\nContent-Length: 0\r\n\r\n";
            stream.write_all(head.as_bytes()).await
        }
        "/script" => {
            let body = "<script>alert('owned')</script>";
            let head =
                format!("HTTP/1.1 500 Oops\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\r\n", body.len());
            stream.write_all(format!("{head}{body}").as_bytes()).await
        }
        _ => Ok(()),
    };
    hold(&mut stream).await.ok();
}

/// Reads the request head (and ignores the body); returns the path.
async fn read_request_path(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.ok().filter(|n| *n > 0)?;
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head).lines().next()?.to_owned();
    line.split_whitespace().nth(1).map(str::to_owned)
}

/// Keeps the connection open, reading and discarding, until the peer hangs up.
async fn hold(stream: &mut TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; 4096];
    while stream.read(&mut buf).await? > 0 {}
    Ok(())
}

/// 128 MiB of zeros, gzip-compressed to about 128 KiB: more than Herald reads.
fn gzip_bomb() -> Vec<u8> {
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;
    let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..128 {
        encoder.write_all(&zeros).unwrap();
    }
    encoder.finish().unwrap()
}

fn once() -> Value {
    json!({"delivery": {"timeoutMs": TIMEOUT_MS, "retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1}}})
}

/// Peak resident memory of this test process (nextest runs each test in its own).
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_receiver_is_a_failed_attempt_within_its_budget() {
    let base = hostile_receiver().await;
    let healthy = Receiver::ok().await;
    // Two slots only: a leaked slot would stall the healthy deliveries at the end.
    let server = TestServer::start_with(|c| c.delivery.max_in_flight = 2).await;
    let app = server.create_app("hostile").await;
    let cases = [
        ("/silent", "timeout"),
        ("/trickle", "timeout"),
        ("/endless", "response_too_large"),
        ("/ten-gigabytes", "response_too_large"),
        ("/gzip-bomb", "response_too_large"),
        ("/garbage", "connection"),
        ("/header-flood", "connection"),
        ("/reset", "connection"),
    ];
    let mut endpoints = Vec::new();
    for (path, class) in cases {
        let endpoint = server.create_endpoint(&app, &format!("{base}{path}"), once()).await;
        endpoints.push((endpoint["id"].as_str().unwrap().to_owned(), path, class));
    }
    let msg = server.send(&app, json!({"eventType": "probe", "payload": {}})).await;
    for (id, path, class) in &endpoints {
        eventually(&format!("{path} fails"), || async {
            (server.delivery_status(&app, &msg, id).await == Some(FAIL)).then_some(())
        })
        .await;
        let (_, attempts) = server.get(&format!("/api/v1/app/{app}/attempt/endpoint/{id}")).await;
        let attempt = &attempts["data"][0];
        assert_eq!(attempt["errorClass"], *class, "{path}: {attempt}");
        let took = attempt["responseDurationMs"].as_u64().unwrap();
        assert!(took <= TIMEOUT_MS + 1000, "{path} took {took} ms, beyond its {TIMEOUT_MS} ms budget");
        assert!(attempt["response"].as_str().unwrap().len() <= 16 * 1024, "{path}: stored response is bounded");
    }
    assert!(peak_rss_bytes() < 512 << 20, "memory stayed bounded: peak {} MB", peak_rss_bytes() >> 20);
    // Every slot came back: a healthy application still gets all its messages.
    let other = server.create_app("healthy").await;
    server.create_endpoint(&other, &healthy.url("/ok"), json!({})).await;
    for i in 0..10 {
        server.send(&other, json!({"eventType": "fine", "payload": {"i": i}})).await;
    }
    healthy.wait_for(Some("/ok"), 10).await;
}

#[tokio::test]
async fn absurd_retry_after_values_are_clamped_and_never_crash() {
    let base = hostile_receiver().await;
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let twice = json!({"delivery": {"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 2}}});
    for path in ["/retry-after-float", "/retry-after-huge"] {
        let endpoint = server.create_endpoint(&app, &format!("{base}{path}"), twice.clone()).await;
        let id = endpoint["id"].as_str().unwrap().to_owned();
        let msg = server.send(&app, json!({"eventType": "probe", "payload": {}})).await;
        let next = eventually(&format!("{path} scheduled a retry"), || async {
            let (_, list) = server.get(&format!("/api/v1/app/{app}/msg/{msg}/endpoint")).await;
            let row = list["data"].as_array()?.iter().find(|d| d["id"] == id.as_str())?.clone();
            row["nextAttempt"].as_str().map(str::to_owned)
        })
        .await;
        let next = chrono::DateTime::parse_from_rfc3339(&next).unwrap().timestamp();
        let in_secs = next - chrono::Utc::now().timestamp();
        assert!((-5..=3600 + 60).contains(&in_secs), "{path}: next attempt in {in_secs} s, clamped to an hour");
    }
    // The server is still answering.
    assert_eq!(server.get("/api/v1/health").await.0, reqwest::StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn a_response_body_is_stored_as_sent_and_served_as_json_text() {
    let base = hostile_receiver().await;
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &format!("{base}/script"), once()).await;
    let id = endpoint["id"].as_str().unwrap();
    let msg = server.send(&app, json!({"eventType": "probe", "payload": {}})).await;
    eventually("the attempt", || async { (server.delivery_status(&app, &msg, id).await == Some(FAIL)).then_some(()) })
        .await;
    let raw =
        server.request_as_admin(reqwest::Method::GET, &format!("/api/v1/app/{app}/attempt/endpoint/{id}")).send().await;
    let response = raw.unwrap();
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    let attempts: Value = response.json().await.unwrap();
    assert_eq!(attempts["data"][0]["response"], "<script>alert('owned')</script>");
    assert_eq!(attempts["data"][0]["responseStatusCode"], 500);
}

#[tokio::test]
async fn a_panicking_attempt_is_an_internal_failure_and_returns_its_slot() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start_with(|c| {
        c.delivery.max_in_flight = 1;
        c.faults.panic_on_event_type = Some("poison".into());
    })
    .await;
    let app = server.create_app("a").await;
    let retries = json!({"delivery": {"retry": {"strategy": "schedule", "delaysMs": [10, 10], "jitterPercent": 0}}});
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), retries).await;
    let id = endpoint["id"].as_str().unwrap();
    let poison = server.send(&app, json!({"eventType": "poison", "payload": {}})).await;
    eventually("the poison message is a dead letter", || async {
        (server.delivery_status(&app, &poison, id).await == Some(FAIL)).then_some(())
    })
    .await;
    let attempts = server.attempts(&app, &poison).await;
    assert_eq!(attempts.len(), 3, "every attempt the policy allows");
    assert!(attempts.iter().all(|a| a["errorClass"] == "internal"));
    assert!(receiver.requests().is_empty(), "the panic happened before sending");
    for i in 0..5 {
        server.send(&app, json!({"eventType": "fine", "payload": {"i": i}})).await;
    }
    receiver.wait_for(Some("/hook"), 5).await;
}
