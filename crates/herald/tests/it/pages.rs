//! Every dashboard page in a real headless Chromium, as the operator and as a customer,
//! with data from real deliveries: each page is screenshotted, has no console error and
//! no serious or critical accessibility violation (axe-core in the same Chromium). The
//! charts draw what was delivered (bars and points counted against the seeded data), ids
//! read as names, the search finds messages by event id, endpoints by URL and applications
//! by name, long lists page, and revoking an application's portal links signs its
//! customers out. The portal shows inside a frame of an allowed site only, in its brand.

use axum::response::Html;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::browser::Browser;
use crate::support::server::ADMIN_TOKEN;
use crate::support::{Receiver, Reply, TestServer, eventually};

/// Failing deliveries make two quick attempts, then dead-letter; two failures open the
/// breaker (with a cooldown longer than the test). Strict order makes it exact: the first
/// message fails twice and is dead-lettered, the rest wait behind the open breaker.
fn failing() -> Value {
    json!({"description": "Fulfilment", "delivery": {
        "ordering": "strict",
        "retry": {"strategy": "schedule", "delaysMs": [10], "jitterPercent": 0},
        "circuitBreaker": {"failureThreshold": 2, "cooldownMs": 600_000},
    }})
}

async fn event_types(server: &TestServer) {
    for (name, description) in [
        ("invoice.paid", "An invoice was paid"),
        ("invoice.failed", "A payment failed"),
        ("customer.created", "A customer signed up"),
    ] {
        let schema = json!({"1": {"type": "object", "examples": [{"example": name}]}});
        let body = json!({"name": name, "description": description, "schemas": schema});
        assert_eq!(server.post("/api/v1/event-type", body).await.0, StatusCode::CREATED);
    }
}

/// The numbers table of the chart `id`: the sum of each column, and the number of rows.
async fn chart_numbers(browser: &Browser, id: &str) -> (Vec<f64>, usize) {
    let script = format!(
        "const rows = [...document.querySelectorAll('#{id} details.numbers tbody tr')];
         const sums = [];
         rows.forEach(r => [...r.querySelectorAll('td')].forEach((td, i) => {{
             sums[i] = (sums[i] || 0) + (parseFloat(td.textContent) || 0); }}));
         return [sums, rows.length];"
    );
    let answer = browser.run(&script).await;
    let sums = answer[0].as_array().unwrap().iter().map(|v| v.as_f64().unwrap_or(0.0)).collect();
    (sums, answer[1].as_u64().unwrap() as usize)
}

async fn count(browser: &Browser, css: &str) -> usize {
    browser.run(&format!("return document.querySelectorAll({css:?}).length;")).await.as_u64().unwrap() as usize
}

