//! Alerts as operational webhooks to a local receiver: each fires once when its condition
//! starts, and sends a recovery note when it ends; every one is signed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use herald::signing::{SignedHeaders, SigningKey, verify};
use serde_json::{Value, json};

use crate::support::receiver::Received;
use crate::support::{Receiver, Reply, TestServer, eventually};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn alerting_server(operator: &Receiver, auto_disable_hours: Option<f64>) -> TestServer {
    let url = operator.url("/ops");
    TestServer::start_with(move |c| {
        c.alerts.webhook_url = Some(url);
        c.alerts.webhook_secret = Some(SECRET.into());
        c.alerts.settings.interval = Duration::from_millis(100);
        // A stall is a message undelivered for 2 s: the stuck endpoint answers after 5 s, the
        // slow one after 150 ms (under 800 ms, a busy CI machine once kept a slow one
        // waiting long enough to count as a second stall).
        c.alerts.settings.oldest_pending = Duration::from_millis(2000);
        c.alerts.settings.p95_threshold_ms = 100.0;
        c.alerts.settings.auto_disable_after = auto_disable_hours.map(|h| Duration::from_secs_f64(h * 3600.0));
    })
    .await
}

/// The operational webhooks received so far, by type (signatures checked).
fn alerts(operator: &Receiver) -> Vec<(String, Value)> {
    let key = SigningKey::decode(SECRET).unwrap();
    operator
        .requests_to("/ops")
        .iter()
        .map(|r: &Received| {
            let headers = SignedHeaders::from_pairs(r.headers.iter().map(|(k, v)| (k.as_str(), v.to_str().unwrap())));
            verify(&key, &headers, &r.body, chrono::Utc::now().timestamp()).expect("signed like any webhook");
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            (body["type"].as_str().unwrap().to_owned(), body["data"].clone())
        })
        .collect()
}

fn count(operator: &Receiver, kind: &str) -> usize {
    alerts(operator).iter().filter(|(t, _)| t == kind).count()
}

async fn wait_alert(operator: &Receiver, kind: &str) -> Value {
    eventually(kind, || async { alerts(operator).into_iter().find(|(t, _)| t == kind).map(|(_, data)| data) }).await
}

