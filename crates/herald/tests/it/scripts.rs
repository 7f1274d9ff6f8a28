//! Endpoint filters and transforms (jq) end to end: a filter decides at ingest and a
//! filtered-out endpoint gets no delivery at all; a transform rewrites body, headers,
//! method and path, and the signature covers what is sent; `null` skips; runaway
//! expressions (endless, memory-eating) fail their own delivery as `transform_error` and
//! nothing else; bad expressions are refused with their position; the simulate call shows
//! what would be sent without credentials; scripts never see credentials or Herald's
//! environment.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::receiver::Received;
use crate::support::server::Storage;
use crate::support::{Receiver, TestServer, eventually, verifies};

fn body_of(request: &Received) -> Value {
    serde_json::from_slice(&request.body).unwrap()
}

#[tokio::test]
async fn a_filter_decides_at_ingest_and_a_filtered_out_endpoint_gets_no_delivery() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let big = server
        .create_endpoint(
            &app,
            &receiver.url("/big"),
            json!({"filter": ".payload.amount > 100 and (.channels | index(\"eu\"))"}),
        )
        .await;
    assert_eq!(big["filter"], ".payload.amount > 100 and (.channels | index(\"eu\"))");
    let all = server.create_endpoint(&app, &receiver.url("/all"), json!({})).await;
    // Fails on every message here (`.amount` of a number): a failing filter is a "no".
    let failing = server.create_endpoint(&app, &receiver.url("/failing"), json!({"filter": ".payload.amount.x"})).await;
    assert!(all.get("filter").is_none(), "no filter, no field: {all}");

    let small =
        server.send(&app, json!({"eventType": "order.paid", "payload": {"amount": 50}, "channels": ["eu"]})).await;
    let large =
        server.send(&app, json!({"eventType": "order.paid", "payload": {"amount": 150}, "channels": ["eu"]})).await;
    let elsewhere =
        server.send(&app, json!({"eventType": "order.paid", "payload": {"amount": 150}, "channels": ["us"]})).await;
    // No delivery row at all for the filtered-out endpoint (`/failing` never gets one
    // either); once every delivery there is has succeeded, nothing more can be sent.
    for (msg, expected) in [(&small, 1), (&large, 2), (&elsewhere, 1)] {
        let statuses = eventually("every delivery of the message to succeed", || async {
            let (_, list) = server.get(&format!("/api/v1/app/{app}/msg/{msg}/endpoint")).await;
            let statuses: Vec<i64> = list["data"].as_array()?.iter().filter_map(|d| d["status"].as_i64()).collect();
            statuses.iter().all(|s| *s == 0).then_some(statuses)
        })
        .await;
        assert_eq!(statuses.len(), expected, "{msg}: {statuses:?}");
    }
    assert_eq!(server.delivery_status(&app, &small, big["id"].as_str().unwrap()).await, None);
    assert_eq!(receiver.requests_to("/all").len(), 3);
    let big_got = receiver.requests_to("/big");
    assert_eq!(big_got.len(), 1, "{big_got:?}");
    assert_eq!(big_got[0].header("webhook-id"), large);

    // Asked, the message says which filter kept it from which endpoint, and why.
    assert!(receiver.requests_to("/failing").is_empty(), "a failing filter lets nothing through");
    let (status, filtered) = server.get(&format!("/api/v1/app/{app}/msg/{small}/filtered")).await;
    assert_eq!(status, StatusCode::OK, "{filtered}");
    let reasons: std::collections::HashMap<String, String> = filtered["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["endpointId"].as_str().unwrap().to_owned(), f["reason"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(reasons.len(), 2, "{filtered}");
    assert_eq!(reasons[big["id"].as_str().unwrap()], "the filter yielded false");
    assert!(reasons[failing["id"].as_str().unwrap()].starts_with("the filter failed: "), "{filtered}");
    let (_, filtered) = server.get(&format!("/api/v1/app/{app}/msg/{large}/filtered")).await;
    assert_eq!(filtered["data"].as_array().unwrap().len(), 1, "only the failing filter kept it out: {filtered}");
}

