//! The proof every destination type owes, written once: each type's file implements
//! [`Fixture`] for its broker and runs these scenarios as its tests.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use herald_test_support::brokers::Broker;
use reqwest::Method;
use serde_json::{Value, json};

use super::{Consumed, TlsSetup, attempts, breaker, never_breaking, quick_retries, send_many, settles};
use crate::support::{TestServer, eventually};

/// A broker of one destination type, started for a test, and a consumer of it.
pub trait Fixture: Sized {
    /// What the broker answers to a wrong password, in the attempt's `error`.
    const AUTH_REFUSED: &'static str;
    /// How the recorded acknowledgement of a message published to `place` begins.
    fn acknowledged(place: &str) -> String;
    /// How long the broker stays killed mid-run, and the attempt timeout then: long
    /// enough that attempts fail (a Kafka producer sends a batch again until its attempt's
    /// deadline, so it rides out an outage shorter than that).
    const OUTAGE: (Duration, Option<u64>) = (Duration::from_secs(1), None);
    /// Whether the broker is killed once a third of the messages are posted (and it holds
    /// some), rather than once it holds a third: for a consumer too slow to count before
    /// Herald has published them all.
    const KILL_WHEN_POSTED: bool = false;

    /// Starts the broker, with credentials.
    async fn start() -> Self;
    fn broker(&mut self) -> &mut Broker;
    fn broker_port(&self) -> u16;
    /// A destination publishing to `place` (a stream, a subject, …), which exists on the
    /// broker if `exists` (made now if the type needs it made).
    async fn destination(&self, place: &str, exists: bool) -> Value;
    /// Every message at `place` as a consumer reads it, oldest first.
    async fn read_all(&self, place: &str) -> Vec<Consumed>;
    /// How many messages `place` holds (0 if it does not exist); `None` while the broker
    /// cannot be asked.
    async fn count(&self, place: &str) -> Option<usize>;
}

/// Creates an endpoint publishing to `destination`, with `extra` settings; its id and
/// signing secret.
pub async fn endpoint(server: &TestServer, app: &str, destination: Value, extra: Value) -> (String, String) {
    let mut body = json!({"destination": destination});
    body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let created = server.create_endpoint(app, "", body).await;
    let id = created["id"].as_str().unwrap().to_owned();
    let secret = server.secret(app, &id).await;
    (id, secret)
}

