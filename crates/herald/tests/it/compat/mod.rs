//! The Svix server's wire behaviour, item by item, through raw HTTP the way integrations
//! and older SDKs call the API (the official SDKs have their own tests: `sdk.rs`). Each
//! module covers a group of behaviours; every request helper here also sends the same
//! request with a trailing slash where that matters, since Svix serves both forms.

mod endpoints;
mod general;
mod messages;
mod pagination;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::TestServer;
use crate::support::server::ADMIN_TOKEN;

/// Sends `method path` with `token` (and a JSON body); the status and the JSON answer.
async fn call(
    server: &TestServer,
    token: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new().request(method, server.url(path)).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.unwrap();
    let status = answer.status();
    let text = answer.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// An event type with an example payload in its schema.
async fn event_type(server: &TestServer, name: &str) {
    let schema = json!({"1": {"type": "object", "examples": [{"example": name}]}});
    let (status, body) =
        server.post("/api/v1/event-type", json!({"name": name, "description": name, "schemas": schema})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// The single validation problem of a 422: (`loc` joined with dots, `msg`, `type`).
fn problem(body: &Value) -> (String, String, String) {
    let item = &body["detail"][0];
    let loc: Vec<&str> = item["loc"]
        .as_array()
        .unwrap_or_else(|| panic!("not a 422 body: {body}"))
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    (loc.join("."), item["msg"].as_str().unwrap().to_owned(), item["type"].as_str().unwrap().to_owned())
}

/// The admin token, for requests that need no other.
const ADMIN: &str = ADMIN_TOKEN;
