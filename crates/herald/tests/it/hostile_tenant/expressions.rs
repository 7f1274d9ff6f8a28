//! Attacks through the expressions a customer sets (endpoint filters and transforms, poller
//! filters) and the JSON it sends: nothing it writes may crash the process, answer another
//! tenant, or keep another tenant waiting on the sandbox.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Tenant, refused_field, still_serving};
use crate::support::{Receiver, TestServer};

/// Every expression field, as (the path of its create, the body around it, the field).
fn expression_fields(tenant: &Tenant, receiver: &Receiver, code: &str) -> Vec<(String, Value, &'static str)> {
    let url = receiver.url("/hook");
    vec![
        (tenant.path("/endpoint"), json!({"url": url, "filter": code}), "filter"),
        (tenant.path("/endpoint"), json!({"url": url, "transform": code}), "transform"),
        (tenant.path("/poller"), json!({"filter": code}), "filter"),
    ]
}

#[tokio::test]
async fn a_nesting_bomb_in_any_expression_is_refused_and_nobody_else_notices() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let (mallory, alice) = (Tenant::new(&server, "mallory").await, Tenant::new(&server, "alice").await);
    // A thousand nested parentheses used to overflow a server thread's stack and abort
    // the whole process.
    let bomb = format!("{}.a{}", "(".repeat(1000), ")".repeat(1000));
    for (path, body, field) in expression_fields(&mallory, &receiver, &bomb) {
        let (status, answer) = mallory.post(&server, &path, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {answer}");
        assert_eq!(refused_field(&answer), (field.to_owned(), "is nested deeper than 64 levels".to_owned()));
    }
    still_serving(&server, &alice).await;
}

#[tokio::test]
async fn nesting_is_bounded_at_64_levels_of_every_kind_operators_at_2048_and_length_at_16_kib() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let mallory = Tenant::new(&server, "mallory").await;
    let nested =
        |open: &str, inner: &str, close: &str, n: usize| format!("{}{inner}{}", open.repeat(n), close.repeat(n));
    let shapes: [(&str, &str, &str); 5] = [
        ("(", ".a", ")"),
        ("[", "1", "]"),
        ("{a: ", "1", "}"),
        ("\"\\(", "1", ")\""),
        ("if true then ", "1", " else 0 end"),
    ];
    for (open, inner, close) in shapes {
        for (path, body, field) in expression_fields(&mallory, &receiver, &nested(open, inner, close, 65)) {
            let (status, answer) = mallory.post(&server, &path, body).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{open}×65 at {field}: {answer}");
            assert_eq!(refused_field(&answer).1, "is nested deeper than 64 levels");
        }
    }
    // At the limit, each kind compiles (in the sandbox) and is accepted.
    for (open, inner, close) in shapes {
        let code = nested(open, inner, close, 64);
        let (status, answer) = mallory.post(&server, &mallory.path("/poller"), json!({"filter": code})).await;
        assert_eq!(status, StatusCode::CREATED, "{open}×64: {answer}");
    }
    // Operators: chains recurse in the parser like nesting does (`----1`, `.|.|…`).
    let chain = |n: usize| format!("1{}", "+1".repeat(n));
    let (status, answer) = mallory.post(&server, &mallory.path("/poller"), json!({"filter": chain(2048)})).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = mallory.post(&server, &mallory.path("/poller"), json!({"filter": chain(2049)})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused_field(&answer), ("filter".to_owned(), "has more than 2048 operators".to_owned()));
    // Length: 16 KiB is accepted, one byte more is not.
    let long = |n: usize| format!("{}true", " ".repeat(n - 4));
    let (status, answer) = mallory.post(&server, &mallory.path("/poller"), json!({"filter": long(16 * 1024)})).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    for (path, body, field) in expression_fields(&mallory, &receiver, &long(16 * 1024 + 1)) {
        let (status, answer) = mallory.post(&server, &path, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert_eq!(refused_field(&answer), (field.to_owned(), "is longer than 16384 bytes".to_owned()));
    }
}

#[tokio::test]
async fn what_the_flat_bounds_let_through_is_compiled_only_in_the_sandbox() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let (mallory, alice) = (Tenant::new(&server, "mallory").await, Tenant::new(&server, "alice").await);
    // Chains of prefix operators nest in the parser without nesting brackets: within the
    // bounds, they reach the compiler, which runs in a worker process. Whatever it makes of
    // them (an expression, or a worker that ran out of stack), the server is not touched.
    let chains = [format!("{}.", "try ".repeat(4000)), format!("{}1", "-".repeat(16_000)), ".a".repeat(8000)];
    for chain in chains {
        for (path, body, field) in expression_fields(&mallory, &receiver, &chain) {
            let (status, answer) = mallory.post(&server, &path, body).await;
            assert!(
                status == StatusCode::CREATED || status == StatusCode::UNPROCESSABLE_ENTITY,
                "{field}: {status} {answer}"
            );
        }
        still_serving(&server, &alice).await;
    }
    // The compile errors a customer sees still say where the problem is.
    let (status, answer) = mallory.post(&server, &mallory.path("/poller"), json!({"filter": ".a |\n  | .b"})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(refused_field(&answer).1.starts_with("line 2, column 3:"), "{answer}");
}

