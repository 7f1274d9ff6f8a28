//! Token buckets for Svix's `throttleRate` (messages per second, on an endpoint or an
//! application). A bucket holds at most one second's worth of tokens, so a quiet endpoint
//! may receive a short burst of `rate` messages, never more.

use crate::clock::Millis;

/// Counted in thousandths of a token, so refilling by whole milliseconds is exact.
const UNIT: i64 = 1000;

#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    /// Tokens per second, which is also thousandths of a token per millisecond.
    rate: i64,
    /// Thousandths of a token.
    level: i64,
    last: Millis,
}

impl TokenBucket {
    pub fn new(rate: u16, now: Millis) -> Self {
        let rate = i64::from(rate.max(1));
        Self { rate, level: rate * UNIT, last: now }
    }

    pub fn rate(&self) -> u16 {
        self.rate as u16
    }

    fn refill(&mut self, now: Millis) {
        let elapsed = (now - self.last).max(0);
        self.level = (self.level + elapsed.saturating_mul(self.rate)).min(self.rate * UNIT);
        self.last = self.last.max(now);
    }

    /// Whether a token is available now, without taking it; `Err` carries when one will be.
    pub fn check(&mut self, now: Millis) -> Result<(), Millis> {
        self.refill(now);
        if self.level >= UNIT {
            Ok(())
        } else {
            let missing = UNIT - self.level;
            Err(now + (missing + self.rate - 1) / self.rate)
        }
    }

    /// Takes a token (after a successful `check`).
    pub fn take(&mut self, now: Millis) {
        self.refill(now);
        self.level -= UNIT;
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
    fn a_clock_that_steps_back_grants_nothing_extra() {
        let mut b = TokenBucket::new(1, 1000);
        b.take(1000);
        assert!(b.check(500).is_err());
        assert_eq!(b.check(2000), Ok(()));
    }
}
