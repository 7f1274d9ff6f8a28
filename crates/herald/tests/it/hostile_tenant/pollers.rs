//! Attacks through pollers: long-polls by the hundred, a busy neighbour waking them, more
//! pollers and consumers than anyone needs, and reads meant to move a consumer by mistake.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Tenant, metric};
use crate::support::{TestServer, eventually};

async fn poller(server: &TestServer, tenant: &Tenant, body: Value) -> String {
    let (status, poller) = tenant.post(server, &tenant.path("/poller"), body).await;
    assert_eq!(status, StatusCode::CREATED, "{poller}");
    poller["id"].as_str().unwrap().to_owned()
}

/// `GET …/consumer/{consumer}?{query}` as `tenant`.
async fn read(server: &TestServer, tenant: &Tenant, poller: &str, consumer: &str, query: &str) -> (StatusCode, Value) {
    let path = tenant.path(&format!("/poller/{poller}/consumer/{consumer}?{query}"));
    tenant.call(server, Method::GET, &path, None).await
}

/// A message to `tenant`'s application (messages are the operator's to send).
async fn send(server: &TestServer, tenant: &Tenant, payload: Value) {
    server.send(&tenant.app, json!({"eventType": "e", "payload": payload})).await;
}

#[tokio::test]
async fn a_long_poll_wakes_for_its_own_application_only_and_reads_each_message_once() {
    let server = TestServer::start().await;
    let (mallory, alice) = (Tenant::new(&server, "mallory").await, Tenant::new(&server, "alice").await);
    let id = poller(&server, &mallory, json!({"filter": ".payload.wanted == true"})).await;
    for n in 0..200 {
        send(&server, &mallory, json!({"n": n})).await;
    }
    let exchanges = format!("herald_sandbox_exchanges_total{{app=\"{}\"}}", mallory.app);
    let waiting = tokio::spawn({
        let (url, token) =
            (server.url(&mallory.path(&format!("/poller/{id}/consumer/c?wait_ms=30000"))), mallory.token.clone());
        async move {
            reqwest::Client::new().get(url).bearer_auth(token).send().await.unwrap().json::<Value>().await.unwrap()
        }
    });
    // The filter's check when the poller was made, and one evaluation per message read.
    eventually("the long-poll to have read everything", || async {
        (metric(&server, &exchanges).await >= 201.0).then_some(())
    })
    .await;
    // A busy neighbour: its commits must not wake this long-poll (they used to, and each
    // wake-up ran the filter again over everything from the request's start).
    for n in 0..300 {
        send(&server, &alice, json!({"n": n})).await;
    }
    // Its own application's messages wake it, and only the new ones are read.
    for n in 0..5 {
        send(&server, &mallory, json!({"late": n})).await;
    }
    send(&server, &mallory, json!({"wanted": true})).await;
    let page = waiting.await.unwrap();
    assert_eq!(page["data"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["data"][0]["payload"], json!({"wanted": true}));
    assert_eq!(metric(&server, &exchanges).await, 207.0, "the check, then each of 206 messages exactly once");
}

#[tokio::test]
async fn waiting_long_polls_are_capped_per_token_and_per_application() {
    let server = TestServer::start_with(|c| {
        c.tenants.max_waiting_polls = 3;
        c.tenants.max_waiting_polls_per_token = 2;
    })
    .await;
    let mallory = Tenant::new(&server, "mallory").await;
    let second_token = Tenant { app: mallory.app.clone(), token: server.portal_token(&mallory.app).await };
    let id = poller(&server, &mallory, json!({})).await;
    let long_poll = |tenant: &Tenant, consumer: &str| {
        let path = tenant.path(&format!("/poller/{id}/consumer/{consumer}?wait_ms=30000"));
        let (url, token) = (server.url(&path), tenant.token.clone());
        tokio::spawn(async move { reqwest::Client::new().get(url).bearer_auth(token).send().await.unwrap().status() })
    };
    let waiting = format!("herald_long_polls_waiting{{app=\"{}\"}}", mallory.app);
    let held = [long_poll(&mallory, "a"), long_poll(&mallory, "b")];
    eventually("the token's two long-polls to be waiting", || async {
        (metric(&server, &waiting).await == 2.0).then_some(())
    })
    .await;
    // A third long-poll of the same token is refused at once, with when to come back.
    let path = mallory.path(&format!("/poller/{id}/consumer/c?wait_ms=1000"));
    let refused = server.request_as(&mallory.token, Method::GET, &path).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    // Another token of the application has its own two, within the application's three.
    let third = long_poll(&second_token, "d");
    eventually("the application's three long-polls to be waiting", || async {
        (metric(&server, &waiting).await == 3.0).then_some(())
    })
    .await;
    let (status, answer) = read(&server, &second_token, &id, "e", "wait_ms=1000").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
    assert!(answer["detail"].as_str().unwrap().contains("this application has the most"), "{answer}");
    // A client that hangs up gives its place back at once.
    third.abort();
    eventually("the hung-up long-poll's place to be free", || async {
        (metric(&server, &waiting).await == 2.0).then_some(())
    })
    .await;
    // A message answers the others; then there is room again.
    send(&server, &mallory, json!({})).await;
    for waiting in held {
        assert_eq!(waiting.await.unwrap(), StatusCode::OK);
    }
    let (status, page) = read(&server, &mallory, &id, "c", "wait_ms=1").await;
    assert_eq!((status, page["data"].as_array().map(Vec::len)), (StatusCode::OK, Some(1)));
}

#[tokio::test]
async fn pollers_and_consumers_are_capped_per_application_and_poller() {
    let server = TestServer::start_with(|c| {
        c.tenants.max_pollers = 2;
        c.tenants.max_consumers_per_poller = 2;
    })
    .await;
    let mallory = Tenant::new(&server, "mallory").await;
    let id = poller(&server, &mallory, json!({})).await;
    poller(&server, &mallory, json!({})).await;
    let (status, answer) = mallory.post(&server, &mallory.path("/poller"), json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(answer["detail"][0]["msg"].as_str().unwrap().contains("tenants.max_pollers"), "{answer}");
    send(&server, &mallory, json!({})).await;
    let (_, page) = read(&server, &mallory, &id, "a", "").await;
    let it = page["iterator"].as_str().unwrap().to_owned();
    for consumer in ["a", "b"] {
        let (status, answer) = read(&server, &mallory, &id, consumer, &format!("iterator={it}")).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let (status, answer) = read(&server, &mallory, &id, "c", &format!("iterator={it}")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "a third consumer: {answer}");
    assert_eq!(answer["detail"][0]["loc"], json!(["path", "consumer_id"]));
    let seek = mallory.path(&format!("/poller/{id}/consumer/d/seek"));
    let (status, _) = mallory.post(&server, &seek, json!({"after": "2020-01-01T00:00:00Z"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "nor by seeking");
    let (status, _) = read(&server, &mallory, &id, "c", "").await;
    assert_eq!(status, StatusCode::OK, "reading without acknowledging stores nothing, so it is not refused");
}

#[tokio::test]
async fn a_refused_read_moves_no_consumer() {
    let server = TestServer::start().await;
    let mallory = Tenant::new(&server, "mallory").await;
    let id = poller(&server, &mallory, json!({})).await;
    for n in 0..3 {
        send(&server, &mallory, json!({"n": n})).await;
    }
    let (_, first) = read(&server, &mallory, &id, "c", "limit=1").await;
    let it = first["iterator"].as_str().unwrap();
    for bad in
        [format!("iterator={it}&wait_ms=999999"), format!("iterator={it}&limit=0"), format!("iterator={it}&limit=251")]
    {
        let (status, answer) = read(&server, &mallory, &id, "c", &bad).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {answer}");
    }
    let (_, again) = read(&server, &mallory, &id, "c", "limit=1").await;
    assert_eq!(again["data"][0]["payload"], json!({"n": 0}), "still at the first page: nothing was acknowledged");
}
