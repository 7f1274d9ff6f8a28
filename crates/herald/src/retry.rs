//! Retry policies (the endpoint's `delivery.retry` setting) and how long to wait before the
//! next attempt: full-jitter exponential backoff, a fixed interval with ± jitter, or an
//! explicit schedule; `Retry-After` parsing with checked arithmetic.
//!
//! Everything here is pure: randomness comes in as an `Rng`, time as a parameter.

use std::time::{Duration, SystemTime};

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Longest delay any policy may ask for (7 days), so arithmetic never overflows.
pub const MAX_DELAY_MS: u64 = 7 * 24 * 3600 * 1000;
/// Most attempts any policy may make.
pub const MAX_ATTEMPTS: u32 = 100;

/// How the next retry is timed. `maxAttempts` counts every attempt, the first included.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "strategy", rename_all = "camelCase", deny_unknown_fields)]
pub enum RetryPolicy {
    /// Retry n (n = 0 for the first retry) waits uniform(0, min(baseMs · 2ⁿ, maxDelayMs)).
    #[serde(rename_all = "camelCase")]
    Exponential {
        #[serde(default = "default_base_ms")]
        base_ms: u64,
        #[serde(default = "default_max_delay_ms")]
        max_delay_ms: u64,
        #[serde(default = "default_max_attempts")]
        max_attempts: u32,
    },
    /// Every retry waits uniform(intervalMs − jitterMs, intervalMs + jitterMs).
    #[serde(rename_all = "camelCase")]
    Fixed {
        interval_ms: u64,
        #[serde(default)]
        jitter_ms: u64,
        #[serde(default = "default_max_attempts")]
        max_attempts: u32,
    },
    /// Retry n waits delaysMs[n] ± jitterPercent %; one attempt more than there are delays.
    #[serde(rename_all = "camelCase")]
    Schedule {
        delays_ms: Vec<u64>,
        #[serde(default)]
        jitter_percent: u8,
    },
}

fn default_base_ms() -> u64 {
    30_000
}
fn default_max_delay_ms() -> u64 {
    3_600_000
}
fn default_max_attempts() -> u32 {
    12
}

impl Default for RetryPolicy {
    /// The default: uniform(0, min(30 s · 2ⁿ, 1 h)), 12 attempts in all.
    fn default() -> Self {
        Self::Exponential {
            base_ms: default_base_ms(),
            max_delay_ms: default_max_delay_ms(),
            max_attempts: default_max_attempts(),
        }
    }
}

impl RetryPolicy {
    /// Svix's own schedule (immediately, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h), ±20 %.
    pub fn svix_preset() -> Self {
        Self::Schedule {
            delays_ms: vec![5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000],
            jitter_percent: 20,
        }
    }

    /// Attempts in all, the first included.
    pub fn max_attempts(&self) -> u32 {
        match self {
            Self::Exponential { max_attempts, .. } | Self::Fixed { max_attempts, .. } => *max_attempts,
            Self::Schedule { delays_ms, .. } => delays_ms.len() as u32 + 1,
        }
    }

    /// The longest wait this policy schedules; also the bound on an honoured `Retry-After`.
    pub fn cap_ms(&self) -> u64 {
        match self {
            Self::Exponential { max_delay_ms, .. } => *max_delay_ms,
            Self::Fixed { interval_ms, jitter_ms, .. } => interval_ms.saturating_add(*jitter_ms),
            Self::Schedule { delays_ms, jitter_percent } => {
                let longest = delays_ms.iter().copied().max().unwrap_or(0);
                longest.saturating_add(longest * u64::from(*jitter_percent) / 100)
            }
        }
    }

