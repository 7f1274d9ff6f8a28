//! Delivery end to end: fan-out, signatures, retries, dead letters, recovery, resend,
//! secret rotation and the destination guard, against real receivers.

use std::time::Duration;

use herald::signing::SigningKey;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::server::Storage;
use crate::support::{Receiver, Reply, TestServer, eventually, verifies};

/// Millisecond retries so tests never wait for real backoff.
fn fast_retries(delays_ms: &[u64]) -> Value {
    json!({"retry": {"strategy": "schedule", "delaysMs": delays_ms, "jitterPercent": 0}})
}

async fn wait_status(server: &TestServer, app: &str, msg: &str, endpoint: &str, want: i64) {
    eventually(&format!("delivery status {want}"), || async {
        (server.delivery_status(app, msg, endpoint).await == Some(want)).then_some(())
    })
    .await;
}

const SUCCESS: i64 = 0;
const FAIL: i64 = 2;

#[tokio::test]
async fn fan_out_honours_filters_and_every_request_is_signed() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("shop").await;
    server.post("/api/v1/event-type", json!({"name": "invoice.paid", "description": "paid"})).await;
    let all = server.create_endpoint(&app, &receiver.url("/all"), json!({"headers": {"X-Tenant": "shop"}})).await;
    let paid = server.create_endpoint(&app, &receiver.url("/paid"), json!({"eventTypes": ["invoice.paid"]})).await;
    let eu = server.create_endpoint(&app, &receiver.url("/eu"), json!({"channels": ["eu"]})).await;
    server.create_endpoint(&app, &receiver.url("/disabled"), json!({"disabled": true})).await;

    let first = server.send(&app, json!({"eventType": "invoice.paid", "channels": ["eu"], "payload": {"id": 1}})).await;
    let second = server.send(&app, json!({"eventType": "user.created", "payload": {"id": 2}})).await;
    receiver.wait_for(Some("/all"), 2).await;
    receiver.wait_for(Some("/paid"), 1).await;
    receiver.wait_for(Some("/eu"), 1).await;
    // Everything routed is delivered; confirm the rest through the record, not by waiting.
    for (msg, endpoint) in [(&first, &all), (&first, &paid), (&first, &eu), (&second, &all)] {
        wait_status(&server, &app, msg, endpoint["id"].as_str().unwrap(), SUCCESS).await;
    }
    let (_, destinations) = server.get(&format!("/api/v1/app/{app}/msg/{second}/endpoint")).await;
    assert_eq!(destinations["data"].as_array().unwrap().len(), 1, "user.created went to the unfiltered endpoint only");
    assert!(receiver.requests_to("/disabled").is_empty());

    for (path, endpoint) in [("/all", &all), ("/paid", &paid), ("/eu", &eu)] {
        let secret = server.secret(&app, endpoint["id"].as_str().unwrap()).await;
        for request in receiver.requests_to(path) {
            assert!(verifies(&secret, &request), "{path}: signature must verify");
            assert_eq!(request.header("svix-id"), request.header("webhook-id"));
            assert_eq!(request.header("svix-signature"), request.header("webhook-signature"));
            assert_eq!(request.header("herald-attempt"), "1");
            assert_eq!(request.header("content-type"), "application/json");
        }
    }
    let to_all = receiver.requests_to("/all");
    assert!(to_all.iter().all(|r| r.header("x-tenant") == "shop"), "custom endpoint headers are sent");
    let bodies: Vec<Value> = to_all.iter().map(|r| serde_json::from_slice(&r.body).unwrap()).collect();
    assert!(bodies.contains(&json!({"id": 1})) && bodies.contains(&json!({"id": 2})));
}

