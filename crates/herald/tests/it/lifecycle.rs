//! Process lifecycle: graceful shutdown with work in flight, SIGKILL under load, and a
//! process whose dispatcher fails: unhealthy at once, then gone with a non-zero exit.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::support::lock::StoreLock;
use crate::support::process::Process;
use crate::support::server::{ADMIN_TOKEN, Backend, Storage, backend, test_config};
use crate::support::{Gate, Receiver, Reply, TestServer, eventually};

#[tokio::test]
async fn graceful_shutdown_finishes_the_in_flight_attempt_and_records_it() {
    let receiver = Receiver::start(|_, _| Reply::ok().after(Duration::from_millis(800))).await;
    let storage = Storage::new().await;
    let server = TestServer::start_on(&storage, |_| {}).await;
    let app = server.create_app("a").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/slow"), json!({})).await;
    let msg = server.send(&app, json!({"eventType": "a", "payload": {}})).await;
    receiver.wait_for(None, 1).await;
    // The attempt is in flight now: stop, and the server must wait for it.
    server.begin_stop();
    server.stopped().await.expect("a graceful stop returns Ok");

    let server = TestServer::start_on(&storage, |_| {}).await;
    let status = server.delivery_status(&app, &msg, endpoint["id"].as_str().unwrap()).await;
    assert_eq!(status, Some(0), "the in-flight attempt's success was recorded before exit");
    assert_eq!(server.attempts(&app, &msg).await.len(), 1);
    assert_eq!(receiver.requests().len(), 1, "nothing was sent twice");
}

