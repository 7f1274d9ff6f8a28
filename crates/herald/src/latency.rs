//! Latency percentiles per endpoint over a rolling 24-hour window, without scanning attempts.
//!
//! Durations go into log-scaled buckets 2 % wide (so any percentile is within about 1 % of
//! the truth), kept as sparse counts that merge by addition. The window is 24 hourly
//! histograms: recording touches the current hour, reading merges the last 24. Processes
//! flush their new counts into the store (see `dispatch::latency`), where histograms of the
//! same endpoint and hour are added together.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;

/// Smallest distinguished duration, in milliseconds.
const FLOOR_MS: f64 = 0.1;
/// Ratio between successive bucket bounds.
const GROWTH: f64 = 1.02;
/// Hours in the rolling window.
pub const WINDOW_HOURS: i64 = 24;
/// p95 above which an endpoint counts as slow for its circuit breaker.
pub const SLOW_P95_MS: f64 = 5000.0;
/// Samples needed before percentiles are trusted.
pub const MIN_SAMPLES: u64 = 20;

/// Counts per bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Histogram(BTreeMap<u16, u64>);

impl Histogram {
    fn bucket(ms: f64) -> u16 {
        if ms <= FLOOR_MS || !ms.is_finite() {
            return 0;
        }
        ((ms / FLOOR_MS).ln() / GROWTH.ln()).floor().clamp(0.0, f64::from(u16::MAX)) as u16
    }

    /// The middle of a bucket (geometric), the value reported for it.
    fn value(bucket: u16) -> f64 {
        FLOOR_MS * GROWTH.powf(f64::from(bucket) + 0.5)
    }

    pub fn record(&mut self, ms: f64) {
        *self.0.entry(Self::bucket(ms)).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (bucket, count) in &other.0 {
            *self.0.entry(*bucket).or_default() += count;
        }
    }

    pub fn count(&self) -> u64 {
        self.0.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value below which a fraction `q` of the samples lie.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (bucket, count) in &self.0 {
            seen += count;
            if seen >= rank {
                return Some(Self::value(*bucket));
            }
        }
        None
    }

    pub fn summary(&self) -> LatencySummary {
        let count = self.count();
        let p95 = self.quantile(0.95);
        LatencySummary {
            p50_ms: self.quantile(0.5),
            p95_ms: p95,
            p99_ms: self.quantile(0.99),
            sample_count: count,
            slow: count >= MIN_SAMPLES && p95.is_some_and(|p| p > SLOW_P95_MS),
        }
    }
}

/// What the health API and the breaker read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub sample_count: u64,
    /// p95 above 5 s with at least 20 samples.
    pub slow: bool,
}

/// The hour a time falls in (hours since the epoch).
pub fn hour_of(now: Millis) -> i64 {
    now.div_euclid(3_600_000)
}

/// The rolling window of one endpoint: hourly histograms of the last 24 hours.
#[derive(Debug, Clone, Default)]
pub struct Window {
    hours: BTreeMap<i64, Histogram>,
}

impl Window {
    pub fn record(&mut self, now: Millis, ms: f64) {
        let hour = hour_of(now);
        self.hours.entry(hour).or_default().record(ms);
        self.hours.retain(|h, _| *h > hour - WINDOW_HOURS);
    }

    /// Adds a histogram for an hour (persisted counts loaded at start-up, say).
    pub fn add(&mut self, hour: i64, histogram: &Histogram) {
        self.hours.entry(hour).or_default().merge(histogram);
    }

    /// Everything within the window ending at `now`, merged.
    pub fn merged(&self, now: Millis) -> Histogram {
        let hour = hour_of(now);
        let mut all = Histogram::default();
        for (_, h) in self.hours.range(hour - WINDOW_HOURS + 1..=hour) {
            all.merge(h);
        }
        all
    }

    /// Takes the counts recorded so far, leaving the window empty (for flushing deltas).
    pub fn take(&mut self) -> BTreeMap<i64, Histogram> {
        std::mem::take(&mut self.hours)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_distribution_are_within_two_percent() {
        let mut h = Histogram::default();
        for ms in 1..=1000 {
            h.record(f64::from(ms));
        }
        for (q, truth) in [(0.5, 500.0), (0.95, 950.0), (0.99, 990.0)] {
            let got = h.quantile(q).unwrap();
            assert!((got - truth).abs() / truth < 0.02, "q{q}: {got} vs {truth}");
        }
        assert_eq!(h.count(), 1000);
    }

    #[test]
    fn histograms_merge_by_addition() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        (0..50).for_each(|_| a.record(10.0));
        (0..50).for_each(|_| b.record(1000.0));
        a.merge(&b);
        assert_eq!(a.count(), 100);
        assert!(a.quantile(0.25).unwrap() < 11.0 && a.quantile(0.75).unwrap() > 990.0);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Histogram>(&json).unwrap(), a);
    }

    #[test]
    fn odd_values_never_panic() {
        let mut h = Histogram::default();
        for ms in [0.0, -5.0, f64::NAN, f64::INFINITY, 1e12] {
            h.record(ms);
        }
        assert_eq!(h.count(), 5);
        assert!(Histogram::default().quantile(0.5).is_none());
    }

    #[test]
    fn slowness_needs_twenty_samples_above_five_seconds_at_p95() {
        let mut h = Histogram::default();
        (0..19).for_each(|_| h.record(9000.0));
        assert!(!h.summary().slow, "too few samples");
        h.record(9000.0);
        assert!(h.summary().slow);
        (0..400).for_each(|_| h.record(10.0));
        assert!(!h.summary().slow, "p95 fell below 5 s");
    }

    #[test]
    fn the_window_keeps_twenty_four_hours() {
        let mut w = Window::default();
        let hour = 3_600_000;
        w.record(0, 10.0);
        w.record(10 * hour, 20.0);
        assert_eq!(w.merged(10 * hour).count(), 2);
        assert_eq!(w.merged(24 * hour).count(), 1, "the first hour left the window");
        w.record(30 * hour, 30.0);
        assert_eq!(w.merged(30 * hour).count(), 2);
        assert_eq!(w.take().len(), 2, "old hours are dropped as new ones are recorded");
        assert_eq!(w.merged(30 * hour).count(), 0);
    }
}