#[tokio::test]
async fn transient_failures_are_retried_until_delivered_on_the_third_attempt() {
    let server = TestServer::start().await;
    let receiver = Receiver::start(|_, n| if n < 2 { Reply::status(503) } else { Reply::ok().body("thanks") }).await;
    let app = server.create_app("a").await;
    let endpoint =
        server.create_endpoint(&app, &receiver.url("/hook"), json!({"delivery": fast_retries(&[10, 10, 10])})).await;
    let msg = server.send(&app, json!({"eventType": "a", "payload": {"x": 1}})).await;
    let got = receiver.wait_for(None, 3).await;
    wait_status(&server, &app, &msg, endpoint["id"].as_str().unwrap(), SUCCESS).await;

    let ids: Vec<&str> = got.iter().map(|r| r.header("webhook-id")).collect();
    assert!(ids.iter().all(|id| *id == msg), "the same webhook-id on every attempt");
    let numbers: Vec<&str> = got.iter().map(|r| r.header("herald-attempt")).collect();
    assert_eq!(numbers, vec!["1", "2", "3"]);
    for pair in got.windows(2) {
        // Retry times are kept in whole milliseconds: allow that much rounding.
        assert!(pair[1].at - pair[0].at >= Duration::from_millis(9), "a retry never comes before its delay");
    }
    let attempts = server.attempts(&app, &msg).await;
    let codes: Vec<i64> = attempts.iter().map(|a| a["responseStatusCode"].as_i64().unwrap()).collect();
    assert_eq!(codes, vec![503, 503, 200]);
    assert_eq!(attempts[0]["errorClass"], "http_status");
    assert_eq!(attempts[2]["status"], 0);
    assert_eq!(attempts[2]["response"], "thanks");
}

#[tokio::test]
async fn a_gone_endpoint_is_dead_lettered_after_exactly_one_attempt() {
    let server = TestServer::start().await;
    let receiver = Receiver::start(|_, _| Reply::status(410)).await;
    let app = server.create_app("a").await;
    let endpoint =
        server.create_endpoint(&app, &receiver.url("/gone"), json!({"delivery": fast_retries(&[1, 1, 1])})).await;
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    wait_status(&server, &app, &msg, endpoint["id"].as_str().unwrap(), FAIL).await;
    let attempts = server.attempts(&app, &msg).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["responseStatusCode"], 410);
    let (_, destinations) = server.get(&format!("/api/v1/app/{app}/msg/{msg}/endpoint")).await;
    assert!(destinations["data"][0]["nextAttempt"].is_null(), "nothing further is scheduled");
    assert_eq!(receiver.requests().len(), 1);
}

#[tokio::test]
async fn rate_limit_only_policy_retries_429_but_treats_500_as_final() {
    let server = TestServer::start().await;
    let receiver = Receiver::start(|r, n| match (r.path.as_str(), n) {
        ("/limited", 0) => Reply::status(429),
        ("/limited", _) => Reply::ok(),
        _ => Reply::status(500),
    })
    .await;
    let app = server.create_app("a").await;
    let mut delivery = fast_retries(&[5, 5, 5]);
    delivery["retryOn"] = json!("rateLimitOnly");
    let limited = server.create_endpoint(&app, &receiver.url("/limited"), json!({"delivery": delivery})).await;
    let broken = server.create_endpoint(&app, &receiver.url("/broken"), json!({"delivery": delivery})).await;
    assert_eq!(limited["delivery"]["retryOn"], "rateLimitOnly");
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    wait_status(&server, &app, &msg, limited["id"].as_str().unwrap(), SUCCESS).await;
    wait_status(&server, &app, &msg, broken["id"].as_str().unwrap(), FAIL).await;
    assert_eq!(receiver.requests_to("/limited").len(), 2);
    assert_eq!(receiver.requests_to("/broken").len(), 1, "500 is final under rateLimitOnly");
}

