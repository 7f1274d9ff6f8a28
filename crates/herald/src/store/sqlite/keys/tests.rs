//! The key index through the store and on its own: runs, groups, restarts, failures and
//! expiry.

use std::path::Path;
use std::time::{Duration, Instant};

use super::*;
use crate::config::Config;
use crate::store::AccessStore;
use crate::store::sqlite::SqliteStore;

fn open(path: &Path, run_keys: usize) -> SqliteStore {
    let mut config = Config::defaults().store;
    config.idempotency_run_keys = run_keys;
    SqliteStore::open(path, &config, &Arc::default()).unwrap()
}

fn count(path: &Path, sql: &str) -> i64 {
    Connection::open(path).unwrap().query_row(sql, [], |r| r.get(0)).unwrap()
}

/// Waits (up to 20 s) for the writer to have registered `runs` runs.
fn wait_for_runs(path: &Path, runs: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(path, "SELECT count(*) FROM idempotency_runs") < runs {
        assert!(Instant::now() < deadline, "the writer did not write {runs} runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn answer(n: usize, created_at: i64) -> StoredResponse {
    StoredResponse { status: 202, body: format!("answer {n}"), created_at }
}

async fn save(store: &SqliteStore, keys: std::ops::Range<usize>, created_at: i64) {
    for n in keys {
        store
            .save_idempotent_response("admin\nPOST /api/v1/app", &format!("key-{n}"), &answer(n, created_at))
            .await
            .unwrap();
    }
}

async fn found(store: &SqliteStore, n: usize) -> Option<String> {
    let stored = store.idempotent_response("admin\nPOST /api/v1/app", &format!("key-{n}")).await.unwrap();
    stored.map(|s| s.body)
}

async fn all_found(store: &SqliteStore, keys: std::ops::Range<usize>) {
    for n in keys {
        assert_eq!(found(store, n).await, Some(format!("answer {n}")), "key {n}");
    }
}

/// A temporary directory and the database path in it.
fn database() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.db");
    (dir, path)
}

/// A database with the store's schema and a key index of runs of `run_keys` over it, on
/// a connection of the test's own (no writer thread).
fn index(run_keys: usize) -> (tempfile::TempDir, std::path::PathBuf, Connection, Keys) {
    let (dir, path) = database();
    drop(open(&path, run_keys));
    let conn = Connection::open(&path).unwrap();
    let keys = Keys::load(&conn, run_keys).unwrap();
    (dir, path, conn, keys)
}

#[tokio::test]
async fn keys_are_found_in_memory_in_runs_and_after_a_restart_and_the_first_answer_stays() {
    let (_dir, path) = database();
    let store = open(&path, 100);
    save(&store, 0..350, 1).await;
    wait_for_runs(&path, 3);
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 300);
    let unique_index = "SELECT count(*) FROM sqlite_master WHERE tbl_name = 'idempotency' AND type = 'index'";
    assert_eq!(count(&path, unique_index), 0, "no index of random keys");
    // A second answer for a kept key does not replace the first, in memory or in a run.
    store.save_idempotent_response("admin\nPOST /api/v1/app", "key-7", &answer(999, 1)).await.unwrap();
    store.save_idempotent_response("admin\nPOST /api/v1/app", "key-340", &answer(999, 1)).await.unwrap();
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency"), 350);
    all_found(&store, 0..350).await;
    assert_eq!(found(&store, 350).await, None);
    let other_scope = store.idempotent_response("admin\nPOST /api/v1/other", "key-1").await.unwrap();
    assert!(other_scope.is_none(), "a key belongs to its scope");
    drop(store);
    // Rows of a run whose last chunk never committed are cleared at open.
    Connection::open(&path).unwrap().execute_batch("INSERT INTO idempotency_run VALUES (4, 1, 1)").unwrap();
    let store = open(&path, 100);
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 300);
    all_found(&store, 0..350).await;
    save(&store, 350..400, 1).await;
    wait_for_runs(&path, 4);
    assert_eq!(found(&store, 399).await, Some("answer 399".into()));
}

#[tokio::test]
async fn records_kept_before_runs_existed_are_written_as_runs_at_open() {
    let (_dir, path) = database();
    save(&open(&path, 1_000), 0..250, 1).await;
    // As a database of version 11 had them: records only.
    Connection::open(&path)
        .unwrap()
        .execute_batch("DELETE FROM idempotency_runs; DELETE FROM idempotency_run")
        .unwrap();
    let store = open(&path, 100);
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_runs"), 2, "two full runs, fifty in memory");
    all_found(&store, 0..250).await;
}

