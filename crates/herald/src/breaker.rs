//! The circuit breaker of an endpoint: a small state machine with the clock passed in.
//!
//! Closed: attempts flow; `failureThreshold` consecutive failures (half as many for an
//! endpoint whose p95 latency is above 5 s) open it. Open: the endpoint's deliveries are
//! parked — no attempt is made or counted — until the cooldown has passed. Half-open: exactly
//! one probe goes through; its success closes the breaker (and resets the cooldown), its
//! failure opens it again with the cooldown doubled, up to `maxCooldownMs`. Any success
//! resets the failure count.

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

/// The endpoint's `delivery.circuitBreaker` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BreakerSettings {
    #[serde(default = "default_threshold")]
    pub failure_threshold: u32,
    #[serde(default = "default_cooldown")]
    pub cooldown_ms: u64,
    #[serde(default = "default_max_cooldown")]
    pub max_cooldown_ms: u64,
}

fn default_threshold() -> u32 {
    10
}
fn default_cooldown() -> u64 {
    300_000
}
fn default_max_cooldown() -> u64 {
    3_600_000
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failure_threshold: default_threshold(),
            cooldown_ms: default_cooldown(),
            max_cooldown_ms: default_max_cooldown(),
        }
    }
}

impl BreakerSettings {
    /// Problems as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = vec![];
        if !(1..=10_000).contains(&self.failure_threshold) {
            problems.push(("failureThreshold", "must be between 1 and 10000".to_owned()));
        }
        if !(1..=7 * 24 * 3_600_000).contains(&self.cooldown_ms) {
            problems.push(("cooldownMs", "must be between 1 and 604800000".to_owned()));
        }
        if self.max_cooldown_ms < self.cooldown_ms || self.max_cooldown_ms > 7 * 24 * 3_600_000 {
            problems.push(("maxCooldownMs", "must be at least cooldownMs and at most 604800000".to_owned()));
        }
        problems
    }

    /// Failures that open a closed breaker: half as many (rounded up) for a slow endpoint.
    fn threshold(&self, slow: bool) -> u32 {
        if slow { self.failure_threshold.div_ceil(2) } else { self.failure_threshold }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

/// What a breaker says about sending now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Go,
    /// Go, as the single half-open probe.
    Probe,
    /// Park the delivery until this time (no attempt is used).
    Wait {
        until: Millis,
    },
}

/// A change worth recording (and alerting on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
    Reopened,
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Breaker {
    pub state: BreakerState,
    pub consecutive_failures: u32,
    pub opened_at: Option<Millis>,
    /// The current cooldown (doubles on each failed probe).
    pub cooldown_ms: u64,
    /// When the breaker left the closed state; kept through reopenings, cleared when it
    /// closes (how long the endpoint has been failing, for auto-disabling).
    #[serde(default)]
    pub failing_since: Option<Millis>,
    /// Whether the half-open probe is out.
    #[serde(skip)]
    probe_out: bool,
}

impl Breaker {
    pub fn new(settings: &BreakerSettings) -> Self {
        Self {
            state: BreakerState::Closed,
            consecutive_failures: 0,
            opened_at: None,
            cooldown_ms: settings.cooldown_ms,
            failing_since: None,
            probe_out: false,
        }
    }

    /// When the open breaker lets a probe through.
    pub fn reopens_at(&self) -> Option<Millis> {
        self.opened_at.map(|at| at.saturating_add(self.cooldown_ms as i64))
    }

    pub fn admit(&mut self, now: Millis) -> Admission {
        match self.state {
            BreakerState::Closed => Admission::Go,
            BreakerState::Open => match self.reopens_at() {
                Some(at) if now < at => Admission::Wait { until: at },
                _ => {
                    self.state = BreakerState::HalfOpen;
                    self.probe_out = true;
                    Admission::Probe
                }
            },
            BreakerState::HalfOpen if self.probe_out => Admission::Wait { until: now.saturating_add(PROBE_RECHECK_MS) },
            BreakerState::HalfOpen => {
                self.probe_out = true;
                Admission::Probe
            }
        }
    }

