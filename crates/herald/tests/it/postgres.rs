//! What only PostgreSQL offers: many Herald processes on one database, the transactional
//! outbox, wake-ups and cache invalidation across processes, and riding out a database
//! restart. These tests start their own throwaway cluster whatever the suite's backend.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::process::Process;
use crate::support::server::{ADMIN_TOKEN, Storage};
use crate::support::{Receiver, Reply, eventually};

async fn post(base: &str, path: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new().post(format!("{base}{path}")).bearer_auth(ADMIN_TOKEN).json(&body).send().await.unwrap()
}

async fn get(base: &str, path: &str) -> Value {
    let sent = reqwest::Client::new().get(format!("{base}{path}")).bearer_auth(ADMIN_TOKEN).send();
    sent.await.unwrap().json().await.unwrap()
}

async fn setup_app(base: &str, receiver: &Receiver, path: &str) -> String {
    let app: Value = post(base, "/api/v1/app", json!({"name": "pg"})).await.json().await.unwrap();
    let app = app["id"].as_str().unwrap().to_owned();
    let ep = post(base, &format!("/api/v1/app/{app}/endpoint"), json!({"url": receiver.url(path)})).await;
    assert_eq!(ep.status(), StatusCode::CREATED);
    app
}

fn received_ids(receiver: &Receiver) -> Vec<String> {
    receiver.requests().iter().map(|r| r.header("webhook-id").to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_share_the_work_and_lose_nothing_when_one_is_killed() {
    let receiver = Receiver::start(|_, _| Reply::ok().after(Duration::from_millis(2))).await;
    let storage = Storage::postgres().await;
    let processes: Vec<Process> = (0..3).map(|_| Process::start(&storage)).collect();
    let app = setup_app(&processes[0].base, &receiver, "/hook").await;

    // Producers spread 5,000 messages over the three processes.
    let accepted = Arc::new(Mutex::new(HashSet::new()));
    let bases: Vec<String> = processes.iter().map(|p| p.base.clone()).collect();
    let producers: Vec<_> = (0..6)
        .map(|p| {
            let (bases, app, accepted) = (bases.clone(), app.clone(), accepted.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                for n in 0..(5000 / 6 + 1) {
                    let body = json!({"eventType": "load", "payload": {"p": p, "n": n}});
                    // Like a real client behind a load balancer: try the next process when one
                    // is gone. The same idempotency key makes the retry safe.
                    for shift in 0..bases.len() {
                        let base = &bases[(p + n + shift) % bases.len()];
                        let sent = client
                            .post(format!("{base}/api/v1/app/{app}/msg"))
                            .bearer_auth(ADMIN_TOKEN)
                            .header("idempotency-key", format!("{p}-{n}"))
                            .json(&body);
                        if let Ok(resp) = sent.send().await
                            && resp.status() == StatusCode::ACCEPTED
                        {
                            let msg: Value = resp.json().await.unwrap();
                            accepted.lock().unwrap().insert(msg["id"].as_str().unwrap().to_owned());
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    eventually("a third of the load", || async { (receiver.requests().len() >= 1500).then_some(()) }).await;
    let mut processes = processes;
    processes.remove(0).kill();
    let killed_at = Instant::now();
    for producer in producers {
        producer.await.unwrap();
    }
    let accepted = accepted.lock().unwrap().clone();
    assert!(accepted.len() >= 5000, "every message was accepted by some process ({})", accepted.len());
    eventually("every accepted message to arrive", || async {
        let received: HashSet<String> = received_ids(&receiver).into_iter().collect();
        accepted.is_subset(&received).then_some(())
    })
    .await;
    // Duplicates can only come from work the killed process had in flight: the first copy
    // of every duplicated message arrived before the kill.
    let mut first_seen: HashMap<String, Instant> = HashMap::new();
    let mut duplicated = HashSet::new();
    for r in receiver.requests() {
        let id = r.header("webhook-id").to_owned();
        match first_seen.entry(id) {
            std::collections::hash_map::Entry::Occupied(seen) => {
                duplicated.insert(seen.key().clone());
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(r.at);
            }
        }
    }
    for id in &duplicated {
        assert!(first_seen[id] <= killed_at, "{id} was delivered twice without a crash to excuse it");
    }
    processes.into_iter().for_each(Process::kill);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_delivers_committed_transactions_and_never_rolled_back_ones() {
    let receiver = Receiver::ok().await;
    let storage = Storage::postgres().await;
    let herald = Process::start(&storage);
    let app = setup_app(&herald.base, &receiver, "/outbox").await;
    let url = storage.database_url.clone().unwrap();
    let (mut client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);

    let send = "SELECT herald.send_message(app => $1, event_type => 'payment.succeeded', payload => $2::text::jsonb, \
                event_id => $3)";
    let tx = client.transaction().await.unwrap();
    tx.execute(send, &[&app, &json!({"order": "rolled-back"}).to_string(), &"ev-1"]).await.unwrap();
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let row = tx.query_one(send, &[&app, &json!({"order": "committed"}).to_string(), &"ev-2"]).await.unwrap();
    let msg_id: String = row.get(0);
    tx.commit().await.unwrap();
    assert!(msg_id.starts_with("msg_"));

    let got = receiver.wait_for(Some("/outbox"), 1).await;
    assert_eq!(got[0].header("webhook-id"), msg_id);
    assert_eq!(serde_json::from_slice::<Value>(&got[0].body).unwrap(), json!({"order": "committed"}));
    // A message posted after the rolled-back one arrives; the rolled-back one never does.
    let marker =
        post(&herald.base, &format!("/api/v1/app/{app}/msg"), json!({"eventType": "m", "payload": {"marker": 1}}))
            .await;
    assert_eq!(marker.status(), StatusCode::ACCEPTED);
    let got = receiver.wait_for(Some("/outbox"), 2).await;
    assert!(got.iter().all(|r| !String::from_utf8_lossy(&r.body).contains("rolled-back")));
    // The outbox enforces the API's rules: a repeated event id fails the producer's statement.
    let again = client.execute(send, &[&app, &json!({}).to_string(), &"ev-2"]).await;
    assert!(again.is_err(), "a repeated event id is refused");
    herald.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_process_hands_work_to_a_worker_without_waiting_for_a_poll() {
    let receiver = Receiver::ok().await;
    let storage = Storage::postgres().await;
    let slow_poll = [("HERALD_QUEUE__POLL_INTERVAL_MS", "600000")];
    let api = Process::start_with(&storage, &[("HERALD_ROLE", "api"), slow_poll[0]]);
    let worker = Process::start_with(&storage, &[("HERALD_ROLE", "worker"), slow_poll[0]]);
    let app = setup_app(&api.base, &receiver, "/w").await;
    let sent = post(&api.base, &format!("/api/v1/app/{app}/msg"), json!({"eventType": "a", "payload": {}})).await;
    assert_eq!(sent.status(), StatusCode::ACCEPTED);
    // The worker polls every ten minutes: only a NOTIFY can bring this within the wait.
    receiver.wait_for(Some("/w"), 1).await;
    let health = reqwest::get(format!("{}/api/v1/health", worker.base)).await.unwrap();
    assert_eq!(health.status(), StatusCode::NO_CONTENT, "a worker answers health checks");
    let apps = reqwest::Client::new().get(format!("{}/api/v1/app", worker.base)).bearer_auth(ADMIN_TOKEN).send();
    assert_eq!(apps.await.unwrap().status(), StatusCode::NOT_FOUND, "and nothing else");
    api.kill();
    worker.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_created_through_one_process_is_routed_by_another() {
    let receiver = Receiver::ok().await;
    let storage = Storage::postgres().await;
    let (a, b) = (Process::start(&storage), Process::start(&storage));
    let app = setup_app(&a.base, &receiver, "/first").await;
    // B routes a message, caching the application's single endpoint...
    post(&b.base, &format!("/api/v1/app/{app}/msg"), json!({"eventType": "x", "payload": {"n": 1}})).await;
    receiver.wait_for(Some("/first"), 1).await;
    // ...A adds a second endpoint, and B's next message must reach it too.
    post(&a.base, &format!("/api/v1/app/{app}/endpoint"), json!({"url": receiver.url("/second")})).await;
    eventually("B to route to the new endpoint", || async {
        post(&b.base, &format!("/api/v1/app/{app}/msg"), json!({"eventType": "x", "payload": {"n": 2}})).await;
        (!receiver.requests_to("/second").is_empty()).then_some(())
    })
    .await;
    a.kill();
    b.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_under_load_answers_503_loses_nothing_and_heals_itself() {
    let receiver = Receiver::ok().await;
    let mut storage = Storage::postgres().await;
    let herald = Process::start(&storage);
    let app = setup_app(&herald.base, &receiver, "/r").await;
    let accepted = Arc::new(Mutex::new(HashSet::new()));
    let statuses = Arc::new(Mutex::new(HashMap::<u16, usize>::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (base, app, accepted, statuses, stop) =
            (herald.base.clone(), app.clone(), accepted.clone(), statuses.clone(), stop.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().unwrap();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let body = json!({"eventType": "r", "payload": {"n": n}});
                let sent = client.post(format!("{base}/api/v1/app/{app}/msg")).bearer_auth(ADMIN_TOKEN).json(&body);
                if let Ok(resp) = sent.send().await {
                    *statuses.lock().unwrap().entry(resp.status().as_u16()).or_default() += 1;
                    if resp.status() == StatusCode::ACCEPTED {
                        let msg: Value = resp.json().await.unwrap();
                        accepted.lock().unwrap().insert(msg["id"].as_str().unwrap().to_owned());
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    eventually("load before the restart", || async { (accepted.lock().unwrap().len() >= 100).then_some(()) }).await;
    let cluster = storage.cluster.as_mut().unwrap();
    cluster.stop("immediate").unwrap();
    eventually("503s while the database is down", || async {
        (statuses.lock().unwrap().get(&503).copied().unwrap_or(0) >= 3).then_some(())
    })
    .await;
    cluster.restart().unwrap();
    let before = accepted.lock().unwrap().len();
    eventually("ingest to recover without restarting Herald", || async {
        (accepted.lock().unwrap().len() >= before + 100).then_some(())
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    producer.await.unwrap();
    let accepted = accepted.lock().unwrap().clone();
    eventually("every accepted message to arrive", || async {
        let received: HashSet<String> = received_ids(&receiver).into_iter().collect();
        accepted.is_subset(&received).then_some(())
    })
    .await;
    let statuses = statuses.lock().unwrap().clone();
    assert!(statuses.keys().all(|s| *s == 202 || *s == 503), "only 202 or 503, never a 500: {statuses:?}");
    herald.kill();
}

/// Two processes holding a backlog of slow deliveries of one application.
struct Backlog {
    receiver: Receiver,
    storage: Storage,
    processes: Vec<Process>,
    app: String,
    accepted: HashSet<String>,
}

/// Two processes holding a backlog of slow deliveries (4 attempts of 200 ms at a time each).
async fn two_processes_with_a_backlog() -> Backlog {
    let receiver = Receiver::start(|_, _| Reply::ok().after(Duration::from_millis(200))).await;
    let storage = Storage::postgres().await;
    let processes: Vec<Process> = (0..2).map(|_| Process::start(&storage)).collect();
    let base = &processes[0].base;
    let app: Value =
        post(base, "/api/v1/app", json!({"name": "stall", "maxConcurrency": 4})).await.json().await.unwrap();
    let app = app["id"].as_str().unwrap().to_owned();
    post(base, &format!("/api/v1/app/{app}/endpoint"), json!({"url": receiver.url("/r")})).await;
    let mut accepted = HashSet::new();
    for n in 0..200 {
        let base = &processes[n % 2].base;
        let msg: Value = post(base, &format!("/api/v1/app/{app}/msg"), json!({"eventType": "e", "payload": {"n": n}}))
            .await
            .json()
            .await
            .unwrap();
        accepted.insert(msg["id"].as_str().unwrap().to_owned());
    }
    eventually("deliveries under way", || async { (receiver.requests().len() >= 10).then_some(()) }).await;
    Backlog { receiver, storage, processes, app, accepted }
}

/// Every accepted message arrives, and none twice: checked once Herald has nothing left
/// to send anywhere. A sentinel message through each process, to the same endpoint, goes
/// behind whatever that process still holds for it; once both arrived, and the store has
/// no delivery waiting and neither process an attempt in flight, every request either
/// process was going to make has been made.
async fn assert_each_arrives_once(backlog: &Backlog) {
    let Backlog { receiver, processes, app, accepted, .. } = backlog;
    eventually("every accepted message to arrive", || async {
        let received: HashSet<String> = received_ids(receiver).into_iter().collect();
        accepted.is_subset(&received).then_some(())
    })
    .await;
    let mut sentinels = HashSet::new();
    for (n, process) in processes.iter().enumerate() {
        // Sent again while the process answers 503 (its database connections may still be
        // coming back); the idempotency key keeps it one message.
        let sentinel = eventually("the sentinel to be accepted", || async {
            let answer = reqwest::Client::new()
                .post(format!("{}/api/v1/app/{app}/msg", process.base))
                .bearer_auth(ADMIN_TOKEN)
                .header("idempotency-key", format!("sentinel-{n}"))
                .json(&json!({"eventType": "e", "payload": {"sentinel": n}}))
                .send()
                .await
                .ok()?;
            if answer.status() != StatusCode::ACCEPTED {
                eprintln!("the sentinel was answered {}", answer.status());
                return None;
            }
            answer.json::<Value>().await.ok()?["id"].as_str().map(str::to_owned)
        })
        .await;
        sentinels.insert(sentinel);
    }
    eventually("the sentinels to arrive", || async {
        let received: HashSet<String> = received_ids(receiver).into_iter().collect();
        sentinels.is_subset(&received).then_some(())
    })
    .await;
    for process in processes {
        eventually("nothing left to send", || async {
            let summary: Value = reqwest::Client::new()
                .get(format!("{}/api/v1/stats/summary", process.base))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let idle = ["pending", "awaitingRetry", "inFlight"].iter().all(|field| summary[field] == 0);
            if !idle {
                eprintln!("{} still has work: {summary}", process.base);
            }
            idle.then_some(())
        })
        .await;
    }
    let mut seen = HashSet::new();
    let twice: Vec<String> = received_ids(receiver).into_iter().filter(|id| !seen.insert(id.clone())).collect();
    assert!(twice.is_empty(), "{} deliveries arrived twice, e.g. {:?}", twice.len(), twice.first());
}

/// A database outage longer than the lease: neither process may take the other's deliveries
/// when the database comes back (nobody could renew meanwhile), and neither may start
/// attempts past its own lease's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_longer_than_the_lease_delivers_nothing_twice() {
    let mut backlog = two_processes_with_a_backlog().await;
    let cluster = backlog.storage.cluster.as_mut().unwrap();
    cluster.stop("immediate").unwrap();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    cluster.restart().unwrap();
    assert_each_arrives_once(&backlog).await;
    for process in backlog.processes {
        process.kill();
    }
}

/// A lock on the delivery tables (rows and held ones) held for three leases, while a
/// crashed bystander's lease is due for reaping: outcomes wait, but renewals go on (reaping,
/// stuck behind the lock, must not hold them up), so no live lease expires and nothing is
/// sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_the_delivery_table_delivers_nothing_twice() {
    let backlog = two_processes_with_a_backlog().await;
    // Holds nothing (everything was claimed at ingest), but leaves a lease to reap.
    Process::start(&backlog.storage).kill();
    let url = backlog.storage.database_url.clone().unwrap();
    let (mut db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let tx = db.transaction().await.unwrap();
    tx.execute("LOCK TABLE herald.delivery, herald.held IN ACCESS EXCLUSIVE MODE", &[]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    tx.rollback().await.unwrap();
    assert_each_arrives_once(&backlog).await;
    for process in backlog.processes {
        process.kill();
    }
}

/// Schema version 9: a delivery claimed at ingest is held (a row of `herald.held`, no
/// delivery row) until its first outcome and reads as pending meanwhile; the outcome makes
/// it a delivery row in its next state: delivered, pending for a retry, or cancelled when
/// its endpoint was deleted while it was held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_held_at_ingest_reads_as_pending_and_its_outcome_makes_it_a_row() {
    let receiver = Receiver::start(|r, _| match r.path.as_str() {
        "/failing" => Reply::status(500),
        _ => Reply::ok().after(Duration::from_millis(2500)),
    })
    .await;
    let storage = Storage::postgres().await;
    let herald = Process::start(&storage);
    let base = herald.base.clone();
    let app = setup_app(&base, &receiver, "/slow").await;
    let mut endpoints = HashMap::new();
    for path in ["/failing", "/doomed"] {
        let ep: Value = post(&base, &format!("/api/v1/app/{app}/endpoint"), json!({"url": receiver.url(path)}))
            .await
            .json()
            .await
            .unwrap();
        endpoints.insert(path, ep["id"].as_str().unwrap().to_owned());
    }
    let (db, connection) =
        tokio_postgres::connect(storage.database_url.as_ref().unwrap(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let sent = post(&base, &format!("/api/v1/app/{app}/msg"), json!({"eventType": "a", "payload": {}})).await;
    let msg = sent.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
    receiver.wait_for(Some("/doomed"), 1).await;
    receiver.wait_for(Some("/slow"), 1).await;

    // Both slow attempts are on the wire: held, no row, and pending to readers.
    let held: i64 = db.query_one("SELECT count(*) FROM herald.held WHERE msg_id = $1", &[&msg]).await.unwrap().get(0);
    assert!(held >= 2, "the two deliveries in flight are held ({held})");
    let doomed = endpoints["/doomed"].clone();
    let rows: i64 = db
        .query_one("SELECT count(*) FROM herald.delivery WHERE msg_id = $1 AND endpoint_id = $2", &[&msg, &doomed])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "a held delivery has no row");
    let client = reqwest::Client::new();
    let destinations = get(&base, &format!("/api/v1/app/{app}/msg/{msg}/endpoint")).await;
    let status_of = |destinations: &Value, id: &str| {
        destinations["data"].as_array().unwrap().iter().find(|d| d["id"] == id).map(|d| d["status"].clone())
    };
    assert_eq!(status_of(&destinations, &doomed), Some(json!(1)), "pending while held: {destinations}");

    // The endpoint is deleted while its delivery is held, then every outcome comes in.
    let deleted = client.delete(format!("{base}/api/v1/app/{app}/endpoint/{doomed}")).bearer_auth(ADMIN_TOKEN);
    assert_eq!(deleted.send().await.unwrap().status(), StatusCode::NO_CONTENT);
    let states = eventually("every outcome recorded", || async {
        let rows = db
            .query(
                "SELECT e.path, d.state, d.attempts, d.owner IS NULL
                 FROM herald.delivery d JOIN UNNEST($2::text[], $3::text[]) AS e(path, id) ON e.id = d.endpoint_id
                 WHERE d.msg_id = $1",
                &[&msg, &vec!["/failing", "/doomed"], &vec![endpoints["/failing"].as_str(), doomed.as_str()]],
            )
            .await
            .unwrap();
        let held: i64 = db.query_one("SELECT count(*) FROM herald.held", &[]).await.unwrap().get(0);
        let slow_done = !receiver.requests_to("/slow").is_empty() && rows.len() == 2 && held == 0;
        slow_done.then(|| {
            rows.iter()
                .map(|r| (r.get::<_, String>(0), (r.get::<_, i16>(1), r.get::<_, i32>(2) >= 1, r.get::<_, bool>(3))))
                .collect::<HashMap<_, _>>()
        })
    })
    .await;
    assert_eq!(states["/failing"].0, 0, "a failed first attempt leaves a pending row: {states:?}");
    assert!(states["/failing"].1, "with its attempt counted: {states:?}");
    assert_eq!(states["/doomed"], (3, false, true), "cancelled with its endpoint, unclaimed: {states:?}");
    let slow = eventually("the slow delivery settled", || async {
        let row = db
            .query_opt(
                "SELECT d.state, d.attempts FROM herald.delivery d JOIN herald.endpoint e ON e.id = d.endpoint_id
                 WHERE d.msg_id = $1 AND e.url LIKE '%/slow'",
                &[&msg],
            )
            .await
            .unwrap()?;
        Some((row.get::<_, i16>(0), row.get::<_, i32>(1)))
    })
    .await;
    assert_eq!(slow, (1, 1), "a first-try success is a delivered row with its one attempt");
    herald.kill();
}

#[tokio::test]
async fn processes_starting_together_apply_each_migration_once() {
    let storage = Storage::postgres().await;
    let url = storage.database_url.clone().unwrap();
    let runs = (0..4).map(|_| herald::store::postgres::migrate_url(&url));
    for result in futures_util::future::join_all(runs).await {
        result.expect("concurrent migrations succeed");
    }
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let rows = client.query("SELECT version FROM herald.schema_migrations ORDER BY version", &[]).await.unwrap();
    let versions: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    let every: Vec<i32> = (1..=herald::store::postgres::SCHEMA_VERSION).collect();
    assert_eq!(versions, every, "each version recorded once");
}

/// In a database whose own collation is a language's (ICU en-US: "msg_a" before "msg_B"),
/// every text column of Herald's schema compares bytes ("msg_B" before "msg_a"), as SQLite
/// and Herald do, and no index comparison goes through the locale's rules.
#[tokio::test]
async fn every_text_column_compares_bytes_whatever_the_database_locale() {
    let cluster = herald_test_support::pg_cluster::TempCluster::start().expect("starting a throwaway PostgreSQL");
    let admin =
        herald_test_support::pg_cluster::connect(&cluster.url("postgres"), Duration::from_secs(10)).await.unwrap();
    admin
        .batch_execute("CREATE DATABASE english TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'")
        .await
        .unwrap();
    let url = cluster.url("english");
    herald::store::postgres::migrate_url(&url).await.expect("migrations apply");
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);

    let language = texts(&client, "SELECT v FROM (VALUES ('msg_a'), ('msg_B')) AS t(v) ORDER BY v").await;
    assert_eq!(language, ["msg_a", "msg_B"], "the database's own collation is a language's");
    let other = texts(
        &client,
        "SELECT a.attrelid::regclass || '.' || a.attname || ' ' || coalesce(c.collname, 'default')
             FROM pg_attribute a JOIN pg_class r ON r.oid = a.attrelid
             LEFT JOIN pg_collation c ON c.oid = a.attcollation
             WHERE r.relnamespace = 'herald'::regnamespace AND r.relkind = 'r' AND a.attnum > 0
               AND NOT a.attisdropped AND a.atttypid IN ('text'::regtype, 'text[]'::regtype)
               AND c.collname IS DISTINCT FROM 'C'",
    )
    .await;
    assert!(other.is_empty(), "text columns not compared by bytes: {other:?}");
    client
        .batch_execute(
            "INSERT INTO herald.held (id, msg_id, endpoint_id, app_id, owner, created_at)
             VALUES (1, 'msg_a', 'ep', 'app', 'node', 0), (2, 'msg_B', 'ep', 'app', 'node', 0)",
        )
        .await
        .unwrap();
    let ids = texts(&client, "SELECT msg_id FROM herald.deliveries ORDER BY msg_id").await;
    assert_eq!(ids, ["msg_B", "msg_a"], "ids order by their bytes");
}

/// The first column of every row a query answers, as text.
async fn texts(client: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    client.query(sql, &[]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fix_or_retry_through_one_process_resumes_the_endpoint_in_another() {
    let healed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = healed.clone();
    let receiver = Receiver::start(move |r, _| match r.path.as_str() {
        "/good" => Reply::ok(),
        "/flaky" if flag.load(std::sync::atomic::Ordering::SeqCst) => Reply::ok(),
        _ => Reply::status(500),
    })
    .await;
    let storage = Storage::postgres().await;
    let api = Process::start_with(&storage, &[("HERALD_ROLE", "api")]);
    let worker = Process::start_with(&storage, &[("HERALD_ROLE", "worker")]);
    let app: Value = post(&api.base, "/api/v1/app", json!({"name": "pg"})).await.json().await.unwrap();
    let app = app["id"].as_str().unwrap().to_owned();
    let parking = json!({
        "retry": {"strategy": "schedule", "delaysMs": vec![10; 20], "jitterPercent": 0},
        "circuitBreaker": {"failureThreshold": 3, "cooldownMs": 300_000},
    });
    let client = reqwest::Client::new();
    let health = |ep: String| {
        let request =
            client.get(format!("{}/api/v1/app/{app}/endpoint/{ep}/health", api.base)).bearer_auth(ADMIN_TOKEN);
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    for (path, fix) in [("/broken", "url"), ("/flaky", "retry")] {
        let body = json!({"url": receiver.url(path), "delivery": parking});
        let ep: Value = post(&api.base, &format!("/api/v1/app/{app}/endpoint"), body).await.json().await.unwrap();
        let ep = ep["id"].as_str().unwrap().to_owned();
        let msg = json!({"eventType": "t", "payload": {}});
        post(&api.base, &format!("/api/v1/app/{app}/msg"), msg.clone()).await;
        // The worker's breaker opens (and is saved, which is what the API process shows).
        eventually("the breaker to open", || async { (health(ep.clone()).await["state"] == "open").then_some(()) })
            .await;
        for _ in 0..5 {
            post(&api.base, &format!("/api/v1/app/{app}/msg"), msg.clone()).await;
        }
        let endpoint = format!("{}/api/v1/app/{app}/endpoint/{ep}", api.base);
        if fix == "url" {
            let patch = client.patch(&endpoint).bearer_auth(ADMIN_TOKEN).json(&json!({"url": receiver.url("/good")}));
            assert_eq!(patch.send().await.unwrap().status(), StatusCode::OK);
            receiver.wait_for(Some("/good"), 6).await;
        } else {
            healed.store(true, std::sync::atomic::Ordering::SeqCst);
            assert_eq!(
                post(&api.base, &format!("/api/v1/app/{app}/endpoint/{ep}/health/retry"), json!({})).await.status(),
                StatusCode::ACCEPTED
            );
            receiver.wait_for(Some("/flaky"), 3 + 6).await;
        }
        eventually("the saved breaker to be closed", || async {
            (health(ep.clone()).await["state"] == "closed").then_some(())
        })
        .await;
    }
    api.kill();
    worker.kill();
}
