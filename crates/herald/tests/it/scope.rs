//! Tenant scoping by extractor (`herald::api::scope`): the extractors that hand a handler
//! its application, endpoint, message or poller authenticate the caller first and charge
//! the request to its token once, however many of them a handler takes. (That another
//! application's ids answer 404 through every route is the isolation matrix's job.)

use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Receiver, TestServer};

#[tokio::test]
async fn a_request_that_names_a_scoped_row_is_charged_to_its_token_once() {
    let server = TestServer::start_with(|c| c.auth.portal_requests_per_second = Some(5)).await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/"), json!({})).await;
    let token = server.portal_token(&app).await;
    let client = reqwest::Client::new();
    // The handler takes the caller (it decides what the secret read shows) and the endpoint.
    let url = server.url(&format!("/api/v1/app/{app}/endpoint/{}/secret", endpoint["id"].as_str().unwrap()));
    for n in 1..=5 {
        let answer = client.get(&url).bearer_auth(&token).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "request {n} of a budget of 5");
    }
    let refused = client.get(&url).bearer_auth(&token).send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "the sixth request is over the budget");
}

#[tokio::test]
async fn the_caller_is_authenticated_before_any_id_in_the_path_is_looked_up() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/"), json!({})).await;
    let endpoint = endpoint["id"].as_str().unwrap();
    let client = reqwest::Client::new();
    let paths = [
        format!("/api/v1/app/{app}/endpoint/{endpoint}"),
        format!("/api/v1/app/{app}/endpoint/ep_doesnotexist"),
        "/api/v1/app/app_doesnotexist/endpoint/ep_doesnotexist".to_owned(),
        "/api/v1/app/app_doesnotexist/msg/msg_doesnotexist".to_owned(),
        "/api/v1/app/app_doesnotexist/poller/poll_doesnotexist".to_owned(),
    ];
    for path in &paths {
        let anonymous = client.get(server.url(path)).send().await.unwrap();
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED, "{path} without a token");
        let wrong = client.get(server.url(path)).bearer_auth("testsk_wrong").send().await.unwrap();
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED, "{path} with a wrong token");
    }
}
