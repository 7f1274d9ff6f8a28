//! Backups of the embedded store through the real `herald` binary: taken while a server
//! ingests, restored into a fresh data directory, and started; refused where they would
//! hurt (a running server's store, a database already there).

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::support::process::run_herald;
use crate::support::server::Storage;
use crate::support::{Receiver, Reply, TestServer, eventually};

/// Runs `herald ARGS --data-dir DATA_DIR`; its success and what it printed.
async fn herald(args: &[&str], data_dir: &Path) -> (bool, String) {
    let data_dir = data_dir.to_str().unwrap();
    run_herald(&[args, &["--data-dir", data_dir]].concat(), &[]).await
}

#[tokio::test]
async fn a_backup_under_load_restores_every_accepted_message_and_delivers_what_was_pending() {
    let up = Arc::new(AtomicBool::new(false));
    let receiver = {
        let up = up.clone();
        Receiver::start(move |_, _| if up.load(Ordering::SeqCst) { Reply::ok() } else { Reply::status(503) }).await
    };
    let storage = Storage::sqlite();
    let server = TestServer::start_on(&storage, |_| {}).await;
    let app = server.create_app("shop").await;
    // Retried every second, and no breaker in the way: every message stays pending while the
    // receiver is down.
    let delivery = json!({"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 100},
                          "circuitBreaker": {"failureThreshold": 10000}});
    server.create_endpoint(&app, &receiver.url("/hook"), json!({"delivery": delivery})).await;

    // Messages keep coming while the backup is taken.
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (server, app, accepted, stop) = (&server, app.clone(), accepted.clone(), stop.clone());
        async move {
            for n in 0.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let id = server.send(&app, json!({"eventType": "order.paid", "payload": {"n": n}})).await;
                accepted.lock().unwrap().push(id);
            }
        }
    };
    let file = storage.dir.path().parent().unwrap().join(format!("herald-backup-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let backup = async {
        eventually("50 messages accepted", || async { (accepted.lock().unwrap().len() >= 50).then_some(()) }).await;
        let before: Vec<String> = accepted.lock().unwrap().clone();
        let made = herald(&["backup", "--to", file.to_str().unwrap()], storage.dir.path()).await;
        stop.store(true, Ordering::SeqCst);
        (before, made)
    };
    let ((), (before, (ok, said))) = tokio::join!(load, backup);
    assert!(ok, "{said}");
    assert!(said.contains("messages") && said.contains("keep the key apart"), "{said}");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the backup is private");
    let (ok, said) = herald(&["backup", "--to", file.to_str().unwrap()], storage.dir.path()).await;
    assert!(!ok && said.contains("naming the backup"), "an existing file is never replaced: {said}");
    let partial = format!("{}.partial", file.display());
    assert!(!Path::new(&partial).exists(), "nothing is left behind");
    let after = accepted.lock().unwrap().len();
    assert!(after > before.len(), "messages were accepted while the backup ran");

    // Not into a running server's store; not over a database without --force.
    let (ok, said) = herald(&["restore", "--from", file.to_str().unwrap()], storage.dir.path()).await;
    assert!(!ok && said.contains("stop the Herald server"), "{said}");
    server.stop().await;
    let mut fresh = Storage::sqlite();
    let garbage = fresh.dir.path().join("not-a-backup.db");
    std::fs::write(&garbage, "hello").unwrap();
    let (ok, said) = herald(&["restore", "--from", garbage.to_str().unwrap()], fresh.dir.path()).await;
    assert!(!ok && said.contains("not a SQLite database"), "{said}");
    fresh.secret_key = storage.secret_key.clone();
    let (ok, said) = herald(&["restore", "--from", file.to_str().unwrap()], fresh.dir.path()).await;
    assert!(ok, "{said}");
    let (ok, said) = herald(&["restore", "--from", file.to_str().unwrap()], fresh.dir.path()).await;
    assert!(!ok && said.contains("--force"), "{said}");
    let (ok, said) = herald(&["restore", "--force", "--from", file.to_str().unwrap()], fresh.dir.path()).await;
    assert!(ok, "{said}");

    // Started on the restored store: every message accepted before the backup began is
    // there, and its pending delivery goes out (signed with the restored secret).
    let seen_before_restore = receiver.requests().len();
    up.store(true, Ordering::SeqCst);
    let restored = TestServer::start_on(&fresh, |_| {}).await;
    for id in &before {
        let (status, _) = restored.get(&format!("/api/v1/app/{app}/msg/{id}")).await;
        assert_eq!(status, reqwest::StatusCode::OK, "{id} is in the backup");
    }
    let (_, endpoints) = restored.get(&format!("/api/v1/app/{app}/endpoint")).await;
    let endpoint = endpoints["data"][0]["id"].as_str().unwrap().to_owned();
    let (_, secret) = restored.get(&format!("/api/v1/app/{app}/endpoint/{endpoint}/secret")).await;
    let secret = secret["key"].as_str().unwrap().to_owned();
    let wanted: HashSet<&String> = before.iter().collect();
    eventually("every message accepted before the backup delivered", || async {
        let delivered: HashSet<String> = receiver.requests()[seen_before_restore..]
            .iter()
            .filter(|r| crate::support::verifies(&secret, r))
            .map(|r| r.header("webhook-id").to_owned())
            .collect();
        wanted.iter().all(|id| delivered.contains(*id)).then_some(())
    })
    .await;
    restored.stop().await;
    let _ = std::fs::remove_file(&file);
}
