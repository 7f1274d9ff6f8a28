//! Svix pagination on every list: `iterator` and `prevIterator` on every non-empty page,
//! `-<id>` paging backwards in display order, `done` for the direction asked, 422 for a
//! malformed iterator, and Svix's default orders.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::{event_type, problem};
use crate::support::{Receiver, TestServer, eventually};

/// The ids of a page.
fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().or(i["name"].as_str()).unwrap().to_owned())
        .collect()
}

/// Walks a list forward with `iterator`, then back with `prevIterator`: both must end, see
/// every item once, and keep the display order.
async fn walk_both_ways(server: &TestServer, list: &str, expected: &[String]) {
    let separator = if list.contains('?') { '&' } else { '?' };
    let (mut forward, mut pages) = (vec![], vec![]);
    let mut next = format!("{list}{separator}limit=2");
    loop {
        let (status, page) = server.get(&next).await;
        assert_eq!(status, StatusCode::OK, "{next}: {page}");
        let items = ids(&page);
        assert_eq!(page["iterator"], json!(items.last().unwrap()), "{next}: iterator is the last id");
        assert_eq!(page["prevIterator"], json!(format!("-{}", items[0])), "{next}: prevIterator is -first");
        forward.extend(items);
        pages.push(page.clone());
        if page["done"] == true {
            break;
        }
        next = format!("{list}{separator}limit=2&iterator={}", page["iterator"].as_str().unwrap());
    }
    assert_eq!(forward, expected, "{list}: forward, each once");
    // Back from the last page, with prevIterator, to the first.
    let mut backward: Vec<Vec<String>> = vec![ids(pages.last().unwrap())];
    let mut prev = pages.last().unwrap()["prevIterator"].as_str().unwrap().to_owned();
    for _ in 0..expected.len() {
        let (_, page) = server.get(&format!("{list}{separator}limit=2&iterator={prev}")).await;
        backward.push(ids(&page));
        if page["done"] == true {
            break;
        }
        prev = page["prevIterator"].as_str().unwrap().to_owned();
    }
    backward.reverse();
    assert_eq!(backward.concat(), *expected, "{list}: backward pages keep the display order and end");
}

#[tokio::test]
async fn every_list_pages_both_ways_and_terminates() {
    let server = TestServer::start().await;
    let mut apps = vec![];
    for i in 0..5 {
        apps.push(server.create_app(&format!("app {i}")).await);
    }
    walk_both_ways(&server, "/api/v1/app", &apps).await;
    let app = &apps[0];
    let mut endpoints = vec![];
    for i in 0..5 {
        let ep = server.create_endpoint(app, &format!("https://hooks{i}.example.com/"), json!({})).await;
        endpoints.push(ep["id"].as_str().unwrap().to_owned());
    }
    endpoints.reverse();
    walk_both_ways(&server, &format!("/api/v1/app/{app}/endpoint"), &endpoints).await;
    let mut messages = vec![];
    for i in 0..5 {
        messages.push(server.send(app, json!({"eventType": "a", "payload": {"i": i}})).await);
    }
    messages.reverse();
    walk_both_ways(&server, &format!("/api/v1/app/{app}/msg"), &messages).await;
    for name in ["e.c", "e.a", "e.e", "e.b", "e.d"] {
        event_type(&server, name).await;
    }
    let names: Vec<String> = ["e.a", "e.b", "e.c", "e.d", "e.e"].map(str::to_owned).to_vec();
    walk_both_ways(&server, "/api/v1/event-type", &names).await;
}

