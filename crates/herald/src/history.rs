//! The history the dashboard's charts draw. What the store keeps for seven days is read
//! back here: attempts per endpoint and hour (succeeded, failed), latency histograms per
//! endpoint and hour, and per-minute totals (accepted, delivered, failed, dead-lettered,
//! the queue's depth). Every series has one point per period, quiet periods included, so a
//! chart's x axis is time, not "the hours that had traffic".
//!
//! Most of it is written with the outcomes that make it; the [`Recorder`] of each process
//! adds what is not: the messages it accepted (flushed every second) and a sample of the
//! queue's depth once a minute.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::{Millis, now_ms};
use crate::ids::EndpointId;
use crate::latency::{Histogram, LatencySummary, hour_of};
use crate::store::{HistoryStore, MinuteTotals, Store, StoreResult};

pub const HOUR_MS: Millis = 3_600_000;
pub const MINUTE_MS: Millis = 60_000;

/// One hour of one endpoint, or of several summed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HourPoint {
    /// When the hour starts.
    pub start: Millis,
    pub succeeded: u64,
    pub failed: u64,
    /// Percentiles of the hour's attempt durations (merged histograms when summed).
    pub latency: LatencySummary,
}

/// The last `hours` hours (the current one included) of these endpoints, summed.
pub async fn endpoint_hours(
    store: &dyn Store,
    endpoints: &[EndpointId],
    hours: i64,
    now: Millis,
) -> StoreResult<Vec<HourPoint>> {
    let first = hour_of(now) - hours + 1;
    let mut counts: BTreeMap<i64, (u64, u64)> = BTreeMap::new();
    for (_, hour, c) in store.endpoint_hours(first, endpoints).await? {
        let slot = counts.entry(hour).or_default();
        slot.0 += c.succeeded.max(0) as u64;
        slot.1 += c.failed.max(0) as u64;
    }
    let mut latency: BTreeMap<i64, Histogram> = BTreeMap::new();
    for (_, hour, histogram) in store.latency_since(first, Some(endpoints)).await? {
        latency.entry(hour).or_default().merge(&histogram);
    }
    Ok((first..=hour_of(now))
        .map(|hour| {
            let (succeeded, failed) = counts.get(&hour).copied().unwrap_or_default();
            let latency = latency.get(&hour).map(Histogram::summary).unwrap_or_default();
            HourPoint { start: hour * HOUR_MS, succeeded, failed, latency }
        })
        .collect())
}

/// One period of the whole server: a minute, or an hour of minutes summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub start: Millis,
    pub accepted: u64,
    pub delivered: u64,
    /// Failed attempts.
    pub failed: u64,
    pub dead: u64,
    /// The queue's deepest sample in the period (waiting for a first attempt, for a
    /// retry), if one was taken.
    pub queue: Option<(u64, u64)>,
}

impl Totals {
    fn add(&mut self, m: &MinuteTotals) {
        self.accepted += m.accepted;
        self.delivered += m.delivered;
        self.failed += m.failed;
        self.dead += m.dead;
        self.queue = match (self.queue, m.queue) {
            (Some(a), Some(b)) if a.0 + a.1 >= b.0 + b.1 => Some(a),
            (a, b) => b.or(a),
        };
    }
}

/// The server's totals over the last `periods` periods of `period_ms` (a minute or an
/// hour), the current one included.
pub async fn totals(
    store: &dyn HistoryStore,
    period_ms: Millis,
    periods: i64,
    now: Millis,
) -> StoreResult<Vec<Totals>> {
    let current = now.div_euclid(period_ms);
    let first = current - periods + 1;
    let mut sums: BTreeMap<i64, Totals> = BTreeMap::new();
    for minute in store.minute_totals(first * period_ms / MINUTE_MS).await? {
        sums.entry((minute.minute * MINUTE_MS).div_euclid(period_ms)).or_default().add(&minute);
    }
    Ok((first..=current)
        .map(|period| Totals { start: period * period_ms, ..sums.get(&period).copied().unwrap_or_default() })
        .collect())
}

/// A process's share of the history that no outcome writes: messages accepted, counted per
/// minute in memory and added to the store's totals every second, and the queue's depth,
/// sampled once a minute.
#[derive(Default)]
pub struct Recorder {
    accepted: Mutex<BTreeMap<i64, u64>>,
}

/// How often the accepted counts are added to the store's.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

impl Recorder {
    /// Counts one message accepted at `now`.
    pub fn accepted(&self, now: Millis) {
        *lock(&self.accepted).entry(now.div_euclid(MINUTE_MS)).or_default() += 1;
    }

    /// Adds the counts to the store's; kept for next time if the store fails.
    async fn flush(&self, store: &dyn HistoryStore) {
        let taken = std::mem::take(&mut *lock(&self.accepted));
        if taken.is_empty() {
            return;
        }
        if let Err(e) = store.add_accepted(taken.clone().into_iter().collect()).await {
            tracing::warn!(error = %e, "adding the accepted counts failed; will retry");
            let mut accepted = lock(&self.accepted);
            for (minute, count) in taken {
                *accepted.entry(minute).or_default() += count;
            }
        }
    }

    /// Samples the queue's depth into the current minute.
    async fn sample(store: &dyn Store) {
        let now = now_ms();
        let sampled = match store.summary(now).await {
            Ok(s) => store.sample_queue(now.div_euclid(MINUTE_MS), s.pending, s.awaiting_retry).await,
            Err(e) => Err(e),
        };
        if let Err(e) = sampled {
            tracing::warn!(error = %e, "sampling the queue's depth failed");
        }
    }

    /// Flushes every second and samples every minute until `stop`, then flushes once more.
    pub async fn run(self: Arc<Self>, store: Arc<dyn Store>, stop: CancellationToken) {
        let mut sampled_minute = None;
        loop {
            let minute = now_ms().div_euclid(MINUTE_MS);
            if sampled_minute != Some(minute) {
                Self::sample(&*store).await;
                sampled_minute = Some(minute);
            }
            tokio::select! {
                _ = tokio::time::sleep(FLUSH_EVERY) => self.flush(&*store).await,
                _ = stop.cancelled() => return self.flush(&*store).await,
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_keeps_its_deepest_queue_sample() {
        let minute = |queue| MinuteTotals { minute: 0, accepted: 1, delivered: 0, failed: 0, dead: 0, queue };
        let mut t = Totals::default();
        t.add(&minute(None));
        assert_eq!(t.queue, None);
        t.add(&minute(Some((5, 1))));
        t.add(&minute(Some((2, 2))));
        t.add(&minute(None));
        assert_eq!((t.queue, t.accepted), (Some((5, 1)), 4));
        t.add(&minute(Some((0, 9))));
        assert_eq!(t.queue, Some((0, 9)));
    }
}
