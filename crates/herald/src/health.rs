//! Endpoint health as every process sees it: the circuit breakers and latency histograms
//! saved in the store, merged with this process's live, not yet saved ones. Read by the
//! health API, the metrics, the dashboard and the alerts.

use std::collections::HashMap;

use crate::breaker::Breaker;
use crate::clock::Millis;
use crate::dispatch::Dispatcher;
use crate::ids::EndpointId;
use crate::latency::{Histogram, WINDOW_HOURS, hour_of};
use crate::store::{HealthStore, StoreResult};

/// Circuit breakers: the saved ones (every process's last transition), overridden by this
/// process's live ones.
pub async fn breakers(
    store: &dyn HealthStore,
    dispatcher: &Dispatcher,
    only: Option<&EndpointId>,
) -> StoreResult<HashMap<EndpointId, Breaker>> {
    let mut all: HashMap<EndpointId, Breaker> = store.breakers().await?.into_iter().collect();
    match only {
        Some(endpoint) => {
            if let Some(live) = dispatcher.breaker(endpoint).await {
                all.insert(endpoint.clone(), live);
            }
        }
        None => all.extend(dispatcher.breakers().await),
    }
    Ok(all)
}

/// Latency histograms over the last 24 hours: what every process flushed to the store, plus
/// what this process has not flushed yet.
pub async fn latency(
    store: &dyn HealthStore,
    dispatcher: &Dispatcher,
    only: Option<&[EndpointId]>,
    now: Millis,
) -> StoreResult<HashMap<EndpointId, Histogram>> {
    let since = hour_of(now) - WINDOW_HOURS + 1;
    let mut merged: HashMap<EndpointId, Histogram> = HashMap::new();
    for (endpoint, _, histogram) in store.latency_since(since, only).await? {
        merged.entry(endpoint).or_default().merge(&histogram);
    }
    for (endpoint, histogram) in dispatcher.latency().unflushed(only, now) {
        merged.entry(endpoint).or_default().merge(&histogram);
    }
    Ok(merged)
}
