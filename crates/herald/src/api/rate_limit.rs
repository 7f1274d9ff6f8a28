//! Per-token request rate limits: each token (the admin token, every app-portal token) has
//! its own bucket; a request beyond it gets 429 with `Retry-After`. Failed authentications
//! have a budget per client address: once it is spent, every authentication from that
//! address gets 429 until it refills, so guessing tokens is slow. Buckets live in memory,
//! per process.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use crate::clock::{Millis, now_ms};
use crate::throttle::TokenBucket;

/// Buckets kept at most; beyond it, full (idle) buckets are forgotten.
const MAX_BUCKETS: usize = 10_000;

pub struct RateLimiter {
    /// Requests per second for app-portal tokens; `None`: unlimited.
    portal: Option<u16>,
    /// Requests per second for the admin token; `None`: unlimited.
    admin: Option<u16>,
    buckets: Mutex<HashMap<String, TokenBucket>>,
    /// Failed authentications per client address and minute; `None`: unlimited.
    failures_per_minute: Option<u16>,
    /// Read on every authentication, written only on failures.
    failures: RwLock<HashMap<IpAddr, TokenBucket>>,
}

const MINUTE_MS: i64 = 60_000;

impl RateLimiter {
    pub fn new(portal: Option<u16>, admin: Option<u16>, failures_per_minute: Option<u16>) -> Self {
        Self { portal, admin, buckets: Mutex::default(), failures_per_minute, failures: RwLock::default() }
    }

    /// Whether `client` may try to authenticate now; `Err` says how long to wait.
    pub fn may_authenticate(&self, client: IpAddr) -> Result<(), Duration> {
        self.may_authenticate_at(client, now_ms())
    }

    /// Books a failed authentication from `client`.
    pub fn failed_authentication(&self, client: IpAddr) {
        self.failed_authentication_at(client, now_ms())
    }

    fn may_authenticate_at(&self, client: IpAddr, now: Millis) -> Result<(), Duration> {
        if self.failures_per_minute.is_none() {
            return Ok(());
        }
        let failures = self.failures.read().unwrap_or_else(|p| p.into_inner());
        if failures.is_empty() {
            return Ok(());
        }
        match failures.get(&client).map(|bucket| bucket.peek(now)) {
            Some(Err(at)) => Err(Duration::from_millis((at - now).max(1) as u64)),
            _ => Ok(()),
        }
    }

    fn failed_authentication_at(&self, client: IpAddr, now: Millis) {
        let Some(rate) = self.failures_per_minute else { return };
        let mut failures = self.failures.write().unwrap_or_else(|p| p.into_inner());
        if failures.len() >= MAX_BUCKETS && !failures.contains_key(&client) {
            failures.retain(|_, bucket| !bucket.is_full(now));
        }
        let bucket = failures.entry(client).or_insert_with(|| TokenBucket::per(rate, MINUTE_MS, now));
        if bucket.check(now).is_ok() {
            bucket.take(now);
        }
    }

    /// Takes one request from `token`'s bucket, or says how long to wait.
    pub fn admit(&self, token: &str, admin: bool) -> Result<(), Duration> {
        let Some(rate) = (if admin { self.admin } else { self.portal }) else { return Ok(()) };
        self.admit_at(token, rate, now_ms())
    }

    fn admit_at(&self, token: &str, rate: u16, now: Millis) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(token) {
            buckets.retain(|_, bucket| bucket.check(now).is_err());
        }
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
            assert_eq!(limiter.may_authenticate_at(a, 0), Ok(()));
            limiter.failed_authentication_at(a, 0);
        }
        assert_eq!(limiter.may_authenticate_at(a, 0), Err(Duration::from_millis(20_000)), "3 a minute");
        assert_eq!(limiter.may_authenticate_at(b, 0), Ok(()), "another address is not affected");
        assert_eq!(limiter.may_authenticate_at(a, 20_000), Ok(()));
        let unlimited = RateLimiter::new(None, None, None);
        for _ in 0..100 {
            unlimited.failed_authentication_at(a, 0);
        }
        assert_eq!(unlimited.may_authenticate_at(a, 0), Ok(()));
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
