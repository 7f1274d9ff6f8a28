//! The statements that read the same on both backends, written once. They are kept in
//! PostgreSQL's form (tables in the `herald` schema, `$n` parameters); [`sqlite`] gives
//! the same text in SQLite's form (no schema, `?n`). A statement whose dialects differ
//! (arrays, `UNNEST`, casts, `greatest`) lives with its backend. The rows' column lists are
//! here too, since both backends' row readers take them in the same order.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, OnceLock};

/// The columns of each kind of row, in the order both backends' row readers take them.
pub const APP_COLUMNS: &str = "id, uid, name, metadata, throttle_rate, max_concurrency, weight, created_at, updated_at, portal_brand, \
     proxy_url, proxy_credentials";

pub const ENDPOINT_COLUMNS: &str = "id, app_id, uid, url, description, disabled, event_types, channels, metadata, \
     throttle_rate, headers, secrets, delivery, request, created_at, updated_at, scripts, auth, version, destination";

/// `ENDPOINT_COLUMNS` of a row being deleted, as its tombstone keeps them: no headers, no
/// secrets, no credentials, no destination (its broker's URL stays in `url`).
pub const KEPT_ENDPOINT_COLUMNS: &str = "id, app_id, uid, url, description, disabled, event_types, channels, \
     metadata, throttle_rate, '', '', delivery, request, created_at, updated_at, scripts, '', version, ''";

pub const EVENT_TYPE_COLUMNS: &str =
    "name, description, archived, deprecated, schemas, feature_flag, created_at, updated_at";

/// A message's columns; its payload is in `payload` as text, or in `packed` compressed
/// (`store::packing`), never both.
pub const MESSAGE_COLUMNS: &str =
    "m.id, m.app_id, m.event_type, m.event_id, m.channels, m.payload, m.created_at, m.trace, m.packed";

pub const ATTEMPT_COLUMNS: &str = "a.id, a.msg_id, a.endpoint_id, a.app_id, a.created_at, a.url, a.status_code, \
     a.duration_ms, a.delivered, a.error_class, a.error, a.response, a.trigger, a.attempt_no, a.delivery_id";

pub const POLLER_COLUMNS: &str =
    "id, app_id, uid, description, event_types, channels, filter, metadata, created_at, updated_at";

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

pub const DELETE_APP: &str = "DELETE FROM herald.app WHERE id = $1";
pub const DELETE_ENDPOINT: &str = "DELETE FROM herald.endpoint WHERE app_id = $1 AND id = $2";
/// Deliveries still pending for an endpoint being deleted: `$1` the canceled state, `$3`
/// the pending one.
pub const CANCEL_PENDING: &str =
    "UPDATE herald.delivery SET state = $1, owner = NULL WHERE endpoint_id = $2 AND state = $3";
pub const DELETE_EVENT_TYPE: &str = "DELETE FROM herald.event_type WHERE name = $1";
/// A version-checked update: `$8` is the `updated_at` the change was made from.
pub const UPDATE_EVENT_TYPE: &str =
    "UPDATE herald.event_type SET description = $2, archived = $3, deprecated = $4, schemas = $5,
     feature_flag = $6, updated_at = $7 WHERE name = $1 AND updated_at = $8";
pub const DELETE_POLLER: &str = "DELETE FROM herald.poller WHERE app_id = $1 AND id = $2";
/// A version-checked update: `$10` is the `updated_at` the change was made from.
pub const UPDATE_POLLER: &str =
    "UPDATE herald.poller SET uid = $3, description = $4, event_types = $5, channels = $6, filter = $7,
     metadata = $8, updated_at = $9 WHERE id = $1 AND app_id = $2 AND updated_at = $10";
pub const DELETE_CONSUMERS: &str = "DELETE FROM herald.poller_consumer WHERE poller_id = $1";
pub const DELETE_APP_CONSUMERS: &str =
    "DELETE FROM herald.poller_consumer WHERE poller_id IN (SELECT id FROM herald.poller WHERE app_id = $1)";