    /// "Retry now": an open breaker lets its probe through at once instead of at the end of
    /// its cooldown. Returns whether it was open.
    pub fn probe_now(&mut self, now: Millis) -> bool {
        if self.state != BreakerState::Open {
            return false;
        }
        self.opened_at = Some(now.saturating_sub(self.cooldown_ms as i64));
        true
    }

    /// The probe was not sent after all (the delivery left memory): let another go.
    pub fn abandon_probe(&mut self) {
        self.probe_out = false;
    }

    /// Records an attempt's result; `slow` when the endpoint's p95 is above 5 s.
    pub fn record(&mut self, success: bool, slow: bool, now: Millis, settings: &BreakerSettings) -> Option<Transition> {
        if success {
            self.consecutive_failures = 0;
            return match self.state {
                BreakerState::HalfOpen => {
                    *self = Self::new(settings);
                    Some(Transition::Closed)
                }
                _ => None,
            };
        }
        self.consecutive_failures = self.consecutive_failures.saturating_add(1);
        match self.state {
            BreakerState::Closed if self.consecutive_failures >= settings.threshold(slow) => {
                self.state = BreakerState::Open;
                self.opened_at = Some(now);
                self.failing_since = Some(now);
                self.cooldown_ms = settings.cooldown_ms;
                Some(Transition::Opened)
            }
            BreakerState::HalfOpen => {
                self.state = BreakerState::Open;
                self.opened_at = Some(now);
                self.cooldown_ms = self.cooldown_ms.saturating_mul(2).min(settings.max_cooldown_ms);
                self.probe_out = false;
                Some(Transition::Reopened)
            }
            _ => None,
        }
    }
}

