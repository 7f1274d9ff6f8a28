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
        json!({"portalBrand": {"name": "not the operator's"}}),
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

/// The operator issues and revokes portal links; a customer can do neither, through the API
/// or its dashboard session, and revoking is exact about when and for whom.
#[tokio::test]
async fn only_the_operator_revokes_portal_links_and_brands_the_portal() {
    let server = TestServer::start().await;
    let app = server.create_app("branded").await;
    let other = server.create_app("other").await;
    let customer = Customer::of(&server, &app).await;
    let bystander = Customer::of(&server, &other).await;
    let expire = format!("/api/v1/auth/app/{app}/expire-all");
    let (status, answer) = customer.call(Method::POST, &expire, Some(json!({}))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let session = crate::support::server::sign_in(&server.url(""), &customer.token).await;
    let page = reqwest::Client::new().get(server.url(&format!("/app/{app}"))).header("cookie", &session);
    let html = page.send().await.unwrap().text().await.unwrap();
    let csrf = html.split("name=\"csrf\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_owned();
    let revoke = reqwest::Client::new()
        .post(server.url(&format!("/app/{app}/portal-links/revoke")))
        .header("cookie", &session)
        .form(&[("csrf", csrf.as_str())]);
    assert_eq!(revoke.send().await.unwrap().status(), StatusCode::FORBIDDEN);
    assert_eq!(customer.call(Method::GET, &format!("/api/v1/app/{app}"), None).await.0, StatusCode::OK, "still valid");

    // The operator: a bad expiry, session ids, then in an hour, then at once.
    for bad in [json!({"expiry": -1}), json!({"expiry": 604_801}), json!({"sessionIds": ["s1"]})] {
        assert_eq!(server.post(&expire, bad.clone()).await.0, StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    let (status, _) = server.post(&expire, json!({"expiry": 3600})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(customer.call(Method::GET, &format!("/api/v1/app/{app}"), None).await.0, StatusCode::OK, "for an hour");
    let (status, _) = server.post(&expire, json!({})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(customer.call(Method::GET, &format!("/api/v1/app/{app}"), None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        bystander.call(Method::GET, &format!("/api/v1/app/{other}"), None).await.0,
        StatusCode::OK,
        "others stay"
    );

    // The brand: validated, removable, kept by a PUT that does not carry it.
    let path = format!("/api/v1/app/{app}");
    let bad = json!({"portalBrand": {"accentColor": "red", "logoUrl": "http://insecure.example/l.png"}});
    let (status, answer) = server.call(Method::PATCH, &path, Some(bad)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let fields: Vec<String> = answer["detail"].as_array().unwrap().iter().map(|d| d["loc"].to_string()).collect();
    assert_eq!(fields, [r#"["body","portalBrand","logoUrl"]"#, r#"["body","portalBrand","accentColor"]"#]);
    let brand = json!({"name": "Acme", "accentColor": "#102030", "theme": "dark"});
    let (_, patched) = server.call(Method::PATCH, &path, Some(json!({"portalBrand": brand}))).await;
    assert_eq!(patched["portalBrand"], brand);
    let (_, put) = server.call(Method::PUT, &path, Some(json!({"name": "branded"}))).await;
    assert_eq!(put["portalBrand"], brand, "a PUT without it keeps it");
    let (_, cleared) = server.call(Method::PATCH, &path, Some(json!({"portalBrand": null}))).await;
    assert_eq!(cleared["portalBrand"], Value::Null);
}