#[tokio::test]
async fn json_bodies_are_bounded_in_depth_before_parsing_payloads_and_schemas_alike() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start().await;
    let (mallory, alice) = (Tenant::new(&server, "mallory").await, Tenant::new(&server, "alice").await);
    let endpoint = mallory.endpoint(&server, &receiver.url("/hook"), json!({"transform": "."})).await;
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let body = |payload: &str| format!(r#"{{"eventType": "e", "payload": {{"a": {payload}}}}}"#);
    let post_raw = |path: String, token: String, text: String| {
        let server = &server;
        async move {
            let answer = server.request_as(&token, Method::POST, &path).header("content-type", "application/json");
            answer.body(text).send().await.unwrap().status()
        }
    };
    let simulate = mallory.path(&format!("/endpoint/{endpoint}/transformation/simulate"));
    // The body's own two levels count: a payload of 62 arrays is 64 levels deep.
    assert_eq!(post_raw(simulate.clone(), mallory.token.clone(), body(&deep(62))).await, StatusCode::OK);
    assert_eq!(post_raw(simulate.clone(), mallory.token.clone(), body(&deep(63))).await, StatusCode::BAD_REQUEST);
    let (msg, admin) = (mallory.path("/msg"), crate::support::server::ADMIN_TOKEN.to_owned());
    assert_eq!(post_raw(msg.clone(), admin.clone(), body(&deep(63))).await, StatusCode::BAD_REQUEST);
    assert_eq!(post_raw(msg, admin, body(&deep(100_000))).await, StatusCode::BAD_REQUEST);
    // Event type schemas are JSON too (and the operator's): the same bound.
    let schema = |n: usize| {
        format!(r#"{{"name": "deep", "description": "d", "schemas": {{"1": {}}}}}"#, {
            let mut s = "{\"type\": \"object\"}".to_owned();
            for _ in 0..n {
                s = format!(r#"{{"type": "object", "properties": {{"a": {s}}}}}"#);
            }
            s
        })
    };
    let admin = crate::support::server::ADMIN_TOKEN.to_owned();
    assert_eq!(post_raw("/api/v1/event-type".into(), admin.clone(), schema(40)).await, StatusCode::BAD_REQUEST);
    assert_eq!(post_raw("/api/v1/event-type".into(), admin, schema(20)).await, StatusCode::CREATED);
    still_serving(&server, &alice).await;
}

#[tokio::test]
async fn an_evaluation_cut_off_by_its_client_never_answers_another_tenant() {
    let receiver = Receiver::ok().await;
    // One worker, so the cut-off exchange and the next one would share it.
    let server = TestServer::start_with(|c| {
        c.scripts.workers = 1;
        c.scripts.max_workers_per_app = 1;
        c.scripts.timeout = Duration::from_secs(20);
    })
    .await;
    let (alpha, beta) = (Tenant::new(&server, "alpha").await, Tenant::new(&server, "beta").await);
    let slow = r#"reduce range(0; 1500000) as $i (0; . + 1) | {payload: {owner: "alpha", secret: "alpha-card-4242"}}"#;
    let alpha_ep = alpha.endpoint(&server, &receiver.url("/a"), json!({"transform": slow})).await;
    let beta_ep =
        beta.endpoint(&server, &receiver.url("/b"), json!({"transform": r#"{payload: {owner: "beta"}}"#})).await;
    let example = json!({"eventType": "e", "payload": {}});
    let cut_off = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let path = alpha.path(&format!("/endpoint/{alpha_ep}/transformation/simulate"));
    let hung_up = cut_off.post(server.url(&path)).bearer_auth(&alpha.token).json(&example).send().await;
    assert!(hung_up.is_err(), "alpha's client gave up while its transform ran");
    for _ in 0..3 {
        let path = beta.path(&format!("/endpoint/{beta_ep}/transformation/simulate"));
        let (status, answer) = beta.post(&server, &path, example.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["body"], r#"{"owner":"beta"}"#, "beta's own answer, never alpha's");
    }
}

#[tokio::test]
async fn a_tenant_whose_filters_run_to_the_deadline_does_not_hold_up_another() {
    let receiver = Receiver::ok().await;
    // Two workers, one each at most: the noisy tenant's evaluations queue behind its own.
    let server = TestServer::start_with(|c| {
        c.scripts.workers = 2;
        c.scripts.max_workers_per_app = 1;
        c.scripts.timeout = Duration::from_secs(1);
    })
    .await;
    let (noisy, quiet) = (Tenant::new(&server, "noisy").await, Tenant::new(&server, "quiet").await);
    noisy.endpoint(&server, &receiver.url("/noisy"), json!({"filter": "until(false; .)"})).await;
    quiet.endpoint(&server, &receiver.url("/quiet"), json!({"filter": ".payload.ok"})).await;
    let message = json!({"eventType": "e", "payload": {"ok": true}});
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut flood = Vec::new();
    for _ in 0..6 {
        let (url, body, done) = (server.url(&noisy.path("/msg")), message.clone(), done.clone());
        flood.push(tokio::spawn(async move {
            let admin = crate::support::server::ADMIN_TOKEN;
            let answer = reqwest::Client::new().post(url).bearer_auth(admin).json(&body).send().await;
            done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            answer.map(|a| a.status())
        }));
    }
    // Let the flood reach the sandbox (each of its evaluations takes the whole second).
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.send(&quiet.app, message.clone()).await;
    let finished = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(finished <= 1, "the quiet tenant waited behind {finished} of the noisy tenant's evaluations");
    for answer in flood {
        // Each noisy message is refused by its own filter's timeout: accepted, routed to nobody.
        assert_eq!(answer.await.unwrap().unwrap(), StatusCode::ACCEPTED);
    }
}