#[tokio::test]
async fn bad_expressions_are_refused_with_their_position_and_null_removes_them() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    let (status, body) = server.post(&path, json!({"url": "https://example.com/h", "filter": ".a |\n  | .b"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "filter"]), "{body}");
    let msg = body["detail"][0]["msg"].as_str().unwrap();
    assert!(msg.starts_with("line 2, column 3: expected"), "{msg}");

    let (status, body) =
        server.post(&path, json!({"url": "https://example.com/h", "transform": "{payload: nosuch(.x)}"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let msg = body["detail"][0]["msg"].as_str().unwrap();
    assert!(msg.starts_with("line 1, column 11: undefined") && msg.contains("nosuch"), "{msg}");

    let postback = json!({"url": "https://example.com/h", "transform": ".", "request": {"method": "GET"}});
    let (status, body) = server.post(&path, postback).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "transform"]), "{body}");

    let endpoint =
        server.create_endpoint(&app, "https://example.com/h", json!({"filter": ".payload.ok", "transform": "."})).await;
    let id = endpoint["id"].as_str().unwrap();
    let (status, patched) =
        server.call(Method::PATCH, &format!("{path}/{id}"), Some(json!({"filter": null, "description": "d"}))).await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert!(patched.get("filter").is_none(), "{patched}");
    assert_eq!(patched["transform"], ".", "a patch keeps what it does not name");
    let (status, body) = server.call(Method::PATCH, &format!("{path}/{id}"), Some(json!({"transform": "("}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (_, read) = server.get(&format!("{path}/{id}")).await;
    assert_eq!(read["transform"], ".", "a refused patch changes nothing");
}

#[tokio::test]
async fn a_transform_rewrites_the_request_and_the_signature_covers_what_is_sent() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let transform = r#"{
        payload: {kind: .eventType, total: (.payload.items | map(.price) | add)},
        headers: (.headers + {"x-kind": .eventType}),
        method: "PUT",
        url: (.url + "/v2?source=herald")
    }"#;
    let extra = json!({"transform": transform, "headers": {"x-team": "blue", "authorization": "Bearer s3cret"}});
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), extra).await;
    let secret = server.secret(&app, endpoint["id"].as_str().unwrap()).await;
    let msg =
        server.send(&app, json!({"eventType": "order.paid", "payload": {"items": [{"price": 2}, {"price": 3}]}})).await;
    let got = receiver.wait_for(None, 1).await;
    let request = &got[0];
    assert_eq!(request.method, "PUT");
    assert_eq!(request.path, "/hook/v2");
    assert_eq!(request.query.as_deref(), Some("source=herald"));
    assert_eq!(body_of(request), json!({"kind": "order.paid", "total": 5}));
    assert_eq!(request.header("x-kind"), "order.paid");
    assert_eq!(request.header("x-team"), "blue");
    assert_eq!(request.header("authorization"), "Bearer s3cret", "credentials go on as set");
    assert_eq!(request.header("webhook-id"), msg);
    assert_eq!(request.header("content-type"), "application/json");
    assert!(verifies(&secret, request), "the signature covers the transformed body");
    let attempt =
        eventually("the attempt to be recorded", || async { server.attempts(&app, &msg).await.into_iter().next() })
            .await;
    assert_eq!(attempt["url"], receiver.url("/hook/v2?source=herald"), "the attempt records where it went");
}

#[tokio::test]
async fn scripts_never_see_credentials_or_heralds_environment() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let extra = json!({
        "transform": "{payload: {headers: .headers, env: env}}",
        "headers": {"x-team": "blue", "authorization": "Bearer s3cret", "x-api-token": "t0k3n"},
    });
    server.create_endpoint(&app, &receiver.url("/hook"), extra).await;
    server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let got = receiver.wait_for(None, 1).await;
    assert_eq!(body_of(&got[0]), json!({"headers": {"x-team": "blue"}, "env": {}}));
    assert_eq!(got[0].header("x-api-token"), "t0k3n");
}

