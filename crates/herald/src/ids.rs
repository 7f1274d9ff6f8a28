//! Typed, prefixed identifiers (`app_…`, `ep_…`, `msg_…`, `atmpt_…`).
//!
//! Ids are time-sortable: 48 bits of milliseconds followed by an 80-bit field that starts
//! as 79 random bits (its top bit clear, so counting up within one millisecond never
//! overflows it), written in base62 with a fixed width, so sorting the strings sorts by creation time. List pagination
//! relies on that (the iterator is simply the last id of a page).
//!
//! Applications and endpoints may also carry an id another server minted (`herald import
//! svix` keeps Svix's ids): it is opaque to Herald, sorts among the others by its bytes, and
//! only has to look like an id ([`is_id_body`]), so that a malformed list iterator is still
//! refused as Svix refuses it.

use std::fmt;
use std::sync::Mutex;

use rand::RngCore;
use serde::{Deserialize, Serialize};

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// 128 bits need 22 base62 digits.
const WIDTH: usize = 22;

/// The lengths of the id bodies accepted from elsewhere (Herald's are 22 characters,
/// Svix's 27).
pub const FOREIGN_BODY_LEN: std::ops::RangeInclusive<usize> = 16..=64;

/// Whether `body` (an id without its prefix) can be an id: Herald's own, or one minted by
/// another server: [`FOREIGN_BODY_LEN`] letters and digits.
pub fn is_id_body(body: &str) -> bool {
    FOREIGN_BODY_LEN.contains(&body.len()) && body.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// Last generated (millis, random) pair, so ids minted in the same millisecond still sort
/// in creation order within this process.
static LAST: Mutex<(u64, u128)> = Mutex::new((0, 0));

fn next_raw(now_ms: u64) -> u128 {
    let mut last = LAST.lock().unwrap_or_else(|poison| poison.into_inner());
    let random = if now_ms <= last.0 {
        // Same (or earlier, if the clock stepped back) millisecond: keep the previous
        // timestamp and count up, which keeps ids strictly increasing.
        last.1 + 1
    } else {
        let mut bytes = [0u8; 16];
        rand::rng().fill_bytes(&mut bytes[6..]);
        // Leave head room so increments within one millisecond never overflow 80 bits.
        u128::from_be_bytes(bytes) >> 1
    };
    let millis = now_ms.max(last.0);
    *last = (millis, random);
    ((millis as u128) << 80) | (random & ((1u128 << 80) - 1))
}

fn encode(mut value: u128) -> String {
    let mut out = [b'0'; WIDTH];
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(value % 62) as usize];
        value /= 62;
    }
    String::from_utf8(out.to_vec()).expect("alphabet is ASCII")
}

/// The smallest id body created at `ms`: every id of an earlier time sorts below it.
pub fn first_body_at(ms: i64) -> String {
    encode(u128::from(ms.max(0) as u64) << 80)
}

/// A fresh time-sortable id body (without prefix).
pub fn new_body() -> String {
    let now_ms = chrono::Utc::now().timestamp_millis().max(0) as u64;
    encode(next_raw(now_ms))
}

/// A random token of `bytes` bytes, base62 encoded (used for secrets and access tokens).
pub fn random_token(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    buf.chunks(16)
        .map(|chunk| {
            let mut block = [0u8; 16];
            block[16 - chunk.len()..].copy_from_slice(chunk);
            encode(u128::from_be_bytes(block))
        })
        .collect()
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// Mints a new id.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, new_body()))
            }

            /// Accepts a string that carries this id type's prefix.
            pub fn parse(raw: &str) -> Option<Self> {
                (raw.starts_with($prefix) && raw.len() > $prefix.len()).then(|| Self(raw.to_owned()))
            }

            /// Accepts an id minted elsewhere (an import): this type's prefix and a body
            /// [`is_id_body`] accepts.
            pub fn parse_foreign(raw: &str) -> Option<Self> {
                raw.strip_prefix($prefix).is_some_and(is_id_body).then(|| Self(raw.to_owned()))
            }

            /// Wraps a value read back from storage, which only ever holds valid ids.
            pub fn from_trusted(raw: String) -> Self {
                Self(raw)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

prefixed_id!(
    /// An application: one of our user's customers.
    AppId,
    "app_"
);
prefixed_id!(
    /// An endpoint: a URL of an application that receives messages.
    EndpointId,
    "ep_"
);
prefixed_id!(
    /// A message: one event, fanned out to the matching endpoints.
    MessageId,
    "msg_"
);
prefixed_id!(
    /// One HTTP try of one delivery.
    AttemptId,
    "atmpt_"
);
prefixed_id!(
    /// A background task such as an endpoint recovery.
    TaskId,
    "qtask_"
);
prefixed_id!(
    /// A poller: an application's messages, filtered like an endpoint's, read by consumers
    /// that pull them instead of receiving webhooks.
    PollerId,
    "poll_"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_their_prefix_and_fixed_width() {
        let id = MessageId::generate();
        assert!(id.as_str().starts_with("msg_"));
        assert_eq!(id.as_str().len(), 4 + WIDTH);
    }

    #[test]
    fn ids_sort_in_creation_order_even_within_one_millisecond() {
        let ids: Vec<_> = (0..2000).map(|_| AppId::generate()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        let mut dedup = sorted.clone();
        dedup.dedup();
        assert_eq!(dedup.len(), ids.len());
    }

    #[test]
    fn parse_requires_the_prefix() {
        assert!(EndpointId::parse("ep_abc").is_some());
        assert!(EndpointId::parse("app_abc").is_none());
        assert!(EndpointId::parse("ep_").is_none());
    }

    #[test]
    fn foreign_ids_carry_the_prefix_and_a_bounded_plain_body() {
        assert!(AppId::parse_foreign("app_2VbUtkDqdJdq8Vq1xkLvXmjYfSH").is_some());
        assert!(AppId::parse_foreign(&format!("app_{}", "a".repeat(64))).is_some());
        assert!(AppId::parse_foreign(&format!("app_{}", "a".repeat(16))).is_some());
        assert!(AppId::parse_foreign(&format!("app_{}", "a".repeat(65))).is_none());
        assert!(AppId::parse_foreign(&format!("app_{}", "a".repeat(15))).is_none());
        let odd = format!("app_{}", "a-b_c".repeat(4));
        for bad in ["app_", "ep_abc", "app_short", odd.as_str(), "app_aaaaaaaaaaaaaaa/b", "app_aaaaaaaaaaaaaaaaé"] {
            assert!(AppId::parse_foreign(bad).is_none(), "{bad}");
        }
        assert!(is_id_body(&AppId::generate().as_str()[4..]));
    }

    #[test]
    fn random_tokens_have_the_requested_strength() {
        let token = random_token(32);
        assert_eq!(token.len(), 2 * WIDTH);
        assert_ne!(token, random_token(32));
    }
}
