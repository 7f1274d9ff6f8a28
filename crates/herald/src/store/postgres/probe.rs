//! The work probe: whether claimable work is waiting in the database, asked every
//! `probe_interval` (10 ms by default) with one index-only statement; the answer wakes the
//! loader (`Signals::work`). Producers' outbox transactions (`herald.send_message`) cannot
//! notify without serializing their commits, so this is how an outbox message reaches a
//! worker within milliseconds; retries that came due are found the same way.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use crate::clock::now_ms;
use crate::store::Signals;
use crate::supervisor::{Liveness, spawn_task};

/// Starts the probe; it runs until the process stops (a panic fails it).
pub fn start(pool: Pool, signals: Signals, every: Duration, liveness: &Arc<Liveness>) {
    spawn_task(liveness, "the work probe", run(pool, signals, every));
}

async fn run(pool: Pool, signals: Signals, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // A failure (the database is away) is the loader's to report; the probe asks again.
        let Ok(client) = pool.get().await else { continue };
        let sql =
            "SELECT 1 FROM herald.delivery WHERE state = 0 AND owner IS NULL AND NOT strict AND next_at <= $1 LIMIT 1";
        let Ok(statement) = client.prepare_cached(sql).await else { continue };
        let waiting = client.query_opt(&statement, &[&now_ms()]).await;
        if matches!(waiting, Ok(Some(_))) {
            signals.work.notify_waiters();
        }
    }
}
