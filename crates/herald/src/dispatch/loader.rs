//! Claims work from the store into memory: at start-up (everything a previous process
//! left), whenever the poll interval passes (retries that came due), and when poked (manual
//! requeues, memory freed). Claims are batched and bounded by the free room in memory.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Dispatcher, Job};
use crate::clock::now_ms;

/// Most deliveries claimed in one store call.
const CLAIM_BATCH: usize = 1000;

pub async fn run(dispatcher: Arc<Dispatcher>, shutdown: CancellationToken) {
    let interval = dispatcher.config.queue.poll_interval;
    let elsewhere = dispatcher.store.signals().work.clone();
    loop {
        if let Err(e) = load_available(&dispatcher).await {
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

/// On a shared store: renews this process's lease, and releases the deliveries of processes
/// whose lease expired (every process does it; it is idempotent).
pub async fn keep_lease(dispatcher: Arc<Dispatcher>, shutdown: CancellationToken) {
    if !dispatcher.store.shared() {
        return;
    }
    let lease = dispatcher.config.lease;
    let mut beat = tokio::time::interval(lease / 4);
    beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = beat.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        match dispatcher.store.heartbeat(&dispatcher.owner()).await {
            Ok(true) => {}
            Ok(false) => dispatcher.forfeit().await,
            Err(e) => tracing::warn!(error = %e, "renewing the lease failed; will retry"),
        }
        if let Err(e) = dispatcher.store.reap_expired(lease).await {
            tracing::warn!(error = %e, "releasing expired leases failed; will retry");
        }
    }
}

/// Claims due work until memory is full or nothing claimable is left.
async fn load_available(dispatcher: &Dispatcher) -> Result<(), crate::store::StoreError> {
    let horizon = dispatcher.config.queue.retry_horizon.as_millis() as i64;
    loop {
        let batch = dispatcher.lanes().free().min(CLAIM_BATCH);
        if batch == 0 || !dispatcher.try_reserve(batch) {
            return Ok(());
        }
        let now = now_ms();
        let claimed = match dispatcher.store.claim(&dispatcher.owner(), now + horizon, batch).await {
            Ok(claimed) => claimed,
            Err(e) => {
                dispatcher.lanes().forget(batch);
                return Err(e);
            }
        };
        let got = claimed.len();
        {
            let mut lanes = dispatcher.lanes();
            lanes.forget(batch - got);
            for delivery in claimed {
                let due = delivery.next_at;
                let job = Job::from(delivery);
                if due <= now { lanes.add_ready(job) } else { lanes.add_timer(job, due) }
            }
        }
        if got > 0 {
            tracing::debug!(claimed = got, "claimed deliveries from the store");
            dispatcher.wake_pump.notify_one();
        }
        if got < batch {
            return Ok(());
        }
    }
}