#[tokio::test]
async fn a_generated_admin_token_is_stored_owner_only_and_reused() {
    use std::os::unix::fs::PermissionsExt;
    if backend() == Backend::Postgres {
        eprintln!("skipped on PostgreSQL: processes sharing a database need HERALD_ADMIN_TOKEN; none is generated");
        return;
    }
    let storage = Storage::new().await;
    let config = || {
        let mut config = test_config(&storage);
        config.auth.admin_token = None;
        config
    };
    let server = herald::Server::build(config()).await.unwrap();
    drop(server);
    let path = storage.dir.path().join("admin-token");
    let token = std::fs::read_to_string(&path).unwrap().trim().to_owned();
    assert!(token.len() >= 40, "a long random token");
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    let server = herald::Server::build(config()).await.unwrap();
    let addr = server.local_addr();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(server.run_until_stopped(shutdown.clone()));
    let resp =
        reqwest::Client::new().get(format!("http://{addr}/api/v1/app")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "the stored token is used again");
    assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), token);
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_second_server_on_the_same_data_directory_fails_at_once() {
    if backend() == Backend::Postgres {
        eprintln!(
            "skipped on PostgreSQL: many processes share one database by design; only SQLite locks its directory"
        );
        return;
    }
    let first = TestServer::start_with(|_| {}).await;
    let storage = Storage::new().await;
    let _held = TestServer::start_on(&storage, |_| {}).await;
    let second = herald::Server::build(test_config(&storage)).await;
    let error = format!("{:#}", second.err().expect("the data directory is locked"));
    assert!(error.contains("another Herald process is using the data directory"), "{error}");
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_no_accepted_message() {
    let receiver = Receiver::start(|_, _| Reply::ok().after(Duration::from_millis(3))).await;
    let storage = Storage::new().await;
    let first = Process::start(&storage);
    let client = reqwest::Client::new();
    let post = |base: &str, path: &str, body: serde_json::Value| {
        client.post(format!("{base}{path}")).bearer_auth(ADMIN_TOKEN).json(&body).send()
    };
    let app: serde_json::Value =
        post(&first.base, "/api/v1/app", json!({"name": "crash"})).await.unwrap().json().await.unwrap();
    let app = app["id"].as_str().unwrap().to_owned();
    let ep =
        post(&first.base, &format!("/api/v1/app/{app}/endpoint"), json!({"url": receiver.url("/hook")})).await.unwrap();
    assert_eq!(ep.status(), StatusCode::CREATED);

    // Eight producers post until the process dies; every 202 is recorded.
    let accepted = Arc::new(Mutex::new(HashSet::new()));
    let producers: Vec<_> = (0..8)
        .map(|p| {
            let (client, base, app, accepted) = (client.clone(), first.base.clone(), app.clone(), accepted.clone());
            tokio::spawn(async move {
                for n in 0.. {
                    let body = json!({"eventType": "load", "payload": {"producer": p, "n": n}});
                    let sent =
                        client.post(format!("{base}/api/v1/app/{app}/msg")).bearer_auth(ADMIN_TOKEN).json(&body).send();
                    match sent.await {
                        Ok(resp) if resp.status() == StatusCode::ACCEPTED => {
                            let msg: serde_json::Value = resp.json().await.unwrap();
                            accepted.lock().unwrap().insert(msg["id"].as_str().unwrap().to_owned());
                        }
                        Ok(resp) => panic!("unexpected status {}", resp.status()),
                        Err(_) => return, // the server is gone
                    }
                }
            })
        })
        .collect();
    eventually("load to build up", || async { (accepted.lock().unwrap().len() >= 400).then_some(()) }).await;
    first.kill();
    for producer in producers {
        producer.await.unwrap();
    }
    let accepted = accepted.lock().unwrap().clone();
    assert!(accepted.len() >= 400);

    let second = Process::start(&storage);
    eventually("every accepted message to arrive", || async {
        let received: HashSet<String> = receiver.requests().iter().map(|r| r.header("webhook-id").to_owned()).collect();
        accepted.is_subset(&received).then_some(())
    })
    .await;
    second.kill();
}

/// A panic in the dispatcher's pump (injected: test builds only) used to stop all delivery
/// while the API kept answering 202. Now the health check says 503 at once, new messages are
/// refused, the process exits non-zero within seconds, and a restart delivers everything
/// accepted before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pump_that_panics_makes_the_process_unhealthy_and_exit_and_nothing_accepted_is_lost() {
    // The first attempts are held at the receiver until the test has seen the failure, so
    // that the process is still draining them (and answering 503) however slow the machine.
    let gate = Gate::default();
    let held = gate.clone();
    let receiver = Receiver::start(move |_, _| Reply::ok().held_by(&held)).await;
    let storage = Storage::new().await;
    let failing = Process::start_with(&storage, &[("HERALD_FAULTS__PANIC_PUMP_ON_EVENT_TYPE", "boom")]);
    let base = failing.base.clone();
    let client = reqwest::Client::new();
    let post = |path: String, body: serde_json::Value| {
        client.post(format!("{base}{path}")).bearer_auth(ADMIN_TOKEN).json(&body).send()
    };
    let app: serde_json::Value = post("/api/v1/app".into(), json!({"name": "a"})).await.unwrap().json().await.unwrap();
    let app = app["id"].as_str().unwrap().to_owned();
    let endpoint: serde_json::Value =
        post(format!("/api/v1/app/{app}/endpoint"), json!({"url": receiver.url("/hook")}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let endpoint = endpoint["id"].as_str().unwrap().to_owned();
    let health = || client.get(format!("{base}/api/v1/health")).send();
    assert_eq!(health().await.unwrap().status(), StatusCode::NO_CONTENT);
    let mut accepted = Vec::new();
    for event_type in ["a", "a", "a", "boom"] {
        let answer = post(format!("/api/v1/app/{app}/msg"), json!({"eventType": event_type, "payload": {}})).await;
        let answer = answer.unwrap();
        assert_eq!(answer.status(), StatusCode::ACCEPTED);
        accepted.push(answer.json::<serde_json::Value>().await.unwrap()["id"].as_str().unwrap().to_owned());
    }
    // The process drains the held attempts before it exits, and says it is unhealthy
    // meanwhile.
    let unhealthy = eventually("the health check to fail", || async {
        let answer = health().await.ok()?;
        (answer.status() == StatusCode::SERVICE_UNAVAILABLE).then_some(answer)
    })
    .await;
    let body: serde_json::Value = unhealthy.json().await.unwrap();
    assert_eq!(body["code"], "unhealthy");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("internal failure"), "{body}");
    assert!(
        !detail.contains("pump") && !detail.contains("injected"),
        "the open health check names no internals: {body}"
    );
    let refused = post(format!("/api/v1/app/{app}/msg"), json!({"eventType": "a", "payload": {}})).await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE, "nothing new is accepted by a failing process");
    gate.open();
    let started = std::time::Instant::now();
    let (status, log) =
        tokio::task::spawn_blocking(move || failing.wait(Duration::from_secs(20))).await.unwrap().expect("it exits");
    assert_eq!(status.code(), Some(1), "a non-zero exit, so a service manager restarts it:\n{log}");
    assert!(started.elapsed() < Duration::from_secs(10), "within seconds: {:?}", started.elapsed());
    assert!(log.contains("the pump panicked"), "the log says why:\n{log}");

    let restarted = Process::start(&storage);
    let base = restarted.base.clone();
    eventually("everything accepted delivered after the restart", || async {
        let mut delivered = 0;
        for msg in &accepted {
            let url = format!("{base}/api/v1/app/{app}/msg/{msg}/endpoint");
            let list: serde_json::Value =
                client.get(&url).bearer_auth(ADMIN_TOKEN).send().await.ok()?.json().await.ok()?;
            let done = list["data"].as_array()?.iter().any(|d| d["id"] == endpoint.as_str() && d["status"] == 0);
            delivered += usize::from(done);
        }
        (delivered == accepted.len()).then_some(())
    })
    .await;
    restarted.kill();
}

