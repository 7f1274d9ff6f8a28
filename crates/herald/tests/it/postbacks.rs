//! Postbacks end to end: a GET to a local tracker with the URL filled from the payload,
//! verified the documented way (an HMAC over `{id}.{timestamp}.{request-target}`, the
//! `{signature}` value left empty), retried under the marketplace preset on 429 but not on
//! 500, a payload missing a field dead-lettered as `template`, bad templates refused, and
//! click ids kept out of the attempt log.

use std::collections::HashSet;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::json;
use sha2::Sha256;

use crate::support::receiver::Received;
use crate::support::{Receiver, Reply, TestServer, eventually};

/// What a tracker does to check a templated request, as the README shows it: blank the
/// `sig` parameter's value, sign `{id}.{timestamp}.{path?query}`, compare.
fn tracker_verifies(secret: &str, request: &Received) -> bool {
    let key = STANDARD.decode(secret.trim_start_matches("whsec_")).unwrap();
    let query = request.query.clone().unwrap_or_default();
    let blanked: Vec<String> =
        query.split('&').map(|kv| if kv.starts_with("sig=") { "sig=".to_owned() } else { kv.to_owned() }).collect();
    let target = format!("{}?{}", request.path, blanked.join("&"));
    let signed = format!("{}.{}.{}", request.header("webhook-id"), request.header("webhook-timestamp"), target);
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(signed.as_bytes());
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    let in_query = query.split('&').find_map(|kv| kv.strip_prefix("sig=")).unwrap_or_default();
    let in_query = percent_decode(in_query);
    request.header("webhook-signature").split(' ').any(|s| s == expected) && in_query == expected
}

fn percent_decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes()).next().map(|(_, v)| v.into_owned()).unwrap_or_default()
}

#[tokio::test]
async fn a_get_postback_reaches_the_tracker_verifies_and_follows_the_marketplace_preset() {
    let tracker = Receiver::start(|r, n| {
        let query = r.query.clone().unwrap_or_default();
        match (query.contains("clickid=rate%20limited"), query.contains("clickid=broken"), n) {
            (true, _, 0) => Reply::status(429),
            (_, true, _) => Reply::status(500),
            _ => Reply::ok(),
        }
    })
    .await;
    let server = TestServer::start().await;
    let app = server.create_app("affiliates").await;
    let base = tracker.url("");
    let template = format!(
        "{base}/pb/{{campaign}}?clickid={{click_id}}&payout={{data.payout}}&id={{message_id}}&sig={{signature}}"
    );
    // The marketplace preset, with its 10-minute interval shortened for the test.
    let settings = json!({
        "request": {"method": "GET", "urlTemplate": template},
        "delivery": {"preset": "marketplace", "retry": {"strategy": "fixed", "intervalMs": 50, "maxAttempts": 7}},
    });
    let endpoint = server.create_endpoint(&app, &tracker.url("/"), settings).await;
    assert_eq!(endpoint["request"]["method"], "GET");
    assert_eq!(endpoint["delivery"]["retryOn"], "rateLimitOnly");
    let endpoint_id = endpoint["id"].as_str().unwrap().to_owned();
    let secret = server.secret(&app, &endpoint_id).await;

    let payload = |click: &str| json!({"campaign": "été 2026", "click_id": click, "data": {"payout": 12.5}});
    let limited = server.send(&app, json!({"eventType": "conversion", "payload": payload("rate limited")})).await;
    let broken = server.send(&app, json!({"eventType": "conversion", "payload": payload("broken")})).await;
    // Both deliveries in their final state: nothing more can be sent for either.
    eventually("the 500 to be final", || async {
        (server.delivery_status(&app, &broken, &endpoint_id).await == Some(2)).then_some(())
    })
    .await;
    eventually("the 429 to be retried into success", || async {
        (server.delivery_status(&app, &limited, &endpoint_id).await == Some(0)).then_some(())
    })
    .await;
    assert_eq!(server.attempts(&app, &broken).await.len(), 1, "500 is final under the marketplace preset");
    assert_eq!(server.attempts(&app, &limited).await.len(), 2, "429 is retried, once here");
    let got: Vec<Received> = tracker.requests();
    assert_eq!(got.len(), 3, "429 retried once, 500 final: {got:?}");
    for request in &got {
        assert_eq!(request.method, "GET");
        assert!(request.body.is_empty());
        assert_eq!(request.path, "/pb/%C3%A9t%C3%A9%202026");
        assert!(tracker_verifies(&secret, request), "the documented verification holds");
    }
    let limited_requests: Vec<&Received> =
        got.iter().filter(|r| r.query.as_deref().unwrap().contains("rate%20limited")).collect();
    assert_eq!(limited_requests.len(), 2);
    let ids: HashSet<&str> = limited_requests.iter().map(|r| r.header("webhook-id")).collect();
    assert_eq!(ids.len(), 1, "the same webhook-id on every attempt");
    assert!(limited_requests[0].query.as_deref().unwrap().contains(&format!("payout=12.5&id={limited}")));

    // Click ids stay out of the attempt log: the recorded URL keeps the macros.
    let attempts = server.attempts(&app, &limited).await;
    let url = attempts[0]["url"].as_str().unwrap();
    assert!(url.contains("clickid={click_id}") && !url.contains("rate"), "{url}");
}

