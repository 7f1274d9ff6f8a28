//! Redis Streams destinations against a real redis-server (`appendfsync always`, so an
//! entry Redis acknowledged survives a kill): 10,000 messages read back with `XRANGE` and
//! verified across a broker kill, each failure class, a filter and a transform, a breaker.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use herald_test_support::brokers::Broker;
use redis::AsyncCommands;
use redis::streams::StreamRangeReply;
use reqwest::Method;
use serde_json::{Value, json};

use super::{Consumed, attempts, breaker, never_breaking, quick_retries, send_many, settles};
use crate::support::{TestServer, eventually};

pub(super) const PASSWORD: &str = "broker-pa55";

/// A Redis Streams destination on `broker`.
fn destination(broker: &Broker, stream: &str, create: bool) -> Value {
    json!({
        "type": "redisStreams",
        "broker": format!("redis://127.0.0.1:{}/0", broker.port()),
        "stream": stream,
        "createStream": create,
        "credentials": {"password": PASSWORD},
    })
}

/// Creates an endpoint publishing to `destination` with `delivery` settings; its id and
/// signing secret.
async fn endpoint(server: &TestServer, app: &str, destination: Value, extra: Value) -> (String, String) {
    let mut body = json!({"destination": destination});
    body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let created = server.create_endpoint(app, "", body).await;
    let id = created["id"].as_str().unwrap().to_owned();
    let secret = server.secret(app, &id).await;
    (id, secret)
}

/// A consumer's connection to the broker (made anew each time: the broker may have been
/// restarted).
async fn consumer(broker: &Broker) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{}/0", broker.port())).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// Every entry of `stream`, oldest first, as a consumer reads it.
pub(super) async fn read_all(broker: &Broker, stream: &str) -> Vec<Consumed> {
    let mut connection = consumer(broker).await;
    let mut entries = Vec::new();
    let mut from = "-".to_owned();
    loop {
        let page: StreamRangeReply = connection.xrange_count(stream, &from, "+", 1000).await.unwrap();
        let Some(last) = page.ids.last() else { break };
        from = format!("({}", last.id);
        for entry in page.ids {
            let mut fields: HashMap<String, Vec<u8>> = entry
                .map
                .into_iter()
                .map(|(name, value)| (name, redis::from_redis_value::<Vec<u8>>(value).unwrap()))
                .collect();
            let body = fields.remove("body").expect("every entry has a body");
            let headers = fields.into_iter().map(|(k, v)| (k, String::from_utf8(v).unwrap())).collect();
            entries.push(Consumed { body, headers });
        }
    }
    entries
}

