//! Token buckets: Svix's `throttleRate` (messages per second, on an endpoint or an
//! application), and the API's request and failed-authentication budgets. A bucket holds at
//! most one period's worth of tokens (a second for `throttleRate`), so a quiet endpoint may
//! receive a short burst of `rate` messages, never more.

use crate::clock::Millis;

#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    /// Tokens per period.
    rate: i64,
    /// The period in milliseconds. Levels count tokens in 1/period units, so refilling by
    /// whole milliseconds (`rate` units each) is exact.
    period: i64,
    /// Tokens × period.
    level: i64,
    last: Millis,
}

impl TokenBucket {
    /// `rate` tokens per second.
    pub fn new(rate: u16, now: Millis) -> Self {
        Self::per(rate, 1000, now)
    }

    /// `rate` tokens per `period_ms` milliseconds, starting full.
    pub fn per(rate: u16, period_ms: i64, now: Millis) -> Self {
        let (rate, period) = (i64::from(rate.max(1)), period_ms.max(1));
        Self { rate, period, level: rate * period, last: now }
    }

    pub fn rate(&self) -> u16 {
        self.rate as u16
    }

    fn refill(&mut self, now: Millis) {
        let elapsed = (now - self.last).max(0);
        self.level = (self.level + elapsed.saturating_mul(self.rate)).min(self.rate * self.period);
        self.last = self.last.max(now);
    }

    /// Whether a token is available now, without taking it; `Err` carries when one will be.
    pub fn check(&mut self, now: Millis) -> Result<(), Millis> {
        self.refill(now);
        self.peek(now)
    }

    /// `check` without refilling first (nothing changes: callers holding a shared lock).
    pub fn peek(&self, now: Millis) -> Result<(), Millis> {
        let elapsed = (now - self.last).max(0);
        let level = (self.level + elapsed.saturating_mul(self.rate)).min(self.rate * self.period);
        if level >= self.period {
            Ok(())
        } else {
            let missing = self.period - level;
            Err(now + (missing + self.rate - 1) / self.rate)
        }
    }

    /// Takes a token (after a successful `check`).
    pub fn take(&mut self, now: Millis) {
        self.refill(now);
        self.level -= self.period;
    }

    /// Whether the bucket is full (an idle bucket that can be forgotten).
    pub fn is_full(&mut self, now: Millis) -> bool {
        self.refill(now);
        self.level == self.rate * self.period
    }

    /// When the bucket will be full again if nothing is taken (`now` if it is).
    pub fn full_at(&self, now: Millis) -> Millis {
        let elapsed = (now - self.last).max(0);
        let level = (self.level + elapsed.saturating_mul(self.rate)).min(self.rate * self.period);
        now + (self.rate * self.period - level + self.rate - 1) / self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_bucket_allows_a_burst_of_rate_tokens() {
        let mut b = TokenBucket::new(5, 0);
        for _ in 0..5 {
            assert_eq!(b.check(0), Ok(()));
            b.take(0);
        }
        assert_eq!(b.check(0), Err(200), "the next token comes after 1/rate");
    }

    #[test]
    fn tokens_refill_at_the_rate_and_never_beyond_one_second() {
        let mut b = TokenBucket::new(10, 0);
        for _ in 0..10 {
            b.take(0);
        }
        assert_eq!(b.check(99), Err(100));
        assert_eq!(b.check(100), Ok(()));
        b.take(100);
        assert!(b.check(100).is_err());
        // A long quiet spell refills to one second's worth, no more.
        assert_eq!(b.check(60_000), Ok(()));
        for _ in 0..10 {
            b.take(60_000);
        }
        assert!(b.check(60_000).is_err());
    }

    #[test]
    fn over_a_long_run_the_rate_holds() {
        let mut b = TokenBucket::new(20, 0);
        let mut sent = 0;
        let mut now = 0;
        while now < 10_000 {
            match b.check(now) {
                Ok(()) => {
                    b.take(now);
                    sent += 1;
                }
                Err(at) => now = at,
            }
        }
        assert!((200..=221).contains(&sent), "{sent} in 10 s at 20/s (plus the first second's burst)");
    }

    #[test]
    fn a_bucket_per_minute_refills_a_token_every_sixtieth_of_it() {
        let mut b = TokenBucket::per(30, 60_000, 0);
        for _ in 0..30 {
            assert_eq!(b.check(0), Ok(()));
            b.take(0);
        }
        assert_eq!(b.check(0), Err(2000), "30 a minute: one every 2 s");
        assert!(!b.is_full(59_999));
        assert!(b.is_full(60_000));
    }

    #[test]
    fn a_drained_bucket_says_when_it_is_full_again() {
        let mut bucket = TokenBucket::new(10, 0);
        assert_eq!(bucket.full_at(0), 0);
        bucket.take(0);
        bucket.take(0);
        assert_eq!(bucket.full_at(0), 200, "two tokens at ten a second");
        assert_eq!(bucket.full_at(150), 200);
        assert_eq!(bucket.full_at(500), 500);
    }

    #[test]
    fn a_clock_that_steps_back_grants_nothing_extra() {
        let mut b = TokenBucket::new(1, 1000);
        b.take(1000);
        assert!(b.check(500).is_err());
        assert_eq!(b.check(2000), Ok(()));
    }
}
