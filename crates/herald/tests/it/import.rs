//! `herald import svix` through the real binary, from one Herald (it speaks the Svix API)
//! into another, on the test's backend: hundreds of objects come over with their ids and
//! secrets, a delivery through an imported endpoint verifies with the source's secret, a
//! second run changes only what differs, and one refused object leaves the rest alone.
//! Also the explicit ids of the create calls that make this possible.

use std::collections::BTreeMap;

use futures_util::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::process::herald_exit;
use crate::support::server::ADMIN_TOKEN;
use crate::support::{Receiver, Reply, TestServer, verifies};

/// Applications in the source: more than one page of 250, so both sides are paged.
const APPS: usize = 260;
/// The first this many applications have three endpoints, the others one.
const WIDE_APPS: usize = 20;

/// Runs the import from `source` to `dest` (plus `extra` flags); its exit code and output.
async fn import(source: &TestServer, dest: &TestServer, extra: &[&str]) -> (Option<i32>, String) {
    let (from, to) = (source.url(""), dest.url(""));
    let args = [&["import", "svix", "--from", &from, "--to", &to][..], extra].concat();
    let tokens = [("HERALD_IMPORT_FROM_TOKEN", ADMIN_TOKEN), ("HERALD_IMPORT_TO_TOKEN", ADMIN_TOKEN)];
    herald_exit(&args, &tokens).await
}

/// A line of the summary's table: created, updated, unchanged, failed.
fn row(kind: &str, counts: [usize; 4]) -> String {
    let [created, updated, unchanged, failed] = counts;
    format!("{kind:<13} {created:>9} {updated:>9} {unchanged:>9} {failed:>6}")
}

async fn ok(server: &TestServer, method: Method, path: &str, body: Value) -> Value {
    let (status, answer) = server.call(method, path, Some(body)).await;
    assert!(status.is_success(), "{path}: {status} {answer}");
    answer
}

/// Every item of a list route.
async fn all(server: &TestServer, path: &str, query: &str) -> Vec<Value> {
    let mut items = Vec::new();
    let mut iterator = String::new();
    loop {
        let (status, page) = server.get(&format!("{path}?limit=100&{query}{iterator}")).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        items.extend(page["data"].as_array().unwrap().iter().cloned());
        if page["done"] == true {
            return items;
        }
        iterator = format!("&iterator={}", page["iterator"].as_str().unwrap());
    }
}

/// What the import copies, read back through `server`'s API, in one comparable value.
async fn snapshot(server: &TestServer) -> Value {
    let pick = |item: &Value, fields: &[&str]| -> Value {
        fields.iter().map(|f| (f.to_string(), item[*f].clone())).collect::<serde_json::Map<_, _>>().into()
    };
    let types = all(server, "/api/v1/event-type", "include_archived=true&with_content=true&").await;
    let types: Vec<Value> = types
        .iter()
        .map(|t| pick(t, &["name", "description", "archived", "deprecated", "schemas", "featureFlag"]))
        .collect();
    let mut apps = BTreeMap::new();
    for app in all(server, "/api/v1/app", "").await {
        let id = app["id"].as_str().unwrap().to_owned();
        let mut endpoints = BTreeMap::new();
        for endpoint in all(server, &format!("/api/v1/app/{id}/endpoint"), "").await {
            let ep = endpoint["id"].as_str().unwrap().to_owned();
            let mut copy = pick(
                &endpoint,
                &[
                    "uid",
                    "url",
                    "description",
                    "disabled",
                    "filterTypes",
                    "channels",
                    "metadata",
                    "throttleRate",
                    "version",
                ],
            );
            copy["secret"] = server.get(&format!("/api/v1/app/{id}/endpoint/{ep}/secret")).await.1["key"].clone();
            copy["headers"] = server.get(&format!("/api/v1/app/{id}/endpoint/{ep}/headers")).await.1["headers"].clone();
            endpoints.insert(ep, copy);
        }
        let mut copy = pick(&app, &["uid", "name", "metadata", "throttleRate"]);
        copy["endpoints"] = json!(endpoints);
        apps.insert(id, copy);
    }
    json!({"eventTypes": types, "applications": apps})
}

