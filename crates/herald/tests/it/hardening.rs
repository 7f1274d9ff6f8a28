//! API hardening: capped bodies and JSON depth, validated names and headers, per-token
//! rate limits, and server keys that seal endpoint secrets at rest.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::server::Storage;
use crate::support::{Receiver, TestServer};

#[tokio::test]
async fn oversized_and_deeply_nested_bodies_get_clear_4xx() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let huge = json!({"eventType": "big", "payload": {"blob": "x".repeat(2 << 20)}});
    let (status, body) = server.post(&format!("/api/v1/app/{app}/msg"), huge).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["code"], "payload_too_large");

    let mut deep = json!("bottom");
    for _ in 0..100 {
        deep = json!({"down": deep});
    }
    let (status, body) =
        server.post(&format!("/api/v1/app/{app}/msg"), json!({"eventType": "deep", "payload": deep})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("nested deeper"), "{body}");
}

#[tokio::test]
async fn names_and_endpoint_headers_are_validated() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    for name in ["with space", "line\r\nbreak", "semi;colon", ""] {
        let (status, _) =
            server.post(&format!("/api/v1/app/{app}/msg"), json!({"eventType": name, "payload": {}})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "event type {name:?}");
        let (status, _) = server.post("/api/v1/event-type", json!({"name": name, "description": "d"})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "event type {name:?}");
    }
    let hostile_headers = [
        json!({"X-Ok": "fine\r\nX-Injected: 1"}),
        json!({"Host": "internal.example"}),
        json!({"X-Forwarded-Host": "internal.example"}),
        json!({"Connection": "close"}),
        json!({"Transfer-Encoding": "chunked"}),
        json!({"Webhook-Signature": "v1,forged"}),
        json!({"Bad Name": "x"}),
        json!({"X-Long": "v".repeat(5000)}),
        Value::Object((0..51).map(|i| (format!("X-H{i}"), json!("v"))).collect()),
    ];
    for headers in hostile_headers {
        let endpoint = json!({"url": "https://hooks.example.com/", "headers": headers});
        let (status, body) = server.post(&format!("/api/v1/app/{app}/endpoint"), endpoint).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{headers}: {body}");
    }
}

#[tokio::test]
async fn each_token_has_its_own_request_budget() {
    let server = TestServer::start_with(|c| c.auth.portal_requests_per_second = Some(5)).await;
    let app = server.create_app("a").await;
    let token = || async {
        let (_, out) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
        out["token"].as_str().unwrap().to_owned()
    };
    let (first, second) = (token().await, token().await);
    let client = reqwest::Client::new();
    let list = |token: &str| client.get(server.url(&format!("/api/v1/app/{app}/endpoint"))).bearer_auth(token).send();
    for _ in 0..5 {
        assert_eq!(list(&first).await.unwrap().status(), StatusCode::OK);
    }
    let refused = list(&first).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "Retry-After: {wait}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "rate_limited");
    assert_eq!(list(&second).await.unwrap().status(), StatusCode::OK, "another token has its own budget");
    for _ in 0..20 {
        assert_eq!(server.get(&format!("/api/v1/app/{app}")).await.0, StatusCode::OK, "admin: unlimited by default");
    }
}

#[tokio::test]
async fn endpoint_secrets_are_sealed_at_rest_and_bound_to_their_row() {
    let receiver = Receiver::ok().await;
    let storage = Storage::new().await;
    let server = TestServer::start_on(&storage, |_| {}).await;
    let app = server.create_app("a").await;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let a = server.create_endpoint(&app, &receiver.url("/a"), json!({"secret": secret})).await;
    let b = server.create_endpoint(&app, &receiver.url("/b"), json!({})).await;
    let (a, b) = (a["id"].as_str().unwrap().to_owned(), b["id"].as_str().unwrap().to_owned());
    server.stop().await;

    let stored = stored_secrets(&storage).await;
    assert!(stored.values().all(|s| s.starts_with("v1.")), "{stored:?}");
    assert!(!stored[&a].contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "the secret is not stored in the clear");
    // A sealed value copied onto another endpoint's row does not open there.
    overwrite_secrets(&storage, &b, &stored[&a]).await;

    let server = TestServer::start_on(&storage, |_| {}).await;
    assert_eq!(server.secret(&app, &a).await, secret, "the right key opens it");
    let (status, _) = server.call(Method::GET, &format!("/api/v1/app/{app}/endpoint/{b}/secret"), None).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "the copy does not open on another row");
    server.stop().await;
    // Without the key the secrets cannot be read, and the API says so rather than guessing.
    let server = TestServer::start_on(&storage, |c| c.auth.secret_key = Some(herald::sealing::generate_key())).await;
    let (status, _) = server.call(Method::GET, &format!("/api/v1/app/{app}/endpoint/{a}/secret"), None).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn rotating_the_server_key_reseals_every_secret_so_the_old_key_can_go() {
    let storage = Storage::new().await;
    let (old, new) = (herald::sealing::generate_key(), herald::sealing::generate_key());
    let server = TestServer::start_on(&storage, |c| c.auth.secret_key = Some(old.clone())).await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, "https://hooks.example.com/", json!({})).await;
    let id = endpoint["id"].as_str().unwrap().to_owned();
    let secret = server.secret(&app, &id).await;
    server.stop().await;
    let before = stored_secrets(&storage).await[&id].clone();

    let server = TestServer::start_on(&storage, |c| {
        c.auth.secret_key = Some(new.clone());
        c.auth.previous_secret_keys = vec![old.clone()];
    })
    .await;
    crate::support::eventually("the secret is sealed under the new key", || async {
        let now = stored_secrets(&storage).await[&id].clone();
        (now.split('.').nth(1) != before.split('.').nth(1)).then_some(())
    })
    .await;
    server.stop().await;
    let server = TestServer::start_on(&storage, |c| c.auth.secret_key = Some(new.clone())).await;
    assert_eq!(server.secret(&app, &id).await, secret, "readable with the new key alone");
}

async fn stored_secrets(storage: &Storage) -> std::collections::HashMap<String, String> {
    match &storage.database_url {
        None => {
            let db = rusqlite::Connection::open(storage.dir.path().join("herald.db")).unwrap();
            let mut query = db.prepare("SELECT id, secrets FROM endpoint").unwrap();
            query.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
        }
        Some(url) => {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let rows = client.query("SELECT id, secrets FROM herald.endpoint", &[]).await.unwrap();
            rows.iter().map(|r| (r.get(0), r.get(1))).collect()
        }
    }
}

async fn overwrite_secrets(storage: &Storage, endpoint: &str, sealed: &str) {
    match &storage.database_url {
        None => {
            let db = rusqlite::Connection::open(storage.dir.path().join("herald.db")).unwrap();
            db.execute("UPDATE endpoint SET secrets = ?1 WHERE id = ?2", [sealed, endpoint]).unwrap();
        }
        Some(url) => {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            client
                .execute("UPDATE herald.endpoint SET secrets = $1 WHERE id = $2", &[&sealed, &endpoint])
                .await
                .unwrap();
        }
    }
}
