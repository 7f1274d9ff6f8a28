//! Redaction: unique canary strings planted in every secret Herald handles (the admin
//! token, the server key, an endpoint secret, an endpoint header, a portal token (issued
//! under an idempotency key and replayed), a dashboard session, a signature, URL userinfo)
//! and in payloads; a real `herald serve` runs at the most verbose log level, and none of
//! them may appear anywhere in what it wrote. Sensitive payload fields are masked in API
//! listings for tokens without the `sensitive` permission.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::process::Process;
use crate::support::server::Storage;
use crate::support::{Receiver, Reply, TestServer};

fn unique(tag: &str) -> String {
    format!("{tag}{}", herald::ids::random_token(16))
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    async fn call(&self, method: reqwest::Method, token: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base)).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_token_signature_or_payload_reaches_the_logs() {
    let admin = unique("hrld_CANARYADMIN");
    let server_key = herald::sealing::generate_key();
    let endpoint_secret = format!("whsec_{}", STANDARD.encode(unique("CANARYSECRET").as_bytes()));
    let payload_canary = unique("CANARYPAYLOAD");
    let click_canary = unique("CANARYCLICK");
    let password = unique("CANARYPASS");
    let header = unique("CANARYHEADER");
    let receiver =
        Receiver::start(|_, n| if n == 0 { Reply::status(500).body("try again") } else { Reply::ok() }).await;
    let storage = Storage::new().await;
    let herald = Process::start_with(
        &storage,
        &[("HERALD_ADMIN_TOKEN", admin.as_str()), ("HERALD_SECRET_KEY", server_key.as_str()), ("RUST_LOG", "trace")],
    );
    let api = Client { http: reqwest::Client::new(), base: herald.base.clone() };
    let post = reqwest::Method::POST;
    let get = reqwest::Method::GET;

    let (_, app) = api.call(post.clone(), &admin, "/api/v1/app", Some(json!({"name": "shop"}))).await;
    let app = app["id"].as_str().unwrap().to_owned();
    let with_userinfo = format!("https://user:{password}@hooks.example.com/");
    let (status, _) = api
        .call(post.clone(), &admin, &format!("/api/v1/app/{app}/endpoint"), Some(json!({"url": with_userinfo})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let retry = json!({"retry": {"strategy": "schedule", "delaysMs": [10], "jitterPercent": 0}});
    let endpoint = json!({"url": receiver.url("/hook"), "secret": endpoint_secret, "delivery": retry,
                          "headers": {"Authorization": format!("Bearer {header}")}});
    let (status, _) = api.call(post.clone(), &admin, &format!("/api/v1/app/{app}/endpoint"), Some(endpoint)).await;
    assert_eq!(status, StatusCode::CREATED);
    let message = json!({"eventType": "conversion", "payload": {"note": payload_canary, "click_id": click_canary}});
    let (status, _) = api.call(post.clone(), &admin, &format!("/api/v1/app/{app}/msg"), Some(message)).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let got = receiver.wait_for(Some("/hook"), 2).await;
    let signature = got[1].header("webhook-signature").split(' ').next().unwrap().split(',').nth(1).unwrap().to_owned();

    // Issued under an idempotency key, then replayed from its sealed copy.
    let access = || {
        api.http
            .post(format!("{}/api/v1/auth/app-portal-access/{app}", api.base))
            .bearer_auth(&admin)
            .header("idempotency-key", "portal-once")
            .json(&json!({}))
            .send()
    };
    let portal: Value = access().await.unwrap().json().await.unwrap();
    let portal = portal["token"].as_str().unwrap().to_owned();
    let again: Value = access().await.unwrap().json().await.unwrap();
    assert_eq!(again["token"], portal.as_str());
    let session = crate::support::server::sign_in(&herald.base, &admin).await;
    let page = api.http.get(format!("{}/", api.base)).header("cookie", &session).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let (status, _) = api.call(get.clone(), &portal, &format!("/api/v1/app/{app}/msg"), None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = api.call(get, "not-a-token", &format!("/api/v1/app/{app}/msg"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = api.call(post, &portal, "/api/v1/auth/logout", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let logs = herald.stop();
    assert!(logs.contains("TRACE") && logs.contains("dispatcher stopped"), "the whole log, at trace level:\n{logs}");
    let planted = [
        ("the admin token", admin.as_str()),
        ("the server key", server_key.as_str()),
        ("the endpoint secret", endpoint_secret.as_str()),
        ("the endpoint secret's key", endpoint_secret.trim_start_matches("whsec_")),
        ("a portal token", portal.as_str()),
        ("an endpoint header", header.as_str()),
        ("a dashboard session", session.trim_start_matches("herald_session=")),
        ("a signature", signature.as_str()),
        ("URL userinfo", password.as_str()),
        ("a payload", payload_canary.as_str()),
        ("a sensitive payload field", click_canary.as_str()),
    ];
    for (what, canary) in planted {
        assert!(!logs.contains(canary), "{what} appears in the logs");
    }
}

#[tokio::test]
async fn sensitive_fields_are_masked_for_portal_tokens_without_the_permission() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start_with(|c| {
        c.redaction.fields.insert("order.paid".into(), vec!["/card/number".into()]);
    })
    .await;
    let app = server.create_app("shop").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let payload = json!({"click_id": "c-123", "affiliate_payout": 9.5, "card": {"number": "4111", "brand": "visa"}});
    let msg = server.send(&app, json!({"eventType": "order.paid", "payload": payload})).await;
    receiver.wait_for(Some("/hook"), 1).await;
    let token = |sensitive: bool| {
        let server = &server;
        let app = app.clone();
        async move {
            let path = format!("/api/v1/auth/app-portal-access/{app}");
            let (_, out) = server.post(&path, json!({"sensitive": sensitive})).await;
            out["token"].as_str().unwrap().to_owned()
        }
    };
    let (plain, trusted) = (token(false).await, token(true).await);
    let endpoint_id = endpoint["id"].as_str().unwrap();
    let (_, poller) = server.post(&format!("/api/v1/app/{app}/poller"), json!({})).await;
    let reads = [
        format!("/api/v1/app/{app}/msg/{msg}"),
        format!("/api/v1/app/{app}/msg"),
        format!("/api/v1/app/{app}/endpoint/{endpoint_id}/msg"),
        format!("/api/v1/app/{app}/poller/{}/consumer/reader", poller["id"].as_str().unwrap()),
    ];
    for path in &reads {
        let as_token = |token: String| {
            let request = reqwest::Client::new().get(server.url(path)).bearer_auth(token);
            async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
        };
        let masked = as_token(plain.clone()).await.to_string();
        // `:9.5` is the payout as a JSON value (a bare "9.5" is also in a timestamp like 20:39:39.538).
        assert!(!masked.contains("c-123") && !masked.contains(":9.5") && !masked.contains("4111"), "{path}: {masked}");
        assert!(masked.contains("[redacted]") && masked.contains("visa"), "{path}: {masked}");
        let clear = as_token(trusted.clone()).await.to_string();
        assert!(clear.contains("c-123") && clear.contains("4111"), "{path}: {clear}");
        let (_, admin) = server.get(path).await;
        assert!(admin.to_string().contains("c-123"), "the admin token sees everything");
    }
    // What was delivered is the payload as sent: masking is for readers only.
    let delivered: Value = serde_json::from_slice(&receiver.requests()[0].body).unwrap();
    assert_eq!(delivered["click_id"], "c-123");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postback_fields_stay_out_of_logs_attempt_urls_and_masked_views() {
    let click = unique("CANARYCLICK");
    let payout = unique("CANARYPAYOUT");
    let tracker = Receiver::start(|_, n| if n == 0 { Reply::status(503) } else { Reply::ok() }).await;
    let storage = Storage::new().await;
    let herald = Process::start_with(&storage, &[("RUST_LOG", "trace")]);
    let api = Client { http: reqwest::Client::new(), base: herald.base.clone() };
    let admin = crate::support::server::ADMIN_TOKEN;
    let (_, app) = api.call(reqwest::Method::POST, admin, "/api/v1/app", Some(json!({"name": "aff"}))).await;
    let app = app["id"].as_str().unwrap().to_owned();
    let template = format!("{}/pb?clickid={{click_id}}&payout={{affiliate_payout}}", tracker.url(""));
    let endpoint = json!({"url": tracker.url("/"), "request": {"method": "GET", "urlTemplate": template},
                          "delivery": {"retry": {"strategy": "schedule", "delaysMs": [10], "jitterPercent": 0}}});
    let (status, _) =
        api.call(reqwest::Method::POST, admin, &format!("/api/v1/app/{app}/endpoint"), Some(endpoint)).await;
    assert_eq!(status, StatusCode::CREATED);
    let message = json!({"eventType": "conversion", "payload": {"click_id": click, "affiliate_payout": payout}});
    let (_, sent) = api.call(reqwest::Method::POST, admin, &format!("/api/v1/app/{app}/msg"), Some(message)).await;
    let msg = sent["id"].as_str().unwrap().to_owned();
    let got = tracker.wait_for(None, 2).await;
    assert!(got[1].query.as_deref().unwrap().contains(&click), "the tracker gets the real value");

    let (_, attempts) =
        api.call(reqwest::Method::GET, admin, &format!("/api/v1/app/{app}/attempt/msg/{msg}"), None).await;
    assert!(!attempts.to_string().contains(&click), "attempt URLs keep the macro, not the value: {attempts}");
    let (_, access) =
        api.call(reqwest::Method::POST, admin, &format!("/api/v1/auth/app-portal-access/{app}"), Some(json!({}))).await;
    let portal = access["token"].as_str().unwrap().to_owned();
    let (_, listed) = api.call(reqwest::Method::GET, &portal, &format!("/api/v1/app/{app}/msg"), None).await;
    let listed = listed.to_string();
    assert!(!listed.contains(&click) && !listed.contains(&payout), "masked for the portal token: {listed}");
    let page = reqwest::Client::new()
        .get(format!("{}/app/{app}/msg/{msg}", herald.base))
        .header("cookie", crate::support::server::sign_in(&herald.base, &portal).await)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("[redacted]") && !page.contains(&click) && !page.contains(&payout),
        "the dashboard masks too"
    );

    let logs = herald.stop();
    assert!(logs.contains("TRACE"));
    assert!(!logs.contains(&click) && !logs.contains(&payout), "postback fields reach no log");
}

/// Delivery credentials (issue 20) reach no log, at the most verbose level: an OAuth2
/// client secret and the tokens Herald fetches (one refused by the receiver, so a refresh
/// happens), a Basic password, a client certificate's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_credentials_and_tokens_stay_out_of_logs() {
    let (secret, password) = (unique("CANARYSECRET"), unique("CANARYPASSWORD"));
    let (refused, token) = (unique("CANARYREFUSED"), unique("CANARYTOKEN"));
    let tokens = [refused.clone(), token.clone()];
    let receiver = Receiver::start(move |request, n| match request.path.as_str() {
        "/token" => {
            let body = json!({"access_token": tokens[n.min(1)], "token_type": "Bearer", "expires_in": 3600});
            Reply::ok().header("content-type", "application/json").body(&body.to_string())
        }
        "/oauth" if request.header("authorization").contains("CANARYREFUSED") => Reply::status(401),
        _ => Reply::ok(),
    })
    .await;
    let client = crate::support::certs::TestCa::new("log CA").client("log-client");
    let key_line = client.key_pem.lines().nth(1).unwrap().to_owned();
    let storage = Storage::new().await;
    let herald = Process::start_with(&storage, &[("RUST_LOG", "trace")]);
    let api = Client { http: reqwest::Client::new(), base: herald.base.clone() };
    let admin = crate::support::server::ADMIN_TOKEN;
    let (_, app) = api.call(reqwest::Method::POST, admin, "/api/v1/app", Some(json!({"name": "creds"}))).await;
    let app = app["id"].as_str().unwrap().to_owned();
    let endpoints = [
        json!({"url": receiver.url("/oauth"),
               "auth": {"type": "oauth2", "tokenUrl": receiver.url("/token"), "clientId": "c", "clientSecret": secret}}),
        json!({"url": receiver.url("/basic"), "auth": {"type": "basic", "username": "u", "password": password},
               "tls": {"clientCertificatePem": client.cert_pem, "clientKeyPem": client.key_pem}}),
    ];
    for endpoint in endpoints {
        let path = format!("/api/v1/app/{app}/endpoint");
        let (status, body) = api.call(reqwest::Method::POST, admin, &path, Some(endpoint)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let message = json!({"eventType": "e", "payload": {}});
    api.call(reqwest::Method::POST, admin, &format!("/api/v1/app/{app}/msg"), Some(message)).await;
    receiver.wait_for(Some("/basic"), 1).await;
    let delivered = receiver.wait_for(Some("/oauth"), 2).await;
    assert!(delivered[1].header("authorization").contains(&token), "refreshed after the 401");

    let logs = herald.stop();
    assert!(logs.contains("TRACE"));
    // The Basic headers as sent: base64 of the pairs.
    let (basic, client_basic) = (STANDARD.encode(format!("u:{password}")), STANDARD.encode(format!("c:{secret}")));
    for (what, canary) in [
        ("a Basic header", basic.as_str()),
        ("the client's Basic header", client_basic.as_str()),
        ("the client secret", secret.as_str()),
        ("a refused token", refused.as_str()),
        ("a token", token.as_str()),
        ("a Basic password", password.as_str()),
        ("a private key", key_line.as_str()),
    ] {
        assert!(!logs.contains(canary), "{what} reaches the log");
    }
}