#[tokio::test]
async fn default_orders_are_svix_ones_and_order_applies_where_svix_takes_it() {
    let server = TestServer::start().await;
    let (a, b) = (server.create_app("a").await, server.create_app("b").await);
    assert_eq!(ids(&server.get("/api/v1/app").await.1), [a.clone(), b.clone()], "applications oldest first");
    assert_eq!(ids(&server.get("/api/v1/app?order=descending").await.1), [b, a.clone()]);
    let one = server.create_endpoint(&a, "https://one.example.com/", json!({})).await;
    let two = server.create_endpoint(&a, "https://two.example.com/", json!({})).await;
    let list = format!("/api/v1/app/{a}/endpoint");
    let (one, two) = (one["id"].as_str().unwrap().to_owned(), two["id"].as_str().unwrap().to_owned());
    assert_eq!(ids(&server.get(&list).await.1), [two.clone(), one.clone()], "endpoints newest first");
    assert_eq!(ids(&server.get(&format!("{list}?order=ascending")).await.1), [one, two]);
    let (m1, m2) = (
        server.send(&a, json!({"eventType": "a", "payload": {}})).await,
        server.send(&a, json!({"eventType": "a", "payload": {}})).await,
    );
    let msgs = format!("/api/v1/app/{a}/msg");
    assert_eq!(ids(&server.get(&msgs).await.1), [m2.clone(), m1.clone()], "messages newest first");
    assert_eq!(ids(&server.get(&format!("{msgs}?order=ascending")).await.1), [m2, m1], "and only so, as in Svix");
}

#[tokio::test]
async fn empty_pages_malformed_iterators_and_limits_answer_as_svix() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let (status, empty) = server.get(&format!("/api/v1/app/{app}/endpoint")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((empty["iterator"].clone(), empty["done"].clone()), (Value::Null, json!(true)));
    assert!(empty.get("prevIterator").is_none(), "no prevIterator on an empty page: {empty}");
    for bad in ["garbage", "-garbage", "ep_short", "msg_0000000000000000000000"] {
        let (status, body) = server.get(&format!("/api/v1/app/{app}/endpoint?iterator={bad}")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
        assert_eq!(problem(&body).0, "query.iterator.__all__", "{bad}");
    }
    let (status, body) = server.get("/api/v1/app?limit=251").await;
    assert_eq!(
        (status, problem(&body).1),
        (StatusCode::UNPROCESSABLE_ENTITY, "Given limit must not exceed 250".to_owned())
    );
    let (status, body) = server.get("/api/v1/app?limit=many").await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("generic_error")));
}

/// Svix's time bounds: `before` leaves out what was made at that very instant, `after`
/// keeps it, on messages and on attempts, with or without a trailing slash.
#[tokio::test]
async fn before_excludes_its_own_instant_and_after_includes_it() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let ep = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let ep = ep["id"].as_str().unwrap();
    let mut messages = vec![];
    for i in 0..3 {
        messages.push(server.send(&app, json!({"eventType": "a", "payload": {"i": i}})).await);
        // Distinct milliseconds, so each item has an instant of its own.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    receiver.wait_for(Some("/hook"), 3).await;
    let attempts = eventually("three attempts", || async {
        let (_, page) = server.get(&format!("/api/v1/app/{app}/attempt/endpoint/{ep}")).await;
        (page["data"].as_array().unwrap().len() == 3).then_some(page)
    })
    .await;
    let (_, listed) = server.get(&format!("/api/v1/app/{app}/msg")).await;
    messages.reverse();
    assert_eq!(ids(&listed), messages, "newest first");
    let lists =
        [(format!("/api/v1/app/{app}/msg"), listed), (format!("/api/v1/app/{app}/attempt/endpoint/{ep}"), attempts)];
    for (list, page) in lists {
        // Newest first: [2], [1], [0].
        let all = ids(&page);
        let middle = page["data"][1]["timestamp"].as_str().unwrap();
        for slash in ["", "/"] {
            let at = |bound: &str| {
                let query = url::form_urlencoded::Serializer::new(String::new()).append_pair(bound, middle).finish();
                format!("{list}{slash}?{query}")
            };
            let (status, before) = server.get(&at("before")).await;
            assert_eq!(status, StatusCode::OK, "{before}");
            assert_eq!(ids(&before), all[2..], "{list}{slash} before the middle one's instant: the oldest alone");
            let (_, after) = server.get(&at("after")).await;
            assert_eq!(ids(&after), all[..2], "{list}{slash} after it: the middle one and the newest");
        }
    }
}