/// Fills `source` with event types of every kind, `APPS` applications and their endpoints
/// (uids, filters, channels, limits, headers, a disabled one, a rotated secret); the
/// applications' ids in order.
async fn seed(source: &TestServer, receiver: &Receiver) -> Vec<String> {
    let schema = json!({"1": {"type": "object", "properties": {"amount": {"type": "integer"}}}});
    let mut types = vec![
        json!({"name": "order.paid", "description": "Paid", "schemas": schema}),
        json!({"name": "order.shipped", "description": "Shipped", "deprecated": true}),
        json!({"name": "legacy.thing", "description": "Old", "archived": true}),
        json!({"name": "beta.feature", "description": "Beta", "featureFlag": "beta"}),
    ];
    types.extend((0..8).map(|i| json!({"name": format!("kind.{i}"), "description": format!("Kind {i}")})));
    for event_type in types {
        ok(source, Method::POST, "/api/v1/event-type", event_type).await;
    }
    join_all((0..APPS).map(|i| async move {
        let mut app = json!({"name": format!("Customer {i}"), "metadata": {"n": i.to_string()}});
        if i % 2 == 0 {
            app["uid"] = json!(format!("customer-{i}"));
        }
        if i % 5 == 0 {
            app["throttleRate"] = json!(100);
        }
        let id = ok(source, Method::POST, "/api/v1/app", app).await["id"].as_str().unwrap().to_owned();
        for j in 0..if i < WIDE_APPS { 3 } else { 1 } {
            let mut endpoint = json!({"url": receiver.url(&format!("/{i}/{j}")), "description": format!("endpoint {j}"),
                "metadata": {"j": j.to_string()}});
            match j {
                0 => endpoint.as_object_mut().unwrap().extend(
                    json!({"uid": "first", "throttleRate": 10,
                    "headers": {"X-Team": format!("team-{i}")}})
                    .as_object()
                    .unwrap()
                    .clone(),
                ),
                1 => endpoint["filterTypes"] = json!(["order.paid", "order.shipped"]),
                _ => endpoint["channels"] = json!(["eu"]),
            }
            if (i, j) == (7, 2) {
                endpoint["disabled"] = json!(true);
            }
            if i < 2 && j == 0 {
                endpoint["headers"]["Authorization"] = json!(format!("Bearer receiver-{i}"));
            }
            ok(source, Method::POST, &format!("/api/v1/app/{id}/endpoint"), endpoint).await;
        }
        id
    }))
    .await
}

