//! The dashboard in a real headless Chromium: sign in, open a dead-lettered message, see
//! the receiver's response (a `<script>` body shown as text, not run), replay it and see
//! the attempt succeed; the consumer view enters through the app-portal link and cannot
//! reach another application. Screenshots of the main pages are saved as artifacts.
//! Forms without the session's CSRF token change nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::StatusCode;
use serde_json::json;

use crate::support::browser::{Browser, artifacts_dir};
use crate::support::server::ADMIN_TOKEN;
use crate::support::{Receiver, Reply, TestServer, eventually};

const HOSTILE_BODY: &str = "<script>window.owned = true; document.title = 'owned';</script>";

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
async fn operators_and_customers_see_failures_and_replay_them_in_a_real_browser() {
    let healed = Arc::new(AtomicBool::new(false));
    let flag = healed.clone();
    let receiver = Receiver::start(move |_, _| {
        if flag.load(Ordering::SeqCst) { Reply::ok().body("thanks") } else { Reply::status(500).body(HOSTILE_BODY) }
    })
    .await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let once = json!({"delivery": {"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1}}});
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), once).await;
    let endpoint_id = endpoint["id"].as_str().unwrap().to_owned();
    let msg = server.send(&app, json!({"eventType": "order.paid", "payload": {"order": 42}})).await;
    eventually("a dead letter", || async {
        (server.delivery_status(&app, &msg, &endpoint_id).await == Some(2)).then_some(())
    })
    .await;
    let other = server.create_app("someone-else").await;
    let other_msg = server.send(&other, json!({"eventType": "order.paid", "payload": {}})).await;

    let browser = Browser::start().await;
    // Sign in as the operator.
    browser.goto(&server.url("/login")).await;
    browser.type_into("#token", ADMIN_TOKEN).await;
    browser.click("button[type=submit]").await;
    assert!(browser.find("#summary").await.is_some(), "the overview after sign-in");
    assert!(!browser.url().await.contains(ADMIN_TOKEN));
    browser.audit("overview").await;
    browser.goto(&server.url(&format!("/app/{app}"))).await;
    assert!(browser.text("table.endpoints").await.contains(&endpoint_id));
    assert!(browser.text("table.dead-letters").await.contains("Trickle"), "the analysis with its pattern");
    browser.audit("application").await;
    browser.goto(&server.url("/dead-letters")).await;
    browser.audit("dead-letters").await;

    // The dead-lettered message: the response body is text, and it did not run.
    let page = server.url(&format!("/app/{app}/msg/{msg}"));
    browser.goto(&page).await;
    assert_eq!(browser.text("td.status").await, "fail");
    browser.run("document.querySelectorAll('details.exchange').forEach(d => d.open = true);").await;
    assert_eq!(browser.text("pre.response").await, HOSTILE_BODY);
    assert_eq!(browser.run("return window.owned === undefined;").await, true, "the receiver's script never ran");
    assert_ne!(browser.title().await, "owned");
    browser.audit("message-dead").await;

    // Replay it once the receiver is healthy again.
    healed.store(true, Ordering::SeqCst);
    browser.click("button.replay").await;
    until_text(&browser, &page, "td.status", |t| t == "success").await;
    assert!(browser.text("table.attempts").await.contains("manual"));
    assert_eq!(browser.text("tr.delivered td.code").await, "200");
    browser.audit("message-replayed").await;

    // Without the session's CSRF token a form changes nothing.
    let cookie = server.sign_in(ADMIN_TOKEN).await;
    let resend = server.url(&format!("/app/{app}/msg/{msg}/endpoint/{endpoint_id}/resend"));
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let forged = client.post(&resend).header("cookie", &cookie).form(&[("csrf", "forged")]).send().await.unwrap();
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    let missing = client.post(&resend).header("cookie", &cookie).form(&[("x", "y")]).send().await.unwrap();
    assert!(missing.status().is_client_error());
    assert_eq!(receiver.requests().len(), 2, "no replay from a forged form");

    // The consumer view: through the app-portal link, scoped to its application.
    browser.click("header form button").await; // sign out
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let portal_url = access["url"].as_str().unwrap();
    assert!(portal_url.contains("/portal#token="), "{portal_url}");
    browser.goto(portal_url).await;
    browser.until_url("the portal sign-in", |url| url.ends_with(&format!("/app/{app}"))).await;
    assert!(!browser.url().await.contains("token"), "no token left in the address bar");
    browser.audit("consumer-application").await;
    for foreign in
        [format!("/app/{other}"), format!("/app/{other}/msg/{other_msg}"), "/apps".into(), "/dead-letters".into()]
    {
        browser.goto(&server.url(&foreign)).await;
        let text = browser.text("main").await;
        assert!(text.contains("404") || text.contains("403"), "{foreign}: {text}");
        assert!(!text.contains(&other_msg) && !text.contains("someone-else"), "{foreign}: {text}");
        browser.audit_refusal("page-refused", if text.contains("404") { 404 } else { 403 }).await;
    }
    browser.goto(&server.url("/")).await;
    assert!(browser.url().await.ends_with(&format!("/app/{app}")), "home is the customer's own application");
    eprintln!("screenshots in {}", artifacts_dir().display());
}
