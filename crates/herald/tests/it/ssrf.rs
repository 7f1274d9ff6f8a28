//! The destination guard against every case of `data/ssrf-cases.json` (a copy of the shared
//! contract): refused at registration (4xx, nothing stored), refused at delivery even when
//! the row is written straight into storage (a `blocked_destination` attempt, no connection
//! to the canary), hostile name servers (a stub DNS), redirects, and proxy variables.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::support::canary::Canary;
use crate::support::dns::{Answer, StubDns};
use crate::support::process::Process;
use crate::support::server::{ADMIN_TOKEN, Storage};
use crate::support::{Receiver, Reply, TestServer, eventually};

const CASES: &str = include_str!("data/ssrf-cases.json");
/// Herald's public host name in these tests (`server.public_url`).
const PUBLIC_HOST: &str = "herald.test.example";
const FAIL: i64 = 2;

#[derive(Deserialize)]
struct Case {
    url: String,
    scenario: String,
    expect: String,
}

/// The cases whose expectation includes `kind`, with placeholders filled in.
fn cases(kind: &str, canary: u16, receiver: u16) -> Vec<(String, String)> {
    #[derive(Deserialize)]
    struct File {
        cases: Vec<Case>,
    }
    let file: File = serde_json::from_str(CASES).unwrap();
    file.cases
        .into_iter()
        .filter(|c| c.expect.split('+').any(|e| e == kind))
        .map(|c| {
            let url = c
                .url
                .replace("{canary_port}", &canary.to_string())
                .replace("{receiver_port}", &receiver.to_string())
                .replace("{service_public_host}", PUBLIC_HOST);
            (url, c.scenario)
        })
        .collect()
}

