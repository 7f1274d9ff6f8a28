//! Read-modify-write of a stored row, made atomic. A handler reads the row, applies the
//! request's change and writes the row back only if nobody wrote it in between: a row's
//! `updated_at` is its version (every write moves it forward, see [`next_version`]), and
//! the store's `update_*` calls compare it. When another write came first, the handler
//! reads the row again and applies its change to that, so two simultaneous requests both
//! take effect (a rotation and a PATCH, say), as if one had come after the other. After
//! [`TRIES`] lost races in a row the request answers 409 and changes nothing.

use super::error::{ApiError, ApiResult};
use crate::clock::{Millis, now_ms};

/// Reads and writes tried before a request gives up with 409.
pub const TRIES: usize = 8;

/// The version a row written now gets after `read_at`: the current time, but always past
/// the version read (two writes in one millisecond, or a clock set back, still differ).
pub fn next_version(read_at: Millis) -> Millis {
    now_ms().max(read_at + 1)
}

/// Runs its body (a read, a change and a conditional write: an `async` block's contents,
/// `?` included) until it does not lose a race (`ApiError::Stale`), at most [`TRIES`]
/// times; then 409. A macro rather than a function taking an async closure: the futures
/// of async closures that borrow are not provably `Send`, which axum's handlers must be.
macro_rules! retry_stale {
    ($($body:tt)*) => {{
        let mut tries = 0;
        loop {
            let attempt: $crate::api::ApiResult<_> = async { $($body)* }.await;
            tries += 1;
            match attempt {
                Err($crate::api::ApiError::Stale(_)) if tries < $crate::api::optimistic::TRIES => continue,
                Err($crate::api::ApiError::Stale(_)) => break Err($crate::api::optimistic::gave_up()),
                done => break done,
            }
        }
    }};
}
pub(crate) use retry_stale;

/// The answer once every try lost its race.
pub fn gave_up() -> ApiError {
    ApiError::Conflict(
        "the resource kept changing while this request was applied; nothing was changed, try again".into(),
    )
}

/// What a conditional write's answer means: `false` (another write came first) is a lost
/// race, retried by [`retry_stale`].
pub fn won(written: bool, what: &'static str) -> ApiResult<()> {
    if written { Ok(()) } else { Err(ApiError::Stale(what)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_always_moves_forward() {
        let now = now_ms();
        assert!(next_version(0) >= now);
        assert_eq!(next_version(now + 60_000), now + 60_001, "a version from a clock ahead still grows");
    }

    #[tokio::test]
    async fn lost_races_are_retried_and_end_in_a_conflict() {
        let mut tries = 0;
        let answer = retry_stale! {
            tries += 1;
            if tries < 3 { Err(ApiError::Stale("endpoint")) } else { Ok(tries) }
        };
        assert_eq!(answer.unwrap(), 3);
        let mut tries = 0;
        let answer: ApiResult<()> = retry_stale! {
            tries += 1;
            Err(ApiError::Stale("endpoint"))
        };
        assert!(matches!(answer, Err(ApiError::Conflict(_))));
        assert_eq!(tries, TRIES);
    }
}
