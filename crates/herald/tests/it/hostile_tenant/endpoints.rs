//! Attacks through endpoints: more than anyone needs, created and deleted by the hundred, a
//! slow one beside a fast one, a parked one deleted, a resend beside a scheduled retry, a
//! client certificate per endpoint by the hundred.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Tenant, metric};
use crate::support::certs::TestCa;
use crate::support::{Receiver, Reply, TestServer, eventually};

/// A message to `tenant`'s application (messages are the operator's to send).
async fn send(server: &TestServer, tenant: &Tenant, payload: Value) -> String {
    server.send(&tenant.app, json!({"eventType": "e", "payload": payload})).await
}

/// The admin's `/metrics` text.
async fn metrics_text(server: &TestServer) -> String {
    server.request_as_admin(Method::GET, "/metrics").send().await.unwrap().text().await.unwrap()
}

/// Breaker settings that open at the first failure and stay open for the test's length.
fn parks_at_first_failure() -> Value {
    json!({"circuitBreaker": {"failureThreshold": 1, "cooldownMs": 600000},
           "retry": {"strategy": "fixed", "intervalMs": 600000, "maxAttempts": 5}})
}

#[tokio::test]
async fn an_application_holds_at_most_its_cap_of_endpoints() {
    let receiver = Receiver::ok().await;
    let server = TestServer::start_with(|c| c.tenants.max_endpoints = 3).await;
    let mallory = Tenant::new(&server, "mallory").await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(mallory.endpoint(&server, &receiver.url("/e"), json!({})).await);
    }
    let (status, answer) = mallory.post(&server, &mallory.path("/endpoint"), json!({"url": receiver.url("/e")})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["detail"][0]["loc"], json!(["body"]));
    assert!(answer["detail"][0]["msg"].as_str().unwrap().contains("tenants.max_endpoints"), "{answer}");
    let (status, _) = mallory
        .call(&server, Method::PUT, &mallory.path("/endpoint/by-put"), Some(json!({"url": receiver.url("/e")})))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "nor by a PUT that creates");
    let (status, _) =
        mallory.call(&server, Method::DELETE, &mallory.path(&format!("/endpoint/{}", ids[0])), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    mallory.endpoint(&server, &receiver.url("/e"), json!({})).await;
}

