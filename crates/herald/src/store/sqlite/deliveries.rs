//! How a delivery is kept (schema version 4). A delivery made at ingest and held in memory
//! is *virtual*: the message row names its endpoint (`dests`), `held` lists it until it
//! settles, and a first-try success settles it with nothing but its attempt row. Anything
//! else *materializes* it: a row in `delivery` with its state, which from then on is the
//! delivery's record. A delivery's id is its message's seq × 65536 + its place.
//!
//! A delivery's state, then: its row's, if it has one; else pending while it is held; else
//! delivered.

use rusqlite::{Connection, OptionalExtension, params};

use crate::clock::Millis;
use crate::store::{Attempt, DeliveryState, StoreResult};

/// The place numbers from which deliveries made after ingest (resends to endpoints the
/// message did not go to) are counted.
pub const LATER_PLACES: i64 = 32_768;
const PLACES: i64 = 65_536;

pub fn delivery_id(msg_seq: i64, place: i64) -> i64 {
    msg_seq * PLACES + place
}

pub fn msg_seq_of(delivery_id: i64) -> i64 {
    delivery_id.div_euclid(PLACES)
}

pub fn place_of(delivery_id: i64) -> i64 {
    delivery_id.rem_euclid(PLACES)
}

/// The state of a delivery `d` (a row of `delivery`, LEFT JOINed) whose id is `id`, as SQL.
pub fn state_sql(d: &str, id: &str) -> String {
    format!(
        "CASE WHEN {d}.id IS NOT NULL THEN {d}.state WHEN EXISTS (SELECT 1 FROM held WHERE id = {id}) THEN 0 ELSE 1 END"
    )
}

/// The attempts of the current round of the same delivery, as SQL (a virtual delivery has
/// none while held, one once delivered).
pub fn attempts_sql(d: &str, id: &str) -> String {
    format!(
        "CASE WHEN {d}.id IS NOT NULL THEN {d}.attempts WHEN EXISTS (SELECT 1 FROM held WHERE id = {id}) THEN 0 ELSE 1 END"
    )
}

/// What a materialized delivery starts with.
pub struct Materialize<'a> {
    pub id: i64,
    pub state: DeliveryState,
    pub attempts: u32,
    pub next_at: Millis,
    pub manual: bool,
    pub owner: Option<&'a str>,
    pub resend: bool,
    /// Strictly ordered, when known; otherwise as its endpoint is now.
    pub strict: Option<bool>,
    /// The attempt that made it what it is, if any (its result is kept with the row).
    pub last: Option<&'a Attempt>,
}

/// Gives a delivery its row (its message must exist; whether it did is returned); its
/// endpoint is the message's destination at the id's place unless `endpoint` says, and it
/// is strictly ordered if that endpoint is now. A pending row whose endpoint was deleted
/// meanwhile is made cancelled instead: the deletion cancelled the rows there were, and
/// this one (an outcome or a release arriving after it) must not wait for a retry that
/// will never be made.
pub fn materialize(conn: &Connection, m: &Materialize<'_>, endpoint: Option<&str>) -> StoreResult<bool> {
    let place = place_of(m.id);
    let (status, class, error) = match m.last {
        Some(a) => (Some(a.status_code), a.error_class.as_deref(), a.error.as_deref()),
        None => (None, None, None),
    };
    let changed = conn
        .prepare_cached(
            "INSERT INTO delivery (id, msg_seq, msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner,
                 strict, resend, created_at, last_status, last_error_class, last_error)
             SELECT ?1, m.seq, m.id, t.endpoint_id, m.app_id,
                 CASE WHEN t.gone THEN ?15 ELSE ?4 END, ?5, ?6, ?7, CASE WHEN t.gone THEN NULL ELSE ?8 END,
                 coalesce(?14, (SELECT json_extract(e.delivery, '$.ordering') IS 'strict' FROM endpoint e
                           WHERE e.id = t.endpoint_id), 0),
                 ?9, m.created_at, ?10, ?11, ?12
             FROM message m
             JOIN (SELECT d.endpoint_id,
                          ?4 = ?16 AND NOT EXISTS (SELECT 1 FROM endpoint e WHERE e.id = d.endpoint_id) AS gone
                   FROM (SELECT coalesce(?2, (SELECT value FROM json_each(dests) WHERE key = ?3)) AS endpoint_id
                         FROM message WHERE seq = ?13) d) t
             WHERE m.seq = ?13 AND t.endpoint_id IS NOT NULL",
        )?
        .execute(params![
            m.id,
            endpoint,
            place,
            m.state.code(),
            m.attempts,
            m.next_at,
            i64::from(m.manual),
            m.owner,
            m.resend,
            status,
            class,
            error,
            msg_seq_of(m.id),
            m.strict,
            DeliveryState::Canceled.code(),
            DeliveryState::Pending.code(),
        ])?;
    Ok(changed == 1)
}

/// Takes a delivery out of `held` if `owner` holds it; whether it did.
pub fn unhold(conn: &Connection, id: i64, owner: &str) -> StoreResult<bool> {
    Ok(conn.prepare_cached("DELETE FROM held WHERE id = ? AND owner = ?")?.execute(params![id, owner])? == 1)
}

/// Who holds a delivery, if anyone.
pub fn holder(conn: &Connection, id: i64) -> StoreResult<Option<String>> {
    Ok(conn.prepare_cached("SELECT owner FROM held WHERE id = ?")?.query_row([id], |r| r.get(0)).optional()?)
}

/// Gives the held deliveries whose id is in `[from, to)` (and, if given, whose holder is
/// `owner`) back to the queue: a pending, unclaimed row each (a held delivery has had no
/// attempt). Returns how many.
pub fn release_held(conn: &Connection, from: i64, to: i64, owner: Option<&str>, now: Millis) -> StoreResult<u64> {
    let ids: Vec<i64> = conn
        .prepare_cached("SELECT id FROM held WHERE id >= ?1 AND id < ?2 AND (?3 IS NULL OR owner = ?3)")?
        .query_map(params![from, to, owner], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for &id in &ids {
        conn.prepare_cached("DELETE FROM held WHERE id = ?")?.execute([id])?;
        let pending = Materialize {
            id,
            state: DeliveryState::Pending,
            attempts: 0,
            next_at: now,
            manual: false,
            owner: None,
            resend: false,
            strict: None,
            last: None,
        };
        materialize(conn, &pending, None)?;
    }
    Ok(ids.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_its_message_and_its_place() {
        let id = delivery_id(12_345, 7);
        assert_eq!((msg_seq_of(id), place_of(id)), (12_345, 7));
        assert!(delivery_id(2, 0) > delivery_id(1, LATER_PLACES + 5), "ordered by message first");
    }
}
