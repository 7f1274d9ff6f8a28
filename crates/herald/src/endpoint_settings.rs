//! The endpoint's `delivery` extension (Herald-only): attempt timeout, retry policy, which
//! failures are retried, circuit breaker thresholds and ordering. Stored as the user set it; resolved against the server
//! defaults when used, so endpoints that set nothing follow the operator's configuration.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::breaker::BreakerSettings;
use crate::outcome::{RetryOn, RetryRules};
use crate::retry::RetryPolicy;

/// Longest attempt timeout an endpoint may ask for.
pub const MAX_TIMEOUT_MS: u64 = 300_000;

/// The `delivery` object as given on create/update/patch. Unknown keys are refused: this
/// object is ours, and a misspelt key would silently change delivery semantics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeliverySettings {
    /// Time budget of one attempt in milliseconds (default: `delivery.timeout_ms`, 10 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Retry policy (default: full-jitter exponential, 12 attempts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// Which failures are retried (default: `transient`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<RetryOn>,
    /// Circuit breaker thresholds (defaults: 10 failures, 5 min cooldown, 1 h at most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub circuit_breaker: Option<BreakerSettings>,
    /// `strict`: one message at a time, in order (a failing head blocks the rest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<Ordering>,
    /// A named policy the other fields refine (`marketplace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<Preset>,
    /// Send each attempt's W3C `traceparent` to the endpoint, so that its own spans join
    /// the message's trace (default `false`: a trace id is information about the sender).
    /// Set by the operator only; with tracing off nothing is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub propagate_trace_context: Option<bool>,
}

/// Named delivery policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Preset {
    /// The marketplace postback policy: only 429 is retried, every 10 minutes (± 30 s of
    /// jitter), 6 retries (7 attempts); every other status is final. Every attempt carries
    /// the same `webhook-id`, as all of Herald's do.
    Marketplace,
}

impl Preset {
    fn retry(self) -> RetryPolicy {
        match self {
            Self::Marketplace => RetryPolicy::Fixed { interval_ms: 600_000, jitter_ms: 30_000, max_attempts: 7 },
        }
    }

    fn retry_on(self) -> RetryOn {
        match self {
            Self::Marketplace => RetryOn::RateLimitOnly,
        }
    }
}

/// Whether an endpoint's messages may overtake each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Ordering {
    /// Messages go out in parallel; the `herald-sequence` header lets receivers reorder.
    #[default]
    None,
    /// One message in flight at a time, in sequence order; a failing head blocks the rest.
    Strict,
}

/// The settings in force for an endpoint, defaults filled in (what `GET` returns).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveSettings {
    pub timeout_ms: u64,
    pub retry: RetryPolicy,
    pub retry_on: RetryOn,
    pub circuit_breaker: BreakerSettings,
    pub ordering: Ordering,
    pub propagate_trace_context: bool,
}

impl EffectiveSettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    pub fn retry_rules(&self) -> RetryRules {
        RetryRules { policy: self.retry.clone(), retry_on: self.retry_on }
    }
}

/// The server-wide defaults endpoints fall back to.
#[derive(Debug, Clone)]
pub struct Defaults {
    pub timeout: Duration,
    pub retry: RetryPolicy,
}

impl DeliverySettings {
    /// Problems as (field path below `delivery`, message).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if let Some(timeout) = self.timeout_ms
            && !(1..=MAX_TIMEOUT_MS).contains(&timeout)
        {
            problems.push(("timeoutMs".to_owned(), format!("must be between 1 and {MAX_TIMEOUT_MS}")));
        }
        if let Some(retry) = &self.retry {
            for (field, msg) in retry.problems() {
                problems.push((format!("retry.{field}"), msg));
            }
        }
        if let Some(breaker) = &self.circuit_breaker {
            for (field, msg) in breaker.problems() {
                problems.push((format!("circuitBreaker.{field}"), msg));
            }
        }
        problems
    }

    pub fn resolve(&self, defaults: &Defaults) -> EffectiveSettings {
        EffectiveSettings {
            timeout_ms: self.timeout_ms.unwrap_or(defaults.timeout.as_millis() as u64),
            retry: self
                .retry
                .clone()
                .or_else(|| self.preset.map(Preset::retry))
                .unwrap_or_else(|| defaults.retry.clone()),
            retry_on: self.retry_on.or_else(|| self.preset.map(Preset::retry_on)).unwrap_or_default(),
            circuit_breaker: self.circuit_breaker.unwrap_or_default(),
            ordering: self.ordering.unwrap_or_default(),
            propagate_trace_context: self.propagate_trace_context.unwrap_or(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_settings_resolve_to_the_server_defaults() {
        let defaults = Defaults { timeout: Duration::from_secs(10), retry: RetryPolicy::default() };
        let effective = DeliverySettings::default().resolve(&defaults);
        assert_eq!(effective.timeout_ms, 10_000);
        assert_eq!(effective.retry, RetryPolicy::default());
        assert_eq!(effective.retry_on, RetryOn::Transient);
    }

    #[test]
    fn documented_json_parses_and_problems_name_the_field() {
        let settings: DeliverySettings = serde_json::from_str(
            r#"{"timeoutMs":0,"retry":{"strategy":"fixed","intervalMs":600000,"jitterMs":700000,"maxAttempts":7},"retryOn":"rateLimitOnly"}"#,
        )
        .unwrap();
        assert_eq!(settings.retry_on, Some(RetryOn::RateLimitOnly));
        let fields: Vec<String> = settings.problems().into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, vec!["timeoutMs", "retry.jitterMs"]);
        assert!(serde_json::from_str::<DeliverySettings>(r#"{"timeoutMS":5}"#).is_err());
        assert!(serde_json::from_str::<DeliverySettings>(r#"{"retryOn":"sometimes"}"#).is_err());
    }

    #[test]
    fn the_marketplace_preset_retries_only_429_every_ten_minutes_seven_times() {
        let defaults = Defaults { timeout: Duration::from_secs(10), retry: RetryPolicy::default() };
        let settings: DeliverySettings = serde_json::from_str(r#"{"preset": "marketplace"}"#).unwrap();
        let effective = settings.resolve(&defaults);
        assert_eq!(effective.retry, RetryPolicy::Fixed { interval_ms: 600_000, jitter_ms: 30_000, max_attempts: 7 });
        assert_eq!(effective.retry_on, RetryOn::RateLimitOnly);
        let refined: DeliverySettings = serde_json::from_str(
            r#"{"preset": "marketplace", "retry": {"strategy": "fixed", "intervalMs": 5, "maxAttempts": 7}}"#,
        )
        .unwrap();
        assert_eq!(refined.resolve(&defaults).retry_on, RetryOn::RateLimitOnly, "explicit fields refine the preset");
    }
}
