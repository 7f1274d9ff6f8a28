//! Authenticated delivery (Herald extensions `auth` and `tls`): HTTP Basic credentials go
//! out with every attempt (over an endpoint header of the same name, and after a transform,
//! which never sees them); OAuth2 tokens come from a local token server that counts its
//! requests (one per expiry window, one refresh per 401, failures retried as `auth_token`);
//! client certificates are checked by a local TLS receiver that requires one. The API never
//! returns the secrets (reads show the kind, and for certificates subject and expiry); bad
//! ones are refused; `null` removes them; the portal's owner may set them.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

use std::net::Ipv4Addr;

use crate::support::canary::Canary;
use crate::support::certs::{TestCa, self_signed_client};
use crate::support::dns::{Answer, StubDns};
use crate::support::receiver::Received;
use crate::support::{Receiver, Reply, TestServer, eventually};

/// A token server's answer: token `tok-{n}` for its n-th request (from 0), valid `expires_in`.
fn token_reply(n: usize, expires_in: u64) -> Reply {
    let body = json!({"access_token": format!("tok-{n}"), "token_type": "Bearer", "expires_in": expires_in});
    Reply::ok().header("content-type", "application/json").body(&body.to_string())
}

/// An OAuth2 grant against `token_url`.
fn oauth2(token_url: &str) -> Value {
    json!({"type": "oauth2", "tokenUrl": token_url, "clientId": "herald", "clientSecret": "cl1ent-s3cret",
           "scopes": ["hooks:write"], "audience": "https://api.example"})
}

fn bearer(request: &Received) -> &str {
    request.header("authorization")
}

