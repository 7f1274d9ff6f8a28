//! General behaviours: trailing slashes on every route, the deprecated fields Svix still
//! returns and accepts, idempotency replays, Svix's timestamp forms, the 401 body.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{ADMIN, call, event_type, problem};
use crate::support::server::ADMIN_TOKEN;
use crate::support::{Receiver, TestServer};

/// Fills the path parameters of every API route with real ids and compares the two forms:
/// GETs must answer the same status and body with and without a trailing slash.
#[tokio::test]
async fn every_route_answers_with_and_without_a_trailing_slash() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    event_type(&server, "invoice.paid").await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    let msg = server.send(&app, json!({"eventType": "invoice.paid", "payload": {"n": 1}})).await;
    receiver.wait_for(None, 1).await;
    let attempt = crate::support::eventually("an attempt", || async {
        server.attempts(&app, &msg).await.first().map(|a| a["id"].as_str().unwrap().to_owned())
    })
    .await;
    let (_, task) = server.post(&format!("/api/v1/app/{app}/dead-letters/replay"), json!({})).await;
    let (_, poller) = server.post(&format!("/api/v1/app/{app}/poller"), json!({})).await;
    let poller = poller["id"].as_str().unwrap().to_owned();
    let fill = |path: &str| {
        path.replace("{app_id}", &app)
            .replace("{endpoint_id}", &ep)
            .replace("{msg_id}", &msg)
            .replace("{attempt_id}", &attempt)
            .replace("{task_id}", task["taskId"].as_str().unwrap())
            .replace("{event_type_name}", "invoice.paid")
            .replace("{session_id}", "ses_none")
            .replace("{poller_id}", &poller)
            .replace("{consumer_id}", "probe")
    };
    let mut compared = 0;
    for route in
        herald::web::route_table().into_iter().filter(|r| r.path.starts_with("/api/") && r.method == Method::GET)
    {
        let path = fill(&route.path);
        let plain = call(&server, ADMIN, Method::GET, &path, None).await;
        let slashed = call(&server, ADMIN, Method::GET, &format!("{path}/"), None).await;
        assert_ne!(slashed.0, StatusCode::NOT_FOUND, "GET {path}/ is served: {}", slashed.1);
        assert_eq!(plain, slashed, "GET {path} and GET {path}/ answer alike");
        compared += 1;
    }
    assert!(compared > 20, "{compared} routes compared");
    // Writes too: a POST and a PATCH with a trailing slash.
    let (status, created) = server.post("/api/v1/app/", json!({"name": "slashed"})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap();
    let (status, _) = server.call(Method::PATCH, &format!("/api/v1/app/{id}/"), Some(json!({"name": "x"}))).await;
    assert_eq!(status, StatusCode::OK);
    let health = reqwest::get(server.url("/api/v1/health/")).await.unwrap();
    assert_eq!(health.status(), StatusCode::NO_CONTENT);
}

/// Every write route is routed with a trailing slash too: whatever it answers (the bodies
/// sent are empty, so often a 422), it is never "route not found" nor a 405.
#[tokio::test]
async fn every_write_route_is_routed_with_a_trailing_slash() {
    let server = TestServer::start().await;
    event_type(&server, "invoice.paid").await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, "https://hooks.example.com/", json!({})).await;
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    let msg = server.send(&app, json!({"eventType": "invoice.paid", "payload": {}})).await;
    let (_, poller) = server.post(&format!("/api/v1/app/{app}/poller"), json!({})).await;
    let poller = poller["id"].as_str().unwrap().to_owned();
    let fill = |path: &str| {
        path.replace("{app_id}", &app)
            .replace("{endpoint_id}", &ep)
            .replace("{msg_id}", &msg)
            .replace("{attempt_id}", "atmpt_none")
            .replace("{event_type_name}", "invoice.paid")
            .replace("{session_id}", "ses_none")
            .replace("{poller_id}", &poller)
            .replace("{consumer_id}", "probe")
    };
    let mut writes: Vec<_> = herald::web::route_table()
        .into_iter()
        .filter(|r| r.path.starts_with("/api/") && r.method != Method::GET && r.method != Method::HEAD)
        .collect();
    // Deletions last, so that the ids stay valid for the rest.
    writes.sort_by_key(|r| r.method == Method::DELETE);
    assert!(writes.len() > 20, "{} write routes", writes.len());
    for route in writes {
        let path = format!("{}/", fill(&route.path));
        let (status, body) = call(&server, ADMIN, route.method.clone(), &path, Some(json!({}))).await;
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{} {path}", route.method);
        assert_ne!(body["detail"], "route not found", "{} {path}: {status}", route.method);
    }
}