#[tokio::test]
async fn a_transform_returning_null_skips_the_delivery_and_records_why() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let endpoint = server
        .create_endpoint(&app, &receiver.url("/hook"), json!({"transform": "if .payload.test then null else . end"}))
        .await;
    let skipped = server.send(&app, json!({"eventType": "e", "payload": {"test": true}})).await;
    let sent = server.send(&app, json!({"eventType": "e", "payload": {"test": false}})).await;
    let got = receiver.wait_for(None, 1).await;
    assert_eq!(got[0].header("webhook-id"), sent);
    let attempt =
        eventually("the skip to be recorded", || async { server.attempts(&app, &skipped).await.into_iter().next() })
            .await;
    assert_eq!(attempt["errorClass"], "skipped", "{attempt}");
    assert_eq!(attempt["responseStatusCode"], 0);
    // Both deliveries are final (the skip is not retried), so nothing more can be sent.
    let endpoint_id = endpoint["id"].as_str().unwrap();
    eventually("both deliveries to be final", || async {
        let statuses = (
            server.delivery_status(&app, &skipped, endpoint_id).await,
            server.delivery_status(&app, &sent, endpoint_id).await,
        );
        (statuses == (Some(2), Some(0))).then_some(())
    })
    .await;
    assert_eq!(server.attempts(&app, &skipped).await.len(), 1, "the skip is its only attempt");
    assert_eq!(receiver.requests().len(), 1, "the skipped message is never sent");
    let (_, stats) =
        server.get(&format!("/api/v1/app/{app}/endpoint/{}/stats", endpoint["id"].as_str().unwrap())).await;
    assert_eq!(
        (stats["fail"].as_u64(), stats["canceled"].as_u64()),
        (Some(0), Some(1)),
        "a skip is not a failure: {stats}"
    );
}

