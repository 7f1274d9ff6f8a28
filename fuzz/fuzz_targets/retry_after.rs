//! Header values from the receiver's response: `Retry-After` and `Content-Length`.
//!
//! Input layout: `<now, unix seconds, may be negative>\n<limit>\n<header value>`.
//!
//! Properties:
//! - `retry::parse_retry_after` never panics, for any value and any clock (the fuzzed
//!   `now`, which may be before 1970, and the real one), and whatever it returns is at
//!   most `retry::MAX_DELAY_MS`;
//! - `deliver::announced_length_fits` never panics, and says yes only when the trimmed
//!   value is an integer no larger than the limit.
//!
//! Past finding (fuzz/regressions/retry_after/): HTTP dates were not clamped, only
//! delta-seconds were; fixed, with a unit test in `retry.rs`.
#![no_main]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herald::deliver::announced_length_fits;
use herald::retry::{MAX_DELAY_MS, parse_retry_after};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &str| {
    let mut parts = input.splitn(3, '\n');
    let now_secs: i64 = parts.next().unwrap_or("").parse().unwrap_or(0);
    let limit: usize = parts.next().unwrap_or("").parse().unwrap_or(0);
    let value = parts.next().unwrap_or("");

    let offset = Duration::from_secs(now_secs.unsigned_abs());
    let now = if now_secs >= 0 { UNIX_EPOCH.checked_add(offset) } else { UNIX_EPOCH.checked_sub(offset) };
    for now in [now.unwrap_or(UNIX_EPOCH), SystemTime::now()] {
        if let Some(delay) = parse_retry_after(value, now) {
            let clamp = Duration::from_millis(MAX_DELAY_MS);
            assert!(delay <= clamp, "Retry-After {value:?} at {now:?} gave {delay:?}, over the {clamp:?} clamp");
        }
    }

    if announced_length_fits(value, limit) {
        let n: u128 = value.trim().parse().expect("a fitting length is an integer");
        assert!(n <= limit as u128, "{value:?} fits a limit of {limit}");
    }
});