#[tokio::test]
async fn basic_credentials_go_out_with_every_attempt_and_are_never_read_back() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let extra = json!({
        "auth": {"type": "basic", "username": "herald", "password": "open sesame"},
        "headers": {"Authorization": "Bearer overridden", "x-team": "blue"},
        "transform": "{payload: {headers: .headers}}",
    });
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), extra).await;
    assert_eq!(endpoint["auth"], json!({"type": "basic"}), "the kind only: {endpoint}");
    assert!(!endpoint.to_string().contains("sesame"));
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let got = receiver.wait_for(None, 1).await;
    assert_eq!(got[0].header("authorization"), "Basic aGVyYWxkOm9wZW4gc2VzYW1l", "the credentials win");
    assert_eq!(got[0].body.as_ref(), br#"{"headers":{"x-team":"blue"}}"#, "the transform saw no credentials");

    let path = format!("/api/v1/app/{app}/endpoint/{ep}");
    for read in [server.get(&path).await.1, server.get(&format!("/api/v1/app/{app}/endpoint")).await.1] {
        assert!(
            !read.to_string().contains("sesame") && read.to_string().contains(r#""auth":{"type":"basic"}"#),
            "{read}"
        );
    }
    // An update that leaves `auth` out keeps it; a patch with null removes it.
    let (status, _) = server.call(Method::PUT, &path, Some(json!({"url": receiver.url("/hook")}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(server.get(&path).await.1["auth"], json!({"type": "basic"}));
    let (_, patched) = server.call(Method::PATCH, &path, Some(json!({"auth": null}))).await;
    assert!(patched.get("auth").is_none(), "{patched}");
    server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let got = receiver.wait_for(None, 2).await;
    assert_eq!(got[1].header("authorization"), "Bearer overridden", "back to the endpoint's own header");
}

#[tokio::test]
async fn bad_credentials_are_refused_and_the_owner_may_set_them() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    let bad = json!({"url": "https://example.com/h", "auth": {"type": "basic", "username": "a:b", "password": "x"}});
    let (status, body) = server.post(&path, bad).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "auth", "username"]), "{body}");
    let unknown = json!({"url": "https://example.com/h", "auth": {"type": "telepathy"}});
    let (status, body) = server.post(&path, unknown).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    let endpoint = server.create_endpoint(&app, "https://example.com/h", json!({})).await;
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let token = access["token"].as_str().unwrap();
    let answer = server
        .request_as(token, Method::PATCH, &format!("{path}/{}", endpoint["id"].as_str().unwrap()))
        .json(&json!({"auth": {"type": "basic", "username": "u", "password": "p"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(answer.json::<serde_json::Value>().await.unwrap()["auth"], json!({"type": "basic"}));
    let client = TestCa::new("owner CA").client("owner");
    let owned = json!({"auth": oauth2("https://id.example.com/token"),
                       "tls": {"clientCertificatePem": client.cert_pem, "clientKeyPem": client.key_pem}});
    let answer = server
        .request_as(token, Method::PATCH, &format!("{path}/{}", endpoint["id"].as_str().unwrap()))
        .json(&owned)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::OK);
    let read = answer.json::<Value>().await.unwrap();
    assert_eq!(
        (read["auth"]["type"].as_str(), read["tls"]["clientCertificate"]["subject"].as_str()),
        (Some("oauth2"), Some("CN=owner"))
    );
}

/// How long a token is reused within its window, and that it is fetched again once the
/// window is over, is timed on a clock the unit tests of `deliver/oauth2.rs` move by hand;
/// here a token that expires at once stands for one that has expired.
#[tokio::test]
async fn oauth2_tokens_are_fetched_once_per_expiry_window_and_shared_by_every_delivery() {
    // Tokens live an hour on /token; those of /short-token expire as they are given.
    let receiver = Receiver::start(|request, n| match request.path.as_str() {
        "/token" => token_reply(n, 3600),
        "/short-token" => token_reply(n, 0),
        _ => Reply::ok(),
    })
    .await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let endpoint =
        server.create_endpoint(&app, &receiver.url("/hook"), json!({"auth": oauth2(&receiver.url("/token"))})).await;
    let shown = json!({"type": "oauth2", "tokenUrl": receiver.url("/token"), "clientId": "herald",
                       "scopes": ["hooks:write"], "audience": "https://api.example"});
    assert_eq!(endpoint["auth"], shown, "the grant without its secret: {endpoint}");
    for _ in 0..12 {
        server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    }
    let hooks = receiver.wait_for(Some("/hook"), 12).await;
    assert!(hooks.iter().all(|r| bearer(r) == "Bearer tok-0"), "{:?}", hooks.iter().map(bearer).collect::<Vec<_>>());
    let tokens = receiver.requests_to("/token");
    assert_eq!(tokens.len(), 1, "one token for twelve deliveries");
    let asked = &tokens[0];
    assert_eq!((asked.method.as_str(), asked.header("content-type")), ("POST", "application/x-www-form-urlencoded"));
    // RFC 6749 §2.3.1: the client's id and secret in HTTP Basic.
    assert_eq!(asked.header("authorization"), "Basic aGVyYWxkOmNsMWVudC1zM2NyZXQ=");
    assert_eq!(
        std::str::from_utf8(&asked.body).unwrap(),
        "grant_type=client_credentials&scope=hooks%3Awrite&audience=https%3A%2F%2Fapi.example"
    );

    // The simulation shows that a token goes out, not the token.
    let ep = endpoint["id"].as_str().unwrap();
    let (status, simulated) = server
        .post(
            &format!("/api/v1/app/{app}/endpoint/{ep}/transformation/simulate"),
            json!({"eventType": "e", "payload": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{simulated}");
    assert_eq!(simulated["headers"]["authorization"], "<sensitive>", "{simulated}");
    assert_eq!(receiver.requests_to("/token").len(), 1, "simulating fetches no token");

    // A token that has expired is fetched again.
    let mut in_body = oauth2(&receiver.url("/short-token"));
    in_body["clientAuthMethod"] = json!("client_secret_post");
    let short = server.create_endpoint(&app, &receiver.url("/short"), json!({"auth": in_body})).await;
    let only_short = json!({"eventType": "e", "payload": {}});
    let (status, _) = server
        .call(
            Method::PATCH,
            &format!("/api/v1/app/{app}/endpoint/{}", endpoint["id"].as_str().unwrap()),
            Some(json!({"disabled": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    server.send(&app, only_short.clone()).await;
    receiver.wait_for(Some("/short"), 1).await;
    server.send(&app, only_short).await;
    let got = receiver.wait_for(Some("/short"), 2).await;
    assert_eq!(got.iter().map(bearer).collect::<Vec<_>>(), ["Bearer tok-0", "Bearer tok-1"]);
    assert_eq!(receiver.requests_to("/short-token").len(), 2, "a new token after the first expired");
    let posted = &receiver.requests_to("/short-token")[0];
    assert_eq!(posted.header("authorization"), "", "client_secret_post: no Basic header");
    assert!(std::str::from_utf8(&posted.body).unwrap().ends_with("&client_id=herald&client_secret=cl1ent-s3cret"));
    assert!(!short.to_string().contains("cl1ent-s3cret") && !endpoint.to_string().contains("cl1ent-s3cret"));
}

#[tokio::test]
async fn a_401_refreshes_the_token_once_and_sends_once_more() {
    // /hook refuses the first token; /strict refuses every token.
    let receiver = Receiver::start(|request, n| match request.path.as_str() {
        "/token" | "/strict-token" => token_reply(n, 3600),
        "/hook" if bearer(request) == "Bearer tok-0" => Reply::status(401),
        "/strict" => Reply::status(401),
        _ => Reply::ok(),
    })
    .await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let hook =
        server.create_endpoint(&app, &receiver.url("/hook"), json!({"auth": oauth2(&receiver.url("/token"))})).await;
    let msg = server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let got = receiver.wait_for(Some("/hook"), 2).await;
    assert_eq!(got.iter().map(bearer).collect::<Vec<_>>(), ["Bearer tok-0", "Bearer tok-1"]);
    assert_eq!(receiver.requests_to("/token").len(), 2, "exactly one refresh");
    let attempts = eventually("the attempt", || async {
        let attempts = server.attempts(&app, &msg).await;
        (!attempts.is_empty()).then_some(attempts)
    })
    .await;
    assert_eq!(attempts.len(), 1, "one attempt: the refresh is part of it");
    assert_eq!(attempts[0]["responseStatusCode"], 200);
    // Later deliveries use the new token without asking again.
    server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    assert_eq!(bearer(&receiver.wait_for(Some("/hook"), 3).await[2]), "Bearer tok-1");
    assert_eq!(receiver.requests_to("/token").len(), 2);

    // A receiver that refuses the fresh token too: exactly one refresh, one more send,
    // and the attempt fails with the 401.
    let ep = hook["id"].as_str().unwrap();
    server.call(Method::PATCH, &format!("/api/v1/app/{app}/endpoint/{ep}"), Some(json!({"disabled": true}))).await;
    server
        .create_endpoint(&app, &receiver.url("/strict"), json!({"auth": oauth2(&receiver.url("/strict-token"))}))
        .await;
    let msg = server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let attempts = eventually("the refused attempt", || async {
        let attempts = server.attempts(&app, &msg).await;
        (!attempts.is_empty()).then_some(attempts)
    })
    .await;
    assert_eq!(attempts[0]["responseStatusCode"], 401);
    assert_eq!(receiver.requests_to("/strict").len(), 2, "sent once more, not again");
    assert_eq!(receiver.requests_to("/strict-token").len(), 2, "refreshed once");
}

#[tokio::test]
async fn a_token_server_that_fails_makes_auth_token_failures_that_are_retried() {
    // The token server fails twice (500, then an answer without a token), then works.
    let receiver = Receiver::start(|request, n| match (request.path.as_str(), n) {
        ("/token", 0) => Reply::status(500)
            .header("content-type", "application/json")
            .body(r#"{"error":"server_error","error_description":"echo cl1ent-s3cret"}"#),
        ("/token", 1) => Reply::ok().header("content-type", "application/json").body(r#"{"token_type":"Bearer"}"#),
        ("/token", n) => token_reply(n, 3600),
        _ => Reply::ok(),
    })
    .await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let delivery = json!({"retry": {"strategy": "schedule", "delaysMs": [1, 1, 1], "jitterPercent": 0}});
    let extra = json!({"auth": oauth2(&receiver.url("/token")), "delivery": delivery});
    server.create_endpoint(&app, &receiver.url("/hook"), extra).await;
    let msg = server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    assert_eq!(bearer(&receiver.wait_for(Some("/hook"), 1).await[0]), "Bearer tok-2");
    let attempts = eventually("three attempts", || async {
        let attempts = server.attempts(&app, &msg).await;
        (attempts.len() == 3).then_some(attempts)
    })
    .await;
    let classes: Vec<_> = attempts.iter().map(|a| a["errorClass"].clone()).collect();
    assert_eq!(classes, [json!("auth_token"), json!("auth_token"), Value::Null], "{attempts:?}");
    assert_eq!(attempts[0]["error"], "the token endpoint answered 500 (server_error)");
    assert_eq!(attempts[1]["error"], "the token endpoint's answer has no access_token");
    assert!(!json!(attempts).to_string().contains("cl1ent-s3cret"), "the description is never quoted");
}

#[tokio::test]
async fn token_urls_are_judged_by_the_destination_guard() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    for token_url in ["http://169.254.169.254/latest/meta-data", "file:///etc/passwd", "http://id.example.com/token"] {
        let body = json!({"url": "https://example.com/h", "auth": oauth2(token_url)});
        let (status, body) = server.post(&path, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{token_url}: {body}");
        assert_eq!(body["detail"][0]["loc"], json!(["body", "auth", "tokenUrl"]), "{body}");
    }
    // The client secret travels over TLS only (the loopback token servers of these tests
    // are in the operator's allowed networks, which is what lets them use plain HTTP).
    let (_, body) =
        server.post(&path, json!({"url": "https://example.com/h", "auth": oauth2("http://id.example.com/t")})).await;
    assert_eq!(body["detail"][0]["msg"], "must be an https URL (the client secret is sent to it)", "{body}");
    let mut secretless = oauth2("https://id.example.com/token");
    secretless["clientSecret"] = json!("");
    let (status, body) = server.post(&path, json!({"url": "https://example.com/h", "auth": secretless})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "auth", "clientSecret"]), "{body}");
}

#[tokio::test]
async fn a_token_url_whose_name_resolves_to_a_forbidden_address_is_never_asked() {
    let canary = Canary::start().await;
    let dns = StubDns::start(|name, _| (name == "token.ssrf.test").then(|| vec![Answer::A(Ipv4Addr::LOCALHOST)])).await;
    let receiver = Receiver::start_at("127.0.0.2", |_, _| Reply::ok()).await;
    let server = TestServer::start_with(|c| {
        c.delivery.allowed_networks = vec!["127.0.0.2/32".parse().unwrap()];
        c.delivery.dns_servers = vec![dns.addr];
    })
    .await;
    let app = server.create_app("shop").await;
    let token_url = format!("https://token.ssrf.test:{}/token", canary.port());
    let no_retries = json!({"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1}});
    let extra = json!({"auth": oauth2(&token_url), "delivery": no_retries});
    server.create_endpoint(&app, &receiver.url("/hook"), extra).await;
    let msg = server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let attempt = eventually("the attempt", || async { server.attempts(&app, &msg).await.into_iter().next() }).await;
    assert_eq!(attempt["errorClass"], "auth_token", "{attempt}");
    assert!(attempt["error"].as_str().unwrap().contains("(127.0.0.1) is not allowed"), "{attempt}");
    assert_eq!(canary.connections(), 0, "the token request never left");
    assert!(receiver.requests().is_empty());
}

#[tokio::test]
async fn client_certificates_are_presented_to_receivers_that_require_them() {
    let ca = TestCa::new("Herald test CA");
    let server_identity = ca.server();
    let receiver = Receiver::start_tls(ca.requiring_clients(&server_identity), |_, _| Reply::ok()).await;
    let client = ca.client("herald-client");
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let no_retries = json!({"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1}});
    let tls = json!({"clientCertificatePem": client.cert_pem, "clientKeyPem": client.key_pem, "caPem": ca.cert_pem});
    let good =
        server.create_endpoint(&app, &receiver.https_url("/good"), json!({"tls": tls, "delivery": no_retries})).await;
    assert_eq!(good["tls"]["clientCertificate"]["subject"], "CN=herald-client", "{good}");
    assert_eq!(good["tls"]["clientCertificate"]["issuer"], "CN=Herald test CA");
    assert!(good["tls"]["clientCertificate"]["expiresAt"].as_str().unwrap().starts_with("4096-"), "{good}");
    assert_eq!(good["tls"]["ca"][0]["subject"], "CN=Herald test CA");
    assert!(!good.to_string().contains("PRIVATE KEY"), "{good}");

    // First the trusted certificate alone: its connection stays in its pool.
    let first = server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    receiver.wait_for(Some("/good"), 1).await;
    let delivered =
        eventually("the first attempt", || async { server.attempts(&app, &first).await.into_iter().next() }).await;
    assert_eq!(delivered["responseStatusCode"], 200);
    let (status, _) = server
        .call(
            Method::PATCH,
            &format!("/api/v1/app/{app}/endpoint/{}", good["id"].as_str().unwrap()),
            Some(json!({"disabled": true})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);

    // Then, to the same receiver, a certificate it does not trust (self-signed), and no
    // certificate (the endpoint does not trust the receiver either: only its own `caPem`
    // would). Neither reuses the trusted endpoint's pooled connection.
    let rogue = self_signed_client("rogue");
    let rogue_tls =
        json!({"clientCertificatePem": rogue.cert_pem, "clientKeyPem": rogue.key_pem, "caPem": ca.cert_pem});
    let rogue_ep = server
        .create_endpoint(&app, &receiver.https_url("/rogue"), json!({"tls": rogue_tls, "delivery": no_retries}))
        .await;
    let bare = server.create_endpoint(&app, &receiver.https_url("/bare"), json!({"delivery": no_retries})).await;
    let msg = server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let attempts = eventually("two attempts", || async {
        let attempts = server.attempts(&app, &msg).await;
        (attempts.len() == 2).then_some(attempts)
    })
    .await;
    let of = |ep: &Value| attempts.iter().find(|a| a["endpointId"] == ep["id"]).unwrap().clone();
    for failed in [of(&rogue_ep), of(&bare)] {
        assert_eq!(failed["errorClass"], "tls", "{failed}");
        assert_eq!(failed["responseStatusCode"], 0, "{failed}");
    }
    assert_eq!(receiver.requests().len(), 1, "only the trusted client got a request through");

    // Reads never show the key; `null` removes the certificate.
    let path = format!("/api/v1/app/{app}/endpoint/{}", good["id"].as_str().unwrap());
    assert!(!server.get(&path).await.1.to_string().contains("PRIVATE KEY"));
    let (_, patched) = server.call(Method::PATCH, &path, Some(json!({"tls": null}))).await;
    assert!(patched.get("tls").is_none(), "{patched}");
}

#[tokio::test]
async fn unusable_certificates_are_refused_with_the_field_at_fault() {
    let ca = TestCa::new("Herald test CA");
    let (client, other) = (ca.client("a"), ca.client("b"));
    let expired = ca.expired_client("old", 3);
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    let cases = [
        (
            json!({"clientCertificatePem": client.cert_pem, "clientKeyPem": other.key_pem}),
            "clientKeyPem",
            "does not go with the certificate",
        ),
        (
            json!({"clientCertificatePem": "hello", "clientKeyPem": client.key_pem}),
            "clientCertificatePem",
            "holds no CERTIFICATE block",
        ),
        (
            json!({"clientCertificatePem": client.cert_pem, "clientKeyPem": "nope"}),
            "clientKeyPem",
            "holds no unencrypted",
        ),
        (
            json!({"clientCertificatePem": expired.cert_pem, "clientKeyPem": expired.key_pem}),
            "clientCertificatePem",
            "expired at",
        ),
        (
            json!({"clientCertificatePem": client.cert_pem, "clientKeyPem": client.key_pem, "caPem": "x"}),
            "caPem",
            "holds no CERTIFICATE block",
        ),
    ];
    for (tls, field, says) in cases {
        let (status, body) = server.post(&path, json!({"url": "https://example.com/h", "tls": tls})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["detail"][0]["loc"], json!(["body", "tls", field]), "{body}");
        assert!(body["detail"][0]["msg"].as_str().unwrap().contains(says), "{body}");
        assert!(!body.to_string().contains("PRIVATE KEY"), "the key is never echoed: {body}");
    }
}

#[tokio::test]
async fn deliveries_waiting_for_a_token_share_its_one_request_and_its_failure() {
    // Slow token servers: one answers a token, the other fails, each after 800 ms.
    let receiver = Receiver::start(|request, n| match request.path.as_str() {
        "/token" => token_reply(n, 3600).after(Duration::from_millis(800)),
        "/down-token" => Reply::status(503).after(Duration::from_millis(800)),
        _ => Reply::ok(),
    })
    .await;
    let server = TestServer::start().await;
    let once = json!({"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1}});
    let (up, down) = (server.create_app("up").await, server.create_app("down").await);
    server.create_endpoint(&up, &receiver.url("/hook"), json!({"auth": oauth2(&receiver.url("/token"))})).await;
    let extra = json!({"auth": oauth2(&receiver.url("/down-token")), "delivery": once});
    server.create_endpoint(&down, &receiver.url("/never"), extra).await;
    let mut failing = Vec::new();
    for _ in 0..6 {
        server.send(&up, json!({"eventType": "e", "payload": {}})).await;
        failing.push(server.send(&down, json!({"eventType": "e", "payload": {}})).await);
    }
    let hooks = receiver.wait_for(Some("/hook"), 6).await;
    assert!(hooks.iter().all(|r| bearer(r) == "Bearer tok-0"));
    assert_eq!(receiver.requests_to("/token").len(), 1, "six deliveries, one token request");
    for msg in &failing {
        let attempt =
            eventually("the failed attempt", || async { server.attempts(&down, msg).await.into_iter().next() }).await;
        assert_eq!(
            (attempt["errorClass"].as_str(), attempt["error"].as_str()),
            (Some("auth_token"), Some("the token endpoint answered 503"))
        );
    }
    assert_eq!(receiver.requests_to("/down-token").len(), 1, "the waiting deliveries shared the one failure");
    assert!(receiver.requests_to("/never").is_empty());
}