#[tokio::test]
async fn runaway_transforms_fail_their_own_delivery_and_nothing_else() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start_with(|c| c.scripts.timeout = Duration::from_millis(200)).await;
    let app = server.create_app("shop").await;
    let mut runaway = Vec::new();
    for (path, code) in [
        ("/endless", "last(range(1e15))"),
        ("/hungry", "[range(1e10)] | length"),
        ("/deep", "def f: [f]; f"),
        ("/failing", "error(\"no such customer\")"),
        ("/quoting", ".payload.card.number.digits"),
    ] {
        let endpoint = server.create_endpoint(&app, &receiver.url(path), json!({"transform": code})).await;
        runaway.push((path, endpoint["id"].as_str().unwrap().to_owned()));
    }
    server.create_endpoint(&app, &receiver.url("/plain"), json!({})).await;
    server.create_endpoint(&app, &receiver.url("/tidy"), json!({"transform": "{payload: {n: .payload.n}}"})).await;
    let card = json!({"number": "4242-canary"});
    let first = server.send(&app, json!({"eventType": "e", "payload": {"n": 1, "card": card}})).await;
    let second = server.send(&app, json!({"eventType": "e", "payload": {"n": 2, "card": card}})).await;
    receiver.wait_for(Some("/plain"), 2).await;
    let tidy = receiver.wait_for(Some("/tidy"), 2).await;
    assert!(tidy.iter().all(|r| body_of(r)["n"].is_number()), "the sandbox recovers after each crash");
    for msg in [&first, &second] {
        for (path, id) in &runaway {
            let status = eventually("the delivery to die", || async {
                server.delivery_status(&app, msg, id).await.filter(|s| *s == 2)
            })
            .await;
            assert_eq!(status, 2, "{path} is a dead letter");
        }
        let attempts = server.attempts(&app, msg).await;
        let classes: Vec<&str> = attempts
            .iter()
            .filter(|a| runaway.iter().any(|(_, id)| a["endpointId"] == id.as_str()))
            .map(|a| a["errorClass"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(classes, vec!["transform_error"; runaway.len()], "one attempt each, never retried: {attempts:?}");
        let failing = attempts.iter().find(|a| a["url"] == receiver.url("/failing")).unwrap();
        assert!(failing["error"].as_str().unwrap().contains("no such customer"), "{failing}");
        let quoting = attempts.iter().find(|a| a["url"] == receiver.url("/quoting")).unwrap();
        assert!(quoting["error"].as_str().unwrap().starts_with("cannot index a value"), "{quoting}");
        assert!(!json!(attempts).to_string().contains("4242-canary"), "no payload value in a reason");
    }
    for (path, _) in &runaway {
        assert!(receiver.requests_to(path).is_empty(), "{path} was never sent anything");
    }
}

#[tokio::test]
async fn the_simulation_shows_what_would_be_sent_and_hides_credentials() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let extra = json!({
        "filter": ".eventType | startswith(\"order.\")",
        "transform": "{payload: {total: .payload.amount}, headers: (.headers + {\"x-kind\": .eventType})}",
        "headers": {"x-team": "blue", "authorization": "Bearer s3cret"},
    });
    let endpoint = server.create_endpoint(&app, "https://hooks.example.com/in", extra).await;
    let path = format!("/api/v1/app/{app}/endpoint/{}/transformation/simulate", endpoint["id"].as_str().unwrap());
    let (status, out) = server.post(&path, json!({"eventType": "order.paid", "payload": {"amount": 7}})).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["passedFilter"], true);
    assert_eq!(out["skipped"], false);
    assert_eq!(out["method"], "POST");
    assert_eq!(out["url"], "https://hooks.example.com/in");
    assert_eq!(out["body"], r#"{"total":7}"#);
    assert_eq!(out["headers"]["x-kind"], "order.paid");
    assert_eq!(out["headers"]["x-team"], "blue");
    assert_eq!(out["headers"]["authorization"], "<sensitive>");
    assert!(out["headers"]["webhook-signature"].as_str().unwrap().starts_with("v1,"));
    assert!(!out.to_string().contains("s3cret"));

    let (_, out) = server.post(&path, json!({"eventType": "user.created", "payload": {}})).await;
    assert_eq!(out["passedFilter"], false, "{out}");
    assert_eq!(out["reason"], "the filter yielded false");
    assert!(out.get("body").is_none());

    // The endpoint's owner may try it too.
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let token = access["token"].as_str().unwrap();
    let answer = server
        .request_as(token, Method::POST, &path)
        .json(&json!({"eventType": "order.paid", "payload": {"amount": 1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_endpoints_owner_sets_its_own_filter_and_transform() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let endpoint = server.create_endpoint(&app, "https://hooks.example.com/in", json!({})).await;
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let token = access["token"].as_str().unwrap();
    let path = format!("/api/v1/app/{app}/endpoint/{}", endpoint["id"].as_str().unwrap());
    let patch = |body: Value| server.request_as(token, Method::PATCH, &path).json(&body).send();
    let answer = patch(json!({"filter": ".payload.vip", "transform": "{payload: .payload.order}"})).await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let (_, read) = server.get(&path).await;
    assert_eq!(
        (read["filter"].as_str(), read["transform"].as_str()),
        (Some(".payload.vip"), Some("{payload: .payload.order}"))
    );
    let answer = patch(json!({"filter": "]"})).await.unwrap();
    assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn without_a_sandbox_nothing_is_routed_short_or_dead_lettered() {
    let receiver = Receiver::ok().await;
    let storage = Storage::new().await;
    // Expressions are compiled by the sandbox when they are set: set them while it runs.
    let server = TestServer::start_on(&storage, |_| {}).await;
    let app = server.create_app("shop").await;
    let filtered = server.create_endpoint(&app, &receiver.url("/f"), json!({"filter": ".payload.ok"})).await;
    server.post("/api/v1/event-type", json!({"name": "t", "description": "t"})).await;
    let transformed =
        server.create_endpoint(&app, &receiver.url("/t"), json!({"transform": ".", "filterTypes": ["t"]})).await;
    server.stop().await;

    let server =
        TestServer::start_on(&storage, |c| c.scripts.worker_program = Some("/nonexistent/herald".into())).await;
    let (status, body) =
        server.post(&format!("/api/v1/app/{app}/msg"), json!({"eventType": "e", "payload": {"ok": true}})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "refused, not routed without its filter: {body}");
    let path = format!("/api/v1/app/{app}/endpoint/{}", filtered["id"].as_str().unwrap());
    let (status, body) = server.call(Method::PATCH, &path, Some(json!({"filter": ".payload.ok == true"}))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "a new expression cannot be checked: {body}");
    let (status, _) = server.call(Method::PATCH, &path, Some(json!({"filter": null}))).await;
    assert_eq!(status, StatusCode::OK, "removing one needs no sandbox");

    let msg = server.send(&app, json!({"eventType": "t", "payload": {"ok": true}})).await;
    // The filtered endpoint (its filter removed) gets the message too: take the
    // transformed endpoint's attempt, whichever was made first.
    let attempt = eventually("an attempt", || async {
        server.attempts(&app, &msg).await.into_iter().find(|a| a["endpointId"] == transformed["id"])
    })
    .await;
    assert_eq!(attempt["errorClass"], "internal", "Herald's failure, not the transform's: {attempt}");
    let status = server.delivery_status(&app, &msg, transformed["id"].as_str().unwrap()).await;
    assert_eq!(status, Some(3), "still to be retried (Svix's \"sending\"), not a dead letter");
}
