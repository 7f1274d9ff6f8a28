//! Messages and attempts as Svix has them: inline applications, expunged content,
//! `rawPayload`, deleted endpoints among a message's destinations, event type schemas.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{call, problem};
use crate::support::{Receiver, TestServer, eventually};

/// Creating a message or a portal link for an application that does not exist: the inline
/// `application` must carry the path's uid, or the request is a 422 and nothing is created.
#[tokio::test]
async fn an_inline_application_must_carry_the_path_uid() {
    let server = TestServer::start().await;
    let routes = [
        ("/api/v1/app/acme/msg", json!({"eventType": "a", "payload": {}})),
        ("/api/v1/auth/app-portal-access/acme", json!({})),
    ];
    for (path, body) in routes {
        for slash in ["", "/"] {
            let path = format!("{path}{slash}");
            let with = |application: Value| {
                let mut body = body.clone();
                body["application"] = application;
                body
            };
            let (status, refused) = server.post(&path, with(json!({"name": "Acme"}))).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {refused}");
            let expected = ("body.application.uid", "Application UID not set in body", "application_uid_missing");
            assert_eq!(problem(&refused), (expected.0.into(), expected.1.into(), expected.2.into()), "{path}");
            let (status, refused) = server.post(&path, with(json!({"name": "Acme", "uid": "other"}))).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {refused}");
            let expected =
                ("body.application.uid", "Application UID in the path and body must match", "application_uid_mismatch");
            assert_eq!(problem(&refused), (expected.0.into(), expected.1.into(), expected.2.into()), "{path}");
            let (status, _) = server.post(&path, body.clone()).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{path}: no inline application, no application");
        }
    }
    for uid in ["acme", "other"] {
        assert_eq!(
            server.get(&format!("/api/v1/app/{uid}")).await.0,
            StatusCode::NOT_FOUND,
            "nothing created as {uid}"
        );
    }
    let (status, sent) = server
        .post(
            "/api/v1/app/acme/msg",
            json!({"eventType": "a", "payload": {}, "application": {"name": "Acme", "uid": "acme"}}),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{sent}");
    let (status, app) = server.get("/api/v1/app/acme").await;
    assert_eq!((status, app["name"].as_str()), (StatusCode::OK, Some("Acme")));
    let (status, access) = server
        .post("/api/v1/auth/app-portal-access/beta", json!({"application": {"name": "Beta", "uid": "beta"}}))
        .await;
    assert_eq!(status, StatusCode::OK, "{access}");
    assert_eq!(server.get("/api/v1/app/beta").await.0, StatusCode::OK);
}

/// Expunged content reads as Svix shows it, and a message without its payload cannot be
/// resent (400 `missing_payload`).
#[tokio::test]
async fn expunged_content_reads_as_svix_and_cannot_be_resent() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("a").await;
    let ep = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let ep = ep["id"].as_str().unwrap();
    let msg = server.send(&app, json!({"eventType": "a", "payload": {"card": "4242"}})).await;
    receiver.wait_for(None, 1).await;
    let attempt = eventually("an attempt", || async { server.attempts(&app, &msg).await.first().cloned() }).await;
    let attempt = attempt["id"].as_str().unwrap();
    let (status, _) =
        server.call(Method::DELETE, &format!("/api/v1/app/{app}/msg/{msg}/attempt/{attempt}/content/"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(server.attempts(&app, &msg).await[0]["response"], "EXPUNGED");
    let (status, _) = server.call(Method::DELETE, &format!("/api/v1/app/{app}/msg/{msg}/content"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, message) = server.get(&format!("/api/v1/app/{app}/msg/{msg}")).await;
    assert_eq!(message["payload"], json!({"expired": true}));
    let (status, body) = server.post(&format!("/api/v1/app/{app}/msg/{msg}/endpoint/{ep}/resend"), json!({})).await;
    let expected = json!({"code": "missing_payload", "detail": "Unable to resend message. Payload is missing (probably expired)."});
    assert_eq!((status, body), (StatusCode::BAD_REQUEST, expected));
}

/// `transformationsParams.rawPayload` is the body sent and signed, byte for byte; a raw
/// body that is not JSON reads back as Svix shows it.
#[tokio::test]
async fn raw_payload_is_the_body_sent_and_signed() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("a").await;
    let ep = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let secret = server.secret(&app, ep["id"].as_str().unwrap()).await;
    let raw = "{\"b\": 2,   \"a\": 1}";
    let sent = json!({"eventType": "a", "payload": {"ignored": true}, "transformationsParams": {"rawPayload": raw}});
    let json_msg = server.send(&app, sent).await;
    let form = "a=1&b=2";
    let sent = json!({"eventType": "a", "payload": {}, "transformationsParams": {"rawPayload": form}});
    let form_msg = server.send(&app, sent).await;
    let got = receiver.wait_for(Some("/hook"), 2).await;
    let key = herald::signing::SigningKey::decode(&secret).unwrap();
    let now = chrono::Utc::now().timestamp();
    let mut bodies = vec![];
    for request in &got {
        let headers = herald::signing::SignedHeaders::from_pairs(
            request.headers.iter().map(|(k, v)| (k.as_str(), v.to_str().unwrap())),
        );
        assert!(herald::signing::verify(&key, &headers, &request.body, now).is_ok(), "signed as sent");
        bodies.push(String::from_utf8(request.body.to_vec()).unwrap());
    }
    bodies.sort();
    assert_eq!(bodies, [form, raw], "the raw payloads, byte for byte");
    let (_, read) = server.get(&format!("/api/v1/app/{app}/msg/{json_msg}")).await;
    assert_eq!(read["payload"], json!({"a": 1, "b": 2}));
    let (_, read) = server.get(&format!("/api/v1/app/{app}/msg/{form_msg}")).await;
    assert_eq!(read["payload"], json!({"expired": true}), "a raw body that is not JSON");
}

/// A message's attempted destinations keep an endpoint deleted since, in creation order,
/// page by page.
#[tokio::test]
async fn attempted_destinations_keep_deleted_endpoints() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("a").await;
    let mut endpoints = vec![];
    for path in ["/one", "/two", "/three"] {
        let ep = server.create_endpoint(&app, &receiver.url(path), json!({})).await;
        endpoints.push(ep["id"].as_str().unwrap().to_owned());
    }
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    receiver.wait_for(None, 3).await;
    let list = format!("/api/v1/app/{app}/msg/{msg}/endpoint");
    eventually("three deliveries recorded", || async {
        let (_, page) = server.get(&list).await;
        (page["data"].as_array().unwrap().iter().filter(|d| d["status"] == 0).count() == 3).then_some(())
    })
    .await;
    let (status, _) = server.call(Method::DELETE, &format!("/api/v1/app/{app}/endpoint/{}", endpoints[1]), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (mut listed, mut next) = (vec![], format!("{list}?limit=2"));
    loop {
        let (status, page) = server.get(&next).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        for destination in page["data"].as_array().unwrap() {
            listed.push((
                destination["id"].as_str().unwrap().to_owned(),
                destination["url"].as_str().unwrap().to_owned(),
            ));
        }
        if page["done"] == true {
            break;
        }
        next = format!("{list}?limit=2&iterator={}", page["iterator"].as_str().unwrap());
    }
    let expected: Vec<(String, String)> =
        endpoints.iter().zip(["/one", "/two", "/three"]).map(|(id, path)| (id.clone(), receiver.url(path))).collect();
    assert_eq!(listed, expected, "every destination, the deleted one included, in creation order");
    let (status, _) = server.get(&format!("/api/v1/app/{app}/endpoint/{}", endpoints[1])).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "deleted all the same");
}

#[tokio::test]
async fn event_type_schemas_must_be_json_schemas() {
    let server = TestServer::start().await;
    let invalid = json!({"1": {"type": "not-a-type"}});
    let (status, body) =
        server.post("/api/v1/event-type", json!({"name": "a.b", "description": "x", "schemas": invalid})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(problem(&body).0, "body.schemas");
    let valid = json!({"1": {"type": "object", "properties": {"n": {"type": "integer"}}}});
    let (status, body) =
        server.post("/api/v1/event-type/", json!({"name": "a.b", "description": "x", "schemas": valid})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) =
        call(&server, super::ADMIN, Method::PATCH, "/api/v1/event-type/a.b", Some(json!({"schemas": invalid}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "PATCH validates too");
}