#[tokio::test]
async fn endpoints_carry_and_accept_the_deprecated_fields() {
    let server = TestServer::start().await;
    event_type(&server, "a.b").await;
    let app = server.create_app("a").await;
    let path = format!("/api/v1/app/{app}/endpoint");
    let (status, ep) =
        server.post(&path, json!({"url": "https://hooks.example.com/", "rateLimit": 7, "filterTypes": ["a.b"]})).await;
    assert_eq!(status, StatusCode::CREATED, "{ep}");
    assert_eq!(
        (ep["version"].clone(), ep["throttleRate"].clone(), ep["rateLimit"].clone()),
        (json!(1), json!(7), json!(7))
    );
    assert_eq!((ep["eventTypes"].clone(), ep["filterTypes"].clone()), (json!(["a.b"]), json!(["a.b"])));
    let id = ep["id"].as_str().unwrap();
    let (_, patched) = server
        .call(Method::PATCH, &format!("{path}/{id}"), Some(json!({"rateLimit": null, "filterTypes": null})))
        .await;
    assert_eq!((patched["throttleRate"].clone(), patched["rateLimit"].clone()), (Value::Null, Value::Null));
    assert_eq!((patched["eventTypes"].clone(), patched["filterTypes"].clone()), (Value::Null, Value::Null));
    let (_, put) = server
        .call(Method::PUT, &format!("{path}/{id}"), Some(json!({"url": "https://hooks.example.com/", "rateLimit": 3})))
        .await;
    assert_eq!(put["throttleRate"], 3);
    // Applications: `rateLimit` accepted, and returned (only) when set.
    let (_, app) = server.post("/api/v1/app", json!({"name": "b", "rateLimit": 9})).await;
    assert_eq!((app["throttleRate"].clone(), app["rateLimit"].clone()), (json!(9), json!(9)));
    let (_, plain) = server.post("/api/v1/app", json!({"name": "c"})).await;
    assert!(plain.get("rateLimit").is_none(), "{plain}");
}

/// Svix's idempotency: the key (caller, method, URI) replays the first 2xx answer whatever
/// the new body is; a non-2xx answer is not kept.
#[tokio::test]
async fn a_repeated_idempotency_key_replays_the_first_success_only() {
    let server = TestServer::start().await;
    let post = |path: &str, key: &str, body: Value| {
        server.request_as_admin(Method::POST, path).header("idempotency-key", key).json(&body).send()
    };
    let refused = post("/api/v1/app", "k1", json!({"name": ""})).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let created = post("/api/v1/app", "k1", json!({"name": "first"})).await.unwrap();
    assert_eq!(created.status(), StatusCode::CREATED, "a refusal was not kept");
    let first: Value = created.json().await.unwrap();
    let again = post("/api/v1/app", "k1", json!({"name": "another body"})).await.unwrap();
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.json::<Value>().await.unwrap(), first);
    let slashed = post("/api/v1/app/", "k1", json!({"name": "slashed"})).await.unwrap();
    assert_eq!(slashed.json::<Value>().await.unwrap(), first, "a trailing slash is the same URI");
    let other_uri = post("/api/v1/app?get_if_exists=true", "k1", json!({"name": "query"})).await.unwrap();
    assert_ne!(other_uri.json::<Value>().await.unwrap()["id"], first["id"], "another URI, another key");
}

#[tokio::test]
async fn timestamps_take_svix_forms_and_a_bad_one_is_a_400() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    let (_, list) = server.get(&format!("/api/v1/app/{app}/msg")).await;
    let at = list["data"][0]["timestamp"].as_str().unwrap().to_owned();
    let chrono_form = chrono::DateTime::parse_from_rfc3339(&at).unwrap().with_timezone(&chrono::Utc).to_string();
    assert!(chrono_form.ends_with(" UTC"), "{chrono_form}");
    // `after` keeps what was made at its instant, `before` leaves it out (as Svix does).
    for (name, value, kept) in
        [("before", &chrono_form, false), ("after", &chrono_form, true), ("before", &at, false), ("after", &at, true)]
    {
        let query = url::form_urlencoded::Serializer::new(String::new()).append_pair(name, value).finish();
        let (status, found) = server.get(&format!("/api/v1/app/{app}/msg?{query}")).await;
        assert_eq!(status, StatusCode::OK, "{name}={value}: {found}");
        assert_eq!(found["data"].as_array().unwrap().len(), usize::from(kept), "{name}={value}: {found}");
        assert!(!kept || found["data"][0]["id"] == msg.as_str(), "{name}={value}: {found}");
    }
    let nanos = "2100-12-01 05:40:58.123456789 UTC";
    let query = url::form_urlencoded::Serializer::new(String::new()).append_pair("before", nanos).finish();
    let (status, found) = server.get(&format!("/api/v1/app/{app}/msg?{query}")).await;
    assert_eq!((status, found["data"][0]["id"].as_str()), (StatusCode::OK, Some(msg.as_str())), "{nanos}");
    let (status, body) = server.get(&format!("/api/v1/app/{app}/msg?before=yesterday")).await;
    assert_eq!((status, body["code"].as_str()), (StatusCode::BAD_REQUEST, Some("generic_error")), "{body}");
}

