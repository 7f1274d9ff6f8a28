//! Periodic upkeep that is not on any request's path: forgetting idempotency keys once
//! their window has passed (in small batches, so the writer is never held for long), and
//! latency hours and summary minutes older than the 24-hour health window.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::store::Store;

/// Records deleted per transaction.
const BATCH: usize = 1000;
/// Latency and summary history kept (the rolling window, plus an hour of slack).
const HEALTH_HISTORY: Duration = Duration::from_secs(25 * 3600);

pub async fn run(store: Arc<dyn Store>, idempotency_ttl: Duration, every: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.cancelled() => return,
        }
        let before = now_ms() - idempotency_ttl.as_millis() as i64;
        loop {
            match store.prune_idempotency(before, BATCH).await {
                Ok(n) if n as usize == BATCH && !shutdown.is_cancelled() => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "pruning idempotency keys failed");
                    break;
                }
            }
        }
        if let Err(e) = store.prune_health(now_ms() - HEALTH_HISTORY.as_millis() as i64).await {
            tracing::warn!(error = %e, "pruning latency and summary history failed");
        }
    }
}
