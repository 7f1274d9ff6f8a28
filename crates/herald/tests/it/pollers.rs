//! Pollers (Herald extension): consumers that cannot receive webhooks pull an application's
//! messages. Each named consumer keeps its own position server side, which moves only when
//! it asks with the iterator it was given (a consumer that crashes before that reads the
//! page again), or seeks; a reader never skips a message that committed late.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::TestServer;
use crate::support::server::Storage;

async fn create_poller(server: &TestServer, app: &str, body: Value) -> String {
    let (status, poller) = server.post(&format!("/api/v1/app/{app}/poller"), body).await;
    assert_eq!(status, StatusCode::CREATED, "{poller}");
    poller["id"].as_str().unwrap().to_owned()
}

/// One page for `consumer`; `query` is the query string (`limit=…&iterator=…`).
async fn read(server: &TestServer, app: &str, poller: &str, consumer: &str, query: &str) -> Value {
    let (status, page) = server.get(&format!("/api/v1/app/{app}/poller/{poller}/consumer/{consumer}?{query}")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    page
}

fn ids(page: &Value) -> Vec<String> {
    page["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn two_consumers_read_independently_and_a_crash_before_acknowledging_reads_again() {
    let server = TestServer::start().await;
    let app = server.create_app("batch").await;
    let poller = create_poller(&server, &app, json!({"eventTypes": ["invoice.paid"]})).await;
    let mut paid = Vec::new();
    for n in 0..5 {
        paid.push(server.send(&app, json!({"eventType": "invoice.paid", "payload": {"n": n}})).await);
        server.send(&app, json!({"eventType": "invoice.created", "payload": {"n": n}})).await;
    }

    let a1 = read(&server, &app, &poller, "a", "limit=3").await;
    assert_eq!(ids(&a1), paid[..3], "in commit order, the poller's event type only");
    assert_eq!((a1["done"].as_bool(), a1["data"][1]["payload"].clone()), (Some(false), json!({"n": 1})));
    assert_eq!(a1["data"][0]["eventType"], "invoice.paid");
    let b = read(&server, &app, &poller, "b", "limit=10").await;
    assert_eq!((ids(&b), b["done"].as_bool()), (paid.clone(), Some(true)), "another consumer, from the start");

    // `a` crashed before asking for the next page: the same page again.
    assert_eq!(ids(&read(&server, &app, &poller, "a", "limit=3").await), paid[..3]);
    let it = a1["iterator"].as_str().unwrap();
    let a2 = read(&server, &app, &poller, "a", &format!("limit=3&iterator={it}")).await;
    assert_eq!((ids(&a2), a2["done"].as_bool()), (paid[3..].to_vec(), Some(true)));
    // Acknowledged up to the first page only: without an iterator, the second page again.
    assert_eq!(ids(&read(&server, &app, &poller, "a", "").await), paid[3..]);
    let it = a2["iterator"].as_str().unwrap().to_owned();
    assert!(ids(&read(&server, &app, &poller, "a", &format!("iterator={it}")).await).is_empty());
    let later = server.send(&app, json!({"eventType": "invoice.paid", "payload": {"n": 9}})).await;
    // An older iterator reads again from where it points, but never moves the position back.
    let first_it = a1["iterator"].as_str().unwrap();
    let again = read(&server, &app, &poller, "a", &format!("iterator={first_it}")).await;
    assert_eq!(ids(&again), [paid[3].clone(), paid[4].clone(), later.clone()]);
    assert_eq!(ids(&read(&server, &app, &poller, "a", "").await), std::slice::from_ref(&later), "where it left off");
    paid.push(later);
    assert_eq!(ids(&read(&server, &app, &poller, "b", "").await), paid, "b never acknowledged anything");
}

#[tokio::test]
async fn pollers_filter_like_endpoints_and_are_managed_like_them() {
    let server = TestServer::start().await;
    let app = server.create_app("batch").await;
    let body = json!({"uid": "eu-large", "channels": ["eu"], "filter": ".payload.amount > 100", "description": "d"});
    let poller = create_poller(&server, &app, body).await;
    for (channel, amount) in [("eu", 200), ("us", 200), ("eu", 50)] {
        server.send(&app, json!({"eventType": "e", "channels": [channel], "payload": {"amount": amount}})).await;
    }
    let page = read(&server, &app, "eu-large", "c", "").await;
    assert_eq!(page["data"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(
        (page["data"][0]["channels"].clone(), page["data"][0]["payload"].clone()),
        (json!(["eu"]), json!({"amount": 200}))
    );

    let path = format!("/api/v1/app/{app}/poller/{poller}");
    let (_, got) = server.get(&path).await;
    assert_eq!((got["uid"].as_str(), got["filter"].as_str()), (Some("eu-large"), Some(".payload.amount > 100")));
    let (status, patched) =
        server.call(Method::PATCH, &path, Some(json!({"filter": null, "description": "all eu"}))).await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert!(patched.get("filter").is_none() && patched["description"] == "all eu", "{patched}");
    let (_, listed) = server.get(&format!("/api/v1/app/{app}/poller")).await;
    assert_eq!(listed["data"][0]["id"], poller.as_str(), "{listed}");
    for (body, field) in [
        (json!({"filter": ".payload |"}), "filter"),
        (json!({"eventTypes": []}), "eventTypes"),
        (json!({"channels": ["no spaces"]}), "channels"),
    ] {
        let (status, answer) = server.post(&format!("/api/v1/app/{app}/poller"), body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert_eq!(answer["detail"][0]["loc"][1], field, "{answer}");
    }
    for query in ["limit=0", "limit=251", "iterator=nonsense"] {
        let (status, answer) = server.get(&format!("{path}/consumer/c?{query}")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{query}: {answer}");
    }
    let (status, _) = server.get(&format!("{path}/consumer/not%20a%20name")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = server.call(Method::DELETE, &path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(server.get(&path).await.0, StatusCode::NOT_FOUND);
    assert_eq!(server.get(&format!("{path}/consumer/c")).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_customer_reads_its_own_pollers_with_its_portal_token_only() {
    let server = TestServer::start().await;
    let (mine, theirs) = (server.create_app("mine").await, server.create_app("theirs").await);
    let their_poller = create_poller(&server, &theirs, json!({})).await;
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{mine}"), json!({})).await;
    let token = access["token"].as_str().unwrap();
    let created = server
        .request_as(token, Method::POST, &format!("/api/v1/app/{mine}/poller"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let own: Value = created.json().await.unwrap();
    server.send(&mine, json!({"eventType": "e", "payload": {"x": 1}})).await;
    let path = format!("/api/v1/app/{mine}/poller/{}/consumer/c", own["id"].as_str().unwrap());
    let page: Value = server.request_as(token, Method::GET, &path).send().await.unwrap().json().await.unwrap();
    assert_eq!(page["data"][0]["payload"], json!({"x": 1}));
    for path in [
        format!("/api/v1/app/{theirs}/poller/{their_poller}"),
        format!("/api/v1/app/{theirs}/poller/{their_poller}/consumer/c"),
        format!("/api/v1/app/{mine}/poller/{their_poller}/consumer/c"),
    ] {
        let answer = server.request_as(token, Method::GET, &path).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn seeking_moves_a_consumer_to_a_time_or_past_a_message_and_retention_says_where_to_resume() {
    let server = TestServer::start().await;
    let app = server.create_app("batch").await;
    let poller = create_poller(&server, &app, json!({})).await;
    let mut sent = Vec::new();
    for n in 0..4 {
        sent.push(server.send(&app, json!({"eventType": "e", "payload": {"n": n}})).await);
    }
    let seek = format!("/api/v1/app/{app}/poller/{poller}/consumer/c/seek");
    let (status, answer) = server.post(&seek, json!({"after": sent[1]})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer["iterator"].is_string());
    assert_eq!(ids(&read(&server, &app, &poller, "c", "").await), sent[2..], "past the message");
    let (_, _) = server.post(&seek, json!({"after": "2000-01-01T00:00:00Z"})).await;
    assert_eq!(ids(&read(&server, &app, &poller, "c", "").await), sent, "from a time before all");
    let (_, _) = server.post(&seek, json!({"after": "2999-01-01T00:00:00Z"})).await;
    assert!(ids(&read(&server, &app, &poller, "c", "").await).is_empty(), "from a time after all");
    let (status, _) = server.post(&seek, json!({"after": "yesterday"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // Past the retention window (payloads expunged): a 410 that says where to resume.
    for msg in &sent[..2] {
        let (status, _) = server.call(Method::DELETE, &format!("/api/v1/app/{app}/msg/{msg}/content"), None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    let (status, gone) = server.get(&format!("/api/v1/app/{app}/poller/{poller}/consumer/fresh")).await;
    assert_eq!(status, StatusCode::GONE, "{gone}");
    assert_eq!(gone["code"], "position_expired");
    let detail = gone["detail"].as_str().unwrap();
    let resume = detail.rsplit(' ').next().unwrap();
    assert_eq!(ids(&read(&server, &app, &poller, "fresh", &format!("iterator={resume}")).await), sent[2..]);
}

/// The classic gap of id-ordered polling: a transaction that started first but commits
/// last would land behind a reader that already read the later one. Two producers'
/// transactions through the outbox, the first committing last, read by consumers on two
/// Herald processes sharing the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_commits_late_is_never_skipped_across_processes() {
    let storage = Storage::postgres().await;
    let (first_process, second_process) =
        (TestServer::start_on(&storage, |_| {}).await, TestServer::start_on(&storage, |_| {}).await);
    let app = first_process.create_app("outbox").await;
    let poller = create_poller(&first_process, &app, json!({})).await;
    let url = storage.database_url.clone().unwrap();
    let connect = || async {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    };
    let (mut early, mut late) = (connect().await, connect().await);
    let send = "SELECT herald.send_message(app => $1, event_type => 'e', payload => $2::text::jsonb)";
    let slow = early.transaction().await.unwrap();
    let first: String = slow.query_one(send, &[&app, &json!({"n": 1}).to_string()]).await.unwrap().get(0);
    let quick = late.transaction().await.unwrap();
    let second: String = quick.query_one(send, &[&app, &json!({"n": 2}).to_string()]).await.unwrap().get(0);
    quick.commit().await.unwrap();

    // The second is committed, but the first may still commit before it in the log: the
    // reader is given nothing yet rather than a position past the first.
    let page = read(&first_process, &app, &poller, "c", "").await;
    assert!(ids(&page).is_empty(), "{page}");
    let it = page["iterator"].as_str().unwrap().to_owned();
    slow.commit().await.unwrap();
    let page = read(&second_process, &app, &poller, "c", &format!("iterator={it}")).await;
    assert_eq!(ids(&page), [first, second], "both, in commit-log order, on the other process");
    let it = page["iterator"].as_str().unwrap();
    assert!(ids(&read(&first_process, &app, &poller, "c", &format!("iterator={it}")).await).is_empty());
}

#[tokio::test]
async fn a_long_poll_answers_as_soon_as_a_message_arrives() {
    let server = TestServer::start().await;
    let app = server.create_app("batch").await;
    let poller = create_poller(&server, &app, json!({})).await;
    // Nothing arrives: an empty page once the wait is over.
    let empty = read(&server, &app, &poller, "c", "wait_ms=200").await;
    assert_eq!((ids(&empty).len(), empty["done"].as_bool()), (0, Some(true)));
    let (status, _) = server.get(&format!("/api/v1/app/{app}/poller/{poller}/consumer/c?wait_ms=30001")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    // A message sent while the consumer waits: answered long before the 30 s wait is over
    // (the margin only tells a wake-up from the timeout; how fast is BENCHMARKS.md's).
    let started = std::time::Instant::now();
    let waiting = read(&server, &app, &poller, "c", "wait_ms=30000");
    let sender = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        server.send(&app, json!({"eventType": "e", "payload": {"late": true}})).await
    };
    let (page, sent) = tokio::join!(waiting, sender);
    assert_eq!(ids(&page), [sent]);
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "woken, not timed out");
}

/// Sends `n` messages of `event_type`, several at a time (their order does not matter).
async fn send_many(server: &TestServer, app: &str, event_type: &str, n: usize) {
    use futures_util::StreamExt;
    futures_util::stream::iter(0..n)
        .map(|i| server.send(app, json!({"eventType": event_type, "payload": {"i": i}})))
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_looks_at_two_thousand_messages_at_most() {
    let server = TestServer::start().await;
    let app = server.create_app("busy").await;
    let poller = create_poller(&server, &app, json!({"eventTypes": ["rare"]})).await;
    send_many(&server, &app, "noise", 1999).await;
    let first = server.send(&app, json!({"eventType": "rare", "payload": {"n": 1}})).await;
    send_many(&server, &app, "noise", 2).await;
    let second = server.send(&app, json!({"eventType": "rare", "payload": {"n": 2}})).await;

    // The 2,000th message is the first match; the second lies beyond what one request reads.
    let page = read(&server, &app, &poller, "c", "limit=250").await;
    assert_eq!((ids(&page), page["done"].as_bool()), (vec![first], Some(false)));
    let it = page["iterator"].as_str().unwrap();
    let next = read(&server, &app, &poller, "c", &format!("limit=250&iterator={it}")).await;
    assert_eq!((ids(&next), next["done"].as_bool()), (vec![second], Some(true)));
}