/// A run that cannot be written (a full disk, here a trigger that refuses its rows) is
/// not tried again before its wait, which doubles; its keys are found meanwhile, and it
/// is written whole once the write succeeds.
#[test]
fn a_run_that_fails_to_write_waits_longer_after_each_failure_and_is_written_later() {
    let (_dir, path, conn, keys) = index(4);
    for n in 0..4 {
        keys.lock().save(&conn, "scope", &format!("key-{n}"), &answer(n, 1)).unwrap();
    }
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON idempotency_run BEGIN SELECT RAISE(FAIL, 'disk full'); END",
    )
    .unwrap();
    let retry = |keys: &Keys| {
        let index = keys.lock();
        let writing = index.writing.as_ref().expect("the run is still to be written");
        (writing.failures, writing.retry_at.unwrap().saturating_duration_since(Instant::now()))
    };
    keys.write_some(&conn);
    let (failures, wait) = retry(&keys);
    assert!(failures == 1 && wait > FIRST_RETRY / 2 && wait <= FIRST_RETRY, "{failures} {wait:?}");
    keys.lock().writing.as_mut().unwrap().retry_at = Some(Instant::now());
    keys.write_some(&conn);
    let (failures, wait) = retry(&keys);
    assert!(failures == 2 && wait > FIRST_RETRY && wait <= 2 * FIRST_RETRY, "{failures} {wait:?}");
    conn.execute_batch("DROP TRIGGER refuse").unwrap();
    keys.write_some(&conn);
    assert_eq!(retry(&keys).0, 2, "not tried again before its wait");
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 0);
    assert_eq!(keys.lock().find(&conn, "scope", "key-3").unwrap(), Some(answer(3, 1)), "found meanwhile");
    keys.lock().writing.as_mut().unwrap().retry_at = Some(Instant::now());
    keys.write_some(&conn);
    assert!(keys.lock().writing.is_none() && keys.lock().runs.len() == 1, "written whole");
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 4);
    assert_eq!(keys.lock().find(&conn, "scope", "key-0").unwrap(), Some(answer(0, 1)));
}

#[tokio::test]
async fn expired_keys_take_their_runs_with_them() {
    let (_dir, path) = database();
    let store = open(&path, 10);
    save(&store, 0..30, 1_000).await;
    wait_for_runs(&path, 3);
    save(&store, 30..35, 5_000).await;
    assert_eq!(store.prune_idempotency(2_000, 1_000).await.unwrap(), 30);
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_runs"), 0);
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 0);
    assert_eq!(found(&store, 3).await, None, "expired");
    assert_eq!(found(&store, 33).await, Some("answer 33".into()));
    // A key that expired may be used again.
    save(&store, 3..4, 6_000).await;
    assert_eq!(found(&store, 3).await, Some("answer 3".into()));
}

const EMPTY_FILTERS: &str = "SELECT count(*) FROM idempotency_runs WHERE length(filter) = 0";

#[tokio::test]
async fn eight_runs_share_one_filter_through_which_their_keys_are_found_until_they_expire() {
    let (_dir, path) = database();
    let store = open(&path, 10);
    save(&store, 0..100, 1_000).await;
    wait_for_runs(&path, 10);
    let group = "SELECT first_run || '-' || last_run FROM idempotency_groups";
    let groups: Vec<String> = Connection::open(&path)
        .unwrap()
        .prepare(group)
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(groups, ["1-8"]);
    assert_eq!(count(&path, EMPTY_FILTERS), 8, "the group's runs keep no filter of their own");
    all_found(&store, 0..100).await;
    assert_eq!(found(&store, 100).await, None);
    drop(store);
    let store = open(&path, 10);
    all_found(&store, 0..100).await;
    assert_eq!(found(&store, 100).await, None);
    save(&store, 100..105, 5_000).await;
    assert_eq!(store.prune_idempotency(2_000, 1_000).await.unwrap(), 100);
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_groups"), 0, "expired with its runs");
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 0);
    assert_eq!(found(&store, 5).await, None, "expired");
    all_found(&store, 100..105).await;
}

/// The group's row, its runs' emptied filters and its last run's rows commit together:
/// a group that cannot be written (a full disk, here a trigger) leaves its last run to
/// be written again, its keys found meanwhile, and nothing half-done.
#[test]
fn a_group_is_written_with_its_last_run_or_not_at_all_and_read_back_at_open() {
    let (_dir, path, conn, keys) = index(1);
    let key = |n: usize| format!("key-{n}");
    let save_and_write = |n: usize| {
        keys.lock().save(&conn, "scope", &key(n), &answer(n, 1)).unwrap();
        keys.write_some(&conn);
    };
    (0..GROUP - 1).for_each(save_and_write);
    conn.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON idempotency_groups BEGIN SELECT RAISE(FAIL, 'disk full'); END",
    )
    .unwrap();
    save_and_write(GROUP - 1);
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_runs"), GROUP as i64 - 1, "rolled back");
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), GROUP as i64 - 1);
    assert_eq!(count(&path, EMPTY_FILTERS), 0);
    assert_eq!(keys.lock().find(&conn, "scope", &key(GROUP - 1)).unwrap(), Some(answer(GROUP - 1, 1)));
    conn.execute_batch("DROP TRIGGER refuse").unwrap();
    keys.lock().writing.as_mut().unwrap().retry_at = Some(Instant::now());
    keys.write_some(&conn);
    assert_eq!(count(&path, "SELECT count(*) FROM idempotency_groups"), 1);
    assert_eq!(count(&path, EMPTY_FILTERS), GROUP as i64);
    drop(keys);
    let keys = Keys::load(&conn, 1).unwrap();
    let index = keys.lock();
    assert_eq!((index.groups.len(), index.runs.len()), (1, GROUP));
    assert!(index.runs.iter().all(|run| run.filter.is_none()), "the group's filter stands for theirs");
    for n in 0..GROUP {
        assert_eq!(index.find(&conn, "scope", &key(n)).unwrap(), Some(answer(n, 1)), "key {n}");
    }
    assert_eq!(index.find(&conn, "scope", &key(GROUP)).unwrap(), None);
}

#[test]
fn the_hash_separates_the_scope_from_the_key() {
    assert_ne!(hash("ab", "c"), hash("a", "bc"));
    assert_eq!(hash("a", "b"), hash("a", "b"));
}
