//! A customer is an adversary: each test here is an attack a portal-token holder can make
//! through the real HTTP API, and what must hold while it runs: the server keeps answering,
//! other tenants' answers and deliveries are untouched, and what the attacker holds stays
//! bounded. Each finding of issue 31 has its test, which fails on the code before the fix.
//! The suite runs on SQLite and again on PostgreSQL (`scripts/test.sh`).
//!
//! - `expressions`: nesting bombs in every expression field, deep JSON, an evaluation cut
//!   off by its client, a tenant whose filters run to the deadline.
//! - `connections`: slow heads and bodies, idle connections, the connection cap, keyed POSTs
//!   beside slow ones, two `Authorization` headers, the failed-authentication budget.
//! - `pollers`: long-polls that must wake for their own application only and read on, the
//!   caps on waiting long-polls, pollers and consumers, a refused read that moves nothing.
//! - `endpoints`: the endpoint cap, churn that must leave nothing behind, a slow endpoint
//!   beside a fast one, deleting a parked endpoint, a resend beside a scheduled retry, many
//!   client certificates beside another tenant's warm connection.
//! - `races`: two writers of the same resource at the same time, on every writable one.

mod connections;
mod endpoints;
mod expressions;
mod pollers;
mod races;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::TestServer;

/// A customer: an application and a portal token of it.
pub struct Tenant {
    pub app: String,
    pub token: String,
}

impl Tenant {
    /// A new application (made by the operator) and its customer's portal token.
    pub async fn new(server: &TestServer, name: &str) -> Self {
        let app = server.create_app(name).await;
        let token = server.portal_token(&app).await;
        Self { app, token }
    }

    /// Calls the API as this customer; the status and the JSON answer (`null` if none).
    pub async fn call(
        &self,
        server: &TestServer,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = server.request_as(&self.token, method, path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.expect("the server answers");
        let status = answer.status();
        (status, serde_json::from_str(&answer.text().await.unwrap()).unwrap_or(Value::Null))
    }

    pub async fn post(&self, server: &TestServer, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(server, Method::POST, path, Some(body)).await
    }

    /// `/api/v1/app/{app}` followed by `rest`.
    pub fn path(&self, rest: &str) -> String {
        format!("/api/v1/app/{}{rest}", self.app)
    }

    /// Creates an endpoint with `extra` fields, expecting success; its id.
    pub async fn endpoint(&self, server: &TestServer, url: &str, extra: Value) -> String {
        let mut body = json!({"url": url});
        body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
        let (status, endpoint) = self.post(server, &self.path("/endpoint"), body).await;
        assert_eq!(status, StatusCode::CREATED, "{endpoint}");
        endpoint["id"].as_str().unwrap().to_owned()
    }
}

/// The field a 422 names first (`body.<field>` as a dotted path) and its message.
pub fn refused_field(answer: &Value) -> (String, String) {
    let item = &answer["detail"][0];
    let loc: Vec<&str> =
        item["loc"].as_array().map(|l| l.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    (loc.get(1..).unwrap_or_default().join("."), item["msg"].as_str().unwrap_or_default().to_owned())
}

/// The server still answers its health check and serves another tenant end to end.
pub async fn still_serving(server: &TestServer, bystander: &Tenant) {
    let health = reqwest::get(server.url("/api/v1/health")).await.expect("the server is up");
    assert_eq!(health.status(), StatusCode::NO_CONTENT, "healthy");
    let (status, _) = bystander.call(server, Method::GET, &bystander.path("/endpoint"), None).await;
    assert_eq!(status, StatusCode::OK, "another tenant is served");
}

/// The value of a Prometheus series in `/metrics` (0 when absent).
pub async fn metric(server: &TestServer, series: &str) -> f64 {
    let text = server.request_as_admin(Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |value| value.trim().parse().unwrap())
}