#[tokio::test]
async fn exhausted_retries_become_a_dead_letter_that_recover_delivers() {
    let server = TestServer::start().await;
    // Down for the first three attempts, then back.
    let receiver = Receiver::start(|_, n| if n < 3 { Reply::status(502) } else { Reply::ok() }).await;
    let app = server.create_app("a").await;
    let endpoint =
        server.create_endpoint(&app, &receiver.url("/flaky"), json!({"delivery": fast_retries(&[5, 5])})).await;
    let ep = endpoint["id"].as_str().unwrap();
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    wait_status(&server, &app, &msg, ep, FAIL).await;
    assert_eq!(server.attempts(&app, &msg).await.len(), 3, "three attempts in all, as the policy says");
    let (_, stats) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}/stats")).await;
    assert_eq!(stats["fail"], 1);

    let since = herald::clock::to_rfc3339(herald::clock::now_ms() - 60_000);
    let (status, task) =
        server.post(&format!("/api/v1/app/{app}/endpoint/{ep}/recover"), json!({"since": since})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{task}");
    assert_eq!(task["task"], "endpoint.recover");
    assert_eq!(task["recovered"], 1);
    wait_status(&server, &app, &msg, ep, SUCCESS).await;
    let attempts = server.attempts(&app, &msg).await;
    assert_eq!(attempts.len(), 4);
    assert_eq!(attempts[3]["triggerType"], 1, "the recovered attempt is manual");
}

#[tokio::test]
async fn resend_sends_a_delivered_message_again_as_a_manual_attempt() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let ep = endpoint["id"].as_str().unwrap();
    let msg = server.send(&app, json!({"eventType": "a", "payload": {"v": 1}})).await;
    wait_status(&server, &app, &msg, ep, SUCCESS).await;
    let (status, _) = server.post(&format!("/api/v1/app/{app}/msg/{msg}/endpoint/{ep}/resend"), json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let got = receiver.wait_for(Some("/hook"), 2).await;
    assert_eq!(got[0].body, got[1].body);
    assert_eq!(got[1].header("webhook-id"), msg);
    let attempts = eventually("two recorded attempts", || async {
        let attempts = server.attempts(&app, &msg).await;
        (attempts.len() == 2).then_some(attempts)
    })
    .await;
    assert_eq!(attempts[1]["triggerType"], 1);
}

/// How a resend is asked for: through the API, or through the dashboard's form.
#[derive(Clone, Copy, Debug)]
enum ResendBy {
    Api,
    Dashboard,
}

/// Regression (issue 16, finding 0): a resend accepted while the first attempt is on the
/// wire was dropped ("it is about to be attempted anyway"), and that attempt's success then
/// settled the delivery. An accepted resend must lead to an attempt that starts after it,
/// whichever way it is asked for.
async fn resend_while_the_first_attempt_is_in_flight(by: ResendBy) {
    let server = TestServer::start().await;
    let receiver =
        Receiver::start(|_, seen| if seen == 0 { Reply::ok().after(Duration::from_millis(1500)) } else { Reply::ok() })
            .await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let ep = endpoint["id"].as_str().unwrap();
    let msg = server.send(&app, json!({"eventType": "a", "payload": {"v": 1}})).await;
    let session = match by {
        ResendBy::Api => None,
        ResendBy::Dashboard => Some(server.sign_in(crate::support::server::ADMIN_TOKEN).await),
    };
    receiver.wait_for(Some("/hook"), 1).await;
    let asked = tokio::time::Instant::now();
    match &session {
        None => {
            let (status, _) =
                server.post(&format!("/api/v1/app/{app}/msg/{msg}/endpoint/{ep}/resend"), json!({})).await;
            assert_eq!(status, StatusCode::ACCEPTED);
        }
        Some(cookie) => {
            let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
            let page = client.get(server.url(&format!("/app/{app}/msg/{msg}"))).header("cookie", cookie).send();
            let html = page.await.unwrap().text().await.unwrap();
            let at = html.find("name=\"csrf\" value=\"").expect("the message page has forms") + 19;
            let csrf = html[at..].split('"').next().unwrap();
            let form = client
                .post(server.url(&format!("/app/{app}/msg/{msg}/endpoint/{ep}/resend")))
                .header("cookie", cookie)
                .form(&[("csrf", csrf)]);
            assert_eq!(form.send().await.unwrap().status(), StatusCode::SEE_OTHER, "the form was accepted");
        }
    }
    let got = receiver.wait_for(Some("/hook"), 2).await;
    assert!(got[1].at > asked, "{by:?}: the second request started after the resend was asked for");
    let attempts = eventually("two recorded attempts, the delivery settled", || async {
        let attempts = server.attempts(&app, &msg).await;
        let settled = server.delivery_status(&app, &msg, ep).await == Some(SUCCESS);
        (attempts.len() == 2 && settled).then_some(attempts)
    })
    .await;
    assert_eq!((attempts[0]["triggerType"].as_i64(), attempts[1]["triggerType"].as_i64()), (Some(0), Some(1)));
    assert_eq!(receiver.requests_to("/hook").len(), 2, "{by:?}: one resend, one extra request");
}

