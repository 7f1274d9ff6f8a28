//! A consumer's iterator: a log position, opaque to consumers.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::api::error::{ApiError, ApiResult};
use crate::store::LogPosition;

/// The iterator text of a position (opaque to consumers).
pub(super) fn iterator_of(at: &LogPosition) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", at.major, at.minor))
}

pub(super) fn position_of(iterator: &str) -> ApiResult<LogPosition> {
    let bad = || ApiError::invalid("iterator", "is not an iterator this poller gave");
    let text = URL_SAFE_NO_PAD.decode(iterator).ok().and_then(|raw| String::from_utf8(raw).ok()).ok_or_else(bad)?;
    let (major, minor) = text.split_once('.').ok_or_else(bad)?;
    Ok(LogPosition { major: major.parse().map_err(|_| bad())?, minor: minor.to_owned() })
}
