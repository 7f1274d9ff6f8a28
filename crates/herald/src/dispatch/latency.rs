//! Every attempt's duration, per endpoint: a local rolling window (which tells the circuit
//! breaker whether an endpoint is slow) and the counts not yet flushed to the store, where
//! every process's histograms are merged for the health API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::{Millis, now_ms};
use crate::ids::EndpointId;
use crate::latency::{Histogram, WINDOW_HOURS, Window, hour_of};
use crate::store::HealthStore;

#[derive(Default)]
pub struct Tracker {
    windows: Mutex<HashMap<EndpointId, Local>>,
    unflushed: Mutex<HashMap<EndpointId, Window>>,
}

/// This process's window of one endpoint, and whether it was slow when last looked at.
#[derive(Default)]
struct Local {
    window: Window,
    slow: bool,
    checked_at: Millis,
}

/// How often an endpoint's slowness is recomputed (merging 24 hours of buckets is not free,
/// and the answer moves slowly).
const SLOW_RECHECK_MS: Millis = 1000;

/// The entry of `key`, cloning the key only when it is new.
fn entry<'a, T: Default>(map: &'a mut HashMap<EndpointId, T>, key: &EndpointId) -> &'a mut T {
    if !map.contains_key(key) {
        map.insert(key.clone(), T::default());
    }
    map.get_mut(key).expect("just inserted")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tracker {
    /// Records an attempt's duration; returns whether the endpoint is slow (p95 above 5 s
    /// with enough samples, as this process has seen it lately).
    pub fn record(&self, endpoint: &EndpointId, now: Millis, ms: f64) -> bool {
        entry(&mut lock(&self.unflushed), endpoint).record(now, ms);
        let mut windows = lock(&self.windows);
        let local = entry(&mut windows, endpoint);
        local.window.record(now, ms);
        if now - local.checked_at >= SLOW_RECHECK_MS {
            local.slow = local.window.merged(now).summary().slow;
            local.checked_at = now;
        }
        local.slow
    }

    /// Counts recorded here but not yet in the store (so readers see them at once).
    pub fn unflushed(&self, endpoints: Option<&[EndpointId]>, now: Millis) -> HashMap<EndpointId, Histogram> {
        lock(&self.unflushed)
            .iter()
            .filter(|(id, _)| endpoints.is_none_or(|wanted| wanted.contains(id)))
            .map(|(id, w)| (id.clone(), w.merged(now)))
            .collect()
    }

    /// The endpoint is gone: its window and its counts not yet flushed go with it.
    pub fn forget(&self, endpoint: &EndpointId) {
        lock(&self.windows).remove(endpoint);
        lock(&self.unflushed).remove(endpoint);
    }

    /// Seeds the local windows from the store (start-up).
    pub async fn load(&self, store: &dyn HealthStore) {
        let since = hour_of(now_ms()) - WINDOW_HOURS + 1;
        match store.latency_since(since, None).await {
            Ok(rows) => {
                let mut windows = lock(&self.windows);
                for (endpoint, hour, histogram) in rows {
                    windows.entry(endpoint).or_default().window.add(hour, &histogram);
                }
            }
            Err(e) => tracing::warn!(error = %e, "loading latency history failed"),
        }
    }

    /// Writes the unflushed counts to the store; on failure they are kept for next time.
    pub async fn flush(&self, store: &dyn HealthStore) {
        let taken: Vec<(EndpointId, i64, Histogram)> = lock(&self.unflushed)
            .drain()
            .flat_map(|(endpoint, mut window)| {
                window.take().into_iter().map(move |(hour, h)| (endpoint.clone(), hour, h))
            })
            .collect();
        if taken.is_empty() {
            return;
        }
        if let Err(e) = store.merge_latency(taken.clone()).await {
            tracing::warn!(error = %e, "flushing latency histograms failed; will retry");
            let mut unflushed = lock(&self.unflushed);
            for (endpoint, hour, histogram) in taken {
                unflushed.entry(endpoint).or_default().add(hour, &histogram);
            }
        }
    }
}

/// Flushes every `every` until `stop`, and once more at the end.
pub async fn run(tracker: Arc<Tracker>, store: Arc<dyn HealthStore>, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => tracker.flush(store.as_ref()).await,
            _ = stop.cancelled() => {
                tracker.flush(store.as_ref()).await;
                return;
            }
        }
    }
}
