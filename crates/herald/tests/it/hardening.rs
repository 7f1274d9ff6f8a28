//! API hardening: capped bodies and JSON depth, validated names and headers, per-token
//! rate limits and failed-authentication budgets, idempotency keys bound to the
//! authenticated caller, and server keys that seal secrets, headers and stored responses at
//! rest.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::certs::TestCa;
use crate::support::server::{ADMIN_TOKEN, Storage};
use crate::support::{Receiver, Reply, TestServer};

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

    let stored = stored_column(&storage, "secrets").await;
    assert!(stored.values().all(|s| s.starts_with("v1.")), "{stored:?}");
    assert!(!stored[&a].contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "the secret is not stored in the clear");
    // A sealed value copied onto another endpoint's row does not open there.
    overwrite_column(&storage, "secrets", &b, &stored[&a]).await;

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
    let auth = json!({"auth": {"type": "basic", "username": "u", "password": "p"}});
    let endpoint = server.create_endpoint(&app, "https://hooks.example.com/", auth).await;
    let id = endpoint["id"].as_str().unwrap().to_owned();
    let secret = server.secret(&app, &id).await;
    let proxy = json!({"proxyUrl": "http://u:p@proxy.internal:3128"});
    assert_eq!(server.call(Method::PATCH, &format!("/api/v1/app/{app}"), Some(proxy)).await.0, StatusCode::OK);
    let broker = json!({"destination": {"type": "redisStreams", "broker": "redis://127.0.0.1:6390", "stream": "s",
                                         "credentials": {"password": "p"}}});
    let publisher = server.create_endpoint(&app, "", broker).await;
    let publisher = publisher["id"].as_str().unwrap().to_owned();
    server.stop().await;
    let before = stored_column(&storage, "secrets").await[&id].clone();
    let key_of = |sealed: &str| sealed.split('.').nth(1).unwrap_or_default().to_owned();
    let old_key = key_of(&before);
    assert_eq!(key_of(&stored_column(&storage, "auth").await[&id]), old_key);
    assert_eq!(key_of(&stored_column(&storage, "destination").await[&publisher]), old_key);
    assert_eq!(key_of(&stored(&storage, "app", "proxy_credentials").await[&app]), old_key);

    let server = TestServer::start_on(&storage, |c| {
        c.auth.secret_key = Some(new.clone());
        c.auth.previous_secret_keys = vec![old.clone()];
    })
    .await;
    crate::support::eventually("the secret is sealed under the new key", || async {
        let now = stored_column(&storage, "secrets").await[&id].clone();
        (now.split('.').nth(1) != before.split('.').nth(1)).then_some(())
    })
    .await;
    server.stop().await;
    assert_ne!(key_of(&stored_column(&storage, "auth").await[&id]), old_key, "delivery credentials resealed");
    assert_ne!(key_of(&stored(&storage, "app", "proxy_credentials").await[&app]), old_key, "proxy credentials too");
    assert_ne!(key_of(&stored_column(&storage, "destination").await[&publisher]), old_key, "destinations too");
    let server = TestServer::start_on(&storage, |c| c.auth.secret_key = Some(new.clone())).await;
    assert_eq!(server.secret(&app, &id).await, secret, "readable with the new key alone");
    let (_, read) = server.get(&format!("/api/v1/app/{app}/endpoint/{id}")).await;
    assert_eq!(read["auth"], json!({"type": "basic"}), "not unreadable: {read}");
    let (_, read) = server.get(&format!("/api/v1/app/{app}/endpoint/{publisher}")).await;
    assert_eq!(read["destination"]["credentials"], json!({"passwordSet": true}), "not unreadable: {read}");
}