/// The id of application `app`'s endpoint number `j` (by its URL's path).
async fn endpoint_of(server: &TestServer, app: &str, receiver: &Receiver, path: &str) -> String {
    let endpoints = all(server, &format!("/api/v1/app/{app}/endpoint"), "").await;
    let url = receiver.url(path);
    endpoints.iter().find(|e| e["url"] == url).unwrap()["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_whole_server_comes_over_with_its_ids_and_secrets_and_a_second_run_changes_only_what_differs() {
    let receiver = Receiver::ok().await;
    let (source, dest) = (TestServer::start().await, TestServer::start().await);
    let apps = seed(&source, &receiver).await;
    // One endpoint has rotated its secret: the old one signs for another hour.
    let rotated = endpoint_of(&source, &apps[3], &receiver, "/3/1").await;
    let rotate = format!("/api/v1/app/{}/endpoint/{rotated}/secret/rotate", apps[3]);
    let old_key = source.secret(&apps[3], &rotated).await;
    ok(&source, Method::POST, &rotate, json!({"gracePeriodSeconds": 3600})).await;

    let (code, out) = import(&source, &dest, &[]).await;
    assert_eq!(code, Some(1), "two sensitive headers cannot come over: {out}");
    let hand: Vec<&str> = out.lines().filter(|l| l.contains("header Authorization: the source never shows")).collect();
    assert_eq!(hand.len(), 2, "{out}");
    assert!(out.contains("To set by hand (2)") && !out.contains("Failed ("), "{out}");
    assert!(out.contains(&row("applications", [APPS, 0, 0, 0])), "{out}");
    assert_eq!(snapshot(&dest).await, snapshot(&source).await);

    // The rotated endpoint's old secret still signs at the destination, as long as at the source.
    let secret_path = format!("/api/v1/app/{}/endpoint/{rotated}/secret", apps[3]);
    let (src, dst) = (source.get(&secret_path).await.1, dest.get(&secret_path).await.1);
    assert_eq!(dst["previousKeys"][0]["key"], old_key);
    let ends =
        |v: &Value| chrono::DateTime::parse_from_rfc3339(v["previousKeys"][0]["expiresAt"].as_str().unwrap()).unwrap();
    assert!((ends(&dst) - ends(&src)).num_seconds().abs() <= 5, "{src} {dst}");

    // A message through the imported endpoint verifies with the source's secrets.
    dest.send(&apps[3], json!({"eventType": "order.paid", "payload": {"amount": 5}})).await;
    let delivered = receiver.wait_for(Some("/3/1"), 1).await;
    assert!(verifies(src["key"].as_str().unwrap(), &delivered[0]), "the source's current secret");
    assert!(verifies(&old_key, &delivered[0]), "the source's previous secret, still in its window");

    // The operator sets the two sensitive headers; then nothing is left to do.
    for (i, line) in hand.iter().enumerate() {
        let path = line.split("PATCH ").nth(1).unwrap().trim();
        ok(&dest, Method::PATCH, path, json!({"headers": {"Authorization": format!("Bearer receiver-{i}")}})).await;
    }
    let (code, out) = import(&source, &dest, &[]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("Everything came over."), "{out}");
    let endpoints = WIDE_APPS * 3 + APPS - WIDE_APPS;
    assert!(out.contains(&row("endpoints", [0, 0, endpoints, 0])), "{out}");

    // Changes at the source: a dry run names them and writes nothing; the run applies them.
    ok(&source, Method::PATCH, &format!("/api/v1/app/{}", apps[5]), json!({"name": "Renamed"})).await;
    let moved = endpoint_of(&source, &apps[6], &receiver, "/6/0").await;
    let moved_path = format!("/api/v1/app/{}/endpoint/{moved}", apps[6]);
    ok(&source, Method::PATCH, &moved_path, json!({"url": receiver.url("/6/moved")})).await;
    ok(&source, Method::POST, &format!("{moved_path}/secret/rotate"), json!({})).await;
    ok(&source, Method::PATCH, "/api/v1/event-type/kind.3", json!({"description": "Changed"})).await;
    ok(&source, Method::POST, "/api/v1/app", json!({"name": "Newcomer", "uid": "newcomer"})).await;
    let before = snapshot(&dest).await;
    let (code, out) = import(&source, &dest, &["--dry-run"]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("update application {}: name", apps[5])), "{out}");
    assert!(out.contains(&format!("update endpoint {moved} of {}: url, secret", apps[6])), "{out}");
    assert!(out.contains("update event type kind.3: description") && out.contains("create application"), "{out}");
    assert_eq!(snapshot(&dest).await, before, "a dry run writes nothing");
    let (code, out) = import(&source, &dest, &[]).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&row("applications", [1, 1, APPS - 1, 0])), "{out}");
    assert_eq!(snapshot(&dest).await, snapshot(&source).await);
}

#[tokio::test]
async fn one_refused_object_leaves_the_rest_and_the_exit_code_says_whether_everything_came_over() {
    let receiver = Receiver::ok().await;
    let source = TestServer::start().await;
    let dest = TestServer::start_with(|c| c.tenants.max_endpoints = 2).await;
    let taken = ok(&source, Method::POST, "/api/v1/app", json!({"name": "Taken", "uid": "taken"})).await;
    ok(
        &source,
        Method::POST,
        &format!("/api/v1/app/{}/endpoint", taken["id"].as_str().unwrap()),
        json!({"url": receiver.url("/t")}),
    )
    .await;
    let wide = source.create_app("Wide").await;
    for j in 0..3 {
        source.create_endpoint(&wide, &receiver.url(&format!("/w/{j}")), json!({})).await;
    }
    let small = source.create_app("Small").await;
    source.create_endpoint(&small, &receiver.url("/s"), json!({})).await;
    // The destination has its own application under the uid "taken".
    dest.post("/api/v1/app", json!({"name": "Mine", "uid": "taken"})).await;

    let (code, out) = import(&source, &dest, &[]).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("Failed (3)"), "{out}");
    assert!(out.contains(&format!("application {} (taken): 409", taken["id"].as_str().unwrap())), "{out}");
    assert!(out.contains("its application did not come over"), "{out}");
    assert!(out.contains("the most it may have"), "{out}");
    assert_eq!(all(&dest, &format!("/api/v1/app/{wide}/endpoint"), "").await.len(), 2);
    assert_eq!(all(&dest, &format!("/api/v1/app/{small}/endpoint"), "").await.len(), 1);

    // A source that cannot be read stops the import before anything is written.
    let (from, to) = (source.url(""), dest.url(""));
    let wrong = [("HERALD_IMPORT_FROM_TOKEN", "wrong"), ("HERALD_IMPORT_TO_TOKEN", ADMIN_TOKEN)];
    let (code, out) = herald_exit(&["import", "svix", "--from", &from, "--to", &to], &wrong).await;
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("reading the source's lists failed, nothing was written: 401"), "{out}");
}