#[tokio::test]
async fn endpoints_created_and_deleted_by_the_dozen_leave_nothing_behind() {
    let receiver = Receiver::start(|_, _| Reply::status(500)).await;
    // Unthrottled: 60 writes in well under a second would meet the token's 50 per second.
    let server = TestServer::start_with(|c| c.auth.portal_requests_per_second = None).await;
    let mallory = Tenant::new(&server, "mallory").await;
    let mut ids = Vec::new();
    for i in 0..30 {
        let id = mallory
            .endpoint(&server, &receiver.url(&format!("/e{i}")), json!({"delivery": parks_at_first_failure()}))
            .await;
        ids.push(id);
    }
    // Each endpoint fails once (its breaker opens) and has messages parked behind it.
    for n in 0..3 {
        send(&server, &mallory, json!({"n": n})).await;
    }
    receiver.wait_for(None, 30).await;
    let series = |id: &str| format!("herald_attempt_duration_seconds_count{{endpoint=\"{id}\"}}");
    eventually("every endpoint's first attempt to be counted", || async {
        let text = metrics_text(&server).await;
        ids.iter().all(|id| text.contains(&series(id))).then_some(())
    })
    .await;
    for id in &ids {
        let (status, _) = mallory.call(&server, Method::DELETE, &mallory.path(&format!("/endpoint/{id}")), None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
    }
    // Nothing of them stays: no series, no breaker, no pending delivery.
    let text = metrics_text(&server).await;
    let kept: Vec<&String> = ids.iter().filter(|id| text.contains(id.as_str())).collect();
    assert!(kept.is_empty(), "metrics still name deleted endpoints: {kept:?}");
    eventually("nothing pending", || async {
        let (_, summary) = server.get("/api/v1/stats/summary").await;
        (summary["pending"] == 0 && summary["awaitingRetry"] == 0 && summary["oldestPendingAt"].is_null()).then_some(())
    })
    .await;
    assert_eq!(metric(&server, "herald_queue_depth{state=\"pending\"}").await, 0.0);
}

#[tokio::test]
async fn deleting_a_parked_endpoint_cancels_its_deliveries_at_once() {
    let receiver = Receiver::start(|_, _| Reply::status(500)).await;
    let server = TestServer::start().await;
    let mallory = Tenant::new(&server, "mallory").await;
    let id = mallory.endpoint(&server, &receiver.url("/down"), json!({"delivery": parks_at_first_failure()})).await;
    let msgs: Vec<String> = {
        let mut msgs = Vec::new();
        for n in 0..5 {
            msgs.push(send(&server, &mallory, json!({"n": n})).await);
        }
        msgs
    };
    receiver.wait_for(Some("/down"), 1).await;
    let (_, summary) = server.get("/api/v1/stats/summary").await;
    assert!(summary["pending"].as_u64().unwrap() + summary["awaitingRetry"].as_u64().unwrap() >= 4, "{summary}");
    let (status, _) = mallory.call(&server, Method::DELETE, &mallory.path(&format!("/endpoint/{id}")), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    eventually("no phantom pending deliveries", || async {
        let (_, summary) = server.get("/api/v1/stats/summary").await;
        (summary["pending"] == 0 && summary["awaitingRetry"] == 0 && summary["oldestPendingAt"].is_null()).then_some(())
    })
    .await;
    for msg in msgs {
        // Svix's "fail" status for a delivery that will never be attempted again.
        let (_, list) = server.get(&format!("/api/v1/app/{}/msg/{msg}/endpoint", mallory.app)).await;
        assert!(list["data"].as_array().unwrap().iter().all(|d| d["status"] != 3), "{list}");
    }
}

#[tokio::test]
async fn a_slow_endpoint_takes_at_most_its_share_of_its_applications_slots() {
    let slow =
        Receiver::start(
            |r, _| if r.path == "/slow" { Reply::ok().after(Duration::from_secs(20)) } else { Reply::ok() },
        )
        .await;
    let server = TestServer::start().await;
    let (status, app) = server.post("/api/v1/app", json!({"name": "shop", "maxConcurrency": 4})).await;
    assert_eq!(status, StatusCode::CREATED);
    let tenant = Tenant { app: app["id"].as_str().unwrap().to_owned(), token: String::new() };
    let tenant = Tenant { token: server.portal_token(&tenant.app).await, ..tenant };
    tenant.endpoint(&server, &slow.url("/slow"), json!({"delivery": {"timeoutMs": 30000}})).await;
    tenant.endpoint(&server, &slow.url("/fast"), json!({})).await;
    for n in 0..40 {
        send(&server, &tenant, json!({"n": n})).await;
    }
    // The slow endpoint holds two of the four slots (its share while the fast one has
    // work); the fast one goes through the other two, never waiting for a slow answer.
    slow.wait_for(Some("/fast"), 40).await;
    assert!(slow.requests_to("/slow").len() <= 2, "the slow endpoint got {} slots", slow.requests_to("/slow").len());
    assert!(slow.max_concurrent("/slow") <= 2);
}

#[tokio::test]
async fn a_resend_goes_at_once_and_takes_the_place_of_the_scheduled_retry() {
    let receiver = Receiver::start(|_, seen| if seen == 0 { Reply::status(500) } else { Reply::ok() }).await;
    let server = TestServer::start().await;
    let tenant = Tenant::new(&server, "shop").await;
    let retry = json!({"retry": {"strategy": "fixed", "intervalMs": 40000, "maxAttempts": 3}});
    let endpoint = tenant.endpoint(&server, &receiver.url("/hook"), json!({"delivery": retry})).await;
    let msg = send(&server, &tenant, json!({})).await;
    receiver.wait_for(Some("/hook"), 1).await;
    eventually("the failed attempt to be recorded", || async {
        (server.attempts(&tenant.app, &msg).await.len() == 1).then_some(())
    })
    .await;
    let path = tenant.path(&format!("/msg/{msg}/endpoint/{endpoint}/resend"));
    let (status, _) = tenant.post(&server, &path, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // Long before the retry's 40 seconds: the resend is the next attempt, and the last.
    let got = receiver.wait_for(Some("/hook"), 2).await;
    assert!(got[1].at - got[0].at < Duration::from_secs(20), "the resend went at once");
    eventually("delivered", || async {
        (server.delivery_status(&tenant.app, &msg, &endpoint).await == Some(0)).then_some(())
    })
    .await;
    let attempts = server.attempts(&tenant.app, &msg).await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[1]["triggerType"], 1, "the second is the manual one");
}

#[tokio::test]
async fn a_tenant_with_many_client_certificates_leaves_others_warm_connections_alone() {
    let ca = TestCa::new("Herald test CA");
    let identity = ca.server();
    let theirs = Receiver::start_tls(ca.requiring_clients(&identity), |_, _| Reply::ok()).await;
    let ours = Receiver::start_tls(ca.requiring_clients(&identity), |_, _| Reply::ok()).await;
    // Unthrottled: a patient attacker gets there anyway; the test should not wait for it.
    let server = TestServer::start_with(|c| c.auth.portal_requests_per_second = None).await;
    let tls = |name: &str| {
        let client = ca.client(name);
        json!({"tls": {"clientCertificatePem": client.cert_pem, "clientKeyPem": client.key_pem, "caPem": ca.cert_pem}})
    };
    let victim = Tenant::new(&server, "victim").await;
    victim.endpoint(&server, &ours.https_url("/hook"), tls("victim")).await;
    send(&server, &victim, json!({"n": 0})).await;
    ours.wait_for(Some("/hook"), 1).await;
    assert_eq!(ours.handshakes(), 1);

    // More identities than one application may keep clients for (64), each used once.
    let mallory = Tenant::new(&server, "mallory").await;
    const IDENTITIES: usize = 100;
    for i in 0..IDENTITIES {
        mallory.endpoint(&server, &theirs.https_url(&format!("/e{i}")), tls(&format!("m{i}"))).await;
    }
    send(&server, &mallory, json!({})).await;
    theirs.wait_for(None, IDENTITIES).await;
    assert_eq!(theirs.handshakes(), IDENTITIES, "one connection per identity");

    // The victim's pooled connection is still there: no new handshake.
    send(&server, &victim, json!({"n": 1})).await;
    ours.wait_for(Some("/hook"), 2).await;
    assert_eq!(ours.handshakes(), 1, "the victim's warm connection was kept");
    // Mallory's own oldest clients made room for its newest: using them again connects anew.
    send(&server, &mallory, json!({})).await;
    theirs.wait_for(None, 2 * IDENTITIES).await;
    assert!(theirs.handshakes() > IDENTITIES, "mallory's clients beyond its share were let go");
}