async fn length(broker: &Broker, stream: &str) -> Option<usize> {
    let client = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{}/0", broker.port())).ok()?;
    let mut connection = client.get_multiplexed_async_connection().await.ok()?;
    connection.xlen(stream).await.ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_reach_the_stream_signed_and_none_is_lost_when_redis_is_killed() {
    const MESSAGES: usize = 10_000;
    let mut broker = Broker::redis(Some(PASSWORD)).unwrap();
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let (ep, secret) =
        endpoint(&server, &app, destination(&broker, "orders", true), json!({"delivery": quick_retries()})).await;

    let sender = {
        let (server_url, app) = (server.url(""), app.clone());
        tokio::spawn(async move { send_all(&server_url, &app, MESSAGES).await })
    };
    eventually("a third of the messages to be in the stream", || async {
        (length(&broker, "orders").await? >= MESSAGES / 3).then_some(())
    })
    .await;
    broker.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    broker.restart().unwrap();
    let sent: HashSet<String> = sender.await.unwrap().into_iter().collect();
    assert_eq!(sent.len(), MESSAGES);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    let entries = loop {
        let entries = read_all(&broker, "orders").await;
        let ids: HashSet<&str> = entries.iter().map(|e| e.header("webhook-id")).collect();
        if ids.len() >= MESSAGES {
            break entries;
        }
        assert!(tokio::time::Instant::now() < deadline, "{} of {MESSAGES} in the stream", ids.len());
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let ids: HashSet<String> = entries.iter().map(|e| e.header("webhook-id").to_owned()).collect();
    assert_eq!(ids, sent, "every message sent is in the stream, and nothing else");
    for entry in &entries {
        assert!(entry.verifies(&secret), "a consumer verifies every entry: {entry:?}");
        assert_eq!(entry.header("herald-event-type"), "order.paid");
        assert_eq!(entry.header("content-type"), "application/json");
        assert!(entry.json()["i"].is_u64());
    }
    // A duplicate is a retry whose first try reached Redis but whose answer was lost with
    // the broker: only the kill makes them, so there are few, and every later copy is a
    // retry (attempt 2 or more).
    let mut seen = HashSet::new();
    let duplicates: Vec<&Consumed> = entries.iter().filter(|e| !seen.insert(e.header("webhook-id"))).collect();
    assert!(duplicates.len() < 200, "{} duplicates", duplicates.len());
    assert!(duplicates.iter().all(|d| d.header("herald-attempt") != "1"), "{duplicates:?}");
    // The outage was felt: attempts failed while Redis was down, and were retried.
    let (_, failed) = server.get(&format!("/api/v1/app/{app}/attempt/endpoint/{ep}?status=2&limit=250")).await;
    let failed = failed["data"].as_array().unwrap();
    assert!(!failed.is_empty(), "no attempt failed during the outage");
    assert!(failed.iter().all(|a| a["errorClass"] == "connection"), "{failed:?}");
    server.stop().await;
}

/// Posts `n` messages to `app`, 16 at a time, on a client of its own; their ids.
async fn send_all(server: &str, app: &str, n: usize) -> Vec<String> {
    let client = reqwest::Client::new();
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(16) {
        let posts =
            chunk.iter().map(|i| {
                let request = client
                    .post(format!("{server}/api/v1/app/{app}/msg"))
                    .bearer_auth(crate::support::server::ADMIN_TOKEN)
                    .json(&json!({"eventType": "order.paid", "payload": {"i": i}}));
                async move {
                    request.send().await.unwrap().json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
                }
            });
        ids.extend(futures_util::future::join_all(posts).await);
    }
    ids
}

#[tokio::test]
async fn wrong_credentials_are_retried_until_corrected() {
    let broker = Broker::redis(Some(PASSWORD)).unwrap();
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let mut wrong = destination(&broker, "orders", true);
    wrong["credentials"]["password"] = json!("not-the-password");
    let (ep, secret) = endpoint(&server, &app, wrong, json!({"delivery": never_breaking()})).await;
    let msg = server.send(&app, json!({"eventType": "order.paid", "payload": {}})).await;
    let failed = attempts(&server, &app, &msg, 2).await;
    for attempt in &failed[..2] {
        assert_eq!(attempt["errorClass"], "broker_auth", "{attempt}");
        assert!(attempt["error"].as_str().unwrap().contains("authentication failed"), "{attempt}");
    }
    let path = format!("/api/v1/app/{app}/endpoint/{ep}");
    let (status, _) =
        server.call(Method::PATCH, &path, Some(json!({"destination": destination(&broker, "orders", true)}))).await;
    assert_eq!(status, 200);
    settles(&server, &app, &msg, &ep, 0).await;
    let entries = read_all(&broker, "orders").await;
    assert_eq!(entries.len(), 1);
    assert!(entries[0].verifies(&secret));
    let last = server.attempts(&app, &msg).await.pop().unwrap();
    assert_eq!(last["responseStatusCode"], 200, "{last}");
    assert!(last["response"].as_str().unwrap().starts_with("XADD orders "), "the broker's answer is recorded: {last}");
}

#[tokio::test]
async fn a_missing_stream_and_an_oversized_message_are_dead_lettered_at_once() {
    let broker = Broker::redis(Some(PASSWORD)).unwrap();
    let server = TestServer::start().await;
    let missing_app = server.create_app("missing").await;
    let (missing, _) =
        endpoint(&server, &missing_app, destination(&broker, "nosuch", false), json!({"delivery": never_breaking()}))
            .await;
    let msg = server.send(&missing_app, json!({"eventType": "order.paid", "payload": {}})).await;
    settles(&server, &missing_app, &msg, &missing, 2).await;
    let tried = server.attempts(&missing_app, &msg).await;
    assert_eq!(tried.len(), 1, "permanent: not retried: {tried:?}");
    assert_eq!(tried[0]["errorClass"], "destination_missing", "{tried:?}");
    assert_eq!(length(&broker, "nosuch").await, Some(0), "no stream was made");

    let small_app = server.create_app("small").await;
    let mut small = destination(&broker, "orders", true);
    small["maxMessageBytes"] = json!(64);
    let (ep, _) = endpoint(&server, &small_app, small, json!({"delivery": never_breaking()})).await;
    let big = server.send(&small_app, json!({"eventType": "order.paid", "payload": {"note": "x".repeat(100)}})).await;
    let fits = server.send(&small_app, json!({"eventType": "order.paid", "payload": {}})).await;
    settles(&server, &small_app, &big, &ep, 2).await;
    settles(&server, &small_app, &fits, &ep, 0).await;
    let tried = server.attempts(&small_app, &big).await;
    assert_eq!(tried.len(), 1, "{tried:?}");
    assert_eq!(tried[0]["errorClass"], "message_too_large");
    let (_, dead) = server.get(&format!("/api/v1/stats/dead-letters?hours=1&appId={small_app}")).await;
    assert_eq!(dead["data"][0]["deadCount"], 1, "{dead}");
    assert_eq!(read_all(&broker, "orders").await.len(), 1, "only the message that fits");
}

#[tokio::test]
async fn filters_and_transforms_apply_before_publishing() {
    let broker = Broker::redis(Some(PASSWORD)).unwrap();
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let scripts = json!({
        "filter": ".payload.amount > 100",
        "transform": r#"{payload: {total: .payload.amount}, headers: (.headers + {"x-kind": .eventType})}"#,
        "headers": {"x-team": "blue"},
    });
    let (_, secret) = endpoint(&server, &app, destination(&broker, "orders", true), scripts).await;
    server.send(&app, json!({"eventType": "order.paid", "payload": {"amount": 5}})).await;
    let kept = server.send(&app, json!({"eventType": "order.paid", "payload": {"amount": 150}})).await;
    let entries = eventually("the kept message", || async {
        let entries = read_all(&broker, "orders").await;
        (!entries.is_empty()).then_some(entries)
    })
    .await;
    assert_eq!(entries.len(), 1, "the filter kept one message out");
    let entry = &entries[0];
    assert_eq!(entry.header("webhook-id"), kept);
    assert_eq!(entry.json(), json!({"total": 150}));
    assert_eq!((entry.header("x-kind"), entry.header("x-team")), ("order.paid", "blue"));
    assert!(entry.verifies(&secret), "the signature covers the transformed body");
}

#[tokio::test]
async fn the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back() {
    let mut broker = Broker::redis(Some(PASSWORD)).unwrap();
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let (ep, _) =
        endpoint(&server, &app, destination(&broker, "orders", true), json!({"delivery": quick_retries()})).await;
    send_many(&server, &app, 1).await;
    eventually("the first entry", || async { (length(&broker, "orders").await? == 1).then_some(()) }).await;
    broker.kill();
    let msg = server.send(&app, json!({"eventType": "order.paid", "payload": {}})).await;
    breaker(&server, &app, &ep, "open").await;
    let failed = server.attempts(&app, &msg).await;
    assert!(failed.iter().all(|a| a["errorClass"] == "connection"), "{failed:?}");
    broker.restart().unwrap();
    breaker(&server, &app, &ep, "closed").await;
    settles(&server, &app, &msg, &ep, 0).await;
    assert_eq!(length(&broker, "orders").await, Some(2));
}
