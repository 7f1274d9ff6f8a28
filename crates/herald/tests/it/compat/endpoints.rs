//! Applications, endpoints and secrets as Svix has them: filter types that exist, reserved
//! headers, recover and stats windows, `send-example`, rotation limits, asymmetric secrets,
//! `dashboard-access`, and where destinations may point.

use base64::Engine;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{ADMIN, call, event_type, problem};
use crate::support::{Receiver, TestServer};

#[tokio::test]
async fn filter_types_must_name_live_event_types() {
    let server = TestServer::start().await;
    event_type(&server, "a.live").await;
    event_type(&server, "a.archived").await;
    let (status, _) = server.call(Method::DELETE, "/api/v1/event-type/a.archived", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let app = server.create_app("a").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    let cases = [
        (json!(["a.live", "a.nope", "a.archived"]), "The following event types don't exist: a.nope, a.archived"),
        (json!([]), "filterTypes can't be empty, it must have at least one item."),
    ];
    for (types, msg) in cases {
        for field in ["eventTypes", "filterTypes"] {
            let (status, body) = server.post(&path, json!({"url": "https://h.example.com/", field: types})).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {types} -> {body}");
            assert_eq!(problem(&body).1, msg, "{field}: {types}");
        }
    }
    let (status, ep) = server.post(&path, json!({"url": "https://h.example.com/", "eventTypes": ["a.live"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{ep}");
    let patch = format!("{path}/{}", ep["id"].as_str().unwrap());
    let (status, _) = server.call(Method::PATCH, &patch, Some(json!({"filterTypes": ["a.nope"]}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn headers_svix_refuses_are_refused() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let ep = server.create_endpoint(&app, "https://h.example.com/", json!({})).await;
    let headers = format!("/api/v1/app/{app}/endpoint/{}/headers", ep["id"].as_str().unwrap());
    let names = [
        "user-agent",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "age",
        "cache-control",
        "clear-site-data",
        "expires",
        "pragma",
        "warning",
        "content-length",
        "content-type",
        "content-encoding",
        "content-language",
        "content-location",
        "svix-x",
        "X-Svix-Id",
        "x-amz-date",
        "x-amzn-trace-id",
        "x-google-x",
        "x-goog-x",
        "x-gfe-x",
        "x-azure-ref",
        "x-fd-healthprobe",
    ];
    for name in names {
        let (status, body) = server.call(Method::PUT, &headers, Some(json!({"headers": {name: "v"}}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {body}");
    }
    let (status, _) = server.call(Method::PUT, &headers, Some(json!({"headers": {"x-long": "v".repeat(4097)}}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "values over 4,096 bytes");
    let (status, _) = server.call(Method::PUT, &headers, Some(json!({"headers": {"x-fine": "v".repeat(4096)}}))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn recover_and_stats_windows_are_svix_ones() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let ep = server.create_endpoint(&app, "https://h.example.com/", json!({})).await;
    let base = format!("/api/v1/app/{app}/endpoint/{}", ep["id"].as_str().unwrap());
    let ago = |days: i64| (chrono::Utc::now() - chrono::Duration::days(days)).to_rfc3339();
    let (status, body) = server.post(&format!("{base}/recover"), json!({"since": ago(15)})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        problem(&body),
        ("body.since".into(), "Cannot recover messages more than 14 days old.".into(), "value_error".into())
    );
    let (status, _) = server.post(&format!("{base}/recover"), json!({"since": ago(13)})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let query =
        |pairs: &[(&str, &str)]| url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
    let (status, body) = server.get(&format!("{base}/stats?{}", query(&[("since", &ago(29))]))).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_range")), "{body}");
    assert!(body["detail"].as_str().unwrap().starts_with("'since' cannot be more than 28 days prior to "), "{body}");
    let future = (chrono::Utc::now() + chrono::Duration::hours(2)).to_rfc3339();
    let (status, body) = server.get(&format!("{base}/stats?{}", query(&[("until", &future)]))).await;
    assert_eq!((status, body["detail"].as_str()), (StatusCode::BAD_REQUEST, Some("'until' cannot be in the future")));
    let (status, _) = server.get(&format!("{base}/stats?{}", query(&[("since", &ago(27))]))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn send_example_sends_the_ping_or_the_schema_example_to_that_endpoint_only() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    event_type(&server, "with.example").await;
    server.post("/api/v1/event-type", json!({"name": "without.example", "description": "x"})).await;
    let app = server.create_app("a").await;
    let ep = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let path = format!("/api/v1/app/{app}/endpoint/{}/send-example", ep["id"].as_str().unwrap());
    let (status, _) = server.post(&path, json!({"eventType": "svix.ping"})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = server.post(&path, json!({"eventType": "with.example"})).await;
    assert_eq!(status, StatusCode::OK);
    let got = receiver.wait_for(Some("/hook"), 2).await;
    let bodies: Vec<&[u8]> = got.iter().map(|r| r.body.as_ref()).collect();
    assert!(bodies.contains(&br#"{"success":true}"#.as_slice()), "the ping, exactly: {bodies:?}");
    assert!(bodies.contains(&br#"{"example":"with.example"}"#.as_slice()), "{bodies:?}");
    let (status, body) = server.post(&path, json!({"eventType": "without.example"})).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_scheme")));
    let (status, _) = server.post(&path, json!({"eventType": "no.such.type"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let portal = access["token"].as_str().unwrap();
    // Herald lets the endpoint's owner test it (a deliberate difference: Svix answers 403).
    let (status, _) = call(&server, portal, Method::POST, &path, Some(json!({"eventType": "svix.ping"}))).await;
    assert_eq!(status, StatusCode::OK);
    receiver.wait_for(Some("/hook"), 3).await;
    let other = server.create_app("b").await;
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{other}"), json!({})).await;
    let stranger = access["token"].as_str().unwrap();
    let (status, _) = call(&server, stranger, Method::POST, &path, Some(json!({"eventType": "svix.ping"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Rotation answers 204 (the new key is read with GET) and keeps at most ten previous keys
/// that still sign; keys whose grace period is over do not count.
#[tokio::test]
async fn rotation_answers_204_and_keeps_at_most_ten_previous_secrets() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let ep = server.create_endpoint(&app, "https://h.example.com/", json!({})).await;
    let base = format!("/api/v1/app/{app}/endpoint/{}", ep["id"].as_str().unwrap());
    let (status, _) = server.post(&format!("{base}/secret/rotate"), json!({"gracePeriodSeconds": 0})).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "the first previous key expires at once");
    for _ in 0..10 {
        let before = server.get(&format!("{base}/secret")).await.1["key"].clone();
        let answer = server
            .request_as_admin(Method::POST, &format!("{base}/secret/rotate/"))
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::NO_CONTENT);
        assert!(answer.bytes().await.unwrap().is_empty(), "a 204 has no body");
        assert_ne!(server.get(&format!("{base}/secret")).await.1["key"], before, "the new key is read with GET");
    }
    let (status, body) = server.post(&format!("{base}/secret/rotate"), json!({})).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("limit_reached")), "{body}");
}

#[tokio::test]
async fn asymmetric_secrets_sign_v1a_next_to_the_previous_hmac_key() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("a").await;
    let ep = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let base = format!("/api/v1/app/{app}/endpoint/{}", ep["id"].as_str().unwrap());
    let old = server.get(&format!("{base}/secret")).await.1["key"].as_str().unwrap().to_owned();
    let pair = herald::signing::AsymmetricKey::generate();
    let (status, _) = server.post(&format!("{base}/secret/rotate"), json!({"key": pair.to_secret_string()})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, shown) = server.get(&format!("{base}/secret")).await;
    assert_eq!(shown["key"], pair.public_key().as_str(), "GET secret shows the public key");
    server.send(&app, json!({"eventType": "a", "payload": {"n": 1}})).await;
    let got = receiver.wait_for(Some("/hook"), 1).await;
    let signature = got[0].header("webhook-signature");
    assert!(signature.starts_with("v1a,") && signature.contains(" v1,"), "{signature}");
    let headers = herald::signing::SignedHeaders::from_pairs(
        got[0].headers.iter().map(|(k, v)| (k.as_str(), v.to_str().unwrap())),
    );
    let now = chrono::Utc::now().timestamp();
    assert!(herald::signing::verify_v1a(&pair.public_key(), &headers, &got[0].body, now).is_ok());
    let old = herald::signing::SigningKey::decode(&old).unwrap();
    assert!(herald::signing::verify(&old, &headers, &got[0].body, now).is_ok(), "the old HMAC key still signs");
    // Created with one, too; garbage is refused.
    let (status, created) = server
        .post(
            &format!("/api/v1/app/{app}/endpoint"),
            json!({"url": "https://h.example.com/", "secret": pair.to_secret_string()}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let bad = format!("whsk_{}", base64::engine::general_purpose::STANDARD.encode([7u8; 10]));
    let (status, _) = server
        .post(&format!("/api/v1/app/{app}/endpoint"), json!({"url": "https://h.example.com/", "secret": bad}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn dashboard_access_issues_a_portal_link_whatever_the_body() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let answer =
        server.request_as_admin(Method::POST, &format!("/api/v1/auth/dashboard-access/{app}")).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let access: Value = answer.json().await.unwrap();
    let token = access["token"].as_str().unwrap();
    assert!(access["url"].as_str().unwrap().contains("/portal#token="), "{access}");
    assert_eq!(call(&server, token, Method::GET, &format!("/api/v1/app/{app}"), None).await.0, StatusCode::OK);
    let (status, _) = call(&server, token, Method::POST, &format!("/api/v1/auth/dashboard-access/{app}"), None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a portal token issues none");
    // Svix reads no body here: `null`, an object, or text that is no JSON at all.
    for (body, slash) in [("null", ""), ("null", "/"), (r#"{"expiry": 1}"#, ""), ("not json", "/")] {
        let answer = server
            .request_as_admin(Method::POST, &format!("/api/v1/auth/dashboard-access/{app}{slash}"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{body}{slash}");
        let access: Value = answer.json().await.unwrap();
        assert!(access["token"].as_str().unwrap().starts_with("appsk_"), "{access}");
    }
}

/// Herald's own rule: private destinations stay closed unless the operator opens them; then
/// `localhost` and any port inside them are accepted, as in Svix. Elsewhere the port rule
/// is the operator's (`delivery.any_port`).
#[tokio::test]
async fn destinations_inside_allowed_networks_take_localhost_and_any_port() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    for url in ["http://localhost:9/hook", "http://127.0.0.1:22/", "http://app.localhost:8080/"] {
        let (status, body) = server.post(&path, json!({"url": url})).await;
        assert_eq!(status, StatusCode::CREATED, "{url}: {body}");
    }
    let (status, _) = server.post(&path, json!({"url": "https://hooks.example.com:22/"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "public names keep the port rule");
    let any = TestServer::start_with(|c| c.delivery.any_port = true).await;
    let app = any.create_app("a").await;
    let (status, _) =
        any.post(&format!("/api/v1/app/{app}/endpoint"), json!({"url": "https://hooks.example.com:22/"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let closed = TestServer::start_with(|c| c.delivery.allowed_networks.clear()).await;
    let app = closed.create_app("a").await;
    let (status, _) =
        closed.post(&format!("/api/v1/app/{app}/endpoint"), json!({"url": "http://localhost:8080/"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "without the operator's say, localhost stays closed");
    let _ = ADMIN;
}

/// Svix stores an endpoint's URL in its normal form, on create, PUT and PATCH alike, and
/// reads it back so; a URL the guard refuses is refused as sent.
#[tokio::test]
async fn endpoint_urls_are_stored_in_their_normal_form() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    for slash in ["", "/"] {
        let (status, created) = call(
            &server,
            ADMIN,
            Method::POST,
            &format!("/api/v1/app/{app}/endpoint{slash}"),
            Some(json!({"url": "http://bad.url2"})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        assert_eq!(created["url"], "http://bad.url2/");
        let path = format!("/api/v1/app/{app}/endpoint/{}", created["id"].as_str().unwrap());
        assert_eq!(server.get(&path).await.1["url"], "http://bad.url2/", "read back");
        let (status, put) = call(
            &server,
            ADMIN,
            Method::PUT,
            &format!("{path}{slash}"),
            Some(json!({"url": "HTTPS://Hooks.Example.COM:443/a/../b"})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{put}");
        assert_eq!(put["url"], "https://hooks.example.com/b");
        let (status, patched) = call(
            &server,
            ADMIN,
            Method::PATCH,
            &format!("{path}{slash}"),
            Some(json!({"url": "https://x.example.com"})),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{patched}");
        assert_eq!(patched["url"], "https://x.example.com/");
        assert_eq!(server.get(&path).await.1["url"], "https://x.example.com/", "read back");
        let (status, refused) =
            call(&server, ADMIN, Method::PATCH, &path, Some(json!({"url": "https://x.example.com\\@evil.example"})))
                .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    }
}

/// Svix's deprecated endpoint `version` is the caller's to set (at least 1) and reads back
/// as set; an update that leaves it out keeps it.
#[tokio::test]
async fn the_deprecated_endpoint_version_is_kept_as_set() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let created = server.create_endpoint(&app, "https://h.example.com/", json!({})).await;
    assert_eq!(created["version"], 1, "{created}");
    let path = format!("/api/v1/app/{app}/endpoint/{}", created["id"].as_str().unwrap());
    for slash in ["", "/"] {
        let (status, patched) =
            call(&server, ADMIN, Method::PATCH, &format!("{path}{slash}"), Some(json!({"version": 2}))).await;
        assert_eq!((status, &patched["version"]), (StatusCode::OK, &json!(2)), "{patched}");
        assert_eq!(server.get(&path).await.1["version"], 2, "read back");
        let (status, refused) =
            call(&server, ADMIN, Method::PATCH, &format!("{path}{slash}"), Some(json!({"version": 0}))).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
        assert_eq!(refused["detail"][0]["loc"], json!(["body", "version"]), "{refused}");
        let put = json!({"url": "https://h.example.com/", "description": "kept"});
        let (status, kept) = call(&server, ADMIN, Method::PUT, &format!("{path}{slash}"), Some(put)).await;
        assert_eq!((status, &kept["version"]), (StatusCode::OK, &json!(2)), "a PUT without it keeps it: {kept}");
        let put = json!({"url": "https://h.example.com/", "version": 5});
        let (_, set) = call(&server, ADMIN, Method::PUT, &format!("{path}{slash}"), Some(put)).await;
        assert_eq!(set["version"], 5, "{set}");
    }
    let (status, made) = call(
        &server,
        ADMIN,
        Method::POST,
        &format!("/api/v1/app/{app}/endpoint"),
        Some(json!({"url": "https://h.example.com/", "version": 7})),
    )
    .await;
    assert_eq!((status, &made["version"]), (StatusCode::CREATED, &json!(7)), "{made}");
}