#[tokio::test]
async fn templates_are_checked_at_registration_and_missing_fields_are_dead_letters() {
    let tracker = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("affiliates").await;
    let base = tracker.url("");
    let refused = [
        format!("{base}/pb?x={{herald.clickid}}"),
        "https://evil.example/pb?c={click_id}".to_owned(),
        format!("{base}/pb?c={{click_id"),
        format!("{base}/pb?c={{bad name}}"),
    ];
    for template in refused {
        let body = json!({"url": tracker.url("/"), "request": {"method": "GET", "urlTemplate": template}});
        let (status, answer) = server.post(&format!("/api/v1/app/{app}/endpoint"), body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{template}: {answer}");
        assert_eq!(answer["detail"][0]["loc"], json!(["body", "request", "urlTemplate"]));
    }
    let template = format!("{base}/pb?c={{data.click_id}}");
    let settings = json!({"request": {"method": "GET", "urlTemplate": template}});
    let endpoint = server.create_endpoint(&app, &tracker.url("/"), settings).await;
    let endpoint_id = endpoint["id"].as_str().unwrap();
    let msg = server.send(&app, json!({"eventType": "conversion", "payload": {"data": {}}})).await;
    eventually("a dead letter", || async {
        (server.delivery_status(&app, &msg, endpoint_id).await == Some(2)).then_some(())
    })
    .await;
    let attempts = server.attempts(&app, &msg).await;
    assert_eq!(attempts.len(), 1, "no retries");
    assert_eq!(attempts[0]["errorClass"], "template");
    assert!(tracker.requests().is_empty(), "never a request with an empty value");
}

/// Regression (issue 16, finding 8): a payload value `..` (or an event type named `..`) in a
/// path segment climbed out of the template's path once the URL was parsed.
#[tokio::test]
async fn values_that_would_climb_out_of_the_template_path_are_dead_letters() {
    let tracker = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("affiliates").await;
    let base = tracker.url("");
    let body =
        json!({"url": tracker.url("/"), "request": {"method": "GET", "urlTemplate": format!("{base}/pb/../admin")}});
    let (status, answer) = server.post(&format!("/api/v1/app/{app}/endpoint"), body).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "a template with a dot segment: {answer}");
    let settings =
        json!({"request": {"method": "GET", "urlTemplate": format!("{base}/pb/{{v}}/{{event_type}}/x?n=1")}});
    let endpoint = server.create_endpoint(&app, &tracker.url("/"), settings).await;
    let ep = endpoint["id"].as_str().unwrap();
    let climbing = [
        server.send(&app, json!({"eventType": "conversion", "payload": {"v": ".."}})).await,
        server.send(&app, json!({"eventType": "..", "payload": {"v": "fine"}})).await,
        server.send(&app, json!({"eventType": "conversion", "payload": {"v": "."}})).await,
    ];
    let fine = server.send(&app, json!({"eventType": "conversion", "payload": {"v": "..."}})).await;
    for msg in &climbing {
        eventually("a dead letter", || async {
            (server.delivery_status(&app, msg, ep).await == Some(2)).then_some(())
        })
        .await;
        let attempts = server.attempts(&app, msg).await;
        assert_eq!(attempts[0]["errorClass"], "template", "{attempts:?}");
    }
    let got = tracker.wait_for(None, 1).await;
    eventually("the fine one delivered", || async {
        (server.delivery_status(&app, &fine, ep).await == Some(0)).then_some(())
    })
    .await;
    assert_eq!(got.len(), 1, "only the message without a dot segment went out");
    assert_eq!(got[0].path, "/pb/.../conversion/x");
}

#[tokio::test]
async fn form_bodies_and_put_are_supported_and_signed_over_the_target() {
    let tracker = Receiver::ok().await;
    let server = TestServer::start().await;
    let app = server.create_app("affiliates").await;
    let template = format!("{}/pb?e={{event_type}}", tracker.url(""));
    let settings = json!({"request": {"method": "PUT", "urlTemplate": template, "bodyFormat": "form"}});
    server.create_endpoint(&app, &tracker.url("/"), settings).await;
    server.send(&app, json!({"eventType": "conversion", "payload": {"a": "x y", "n": 2, "deep": {"no": 1}}})).await;
    let got = tracker.wait_for(None, 1).await;
    assert_eq!(got[0].method, "PUT");
    assert_eq!(got[0].header("content-type"), "application/x-www-form-urlencoded");
    assert_eq!(String::from_utf8_lossy(&got[0].body), "a=x+y&n=2");
    assert_eq!(got[0].query.as_deref(), Some("e=conversion"));
}
