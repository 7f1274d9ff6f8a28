//! Alerts: every `alerts.interval_secs` Herald looks at the queue and the endpoints and
//! compares what it sees with what it saw. A condition that starts sends one operational
//! webhook; when it ends, one recovery note. Conditions, with their webhook types:
//!
//! | condition | starts | ends |
//! |---|---|---|
//! | the dead-letter count grew since the last look | `herald.dead_letters.growing` | `….resolved` |
//! | the oldest undelivered message is older than `oldest_pending_secs` | `herald.queue.stalled` | `….resolved` |
//! | an endpoint's p95 is above `p95_threshold_ms` (≥ 20 samples) | `herald.endpoint.slow` | `….resolved` |
//! | an endpoint's circuit is open or half-open | `herald.circuit.opened` | `herald.circuit.closed` |
//! | an endpoint failed for `auto_disable_after_hours`: Herald disables it | `endpoint.disabled` (Svix) | — |
//!
//! Every condition is also a metric (`herald_alerts_active`, `herald_alerts_total`).

mod sender;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use sender::Sender;

use crate::breaker::BreakerState;
use crate::catalog::Catalog;
use crate::clock::{Millis, now_ms, to_rfc3339};
use crate::config::AlertSettings;
use crate::dispatch::Dispatcher;
use crate::health;
use crate::latency::MIN_SAMPLES;
use crate::metrics::Metrics;
use crate::store::{Store, StoreResult};

/// The kinds of condition, each with the webhook types of its start and end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    DeadLettersGrowing,
    QueueStalled,
    EndpointSlow,
    CircuitOpen,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::DeadLettersGrowing, Kind::QueueStalled, Kind::EndpointSlow, Kind::CircuitOpen];

    pub fn name(self) -> &'static str {
        match self {
            Self::DeadLettersGrowing => "dead_letters.growing",
            Self::QueueStalled => "queue.stalled",
            Self::EndpointSlow => "endpoint.slow",
            Self::CircuitOpen => "circuit.open",
        }
    }

    fn started(self) -> &'static str {
        match self {
            Self::DeadLettersGrowing => "herald.dead_letters.growing",
            Self::QueueStalled => "herald.queue.stalled",
            Self::EndpointSlow => "herald.endpoint.slow",
            Self::CircuitOpen => "herald.circuit.opened",
        }
    }

    fn ended(self) -> &'static str {
        match self {
            Self::DeadLettersGrowing => "herald.dead_letters.growing.resolved",
            Self::QueueStalled => "herald.queue.stalled.resolved",
            Self::EndpointSlow => "herald.endpoint.slow.resolved",
            Self::CircuitOpen => "herald.circuit.closed",
        }
    }
}

/// Conditions true now, by (kind, subject), with what the webhook says about each.
type Conditions = BTreeMap<(Kind, String), Value>;

pub struct Alerts {
    settings: AlertSettings,
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    dispatcher: Arc<Dispatcher>,
    metrics: Arc<Metrics>,
    sender: Option<Sender>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    active: Conditions,
    last_dead: Option<u64>,
}

