//! Time as Herald stores and prints it: milliseconds since the Unix epoch, shown as RFC 3339.

use chrono::{DateTime, SecondsFormat, Utc};

/// Milliseconds since the Unix epoch (UTC).
pub type Millis = i64;

pub fn now_ms() -> Millis {
    Utc::now().timestamp_millis()
}

/// `2024-01-02T03:04:05.678Z`.
pub fn to_rfc3339(ms: Millis) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms).unwrap_or_default().to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Parses an RFC 3339 timestamp (any offset) into milliseconds.
pub fn parse_rfc3339(s: &str) -> Option<Millis> {
    DateTime::parse_from_rfc3339(s.trim()).ok().map(|t| t.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_with_millisecond_precision() {
        let ms = 1_700_000_000_123;
        assert_eq!(to_rfc3339(ms), "2023-11-14T22:13:20.123Z");
        assert_eq!(parse_rfc3339(&to_rfc3339(ms)), Some(ms));
        assert_eq!(parse_rfc3339("2023-11-14T23:13:20.123+01:00"), Some(ms));
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
