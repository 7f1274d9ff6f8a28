//! Recording outcomes in batches. Attempts hand their outcome here and move on; one task
//! writes everything that is waiting in a single store call (only while this process still
//! holds each delivery), then schedules the retries that stay in memory and lets the rest
//! go. Outcomes are off the latency path, so the batches can be generous.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Dispatcher, Job};
use crate::endpoint_settings::Ordering;
use crate::store::{NextState, OutcomeRecord, Recorded, Trigger};

/// Most outcomes written in one store call.
const BATCH_MAX: usize = 1024;
/// How long an outcome may wait for others to join its batch. Each store call is a commit
/// that rewrites the right edge of the attempt tables and their indexes, whatever it
/// carries: 25 ms instead of 5 cut the bytes written per message by about a tenth on
/// both backends (BENCHMARKS.md, issue 35). Nothing waits on it but the attempt's row.
const LINGER: Duration = Duration::from_millis(25);
/// Waits between tries while the store is unreachable; the last one repeats until the store
/// answers or the dispatcher stops. An outcome is never dropped while the process runs
/// (dropping it would strand the delivery under this process's claim until a restart).
/// The waits stay short: until its outcome is written a delivery is neither retried nor
/// settled, so a long wait would outlast the outage it rides out.
const RETRY_DELAYS_MS: &[u64] = &[50, 200, 500, 1000];

/// An attempt's outcome waiting to be recorded, with its job.
pub struct Pending {
    pub job: Job,
    pub record: OutcomeRecord,
}

pub type Sender = mpsc::UnboundedSender<Pending>;
pub type Receiver = mpsc::UnboundedReceiver<Pending>;

pub fn channel() -> (Sender, Receiver) {
    mpsc::unbounded_channel()
}

/// Writes outcomes until `stop` is cancelled and nothing is left waiting.
pub async fn run(dispatcher: Arc<Dispatcher>, mut rx: Receiver, stop: CancellationToken) {
    let mut batch = Vec::with_capacity(BATCH_MAX);
    loop {
        let first = tokio::select! {
            first = rx.recv() => first,
            _ = stop.cancelled() => rx.try_recv().ok(),
        };
        let Some(first) = first else { return };
        batch.push(first);
        let deadline = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH_MAX {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(pending)) => batch.push(pending),
                _ => break,
            }
        }
        write(&dispatcher, &mut batch, &stop).await;
    }
}

/// Records a batch, each outcome under the owner name its delivery was claimed under (an
/// attempt begun before a lost lease must not land on the claim that replaced it), then
/// keeps the in-memory retries and lets the rest go.
async fn write(dispatcher: &Dispatcher, batch: &mut Vec<Pending>, stop: &CancellationToken) {
    let mut applied = vec![Recorded::ClaimLost; batch.len()];
    let strict_done = batch.iter().any(|p| p.job.target.settings.ordering == Ordering::Strict);
    let mut owners: Vec<Arc<str>> = batch.iter().map(|p| p.job.owner.clone()).collect();
    owners.sort_unstable();
    owners.dedup();
    for owner in owners {
        let (at, records): (Vec<usize>, Vec<OutcomeRecord>) =
            batch.iter().enumerate().filter(|(_, p)| p.job.owner == owner).map(|(i, p)| (i, p.record.clone())).unzip();
        for (i, ok) in at.into_iter().zip(record(dispatcher, &owner, records, stop).await) {
            applied[i] = ok;
        }
    }
    let mut kept = Vec::new();
    let mut released = 0;
    let mut resent = false;
    for (Pending { mut job, record }, applied) in batch.drain(..).zip(applied) {
        match (applied, record.next) {
            (Recorded::Applied, NextState::Retry { at, keep: true }) => {
                job.attempts = record.attempts;
                if dispatcher.is_gone(&job.endpoint_id) {
                    // Deleted while this attempt was on the wire: cancelled now, not
                    // counted as awaiting a retry until its time comes.
                    dispatcher.conclude(job, NextState::Canceled, None);
                    continue;
                }
                job.trigger = Trigger::Scheduled;
                job.ready_at = at;
                kept.push((job, at));
            }
            (applied, _) => {
                match applied {
                    Recorded::ClaimLost => tracing::info!(
                        delivery = record.delivery_id,
                        msg = %job.message.id,
                        endpoint = %job.endpoint_id,
                        "claim lost; outcome not recorded"
                    ),
                    Recorded::Resent => resent = true,
                    Recorded::Applied => {}
                }
                released += 1;
            }
        }
    }
    dispatcher.room.release(released);
    dispatcher.hold(kept);
    if strict_done || resent {
        // A resend waits in the store, as does the next message of a strictly ordered
        // endpoint.
        dispatcher.poke();
    } else {
        dispatcher.room_freed();
    }
}

/// Writes outcomes under one owner name, trying until the store answers (or, once stopping,
/// giving up); what became of each.
async fn record(
    dispatcher: &Dispatcher,
    owner: &str,
    records: Vec<OutcomeRecord>,
    stop: &CancellationToken,
) -> Vec<Recorded> {
    let mut delays = RETRY_DELAYS_MS.iter().copied();
    let mut delay = 0;
    loop {
        match dispatcher.store.record_outcomes(owner, records.clone()).await {
            Ok(applied) => return applied,
            // Stopping: the claims are dropped at the next start and the deliveries retried.
            Err(e) if stop.is_cancelled() => {
                tracing::error!(error = %e, outcomes = records.len(), "outcomes not recorded at shutdown");
                return vec![Recorded::ClaimLost; records.len()];
            }
            Err(e) => {
                delay = delays.next().unwrap_or(delay);
                tracing::warn!(error = %e, outcomes = records.len(), "recording outcomes failed; retrying");
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
        }
    }
}
