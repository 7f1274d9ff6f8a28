//! Two writers of one resource at the same moment (a customer and its operator, or two
//! tabs of the portal): both answer 2xx, so both changes must be there afterwards. Every
//! writable resource, twenty rounds each; before the fix one change was lost in most rounds.
//! (The admin token writes and reads here: a portal token's request budget would cut the
//! rounds short, and whose request it is does not change the race.)

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::Tenant;
use crate::support::{Receiver, TestServer};

const ROUNDS: usize = 20;

/// An application, called with the admin token.
async fn admin(server: &TestServer) -> Tenant {
    Tenant { app: server.create_app("shop").await, token: crate::support::server::ADMIN_TOKEN.to_owned() }
}

/// Sends two requests at once and checks both succeeded.
async fn at_once(server: &TestServer, first: (&str, Method, String, Value), second: (&str, Method, String, Value)) {
    let call = |(token, method, path, body): (&str, Method, String, Value)| {
        let request = server.request_as(token, method, &path).json(&body);
        async move {
            let answer = request.send().await.unwrap();
            let status = answer.status();
            (status, answer.text().await.unwrap())
        }
    };
    let (a, b) = tokio::join!(call(first), call(second));
    assert!(a.0.is_success() && b.0.is_success(), "both writes answered 2xx: {a:?} {b:?}");
}

#[tokio::test]
async fn a_rotation_and_a_patch_at_once_both_take_effect() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let tenant = admin(&server).await;
    let id = tenant.endpoint(&server, &receiver.url("/hook"), json!({})).await;
    let path = tenant.path(&format!("/endpoint/{id}"));
    for round in 0..ROUNDS {
        let (_, before) = tenant.call(&server, Method::GET, &format!("{path}/secret"), None).await;
        let description = format!("round {round}");
        at_once(
            &server,
            (&tenant.token, Method::POST, format!("{path}/secret/rotate"), json!({"gracePeriodSeconds": 0})),
            (&tenant.token, Method::PATCH, path.clone(), json!({"description": description})),
        )
        .await;
        let (_, after) = tenant.call(&server, Method::GET, &format!("{path}/secret"), None).await;
        let (_, endpoint) = tenant.call(&server, Method::GET, &path, None).await;
        assert_ne!(before["key"], after["key"], "round {round}: the rotation was lost");
        assert_eq!(endpoint["description"], description, "round {round}: the patch was lost");
    }
}

#[tokio::test]
async fn a_url_change_and_a_headers_change_at_once_both_take_effect() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let tenant = admin(&server).await;
    let id = tenant.endpoint(&server, &receiver.url("/hook"), json!({})).await;
    let path = tenant.path(&format!("/endpoint/{id}"));
    for round in 0..ROUNDS {
        let url = receiver.url(&format!("/hook-{round}"));
        let header = format!("value-{round}");
        at_once(
            &server,
            (&tenant.token, Method::PATCH, path.clone(), json!({"url": url})),
            (&tenant.token, Method::PATCH, format!("{path}/headers"), json!({"headers": {"x-round": header}})),
        )
        .await;
        let (_, endpoint) = tenant.call(&server, Method::GET, &path, None).await;
        let (_, headers) = tenant.call(&server, Method::GET, &format!("{path}/headers"), None).await;
        assert_eq!(endpoint["url"], url, "round {round}: the URL change was lost");
        assert_eq!(headers["headers"]["x-round"], header, "round {round}: the headers change was lost");
    }
}

#[tokio::test]
async fn two_patches_of_an_application_at_once_both_take_effect() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let token = crate::support::server::ADMIN_TOKEN;
    let path = format!("/api/v1/app/{app}");
    for round in 0..ROUNDS {
        let (name, note) = (format!("shop {round}"), format!("note {round}"));
        at_once(
            &server,
            (token, Method::PATCH, path.clone(), json!({"name": name})),
            (token, Method::PATCH, path.clone(), json!({"metadata": {"note": note}})),
        )
        .await;
        let (_, app) = server.get(&path).await;
        assert_eq!(
            (app["name"].as_str(), app["metadata"]["note"].as_str()),
            (Some(&*name), Some(&*note)),
            "round {round}"
        );
    }
}

#[tokio::test]
async fn two_patches_of_an_event_type_at_once_both_take_effect() {
    let server = TestServer::start().await;
    let (status, _) = server.post("/api/v1/event-type", json!({"name": "invoice.paid", "description": "d"})).await;
    assert_eq!(status, StatusCode::CREATED);
    let token = crate::support::server::ADMIN_TOKEN;
    let path = "/api/v1/event-type/invoice.paid".to_owned();
    for round in 0..ROUNDS {
        let (description, flag) = (format!("round {round}"), format!("flag-{round}"));
        at_once(
            &server,
            (token, Method::PATCH, path.clone(), json!({"description": description})),
            (token, Method::PATCH, path.clone(), json!({"featureFlag": flag})),
        )
        .await;
        let (_, et) = server.get(&path).await;
        assert_eq!(
            (et["description"].as_str(), et["featureFlag"].as_str()),
            (Some(&*description), Some(&*flag)),
            "round {round}"
        );
    }
}

#[tokio::test]
async fn two_patches_of_a_poller_at_once_both_take_effect() {
    let server = TestServer::start().await;
    let tenant = admin(&server).await;
    let (status, poller) = tenant.post(&server, &tenant.path("/poller"), json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    let path = tenant.path(&format!("/poller/{}", poller["id"].as_str().unwrap()));
    for round in 0..ROUNDS {
        let (description, filter) = (format!("round {round}"), format!(".payload.n == {round}"));
        at_once(
            &server,
            (&tenant.token, Method::PATCH, path.clone(), json!({"description": description})),
            (&tenant.token, Method::PATCH, path.clone(), json!({"filter": filter})),
        )
        .await;
        let (_, poller) = tenant.call(&server, Method::GET, &path, None).await;
        assert_eq!(
            (poller["description"].as_str(), poller["filter"].as_str()),
            (Some(&*description), Some(&*filter)),
            "round {round}"
        );
    }
}
