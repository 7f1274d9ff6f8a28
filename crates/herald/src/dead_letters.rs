//! Dead-letter analysis: per endpoint, how many messages died, of what, when, and which
//! pattern that suggests, with a hint for the operator. Pure: it reads rows the store
//! returned.
//!
//! Patterns, first match wins (shares are of the endpoint's dead letters in the window):
//! - `permanent`: at least half ended on 404, 410, a name that does not exist, or a refused
//!   destination — the URL is wrong.
//! - `authChanged`: at least half ended on 401 or 403 — the receiver's credentials changed.
//! - `rateLimited`: at least half ended on 429 — the receiver throttles us.
//! - `burst`: at least 5 dead letters, 80 % of them within one hour — the endpoint was down
//!   for longer than the retry window.
//! - `trickle`: anything else — a few now and then.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::clock::Millis;
use crate::ids::{AppId, EndpointId};
use crate::store::DeadLetter;

/// Share of an endpoint's dead letters that makes a status pattern.
const DOMINANT_SHARE: f64 = 0.5;
/// A burst: at least this many dead letters...
const BURST_MIN: usize = 5;
/// ...with this share of them...
const BURST_SHARE: f64 = 0.8;
/// ...inside a span this long.
const BURST_SPAN_MS: Millis = 3_600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum Pattern {
    Burst,
    AuthChanged,
    RateLimited,
    Trickle,
    Permanent,
}

impl Pattern {
    /// What the operator should do about it.
    pub fn hint(self) -> &'static str {
        match self {
            Self::Burst => {
                "the endpoint was down for longer than the retry window: replay the time range once it is back"
            }
            Self::AuthChanged => "the receiver refuses our requests (401/403): its credentials were probably rotated",
            Self::RateLimited => "the receiver rate-limits us (429): set a throttleRate on the endpoint",
            Self::Trickle => "a few failures spread out: raise the number of attempts or lower the timeout",
            Self::Permanent => "the URL looks wrong (404/410/unknown host): fix the endpoint URL, then replay",
        }
    }
}

/// The analysis of one endpoint's dead letters.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointDeadLetters {
    #[schema(value_type = String)]
    pub app_id: AppId,
    #[schema(value_type = String)]
    pub endpoint_id: EndpointId,
    pub dead_count: usize,
    /// The most common error class of the last attempts (`http_status`, `timeout`, …).
    pub primary_error: String,
    /// The most common error message among those, when there is one.
    pub primary_error_message: Option<String>,
    /// The most common status code of the last attempts (absent when none answered).
    pub primary_status_code: Option<u16>,
    pub first_dead_at: Millis,
    pub last_dead_at: Millis,
    pub avg_attempts: f64,
    pub pattern: Pattern,
    pub hint: &'static str,
}

/// Groups dead letters by endpoint and analyses each group; most dead letters first.
pub fn analyse(letters: &[DeadLetter]) -> Vec<EndpointDeadLetters> {
    let mut by_endpoint: BTreeMap<&EndpointId, Vec<&DeadLetter>> = BTreeMap::new();
    for letter in letters {
        by_endpoint.entry(&letter.endpoint_id).or_default().push(letter);
    }
    let mut out: Vec<EndpointDeadLetters> = by_endpoint.into_values().map(|group| summarise(&group)).collect();
    out.sort_by(|a, b| b.dead_count.cmp(&a.dead_count).then(b.last_dead_at.cmp(&a.last_dead_at)));
    out
}

fn summarise(group: &[&DeadLetter]) -> EndpointDeadLetters {
    let first = group[0];
    let pattern = pattern(group);
    let class = |d: &&DeadLetter| d.error_class.clone().unwrap_or_else(|| "unknown".into());
    EndpointDeadLetters {
        app_id: first.app_id.clone(),
        endpoint_id: first.endpoint_id.clone(),
        dead_count: group.len(),
        primary_error: most_common(group.iter().map(class)).unwrap_or_default(),
        primary_error_message: most_common(group.iter().filter_map(|d| d.error.clone())),
        primary_status_code: most_common(group.iter().map(|d| d.status_code).filter(|s| *s != 0)),
        first_dead_at: group.iter().map(|d| d.dead_at).min().unwrap_or_default(),
        last_dead_at: group.iter().map(|d| d.dead_at).max().unwrap_or_default(),
        avg_attempts: group.iter().map(|d| f64::from(d.attempts)).sum::<f64>() / group.len() as f64,
        pattern,
        hint: pattern.hint(),
    }
}