    /// Problems with the policy, as (field path below `retry`, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, field: &'static str, msg: String| {
            if !ok {
                problems.push((field, msg));
            }
        };
        match self {
            Self::Exponential { base_ms, max_delay_ms, max_attempts } => {
                check(*base_ms >= 1, "baseMs", "must be at least 1".into());
                check(*base_ms <= MAX_DELAY_MS, "baseMs", format!("must be at most {MAX_DELAY_MS}"));
                check(max_delay_ms >= base_ms, "maxDelayMs", "must be at least baseMs".into());
                check(*max_delay_ms <= MAX_DELAY_MS, "maxDelayMs", format!("must be at most {MAX_DELAY_MS}"));
                check_attempts(*max_attempts, &mut check);
            }
            Self::Fixed { interval_ms, jitter_ms, max_attempts } => {
                check(*interval_ms >= 1, "intervalMs", "must be at least 1".into());
                check(*interval_ms <= MAX_DELAY_MS, "intervalMs", format!("must be at most {MAX_DELAY_MS}"));
                check(jitter_ms <= interval_ms, "jitterMs", "must not exceed intervalMs".into());
                check_attempts(*max_attempts, &mut check);
            }
            Self::Schedule { delays_ms, jitter_percent } => {
                check(!delays_ms.is_empty(), "delaysMs", "must list at least one delay".into());
                check(
                    delays_ms.len() < MAX_ATTEMPTS as usize,
                    "delaysMs",
                    format!("must list fewer than {MAX_ATTEMPTS} delays"),
                );
                check(
                    delays_ms.iter().all(|d| *d <= MAX_DELAY_MS),
                    "delaysMs",
                    format!("every delay must be at most {MAX_DELAY_MS}"),
                );
                check(*jitter_percent <= 100, "jitterPercent", "must be between 0 and 100".into());
            }
        }
        problems
    }

    /// How long to wait before retry number `retry` (0 for the retry after the first attempt).
    pub fn delay(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let ms = match self {
            Self::Exponential { base_ms, max_delay_ms, .. } => {
                let ceiling = base_ms
                    .checked_shl(retry.min(63))
                    .filter(|v| v >> retry.min(63) == *base_ms)
                    .unwrap_or(u64::MAX)
                    .min(*max_delay_ms);
                rng.random_range(0..=ceiling)
            }
            Self::Fixed { interval_ms, jitter_ms, .. } => {
                rng.random_range(interval_ms.saturating_sub(*jitter_ms)..=interval_ms.saturating_add(*jitter_ms))
            }
            Self::Schedule { delays_ms, jitter_percent } => {
                let base = delays_ms.get(retry as usize).or(delays_ms.last()).copied().unwrap_or(0);
                let spread = base * u64::from(*jitter_percent) / 100;
                rng.random_range(base.saturating_sub(spread)..=base.saturating_add(spread))
            }
        };
        Duration::from_millis(ms)
    }
}

