//! OpenTelemetry traces, checked at a collector on loopback that decodes what real
//! `herald serve` processes export: one trace per message from the ingest request to its
//! last attempt, even when the retries happen in another process; nothing exported while
//! tracing is off; `traceparent` sent on only where the operator asked; trace ids in JSON
//! logs.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::otlp::{CollectedSpan, Collector};
use crate::support::process::Process;
use crate::support::server::{ADMIN_TOKEN, Storage, backend};
use crate::support::{Receiver, Reply, TestServer, eventually};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// `SpanKind` and status codes as OTLP numbers them.
const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const ERROR: i32 = 2;

fn traced(collector: &Collector, service: &str) -> Vec<(&'static str, String)> {
    vec![
        ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-key=s%3Dcret".into()),
        ("OTEL_SERVICE_NAME", service.into()),
        ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
    ]
}

fn start(storage: &Storage, env: &[(&'static str, String)]) -> Process {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Process::start_with(storage, &env)
}

async fn app_with_endpoint(herald: &Process, url: &str, delivery: Value) -> (String, String) {
    let (_, app) = herald.call(Method::POST, ADMIN_TOKEN, "/api/v1/app", Some(json!({"name": "shop"}))).await;
    let app = app["id"].as_str().unwrap().to_owned();
    let endpoint = json!({"url": url, "delivery": delivery});
    let (status, endpoint) =
        herald.call(Method::POST, ADMIN_TOKEN, &format!("/api/v1/app/{app}/endpoint"), Some(endpoint)).await;
    assert_eq!(status, StatusCode::CREATED, "{endpoint}");
    (app, endpoint["id"].as_str().unwrap().to_owned())
}

/// Sends a message, with the caller's `traceparent` if given; returns its id.
async fn send(herald: &Process, app: &str, traceparent: Option<&str>) -> String {
    let mut request = reqwest::Client::new()
        .post(format!("{}/api/v1/app/{app}/msg", herald.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"eventType": "order.paid", "payload": {"n": 1}}));
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    response.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
}

fn of_trace(collector: &Collector, trace: &str) -> Vec<CollectedSpan> {
    collector.spans().into_iter().filter(|s| s.trace_id == trace).collect()
}

fn attempts_in(spans: &[CollectedSpan]) -> Vec<CollectedSpan> {
    let mut attempts: Vec<CollectedSpan> = spans.iter().filter(|s| s.kind == CLIENT).cloned().collect();
    attempts.sort_by_key(|s| s.attr("herald.attempt").as_i64());
    attempts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_retried_in_another_process_is_one_trace_from_the_callers_span_to_its_last_attempt() {
    let collector = Collector::start_requiring(Some(("x-collector-key", "s=cret"))).await;
    let receiver = Receiver::start(|_, n| if n < 2 { Reply::status(500) } else { Reply::ok() }).await;
    let storage = Storage::new().await;
    let first = start(&storage, &traced(&collector, "herald-first"));
    // The first retry comes late enough for this process to stop and another to take over.
    let retry = json!({"retry": {"strategy": "schedule", "delaysMs": [3000, 200], "jitterPercent": 0}});
    let (app, endpoint) = app_with_endpoint(&first, &receiver.url("/hook"), retry).await;
    let msg = send(&first, &app, Some(&format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))).await;
    receiver.wait_for(Some("/hook"), 1).await;
    let (status, _, _) = first.terminate();
    assert!(status.success());
    let second = start(&storage, &traced(&collector, "herald-second"));
    receiver.wait_for(Some("/hook"), 3).await;

    let spans = eventually("the spans of three attempts", || {
        let spans = of_trace(&collector, CALLER_TRACE);
        let done =
            attempts_in(&spans).len() == 3 && spans.iter().filter(|s| s.name == "herald.dispatch.wait").count() == 3;
        std::future::ready(done.then_some(spans))
    })
    .await;
    second.stop();
    assert!(storage.everything().await.contains(CALLER_TRACE), "the trace context is stored with the message");
    assert_eq!(collector.refused(), 0, "every export carried the configured header as protobuf");

    let ingest = spans.iter().find(|s| s.kind == SERVER).expect("an ingest span");
    assert_eq!(ingest.name, "POST /api/v1/app/{app_id}/msg");
    assert_eq!(ingest.parent_span_id, CALLER_SPAN, "the caller's traceparent is continued");
    assert_eq!(ingest.service, "herald-first");
    assert_eq!(ingest.attr("http.response.status_code"), &json!(202));
    assert_eq!(ingest.attr("herald.msg_id"), &json!(msg));
    let commit = spans.iter().find(|s| s.name == "herald.commit").expect("a commit span");
    assert_eq!(commit.parent_span_id, ingest.span_id);
    let database = if backend() == crate::support::server::Backend::Postgres { "postgresql" } else { "sqlite" };
    assert_eq!(commit.attr("db.system.name"), &json!(database));
    assert!(commit.end_ns <= ingest.end_ns, "the answer waits for the commit");

    let attempts = attempts_in(&spans);
    let services: Vec<&str> = attempts.iter().map(|s| s.service.as_str()).collect();
    assert_eq!(services, ["herald-first", "herald-second", "herald-second"]);
    let statuses: Vec<&Value> = attempts.iter().map(|s| s.attr("http.response.status_code")).collect();
    assert_eq!(statuses, [&json!(500), &json!(500), &json!(200)]);
    let classes: Vec<&Value> = attempts.iter().map(|s| s.attr("error.type")).collect();
    assert_eq!(classes, [&json!("http_status"), &json!("http_status"), &Value::Null]);
    let span_statuses: Vec<i32> = attempts.iter().map(|s| s.status).collect();
    assert_eq!(span_statuses, [ERROR, ERROR, 0]);
    assert_eq!(attempts[0].status_message, "the endpoint answered 500");
    for (n, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt.parent_span_id, ingest.span_id, "attempt {} hangs under the ingest span", n + 1);
        assert_eq!(attempt.name, "POST");
        assert_eq!(attempt.attr("herald.attempt"), &json!(n + 1));
        assert_eq!(attempt.attr("herald.endpoint_id"), &json!(endpoint));
        assert_eq!(attempt.attr("herald.msg_id"), &json!(msg));
        assert_eq!(attempt.attr("http.request.method"), &json!("POST"));
        assert_eq!(attempt.attr("url.full"), &Value::Null, "a webhook URL's path may hold its secret");
        assert_eq!(attempt.attr("url.scheme"), &json!("http"));
        assert_eq!(attempt.attr("server.address"), &json!("127.0.0.1"));
        let port = receiver.url("/").split(':').nth(2).unwrap().trim_end_matches('/').parse::<u16>().unwrap();
        assert_eq!(attempt.attr("server.port"), &json!(port));
        assert!(attempt.attr("herald.duration_ms").as_f64().unwrap() >= 0.0);
    }
    let mut waits: Vec<&CollectedSpan> = spans.iter().filter(|s| s.name == "herald.dispatch.wait").collect();
    waits.sort_by_key(|s| s.attr("herald.attempt").as_i64());
    for (wait, attempt) in waits.iter().zip(&attempts) {
        assert_eq!(wait.parent_span_id, ingest.span_id);
        assert_eq!(wait.attr("herald.endpoint_id"), &json!(endpoint));
        assert!(wait.start_ns <= wait.end_ns && wait.end_ns <= attempt.start_ns, "the wait ends as its attempt starts");
    }
    // Due times are whole milliseconds: the first wait starts within the commit's one.
    let commit_ms = commit.start_ns / 1_000_000 * 1_000_000;
    assert!(waits[0].start_ns >= commit_ms, "the first wait starts at the commit: {commit:#?} {waits:#?}");
    assert!(waits[1].start_ns >= attempts[0].end_ns, "the retry's wait starts when it was due, after the failure");
    let known: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).chain([CALLER_SPAN]).collect();
    assert!(spans.iter().all(|s| known.contains(&s.parent_span_id.as_str())), "one connected trace: {spans:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_exported_and_no_traceparent_is_sent_while_tracing_is_off() {
    let collector = Collector::start().await;
    let receiver = Receiver::ok().await;
    let quiet = [("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned()), ("HERALD_LOG__FORMAT", "json".to_owned())];
    let disabled: Vec<(&str, String)> =
        traced(&collector, "herald").into_iter().chain([("OTEL_SDK_DISABLED", "true".to_owned())]).collect();
    for env in [quiet.to_vec(), disabled] {
        let storage = Storage::new().await;
        let herald = start(&storage, &env);
        let (app, _) = app_with_endpoint(&herald, &receiver.url("/hook"), json!({"propagateTraceContext": true})).await;
        let before = receiver.requests().len();
        send(&herald, &app, Some(&format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))).await;
        let got = receiver.wait_for(Some("/hook"), before + 1).await;
        assert!(got[before].headers.get("traceparent").is_none(), "no trace context goes out while off");
        let output = herald.stop();
        assert!(!output.contains("trace_id"), "no trace ids in the logs: {output}");
        assert!(!storage.everything().await.contains(CALLER_TRACE), "no trace context is stored");
    }
    assert_eq!(collector.requests(), 0, "nothing reached the collector");
    // A sentinel: a process that does export, started after both quiet ones were gone. Once
    // its spans have arrived, anything the quiet ones had sent would have arrived before.
    let storage = Storage::new().await;
    let sentinel = start(&storage, &traced(&collector, "sentinel"));
    let (app, _) = app_with_endpoint(&sentinel, &receiver.url("/sentinel"), json!({})).await;
    send(&sentinel, &app, None).await;
    eventually("the sentinel's attempt to be exported", || {
        std::future::ready(collector.spans().iter().any(|s| s.service == "sentinel" && s.kind == CLIENT).then_some(()))
    })
    .await;
    sentinel.kill();
    let others: Vec<String> = collector
        .spans()
        .iter()
        .filter(|s| s.service != "sentinel")
        .map(|s| format!("{} of {}", s.name, s.service))
        .collect();
    assert!(others.is_empty(), "only the sentinel's spans reached the collector: {others:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_goes_only_to_endpoints_the_operator_opened_and_json_logs_carry_the_ids() {
    let collector = Collector::start().await;
    let receiver = Receiver::ok().await;
    let storage = Storage::new().await;
    let mut env = traced(&collector, "herald");
    env.extend([("HERALD_LOG__FORMAT", "json".to_owned()), ("RUST_LOG", "trace".to_owned())]);
    let herald = start(&storage, &env);
    let (app, opened) =
        app_with_endpoint(&herald, &receiver.url("/opened"), json!({"propagateTraceContext": true})).await;
    let closed = json!({"url": receiver.url("/closed")});
    let (status, _) =
        herald.call(Method::POST, ADMIN_TOKEN, &format!("/api/v1/app/{app}/endpoint"), Some(closed)).await;
    assert_eq!(status, StatusCode::CREATED);
    send(&herald, &app, None).await;
    let opened_got = receiver.wait_for(Some("/opened"), 1).await;
    let closed_got = receiver.wait_for(Some("/closed"), 1).await;
    assert!(closed_got[0].headers.get("traceparent").is_none(), "not sent where nobody asked");
    let traceparent = opened_got[0].header("traceparent").to_owned();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!((parts.len(), parts[0], parts[3]), (4, "00", "01"), "{traceparent}");
    let (trace, parent) = (parts[1].to_owned(), parts[2].to_owned());

    let spans = eventually("both attempts exported", || {
        let spans = of_trace(&collector, &trace);
        std::future::ready((attempts_in(&spans).len() == 2).then_some(spans))
    })
    .await;
    let sent_from = spans.iter().find(|s| s.span_id == parent).expect("the traceparent names an exported span");
    assert_eq!((sent_from.kind, sent_from.attr("herald.endpoint_id")), (CLIENT, &json!(opened)));
    let ingest = spans.iter().find(|s| s.kind == SERVER).unwrap();
    assert_eq!(ingest.parent_span_id, "", "without a caller's traceparent the ingest span is the root");

    let output = herald.stop();
    let ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let traced_lines: Vec<Value> = output
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["trace_id"] == json!(trace))
        .collect();
    assert!(!traced_lines.is_empty(), "lines logged during the ingest or an attempt carry the trace id");
    for line in &traced_lines {
        assert!(ids.contains(&line["span_id"].as_str().unwrap()), "a span of this trace: {line}");
    }
    let listening = output.lines().find(|l| l.contains("Herald is listening")).unwrap();
    assert!(!listening.contains("trace_id"), "no ids outside a span: {listening}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_refuses_exports_is_reported_in_the_log_without_the_header_value() {
    let collector = Collector::start_requiring(Some(("x-collector-key", "s=cret"))).await;
    let storage = Storage::new().await;
    let mut env = traced(&collector, "herald");
    env[1].1 = "x-collector-key=wrong-key-value".into();
    let herald = start(&storage, &env);
    let (app, _) = app_with_endpoint(&herald, "https://hooks.example.com/", json!({})).await;
    send(&herald, &app, None).await;
    eventually("a refused export", || std::future::ready((collector.refused() > 0).then_some(()))).await;
    let output = herald.stop();
    let reported = output.lines().find(|l| l.contains("ExportError")).unwrap_or_else(|| panic!("{output}"));
    assert!(reported.contains("401"), "{reported}");
    assert!(!output.contains("wrong-key-value"), "the header value is a credential: {output}");
    assert_eq!(collector.spans().len(), 0);
}

#[tokio::test]
async fn only_the_operator_sets_trace_propagation() {
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let endpoint = server
        .create_endpoint(&app, "https://hooks.example.com/", json!({"delivery": {"propagateTraceContext": true}}))
        .await;
    let id = endpoint["id"].as_str().unwrap().to_owned();
    assert_eq!(endpoint["delivery"]["propagateTraceContext"], json!(true));
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
    let portal = access["token"].as_str().unwrap().to_owned();
    let path = format!("/api/v1/app/{app}/endpoint/{id}");
    let as_portal = |method: Method, path: &str, body: Value| {
        let request = server.request_as(&portal, method, path).json(&body).send();
        async move { request.await.unwrap().status() }
    };

    let refused = json!({"delivery": {"propagateTraceContext": false}});
    assert_eq!(as_portal(Method::PATCH, &path, refused).await, StatusCode::FORBIDDEN);
    let other = json!({"delivery": {"timeoutMs": 5000}});
    assert_eq!(as_portal(Method::PATCH, &path, other).await, StatusCode::OK);
    let (_, read) = server.get(&path).await;
    assert_eq!(read["delivery"]["propagateTraceContext"], json!(true), "kept through the customer's change");
    assert_eq!(read["delivery"]["timeoutMs"], json!(5000));
    let replaced = json!({"url": "https://hooks.example.com/v2"});
    assert_eq!(as_portal(Method::PUT, &path, replaced).await, StatusCode::OK);
    let (_, read) = server.get(&path).await;
    assert_eq!(read["delivery"]["propagateTraceContext"], json!(true), "kept through a replacement");

    let list = format!("/api/v1/app/{app}/endpoint");
    let opened = json!({"url": "https://hooks.example.com/", "delivery": {"propagateTraceContext": true}});
    assert_eq!(as_portal(Method::POST, &list, opened).await, StatusCode::FORBIDDEN);
    let closed = json!({"url": "https://hooks.example.com/", "delivery": {"propagateTraceContext": false}});
    assert_eq!(as_portal(Method::POST, &list, closed).await, StatusCode::CREATED);

    let (status, read) =
        server.call(Method::PATCH, &path, Some(json!({"delivery": {"propagateTraceContext": false}}))).await;
    assert_eq!((status, &read["delivery"]["propagateTraceContext"]), (StatusCode::OK, &json!(false)));
}