/// The pattern of one endpoint's dead letters (see the module documentation).
pub fn pattern(group: &[&DeadLetter]) -> Pattern {
    let share = |test: &dyn Fn(&DeadLetter) -> bool| {
        group.iter().filter(|d| test(d)).count() as f64 / group.len().max(1) as f64
    };
    let wrong_url = |d: &DeadLetter| {
        matches!(d.status_code, 404 | 410)
            || matches!(d.error_class.as_deref(), Some("dns_not_found" | "blocked_destination"))
    };
    if share(&wrong_url) >= DOMINANT_SHARE {
        return Pattern::Permanent;
    }
    if share(&|d| matches!(d.status_code, 401 | 403)) >= DOMINANT_SHARE {
        return Pattern::AuthChanged;
    }
    if share(&|d| d.status_code == 429) >= DOMINANT_SHARE {
        return Pattern::RateLimited;
    }
    if group.len() >= BURST_MIN && densest_span(group) as f64 >= BURST_SHARE * group.len() as f64 {
        return Pattern::Burst;
    }
    Pattern::Trickle
}

/// The most dead letters inside any window of `BURST_SPAN_MS`.
fn densest_span(group: &[&DeadLetter]) -> usize {
    let mut times: Vec<Millis> = group.iter().map(|d| d.dead_at).collect();
    times.sort_unstable();
    let mut best = 0;
    let mut start = 0;
    for end in 0..times.len() {
        while times[end] - times[start] > BURST_SPAN_MS {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

fn most_common<T: std::hash::Hash + Eq + Ord + Clone>(items: impl Iterator<Item = T>) -> Option<T> {
    let mut counts: HashMap<T, usize> = HashMap::new();
    for item in items {
        *counts.entry(item).or_default() += 1;
    }
    // Ties go to the smallest value, so the answer does not depend on hashing.
    counts.into_iter().max_by(|(a, na), (b, nb)| na.cmp(nb).then(b.cmp(a))).map(|(item, _)| item)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MessageId;

    const HOUR: Millis = 3_600_000;

    fn letter(endpoint: &EndpointId, status: u16, class: &str, dead_at: Millis) -> DeadLetter {
        DeadLetter {
            delivery_id: 1,
            app_id: AppId::from_trusted("app_1".into()),
            endpoint_id: endpoint.clone(),
            msg_id: MessageId::generate(),
            event_type: "t".into(),
            dead_at,
            attempts: 12,
            status_code: status,
            error_class: Some(class.into()),
            error: None,
        }
    }

    fn pattern_of(letters: &[DeadLetter]) -> Pattern {
        pattern(&letters.iter().collect::<Vec<_>>())
    }

    #[test]
    fn status_patterns_need_half_of_the_dead_letters() {
        let e = EndpointId::generate();
        let mixed = |status: u16, class: &str| {
            let mut v: Vec<DeadLetter> = (0..5).map(|i| letter(&e, status, class, i * 10 * HOUR)).collect();
            v.extend((0..5).map(|i| letter(&e, 503, "http_status", i * 10 * HOUR)));
            v
        };
        assert_eq!(pattern_of(&mixed(404, "http_status")), Pattern::Permanent);
        assert_eq!(pattern_of(&mixed(0, "dns_not_found")), Pattern::Permanent);
        assert_eq!(pattern_of(&mixed(401, "http_status")), Pattern::AuthChanged);
        assert_eq!(pattern_of(&mixed(429, "http_status")), Pattern::RateLimited);
        let mut minority = mixed(429, "http_status");
        minority.push(letter(&e, 503, "http_status", 0));
        assert_eq!(pattern_of(&minority), Pattern::Trickle, "4xx in a minority, spread out");
    }

    #[test]
    fn bursts_are_many_dead_letters_within_an_hour() {
        let e = EndpointId::generate();
        let burst: Vec<DeadLetter> = (0..10).map(|i| letter(&e, 503, "http_status", 5 * HOUR + i * 60_000)).collect();
        assert_eq!(pattern_of(&burst), Pattern::Burst);
        let spread: Vec<DeadLetter> = (0..10).map(|i| letter(&e, 503, "http_status", i * 2 * HOUR)).collect();
        assert_eq!(pattern_of(&spread), Pattern::Trickle);
        let few: Vec<DeadLetter> = (0..4).map(|i| letter(&e, 0, "timeout", i)).collect();
        assert_eq!(pattern_of(&few), Pattern::Trickle, "fewer than five is never a burst");
    }

    #[test]
    fn the_summary_counts_and_ranks_endpoints() {
        let (a, b) = (EndpointId::generate(), EndpointId::generate());
        let mut letters: Vec<DeadLetter> = (0..3).map(|i| letter(&a, 503, "http_status", i * HOUR)).collect();
        letters.push(letter(&a, 0, "timeout", 10 * HOUR));
        letters.push(letter(&b, 410, "http_status", 7));
        let out = analyse(&letters);
        assert_eq!(out.len(), 2);
        let first = &out[0];
        assert_eq!((first.endpoint_id.clone(), first.dead_count), (a, 4));
        assert_eq!(first.primary_error, "http_status");
        assert_eq!(first.primary_status_code, Some(503));
        assert_eq!((first.first_dead_at, first.last_dead_at), (0, 10 * HOUR));
        assert_eq!(first.avg_attempts, 12.0);
        assert_eq!(out[1].pattern, Pattern::Permanent);
        assert!(!out[1].hint.is_empty());
    }
}
