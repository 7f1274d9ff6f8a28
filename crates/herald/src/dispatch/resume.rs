//! Bringing a parked endpoint back: when its owner fixes how it is reached (a new URL or
//! headers, or enabled again) its circuit breaker closes at once, and "retry now" lets the
//! probe of an open breaker go without waiting out the cooldown. Either way the endpoint's
//! parked deliveries come forward through the normal fairness and rate limits.
//!
//! The process that serves the API call acts at once; the others hear of it through the
//! store's catalog announcements ([`Dispatcher::follow`]).

use std::sync::Arc;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use crate::clock::now_ms;
use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::{BreakerEventKind, CatalogChange};
use crate::supervisor::spawn_task;

impl Dispatcher {
    /// The endpoint changed: if it is now reached differently from how its breaker judged
    /// it, the breaker closes and its parked deliveries come forward; if it is gone, this
    /// process forgets it (`gone`).
    pub async fn endpoint_changed(&self, endpoint: &EndpointId) {
        let target = match self.catalog.target(endpoint).await {
            Ok(Some(target)) => target,
            Ok(None) => return self.endpoint_gone(endpoint).await,
            Err(e) => {
                tracing::warn!(error = %e, %endpoint, "loading a changed endpoint failed");
                return;
            }
        };
        let changed = target.clone();
        let transition = self.ask(move |lanes, _| lanes.reach_changed(&changed)).await.flatten();
        if let Some(transition) = transition {
            tracing::info!(%endpoint, "the endpoint is reached differently now: its circuit breaker closes");
            self.poke();
            self.breaker_changed(endpoint, transition, true).await;
        }
    }

    /// "Retry now": an open breaker of this process lets its probe go at once (and says so
    /// in its log). Returns whether this process had it open.
    pub async fn retry_now(&self, app: &AppId, endpoint: &EndpointId) -> bool {
        let (of, probed) = (app.clone(), endpoint.clone());
        let opened = self.ask(move |lanes, _| lanes.probe_now(&of, &probed, now_ms())).await.unwrap_or(false);
        if opened {
            self.log_breaker(endpoint, BreakerEventKind::RetryNow, self.breaker(endpoint).await.as_ref()).await;
        }
        opened
    }

    /// A resend of `msg` to `endpoint` was accepted. If this process holds that delivery
    /// waiting (for a retry, or parked), it gives the claim back now, and the store makes it
    /// the resend (due at once, with a fresh budget); the loader claims it next. An attempt
    /// already on the wire is left alone: its outcome puts the delivery back for the resend.
    /// The hand-back runs as a task of its own: a caller that stops waiting (a client
    /// hanging up) cannot strand a job taken out of the lanes but not given back.
    pub fn resend_requested(self: &Arc<Self>, msg: &MessageId, endpoint: &EndpointId) {
        let (this, msg, endpoint) = (self.clone(), msg.clone(), endpoint.clone());
        spawn_task(&self.liveness, "a resend's hand-back", async move { this.hand_back(&msg, &endpoint).await });
    }

    async fn hand_back(&self, msg: &MessageId, endpoint: &EndpointId) {
        let (of, to) = (msg.clone(), endpoint.clone());
        let Some(job) = self.ask(move |lanes, _| lanes.take_waiting(&of, &to)).await.flatten() else { return };
        match self.store.release(&job.owner, vec![job.delivery_id]).await {
            Ok(()) => {
                self.room.release(1);
                self.poke();
            }
            Err(e) => {
                // Still ours: attempted now, its outcome then makes it the resend.
                tracing::warn!(error = %e, %msg, "giving a delivery back for its resend failed; attempting it now");
                self.hold([(job, now_ms())]);
            }
        }
    }

    /// Applies what other processes announce (endpoint changes, "retry now") until `stop`.
    pub async fn follow(self: Arc<Self>, mut changes: broadcast::Receiver<CatalogChange>, stop: CancellationToken) {
        loop {
            let change = tokio::select! {
                change = changes.recv() => change,
                _ = stop.cancelled() => return,
            };
            match change {
                Ok(CatalogChange::Endpoint(app, endpoint)) => {
                    // The catalog's own follower may not have dropped its copy yet.
                    self.catalog.invalidate_endpoint(&app, &endpoint);
                    self.endpoint_changed(&endpoint).await;
                }
                Ok(CatalogChange::RetryNow(app, endpoint)) => {
                    self.retry_now(&app, &endpoint).await;
                }
                Ok(CatalogChange::Resend(_, endpoint, msg)) => self.resend_requested(&msg, &endpoint),
                Ok(CatalogChange::All) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    let gated = self.ask(|lanes, _| lanes.gated_endpoints()).await.unwrap_or_default();
                    for endpoint in gated {
                        self.endpoint_changed(&endpoint).await;
                    }
                }
                Ok(CatalogChange::App(app)) => self.app_changed(&app).await,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}