impl Alerts {
    pub fn new(
        settings: AlertSettings,
        store: Arc<dyn Store>,
        catalog: Arc<Catalog>,
        dispatcher: Arc<Dispatcher>,
        metrics: Arc<Metrics>,
        sender: Option<Sender>,
    ) -> Self {
        Self { settings, store, catalog, dispatcher, metrics, sender, state: Mutex::default() }
    }

    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    if let Err(e) = self.evaluate().await {
                        tracing::warn!(error = %e, "evaluating alerts failed; trying again next interval");
                    }
                }
            }
        }
    }

    /// One look: fires what started, resolves what ended, disables what failed too long.
    pub async fn evaluate(&self) -> StoreResult<()> {
        let now = now_ms();
        let conditions = self.conditions(now).await?;
        let (started, ended) = {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let started = only_in(&conditions, &state.active);
            let ended = only_in(&state.active, &conditions);
            state.active = conditions;
            for kind in Kind::ALL {
                let active = state.active.keys().filter(|(k, _)| *k == kind).count();
                self.metrics.alert_active(kind.name(), active as u64);
            }
            (started, ended)
        };
        for ((kind, _), data) in started {
            tracing::warn!(alert = kind.started(), %data, "alert");
            self.metrics.alert_sent(kind.started());
            self.notify(kind.started(), data);
        }
        for ((kind, _), data) in ended {
            tracing::info!(alert = kind.ended(), %data, "alert resolved");
            self.metrics.alert_sent(kind.ended());
            self.notify(kind.ended(), data);
        }
        self.auto_disable(now).await
    }

    fn notify(&self, kind: &str, data: Value) {
        if let Some(sender) = &self.sender {
            sender.send(kind, data);
        }
    }

    async fn conditions(&self, now: Millis) -> StoreResult<Conditions> {
        let mut out = Conditions::new();
        let summary = self.store.summary(now).await?;
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(last) = state.last_dead
                && summary.dead > last
            {
                let data = json!({"deadLetters": summary.dead, "increase": summary.dead - last});
                out.insert((Kind::DeadLettersGrowing, String::new()), data);
            }
            state.last_dead = Some(summary.dead);
        }
        if let Some(oldest) = summary.oldest_pending_at
            && now - oldest > self.settings.oldest_pending.as_millis() as i64
        {
            let data =
                json!({"oldestPendingAt": to_rfc3339(oldest), "pending": summary.pending + summary.awaiting_retry});
            out.insert((Kind::QueueStalled, String::new()), data);
        }
        for (endpoint, histogram) in health::latency(&*self.store, &self.dispatcher, None, now).await? {
            let s = histogram.summary();
            if s.sample_count >= MIN_SAMPLES && s.p95_ms.is_some_and(|p| p > self.settings.p95_threshold_ms) {
                let data = json!({"endpointId": endpoint, "appId": self.app_of(&endpoint).await?, "p95Ms": s.p95_ms,
                                  "thresholdMs": self.settings.p95_threshold_ms});
                out.insert((Kind::EndpointSlow, endpoint.to_string()), data);
            }
        }
        for (endpoint, breaker) in health::breakers(&*self.store, &self.dispatcher, None).await? {
            if breaker.state != BreakerState::Closed {
                let data = json!({"endpointId": endpoint, "appId": self.app_of(&endpoint).await?,
                                  "openedAt": breaker.opened_at.map(to_rfc3339),
                                  "consecutiveFailures": breaker.consecutive_failures});
                out.insert((Kind::CircuitOpen, endpoint.to_string()), data);
            }
        }
        Ok(out)
    }

    async fn app_of(&self, endpoint: &crate::ids::EndpointId) -> StoreResult<Option<String>> {
        Ok(self.catalog.target(endpoint).await?.map(|t| t.endpoint.app_id.to_string()))
    }

    /// Disables endpoints whose breaker has not closed for `auto_disable_after`, counted
    /// from the later of the first failure and the endpoint's last change (re-enabling an
    /// endpoint starts the clock again).
    async fn auto_disable(&self, now: Millis) -> StoreResult<()> {
        let Some(after) = self.settings.auto_disable_after else { return Ok(()) };
        let limit = after.as_millis() as i64;
        for (id, breaker) in health::breakers(&*self.store, &self.dispatcher, None).await? {
            let Some(since) = breaker.failing_since else { continue };
            let Some(mut endpoint) = self.store.endpoint_by_id(&id).await? else { continue };
            if endpoint.disabled || now - since.max(endpoint.updated_at) < limit {
                continue;
            }
            let read_at = endpoint.updated_at;
            endpoint.disabled = true;
            endpoint.updated_at = now.max(read_at + 1);
            if !self.store.update_endpoint(&endpoint, read_at).await? {
                continue; // changed meanwhile (enabled again, say): judged again next time
            }
            self.catalog.invalidate_endpoint(&endpoint.app_id, &endpoint.id);
            let data = json!({"appId": endpoint.app_id, "endpointId": endpoint.id, "endpointUid": endpoint.uid,
                              "failSince": to_rfc3339(since), "trigger": "automatic"});
            tracing::warn!(endpoint = %endpoint.id, "disabled an endpoint that kept failing");
            self.metrics.alert_sent("endpoint.disabled");
            self.notify("endpoint.disabled", data);
        }
        Ok(())
    }
}

/// The conditions of `a` that `b` lacks.
fn only_in(a: &Conditions, b: &Conditions) -> Vec<((Kind, String), Value)> {
    a.iter().filter(|(k, _)| !b.contains_key(*k)).map(|(k, v)| (k.clone(), v.clone())).collect()
}