/// A portal token may read its application but not change or delete it.
#[tokio::test]
async fn a_portal_token_cannot_change_its_application() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let portal = access["token"].as_str().unwrap();
    let path = format!("/api/v1/app/{app}");
    assert_eq!(call(&server, portal, Method::GET, &path, None).await.0, StatusCode::OK);
    let writes = [
        (Method::PUT, Some(json!({"name": "mine"}))),
        (Method::PATCH, Some(json!({"name": "mine"}))),
        (Method::DELETE, None),
    ];
    for (method, body) in writes {
        for slash in ["", "/"] {
            let (status, answer) = call(&server, portal, method.clone(), &format!("{path}{slash}"), body.clone()).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}{slash}: {answer}");
        }
    }
    assert_eq!(server.get(&path).await.1["name"], "a", "unchanged");
}

#[tokio::test]
async fn an_unknown_or_missing_token_gets_svix_401_body() {
    let server = TestServer::start().await;
    let expected = json!({"code": "authentication_failed", "detail": "Invalid token"});
    let (status, body) = call(&server, "not-a-token", Method::GET, "/api/v1/app", None).await;
    assert_eq!((status, body), (StatusCode::UNAUTHORIZED, expected.clone()));
    let answer = reqwest::get(server.url("/api/v1/app")).await.unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(answer.json::<Value>().await.unwrap(), expected);
    assert_eq!(call(&server, ADMIN_TOKEN, Method::GET, "/api/v1/app", None).await.0, StatusCode::OK);
    let (status, body) = server.post("/api/v1/app", json!({"name": ""})).await;
    assert_eq!((status, problem(&body).0), (StatusCode::UNPROCESSABLE_ENTITY, "body.name".to_owned()));
}

/// A portal token's `featureFlags`: an event type gated by a flag the token lacks answers
/// 404 and is left out of lists, as in Svix; the admin token sees every one.
#[tokio::test]
async fn event_types_behind_a_feature_flag_are_hidden_from_tokens_without_it() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    for (name, flag) in [("beta.event", Some("beta")), ("gamma.event", Some("gamma")), ("plain", None)] {
        let (status, body) =
            server.post("/api/v1/event-type", json!({"name": name, "description": name, "featureFlag": flag})).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let token = |flags: Value| {
        let server = &server;
        let app = app.clone();
        async move {
            let (status, access) =
                server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({"featureFlags": flags})).await;
            assert_eq!(status, StatusCode::OK, "{access}");
            access["token"].as_str().unwrap().to_owned()
        }
    };
    let (beta, none) = (token(json!(["beta"])).await, token(json!([])).await);
    let names = |page: &Value| -> Vec<String> {
        page["data"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()).collect()
    };
    for slash in ["", "/"] {
        let list = format!("/api/v1/event-type{slash}");
        assert_eq!(
            names(&call(&server, ADMIN, Method::GET, &list, None).await.1),
            ["beta.event", "gamma.event", "plain"]
        );
        assert_eq!(names(&call(&server, &beta, Method::GET, &list, None).await.1), ["beta.event", "plain"]);
        assert_eq!(names(&call(&server, &none, Method::GET, &list, None).await.1), ["plain"]);
        for (who, name, status) in [
            (&beta, "beta.event", StatusCode::OK),
            (&beta, "gamma.event", StatusCode::NOT_FOUND),
            (&none, "beta.event", StatusCode::NOT_FOUND),
            (&none, "plain", StatusCode::OK),
        ] {
            let (got, body) = call(&server, who, Method::GET, &format!("/api/v1/event-type/{name}{slash}"), None).await;
            assert_eq!(got, status, "{name}{slash}: {body}");
        }
    }
    // Pages skip what is hidden and still end where they should.
    let (_, first) = call(&server, &beta, Method::GET, "/api/v1/event-type?limit=1", None).await;
    assert_eq!((names(&first), &first["done"]), (vec!["beta.event".to_owned()], &json!(false)), "{first}");
    let next = format!("/api/v1/event-type?limit=1&iterator={}", first["iterator"].as_str().unwrap());
    let (_, second) = call(&server, &beta, Method::GET, &next, None).await;
    assert_eq!((names(&second), &second["done"]), (vec!["plain".to_owned()], &json!(true)), "{second}");
    let (_, only) = call(&server, &none, Method::GET, "/api/v1/event-type?limit=1", None).await;
    assert_eq!((names(&only), &only["done"]), (vec!["plain".to_owned()], &json!(true)), "{only}");
    // Svix's rules for the flags themselves.
    let (status, refused) =
        server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({"featureFlags": ["not a flag!"]})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["detail"][0]["loc"], json!(["body", "featureFlags", "0"]), "{refused}");
}