/// 10,000 messages through the HTTP API, the broker killed (`SIGKILL`) and restarted a
/// third of the way: every message is read back and verifies, none is lost, and the only
/// duplicates are retries of messages whose acknowledgement died with the broker.
pub async fn ten_thousand_messages_survive_a_broker_kill<F: Fixture>() {
    const MESSAGES: usize = 10_000;
    let mut fixture = F::start().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let destination = fixture.destination("orders", true).await;
    let (outage, timeout_ms) = F::OUTAGE;
    let mut delivery = quick_retries();
    if let Some(timeout_ms) = timeout_ms {
        delivery["timeoutMs"] = json!(timeout_ms);
    }
    let (ep, secret) = endpoint(&server, &app, destination, json!({"delivery": delivery})).await;

    let posted = Arc::new(AtomicUsize::new(0));
    let sender = {
        let (server_url, app, posted) = (server.url(""), app.clone(), posted.clone());
        tokio::spawn(async move { send_all(&server_url, &app, MESSAGES, &posted).await })
    };
    // Killed mid-run. Patiently: an emulator (moto) takes a few hundred messages a second.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let held = fixture.count("orders").await.unwrap_or_default();
        let mid_run = match F::KILL_WHEN_POSTED {
            true => held > 0 && posted.load(Ordering::Relaxed) >= MESSAGES / 3,
            false => held >= MESSAGES / 3,
        };
        if mid_run {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{held} messages at the broker after 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fixture.broker().kill();
    eprintln!("the broker was killed with {} of {MESSAGES} messages posted", posted.load(Ordering::Relaxed));
    tokio::time::sleep(outage).await;
    fixture.broker().restart().unwrap();
    let sent: HashSet<String> = sender.await.unwrap().into_iter().collect();
    assert_eq!(sent.len(), MESSAGES);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let count = fixture.count("orders").await.unwrap_or_default();
        if count >= MESSAGES {
            let entries = fixture.read_all("orders").await;
            let ids: HashSet<String> = entries.iter().map(|e| e.header("webhook-id").to_owned()).collect();
            if ids.len() >= MESSAGES {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                let missing = sent.difference(&ids).take(3);
                let mut attempts = Vec::new();
                for id in missing {
                    attempts.push((id.clone(), server.attempts(&app, id).await));
                }
                panic!(
                    "{} of {MESSAGES} messages at the broker; some missing, with Herald's attempts: {attempts:?}",
                    ids.len()
                );
            }
        }
        if tokio::time::Instant::now() >= deadline {
            let one = sent.iter().next().expect("messages were sent");
            let attempts = server.attempts(&app, one).await;
            let logs = fixture.broker().log_tail(40);
            panic!("{count} of {MESSAGES} at the broker; {one}'s attempts: {attempts:?}\nthe broker's logs:\n{logs}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let entries = fixture.read_all("orders").await;
    let ids: HashSet<String> = entries.iter().map(|e| e.header("webhook-id").to_owned()).collect();
    assert_eq!(ids, sent, "every message sent is at the broker, and nothing else");
    for entry in &entries {
        assert!(entry.verifies(&secret), "a consumer verifies every message: {entry:?}");
        assert_eq!(entry.header("herald-event-type"), "order.paid");
        assert_eq!(entry.header("content-type"), "application/json");
        assert!(entry.json()["i"].is_u64());
    }
    // A duplicate is a retry whose first try reached the broker but whose answer was lost
    // with it: only the kill makes them, so there are few, and every later copy is a retry
    // (attempt 2 or more).
    let mut seen = HashSet::new();
    let duplicates: Vec<&Consumed> = entries.iter().filter(|e| !seen.insert(e.header("webhook-id"))).collect();
    assert!(duplicates.len() < 200, "{} duplicates", duplicates.len());
    assert!(duplicates.iter().all(|d| d.header("herald-attempt") != "1"), "{duplicates:?}");
    // The outage was felt: attempts failed while the broker was down, and were retried.
    // Refused while it was down, or unanswered when it died or stalled with a request
    // already sent (a timeout): nothing else.
    let (_, failed) = server.get(&format!("/api/v1/app/{app}/attempt/endpoint/{ep}?status=2&limit=250")).await;
    let failed = failed["data"].as_array().unwrap();
    assert!(!failed.is_empty(), "no attempt failed during the outage");
    let outage = |a: &Value| a["errorClass"] == "connection" || a["errorClass"] == "timeout";
    assert!(failed.iter().all(outage), "{failed:?}");
    server.stop().await;
}

/// Posts `n` messages to `app`, 16 at a time, on a client of its own, counting them in
/// `posted`; their ids.
async fn send_all(server: &str, app: &str, n: usize, posted: &AtomicUsize) -> Vec<String> {
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
        posted.store(ids.len(), Ordering::Relaxed);
    }
    ids
}

/// A wrong password is `broker_auth`, retried; corrected by a PATCH, the message goes
/// through and the broker's acknowledgement is recorded.
pub async fn wrong_credentials_are_retried_until_corrected<F: Fixture>() {
    let fixture = F::start().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let right = fixture.destination("orders", true).await;
    let mut wrong = right.clone();
    wrong["credentials"]["password"] = json!("not-the-password");
    let (ep, secret) = endpoint(&server, &app, wrong, json!({"delivery": never_breaking()})).await;
    let msg = server.send(&app, json!({"eventType": "order.paid", "payload": {}})).await;
    let failed = attempts(&server, &app, &msg, 2).await;
    for attempt in &failed[..2] {
        assert_eq!(attempt["errorClass"], "broker_auth", "{attempt}");
        assert!(attempt["error"].as_str().unwrap().contains(F::AUTH_REFUSED), "{attempt}");
    }
    let path = format!("/api/v1/app/{app}/endpoint/{ep}");
    let (status, _) = server.call(Method::PATCH, &path, Some(json!({"destination": right}))).await;
    assert_eq!(status, 200);
    settles(&server, &app, &msg, &ep, 0).await;
    let entries = fixture.read_all("orders").await;
    assert_eq!(entries.len(), 1);
    assert!(entries[0].verifies(&secret));
    let last = server.attempts(&app, &msg).await.pop().unwrap();
    assert_eq!(last["responseStatusCode"], 200, "{last}");
    let answer = last["response"].as_str().unwrap();
    assert!(answer.starts_with(&F::acknowledged("orders")), "the broker's answer is recorded: {last}");
}

/// A place that does not exist is `destination_missing` and a body over
/// `maxMessageBytes` is `message_too_large`: each dead-lettered after one attempt.
pub async fn a_missing_place_and_an_oversized_message_are_dead_lettered_at_once<F: Fixture>() {
    let fixture = F::start().await;
    let server = TestServer::start().await;
    let missing_app = server.create_app("missing").await;
    let nowhere = fixture.destination("nosuch", false).await;
    let (missing, _) = endpoint(&server, &missing_app, nowhere, json!({"delivery": never_breaking()})).await;
    let msg = server.send(&missing_app, json!({"eventType": "order.paid", "payload": {}})).await;
    settles(&server, &missing_app, &msg, &missing, 2).await;
    let tried = server.attempts(&missing_app, &msg).await;
    assert_eq!(tried.len(), 1, "permanent: not retried: {tried:?}");
    assert_eq!(tried[0]["errorClass"], "destination_missing", "{tried:?}");
    assert_eq!(fixture.count("nosuch").await, Some(0), "nothing was made");

    let small_app = server.create_app("small").await;
    let mut small = fixture.destination("orders", true).await;
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
    assert_eq!(fixture.read_all("orders").await.len(), 1, "only the message that fits");
}

/// The filter keeps a message out; the transform's body and headers are what is
/// published, signed.
pub async fn filters_and_transforms_apply_before_publishing<F: Fixture>() {
    let fixture = F::start().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let scripts = json!({
        "filter": ".payload.amount > 100",
        "transform": r#"{payload: {total: .payload.amount}, headers: (.headers + {"x-kind": .eventType})}"#,
        "headers": {"x-team": "blue"},
    });
    let (_, secret) = endpoint(&server, &app, fixture.destination("orders", true).await, scripts).await;
    server.send(&app, json!({"eventType": "order.paid", "payload": {"amount": 5}})).await;
    let kept = server.send(&app, json!({"eventType": "order.paid", "payload": {"amount": 150}})).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let entries = loop {
        let entries = fixture.read_all("orders").await;
        if !entries.is_empty() {
            break entries;
        }
        let tried = server.attempts(&app, &kept).await;
        assert!(tokio::time::Instant::now() < deadline, "the kept message is not at the broker: {tried:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // At least once: a retry whose first try's acknowledgement was lost is a second copy.
    let tried = server.attempts(&app, &kept).await;
    let ids: HashSet<&str> = entries.iter().map(|e| e.header("webhook-id")).collect();
    assert_eq!(ids, HashSet::from([kept.as_str()]), "the filter kept one message out: {entries:?} {tried:?}");
    assert!(entries.len() <= tried.len().max(1), "a copy per attempt at most: {entries:?} {tried:?}");
    for entry in &entries {
        assert_eq!(entry.json(), json!({"total": 150}), "{entries:?}");
        assert_eq!((entry.header("x-kind"), entry.header("x-team")), ("order.paid", "blue"), "{entries:?}");
        assert!(entry.verifies(&secret), "the signature covers the transformed body: {entries:?}");
    }
}

/// A stopped broker opens the endpoint's breaker (every failure `connection`); back, a
/// probe closes it and the waiting message is delivered.
pub async fn the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back<F: Fixture>() {
    let mut fixture = F::start().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let destination = fixture.destination("orders", true).await;
    let patient = json!({"retry": {"strategy": "exponential", "baseMs": 100, "maxDelayMs": 2000, "maxAttempts": 100},
                         "circuitBreaker": {"failureThreshold": 5, "cooldownMs": 300}});
    let (ep, _) = endpoint(&server, &app, destination, json!({"delivery": patient})).await;
    let first = send_many(&server, &app, 1).await.remove(0);
    eventually("the first message", || async { (fixture.count("orders").await? >= 1).then_some(()) }).await;
    // Stopped cleanly: a broker killed just after its queue was declared may lose the
    // declaration (RabbitMQ did on a loaded machine); the kill is the scenario above.
    fixture.broker().stop();
    let msg = server.send(&app, json!({"eventType": "order.paid", "payload": {}})).await;
    breaker(&server, &app, &ep, "open").await;
    let failed = server.attempts(&app, &msg).await;
    assert!(failed.iter().all(|a| a["errorClass"] == "connection"), "{failed:?}");
    fixture.broker().restart().unwrap();
    // A broker that restarts slowly (RabbitMQ under load) must not exhaust the message's
    // attempts; if it is not delivered, the last attempts say why.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while server.delivery_status(&app, &msg, &ep).await != Some(0) {
        let tried = server.attempts(&app, &msg).await;
        let last: Vec<&Value> = tried.iter().rev().take(3).collect();
        assert!(tokio::time::Instant::now() < deadline, "not delivered after the restart: {last:?}");
        assert_ne!(server.delivery_status(&app, &msg, &ep).await, Some(2), "given up: {last:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    breaker(&server, &app, &ep, "closed").await;
    // Both messages, and a second copy only of a retry whose first acknowledgement was lost.
    let entries = fixture.read_all("orders").await;
    let ids: HashSet<&str> = entries.iter().map(|e| e.header("webhook-id")).collect();
    assert_eq!(ids, HashSet::from([first.as_str(), msg.as_str()]));
    let mut seen = HashSet::new();
    let copies: Vec<&Consumed> = entries.iter().filter(|e| !seen.insert(e.header("webhook-id"))).collect();
    assert!(copies.iter().all(|c| c.header("herald-attempt") != "1"), "{copies:?}");
}

/// Over TLS with the endpoint's client certificate and CA (a broker that requires client
/// certificates), the message arrives and verifies; an endpoint that does not trust the
/// broker's CA fails as `tls`, publishing nothing.
pub async fn tls_with_a_client_certificate<F: Fixture>(fixture: &F, destination: Value, tls: &TlsSetup) {
    let server = TestServer::start().await;
    let app = server.create_app("tls").await;
    let (ep, secret) = endpoint(&server, &app, destination.clone(), json!({"tls": tls.endpoint_tls})).await;
    let msg = server.send(&app, json!({"eventType": "order.paid", "payload": {"over": "tls"}})).await;
    settles(&server, &app, &msg, &ep, 0).await;
    let entries = fixture.read_all("orders").await;
    assert_eq!(entries.len(), 1);
    assert!(entries[0].verifies(&secret));

    let untrusting = server.create_app("untrusting").await;
    let (_, _) = endpoint(&server, &untrusting, destination, json!({"delivery": never_breaking()})).await;
    let refused = server.send(&untrusting, json!({"eventType": "order.paid", "payload": {}})).await;
    let tried = attempts(&server, &untrusting, &refused, 1).await;
    assert_eq!(tried[0]["errorClass"], "tls", "{tried:?}");
    assert_eq!(fixture.read_all("orders").await.len(), 1, "nothing more was published");
}
