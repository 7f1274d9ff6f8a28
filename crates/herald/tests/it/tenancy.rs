//! The tenant rules: the operator (admin token) owns applications, their uid, limits and
//! deletion; a customer (portal token) owns what is inside its application. Refusals are
//! 403 on the customer's own application, and never reveal anything about another's.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::TestServer;

struct Customer<'a> {
    server: &'a TestServer,
    token: String,
}

impl Customer<'_> {
    async fn of<'s>(server: &'s TestServer, app: &str) -> Customer<'s> {
        let (status, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{access}");
        Customer { server, token: access["token"].as_str().unwrap().to_owned() }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = reqwest::Client::new().request(method, self.server.url(path)).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status();
        (status, answer.json().await.unwrap_or(Value::Null))
    }
}

/// Regression (issue 16, finding 1): a portal token renamed its application's uid to
/// another customer's, and the operator's get-or-create, message creation and portal
/// access for that uid then landed on the attacker's application.
#[tokio::test]
async fn a_portal_token_cannot_take_another_customers_uid() {
    let server = TestServer::start().await;
    let (_, attacker) = server.post("/api/v1/app", json!({"name": "attacker", "uid": "customer-1"})).await;
    let attacker = attacker["id"].as_str().unwrap().to_owned();
    let customer = Customer::of(&server, &attacker).await;
    for method in [Method::PATCH, Method::PUT] {
        let (status, answer) = customer
            .call(method.clone(), &format!("/api/v1/app/{attacker}"), Some(json!({"name": "x", "uid": "customer-999"})))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method}: {answer}");
        assert!(answer["detail"].as_str().unwrap().contains("operator"), "a clear message: {answer}");
    }
    let (_, app) = server.get(&format!("/api/v1/app/{attacker}")).await;
    assert_eq!(app["uid"], "customer-1", "unchanged");
    // The operator's usual get-or-create makes customer 999 its own application.
    let (status, created) =
        server.post("/api/v1/app?get_if_exists=true", json!({"name": "customer 999", "uid": "customer-999"})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_ne!(created["id"], attacker.as_str());
}

/// Regression (issue 16, finding 3): a tenant lifted the limits its operator set.
#[tokio::test]
async fn a_portal_token_cannot_lift_its_limits_or_rename_or_delete_its_application() {
    let server = TestServer::start().await;
    let limits = json!({"name": "limited", "uid": "limited", "throttleRate": 5, "maxConcurrency": 2, "weight": 1,
                        "metadata": {"plan": "free"}});
    let (_, app) = server.post("/api/v1/app", limits).await;
    let app = app["id"].as_str().unwrap().to_owned();
    let before = server.get(&format!("/api/v1/app/{app}")).await.1;
    let customer = Customer::of(&server, &app).await;
    let path = format!("/api/v1/app/{app}");
    let patches = [
        json!({"maxConcurrency": 10000}),
        json!({"weight": 1000}),
        json!({"throttleRate": null}),
        json!({"name": "renamed"}),
        json!({"metadata": {"plan": "enterprise"}}),
    ];
    for patch in patches {
        let (status, answer) = customer.call(Method::PATCH, &path, Some(patch.clone())).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "PATCH {patch}: {answer}");
    }
    let (status, _) = customer.call(Method::PUT, &path, Some(json!({"name": "limited"}))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "a PUT would clear every limit");
    let (status, _) = customer.call(Method::DELETE, &path, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(server.get(&path).await.1, before, "nothing changed");
    let (status, own) = customer.call(Method::GET, &path, None).await;
    assert_eq!((status, own["maxConcurrency"].as_i64()), (StatusCode::OK, Some(2)), "it may read it");
    // What it owns, it may change: its endpoints.
    let (status, endpoint) = customer
        .call(Method::POST, &format!("{path}/endpoint"), Some(json!({"url": "https://hooks.example.com/"})))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{endpoint}");
    let ep = endpoint["id"].as_str().unwrap();
    let (status, _) =
        customer.call(Method::PATCH, &format!("{path}/endpoint/{ep}"), Some(json!({"throttleRate": 3}))).await;
    assert_eq!(status, StatusCode::OK);
}

/// Regression (issue 16, finding 9): renaming one's uid to an existing one answered 409,
/// telling a tenant which uids other customers have.
#[tokio::test]
async fn a_portal_token_learns_nothing_about_other_customers_uids() {
    let server = TestServer::start().await;
    server.post("/api/v1/app", json!({"name": "someone", "uid": "someone-else"})).await;
    let own = server.create_app("mine").await;
    let customer = Customer::of(&server, &own).await;
    let path = format!("/api/v1/app/{own}");
    let taken = customer.call(Method::PATCH, &path, Some(json!({"uid": "someone-else"}))).await;
    let free = customer.call(Method::PATCH, &path, Some(json!({"uid": "nobody-has-this"}))).await;
    assert_eq!(taken.0, StatusCode::FORBIDDEN);
    assert_eq!(taken, free, "the same answer whether the uid exists or not");
}