/// How many alerts of `kind` Herald raised, as its metrics count them (at the evaluation
/// that raised them, before the webhook goes out).
async fn raised(server: &TestServer, kind: &str) -> u64 {
    let text = server.request_as_admin(reqwest::Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    let series = format!("herald_alerts_total{{type=\"{kind}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(series.as_str())).map_or(0, |n| n.parse().unwrap())
}

/// Waits for two whole evaluations that began after this call: a sentinel message is
/// dead-lettered at once (a 400, in an application of its own), so one evaluation sees the
/// dead-letter count grow and the next one resolves that. Whatever those evaluations would
/// raise again has been raised, and counted, by the time the resolution arrives.
async fn two_more_evaluations(server: &TestServer, operator: &Receiver) {
    let (_, summary) = server.get("/api/v1/stats/summary").await;
    let before = summary["deadLetter"].as_u64().unwrap();
    let refusing = Receiver::start(|_, _| Reply::status(400)).await;
    let app = server.create_app("sentinel").await;
    server.create_endpoint(&app, &refusing.url("/sentinel"), json!({})).await;
    server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    eventually("the sentinel's dead letter to be seen and resolved", || async {
        let resolved = |(kind, data): &(String, Value)| {
            kind == "herald.dead_letters.growing.resolved" && data["deadLetters"].as_u64() > Some(before)
        };
        alerts(operator).iter().any(resolved).then_some(())
    })
    .await;
}

/// Checks that Herald raised `kind` exactly `times` (its own count) and that the operator
/// got exactly that many (waiting for webhooks still on their way).
async fn raised_exactly(server: &TestServer, operator: &Receiver, kind: &str, times: usize) {
    assert_eq!(raised(server, kind).await, times as u64, "{kind}: {:?}", alerts(operator));
    eventually(kind, || async { (count(operator, kind) >= times).then_some(()) }).await;
    assert_eq!(count(operator, kind), times, "{kind}: {:?}", alerts(operator));
}

#[tokio::test]
async fn a_circuit_opening_and_closing_and_growing_dead_letters_are_announced_once() {
    let operator = Receiver::ok().await;
    let healthy = Arc::new(AtomicBool::new(false));
    let flag = healthy.clone();
    let receiver =
        Receiver::start(move |_, _| if flag.load(Ordering::SeqCst) { Reply::ok() } else { Reply::status(500) }).await;
    let server = alerting_server(&operator, None).await;
    let app = server.create_app("a").await;
    let delivery = json!({"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1},
                          "circuitBreaker": {"failureThreshold": 2, "cooldownMs": 500}});
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({"delivery": delivery})).await;
    let endpoint_id = endpoint["id"].as_str().unwrap();
    for i in 0..2 {
        server.send(&app, json!({"eventType": "e", "payload": {"i": i}})).await;
    }
    let opened = wait_alert(&operator, "herald.circuit.opened").await;
    assert_eq!((opened["endpointId"].as_str(), opened["appId"].as_str()), (Some(endpoint_id), Some(app.as_str())));
    wait_alert(&operator, "herald.dead_letters.growing").await;
    wait_alert(&operator, "herald.dead_letters.growing.resolved").await;

    healthy.store(true, Ordering::SeqCst);
    server.send(&app, json!({"eventType": "e", "payload": {"probe": true}})).await;
    wait_alert(&operator, "herald.circuit.closed").await;
    two_more_evaluations(&server, &operator).await;
    // Once each; the dead letters grew twice (the circuit's two messages, then the sentinel).
    for (kind, times) in
        [("herald.circuit.opened", 1), ("herald.circuit.closed", 1), ("herald.dead_letters.growing", 2)]
    {
        raised_exactly(&server, &operator, kind, times).await;
    }
    let text = server.request_as_admin(reqwest::Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    assert!(text.contains("herald_alerts_active{alert=\"circuit.open\"} 0"), "{text}");
}

#[tokio::test]
async fn a_stalled_queue_and_a_slow_endpoint_are_announced_and_the_stall_resolves() {
    let operator = Receiver::ok().await;
    let receiver = Receiver::start(|r, _| match r.path.as_str() {
        "/stuck" => Reply::ok().after(Duration::from_millis(5000)),
        _ => Reply::ok().after(Duration::from_millis(150)),
    })
    .await;
    let server = alerting_server(&operator, None).await;
    let app = server.create_app("a").await;
    let mut slow = json!({});
    slow["channels"] = json!(["slow"]);
    let slow = server.create_endpoint(&app, &receiver.url("/slow"), slow).await;
    let mut stuck = json!({});
    stuck["channels"] = json!(["stuck"]);
    server.create_endpoint(&app, &receiver.url("/stuck"), stuck).await;

    server.send(&app, json!({"eventType": "e", "channels": ["stuck"], "payload": {}})).await;
    let stalled = wait_alert(&operator, "herald.queue.stalled").await;
    assert!(stalled["oldestPendingAt"].is_string());
    wait_alert(&operator, "herald.queue.stalled.resolved").await;

    for i in 0..20 {
        server.send(&app, json!({"eventType": "e", "channels": ["slow"], "payload": {"i": i}})).await;
    }
    let alert = wait_alert(&operator, "herald.endpoint.slow").await;
    assert_eq!(alert["endpointId"], slow["id"]);
    assert!(alert["p95Ms"].as_f64().unwrap() > 100.0);
    two_more_evaluations(&server, &operator).await;
    for kind in ["herald.endpoint.slow", "herald.queue.stalled"] {
        raised_exactly(&server, &operator, kind, 1).await;
    }
}

#[tokio::test]
async fn an_endpoint_that_keeps_failing_is_disabled_once_and_announced() {
    let operator = Receiver::ok().await;
    let receiver = Receiver::start(|_, _| Reply::status(503)).await;
    // About a second of failing is "too long" here.
    let server = alerting_server(&operator, Some(0.0003)).await;
    let app = server.create_app("a").await;
    let delivery = json!({"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1},
                          "circuitBreaker": {"failureThreshold": 1, "cooldownMs": 60000}});
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({"delivery": delivery})).await;
    let endpoint_id = endpoint["id"].as_str().unwrap();
    server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let disabled = wait_alert(&operator, "endpoint.disabled").await;
    assert_eq!((disabled["endpointId"].as_str(), disabled["trigger"].as_str()), (Some(endpoint_id), Some("automatic")));
    let (_, endpoint) = server.get(&format!("/api/v1/app/{app}/endpoint/{endpoint_id}")).await;
    assert_eq!(endpoint["disabled"], true);
    two_more_evaluations(&server, &operator).await;
    raised_exactly(&server, &operator, "endpoint.disabled", 1).await;
}
