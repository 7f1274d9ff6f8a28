//! Per-token request rate limits: each token (the admin token, every app-portal token) has
//! its own bucket; a request beyond it gets 429 with `Retry-After`. Failed authentications
//! have a budget per client address: once it is spent, a wrong token from that address is
//! answered 429 instead of 401 until it refills, which tells a well-behaved client to stop
//! and keeps the log quiet. A valid token is never refused for it (nobody can lock out
//! others who share their address); guessing is hopeless anyway (tokens carry 192 bits
//! or more). Buckets live in memory, per process; a full map forgets the buckets that have
//! refilled (the same as new ones) first, then the half nearest to refilling
//! ([`MAX_BUCKETS`]).
//!
//! Not governor (weighed in issue 33): its keyed limiter bounds its map only when asked to
//! forget idle keys, and it keeps time through a clock trait of its own; these buckets are
//! the same `TokenBucket` the lanes use for `throttleRate` (pure, the time passed in), and
//! the map's bound holds under a flood of new keys by construction.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use crate::clock::{Millis, now_ms};
use crate::throttle::TokenBucket;

/// Buckets kept at most. A bucket that has refilled is the same as a new one, so those go
/// first when the map is full; if none has, the ones that will refill soonest (the least
/// recently drained) go, so a flood of new keys can never grow the map past the bound.
const MAX_BUCKETS: usize = 10_000;

/// Makes room for `key` in a full map of buckets (see [`MAX_BUCKETS`]).
fn make_room<K, Q>(buckets: &mut HashMap<K, TokenBucket>, key: &Q, now: Millis)
where
    K: Borrow<Q> + Hash + Eq,
    Q: Hash + Eq + ?Sized,
{
    if buckets.len() < MAX_BUCKETS || buckets.contains_key(key) {
        return;
    }
    buckets.retain(|_, bucket| !bucket.is_full(now));
    if buckets.len() >= MAX_BUCKETS {
        let mut refills: Vec<Millis> = buckets.values().map(|b| b.full_at(now)).collect();
        let cut = refills.len() / 2;
        let (_, median, _) = refills.select_nth_unstable(cut);
        let median = *median;
        buckets.retain(|_, bucket| bucket.full_at(now) > median);
    }
}

pub struct RateLimiter {
    /// Requests per second for app-portal tokens; `None`: unlimited.
    portal: Option<u16>,
    /// Requests per second for the admin token; `None`: unlimited.
    admin: Option<u16>,
    buckets: Mutex<HashMap<String, TokenBucket>>,
    /// Failed authentications per client address and minute; `None`: unlimited.
    failures_per_minute: Option<u16>,
    failures: Mutex<HashMap<IpAddr, TokenBucket>>,
}

const MINUTE_MS: i64 = 60_000;

impl RateLimiter {
    pub fn new(portal: Option<u16>, admin: Option<u16>, failures_per_minute: Option<u16>) -> Self {
        Self { portal, admin, buckets: Mutex::default(), failures_per_minute, failures: Mutex::default() }
    }

    /// Books a failed authentication from `client`: `Err` (how long until the budget has
    /// room again) when it was already spent.
    pub fn failed_authentication(&self, client: IpAddr) -> Result<(), Duration> {
        self.failed_authentication_at(client, now_ms())
    }

    fn failed_authentication_at(&self, client: IpAddr, now: Millis) -> Result<(), Duration> {
        let Some(rate) = self.failures_per_minute else { return Ok(()) };
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        make_room(&mut failures, &client, now);
        let bucket = failures.entry(client).or_insert_with(|| TokenBucket::per(rate, MINUTE_MS, now));
        match bucket.check(now) {
            Ok(()) => {
                bucket.take(now);
                Ok(())
            }
            Err(at) => Err(Duration::from_millis((at - now).max(1) as u64)),
        }
    }

    /// Takes one request from `token`'s bucket, or says how long to wait.
    pub fn admit(&self, token: &str, admin: bool) -> Result<(), Duration> {
        let Some(rate) = (if admin { self.admin } else { self.portal }) else { return Ok(()) };
        self.admit_at(token, rate, now_ms())
    }

    fn admit_at(&self, token: &str, rate: u16, now: Millis) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        make_room(&mut buckets, token, now);
        let bucket = buckets.entry(token.to_owned()).or_insert_with(|| TokenBucket::new(rate, now));
        match bucket.check(now) {
            Ok(()) => {
                bucket.take(now);
                Ok(())
            }
            Err(at) => Err(Duration::from_millis((at - now).max(1) as u64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_authentications_are_budgeted_per_client_address() {
        let limiter = RateLimiter::new(None, None, Some(3));
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        for _ in 0..3 {
            assert_eq!(limiter.failed_authentication_at(a, 0), Ok(()));
        }
        assert_eq!(limiter.failed_authentication_at(a, 0), Err(Duration::from_millis(20_000)), "3 a minute");
        assert_eq!(limiter.failed_authentication_at(b, 0), Ok(()), "another address is not affected");
        assert_eq!(limiter.failed_authentication_at(a, 20_000), Ok(()));
        let unlimited = RateLimiter::new(None, None, None);
        for _ in 0..100 {
            assert_eq!(unlimited.failed_authentication_at(a, 0), Ok(()));
        }
    }

    #[test]
    fn a_full_map_forgets_refilled_buckets_then_the_soonest_to_refill_never_a_drained_one() {
        let limiter = RateLimiter::new(Some(10), None, None);
        // The victim drains its bucket first; then a flood of one-request tokens fills the map.
        for _ in 0..10 {
            assert_eq!(limiter.admit_at("victim", 10, 0), Ok(()));
        }
        for i in 0..MAX_BUCKETS * 2 {
            let _ = limiter.admit_at(&format!("flood-{i}"), 10, 1 + (i as Millis) / 1000);
        }
        let buckets = limiter.buckets.lock().unwrap();
        assert!(buckets.len() <= MAX_BUCKETS, "bounded: {}", buckets.len());
        drop(buckets);
        assert!(limiter.admit_at("victim", 10, 50).is_err(), "its drained bucket was kept, not reset to full");
    }

    #[test]
    fn each_token_has_its_own_bucket_of_one_second() {
        let limiter = RateLimiter::new(Some(3), None, None);
        for _ in 0..3 {
            assert_eq!(limiter.admit_at("a", 3, 0), Ok(()));
        }
        assert_eq!(limiter.admit_at("a", 3, 0), Err(Duration::from_millis(334)));
        assert_eq!(limiter.admit_at("b", 3, 0), Ok(()), "another token is not affected");
        assert_eq!(limiter.admit_at("a", 3, 334), Ok(()));
    }

    #[test]
    fn unlimited_kinds_are_never_refused() {
        let limiter = RateLimiter::new(Some(1), None, None);
        for _ in 0..100 {
            assert_eq!(limiter.admit("admin", true), Ok(()));
        }
        assert_eq!(limiter.admit("portal", false), Ok(()));
        assert!(limiter.admit("portal", false).is_err());
    }
}