/// Reloads `url` until `check` finds what it waits for on the page.
async fn until_page<T>(browser: &Browser, url: &str, what: &str, check: impl AsyncFn(&Browser) -> Option<T>) -> T {
    eventually(what, || async {
        browser.goto(url).await;
        check(browser).await
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_reads_well_and_passes_the_accessibility_check() {
    let server = TestServer::start().await;
    event_types(&server).await;
    let good = Receiver::ok().await;
    let bad = Receiver::start(|_, _| Reply::status(500).body("down for maintenance")).await;
    let (_, shop) = server.post("/api/v1/app", json!({"name": "Acme Shop", "uid": "acme"})).await;
    let app = shop["id"].as_str().unwrap().to_owned();
    let billing = server.create_endpoint(&app, &good.url("/billing"), json!({"description": "Billing"})).await;
    let billing = billing["id"].as_str().unwrap().to_owned();
    let fulfilment = server.create_endpoint(&app, &bad.url("/fulfil"), failing()).await;
    let fulfilment = fulfilment["id"].as_str().unwrap().to_owned();
    let globex = server.create_app("Globex").await;
    server.create_endpoint(&globex, &good.url("/globex"), json!({})).await;
    for i in 0..6 {
        let body = json!({"eventType": "invoice.paid", "eventId": format!("inv-{i}"), "payload": {"invoice": i}});
        server.send(&app, body).await;
    }
    server.send(&globex, json!({"eventType": "customer.created", "payload": {}})).await;
    good.wait_for(Some("/billing"), 6).await;
    let health = format!("/api/v1/app/{app}/endpoint/{fulfilment}/health");
    eventually("the failing endpoint's circuit to open", || async {
        (server.get(&health).await.1["state"] == "open").then_some(())
    })
    .await;

    let browser = Browser::start().await;
    browser.goto(&server.url("/login")).await;
    browser.audit("page-sign-in").await;
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("button[type=submit]").await;

    // The overview: the server's charts add up to what happened.
    let overview = server.url("/");
    let sums = until_page(&browser, &overview, "7 accepted messages in the chart", async |b| {
        let (sums, rows) = chart_numbers(b, "messages").await;
        (rows > 0 && sums.first() == Some(&7.0)).then_some(sums)
    })
    .await;
    assert_eq!(count(&browser, "#messages circle").await, 4 * 60, "a point per minute of the hour, per series");
    assert!(sums[1] >= 7.0, "deliveries: {sums:?}");
    assert!(browser.text("table.dead-letters").await.contains("Fulfilment"), "endpoints by name");
    assert!(browser.text("table.dead-letters").await.contains("Acme Shop"), "applications by name");
    browser.audit("page-overview").await;
    browser.goto(&server.url("/?window=7d")).await;
    assert_eq!(count(&browser, "#messages circle").await, 4 * 7 * 24, "a point per hour of the week, per series");
    browser.audit("page-overview-week").await;

    // The application: names, summed charts, its messages.
    browser.goto(&server.url(&format!("/app/{app}"))).await;
    let endpoints = browser.text("table.endpoints").await;
    assert!(
        endpoints.contains("Billing") && endpoints.contains("Fulfilment") && endpoints.contains("open"),
        "{endpoints}"
    );
    let (sums, rows) = chart_numbers(&browser, "app-deliveries").await;
    assert_eq!(sums, vec![6.0, 2.0], "6 succeeded, 2 failed attempts");
    assert_eq!(count(&browser, "#app-deliveries g.slot").await, rows, "one bar group per hour with attempts");
    browser.audit("page-application").await;

    // An endpoint: its own charts, the breaker's history, its dead letters.
    let failing_page = server.url(&format!("/app/{app}/endpoint/{fulfilment}"));
    until_page(&browser, &failing_page, "the latency points", async |b| {
        let (_, rows) = chart_numbers(b, "endpoint-latency").await;
        (rows > 0 && count(b, "#endpoint-latency circle").await == 3 * rows).then_some(())
    })
    .await;
    let (sums, rows) = chart_numbers(&browser, "endpoint-deliveries").await;
    assert_eq!((sums, count(&browser, "#endpoint-deliveries g.slot").await), (vec![0.0, 2.0], rows));
    assert_eq!(count(&browser, "#endpoint-deliveries rect.bar.s1").await, rows, "failed bars, hatched");
    assert!(browser.text("#breaker-history").await.contains("opened"), "the breaker's history");
    assert!(browser.text("table.dead-letters").await.contains("Fulfilment"));
    browser.audit("page-endpoint-failing").await;
    browser.goto(&format!("{failing_page}?window=7d")).await;
    assert_eq!(chart_numbers(&browser, "endpoint-deliveries").await.0, vec![0.0, 2.0], "the week holds the same");
    browser.audit("page-endpoint-week").await;

    // The delivery log, filtered; each attempt's request, masked, and the response as text.
    browser.goto(&server.url(&format!("/app/{app}/log?status=failed"))).await;
    assert_eq!(count(&browser, "table.attempts tbody tr").await, 2, "only the failed attempts");
    browser.run("document.querySelectorAll('details.exchange').forEach(d => d.open = true);").await;
    let request = browser.text("pre.request").await;
    assert!(request.starts_with("POST ") && request.contains("webhook-signature: v1,•••"), "{request}");
    assert!(browser.text("pre.response").await.contains("down for maintenance"));
    browser.audit("page-delivery-log").await;
    browser.goto(&server.url(&format!("/app/{app}/log?endpoint={billing}"))).await;
    assert_eq!(count(&browser, "table.attempts tbody tr").await, 6);

    // A message, the catalog, the forms.
    browser.click("table.attempts tbody tr td:nth-child(3) a").await;
    assert!(browser.text("table.deliveries").await.contains("Billing"), "destinations by name");
    browser.audit("page-message").await;
    for (path, name) in [
        (format!("/app/{app}/event-types"), "page-event-catalog"),
        (format!("/app/{app}/endpoint/new"), "page-endpoint-new"),
        (format!("/app/{app}/endpoint/{billing}"), "page-endpoint"),
        ("/apps".into(), "page-applications"),
        ("/dead-letters".into(), "page-dead-letters"),
    ] {
        browser.goto(&server.url(&path)).await;
        browser.audit(name).await;
    }
    browser.goto(&server.url(&format!("/app/{app}/endpoint/{billing}"))).await;
    browser.click("#delete").await;
    browser.audit("page-endpoint-delete").await;
    browser.goto(&server.url(&format!("/app/{app}"))).await;
    browser.click("form[action$='/replay'] button").await;
    assert_eq!(browser.text("#dry-run-count").await, "1 dead letter matches.");
    browser.audit("page-replay-count").await;
    browser.click("#confirm-replay").await;
    browser.audit("page-replay-progress").await;

    // The search: an event id, part of a URL, an application's name.
    for (query, expect) in [("inv-3", "invoice.paid"), ("/fulfil", "Fulfilment"), ("globex", "Globex")] {
        browser.goto(&server.url(&format!("/search?q={query}"))).await;
        assert!(browser.text("main").await.contains(expect), "searching {query}");
    }
    assert_eq!(browser.text("#search-count").await, "2 found", "Globex the application and its endpoint's URL");
    browser.audit("page-search").await;

    // The customer's own pages.
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    browser.click("header form button").await;
    browser.goto(access["url"].as_str().unwrap()).await;
    browser.until_url("the portal", |u| u.ends_with(&format!("/app/{app}"))).await;
    browser.audit("portal-application").await;
    assert!(browser.find("#revoke-links").await.is_none(), "portal links are the operator's");
    for (path, name) in [
        (format!("/app/{app}/endpoint/{fulfilment}"), "portal-endpoint-failing"),
        (format!("/app/{app}/log"), "portal-delivery-log"),
        (format!("/app/{app}/event-types"), "portal-event-catalog"),
        (format!("/app/{app}/endpoint/new"), "portal-endpoint-new"),
    ] {
        browser.goto(&server.url(&path)).await;
        browser.audit(name).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_lists_page_and_revoked_portal_links_sign_customers_out() {
    let server = TestServer::start().await;
    let app = server.create_app("Paged").await;
    for i in 0..57 {
        server.send(&app, json!({"eventType": "t", "eventId": format!("m-{i:02}"), "payload": {}})).await;
    }
    for i in 0..52 {
        server.create_app(&format!("tenant {i}")).await;
    }
    let browser = Browser::start().await;
    browser.goto(&server.url("/login")).await;
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("button[type=submit]").await;
    browser.goto(&server.url(&format!("/app/{app}"))).await;
    assert_eq!(count(&browser, "table.messages tbody tr").await, 50);
    browser.click("nav.pager a[rel=next]").await;
    assert_eq!(count(&browser, "table.messages tbody tr").await, 7, "the rest on the next page");
    assert!(browser.text("table.messages").await.contains("m-00"), "the oldest last");
    browser.audit("page-messages-older").await;
    browser.goto(&server.url("/apps")).await;
    assert_eq!(count(&browser, "table.apps tbody tr").await, 50);
    browser.click("nav.pager a[rel=next]").await;
    assert_eq!(count(&browser, "table.apps tbody tr").await, 3);

    // A customer's session ends when the operator revokes the application's links.
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let customer = crate::support::server::sign_in(&server.url(""), access["token"].as_str().unwrap()).await;
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let own_page = server.url(&format!("/app/{app}"));
    assert_eq!(client.get(&own_page).header("cookie", &customer).send().await.unwrap().status(), StatusCode::OK);
    browser.goto(&own_page).await;
    assert!(browser.text("#portal-links").await.starts_with("1 valid"));
    browser.click("#revoke-links").await;
    assert_eq!(browser.text("#portal-links").await, "No portal link is valid now.");
    let after = client.get(&own_page).header("cookie", &customer).send().await.unwrap();
    assert_eq!(after.status(), StatusCode::SEE_OTHER, "back to the sign-in page");
    let api = client.get(server.url(&format!("/api/v1/app/{app}"))).bearer_auth(access["token"].as_str().unwrap());
    assert_eq!(api.send().await.unwrap().status(), StatusCode::UNAUTHORIZED, "the token itself is expired");
}

/// A port on loopback, bound (so its number is known before anything serves on it).
fn bound() -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    listener
}

/// Another site's page, on `listener`, that shows the portal link in a frame.
fn embedding_site(listener: std::net::TcpListener, portal_link: &str) {
    let page = format!(
        "<!doctype html><html lang=en><title>Customer area</title><link rel=icon href=\"data:,\"><h1>Our product</h1>\
         <iframe id=portal title=Webhooks width=1200 height=900 src=\"{portal_link}\"></iframe></html>"
    );
    let router = axum::Router::new().route("/", axum::routing::get(move || async move { Html(page) }));
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_shows_in_a_frame_of_an_allowed_site_only_in_its_brand() {
    // The embedding sites run on `localhost`, Herald on 127.0.0.1: a different site, as an
    // operator's product and its Herald would be.
    let (allowed, other) = (bound(), bound());
    let allowed_port = allowed.local_addr().unwrap().port();
    let other_port = other.local_addr().unwrap().port();
    let server = TestServer::start_with(|config| {
        config.portal.frame_ancestors = vec![format!("http://localhost:{allowed_port}")];
        config.portal.brand.name = Some("Acme Webhooks".into());
        config.portal.brand.theme = Some(herald::brand::Theme::Dark);
    })
    .await;
    let app = server.create_app("Globex").await;
    let brand = json!({"portalBrand": {"accentColor": "#0a7cff", "name": "Globex Hooks"}});
    let (status, patched) = server.call(reqwest::Method::PATCH, &format!("/api/v1/app/{app}"), Some(brand)).await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    let receiver = Receiver::ok().await;
    server.create_endpoint(&app, &receiver.url("/hook"), json!({"description": "Orders"})).await;
    for site in [allowed, other] {
        let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
        embedding_site(site, access["url"].as_str().unwrap());
    }

    let browser = Browser::start().await;
    browser.goto(&format!("http://localhost:{allowed_port}/")).await;
    browser.enter_frame("#portal").await;
    let header = eventually("the portal inside the frame", || async {
        let text = browser.text("header").await;
        text.contains("Globex Hooks").then_some(text)
    })
    .await;
    assert!(header.contains("Globex Hooks"), "the application's brand name over the server's: {header}");
    assert!(browser.text("table.endpoints").await.contains("Orders"), "signed in inside the frame");
    let accent = browser.run("return getComputedStyle(document.querySelector('header')).backgroundColor;").await;
    assert_eq!(accent, "rgb(10, 124, 255)", "the application's accent colour");
    assert_eq!(browser.run("return document.documentElement.dataset.theme;").await, "dark", "the server's theme");
    browser.click("a[href$='/log']").await;
    assert!(browser.find("table.attempts, p.muted").await.is_some(), "navigating inside the frame keeps the session");
    browser.leave_frame().await;
    browser.audit("portal-embedded").await;

    browser.goto(&format!("http://localhost:{other_port}/")).await;
    browser.enter_frame("#portal").await;
    let shown = browser.run("return document.location.href + ' ' + document.body.innerText;").await;
    assert!(!shown.as_str().unwrap_or_default().contains("Orders"), "nothing of the portal shows: {shown}");
    browser.leave_frame().await;
    let refused = browser.console().await;
    assert!(
        refused.iter().any(|(_, text)| text.contains("frame-ancestors")),
        "the browser refused to frame it: {refused:?}"
    );
    browser.screenshot("portal-embedded-refused").await;

    // The operator's pages are never framed, whatever the allow-list says.
    let admin = crate::support::server::sign_in(&server.url(""), ADMIN_TOKEN).await;
    let client = reqwest::Client::new();
    let overview = client.get(server.url("/")).header("cookie", admin).send().await.unwrap();
    let policy = overview.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correcting_a_broken_url_in_the_portal_delivers_the_parked_messages_at_once() {
    let server = TestServer::start().await;
    let broken = Receiver::start(|_, _| Reply::status(503)).await;
    let fixed = Receiver::ok().await;
    let app = server.create_app("shop").await;
    let parking = json!({"delivery": {
        "retry": {"strategy": "schedule", "delaysMs": vec![10; 30], "jitterPercent": 0},
        "circuitBreaker": {"failureThreshold": 1, "cooldownMs": 600_000},
    }});
    let endpoint = server.create_endpoint(&app, &broken.url("/typo"), parking).await;
    let ep = endpoint["id"].as_str().unwrap().to_owned();
    // The first 503 opens the breaker; the messages behind it are parked for ten minutes.
    for i in 0..5 {
        server.send(&app, json!({"eventType": "t", "payload": {"n": i}})).await;
    }
    let health = format!("/api/v1/app/{app}/endpoint/{ep}/health");
    eventually("the circuit to open", || async { (server.get(&health).await.1["state"] == "open").then_some(()) })
        .await;

    let browser = Browser::start().await;
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    browser.goto(access["url"].as_str().unwrap()).await;
    browser.until_url("the portal", |u| u.ends_with(&format!("/app/{app}"))).await;
    browser.goto(&server.url(&format!("/app/{app}/endpoint/{ep}"))).await;
    assert_eq!(browser.text("#circuit").await, "open");
    browser.run(&format!("document.getElementById('url').value = '{}';", fixed.url("/hook"))).await;
    browser.click("form.settings button[type=submit]").await;
    fixed.wait_for(Some("/hook"), 5).await;
    assert_eq!(browser.text("#circuit").await, "closed", "the new URL closed the breaker");
    browser.audit("portal-endpoint-fixed").await;
}
