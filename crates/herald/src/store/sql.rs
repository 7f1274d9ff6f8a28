//! The statements that read the same on both backends, written once. They are kept in
//! PostgreSQL's form (tables in the `herald` schema, `$n` parameters); [`sqlite`] gives
//! the same text in SQLite's form (no schema, `?n`). A statement whose dialects differ
//! (arrays, `UNNEST`, casts, `greatest`) lives with its backend.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

pub const INSERT_TOKEN: &str =
    "INSERT INTO herald.portal_token (hash, app_id, expires_at, created_at, sensitive, feature_flags)
     VALUES ($1, $2, $3, $4, $5, $6)";
pub const TOKEN: &str = "SELECT hash, app_id, expires_at, created_at, sensitive, feature_flags
     FROM herald.portal_token WHERE hash = $1";
pub const REVOKE_TOKEN: &str = "DELETE FROM herald.portal_token WHERE hash = $1";
pub const EXPIRE_TOKENS: &str = "UPDATE herald.portal_token SET expires_at = $2 WHERE app_id = $1 AND expires_at > $2";
pub const APP_TOKENS: &str =
    "SELECT hash, app_id, expires_at, created_at, sensitive, feature_flags FROM herald.portal_token
     WHERE app_id = $1 AND expires_at > $2 ORDER BY created_at DESC";

pub const SESSION_COLUMNS: &str = "hash, id, app_id, token_hash, created_at, expires_at";
pub const INSERT_SESSION: &str = "INSERT INTO herald.session (hash, id, app_id, token_hash, created_at, expires_at)
     VALUES ($1, $2, $3, $4, $5, $6)";
pub const SESSION: &str =
    "SELECT hash, id, app_id, token_hash, created_at, expires_at FROM herald.session WHERE hash = $1";
pub const END_SESSION_BY_HASH: &str = "DELETE FROM herald.session WHERE hash = $1";
pub const END_SESSION_BY_ID: &str = "DELETE FROM herald.session WHERE id = $1";
pub const END_SESSIONS_OF_APP: &str = "DELETE FROM herald.session WHERE app_id = $1";
pub const END_ALL_SESSIONS: &str = "DELETE FROM herald.session";
pub const END_EXPIRED_SESSIONS: &str = "DELETE FROM herald.session WHERE expires_at < $1";

pub const STORED_RESPONSE: &str =
    "SELECT status, body, created_at FROM herald.idempotency WHERE scope = $1 AND key = $2";
pub const SAVE_RESPONSE: &str = "INSERT INTO herald.idempotency (scope, key, status, body, created_at)
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING";

pub const SAVE_BREAKER: &str =
    "INSERT INTO herald.endpoint_health (endpoint_id, breaker, updated_at) VALUES ($1, $2, $3)
     ON CONFLICT (endpoint_id) DO UPDATE SET breaker = excluded.breaker, updated_at = excluded.updated_at";
pub const FORGET_BREAKER: &str = "DELETE FROM herald.endpoint_health WHERE endpoint_id = $1";
pub const BREAKERS: &str = "SELECT endpoint_id, breaker FROM herald.endpoint_health";
pub const PRUNE_LATENCY: &str = "DELETE FROM herald.latency WHERE hour < $1";
pub const PRUNE_ENDPOINT_HOURS: &str = "DELETE FROM herald.endpoint_hour WHERE hour < $1";
pub const PRUNE_BREAKER_EVENTS: &str = "DELETE FROM herald.breaker_event WHERE at < $1";
pub const PRUNE_MINUTES: &str = "DELETE FROM herald.stats_minute WHERE minute < $1";

pub const MINUTE_TOTALS: &str = "SELECT minute, accepted, delivered, failed, dead, pending, retrying
     FROM herald.stats_minute WHERE minute >= $1 ORDER BY minute";
pub const LOG_BREAKER: &str =
    "INSERT INTO herald.breaker_event (endpoint_id, at, kind, failures, cooldown_ms) VALUES ($1, $2, $3, $4, $5)";
pub const BREAKER_EVENTS: &str = "SELECT at, kind, failures, cooldown_ms FROM herald.breaker_event
     WHERE endpoint_id = $1 AND at >= $2 ORDER BY at DESC LIMIT $3";

/// `statement` in SQLite's form: the same text without the schema, with `?n` parameters.
pub fn sqlite(statement: &'static str) -> &'static str {
    static CONVERTED: OnceLock<Mutex<HashMap<usize, &'static str>>> = OnceLock::new();
    let mut converted = CONVERTED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    converted.entry(statement.as_ptr() as usize).or_insert_with(|| Box::leak(to_sqlite(statement).into_boxed_str()))
}

fn to_sqlite(statement: &str) -> String {
    let unqualified = statement.replace("herald.", "");
    let mut out = String::with_capacity(unqualified.len());
    let mut chars = unqualified.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sqlite_form_drops_the_schema_and_numbers_its_parameters_alike() {
        assert_eq!(
            sqlite(EXPIRE_TOKENS),
            "UPDATE portal_token SET expires_at = ?2 WHERE app_id = ?1 AND expires_at > ?2"
        );
        assert!(std::ptr::eq(sqlite(EXPIRE_TOKENS), sqlite(EXPIRE_TOKENS)), "converted once");
        assert!(!sqlite(SAVE_RESPONSE).contains("herald.") && !sqlite(SAVE_RESPONSE).contains('$'));
    }
}
