//! Prometheus metrics: counters and histograms the dispatcher updates as it goes, rendered
//! in the text exposition format at `/metrics` together with gauges read at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use crate::ids::{AppId, EndpointId};
use crate::outcome::OutcomeClass;

/// What one application used of the jq sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SandboxUsage {
    pub exchanges: u64,
    pub seconds: f64,
}

/// Outcome classes as labelled, in `OutcomeClass` order.
const CLASSES: [(OutcomeClass, &str); 4] = [
    (OutcomeClass::Delivered, "delivered"),
    (OutcomeClass::Transient, "transient"),
    (OutcomeClass::Permanent, "permanent"),
    (OutcomeClass::Internal, "internal"),
];

/// Upper bounds (seconds) of the attempt-duration histogram buckets.
const BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Default)]
struct Durations {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

#[derive(Default)]
pub struct Metrics {
    /// Per application, counts by outcome class (in `CLASSES` order).
    attempts: Mutex<BTreeMap<AppId, [u64; CLASSES.len()]>>,
    durations: Mutex<BTreeMap<EndpointId, Durations>>,
    transitions: Mutex<BTreeMap<&'static str, u64>>,
    /// Alert conditions active now, by kind.
    alerts_active: Mutex<BTreeMap<&'static str, u64>>,
    /// Operational webhooks raised, by type.
    alerts_sent: Mutex<BTreeMap<&'static str, u64>>,
}

/// Values read at scrape time.
pub struct Gauges {
    pub pending: u64,
    pub awaiting_retry: u64,
    pub in_flight: u64,
    pub dead: u64,
    pub oldest_pending_age_seconds: f64,
    /// (endpoint, 0 closed, 1 half-open, 2 open)
    pub circuits: Vec<(EndpointId, u8)>,
    /// Each application's use of the jq sandbox.
    pub sandbox: Vec<(AppId, SandboxUsage)>,
    /// Long-polls waiting now, per application.
    pub long_polls: Vec<(AppId, usize)>,
}

/// The entry of `key`, cloning the key only when it is new (the hot path's common case).
fn entry<'a, K: Ord + Clone, V: Default>(map: &'a mut BTreeMap<K, V>, key: &K) -> &'a mut V {
    if !map.contains_key(key) {
        map.insert(key.clone(), V::default());
    }
    map.get_mut(key).expect("just inserted")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Metrics {
    /// One attempt of `app`'s, by outcome class, with its duration.
    pub fn attempt(&self, app: &AppId, endpoint: &EndpointId, class: OutcomeClass, seconds: f64) {
        let index = CLASSES.iter().position(|(c, _)| *c == class).unwrap_or(0);
        entry(&mut lock(&self.attempts), app)[index] += 1;
        let mut durations = lock(&self.durations);
        let d = entry(&mut durations, endpoint);
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                d.counts[i] += 1;
            }
        }
        d.sum += seconds;
        d.count += 1;
    }

    /// The endpoint is gone: its series go with it (memory follows live endpoints, not churn).
    pub fn forget_endpoint(&self, endpoint: &EndpointId) {
        lock(&self.durations).remove(endpoint);
    }

    /// The application is gone: its series go with it.
    pub fn forget_app(&self, app: &AppId) {
        lock(&self.attempts).remove(app);
    }

    pub fn circuit_transition(&self, kind: &'static str) {
        *lock(&self.transitions).entry(kind).or_default() += 1;
    }

    pub fn alert_active(&self, kind: &'static str, conditions: u64) {
        lock(&self.alerts_active).insert(kind, conditions);
    }

    pub fn alert_sent(&self, webhook_type: &'static str) {
        *lock(&self.alerts_sent).entry(webhook_type).or_default() += 1;
    }

    pub fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(w, "# HELP herald_attempts_total Delivery attempts by outcome class and application.");
        let _ = writeln!(w, "# TYPE herald_attempts_total counter");
        for (app, counts) in lock(&self.attempts).iter() {
            for ((_, class), n) in CLASSES.iter().zip(counts) {
                let _ = writeln!(w, "herald_attempts_total{{app=\"{app}\",class=\"{class}\"}} {n}");
            }
        }
        let _ = writeln!(w, "# HELP herald_attempt_duration_seconds Attempt durations by endpoint.");
        let _ = writeln!(w, "# TYPE herald_attempt_duration_seconds histogram");
        for (endpoint, d) in lock(&self.durations).iter() {
            for (bound, count) in BUCKETS.iter().zip(d.counts) {
                let _ = writeln!(
                    w,
                    "herald_attempt_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"{bound}\"}} {count}"
                );
            }
            let _ = writeln!(
                w,
                "herald_attempt_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"+Inf\"}} {}",
                d.count
            );
            let _ = writeln!(w, "herald_attempt_duration_seconds_sum{{endpoint=\"{endpoint}\"}} {}", d.sum);
            let _ = writeln!(w, "herald_attempt_duration_seconds_count{{endpoint=\"{endpoint}\"}} {}", d.count);
        }
        let _ = writeln!(w, "# HELP herald_circuit_transitions_total Circuit breaker transitions.");
        let _ = writeln!(w, "# TYPE herald_circuit_transitions_total counter");
        for (kind, n) in lock(&self.transitions).iter() {
            let _ = writeln!(w, "herald_circuit_transitions_total{{to=\"{kind}\"}} {n}");
        }
        let _ = writeln!(w, "# HELP herald_queue_depth Deliveries by state.");
        let _ = writeln!(w, "# TYPE herald_queue_depth gauge");
        for (state, n) in [
            ("pending", gauges.pending),
            ("awaiting_retry", gauges.awaiting_retry),
            ("in_flight", gauges.in_flight),
            ("dead", gauges.dead),
        ] {
            let _ = writeln!(w, "herald_queue_depth{{state=\"{state}\"}} {n}");
        }
        let _ = writeln!(w, "# HELP herald_dead_letters Deliveries that are dead letters.");
        let _ = writeln!(w, "# TYPE herald_dead_letters gauge");
        let _ = writeln!(w, "herald_dead_letters {}", gauges.dead);
        let _ = writeln!(w, "# HELP herald_oldest_pending_age_seconds Age of the oldest undelivered message.");
        let _ = writeln!(w, "# TYPE herald_oldest_pending_age_seconds gauge");
        let _ = writeln!(w, "herald_oldest_pending_age_seconds {}", gauges.oldest_pending_age_seconds);
        let _ = writeln!(w, "# HELP herald_circuit_state Circuit breaker per endpoint: 0 closed, 1 half-open, 2 open.");
        let _ = writeln!(w, "# TYPE herald_circuit_state gauge");
        for (endpoint, state) in &gauges.circuits {
            let _ = writeln!(w, "herald_circuit_state{{endpoint=\"{endpoint}\"}} {state}");
        }
        let _ =
            writeln!(w, "# HELP herald_sandbox_exchanges_total Filter and transform runs and checks, by application.");
        let _ = writeln!(w, "# TYPE herald_sandbox_exchanges_total counter");
        for (app, usage) in &gauges.sandbox {
            let _ = writeln!(w, "herald_sandbox_exchanges_total{{app=\"{app}\"}} {}", usage.exchanges);
        }
        let _ = writeln!(w, "# HELP herald_sandbox_seconds_total Time sandbox workers spent for each application.");
        let _ = writeln!(w, "# TYPE herald_sandbox_seconds_total counter");
        for (app, usage) in &gauges.sandbox {
            let _ = writeln!(w, "herald_sandbox_seconds_total{{app=\"{app}\"}} {}", usage.seconds);
        }
        let _ = writeln!(w, "# HELP herald_long_polls_waiting Poller long-polls waiting now, by application.");
        let _ = writeln!(w, "# TYPE herald_long_polls_waiting gauge");
        for (app, n) in &gauges.long_polls {
            let _ = writeln!(w, "herald_long_polls_waiting{{app=\"{app}\"}} {n}");
        }
        let _ = writeln!(w, "# HELP herald_alerts_active Alert conditions true at the last evaluation, by kind.");
        let _ = writeln!(w, "# TYPE herald_alerts_active gauge");
        for (kind, n) in lock(&self.alerts_active).iter() {
            let _ = writeln!(w, "herald_alerts_active{{alert=\"{kind}\"}} {n}");
        }
        let _ = writeln!(w, "# HELP herald_alerts_total Alerts raised and resolved, by operational webhook type.");
        let _ = writeln!(w, "# TYPE herald_alerts_total counter");
        for (kind, n) in lock(&self.alerts_sent).iter() {
            let _ = writeln!(w, "herald_alerts_total{{type=\"{kind}\"}} {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_gauges() {
        let m = Metrics::default();
        let (app, ep) = (AppId::from_trusted("app_1".into()), EndpointId::from_trusted("ep_1".into()));
        m.attempt(&app, &ep, OutcomeClass::Delivered, 0.02);
        m.attempt(&app, &ep, OutcomeClass::Transient, 3.0);
        let gauges = Gauges {
            pending: 5,
            awaiting_retry: 1,
            in_flight: 2,
            dead: 7,
            oldest_pending_age_seconds: 1.5,
            circuits: vec![(ep.clone(), 2)],
            sandbox: vec![(app.clone(), SandboxUsage { exchanges: 3, seconds: 0.25 })],
            long_polls: vec![(app.clone(), 2)],
        };
        let text = m.render(&gauges);
        assert!(text.contains("herald_long_polls_waiting{app=\"app_1\"} 2"));
        assert!(text.contains("herald_sandbox_exchanges_total{app=\"app_1\"} 3"));
        assert!(text.contains("herald_sandbox_seconds_total{app=\"app_1\"} 0.25"));
        assert!(text.contains("herald_attempts_total{app=\"app_1\",class=\"delivered\"} 1"));
        assert!(text.contains("herald_attempt_duration_seconds_bucket{endpoint=\"ep_1\",le=\"0.025\"} 1"));
        assert!(text.contains("herald_attempt_duration_seconds_bucket{endpoint=\"ep_1\",le=\"5\"} 2"));
        assert!(text.contains("herald_attempt_duration_seconds_count{endpoint=\"ep_1\"} 2"));
        assert!(text.contains("herald_queue_depth{state=\"pending\"} 5"));
        assert!(text.contains("herald_dead_letters 7"));
        assert!(text.contains("herald_circuit_state{endpoint=\"ep_1\"} 2"));
        m.forget_endpoint(&ep);
        m.forget_app(&app);
        let forgotten = m.render(&Gauges { circuits: vec![], sandbox: vec![], long_polls: vec![], ..gauges });
        assert!(!forgotten.contains("ep_1") && !forgotten.contains("app_1"), "{forgotten}");
    }
}