/// Regressions (issue 16, findings 2 and 5): with an idempotency key, the app-portal token
/// and a rotated signing secret were stored in plaintext with their responses, and endpoint
/// headers (the receiver's credentials) were stored in plaintext. Delivery credentials
/// (issue 20: Basic, OAuth2 secret and fetched token, client certificate key) are checked
/// the same way. Canaries in each, then the
/// whole store (every file of the data directory, every row on PostgreSQL) is searched.
#[tokio::test]
async fn no_token_secret_or_header_value_rests_in_plaintext_anywhere() {
    let storage = Storage::new().await;
    let server = TestServer::start_on(&storage, |_| {}).await;
    let app = server.create_app("a").await;
    let header = format!("Bearer canary-{}", herald::ids::random_token(16));
    let password = format!("canary-{}", herald::ids::random_token(16));
    let extra =
        json!({"headers": {"Authorization": header}, "auth": {"type": "basic", "username": "u", "password": password}});
    let endpoint = server.create_endpoint(&app, "https://hooks.example.com/", extra).await;
    let proxy_password = format!("canary{}", herald::ids::random_token(16));
    let proxy = json!({"proxyUrl": format!("http://egress:{proxy_password}@proxy.internal:3128")});
    let (status, _) = server.call(Method::PATCH, &format!("/api/v1/app/{app}"), Some(proxy)).await;
    assert_eq!(status, StatusCode::OK);
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    // An OAuth2 grant whose token is fetched (a delivery is made with it) and a client
    // certificate whose key must rest sealed.
    let client_secret = format!("canary-{}", herald::ids::random_token(16));
    let access_token = format!("canary-{}", herald::ids::random_token(16));
    let answer = json!({"access_token": access_token, "token_type": "Bearer", "expires_in": 3600}).to_string();
    let receiver = Receiver::start(move |r, _| match r.path.as_str() {
        "/token" => Reply::ok().header("content-type", "application/json").body(&answer),
        _ => Reply::ok(),
    })
    .await;
    let client = TestCa::new("canary CA").client("canary-client");
    let key_line = client.key_pem.lines().nth(1).unwrap().to_owned();
    let grant =
        json!({"type": "oauth2", "tokenUrl": receiver.url("/token"), "clientId": "c", "clientSecret": client_secret});
    let tls = json!({"clientCertificatePem": client.cert_pem, "clientKeyPem": client.key_pem});
    // Its own application: this one goes through a proxy that does not exist.
    let direct = server.create_app("direct").await;
    server.create_endpoint(&direct, &receiver.url("/hook"), json!({"auth": grant, "tls": tls})).await;
    server.send(&direct, json!({"eventType": "e", "payload": {}})).await;
    receiver.wait_for(Some("/hook"), 1).await;
    let broker_password = format!("canary-{}", herald::ids::random_token(16));
    let destination = json!({"type": "redisStreams", "broker": "redis://127.0.0.1:6390", "stream": "s",
                             "credentials": {"username": "herald", "password": broker_password}});
    server.create_endpoint(&direct, "", json!({"destination": destination})).await;
    let patched = format!("canary-{}", herald::ids::random_token(16));
    let (status, _) = server
        .call(
            Method::PATCH,
            &format!("/api/v1/app/{app}/endpoint/{ep}/headers"),
            Some(json!({"headers": {"X-Tenant-Ref": patched}})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let keyed = |path: String, key: &str| {
        server.request_as_admin(Method::POST, &path).header("idempotency-key", key).json(&json!({}))
    };
    let access = keyed(format!("/api/v1/auth/app-portal-access/{app}"), "portal-key").send().await.unwrap();
    let access: Value = access.json().await.unwrap();
    let token = access["token"].as_str().unwrap().to_owned();
    let rotated = keyed(format!("/api/v1/app/{app}/endpoint/{ep}/secret/rotate"), "rotate-key").send().await.unwrap();
    assert_eq!(rotated.status(), StatusCode::NO_CONTENT);
    let secret = server.secret(&app, &ep).await;
    let cookie = server.sign_in(&token).await;

    // The replays still answer what the first request did.
    let again = keyed(format!("/api/v1/auth/app-portal-access/{app}"), "portal-key").send().await.unwrap();
    assert_eq!(again.json::<Value>().await.unwrap()["token"], token.as_str(), "replayed from the sealed copy");
    let (_, headers) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}/headers")).await;
    assert_eq!(headers["sensitive"], json!(["Authorization"]), "{headers}");
    assert_eq!(headers["headers"]["X-Tenant-Ref"], patched.as_str());
    server.stop().await;

    let everything = storage.everything().await;
    let session = cookie.trim_start_matches("herald_session=");
    for (what, canary) in [
        ("the portal token", token.as_str()),
        ("the rotated secret", secret.as_str()),
        ("an endpoint header", header.as_str()),
        ("a patched endpoint header", patched.as_str()),
        ("the dashboard session", session),
        ("a delivery password", password.as_str()),
        ("an egress proxy password", proxy_password.as_str()),
        ("an OAuth2 client secret", client_secret.as_str()),
        ("an OAuth2 access token", access_token.as_str()),
        ("a client certificate's private key", key_line.as_str()),
        ("a broker password", broker_password.as_str()),
    ] {
        assert!(!everything.contains(canary), "{what} rests in plaintext");
    }
    assert!(everything.contains(&ep), "the search does see the store");
}

/// Headers stored before they were sealed (schema version 1) are sealed at the next start,
/// and still go out with every request.
#[tokio::test]
async fn headers_stored_in_plaintext_before_are_sealed_at_start() {
    let receiver = Receiver::ok().await;
    let storage = Storage::new().await;
    let server = TestServer::start_on(&storage, |_| {}).await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    server.stop().await;
    overwrite_column(&storage, "headers", &ep, r#"{"X-Legacy":"kept-in-the-clear"}"#).await;

    let server = TestServer::start_on(&storage, |_| {}).await;
    crate::support::eventually("the legacy headers sealed", || async {
        stored_column(&storage, "headers").await[&ep].starts_with("v1.").then_some(())
    })
    .await;
    server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    let got = receiver.wait_for(Some("/hook"), 1).await;
    assert_eq!(got[0].header("x-legacy"), "kept-in-the-clear");
}

/// Regressions (issue 16, finding 10): the idempotency layer ran before authentication,
/// scoped keys by the raw `Authorization` header and took keys of any length.
#[tokio::test]
async fn idempotency_keys_are_checked_and_belong_to_the_authenticated_caller() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let post = |token: &str, key: &str, body: Value| {
        reqwest::Client::new()
            .post(server.url(&format!("/api/v1/app/{app}/endpoint")))
            .bearer_auth(token)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let body = json!({"url": "https://hooks.example.com/"});
    // An unknown caller is refused before any key is looked up or kept.
    let refused = post("not-a-token", "k", body.clone()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let first = post(ADMIN_TOKEN, "k", body.clone()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED, "the refused request left no record behind");
    let first: Value = first.json().await.unwrap();
    let replayed: Value = post(ADMIN_TOKEN, "k", body.clone()).await.unwrap().json().await.unwrap();
    assert_eq!(replayed["id"], first["id"], "the admin's key replays");
    // Another caller's same key is its own.
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let portal = access["token"].as_str().unwrap();
    let theirs: Value = post(portal, "k", body.clone()).await.unwrap().json().await.unwrap();
    assert_ne!(theirs["id"], first["id"], "a portal token never sees the admin's response");
    // `BEARER` is the same scheme as `Bearer`: the same caller, the same key.
    let shouted = reqwest::Client::new()
        .post(server.url(&format!("/api/v1/app/{app}/endpoint")))
        .header("authorization", format!("BEARER {ADMIN_TOKEN}"))
        .header("idempotency-key", "k")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(shouted.status(), StatusCode::CREATED);
    assert_eq!(shouted.json::<Value>().await.unwrap()["id"], first["id"]);
    // Keys are at most 256 visible ASCII characters, on every POST.
    for bad in ["x".repeat(257), "x".repeat(10_000), "tab\tinside".into()] {
        let answer = post(ADMIN_TOKEN, &bad, body.clone()).await.unwrap();
        assert_eq!(answer.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let detail: Value = answer.json().await.unwrap();
        assert_eq!(detail["detail"][0]["loc"], json!(["header", "idempotency-key"]), "{detail}");
        let message = server
            .request_as_admin(Method::POST, &format!("/api/v1/app/{app}/msg"))
            .header("idempotency-key", &bad)
            .json(&json!({"eventType": "a", "payload": {}}))
            .send()
            .await
            .unwrap();
        assert_eq!(message.status(), StatusCode::UNPROCESSABLE_ENTITY);
    }
    assert_eq!(post(ADMIN_TOKEN, &"x".repeat(256), body).await.unwrap().status(), StatusCode::CREATED);
    let (_, list) = server.get(&format!("/api/v1/app/{app}/endpoint")).await;
    assert_eq!(list["data"].as_array().unwrap().len(), 3, "admin, portal, 256-character key: {list}");
    let (_, messages) = server.get(&format!("/api/v1/app/{app}/msg")).await;
    assert!(messages["data"].as_array().unwrap().is_empty());
}

/// Regression (issue 16, finding 10): failed authentications were not rate-limited.
#[tokio::test]
async fn failed_authentications_are_budgeted_per_address() {
    let server = TestServer::start_with(|c| c.auth.failed_auth_per_minute = Some(5)).await;
    let client = reqwest::Client::new();
    let get = |token: &str| client.get(server.url("/api/v1/app")).bearer_auth(token).send();
    for i in 0..5 {
        assert_eq!(get(&format!("guess-{i}")).await.unwrap().status(), StatusCode::UNAUTHORIZED);
    }
    let refused = get("guess-5").await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = refused.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=12).contains(&wait), "Retry-After: {wait}");
    assert_eq!(refused.json::<Value>().await.unwrap()["code"], "rate_limited");
    // The budget answers wrong tokens only: everyone sharing the address (behind one proxy,
    // say) with a valid token is served as before.
    assert_eq!(get(ADMIN_TOKEN).await.unwrap().status(), StatusCode::OK, "a valid token is never refused for it");
    let app = server.create_app("a").await;
    let portal = server.portal_token(&app).await;
    let own = client.get(server.url(&format!("/api/v1/app/{app}"))).bearer_auth(&portal).send().await.unwrap();
    assert_eq!(own.status(), StatusCode::OK);
    let answer = crate::support::server::sign_in_answer(&server.url(""), ADMIN_TOKEN, None).await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER, "nor is a valid sign-in");
    // The dashboard's sign-in shares the budget of wrong tokens.
    let answer = crate::support::server::sign_in_answer(&server.url(""), "guess-6", None).await;
    assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
}

async fn stored_column(storage: &Storage, column: &str) -> std::collections::HashMap<String, String> {
    stored(storage, "endpoint", column).await
}

/// `column` of every row of `table`, by id (text columns; NULL reads as empty).
async fn stored(storage: &Storage, table: &str, column: &str) -> std::collections::HashMap<String, String> {
    match &storage.database_url {
        None => {
            let db = rusqlite::Connection::open(storage.dir.path().join("herald.db")).unwrap();
            let mut query = db.prepare(&format!("SELECT id, coalesce({column}, '') FROM {table}")).unwrap();
            query.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
        }
        Some(url) => {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let sql = format!("SELECT id, coalesce({column}, '') FROM herald.{table}");
            let rows = client.query(&sql, &[]).await.unwrap();
            rows.iter().map(|r| (r.get(0), r.get(1))).collect()
        }
    }
}

async fn overwrite_column(storage: &Storage, column: &str, endpoint: &str, value: &str) {
    match &storage.database_url {
        None => {
            let db = rusqlite::Connection::open(storage.dir.path().join("herald.db")).unwrap();
            db.execute(&format!("UPDATE endpoint SET {column} = ?1 WHERE id = ?2"), [value, endpoint]).unwrap();
        }
        Some(url) => {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let sql = format!("UPDATE herald.endpoint SET {column} = $1 WHERE id = $2");
            client.execute(&sql, &[&value, &endpoint]).await.unwrap();
        }
    }
}

/// The mode bits of a path (permissions only).
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Regression (issue 16, finding 7): the database files were 0644 and the data directory
/// 0755, and an `admin-token` file others could read was accepted silently.
#[tokio::test]
async fn the_data_directory_and_its_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let storage = Storage::sqlite();
    let dir = storage.dir.path().join("data");
    let without_token = |c: &mut herald::Config| {
        c.server.data_dir = dir.clone();
        c.auth.admin_token = None;
        c.auth.secret_key = None;
    };
    let server = TestServer::start_on(&storage, without_token).await;
    let app = server.create_app_with_token(&std::fs::read_to_string(dir.join("admin-token")).unwrap()).await;
    assert!(app.starts_with("app_"));
    assert_eq!(mode(&dir), 0o700, "the data directory");
    for file in ["herald.db", "herald.db-wal", "herald.db-shm", "herald.lock", "admin-token", "secret-key"] {
        assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
    }
    server.stop().await;

    // Modes loosened by hand (or by an earlier version) are tightened at the next start.
    // (A clean stop removes the WAL; the database file carries the mode SQLite gives it.)
    for (path, loose) in [(dir.clone(), 0o755), (dir.join("herald.db"), 0o644), (dir.join("herald.lock"), 0o666)] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(loose)).unwrap();
    }
    let server = TestServer::start_on(&storage, without_token).await;
    for (path, want) in [(dir.clone(), 0o700), (dir.join("herald.db"), 0o600), (dir.join("herald.lock"), 0o600)] {
        assert_eq!(mode(&path), want, "{}", path.display());
    }
    assert_eq!(mode(&dir.join("herald.db-wal")), 0o600, "a WAL made after tightening");
    server.stop().await;

    // A secret file others can read is refused, saying why.
    for secret in ["admin-token", "secret-key"] {
        std::fs::set_permissions(dir.join(secret), std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut config = crate::support::server::test_config(&storage);
        without_token(&mut config);
        let refused = herald::Server::build(config).await.err().expect("a readable secret file is refused");
        let text = format!("{refused:#}");
        assert!(text.contains(secret) && text.contains("other users") && text.contains("chmod 600"), "{text}");
        std::fs::set_permissions(dir.join(secret), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}