#[tokio::test]
async fn on_a_terminal_the_import_draws_a_progress_bar_per_kind() {
    let receiver = Receiver::ok().await;
    let (source, dest) = (TestServer::start().await, TestServer::start().await);
    let app = source.create_app("Shown").await;
    source.create_endpoint(&app, &receiver.url("/x"), json!({})).await;
    let command =
        format!("{} import svix --from {} --to {}", env!("CARGO_BIN_EXE_herald"), source.url(""), dest.url(""));
    let output = tokio::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("HERALD_IMPORT_FROM_TOKEN", ADMIN_TOKEN)
        .env("HERALD_IMPORT_TO_TOKEN", ADMIN_TOKEN)
        .env("TERM", "xterm")
        .output()
        .await
        .expect("script(1) runs");
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{shown}");
    for bar in [" applications [", "    endpoints [", "  event types ["] {
        assert!(shown.contains(bar), "no {bar:?} bar in {shown:?}");
    }
    assert!(shown.contains("1/1 1 created"), "{shown:?}");
}

#[tokio::test]
async fn the_admin_token_may_keep_an_id_from_elsewhere_and_only_the_admin_token() {
    let server = TestServer::start().await;
    let foreign = "app_2VbUtkDqdJdq8Vq1xkLvXmjYfSH";
    let (status, app) = server.post("/api/v1/app", json!({"id": foreign, "name": "Imported"})).await;
    assert_eq!((status, app["id"].as_str()), (StatusCode::CREATED, Some(foreign)), "{app}");
    for path in [format!("/api/v1/app/{foreign}"), format!("/api/v1/app/{foreign}/")] {
        assert_eq!(server.get(&path).await.1["name"], "Imported", "{path}");
    }
    let (status, twice) = server.post("/api/v1/app", json!({"id": foreign, "name": "Again"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{twice}");
    let too_long = format!("app_{}", "a".repeat(65));
    let dashed = format!("app_{}", "a-b_c".repeat(4));
    let bad_ids =
        ["app_", "app_short", "ep_2VbUtkDqdJdq8Vq1xkLvXmjYfSH", "app_2VbUtkDqdJdq8Vq1x/kLvXmjYfSH", &dashed, &too_long];
    for bad in bad_ids {
        let (status, refused) = server.post("/api/v1/app", json!({"id": bad, "name": "Bad"})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {refused}");
        assert_eq!(refused["detail"][0]["loc"], json!(["body", "id"]), "{refused}");
    }
    // Herald's own ids and foreign ones page together.
    let own = server.create_app("Own").await;
    let (_, first) = server.get("/api/v1/app?limit=1").await;
    let (status, second) =
        server.get(&format!("/api/v1/app?limit=1&iterator={}", first["iterator"].as_str().unwrap())).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let mut seen = vec![first["data"][0]["id"].clone(), second["data"][0]["id"].clone()];
    seen.sort_by_key(|v| v.to_string());
    let mut expected = vec![json!(foreign), json!(own)];
    expected.sort_by_key(|v| v.to_string());
    assert_eq!(seen, expected);
    let (status, changed) =
        server.call(Method::PUT, &format!("/api/v1/app/{foreign}"), Some(json!({"id": own, "name": "X"}))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "an id never changes: {changed}");

    let ep_id = "ep_2VbUtkDqdJdq8Vq1xkLvXmjYfSI";
    let body = json!({"id": ep_id, "url": "http://127.0.0.1:9/hook"});
    let (status, endpoint) = server.post(&format!("/api/v1/app/{foreign}/endpoint"), body.clone()).await;
    assert_eq!((status, endpoint["id"].as_str()), (StatusCode::CREATED, Some(ep_id)), "{endpoint}");
    let portal = server.portal_token(foreign).await;
    let refused = server.request_as(&portal, Method::POST, &format!("/api/v1/app/{foreign}/endpoint"));
    let refused = refused
        .json(&json!({"id": "ep_2VbUtkDqdJdq8Vq1xkLvXmjYfSJ", "url": "http://127.0.0.1:9/p"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let put = server
        .call(
            Method::PUT,
            &format!("/api/v1/app/{foreign}/endpoint/{ep_id}"),
            Some(json!({"id": "ep_2VbUtkDqdJdq8Vq1xkLvXmjYfSK", "url": "http://127.0.0.1:9/hook"})),
        )
        .await;
    assert_eq!(put.0, StatusCode::UNPROCESSABLE_ENTITY, "{}", put.1);
    let same = json!({"id": ep_id, "url": "http://127.0.0.1:9/hook"});
    let put = server.call(Method::PUT, &format!("/api/v1/app/{foreign}/endpoint/{ep_id}"), Some(same)).await;
    assert_eq!(put.0, StatusCode::OK, "a PUT may repeat the id: {}", put.1);
    // A portal token creating an endpoint by PUT may not choose its id either.
    let by_put = server.request_as(&portal, Method::PUT, &format!("/api/v1/app/{foreign}/endpoint/new-hook"));
    let by_put = by_put.json(&json!({"id": "ep_2VbUtkDqdJdq8Vq1xkLvXmjYfSL", "url": "http://127.0.0.1:9/n"}));
    assert_eq!(by_put.send().await.unwrap().status(), StatusCode::FORBIDDEN);
    let (status, _) = server.get(&format!("/api/v1/app/{foreign}/endpoint/new-hook")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the refused PUT created nothing");

    // The earlier secrets still signing are shown to the admin token only.
    let secret = format!("/api/v1/app/{foreign}/endpoint/{ep_id}/secret");
    let old = server.secret(foreign, ep_id).await;
    ok(&server, Method::POST, &format!("{secret}/rotate"), json!({})).await;
    assert_eq!(server.get(&secret).await.1["previousKeys"][0]["key"], old);
    let as_portal =
        server.request_as(&portal, Method::GET, &secret).send().await.unwrap().json::<Value>().await.unwrap();
    assert!(as_portal.get("previousKeys").is_none() && as_portal["key"].is_string(), "{as_portal}");
}

#[tokio::test]
async fn the_importer_waits_out_rate_limits_and_brief_outages_and_no_more() {
    // 429 then 200: one wait, as Retry-After says, then the answer.
    let limited = Receiver::start(|_, n| match n {
        0 => Reply::status(429).header("retry-after", "0"),
        _ => Reply::ok().body(r#"{"ok": true}"#),
    })
    .await;
    let api = herald::import::Api::new(&limited.url(""), "t").unwrap();
    assert_eq!(api.get("/x").await.unwrap(), json!({"ok": true}));
    assert_eq!(limited.requests().len(), 2);
    // A 503 that never ends: five tries, then the refusal with the server's reason.
    let down =
        Receiver::start(|_, _| Reply::status(503).header("retry-after", "0").body(r#"{"detail": "busy"}"#)).await;
    let api = herald::import::Api::new(&down.url(""), "t").unwrap();
    let refused = api.get("/x").await.unwrap_err();
    assert_eq!((refused.status, refused.reason.as_str()), (Some(503), "busy"));
    assert_eq!(down.requests().len(), 5);
    // A 422 is an answer, not an outage: one try.
    let refusing =
        Receiver::start(|_, _| Reply::status(422).body(r#"{"detail": [{"loc": ["body", "url"], "msg": "bad"}]}"#))
            .await;
    let api = herald::import::Api::new(&refusing.url(""), "t").unwrap();
    assert_eq!(api.get("/x").await.unwrap_err().to_string(), "422: url: bad");
    assert_eq!(refusing.requests().len(), 1);
}

#[tokio::test]
async fn the_importer_tries_a_dropped_connection_five_times_in_all() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        // Every connection is closed before any answer.
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    let refused = herald::import::Api::new(&url, "t").unwrap().get("/x").await.unwrap_err();
    assert_eq!(refused.status, None, "{refused}");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
}