fn check_attempts(max_attempts: u32, check: &mut impl FnMut(bool, &'static str, String)) {
    check((1..=MAX_ATTEMPTS).contains(&max_attempts), "maxAttempts", format!("must be between 1 and {MAX_ATTEMPTS}"));
}

/// Parses a `Retry-After` value: delta-seconds or an HTTP date (relative to `now`).
/// Garbage, negative numbers and non-integers yield `None`; huge values saturate.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Saturate instead of overflowing: "99999999999999999999999" means "a very long time".
        let secs = value.parse::<u64>().unwrap_or(u64::MAX).min(MAX_DELAY_MS / 1000);
        return Some(Duration::from_secs(secs));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    let wait = date.duration_since(now).unwrap_or(Duration::ZERO);
    Some(wait.min(Duration::from_millis(MAX_DELAY_MS)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn rng() -> StdRng {
        StdRng::seed_from_u64(7)
    }

    #[test]
    fn default_policy_is_full_jitter_exponential_with_twelve_attempts() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.max_attempts(), 12);
        let mut rng = rng();
        for retry in 0..11 {
            let ceiling = (30_000u64 << retry).min(3_600_000);
            let mut max_seen = 0;
            for _ in 0..500 {
                let d = policy.delay(retry, &mut rng).as_millis() as u64;
                assert!(d <= ceiling, "retry {retry}: {d} > {ceiling}");
                max_seen = max_seen.max(d);
            }
            // Full jitter spreads over the whole range, not just near the ceiling or zero.
            assert!(max_seen > ceiling / 2, "retry {retry}: max {max_seen}");
        }
    }

    #[test]
    fn exponential_ceiling_never_overflows_on_huge_retry_numbers() {
        let policy = RetryPolicy::Exponential { base_ms: MAX_DELAY_MS, max_delay_ms: MAX_DELAY_MS, max_attempts: 100 };
        let mut rng = rng();
        for retry in [40, 63, 64, 1000, u32::MAX] {
            assert!(policy.delay(retry, &mut rng).as_millis() as u64 <= MAX_DELAY_MS);
        }
    }

    #[test]
    fn fixed_policy_stays_within_interval_plus_minus_jitter() {
        let policy = RetryPolicy::Fixed { interval_ms: 600_000, jitter_ms: 30_000, max_attempts: 7 };
        let mut rng = rng();
        let delays: Vec<u64> = (0..1000).map(|i| policy.delay(i % 6, &mut rng).as_millis() as u64).collect();
        assert!(delays.iter().all(|d| (570_000..=630_000).contains(d)));
        assert!(delays.iter().any(|d| *d < 590_000) && delays.iter().any(|d| *d > 610_000));
        assert_eq!(policy.max_attempts(), 7);
        assert_eq!(policy.cap_ms(), 630_000);
    }

    #[test]
    fn schedule_policy_follows_its_delays_with_percent_jitter() {
        let policy = RetryPolicy::Schedule { delays_ms: vec![5000, 300_000], jitter_percent: 20 };
        assert_eq!(policy.max_attempts(), 3);
        let mut rng = rng();
        for _ in 0..200 {
            let first = policy.delay(0, &mut rng).as_millis() as u64;
            let second = policy.delay(1, &mut rng).as_millis() as u64;
            assert!((4000..=6000).contains(&first));
            assert!((240_000..=360_000).contains(&second));
        }
        let exact = RetryPolicy::Schedule { delays_ms: vec![10, 20], jitter_percent: 0 };
        assert_eq!(exact.delay(1, &mut rng), Duration::from_millis(20));
    }

    #[test]
    fn svix_preset_makes_eight_attempts() {
        assert_eq!(RetryPolicy::svix_preset().max_attempts(), 8);
        assert!(RetryPolicy::svix_preset().problems().is_empty());
    }

    #[test]
    fn invalid_policies_name_the_field() {
        let bad = RetryPolicy::Fixed { interval_ms: 10, jitter_ms: 20, max_attempts: 0 };
        let fields: Vec<_> = bad.problems().into_iter().map(|(f, _)| f).collect();
        assert_eq!(fields, vec!["jitterMs", "maxAttempts"]);
        let bad = RetryPolicy::Exponential { base_ms: 100, max_delay_ms: 10, max_attempts: 3 };
        assert_eq!(bad.problems()[0].0, "maxDelayMs");
        let bad = RetryPolicy::Schedule { delays_ms: vec![], jitter_percent: 101 };
        assert_eq!(bad.problems().len(), 2);
    }

    #[test]
    fn policies_parse_from_their_documented_json() {
        let parsed: RetryPolicy =
            serde_json::from_str(r#"{"strategy":"exponential","baseMs":30000,"maxDelayMs":3600000,"maxAttempts":12}"#)
                .unwrap();
        assert_eq!(parsed, RetryPolicy::default());
        let fixed: RetryPolicy =
            serde_json::from_str(r#"{"strategy":"fixed","intervalMs":600000,"jitterMs":30000,"maxAttempts":7}"#)
                .unwrap();
        assert_eq!(fixed.max_attempts(), 7);
        let schedule: RetryPolicy =
            serde_json::from_str(r#"{"strategy":"schedule","delaysMs":[5000,300000,1800000],"jitterPercent":20}"#)
                .unwrap();
        assert_eq!(schedule.max_attempts(), 4);
        assert!(serde_json::from_str::<RetryPolicy>(r#"{"strategy":"fixed","intervalMs":1,"typo":1}"#).is_err());
        assert!(serde_json::from_str::<RetryPolicy>(r#"{"strategy":"linear"}"#).is_err());
    }

    #[test]
    fn retry_after_accepts_delta_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(parse_retry_after(&later, now), Some(Duration::from_secs(90)));
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
    }

    #[test]
    fn retry_after_garbage_and_huge_values_never_panic() {
        let now = SystemTime::now();
        for garbage in ["", "soon", "-5", "1.5", "1e300", "0x10", "Wed, 99 Foo 2024", "\u{0}", "9 9"] {
            assert_eq!(parse_retry_after(garbage, now), None, "{garbage:?}");
        }
        let huge = parse_retry_after("99999999999999999999999999999", now).unwrap();
        assert_eq!(huge, Duration::from_millis(MAX_DELAY_MS));
    }

    #[test]
    fn far_future_retry_after_dates_are_clamped_like_seconds() {
        // Found by the retry_after fuzz target.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let far = parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now).unwrap();
        assert_eq!(far, Duration::from_millis(MAX_DELAY_MS));
        assert_eq!(parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", SystemTime::UNIX_EPOCH), Some(far));
    }
}
