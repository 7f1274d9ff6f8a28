//! Periodic upkeep that is not on any request's path: forgetting idempotency keys once
//! their window has passed, expired dashboard sessions, the health history (latency hours,
//! endpoint hours and summary minutes) older than the charts' seven days, and the retention purges of payloads, response bodies and attempts —
//! all in small batches, so the writer is never held for long and delivery goes on.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::config::RetentionConfig;
use crate::store::{AccessStore, EndSessions, Purge, Store};

/// Records deleted per transaction.
const BATCH: usize = 1000;
/// Health history kept: the charts' seven days, plus an hour of slack.
const HEALTH_HISTORY: Duration = Duration::from_secs((7 * 24 + 1) * 3600);

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
        if let Err(e) = store.end_sessions(EndSessions::ExpiredBefore(now_ms())).await {
            tracing::warn!(error = %e, "removing expired dashboard sessions failed");
        }
        if let Err(e) = store.prune_health(now_ms() - HEALTH_HISTORY.as_millis() as i64).await {
            tracing::warn!(error = %e, "pruning latency and summary history failed");
        }
    }
}

/// Purges what the retention settings say is too old, every `retention.interval`.
pub async fn retention(store: Arc<dyn AccessStore>, retention: RetentionConfig, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(retention.interval) => {}
            _ = shutdown.cancelled() => return,
        }
        let rules = [
            (Purge::Payloads, retention.payloads),
            (Purge::Responses, retention.responses),
            (Purge::Attempts, retention.attempts),
        ];
        for (what, keep) in rules {
            let Some(keep) = keep else { continue };
            let before = now_ms() - keep.as_millis() as i64;
            let mut purged = 0;
            loop {
                match store.purge(what, before, retention.batch).await {
                    Ok(n) => {
                        purged += n;
                        if (n as usize) < retention.batch || shutdown.is_cancelled() {
                            break;
                        }
                        // Let deliveries' writes in between batches.
                        tokio::task::yield_now().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, ?what, "retention purge failed; trying again next interval");
                        break;
                    }
                }
            }
            if purged > 0 {
                tracing::info!(?what, purged, "retention purge");
            }
        }
    }
}
