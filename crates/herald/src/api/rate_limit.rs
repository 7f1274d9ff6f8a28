//! Per-token request rate limits: each token (the admin token, every app-portal token) has
//! its own bucket; a request beyond it gets 429 with `Retry-After`. Buckets live in memory,
//! per process.

use std::collections::HashMap;
use std::sync::Mutex;
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
}

impl RateLimiter {
    pub fn new(portal: Option<u16>, admin: Option<u16>) -> Self {
        Self { portal, admin, buckets: Mutex::default() }
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
    fn each_token_has_its_own_bucket_of_one_second() {
        let limiter = RateLimiter::new(Some(3), None);
        for _ in 0..3 {
            assert_eq!(limiter.admit_at("a", 3, 0), Ok(()));
        }
        assert_eq!(limiter.admit_at("a", 3, 0), Err(Duration::from_millis(334)));
        assert_eq!(limiter.admit_at("b", 3, 0), Ok(()), "another token is not affected");
        assert_eq!(limiter.admit_at("a", 3, 334), Ok(()));
    }

    #[test]
    fn unlimited_kinds_are_never_refused() {
        let limiter = RateLimiter::new(Some(1), None);
        for _ in 0..100 {
            assert_eq!(limiter.admit("admin", true), Ok(()));
        }
        assert_eq!(limiter.admit("portal", false), Ok(()));
        assert!(limiter.admit("portal", false).is_err());
    }
}
