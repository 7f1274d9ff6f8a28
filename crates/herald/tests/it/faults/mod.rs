//! The fault-injection suite: Herald as real processes on each backend, under a seeded
//! schedule of crashes, pauses, database restarts, locks, hostile receivers and
//! idempotency storms, then the invariants of `invariants.rs`. The CI runs are part of
//! the test command; the long run is opt-in (see docs/testing.md).

mod harness;
mod invariants;
mod proxy;
mod schedule;

use std::time::Duration;

use harness::{Plan, run};
use invariants::{check, save};

use crate::support::server::Backend;

/// Runs one plan and fails loudly, with its seed, unless every invariant held.
async fn prove(plan: Plan) {
    let report = try_plan(plan).await;
    assert!(
        report.passed(),
        "invariants broken — {}, reproduce with HERALD_FAULT_SEED={}\n{:#?}",
        report.reproduce(),
        report.seed,
        report.violations
    );
}

/// Runs one plan and saves and prints its report.
async fn try_plan(plan: Plan) -> invariants::Report {
    let report = check(run(plan).await).await;
    let path = save(&report);
    eprintln!("{}\nreport: {}", report.summary(), path.display());
    report
}

fn seed() -> u64 {
    std::env::var("HERALD_FAULT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_on_sqlite_under_faults() {
    prove(Plan { backend: Backend::Sqlite, seed: seed(), messages: 2000, fault_time: Duration::from_secs(60) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_lost_on_postgres_under_faults() {
    prove(Plan { backend: Backend::Postgres, seed: seed(), messages: 2000, fault_time: Duration::from_secs(60) }).await;
}

/// The long run: 20,000 messages × 3 endpoints, 300 s of faults, five seeds per backend
/// (`HERALD_FAULT_SEEDS=1,2`, `HERALD_FAULT_BACKENDS=sqlite|postgres` to narrow it).
/// `scripts/faults-long.sh` runs it; reports land in test-artifacts/.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long fault run (about an hour); scripts/faults-long.sh"]
async fn long_fault_run() {
    let seeds: Vec<u64> = match std::env::var("HERALD_FAULT_SEEDS") {
        Ok(list) => list.split(',').filter_map(|s| s.trim().parse().ok()).collect(),
        Err(_) => (0..5).map(|_| rand::random()).collect(),
    };
    let backends = match std::env::var("HERALD_FAULT_BACKENDS").as_deref() {
        Ok("sqlite") => vec![Backend::Sqlite],
        Ok("postgres") => vec![Backend::Postgres],
        _ => vec![Backend::Sqlite, Backend::Postgres],
    };
    let mut failed = Vec::new();
    for backend in backends {
        for &seed in &seeds {
            let report = try_plan(Plan { backend, seed, messages: 20_000, fault_time: Duration::from_secs(300) }).await;
            if !report.passed() {
                failed.push(format!("{}: {:?}", report.reproduce(), report.violations));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "invariants broken in {} runs (reproduce with HERALD_FAULT_SEEDS and HERALD_FAULT_BACKENDS):\n{}",
        failed.len(),
        failed.join("\n")
    );
}
