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

/// Parses a timestamp into milliseconds: RFC 3339 (any offset), and what Svix also takes
/// (a space for the `T`, `UTC` for the offset: `2026-12-01 05:40:58.123456789 UTC`).
pub fn parse_time(s: &str) -> Option<Millis> {
    s.trim().parse::<DateTime<Utc>>().ok().map(|t| t.timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svix_style_times_parse_too() {
        let at = parse_time("2026-12-01T05:40:58.123Z").unwrap();
        for same in
            ["2026-12-01 05:40:58.123456789 UTC", "2026-12-01 05:40:58.123+00:00", "2026-12-01T07:40:58.123+02:00"]
        {
            assert_eq!(parse_time(same), Some(at), "{same}");
        }
        for bad in ["2026-12-01", "2026-12-01T05:40:58", "yesterday", ""] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn rfc3339_round_trips_with_millisecond_precision() {
        let ms = 1_700_000_000_123;
        assert_eq!(to_rfc3339(ms), "2023-11-14T22:13:20.123Z");
        assert_eq!(parse_time(&to_rfc3339(ms)), Some(ms));
        assert_eq!(parse_time("2023-11-14T23:13:20.123+01:00"), Some(ms));
        assert_eq!(parse_time("yesterday"), None);
    }
}
