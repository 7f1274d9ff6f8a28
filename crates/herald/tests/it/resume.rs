//! Fixing an endpoint resumes it at once: a new URL (or headers), or enabling it again,
//! closes its circuit breaker and brings the parked deliveries forward; "retry now" lets
//! the probe of an open breaker go without waiting out the cooldown. The breakers here have
//! five-minute cooldowns, so anything waiting for the cooldown would time the tests out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::{Receiver, Reply, TestServer, eventually};

/// Three failures open it; it would stay open for five minutes.
fn parking_breaker() -> Value {
    json!({"delivery": {
        "retry": {"strategy": "schedule", "delaysMs": vec![10; 20], "jitterPercent": 0},
        "circuitBreaker": {"failureThreshold": 3, "cooldownMs": 300_000},
    }})
}

/// `/broken` always answers 500; `/good` answers 200; `/flaky` answers 503 until healed.
async fn receiver() -> (Receiver, Arc<AtomicBool>) {
    let healed = Arc::new(AtomicBool::new(false));
    let flag = healed.clone();
    let receiver = Receiver::start(move |r, _| match r.path.as_str() {
        "/good" => Reply::ok(),
        "/flaky" if flag.load(Ordering::SeqCst) => Reply::ok(),
        "/flaky" => Reply::status(503),
        _ => Reply::status(500),
    })
    .await;
    (receiver, healed)
}

async fn health(server: &TestServer, app: &str, ep: &str) -> Value {
    server.get(&format!("/api/v1/app/{app}/endpoint/{ep}/health")).await.1
}

/// Opens the endpoint's breaker with one message, then parks `parked` more behind it.
async fn open_and_park(server: &TestServer, app: &str, ep: &str, parked: usize) -> Vec<String> {
    let mut sent = vec![server.send(app, json!({"eventType": "t", "payload": {"n": 0}})).await];
    eventually("the breaker to open", || async { (health(server, app, ep).await["state"] == "open").then_some(()) })
        .await;
    for n in 1..=parked {
        sent.push(server.send(app, json!({"eventType": "t", "payload": {"n": n}})).await);
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrected_url_closes_the_breaker_and_the_parked_deliveries_reach_it_at_once() {
    let server = TestServer::start().await;
    let (receiver, _) = receiver().await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/broken"), parking_breaker()).await;
    let ep = endpoint["id"].as_str().unwrap();
    let sent = open_and_park(&server, &app, ep, 50).await;
    assert_eq!(receiver.requests_to("/broken").len(), 3, "parked deliveries use no attempts");

    // A change that leaves the way the endpoint is reached alone keeps the breaker's verdict.
    let path = format!("/api/v1/app/{app}/endpoint/{ep}");
    let (status, _) = server.call(Method::PATCH, &path, Some(json!({"description": "still broken"}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health(&server, &app, ep).await["state"], "open");

    let (status, _) = server.call(Method::PATCH, &path, Some(json!({"url": receiver.url("/good")}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health(&server, &app, ep).await["state"], "closed", "closed as the change is answered");
    let arrived = receiver.wait_for(Some("/good"), sent.len()).await;
    let mut ids: Vec<&str> = arrived.iter().map(|r| r.header("webhook-id")).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), sent.len(), "every parked message, once each, at the corrected URL");
    assert_eq!(receiver.requests_to("/broken").len(), 3, "nothing more went to the old URL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_headers_and_enabling_again_close_the_breaker() {
    let server = TestServer::start().await;
    let (receiver, healed) = receiver().await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/flaky"), parking_breaker()).await;
    let ep = endpoint["id"].as_str().unwrap();
    open_and_park(&server, &app, ep, 0).await;
    healed.store(true, Ordering::SeqCst);
    let headers = format!("/api/v1/app/{app}/endpoint/{ep}/headers");
    let (status, _) = server.call(Method::PUT, &headers, Some(json!({"headers": {"x-api-key": "fixed"}}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(health(&server, &app, ep).await["state"], "closed", "new credentials deserve a new verdict");
    let fixed = receiver.wait_for(Some("/flaky"), 4).await;
    assert_eq!(fixed[3].header("x-api-key"), "fixed", "the parked message went out at once, with them");

    healed.store(false, Ordering::SeqCst);
    let before = 4;
    server.send(&app, json!({"eventType": "t", "payload": {}})).await;
    eventually("the breaker to open again", || async {
        (health(&server, &app, ep).await["state"] == "open").then_some(())
    })
    .await;
    assert_eq!(receiver.requests_to("/flaky").len(), before + 3);
    let path = format!("/api/v1/app/{app}/endpoint/{ep}");
    for disabled in [true, false] {
        let (status, _) = server.call(Method::PATCH, &path, Some(json!({"disabled": disabled}))).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(health(&server, &app, ep).await["state"], "closed", "enabled again: closed");
    healed.store(true, Ordering::SeqCst);
    let msg = server.send(&app, json!({"eventType": "t", "payload": {"after": "enabled"}})).await;
    eventually("the next message to arrive", || async {
        receiver.requests_to("/flaky").iter().any(|r| r.header("webhook-id") == msg).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_now_sends_the_probe_at_once_for_the_owner_only() {
    let server = TestServer::start().await;
    let (receiver, healed) = receiver().await;
    let app = server.create_app("a").await;
    let other = server.create_app("b").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/flaky"), parking_breaker()).await;
    let ep = endpoint["id"].as_str().unwrap();
    let sent = open_and_park(&server, &app, ep, 5).await;
    healed.store(true, Ordering::SeqCst);

    let retry = format!("/api/v1/app/{app}/endpoint/{ep}/health/retry");
    let (status, _) = portal_call(&server, &other, Method::POST, &retry).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another customer cannot see, let alone retry, the endpoint");
    assert_eq!(health(&server, &app, ep).await["state"], "open");
    let (status, answer) = portal_call(&server, &app, Method::POST, &retry).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{answer}");
    assert!(answer["state"].is_string(), "the answer is the endpoint's health: {answer}");
    receiver.wait_for(Some("/flaky"), 3 + sent.len()).await;
    eventually("the probe to close the breaker", || async {
        (health(&server, &app, ep).await["state"] == "closed").then_some(())
    })
    .await;
}

/// A call with a portal token of `app`.
async fn portal_call(server: &TestServer, app: &str, method: Method, path: &str) -> (StatusCode, Value) {
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let token = access["token"].as_str().unwrap();
    let answer = reqwest::Client::new().request(method, server.url(path)).bearer_auth(token).send().await.unwrap();
    let status = answer.status();
    (status, answer.json().await.unwrap_or(Value::Null))
}