/// One attempt-only policy: blocked destinations are permanent anyway, and a connection
/// error (the rebinding case) must not turn into retries that outlast the test.
fn one_attempt() -> Value {
    json!({"delivery": {"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1}}})
}

async fn endpoint_count(server: &TestServer, app: &str) -> usize {
    let (_, list) = server.get(&format!("/api/v1/app/{app}/endpoint")).await;
    list["data"].as_array().unwrap().len()
}

#[tokio::test]
async fn every_hostile_url_is_refused_at_registration_and_nothing_is_stored() {
    let canary = Canary::start().await;
    let server = TestServer::start_with(|c| {
        c.delivery.allowed_networks.clear();
        c.server.public_url = Some(format!("https://{PUBLIC_HOST}"));
    })
    .await;
    let app = server.create_app("a").await;
    let existing = server.create_endpoint(&app, "https://hooks.example.com/ok", json!({})).await;
    let existing = existing["id"].as_str().unwrap();
    let cases = cases("reject_registration", canary.port(), 1);
    assert!(cases.len() >= 30, "the contract lists {} registration cases", cases.len());
    for (url, scenario) in &cases {
        let (status, body) = server.post(&format!("/api/v1/app/{app}/endpoint"), json!({"url": url})).await;
        assert!(status.is_client_error(), "{scenario}: {url:?} was accepted ({status}) {body}");
        let path = format!("/api/v1/app/{app}/endpoint/{existing}");
        let (status, _) = server.call(Method::PUT, &path, Some(json!({"url": url}))).await;
        assert!(status.is_client_error(), "{scenario}: updating to {url:?} was accepted ({status})");
    }
    assert_eq!(endpoint_count(&server, &app).await, 1, "nothing was stored");
    let (_, kept) = server.get(&format!("/api/v1/app/{app}/endpoint/{existing}")).await;
    assert_eq!(kept["url"], "https://hooks.example.com/ok");
    assert_eq!(canary.connections(), 0);
}

/// Writes `url` straight into an endpoint's row, bypassing the API's checks.
async fn write_url_into_storage(storage: &Storage, endpoint: &str, url: &str) {
    match &storage.database_url {
        None => {
            let db = rusqlite::Connection::open(storage.dir.path().join("herald.db")).unwrap();
            let changed = db.execute("UPDATE endpoint SET url = ?1 WHERE id = ?2", [url, endpoint]).unwrap();
            assert_eq!(changed, 1);
        }
        Some(database) => {
            let (client, connection) = tokio_postgres::connect(database, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let changed =
                client.execute("UPDATE herald.endpoint SET url = $1 WHERE id = $2", &[&url, &endpoint]).await.unwrap();
            assert_eq!(changed, 1);
        }
    }
}

#[tokio::test]
async fn hostile_urls_written_straight_into_storage_are_refused_at_delivery() {
    let canary = Canary::start().await;
    let storage = Storage::new().await;
    let server = TestServer::start_on(&storage, |_| {}).await;
    let app = server.create_app("a").await;
    let cases = cases("reject_delivery", canary.port(), 1);
    let cases: Vec<_> =
        cases.into_iter().filter(|(url, _)| !url.contains(".ssrf.test") && !url.contains("nip.io")).collect();
    assert!(cases.len() >= 18, "the contract lists {} such cases", cases.len());
    let mut ids = Vec::new();
    for (i, _) in cases.iter().enumerate() {
        let endpoint = server.create_endpoint(&app, &format!("https://hooks.example.com/{i}"), one_attempt()).await;
        ids.push(endpoint["id"].as_str().unwrap().to_owned());
    }
    server.stop().await;
    for ((url, _), id) in cases.iter().zip(&ids) {
        write_url_into_storage(&storage, id, url).await;
    }
    // The "test-public" allow-list is off: only the guard decides.
    let server = TestServer::start_on(&storage, |c| c.delivery.allowed_networks.clear()).await;
    let msg = server.send(&app, json!({"eventType": "probe", "payload": {}})).await;
    for ((url, scenario), id) in cases.iter().zip(&ids) {
        eventually(&format!("{scenario} fails"), || async {
            (server.delivery_status(&app, &msg, id).await == Some(FAIL)).then_some(())
        })
        .await;
        let (_, attempts) = server.get(&format!("/api/v1/app/{app}/attempt/endpoint/{id}")).await;
        let attempts = attempts["data"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{scenario}: blocked is permanent");
        assert_eq!(attempts[0]["errorClass"], "blocked_destination", "{scenario}: {url}");
    }
    assert_eq!(canary.connections(), 0, "no connection reached the canary");
}

#[tokio::test]
async fn hostile_name_servers_cannot_point_a_delivery_at_a_forbidden_address() {
    let canary = Canary::start().await;
    let loopback = Ipv4Addr::new(127, 0, 0, 1);
    let public = Ipv4Addr::new(127, 0, 0, 2); // "public" inside this test only
    let dns = StubDns::start(move |name, seen| match name {
        "127.0.0.1.nip.io" => Some(vec![Answer::A(loopback)]),
        "rebind.ssrf.test" => Some(vec![Answer::A(if seen == 0 { public } else { loopback })]),
        "mixed.ssrf.test" => Some(vec![Answer::A(public), Answer::A(loopback)]),
        "cname.ssrf.test" => Some(vec![Answer::Cname("localhost.")]),
        "localhost" => Some(vec![Answer::A(loopback)]),
        _ => None,
    })
    .await;
    let server = TestServer::start_with(|c| {
        c.delivery.allowed_networks = vec!["127.0.0.2/32".parse().unwrap()];
        c.delivery.dns_servers = vec![dns.addr];
    })
    .await;
    let app = server.create_app("a").await;
    let cases: Vec<_> = cases("reject_delivery", canary.port(), 1)
        .into_iter()
        .filter(|(url, _)| url.contains(".ssrf.test") || url.contains("nip.io"))
        .collect();
    assert_eq!(cases.len(), 4);
    let mut endpoints = HashMap::new();
    for (url, scenario) in &cases {
        // Registration may accept names: they are judged when resolved, at every attempt.
        let endpoint = server.create_endpoint(&app, url, one_attempt()).await;
        endpoints.insert(endpoint["id"].as_str().unwrap().to_owned(), (url.clone(), scenario.clone()));
    }
    let msg = server.send(&app, json!({"eventType": "probe", "payload": {}})).await;
    for (id, (url, scenario)) in &endpoints {
        eventually(&format!("{scenario} fails"), || async {
            (server.delivery_status(&app, &msg, id).await == Some(FAIL)).then_some(())
        })
        .await;
        let (_, attempts) = server.get(&format!("/api/v1/app/{app}/attempt/endpoint/{id}")).await;
        let class = attempts["data"][0]["errorClass"].as_str().unwrap().to_owned();
        if url.contains("rebind") {
            // Resolved once to the vetted 127.0.0.2 and pinned: the connection went there
            // (nothing listens on that port), never to the 127.0.0.1 of a second answer.
            assert_eq!(dns.queries("rebind.ssrf.test"), 1, "resolved once per attempt");
            assert_eq!(class, "connection", "{scenario}");
        } else {
            assert_eq!(class, "blocked_destination", "{scenario}: {url}");
        }
    }
    assert_eq!(canary.connections(), 0, "no connection reached the canary");
}

#[tokio::test]
async fn redirects_fail_the_attempt_and_are_never_followed() {
    let canary = Canary::start().await;
    let target = format!("http://127.0.0.1:{}/", canary.port());
    let receiver = Receiver::start_at("127.0.0.2", move |r, _| {
        let to = if r.path.contains("to=self") { "/redirect?to=self".to_owned() } else { target.clone() };
        Reply::status(302).header("location", &to)
    })
    .await;
    let server = TestServer::start_with(|c| c.delivery.allowed_networks = vec!["127.0.0.2/32".parse().unwrap()]).await;
    let app = server.create_app("a").await;
    let cases = cases("attempt_failed_no_follow", canary.port(), receiver.addr.port());
    assert_eq!(cases.len(), 2);
    for (url, _) in &cases {
        server.create_endpoint(&app, url, one_attempt()).await;
    }
    let msg = server.send(&app, json!({"eventType": "probe", "payload": {}})).await;
    let attempts = eventually("both attempts", || async {
        let attempts = server.attempts(&app, &msg).await;
        (attempts.len() == 2).then_some(attempts)
    })
    .await;
    for attempt in attempts {
        assert_eq!(attempt["responseStatusCode"], 302);
        assert_eq!(attempt["errorClass"], "redirect");
    }
    assert_eq!(receiver.requests().len(), 2, "exactly one request per attempt");
    assert_eq!(canary.connections(), 0, "the Location was never fetched");
}

#[tokio::test]
async fn proxy_variables_in_the_environment_are_ignored() {
    let proxy = Canary::start().await;
    let receiver = Receiver::ok().await;
    let storage = Storage::new().await;
    let proxy_url = format!("http://{}", proxy.addr);
    let proxies: Vec<(&str, &str)> =
        ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"]
            .into_iter()
            .map(|name| (name, proxy_url.as_str()))
            .collect();
    let herald = Process::start_with(&storage, &proxies);
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let post = |path: String, body: Value| {
        client.post(format!("{}{path}", herald.base)).bearer_auth(ADMIN_TOKEN).json(&body).send()
    };
    let app: Value = post("/api/v1/app".into(), json!({"name": "a"})).await.unwrap().json().await.unwrap();
    let app = app["id"].as_str().unwrap().to_owned();
    let status =
        post(format!("/api/v1/app/{app}/endpoint"), json!({"url": receiver.url("/hook")})).await.unwrap().status();
    assert_eq!(status, StatusCode::CREATED);
    let status =
        post(format!("/api/v1/app/{app}/msg"), json!({"eventType": "a", "payload": {}})).await.unwrap().status();
    assert_eq!(status, StatusCode::ACCEPTED);
    receiver.wait_for(Some("/hook"), 1).await;
    assert_eq!(proxy.connections(), 0, "delivered directly, not through the proxy");
    herald.kill();
}