#[tokio::test]
async fn a_resend_accepted_while_the_first_attempt_is_in_flight_is_still_sent() {
    resend_while_the_first_attempt_is_in_flight(ResendBy::Api).await;
}

#[tokio::test]
async fn a_dashboard_resend_accepted_while_the_first_attempt_is_in_flight_is_still_sent() {
    resend_while_the_first_attempt_is_in_flight(ResendBy::Dashboard).await;
}

#[tokio::test]
async fn a_rotated_secret_signs_alongside_the_old_one_during_the_overlap() {
    let server = TestServer::start().await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/hook"), json!({})).await;
    let ep = endpoint["id"].as_str().unwrap();
    let old = server.secret(&app, ep).await;
    let new = SigningKey::generate().to_secret_string();
    let (status, _) = server.post(&format!("/api/v1/app/{app}/endpoint/{ep}/secret/rotate"), json!({"key": new})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(server.secret(&app, ep).await, new);
    server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    let got = receiver.wait_for(None, 1).await;
    assert_eq!(got[0].header("webhook-signature").split(' ').count(), 2, "two signatures during the overlap");
    assert!(verifies(&old, &got[0]) && verifies(&new, &got[0]));

    // With no overlap the old secret stops signing at once.
    let (status, _) =
        server.post(&format!("/api/v1/app/{app}/endpoint/{ep}/secret/rotate"), json!({"gracePeriodSeconds": 0})).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let newest = server.secret(&app, ep).await;
    server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    let got = receiver.wait_for(None, 2).await;
    // The key replaced just now stops at once; the first one keeps its 24 h overlap.
    assert_eq!(got[1].header("webhook-signature").split(' ').count(), 2);
    assert!(verifies(&newest, &got[1]) && verifies(&old, &got[1]) && !verifies(&new, &got[1]));
}

#[tokio::test]
async fn a_destination_refused_at_delivery_is_a_permanent_blocked_failure() {
    let canary = Receiver::ok().await;
    let storage = Storage::new().await;
    // Registered while loopback was allowed...
    let server = TestServer::start_on(&storage, |_| {}).await;
    let app = server.create_app("a").await;
    let endpoint =
        server.create_endpoint(&app, &canary.url("/canary"), json!({"delivery": fast_retries(&[1, 1])})).await;
    server.stop().await;
    // ...and delivered by a server that no longer allows it.
    let server = TestServer::start_on(&storage, |c| c.delivery.allowed_networks.clear()).await;
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    wait_status(&server, &app, &msg, endpoint["id"].as_str().unwrap(), FAIL).await;
    let attempts = server.attempts(&app, &msg).await;
    assert_eq!(attempts.len(), 1, "blocked is permanent: no retries");
    assert_eq!(attempts[0]["errorClass"], "blocked_destination");
    assert_eq!(attempts[0]["responseStatusCode"], 0);
    assert!(canary.requests().is_empty(), "no connection reached the canary");
}

#[tokio::test]
async fn redirects_are_failed_attempts_and_never_followed() {
    let canary = Receiver::ok().await;
    let target = canary.url("/canary");
    let receiver =
        Receiver::start(move |_, n| if n == 0 { Reply::status(302).header("location", &target) } else { Reply::ok() })
            .await;
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/moved"), json!({"delivery": fast_retries(&[5])})).await;
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    wait_status(&server, &app, &msg, endpoint["id"].as_str().unwrap(), SUCCESS).await;
    let attempts = server.attempts(&app, &msg).await;
    assert_eq!(
        (attempts[0]["responseStatusCode"].as_i64(), attempts[0]["errorClass"].as_str()),
        (Some(302), Some("redirect"))
    );
    assert!(canary.requests().is_empty(), "the Location was never fetched");
    assert_eq!(receiver.requests().len(), 2, "one request per attempt");
}

#[tokio::test]
async fn a_timeout_is_a_transient_failure_recorded_with_its_class() {
    let server = TestServer::start().await;
    let receiver =
        Receiver::start(|_, n| if n == 0 { Reply::ok().after(Duration::from_secs(2)) } else { Reply::ok() }).await;
    let app = server.create_app("a").await;
    let mut delivery = fast_retries(&[5]);
    delivery["timeoutMs"] = json!(200);
    let endpoint = server.create_endpoint(&app, &receiver.url("/slow"), json!({"delivery": delivery})).await;
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    wait_status(&server, &app, &msg, endpoint["id"].as_str().unwrap(), SUCCESS).await;
    let attempts = server.attempts(&app, &msg).await;
    assert_eq!(attempts[0]["errorClass"], "timeout");
    assert_eq!(attempts[0]["responseStatusCode"], 0);
    assert!(attempts[0]["responseDurationMs"].as_i64().unwrap() < 2000);
    assert_eq!(attempts[1]["status"], 0);
}

#[tokio::test]
async fn endpoint_settings_are_returned_with_defaults_and_can_be_patched_back() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let endpoint =
        server.create_endpoint(&app, "https://example.com/hook", json!({"delivery": {"timeoutMs": 2500}})).await;
    assert_eq!(endpoint["delivery"]["timeoutMs"], 2500);
    assert_eq!(endpoint["delivery"]["retry"]["strategy"], "exponential");
    assert_eq!(endpoint["delivery"]["retry"]["maxAttempts"], 12);
    let ep = endpoint["id"].as_str().unwrap();
    let (_, patched) =
        server.call(Method::PATCH, &format!("/api/v1/app/{app}/endpoint/{ep}"), Some(json!({"delivery": null}))).await;
    assert_eq!(patched["delivery"]["timeoutMs"], 10_000);
    let (status, headers) = server
        .call(
            Method::PUT,
            &format!("/api/v1/app/{app}/endpoint/{ep}/headers"),
            Some(json!({"headers": {"X-Plain": "a", "Authorization": "Bearer s3cret"}})),
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{headers}");
    let (_, headers) = server.get(&format!("/api/v1/app/{app}/endpoint/{ep}/headers")).await;
    assert_eq!(headers["headers"], json!({"X-Plain": "a"}));
    assert_eq!(headers["sensitive"], json!(["Authorization"]));
}

/// No poll for an hour: work only moves when something wakes the loader.
fn without_polling(config: &mut herald::Config) {
    config.queue.poll_interval = Duration::from_secs(3600);
}

#[tokio::test]
async fn work_beyond_the_memory_limit_goes_out_as_room_frees_without_a_poll() {
    let server = TestServer::start_with(|c| {
        without_polling(c);
        c.queue.memory_limit = 2;
    })
    .await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("crowded").await;
    server.create_endpoint(&app, &receiver.url("/c"), json!({})).await;
    const N: usize = 40;
    for i in 0..N {
        server.send(&app, json!({"eventType": "t", "payload": {"i": i}})).await;
    }
    receiver.wait_for(Some("/c"), N).await;
    server.stop().await;
}

#[tokio::test]
async fn a_strict_endpoint_moves_to_its_next_message_without_a_poll() {
    let server = TestServer::start_with(without_polling).await;
    let receiver = Receiver::ok().await;
    let app = server.create_app("ordered").await;
    server.create_endpoint(&app, &receiver.url("/s"), json!({"delivery": {"ordering": "strict"}})).await;
    const N: usize = 10;
    for i in 0..N {
        server.send(&app, json!({"eventType": "t", "payload": {"i": i}})).await;
    }
    let got = receiver.wait_for(Some("/s"), N).await;
    let order: Vec<i64> =
        got.iter().map(|r| serde_json::from_slice::<Value>(&r.body).unwrap()["i"].as_i64().unwrap()).collect();
    assert_eq!(order, (0..N as i64).collect::<Vec<_>>());
    server.stop().await;
}
