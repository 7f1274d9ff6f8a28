//! What a keyed message's lookup costs once SQLite's key index is full (`--scenario
//! key-index`). At 1,000 keyed messages a second over the 12-hour TTL the index holds about
//! 43 million keys; a bench run of seconds never builds that. Here the store's own index is
//! built at that size: `--key-runs` runs of `--run-keys` keys (default 80 × 524,288, the
//! default run size) are kept as records the way a version-11 database held them, and the
//! store's open writes them as runs by its own code. Then a lookup of a key not kept (every
//! new message's) and of a key kept (a replay) are timed through the index's own `find`, on
//! a connection set up as the writer's. No server. About 2.5 minutes and 4 GB of disk at
//! the defaults.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use herald::config::Config;
use herald::store::sqlite::SqliteStore;
use herald::store::sqlite::keys::{self, Keys};
use rusqlite::{Connection, params};
use serde::Serialize;

use super::BenchArgs;
use super::probe::ProcessSample;
use super::scripts;

/// The scope every record is kept under (a caller, a method and a path).
const SCOPE: &str = "admin\nPOST /api/v1/app/app_bench/msg";
/// Lookups timed per kind.
const LOOKUPS: usize = 200_000;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyIndexReport {
    scenario: &'static str,
    runs: usize,
    keys: usize,
    /// Building the records and opening the store over them (which writes the runs).
    build_secs: f64,
    /// What the open added to this process's resident memory: the filters, mostly.
    index_rss_mb: f64,
    /// The database and its log on disk once built.
    database_mb: f64,
    /// A key's hash alone, which every lookup pays first.
    hash_us: f64,
    /// A key not kept: every new keyed message.
    miss_us: f64,
    /// A key kept, found in a run: a replay.
    hit_us: f64,
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("herald.db");
    let started = Instant::now();
    let total = args.key_runs * args.run_keys;
    eprintln!("keeping {total} records, then opening the store over them (its open writes the runs)");
    keep_records(&path, total)?;
    let before = rss_mb();
    let conn = writer_connection(&path)?;
    let index = Keys::load(&conn, args.run_keys).context("loading the key index")?;
    let index_rss_mb = rss_mb() - before;
    let build_secs = started.elapsed().as_secs_f64();
    let database_mb = ["herald.db", "herald.db-wal"]
        .iter()
        .filter_map(|name| std::fs::metadata(dir.path().join(name)).ok())
        .map(|m| m.len() as f64 / 1e6)
        .sum();

    let absent: Vec<String> = (0..LOOKUPS).map(|i| format!("absent-{i}")).collect();
    let kept: Vec<String> = (0..LOOKUPS).map(|i| key(i * (total / LOOKUPS).max(1) % total)).collect();
    let hash_us = per(LOOKUPS, || {
        for k in &absent {
            std::hint::black_box(keys::hash(SCOPE, k));
        }
    });
    let index = index.lock();
    let miss_us = per(LOOKUPS, || {
        for k in &absent {
            assert!(index.find(&conn, SCOPE, k).expect("a lookup").is_none(), "{k} was never kept");
        }
    });
    let hit_us = per(LOOKUPS, || {
        for k in &kept {
            assert!(index.find(&conn, SCOPE, k).expect("a lookup").is_some(), "{k} is kept");
        }
    });
    let report = KeyIndexReport {
        scenario: "key-index",
        runs: args.key_runs,
        keys: total,
        build_secs,
        index_rss_mb,
        database_mb,
        hash_us,
        miss_us,
        hit_us,
    };
    println!(
        "{} runs of {} keys (built in {build_secs:.0} s, index {index_rss_mb:.0} MB resident, \
         database {database_mb:.0} MB): \
         a new key {miss_us:.2} µs, a replay {hit_us:.2} µs, of which the hash {hash_us:.2} µs",
        args.key_runs, args.run_keys
    );
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

fn key(n: usize) -> String {
    format!("key-{n}")
}

/// Creates the database with the store's schema, then keeps `total` records in it directly,
/// without runs: as a database from before the runs held them.
fn keep_records(path: &Path, total: usize) -> anyhow::Result<()> {
    let mut config = Config::defaults().store;
    config.idempotency_run_keys = usize::MAX; // the store opened here writes no run
    drop(SqliteStore::open(path, &config, &Arc::default())?);
    let conn = writer_connection(path)?;
    conn.execute_batch("PRAGMA synchronous = OFF")?;
    for start in (0..total).step_by(1 << 20) {
        conn.execute_batch("BEGIN")?;
        let mut insert = conn.prepare_cached(
            "INSERT INTO idempotency (seq, scope, key, status, body, created_at) VALUES (?, ?, ?, 202, '{}', 0)",
        )?;
        for n in start..total.min(start + (1 << 20)) {
            insert.execute(params![n as i64 + 1, SCOPE, key(n)])?;
        }
        conn.execute_batch("COMMIT")?;
    }
    Ok(())
}

/// A connection set up as the store's writer's.
fn writer_connection(path: &Path) -> anyhow::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA cache_size = -32768;")?;
    Ok(conn)
}

/// Microseconds per one of `n` operations that `f` performs.
fn per(n: usize, f: impl FnOnce()) -> f64 {
    let started = Instant::now();
    f();
    scripts::per(started.elapsed(), n)
}

fn rss_mb() -> f64 {
    ProcessSample::read(std::process::id()).map_or(0.0, |s| s.rss as f64 / 1e6)
}