pub const COUNT_CONSUMERS: &str = "SELECT count(*) FROM herald.poller_consumer WHERE poller_id = $1";
pub const CONSUMERS: &str = "SELECT name, updated_at FROM herald.poller_consumer WHERE poller_id = $1
     ORDER BY updated_at DESC, name LIMIT $2";
pub const EXPUNGE_MESSAGE: &str =
    "UPDATE herald.message SET payload = NULL, packed = NULL WHERE id = $1 AND app_id = $2";
pub const EXPUNGE_ATTEMPT: &str =
    "UPDATE herald.attempt SET response = 'EXPUNGED' WHERE id = $1 AND msg_id = $2 AND app_id = $3";
/// `recover`: an endpoint's dead deliveries created in [`$3`, `$4`) go again at `$1`.
pub const RECOVER: &str = "UPDATE herald.delivery SET state = 0, attempts = 0, next_at = $1, trigger = 1, owner = NULL
     WHERE endpoint_id = $2 AND state = 2 AND created_at >= $3 AND created_at < $4";

/// Statements built from the column lists above, once.
pub static INSERT_APP: LazyLock<String> = LazyLock::new(|| {
    format!("INSERT INTO herald.app ({APP_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)")
});
pub static INSERT_EVENT_TYPE: LazyLock<String> = LazyLock::new(|| {
    format!("INSERT INTO herald.event_type ({EVENT_TYPE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
});
pub static ENDPOINT_BY_ID: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {ENDPOINT_COLUMNS} FROM herald.endpoint WHERE id = $1"));
pub static DELETED_ENDPOINT: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {ENDPOINT_COLUMNS} FROM herald.deleted_endpoint WHERE id = $1"));
pub static APP_ENDPOINTS: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {ENDPOINT_COLUMNS} FROM herald.endpoint WHERE app_id = $1 ORDER BY id"));
pub static EVENT_TYPE: LazyLock<String> =
    LazyLock::new(|| format!("SELECT {EVENT_TYPE_COLUMNS} FROM herald.event_type WHERE name = $1"));
/// A message by id, or else by its `eventId`.
pub static MESSAGE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {MESSAGE_COLUMNS} FROM herald.message m
         WHERE m.app_id = $1 AND (m.id = $2 OR m.event_id = $2) ORDER BY m.id = $2 DESC LIMIT 1"
    )
});
pub static ATTEMPT: LazyLock<String> = LazyLock::new(|| {
    format!("SELECT {ATTEMPT_COLUMNS} FROM herald.attempt a WHERE a.id = $1 AND a.msg_id = $2 AND a.app_id = $3")
});

/// The start of a list query on `table` (alias and joins may follow), before its
/// conditions and page: `SELECT columns FROM herald.table`.
pub fn list_head(columns: &str, table: &str) -> String {
    format!("SELECT {columns} FROM herald.{table}")
}

/// Deletes an application's rows of `table` (`$1` the application).
pub fn delete_app_rows(table: &str) -> String {
    format!("DELETE FROM herald.{table} WHERE app_id = $1")
}

/// `statement` in SQLite's form: the same text without the schema, with `?n` parameters.
pub fn sqlite(statement: &'static str) -> &'static str {
    static CONVERTED: OnceLock<Mutex<HashMap<usize, &'static str>>> = OnceLock::new();
    let mut converted = CONVERTED.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    converted.entry(statement.as_ptr() as usize).or_insert_with(|| Box::leak(to_sqlite(statement).into_boxed_str()))
}

/// A statement made at run time in SQLite's form (see [`sqlite`]).
pub fn to_sqlite(statement: &str) -> String {
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
        assert!(!sqlite(END_SESSION_BY_HASH).contains("herald.") && !sqlite(END_SESSION_BY_HASH).contains('$'));
    }
}
