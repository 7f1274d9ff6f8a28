//! Authenticated delivery (Herald extension `auth`): HTTP Basic credentials go out with
//! every attempt (over an endpoint header of the same name, and after a transform, which
//! never sees them); the API never returns them (reads say only the kind); bad ones are
//! refused; `null` removes them; the portal's owner may set them.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{Receiver, TestServer};

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
}
