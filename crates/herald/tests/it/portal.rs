//! The customer portal in a real headless Chromium: a customer enters through the portal
//! link, is refused an address the destination guard forbids (with the guard's reason, and
//! nothing created), adds an endpoint subscribed to two event types picked from the
//! catalog, sends a test event and sees it arrive and succeed, rotates the secret and
//! verifies the next delivery with the new key, searches the catalog, and retries an open
//! circuit at once. Screenshots go to the test artifacts.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::browser::Browser;
use crate::support::certs::TestCa;
use crate::support::{Receiver, Reply, TestServer, eventually, verifies};

async fn event_type(server: &TestServer, name: &str, description: &str) {
    let schema = json!({"1": {"type": "object", "examples": [{"example": name}]}});
    let (status, body) =
        server.post("/api/v1/event-type", json!({"name": name, "description": description, "schemas": schema})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// Enters the portal of `app` through its link.
async fn enter(server: &TestServer, browser: &Browser, app: &str) {
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    browser.goto(access["url"].as_str().unwrap()).await;
    browser.until_url("the portal", |url| url.ends_with(&format!("/app/{app}"))).await;
}

/// Reloads `url` until the text of `css` satisfies `want`.
async fn until_text(browser: &Browser, url: &str, css: &str, want: impl Fn(&str) -> bool) -> String {
    eventually(&format!("{css} on {url}"), || async {
        browser.goto(url).await;
        let text = browser.text(css).await;
        want(&text).then_some(text)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_adds_an_endpoint_from_the_catalog_tests_it_and_rotates_its_secret() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    event_type(&server, "invoice.paid", "An invoice was paid").await;
    event_type(&server, "invoice.failed", "A payment failed").await;
    event_type(&server, "customer.created", "A customer signed up").await;
    let app = server.create_app("shop").await;
    let browser = Browser::start().await;
    enter(&server, &browser, &app).await;

    // The catalog, grouped and searchable.
    browser.goto(&server.url(&format!("/app/{app}/event-types"))).await;
    assert_eq!(browser.text("#catalog-count").await, "3 of 3 event types");
    let groups =
        browser.run("return [...document.querySelectorAll('section.catalog-group h2')].map(h => h.textContent);");
    assert_eq!(groups.await, json!(["customer", "invoice"]));
    browser.audit("portal-catalog").await;
    browser.goto(&server.url(&format!("/app/{app}/event-types?q=payment"))).await;
    assert_eq!(browser.text("#catalog-count").await, "1 of 3 event types");
    assert!(browser.find("#type-invoice\\.failed").await.is_some());

    // A forbidden address: the guard's reason next to the field, nothing created.
    browser.goto(&server.url(&format!("/app/{app}"))).await;
    browser.click("#add-endpoint").await;
    browser.type_into("#url", "http://169.254.169.254/latest/meta-data").await;
    browser.click("form.settings button[type=submit]").await;
    let reason = browser.text(".field-error").await;
    assert!(reason.contains("169.254.169.254") || reason.contains("link-local"), "the guard's reason: {reason}");
    let (_, endpoints) = server.get(&format!("/api/v1/app/{app}/endpoint")).await;
    assert_eq!(endpoints["data"].as_array().unwrap().len(), 0, "nothing created");
    browser.audit_refusal("portal-endpoint-refused", 422).await;

    // The real one, subscribed to two event types picked from the catalog.
    let url = receiver.url("/hook");
    browser.run(&format!("document.getElementById('url').value = '{url}';")).await;
    browser.type_into("#description", "Billing").await;
    for name in ["invoice.paid", "invoice.failed"] {
        browser.run(&format!("document.querySelector(\"input[value='{name}']\").click();")).await;
    }
    browser.click("form.settings button[type=submit]").await;
    let page = browser.until_url("the endpoint's page", |u| u.contains("/endpoint/ep_")).await;
    let ep = page.rsplit('/').next().unwrap().to_owned();
    let (_, endpoint) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await;
    assert_eq!(endpoint["url"], url.as_str());
    assert_eq!(endpoint["filterTypes"], json!(["invoice.failed", "invoice.paid"]));
    assert_eq!(endpoint["description"], "Billing");

    // A test event of a catalogued type: it arrives, and the page says it succeeded.
    browser.run("document.getElementById('test-type').value = 'invoice.paid';").await;
    browser.click("#test-event button").await;
    let tested = browser.url().await;
    assert!(tested.contains("?test=msg_"), "{tested}");
    until_text(&browser, &tested, "#test-outcome", |t| t.starts_with("Test event delivered: 200")).await;
    let got = receiver.wait_for(Some("/hook"), 1).await;
    assert_eq!(got[0].body.as_ref(), br#"{"example":"invoice.paid"}"#);
    browser.audit("portal-endpoint").await;

    // The secret: masked until revealed; rotated, the next delivery verifies with the new key.
    assert_eq!(browser.text("#secret").await, "", "masked until revealed");
    browser.run("document.querySelector('details.secret').open = true;").await;
    let first = browser.text("#secret").await;
    assert_eq!(first, server.secret(&app, &ep).await);
    assert!(verifies(&first, &got[0]));
    browser.click("#rotate").await;
    browser.run("document.querySelector('details.secret').open = true;").await;
    let second = browser.text("#secret").await;
    assert!(second.starts_with("whsec_") && second != first, "a new secret: {second}");
    let overlap = browser.text("#rotate + span").await;
    assert!(overlap.contains("keeps signing (a second signature) for 24 hours"), "the overlap is stated: {overlap}");
    browser.run("document.getElementById('test-type').value = 'invoice.failed';").await;
    browser.click("#test-event button").await;
    let got = receiver.wait_for(Some("/hook"), 2).await;
    assert!(verifies(&second, &got[1]), "the next delivery verifies with the new secret");

    // Headers are write-only: the name is listed, the value never shown.
    browser.type_into("#header-name", "x-api-key").await;
    browser.type_into("#header-value", "sk-canary-4242").await;
    browser.click("#header-value + button").await;
    assert!(browser.text("table.headers").await.contains("x-api-key"));
    assert!(!browser.run("return document.documentElement.outerHTML;").await.to_string().contains("sk-canary-4242"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_retries_an_open_circuit_and_edits_disables_and_deletes_an_endpoint() {
    let server = TestServer::start().await;
    let healed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = healed.clone();
    let receiver =
        Receiver::start(
            move |_, _| {
                if flag.load(std::sync::atomic::Ordering::SeqCst) { Reply::ok() } else { Reply::status(503) }
            },
        )
        .await;
    let app = server.create_app("shop").await;
    let parking = json!({"delivery": {
        "retry": {"strategy": "schedule", "delaysMs": vec![10; 20], "jitterPercent": 0},
        "circuitBreaker": {"failureThreshold": 2, "cooldownMs": 300_000},
    }});
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), parking).await;
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    server.send(&app, json!({"eventType": "t", "payload": {}})).await;
    let health = format!("/api/v1/app/{app}/endpoint/{ep}/health");
    eventually("the circuit to open", || async { (server.get(&health).await.1["state"] == "open").then_some(()) })
        .await;

    let browser = Browser::start().await;
    enter(&server, &browser, &app).await;
    browser.click(&format!("a[href='/app/{app}/endpoint/{ep}']")).await;
    assert_eq!(browser.text("#circuit").await, "open");
    healed.store(true, std::sync::atomic::Ordering::SeqCst);
    browser.click("#retry-now").await;
    let page = server.url(&format!("/app/{app}/endpoint/{ep}"));
    until_text(&browser, &page, "#circuit", |t| t == "closed").await;
    assert_eq!(receiver.requests().len(), 3, "two failures, then the probe at once");

    // Editing: a rate limit, then clearing it; a refused edit keeps what was typed.
    browser.type_into("#throttle_rate", "5").await;
    browser.click("form.settings button[type=submit]").await;
    assert_eq!(server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await.1["throttleRate"], 5);
    browser.run("document.getElementById('url').value = 'ftp://example.com/';").await;
    browser.click("form.settings button[type=submit]").await;
    assert!(!browser.text(".field-error").await.is_empty(), "the API's reason, next to the URL");
    assert_eq!(browser.run("return document.getElementById('url').value;").await, "ftp://example.com/");
    assert_eq!(server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await.1["url"], receiver.url("/hook").as_str());

    browser.goto(&page).await;
    browser.click("#disable").await;
    assert_eq!(server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await.1["disabled"], true);
    browser.click("#enable").await;
    assert_eq!(server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await.1["disabled"], false);

    browser.click("#delete").await;
    assert!(browser.text("#confirm-delete").await.contains("Delete the endpoint"));
    let (status, _) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await;
    assert_eq!(status, StatusCode::OK, "nothing deleted before the confirmation");
    browser.click("#confirm").await;
    let (status, _): (StatusCode, Value) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_sets_a_filter_a_transform_and_receiver_credentials() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("shop").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    let browser = Browser::start().await;
    enter(&server, &browser, &app).await;
    let page = server.url(&format!("/app/{app}/endpoint/{ep}"));
    browser.goto(&page).await;

    // A filter that does not parse: refused with its position, next to the field, kept as typed.
    browser.type_into("#filter", ".payload.amount >").await;
    browser.click("form.settings button[type=submit]").await;
    let reason = browser.text(".field-error").await;
    assert!(reason.starts_with("line 1, column"), "the parse error's position: {reason}");
    assert_eq!(browser.run("return document.getElementById('filter').value;").await, ".payload.amount >");
    assert!(server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await.1.get("filter").is_none());
    browser.audit_refusal("portal-endpoint-filter-refused", 422).await;

    browser.run("document.getElementById('filter').value = '.payload.amount > 100';").await;
    browser.type_into("#transform", "{payload: {cents: (.payload.amount * 100)}}").await;
    browser.click("form.settings button[type=submit]").await;
    browser.until_url("the endpoint's page", |u| u.ends_with(&ep)).await;
    let (_, read) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await;
    assert_eq!(read["filter"], ".payload.amount > 100");
    assert_eq!(read["transform"], "{payload: {cents: (.payload.amount * 100)}}");

    // Try it: filtered out, then what would be sent.
    browser.type_into("#try-type", "invoice.paid").await;
    browser.run("document.getElementById('try-payload').value = '{\"amount\": 5}';").await;
    browser.click("#try-it button").await;
    assert_eq!(browser.text("#trial-outcome").await, "Filtered out: the filter yielded false");
    browser.run("document.getElementById('try-payload').value = '{\"amount\": 150}';").await;
    browser.click("#try-it button").await;
    assert_eq!(browser.text("#trial-request").await, format!("POST {}", receiver.url("/hook")));
    assert_eq!(browser.text("#trial-body").await, r#"{"cents":15000}"#);
    browser.audit("portal-endpoint-trial").await;
    assert!(receiver.requests().is_empty(), "trying sends nothing");

    // And for real: only the large one arrives, transformed. The filter decides at ingest:
    // the small one has no delivery to send, only the filter's verdict.
    let small = server.send(&app, json!({"eventType": "invoice.paid", "payload": {"amount": 5}})).await;
    let large = server.send(&app, json!({"eventType": "invoice.paid", "payload": {"amount": 150}})).await;
    let got = receiver.wait_for(Some("/hook"), 1).await;
    assert_eq!(got[0].body.as_ref(), br#"{"cents":15000}"#);
    eventually("the large one's delivery to succeed", || async {
        (server.delivery_status(&app, &large, &ep).await == Some(0)).then_some(())
    })
    .await;
    assert_eq!(server.delivery_status(&app, &small, &ep).await, None, "no delivery of the small one");
    let (_, filtered) = server.get(&format!("/api/v1/app/{app}/msg/{small}/filtered")).await;
    assert_eq!(filtered["data"], json!([{"endpointId": ep, "reason": "the filter yielded false"}]));
    assert_eq!(receiver.requests().len(), 1);

    // Credentials for the receiver: set from the form, never shown again, sent.
    browser.goto(&page).await;
    browser.type_into("#auth_username", "shop").await;
    browser.type_into("#auth_password", "pa55-canary").await;
    browser.click("form.settings button[type=submit]").await;
    browser.until_url("the endpoint's page", |u| u.ends_with(&ep)).await;
    assert_eq!(server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await.1["auth"], json!({"type": "basic"}));
    browser.goto(&page).await;
    assert!(browser.find("#auth-state").await.is_some());
    assert!(!browser.run("return document.documentElement.outerHTML;").await.to_string().contains("pa55-canary"));
    server.send(&app, json!({"eventType": "invoice.paid", "payload": {"amount": 300}})).await;
    let got = receiver.wait_for(Some("/hook"), 2).await;
    assert_eq!(got[1].header("authorization"), "Basic c2hvcDpwYTU1LWNhbmFyeQ==");
}

/// Sets a textarea or input to `value` (PEM text is too long to type).
async fn fill(browser: &Browser, id: &str, value: &str) {
    browser.run(&format!("document.getElementById('{id}').value = {};", serde_json::to_string(value).unwrap())).await;
}

#[tokio::test]
async fn a_customer_sets_oauth2_credentials_and_a_client_certificate() {
    let ca = TestCa::new("Shop receiver CA");
    let receiver = Receiver::start_tls(ca.requiring_clients(&ca.server()), |_, _| Reply::ok()).await;
    let tokens = Receiver::start(|_, n| {
        let body = json!({"access_token": format!("tok-{n}"), "token_type": "Bearer", "expires_in": 3600});
        Reply::ok().header("content-type", "application/json").body(&body.to_string())
    })
    .await;
    let (client, stranger) = (ca.client("portal-client"), ca.client("stranger"));
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let endpoint = server.create_endpoint(&app, &receiver.https_url("/hook"), json!({})).await;
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    let browser = Browser::start().await;
    enter(&server, &browser, &app).await;
    let page = server.url(&format!("/app/{app}/endpoint/{ep}"));
    browser.goto(&page).await;

    // A key that belongs to another certificate: refused next to the key's field.
    fill(&browser, "tls_cert", &client.cert_pem).await;
    fill(&browser, "tls_key", &stranger.key_pem).await;
    browser.click("form.settings button[type=submit]").await;
    let reason = browser.text(".field-error").await;
    assert!(reason.starts_with("does not go with the certificate"), "{reason}");
    assert!(server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await.1.get("tls").is_none());
    browser.audit_refusal("portal-endpoint-tls-refused", 422).await;

    browser.goto(&page).await;
    browser.type_into("#auth_token_url", &tokens.url("/token")).await;
    browser.type_into("#auth_client_id", "shop-hooks").await;
    browser.type_into("#auth_client_secret", "cs-canary-77").await;
    browser.type_into("#auth_scopes", "hooks:write read").await;
    fill(&browser, "tls_cert", &client.cert_pem).await;
    fill(&browser, "tls_key", &client.key_pem).await;
    fill(&browser, "tls_ca", &ca.cert_pem).await;
    browser.click("form.settings button[type=submit]").await;
    browser.until_url("the endpoint's page", |u| u.ends_with(&ep)).await;
    let (_, read) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}")).await;
    assert_eq!(read["auth"]["type"], "oauth2", "{read}");
    assert_eq!(read["auth"]["scopes"], json!(["hooks:write", "read"]));
    assert_eq!(read["tls"]["clientCertificate"]["subject"], "CN=portal-client");

    // Shown as a summary, never as values.
    browser.goto(&page).await;
    assert!(browser.text("#auth-state").await.contains(&tokens.url("/token")));
    assert!(browser.text("#tls-state").await.contains("CN=portal-client"));
    let html = browser.run("return document.documentElement.outerHTML;").await.to_string();
    let key_line = client.key_pem.lines().nth(1).unwrap();
    assert!(!html.contains("cs-canary-77") && !html.contains(key_line), "no secret on the page");
    browser.audit("portal-endpoint-credentials").await;

    // Delivered over mutual TLS with the grant's token.
    server.send(&app, json!({"eventType": "invoice.paid", "payload": {}})).await;
    let got = receiver.wait_for(Some("/hook"), 1).await;
    assert_eq!(got[0].header("authorization"), "Bearer tok-0");
    assert_eq!(tokens.requests()[0].header("authorization"), "Basic c2hvcC1ob29rczpjcy1jYW5hcnktNzc=");
}

#[tokio::test]
async fn a_customer_adds_and_deletes_a_poller_in_the_portal() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let browser = Browser::start().await;
    enter(&server, &browser, &app).await;
    let page = server.url(&format!("/app/{app}"));
    browser.goto(&page).await;

    // A filter that does not parse: refused next to its field, nothing created.
    browser.type_into("#poller_filter", ".payload |").await;
    browser.click("#add-poller button[type=submit]").await;
    let reason = browser.text(".field-error").await;
    assert!(reason.starts_with("line 1, column"), "{reason}");
    let (_, listed) = server.get(&format!("/api/v1/app/{app}/poller")).await;
    assert_eq!(listed["data"], json!([]), "{listed}");
    browser.audit_refusal("portal-poller-refused", 422).await;

    browser.goto(&page).await;
    browser.type_into("#poller_description", "nightly billing").await;
    browser.type_into("#poller_uid", "nightly").await;
    browser.type_into("#poller_event_types", "invoice.paid, invoice.voided").await;
    browser.type_into("#poller_filter", ".payload.amount > 0").await;
    browser.click("#add-poller button[type=submit]").await;
    browser.until_url("the application's page", |u| u.contains(&format!("/app/{app}"))).await;
    let (_, listed) = server.get(&format!("/api/v1/app/{app}/poller")).await;
    let created = &listed["data"][0];
    assert_eq!((created["uid"].as_str(), created["description"].as_str()), (Some("nightly"), Some("nightly billing")));
    assert_eq!(created["eventTypes"], json!(["invoice.paid", "invoice.voided"]));
    assert!(browser.text("table.pollers").await.contains(&format!("/api/v1/app/{app}/poller/nightly/consumer/")));
    assert!(browser.text("td.consumers").await.contains("none has acknowledged a page yet"));

    // A consumer acknowledges a page: the portal shows it and when it moved.
    server.send(&app, json!({"eventType": "invoice.paid", "payload": {"amount": 5}})).await;
    let consumer = format!("/api/v1/app/{app}/poller/nightly/consumer/billing-sync");
    let (_, first) = server.get(&consumer).await;
    assert_eq!(first["data"].as_array().map(Vec::len), Some(1), "{first}");
    server.get(&format!("{consumer}?iterator={}", first["iterator"].as_str().unwrap())).await;
    browser.goto(&page).await;
    let consumers = browser.text("td.consumers").await;
    assert!(consumers.contains("billing-sync moved "), "{consumers}");
    browser.audit("portal-pollers").await;

    browser.click("table.pollers form button").await;
    browser.click("#confirm").await;
    browser.until_url("the application's page", |u| u.contains(&format!("/app/{app}"))).await;
    let (_, listed) = server.get(&format!("/api/v1/app/{app}/poller")).await;
    assert_eq!(listed["data"], json!([]), "deleted");
}
