//! Claims work from the store into memory: at start-up (everything a previous process
//! left), whenever the poll interval passes (retries that came due), and when poked (manual
//! requeues, memory freed). Claims are batched and bounded by the free room in memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio_util::sync::CancellationToken;

use super::{Dispatcher, Job};
use crate::clock::now_ms;
use crate::store::{ClaimedDelivery, NextState, OutcomeRecord, StoreError, keep_trying};

/// Most deliveries claimed in one store call.
const CLAIM_BATCH: usize = 1000;

pub async fn run(dispatcher: Arc<Dispatcher>, shutdown: CancellationToken) {
    let interval = dispatcher.config.queue.poll_interval;
    let elsewhere = dispatcher.store.signals().work.clone();
    loop {
        if let Err(e) = load_available(&dispatcher).await {
            dispatcher.work_in_store.store(true, Ordering::Release);
            tracing::warn!(error = %e, "claiming work from the store failed; will retry");
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = dispatcher.wake_loader.notified() => {}
            // Another process committed claimable work (PostgreSQL NOTIFY).
            _ = elsewhere.notified() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Claims due work until memory is full or nothing claimable is left: the heads of strictly
/// ordered endpoints first, then everything else.
async fn load_available(dispatcher: &Dispatcher) -> Result<(), StoreError> {
    let horizon = dispatcher.config.queue.retry_horizon.as_millis() as i64;
    // Cleared before claiming, so work stored meanwhile sets it again; set again whenever
    // this pass stops before the store is drained.
    dispatcher.work_in_store.store(false, Ordering::Release);
    let mut heads = true;
    loop {
        let batch = dispatcher.room.free().min(CLAIM_BATCH);
        if batch == 0 || !dispatcher.try_reserve(batch) {
            // (`try_reserve` also refuses while this process is not registered.)
            dispatcher.work_in_store.store(true, Ordering::Release);
            return Ok(());
        }
        let now = now_ms();
        let owner = dispatcher.owner();
        let claimed = if heads {
            dispatcher.store.claim_heads(&owner, now + horizon, batch).await
        } else {
            dispatcher.store.claim(&owner, now + horizon, batch).await
        };
        let claimed = match claimed {
            Ok(claimed) => claimed,
            Err(e) => {
                dispatcher.room.release(batch);
                return Err(e);
            }
        };
        let got = claimed.len();
        dispatcher.room.release(batch - got);
        let jobs = with_targets(dispatcher, &owner, claimed).await?;
        dispatcher.hold(jobs.into_iter().map(|c| (c.job, c.due)));
        if got > 0 {
            tracing::debug!(claimed = got, heads, "claimed deliveries from the store");
        }
        if got < batch {
            if !heads {
                return Ok(());
            }
            heads = false;
        }
    }
}

struct Claimed {
    job: Job,
    due: crate::clock::Millis,
}

/// Attaches each claimed delivery's endpoint; deliveries of deleted endpoints are cancelled
/// on the spot (and leave memory).
async fn with_targets(
    dispatcher: &Dispatcher,
    owner: &Arc<str>,
    claimed: Vec<ClaimedDelivery>,
) -> Result<Vec<Claimed>, StoreError> {
    let mut targets = HashMap::new();
    let mut jobs = Vec::with_capacity(claimed.len());
    let mut cancelled = vec![];
    for delivery in claimed {
        if !targets.contains_key(&delivery.endpoint_id) {
            let endpoint = &delivery.endpoint_id;
            let target =
                keep_trying("reading a claimed delivery's endpoint", || dispatcher.catalog.target(endpoint)).await?;
            targets.insert(delivery.endpoint_id.clone(), target);
        }
        match targets[&delivery.endpoint_id].clone() {
            Some(target) => {
                let due = delivery.next_at;
                jobs.push(Claimed { job: Job::from_claim(delivery, target, owner.clone()), due });
            }
            None => cancelled.push(OutcomeRecord {
                delivery_id: delivery.delivery_id,
                message_created_at: delivery.message.created_at,
                attempt: None,
                attempts: delivery.attempts,
                next: NextState::Canceled,
            }),
        }
    }
    if !cancelled.is_empty() {
        let n = cancelled.len();
        let cancel = || dispatcher.store.record_outcomes(owner, cancelled.clone());
        keep_trying("cancelling deliveries of deleted endpoints", cancel).await?;
        dispatcher.room.release(n);
    }
    Ok(jobs)
}