/// The store stops answering (another client holds it locked) just as the process is told
/// to stop: the stop must still end within the grace period, exit 0, and say what it left
/// undone; nothing is lost by it, as the next process takes the deliveries up.
#[tokio::test]
async fn a_sigterm_with_the_store_locked_still_exits_within_the_grace() {
    const GRACE: Duration = Duration::from_secs(2);
    // 503 until `healthy`; then 200, and the message's id is booked as delivered.
    let healthy = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let delivered = Arc::new(Mutex::new(HashSet::new()));
    let (answer, book) = (healthy.clone(), delivered.clone());
    let receiver = Receiver::start(move |request, _| {
        if !answer.load(std::sync::atomic::Ordering::SeqCst) {
            return Reply::status(503);
        }
        book.lock().unwrap().insert(request.header("webhook-id").to_owned());
        Reply::ok()
    })
    .await;
    let storage = Storage::new().await;
    let grace_ms = GRACE.as_millis().to_string();
    let first = Process::start_with(&storage, &[("HERALD_QUEUE__SHUTDOWN_GRACE_MS", &grace_ms)]);
    let (_, app) = first.call(reqwest::Method::POST, ADMIN_TOKEN, "/api/v1/app", Some(json!({"name": "a"}))).await;
    let app = app["id"].as_str().unwrap().to_owned();
    let retry = json!({"retry": {"strategy": "schedule", "delaysMs": [3000], "jitterPercent": 0}});
    let endpoint = json!({"url": receiver.url("/hook"), "delivery": retry});
    let (status, _) =
        first.call(reqwest::Method::POST, ADMIN_TOKEN, &format!("/api/v1/app/{app}/endpoint"), Some(endpoint)).await;
    assert_eq!(status, StatusCode::CREATED);
    let mut sent = HashSet::new();
    for n in 0..3 {
        let body = json!({"eventType": "a", "payload": {"n": n}});
        let (status, msg) =
            first.call(reqwest::Method::POST, ADMIN_TOKEN, &format!("/api/v1/app/{app}/msg"), Some(body)).await;
        assert_eq!(status, StatusCode::ACCEPTED);
        sent.insert(msg["id"].as_str().unwrap().to_owned());
    }
    receiver.wait_for(Some("/hook"), 3).await;

    // Every message failed once and waits for its retry, held by this process.
    let lock = StoreLock::take(&storage).await;
    let (status, took, log) = tokio::task::spawn_blocking(move || first.terminate()).await.unwrap();
    assert!(status.success(), "{status}\n{log}");
    assert!(took <= GRACE, "the stop took {took:?}, past the grace of {GRACE:?}:\n{log}");
    assert!(log.contains("left claimed"), "the log says the deliveries were left claimed:\n{log}");
    assert!(log.contains("stopped; exiting") && log.contains("runtime stopped"), "each step is logged:\n{log}");
    lock.release().await;

    healthy.store(true, std::sync::atomic::Ordering::SeqCst);
    let second = Process::start(&storage);
    eventually("every message to be delivered by the next process", || async {
        sent.is_subset(&delivered.lock().unwrap()).then_some(())
    })
    .await;
    second.kill();
}