/// How soon a parked delivery looks again while the probe is out (the probe's outcome
/// wakes the endpoint anyway; this is a safety net).
const PROBE_RECHECK_MS: i64 = 1000;

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> BreakerSettings {
        BreakerSettings { failure_threshold: 4, cooldown_ms: 1000, max_cooldown_ms: 3500 }
    }

    #[test]
    fn retry_now_lets_the_probe_of_an_open_breaker_through_at_once() {
        let mut b = Breaker::new(&settings());
        assert!(!b.probe_now(0), "a closed breaker has nothing to retry");
        fail(&mut b, 4, 0);
        assert_eq!(b.admit(10), Admission::Wait { until: 1000 });
        assert!(b.probe_now(10));
        assert_eq!(b.admit(10), Admission::Probe);
        assert!(!b.probe_now(11), "half-open: the probe is already out");
        assert_eq!(b.record(true, false, 12, &settings()), Some(Transition::Closed));
    }

    fn fail(b: &mut Breaker, n: u32, now: Millis) -> Vec<Option<Transition>> {
        (0..n).map(|_| b.record(false, false, now, &settings())).collect()
    }

    #[test]
    fn closed_admits_and_opens_after_the_threshold_of_consecutive_failures() {
        let mut b = Breaker::new(&settings());
        assert_eq!(b.admit(0), Admission::Go);
        assert_eq!(fail(&mut b, 3, 10), vec![None, None, None]);
        assert_eq!(b.state, BreakerState::Closed);
        assert_eq!(b.record(false, false, 20, &settings()), Some(Transition::Opened));
        assert_eq!((b.state, b.opened_at, b.consecutive_failures), (BreakerState::Open, Some(20), 4));
    }

    #[test]
    fn a_success_resets_the_failure_count() {
        let mut b = Breaker::new(&settings());
        fail(&mut b, 3, 0);
        assert_eq!(b.record(true, false, 0, &settings()), None);
        assert_eq!(b.consecutive_failures, 0);
        assert_eq!(fail(&mut b, 3, 0), vec![None, None, None], "three more do not open it");
    }

    #[test]
    fn a_slow_endpoint_opens_after_half_the_failures() {
        let mut b = Breaker::new(&settings());
        assert_eq!(b.record(false, true, 0, &settings()), None);
        assert_eq!(b.record(false, true, 0, &settings()), Some(Transition::Opened));
        let odd = BreakerSettings { failure_threshold: 5, ..settings() };
        let mut b = Breaker::new(&odd);
        let opened: Vec<_> = (0..3).map(|_| b.record(false, true, 0, &odd)).collect();
        assert_eq!(opened, vec![None, None, Some(Transition::Opened)], "half of 5, rounded up, is 3");
    }

    #[test]
    fn open_parks_until_the_cooldown_then_lets_exactly_one_probe_through() {
        let mut b = Breaker::new(&settings());
        fail(&mut b, 4, 100);
        assert_eq!(b.admit(100), Admission::Wait { until: 1100 });
        assert_eq!(b.admit(1099), Admission::Wait { until: 1100 });
        assert_eq!(b.admit(1100), Admission::Probe);
        assert_eq!(b.state, BreakerState::HalfOpen);
        assert!(matches!(b.admit(1100), Admission::Wait { .. }), "only one probe at a time");
        assert!(matches!(b.admit(5000), Admission::Wait { .. }));
    }

    #[test]
    fn a_successful_probe_closes_and_resets_the_cooldown() {
        let mut b = Breaker::new(&settings());
        fail(&mut b, 4, 0);
        b.admit(1000);
        assert_eq!(b.record(false, false, 1000, &settings()), Some(Transition::Reopened));
        assert_eq!(b.cooldown_ms, 2000);
        b.admit(3000);
        assert_eq!(b.record(true, false, 3000, &settings()), Some(Transition::Closed));
        assert_eq!(b, Breaker::new(&settings()));
        assert_eq!(b.admit(3000), Admission::Go);
    }

    #[test]
    fn failed_probes_double_the_cooldown_up_to_the_cap() {
        let mut b = Breaker::new(&settings());
        fail(&mut b, 4, 0);
        let mut now = 0;
        let mut cooldowns = vec![];
        for _ in 0..4 {
            now = b.reopens_at().unwrap();
            assert_eq!(b.admit(now), Admission::Probe);
            assert_eq!(b.record(false, false, now, &settings()), Some(Transition::Reopened));
            assert_eq!(b.opened_at, Some(now));
            cooldowns.push(b.cooldown_ms);
        }
        assert_eq!(cooldowns, vec![2000, 3500, 3500, 3500]);
        assert_eq!(b.admit(now + 3499), Admission::Wait { until: now + 3500 });
    }

    #[test]
    fn an_abandoned_probe_lets_another_one_go() {
        let mut b = Breaker::new(&settings());
        fail(&mut b, 4, 0);
        assert_eq!(b.admit(1000), Admission::Probe);
        b.abandon_probe();
        assert_eq!(b.admit(1000), Admission::Probe);
    }

    #[test]
    fn failures_while_open_change_nothing_but_the_count() {
        let mut b = Breaker::new(&settings());
        fail(&mut b, 4, 0);
        assert_eq!(fail(&mut b, 3, 10), vec![None, None, None]);
        assert_eq!((b.state, b.opened_at), (BreakerState::Open, Some(0)));
        assert_eq!(b.record(true, false, 20, &settings()), None, "a late success of an old attempt");
        assert_eq!(b.state, BreakerState::Open);
    }

    #[test]
    fn settings_are_validated_and_parse_with_defaults() {
        let parsed: BreakerSettings = serde_json::from_str(r#"{"failureThreshold":3}"#).unwrap();
        assert_eq!(parsed, BreakerSettings { failure_threshold: 3, ..Default::default() });
        let bad = BreakerSettings { failure_threshold: 0, cooldown_ms: 10, max_cooldown_ms: 5 };
        let fields: Vec<_> = bad.problems().into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, vec!["failureThreshold", "maxCooldownMs"]);
        assert!(serde_json::from_str::<BreakerSettings>(r#"{"threshold":3}"#).is_err());
    }

    #[test]
    fn failing_since_survives_reopening_and_clears_on_closing() {
        let settings = BreakerSettings { failure_threshold: 1, cooldown_ms: 10, max_cooldown_ms: 100 };
        let mut b = Breaker::new(&settings);
        b.record(false, false, 5, &settings);
        assert_eq!(b.failing_since, Some(5));
        assert_eq!(b.admit(20), Admission::Probe);
        b.record(false, false, 20, &settings);
        assert_eq!((b.state, b.failing_since), (BreakerState::Open, Some(5)), "reopened: still failing since 5");
        assert_eq!(b.admit(50), Admission::Probe);
        b.record(true, false, 50, &settings);
        assert_eq!((b.state, b.failing_since), (BreakerState::Closed, None));
    }
}
