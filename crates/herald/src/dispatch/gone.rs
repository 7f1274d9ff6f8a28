//! Forgetting an endpoint that was deleted: its waiting deliveries are cancelled at once
//! (none stays counted as pending, parked behind a breaker that will never judge again),
//! and everything this process kept for it goes: its circuit breaker (here and in the
//! store), its latency window, its metrics series, its OAuth2 token. Memory follows the
//! endpoints that exist, not every endpoint that ever did.
//!
//! The process that served the deletion acts at once; the others when the store announces
//! the change (`resume`'s follower) and find the endpoint gone.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Dispatcher;
use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, EndpointId};
use crate::store::NextState;

/// How long a deleted endpoint is remembered: longer than any attempt can be on the wire.
const REMEMBERED_MS: Millis = 15 * 60 * 1000;
/// Deleted endpoints remembered at most (the oldest are forgotten first).
const REMEMBERED: usize = 4096;

/// Endpoints deleted lately, so that the outcome of an attempt that was on the wire when
/// its endpoint went is not kept for a retry (see `outcomes`).
#[derive(Default)]
pub(super) struct Gone(Mutex<HashMap<EndpointId, Millis>>);

impl Gone {
    fn remember(&self, endpoint: &EndpointId, now: Millis) {
        let mut gone = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if gone.len() >= REMEMBERED {
            gone.retain(|_, at| now - *at < REMEMBERED_MS);
            if gone.len() >= REMEMBERED {
                let oldest = gone.iter().min_by_key(|(_, at)| **at).map(|(id, _)| id.clone());
                oldest.map(|id| gone.remove(&id));
            }
        }
        gone.insert(endpoint.clone(), now);
    }

    fn contains(&self, endpoint: &EndpointId) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).contains_key(endpoint)
    }
}

impl Dispatcher {
    /// Whether `endpoint` was deleted lately.
    pub(super) fn is_gone(&self, endpoint: &EndpointId) -> bool {
        self.gone.contains(endpoint)
    }

    /// `endpoint` no longer exists.
    pub(super) async fn endpoint_gone(&self, endpoint: &EndpointId) {
        self.gone.remember(endpoint, now_ms());
        let gone = endpoint.clone();
        // The jobs are concluded by the owner as it takes them: a caller that stops waiting
        // (a client hanging up on the deletion) cannot leave them neither held nor settled.
        let cancel = move |lanes: &mut super::lanes::Lanes, dispatcher: &Dispatcher| {
            let waiting = lanes.remove_endpoint(&gone);
            let cancelled = waiting.len();
            for job in waiting {
                dispatcher.conclude(job, NextState::Canceled, None);
            }
            cancelled
        };
        let cancelled = self.ask(cancel).await.unwrap_or_default();
        self.latency.forget(endpoint);
        self.metrics.forget_endpoint(endpoint);
        self.deliverer.forget_endpoint(endpoint);
        if cancelled > 0 {
            tracing::info!(%endpoint, cancelled, "the endpoint was deleted: its waiting deliveries are cancelled");
        }
        if let Err(e) = self.store.save_breaker(endpoint, None).await {
            tracing::warn!(error = %e, %endpoint, "forgetting a deleted endpoint's circuit breaker failed");
        }
    }

    /// `app` changed, perhaps deleted with its endpoints: the ones that are gone are
    /// forgotten, and so are the application's own metrics if it is.
    pub async fn app_changed(&self, app: &AppId) {
        let of = app.clone();
        let endpoints = self.ask(move |lanes, _| lanes.endpoints_of(&of)).await.unwrap_or_default();
        for endpoint in endpoints {
            self.endpoint_changed(&endpoint).await;
        }
        if matches!(self.catalog.app(app.as_str()).await, Ok(None)) {
            self.metrics.forget_app(app);
            self.sandbox.forget(app);
        }
    }
}
