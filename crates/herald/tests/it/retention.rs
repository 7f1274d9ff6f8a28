//! Retention: with zero days and a purge every few milliseconds, delivered payloads and
//! response bodies go, then attempts; metadata stays; nothing undelivered is purged. The
//! Svix `expunge-content` calls do the same on demand.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::support::server::Storage;
use crate::support::{Receiver, Reply, TestServer, eventually};

fn retention(c: &mut herald::Config, payloads: f64, responses: f64, attempts: f64) {
    let days = |d: f64| (d >= 0.0).then(|| Duration::from_secs_f64(d * 86_400.0));
    c.retention.payloads = days(payloads);
    c.retention.responses = days(responses);
    c.retention.attempts = days(attempts);
    c.retention.interval = Duration::from_millis(50);
    c.retention.batch = 2; // several batches per run
}

#[tokio::test]
async fn expired_payloads_bodies_and_attempts_are_purged_but_nothing_undelivered() {
    let receiver = Receiver::start(|r, _| match r.path.as_str() {
        "/ok" => Reply::ok().body("receipt-body"),
        _ => Reply::status(503),
    })
    .await;
    let storage = Storage::new().await;
    let server = TestServer::start_on(&storage, |c| retention(c, -1.0, -1.0, -1.0)).await;
    let app = server.create_app("a").await;
    let ok = server.create_endpoint(&app, &receiver.url("/ok"), json!({"channels": ["ok"]})).await;
    // Retries far in the future: this one stays pending.
    let later = json!({"channels": ["later"], "delivery": {"retry": {"strategy": "fixed", "intervalMs": 3600000, "maxAttempts": 5}}});
    server.create_endpoint(&app, &receiver.url("/later"), later).await;
    let mut delivered = Vec::new();
    for i in 0..5 {
        delivered.push(server.send(&app, json!({"eventType": "e", "channels": ["ok"], "payload": {"i": i}})).await);
    }
    let pending = server.send(&app, json!({"eventType": "e", "channels": ["later"], "payload": {"keep": true}})).await;
    receiver.wait_for(Some("/ok"), 5).await;
    receiver.wait_for(Some("/later"), 1).await;
    let ok_id = ok["id"].as_str().unwrap();
    for msg in &delivered {
        eventually("delivered", || async { (server.delivery_status(&app, msg, ok_id).await == Some(0)).then_some(()) })
            .await;
    }
    server.stop().await;

    // Payloads and response bodies: zero days.
    let server = TestServer::start_on(&storage, |c| retention(c, 0.0, 0.0, -1.0)).await;
    for msg in &delivered {
        let (message, attempts) = eventually("the payload and the response body purged", || async {
            let (_, m) = server.get(&format!("/api/v1/app/{app}/msg/{msg}")).await;
            let attempts = server.attempts(&app, msg).await;
            (m["payloadExpunged"] == true && attempts.first().is_some_and(|a| a["response"] == "EXPUNGED"))
                .then_some((m, attempts))
        })
        .await;
        assert_eq!((message["eventType"].clone(), message["payload"].clone()), (json!("e"), json!({"expired": true})));
        assert_eq!(attempts.len(), 1, "attempts stay (their retention is longer)");
        assert_eq!(attempts[0]["responseStatusCode"], 200, "the attempt's metadata stays");
    }
    let (_, kept) = server.get(&format!("/api/v1/app/{app}/msg/{pending}")).await;
    assert_eq!(kept["payload"], json!({"keep": true}), "undelivered: the payload stays");
    server.stop().await;

    // Attempts: zero days, except those of the pending delivery.
    let server = TestServer::start_on(&storage, |c| retention(c, 0.0, 0.0, 0.0)).await;
    for msg in &delivered {
        eventually("the attempts purged", || async { server.attempts(&app, msg).await.is_empty().then_some(()) }).await;
        let (status, _) = server.get(&format!("/api/v1/app/{app}/msg/{msg}")).await;
        assert!(status.is_success(), "the message itself stays");
    }
    assert_eq!(server.attempts(&app, &pending).await.len(), 1, "a pending delivery keeps its attempts");
}

#[tokio::test]
async fn expunge_content_removes_a_payload_and_a_response_body_on_demand() {
    let receiver = Receiver::start(|_, _| Reply::ok().body("receipt")).await;
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let msg = server.send(&app, json!({"eventType": "e", "payload": {"secret": 1}})).await;
    receiver.wait_for(None, 1).await;
    let attempt = eventually("an attempt", || async { server.attempts(&app, &msg).await.first().cloned() }).await;
    let attempt_id = attempt["id"].as_str().unwrap();
    let path = format!("/api/v1/app/{app}/msg/{msg}/attempt/{attempt_id}/content");
    assert!(server.call(Method::DELETE, &path, None).await.0.is_success());
    let (status, _) = server.call(Method::DELETE, &format!("/api/v1/app/{app}/msg/{msg}/content"), None).await;
    assert!(status.is_success());
    let (_, message) = server.get(&format!("/api/v1/app/{app}/msg/{msg}")).await;
    assert_eq!(
        (message["payloadExpunged"].clone(), message["payload"].clone()),
        (json!(true), json!({"expired": true})),
        "an expunged payload reads as Svix shows it"
    );
    assert_eq!(server.attempts(&app, &msg).await[0]["response"], "EXPUNGED");
}
