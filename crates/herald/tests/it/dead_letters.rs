//! Dead letters end to end: each analysis pattern produced by a scripted receiver and
//! recognised, and a filtered bulk replay of 1,000 dead letters that re-delivers exactly
//! the matching ones, after a dry run that counted them.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Receiver, Reply, TestServer, eventually};

/// One attempt per delivery, and a breaker that never opens: these endpoints fail on
/// purpose, and a parked endpoint would hold its dead letters back.
fn once() -> Value {
    json!({"delivery": {"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1},
                        "circuitBreaker": {"failureThreshold": 10000}}})
}

/// Waits until `app` has `n` dead letters in the last hour.
async fn dead_letters(server: &TestServer, query: &str, n: u64) -> Vec<Value> {
    eventually(&format!("{n} dead letters"), || async {
        let (_, stats) = server.get(&format!("/api/v1/stats/dead-letters{query}")).await;
        let rows = stats["data"].as_array()?.clone();
        (rows.iter().map(|r| r["deadCount"].as_u64().unwrap()).sum::<u64>() == n).then_some(rows)
    })
    .await
}

#[tokio::test]
async fn each_dead_letter_pattern_is_recognised_with_its_hint() {
    let receiver = Receiver::start(|r, _| match r.path.as_str() {
        "/down" => Reply::status(503),
        "/auth" => Reply::status(401),
        "/limited" => Reply::status(429),
        "/gone" => Reply::status(410),
        _ => Reply::status(500),
    })
    .await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let mut expected = HashMap::new();
    for (path, pattern, messages) in [
        ("/down", "burst", 6),
        ("/auth", "authChanged", 3),
        ("/limited", "rateLimited", 3),
        ("/gone", "permanent", 3),
        ("/flaky", "trickle", 2),
    ] {
        // Each endpoint takes its own channel, so each gets its own messages only.
        let channel = path.trim_start_matches('/');
        let mut settings = once();
        settings["channels"] = json!([channel]);
        let endpoint = server.create_endpoint(&app, &receiver.url(path), settings).await;
        expected.insert(endpoint["id"].as_str().unwrap().to_owned(), (pattern, messages));
        for i in 0..messages {
            server.send(&app, json!({"eventType": "order.paid", "channels": [channel], "payload": {"i": i}})).await;
        }
    }
    let rows = dead_letters(&server, "?hours=1", 17).await;
    assert_eq!(rows.len(), 5);
    for row in &rows {
        let (pattern, count) = expected[row["endpointId"].as_str().unwrap()];
        assert_eq!(row["pattern"], pattern, "{row}");
        assert_eq!(row["deadCount"], count, "{row}");
        assert_eq!(row["avgAttempts"], 1.0);
        assert!(!row["hint"].as_str().unwrap().is_empty());
        assert!(row["firstDeadAt"].as_i64() <= row["lastDeadAt"].as_i64());
    }
    let auth = rows.iter().find(|r| r["pattern"] == "authChanged").unwrap();
    assert_eq!((auth["primaryStatusCode"].clone(), auth["primaryError"].clone()), (json!(401), json!("http_status")));

    // A portal token sees its own application's dead letters only.
    let other = server.create_app("other").await;
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{other}"), json!({})).await;
    let token = access["token"].as_str().unwrap();
    let response = reqwest::Client::new()
        .get(server.url("/api/v1/stats/dead-letters?hours=1"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen: Value = response.json().await.unwrap();
    assert_eq!(seen["data"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_bulk_replay_redelivers_exactly_the_matching_dead_letters() {
    let healed = Arc::new(AtomicBool::new(false));
    let flag = healed.clone();
    let receiver = Receiver::start(move |r, _| {
        if flag.load(Ordering::SeqCst) {
            return Reply::ok();
        }
        match r.path.as_str() {
            "/a" => Reply::status(500),
            "/b" => Reply::status(404),
            _ => Reply::status(410),
        }
    })
    .await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let mut endpoint_b = String::new();
    for path in ["/a", "/b", "/c"] {
        let endpoint = server.create_endpoint(&app, &receiver.url(path), once()).await;
        if path == "/b" {
            endpoint_b = endpoint["id"].as_str().unwrap().to_owned();
        }
    }
    const MESSAGES: u64 = 334; // × 3 endpoints: 1,002 dead letters
    for i in 0..MESSAGES {
        server.send(&app, json!({"eventType": "order.paid", "payload": {"i": i}})).await;
    }
    dead_letters(&server, &format!("?hours=1&appId={app}"), 3 * MESSAGES).await;
    healed.store(true, Ordering::SeqCst);
    let before: HashMap<&str, usize> = ["/a", "/b", "/c"].map(|p| (p, receiver.requests_to(p).len())).into();

    let path = format!("/api/v1/app/{app}/dead-letters/replay");
    let (status, dry) = server.post(&path, json!({"statusCode": 404, "dryRun": true})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((dry["status"].clone(), dry["total"].clone()), (json!("dryRun"), json!(MESSAGES)));
    let (status, task) = server.post(&path, json!({"statusCode": 404})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{task}");
    let task_id = task["taskId"].as_str().unwrap();
    let done = eventually("the replay to finish", || async {
        let (_, progress) = server.get(&format!("{path}/{task_id}")).await;
        (progress["status"] == "finished").then_some(progress)
    })
    .await;
    assert_eq!((done["total"].clone(), done["replayed"].clone()), (json!(MESSAGES), dry["total"].clone()));

    receiver.wait_for(Some("/b"), before["/b"] + MESSAGES as usize).await;
    assert_eq!(receiver.requests_to("/a").len(), before["/a"], "other status codes stay dead");
    assert_eq!(receiver.requests_to("/c").len(), before["/c"]);
    // Replays are manual attempts through the normal pipeline, and they succeeded.
    let (_, attempts) = server.get(&format!("/api/v1/app/{app}/attempt/endpoint/{endpoint_b}?limit=5")).await;
    let latest = &attempts["data"][0];
    assert_eq!((latest["triggerType"].clone(), latest["responseStatusCode"].clone()), (json!(1), json!(200)));
    let rows = dead_letters(&server, &format!("?hours=1&appId={app}"), 2 * MESSAGES).await;
    assert!(rows.iter().all(|r| r["endpointId"] != endpoint_b.as_str()));
}
