//! The Svix-compatible API surface: CRUD, errors, limits, idempotency, the OpenAPI document.

use std::collections::BTreeSet;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::TestServer;

#[tokio::test]
async fn applications_are_found_by_id_or_uid_and_round_trip() {
    let server = TestServer::start().await;
    let (status, app) =
        server.post("/api/v1/app", json!({"name": "Acme", "uid": "acme", "metadata": {"tier": "gold"}})).await;
    assert_eq!(status, StatusCode::CREATED);
    let id = app["id"].as_str().unwrap();
    assert!(id.starts_with("app_"));
    assert_eq!(server.get(&format!("/api/v1/app/{id}")).await.1["uid"], "acme");
    assert_eq!(server.get("/api/v1/app/acme").await.1["id"], id);

    let (status, updated) = server.call(Method::PUT, "/api/v1/app/acme", Some(json!({"name": "Acme Inc"}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(updated["name"], "Acme Inc");
    assert_eq!(updated["uid"], "acme");
    let (status, created) = server.call(Method::PUT, "/api/v1/app/newco", Some(json!({"name": "NewCo"}))).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(created["uid"], "newco");

    let (status, patched) = server.call(Method::PATCH, "/api/v1/app/acme", Some(json!({"throttleRate": 10}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!((patched["name"].as_str(), patched["throttleRate"].as_i64()), (Some("Acme Inc"), Some(10)));

    let (status, again) = server.post("/api/v1/app?get_if_exists=true", json!({"name": "x", "uid": "acme"})).await;
    assert_eq!((status, again["id"].as_str()), (StatusCode::OK, Some(id)));
    let (status, _) = server.post("/api/v1/app", json!({"name": "x", "uid": "acme"})).await;
    assert_eq!(status, StatusCode::CONFLICT);

    let (status, _) = server.call(Method::DELETE, "/api/v1/app/acme", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(server.get("/api/v1/app/acme").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn lists_paginate_with_iterator_and_done() {
    let server = TestServer::start().await;
    let mut created = vec![];
    for i in 0..5 {
        created.push(server.create_app(&format!("app {i}")).await);
    }
    let mut seen = vec![];
    let mut iterator: Option<String> = None;
    loop {
        let path = match &iterator {
            Some(it) => format!("/api/v1/app?limit=2&iterator={it}"),
            None => "/api/v1/app?limit=2".to_owned(),
        };
        let (_, page) = server.get(&path).await;
        seen.extend(page["data"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_owned()));
        if page["done"].as_bool().unwrap() {
            break;
        }
        iterator = Some(page["iterator"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, created, "ascending by creation, each exactly once");
    let (_, newest) = server.get("/api/v1/app?limit=1&order=descending").await;
    assert_eq!(newest["data"][0]["id"], created[4].as_str());
    assert_eq!(server.get("/api/v1/app?limit=0").await.0, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn unknown_ids_and_routes_answer_404_with_an_error_body() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    for path in [
        "/api/v1/app/app_missing".to_owned(),
        format!("/api/v1/app/{app}/endpoint/ep_missing"),
        format!("/api/v1/app/{app}/msg/msg_missing"),
        format!("/api/v1/app/{app}/attempt/msg/msg_missing"),
        format!("/api/v1/app/{app}/endpoint/ep_missing/secret"),
        "/api/v1/event-type/no.such.type".to_owned(),
        "/api/v1/no-such-route".to_owned(),
    ] {
        let (status, body) = server.get(&path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body["code"], "not_found", "{path}: {body}");
        assert!(body["detail"].is_string(), "{path}: {body}");
    }
    let (status, _) = server.post("/api/v1/app/app_missing/msg", json!({"eventType": "a", "payload": {}})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn requests_without_a_valid_token_are_refused() {
    let server = TestServer::start().await;
    let client = reqwest::Client::new();
    let resp = client.get(server.url("/api/v1/app")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = client.get(server.url("/api/v1/app")).bearer_auth("wrong").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "authentication_failed");
    let resp = client.get(server.url("/api/v1/health")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT, "health needs no token");
}

fn locs(body: &Value) -> Vec<String> {
    body["detail"]
        .as_array()
        .unwrap_or_else(|| panic!("not a validation error: {body}"))
        .iter()
        .map(|item| item["loc"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect::<Vec<_>>().join("."))
        .collect()
}

#[tokio::test]
async fn invalid_input_gets_422_naming_the_field() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let endpoints = format!("/api/v1/app/{app}/endpoint");
    let cases = [
        (json!({"description": "no url"}), "body.url"),
        (json!({"url": "ftp://example.com/"}), "body.url"),
        (json!({"url": "http://10.0.0.1/hook"}), "body.url"),
        (json!({"url": "http://metadata.google.internal/hook"}), "body.url"),
        (json!({"url": "https://example.com/", "uid": "has space"}), "body.uid"),
        (json!({"url": "https://example.com/", "secret": "whsec_short"}), "body.secret"),
        (json!({"url": "https://example.com/", "channels": []}), "body.channels"),
        (json!({"url": "https://example.com/", "headers": {"webhook-id": "x"}}), "body.headers.webhook-id"),
        (json!({"url": "https://example.com/", "delivery": {"timeoutMs": 0}}), "body.delivery.timeoutMs"),
        (
            json!({"url": "https://example.com/", "delivery": {"retry": {"strategy": "fixed", "intervalMs": 10, "jitterMs": 20}}}),
            "body.delivery.retry.jitterMs",
        ),
        (
            json!({"url": "https://example.com/", "delivery": {"retry": {"strategy": "sometimes"}}}),
            "body.delivery.retry.strategy",
        ),
        (json!({"url": "https://example.com/", "delivery": {"timeoutMS": 5}}), "body.delivery.timeoutMS"),
        (json!({"url": "https://example.com/", "delivery": {"retryOn": "never"}}), "body.delivery.retryOn"),
    ];
    for (body, field) in cases {
        let (status, answer) = server.post(&endpoints, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {answer}");
        assert!(locs(&answer).iter().any(|l| l == field), "{body}: wanted {field}, got {answer}");
    }
    let msgs = format!("/api/v1/app/{app}/msg");
    for (body, field) in [
        (json!({"payload": {}}), "body.eventType"),
        (json!({"eventType": "bad type!", "payload": {}}), "body.eventType"),
        (json!({"eventType": "a", "payload": [1, 2]}), "body.payload"),
        (json!({"eventType": "a", "payload": {}, "channels": ["1", "2", "3", "4", "5", "6"]}), "body.channels"),
    ] {
        let (status, answer) = server.post(&msgs, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {answer}");
        assert!(locs(&answer).iter().any(|l| l == field), "{body}: wanted {field}, got {answer}");
    }
    let resp = server.request_as_admin(Method::POST, &msgs).body("{not json").send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn oversized_payloads_get_413_with_a_clear_error() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let big = "x".repeat(256 * 1024);
    let (status, body) =
        server.post(&format!("/api/v1/app/{app}/msg"), json!({"eventType": "a", "payload": {"blob": big}})).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["code"], "payload_too_large");
    assert!(body["detail"].as_str().unwrap().contains("262144"), "{body}");
    let fits = "x".repeat(200 * 1024);
    let (status, _) =
        server.post(&format!("/api/v1/app/{app}/msg"), json!({"eventType": "a", "payload": {"blob": fits}})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
}

#[tokio::test]
async fn the_payload_limit_is_configurable() {
    let server = TestServer::start_with(|c| c.server.max_payload_bytes = 1000).await;
    let app = server.create_app("a").await;
    let (status, _) = server
        .post(&format!("/api/v1/app/{app}/msg"), json!({"eventType": "a", "payload": {"blob": "y".repeat(1000)}}))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn an_idempotency_key_returns_the_first_response() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let path = format!("/api/v1/app/{app}/msg");
    let body = json!({"eventType": "order.created", "payload": {"n": 1}});
    let send = |body: Value| {
        server.request_as_admin(Method::POST, &path).header("idempotency-key", "key-1").json(&body).send()
    };
    let first: Value = send(body.clone()).await.unwrap().json().await.unwrap();
    let again = send(body.clone()).await.unwrap();
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    let again: Value = again.json().await.unwrap();
    assert_eq!(first, again);
    let (_, list) = server.get(&path).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "only one message was created");
    // As Svix: the same key with another (even invalid) body replays the first answer.
    for other in [json!({"eventType": "order.created", "payload": {"n": 2}}), json!({"no": "event type"})] {
        let different = send(other).await.unwrap();
        assert_eq!(different.status(), StatusCode::ACCEPTED);
        assert_eq!(different.json::<Value>().await.unwrap(), first);
    }
    // Under another URI the key is another key.
    let other_uri = server
        .request_as_admin(Method::POST, &format!("{path}?with_content=false"))
        .header("idempotency-key", "key-1")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_ne!(other_uri.json::<Value>().await.unwrap()["id"], first["id"]);

    // Other POSTs too: creating an application twice with one key creates it once.
    let create = || {
        server
            .request_as_admin(Method::POST, "/api/v1/app")
            .header("idempotency-key", "app-key")
            .json(&json!({"name": "b"}))
            .send()
    };
    let one: Value = create().await.unwrap().json().await.unwrap();
    let two: Value = create().await.unwrap().json().await.unwrap();
    assert_eq!(one["id"], two["id"]);
}

/// A message create keeps where its message is as the key's answer, not a copy: a replay
/// shows the message as it is now, so expunged content stays expunged, and a message that
/// is gone cannot be replayed.
#[tokio::test]
async fn a_replayed_message_answer_is_the_message_as_it_is_now() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let path = format!("/api/v1/app/{app}/msg");
    let send = |key: &'static str| {
        server
            .request_as_admin(Method::POST, &path)
            .header("idempotency-key", key)
            .json(&json!({"eventType": "a", "payload": {"secret": "expunge-me-7f3a"}}))
            .send()
    };
    let first: Value = send("k").await.unwrap().json().await.unwrap();
    assert_eq!(first["payload"]["secret"], "expunge-me-7f3a");
    let msg = first["id"].as_str().unwrap();
    let (status, _) = server.call(Method::DELETE, &format!("{path}/{msg}/content"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let again = send("k").await.unwrap();
    assert_eq!(again.status(), StatusCode::ACCEPTED);
    let again: Value = again.json().await.unwrap();
    assert_eq!((&again["id"], &again["timestamp"]), (&first["id"], &first["timestamp"]));
    assert_eq!(again["payload"], json!({"expired": true}), "the expunged payload is not replayed: {again}");
    assert_eq!(again["payloadExpunged"], true);
    let (_, read) = server.get(&format!("{path}/{msg}")).await;
    assert_eq!(again["payload"], read["payload"], "a replay reads as the message does");

    // The application (and with it the message) deleted, then made again under the same
    // id: the key's message is gone, and the replay says so instead of making another.
    let uid = "idem-app";
    let (status, _) = server.post("/api/v1/app", json!({"name": "b", "uid": uid})).await;
    assert_eq!(status, StatusCode::CREATED);
    let path = format!("/api/v1/app/{uid}/msg");
    let send = || {
        server
            .request_as_admin(Method::POST, &path)
            .header("idempotency-key", "gone")
            .json(&json!({"eventType": "a", "payload": {}}))
            .send()
    };
    assert_eq!(send().await.unwrap().status(), StatusCode::ACCEPTED);
    let (status, _) = server.call(Method::DELETE, &format!("/api/v1/app/{uid}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = server.post("/api/v1/app", json!({"name": "b", "uid": uid})).await;
    assert_eq!(status, StatusCode::CREATED);
    let replay = send().await.unwrap();
    assert_eq!(replay.status(), StatusCode::NOT_FOUND);
    let detail: Value = replay.json().await.unwrap();
    assert!(detail["detail"].as_str().unwrap().contains("idempotency key"), "{detail}");
    let (_, list) = server.get(&path).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 0, "no message was made again");
}

#[tokio::test]
async fn concurrent_requests_with_one_idempotency_key_create_one_message() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let path = format!("/api/v1/app/{app}/msg");
    let sends = (0..20).map(|_| {
        server
            .request_as_admin(Method::POST, &path)
            .header("idempotency-key", "same")
            .json(&json!({"eventType": "a", "payload": {"k": "v"}}))
            .send()
    });
    let answers = futures_util::future::join_all(sends).await;
    let ids: BTreeSet<String> = futures_util::future::join_all(answers.into_iter().map(|r| async {
        let r = r.unwrap();
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
    }))
    .await
    .into_iter()
    .collect();
    assert_eq!(ids.len(), 1);
}

#[tokio::test]
async fn a_repeated_event_id_is_a_conflict() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let path = format!("/api/v1/app/{app}/msg");
    server.send(&app, json!({"eventType": "a", "eventId": "evt-1", "payload": {}})).await;
    let (status, body) = server.post(&path, json!({"eventType": "a", "eventId": "evt-1", "payload": {}})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // The message can be read back by its eventId, as Svix allows.
    let (status, found) = server.get(&format!("{path}/evt-1")).await;
    assert_eq!((status, found["eventId"].as_str()), (StatusCode::OK, Some("evt-1")));
}

#[tokio::test]
async fn event_types_are_created_updated_archived_and_listed() {
    let server = TestServer::start().await;
    let (status, _) = server.post("/api/v1/event-type", json!({"name": "invoice.paid", "description": "Paid"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = server.post("/api/v1/event-type", json!({"name": "invoice.paid", "description": "Again"})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, put) =
        server.call(Method::PUT, "/api/v1/event-type/invoice.failed", Some(json!({"description": "Failed"}))).await;
    assert_eq!((status, put["name"].as_str()), (StatusCode::CREATED, Some("invoice.failed")));
    let (status, patched) =
        server.call(Method::PATCH, "/api/v1/event-type/invoice.paid", Some(json!({"deprecated": true}))).await;
    assert_eq!((status, patched["deprecated"].as_bool()), (StatusCode::OK, Some(true)));
    assert_eq!(server.call(Method::DELETE, "/api/v1/event-type/invoice.failed", None).await.0, StatusCode::NO_CONTENT);
    let (_, list) = server.get("/api/v1/event-type").await;
    let names: Vec<&str> = list["data"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["invoice.paid"], "archived types are hidden by default");
    let (_, all) = server.get("/api/v1/event-type?include_archived=true").await;
    assert_eq!(all["data"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn a_portal_token_reaches_only_its_own_application() {
    let server = TestServer::start().await;
    let mine = server.create_app("mine").await;
    let other = server.create_app("other").await;
    let (status, access) = server.post(&format!("/api/v1/auth/app-portal-access/{mine}"), json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let token = access["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("appsk_"));
    let client = reqwest::Client::new();
    let get = |path: String| client.get(server.url(&path)).bearer_auth(&token).send();
    assert_eq!(get(format!("/api/v1/app/{mine}")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(get(format!("/api/v1/app/{other}")).await.unwrap().status(), StatusCode::NOT_FOUND);
    assert_eq!(get(format!("/api/v1/app/{other}/endpoint")).await.unwrap().status(), StatusCode::NOT_FOUND);
    // As in Svix, listing applications is the operator's.
    assert_eq!(get("/api/v1/app".into()).await.unwrap().status(), StatusCode::FORBIDDEN);
    assert_eq!(get("/api/v1/app/".into()).await.unwrap().status(), StatusCode::FORBIDDEN);
    let logout = client.post(server.url("/api/v1/auth/logout")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(logout.status(), StatusCode::NO_CONTENT);
    assert_eq!(get(format!("/api/v1/app/{mine}")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_openapi_document_covers_every_svix_operation() {
    let server = TestServer::start().await;
    let (status, ours) = server.get("/api/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let svix: Value = serde_json::from_str(include_str!("../../../../contracts/svix-openapi.json")).unwrap();
    let operations = |doc: &Value| -> BTreeSet<String> {
        doc["paths"]
            .as_object()
            .unwrap()
            .iter()
            .flat_map(|(path, ops)| {
                ops.as_object()
                    .unwrap()
                    .keys()
                    .filter(|m| m.as_str() != "parameters")
                    .map(move |m| format!("{} {path}", m.to_uppercase()))
            })
            .collect()
    };
    let wanted = operations(&svix);
    assert_eq!(wanted.len(), 43);
    let present = operations(&ours);
    let missing: Vec<_> = wanted.difference(&present).collect();
    assert!(missing.is_empty(), "operations missing from Herald's document: {missing:?}");
    assert!(
        ours["components"]["schemas"]["EndpointOut"]["properties"]["delivery"].is_object(),
        "extensions documented"
    );
    // Issue 20's extensions: filters, transforms, credentials (Basic or OAuth2), client
    // certificates, and what reads show of them.
    let schemas = &ours["components"]["schemas"];
    for field in ["filter", "transform", "auth", "tls"] {
        assert!(schemas["EndpointIn"]["properties"][field].is_object(), "EndpointIn.{field}");
        assert!(schemas["EndpointOut"]["properties"][field].is_object(), "EndpointOut.{field}");
    }
    let text = schemas.to_string();
    for name in
        ["tokenUrl", "clientSecret", "clientAuthMethod", "clientCertificatePem", "clientKeyPem", "caPem", "expiresAt"]
    {
        assert!(text.contains(&format!("\"{name}\"")), "{name} documented");
    }
    assert!(ours["paths"]["/api/v1/app/{app_id}/endpoint/{endpoint_id}/transformation/simulate"]["post"].is_object());
}
