//! The work queue on SQLite: claims, outcomes, releases and manual requeues (schema version
//! 4: a held delivery settles with its first successful attempt alone; anything else gives it
//! a row, see `deliveries`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::deliveries::{self, LATER_PLACES, Materialize, delivery_id};
use super::messages::{Seqs, insert_attempt};
use super::rows::{self, MESSAGE_COLUMNS};
use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::sql::{self, sqlite};
use crate::store::{
    ClaimedDelivery, DeadLetter, DeadLetterFilter, DeliveryState, HourCounts, Message, MinuteCounts, NextState,
    OutcomeRecord, QueueStore, Recorded, Requeue, StoreResult, Trigger,
};

/// What giving a claim back sets (`?1` is now). A delivery a resend marked while it was
/// held becomes that resend: due at once, with a fresh retry budget, as a manual attempt;
/// otherwise it stays as it was, only unclaimed.
const RELEASED: &str = "owner = NULL, resend = 0, next_at = CASE WHEN resend THEN ?1 ELSE next_at END,
    attempts = CASE WHEN resend THEN 0 ELSE attempts END, trigger = CASE WHEN resend THEN 1 ELSE trigger END";

#[async_trait]
impl QueueStore for SqliteStore {
    async fn claim(&self, owner: &str, due_before: Millis, limit: usize) -> StoreResult<Vec<ClaimedDelivery>> {
        let owner = owner.to_owned();
        self.writer.write_hot(move |conn| claim(conn, &owner, due_before, limit, CLAIM_DUE)).await
    }

    async fn claim_heads(&self, owner: &str, due_before: Millis, limit: usize) -> StoreResult<Vec<ClaimedDelivery>> {
        let owner = owner.to_owned();
        self.writer.write_hot(move |conn| claim(conn, &owner, due_before, limit, CLAIM_HEADS)).await
    }

    async fn record_outcomes(&self, owner: &str, outcomes: Vec<OutcomeRecord>) -> StoreResult<Vec<Recorded>> {
        let (owner, seqs) = (owner.to_owned(), self.seqs.clone());
        self.writer
            .write_hot(move |conn| {
                let applied: Vec<Recorded> = outcomes
                    .iter()
                    .map(|outcome| record_outcome(conn, &seqs, &owner, outcome))
                    .collect::<StoreResult<_>>()?;
                for (minute, counts) in
                    MinuteCounts::of(outcomes.iter().zip(&applied).filter(|(_, a)| a.recorded()).map(|(o, _)| o))
                {
                    conn.prepare_cached(
                        "INSERT INTO stats_minute (minute, delivered, failed, delivery_ms, dead) VALUES (?, ?, ?, ?, ?)
                         ON CONFLICT (minute) DO UPDATE SET delivered = delivered + excluded.delivered,
                             failed = failed + excluded.failed, delivery_ms = delivery_ms + excluded.delivery_ms,
                             dead = dead + excluded.dead",
                    )?
                    .execute(params![
                        minute,
                        counts.delivered,
                        counts.failed,
                        counts.delivery_ms,
                        counts.dead
                    ])?;
                }
                let recorded = outcomes.iter().zip(&applied).filter(|(_, a)| a.recorded()).map(|(o, _)| o);
                for ((endpoint, hour), counts) in HourCounts::of(recorded) {
                    conn.prepare_cached(
                        "INSERT INTO endpoint_hour (endpoint_id, hour, succeeded, failed) VALUES (?, ?, ?, ?)
                         ON CONFLICT (endpoint_id, hour) DO UPDATE SET succeeded = succeeded + excluded.succeeded,
                             failed = failed + excluded.failed",
                    )?
                    .execute(params![endpoint.as_str(), hour, counts.succeeded, counts.failed])?;
                }
                Ok(applied)
            })
            .await
    }

    async fn release(&self, owner: &str, ids: Vec<i64>) -> StoreResult<()> {
        let owner = owner.to_owned();
        self.writer
            .write(move |conn| {
                let now = now_ms();
                let sql = format!("UPDATE delivery SET {RELEASED} WHERE id = ?2 AND owner = ?3");
                let mut stmt = conn.prepare_cached(&sql)?;
                for id in ids {
                    if deliveries::release_held(conn, id, id + 1, Some(&owner), now)? == 0 {
                        stmt.execute(params![now, id, owner])?;
                    }
                }
                Ok(())
            })
            .await
    }

    async fn release_message(&self, owner: &str, msg: &MessageId) -> StoreResult<u64> {
        let (owner, msg) = (owner.to_owned(), msg.to_string());
        self.writer
            .write(move |conn| {
                let seq: Option<i64> = conn
                    .prepare_cached("SELECT seq FROM message WHERE id = ?")?
                    .query_row([&msg], |r| r.get(0))
                    .optional()?;
                let Some(seq) = seq else { return Ok(0) };
                let held = deliveries::release_held(
                    conn,
                    delivery_id(seq, 0),
                    delivery_id(seq + 1, 0),
                    Some(&owner),
                    now_ms(),
                )?;
                let sql = format!("UPDATE delivery SET {RELEASED} WHERE msg_seq = ?2 AND owner = ?3 AND state = 0");
                Ok(held + conn.execute(&sql, params![now_ms(), seq, owner])? as u64)
            })
            .await
    }

    async fn release_owner(&self, owner: &str) -> StoreResult<u64> {
        let owner = owner.to_owned();
        self.writer
            .write(move |conn| {
                let held = deliveries::release_held(conn, 0, i64::MAX, Some(&owner), now_ms())?;
                let sql = format!("UPDATE delivery SET {RELEASED} WHERE owner = ?2");
                Ok(held + conn.execute(&sql, params![now_ms(), owner])? as u64)
            })
            .await
    }

    async fn release_all(&self) -> StoreResult<u64> {
        self.writer
            .write(|conn| {
                let held = deliveries::release_held(conn, 0, i64::MAX, None, now_ms())?;
                let sql = format!("UPDATE delivery SET {RELEASED} WHERE owner IS NOT NULL");
                Ok(held + conn.execute(&sql, [now_ms()])? as u64)
            })
            .await
    }

    async fn register_node(&self, _owner: &str) -> StoreResult<()> {
        Ok(())
    }

    /// One process per database: its lease cannot be lost to another.
    async fn heartbeat(&self, _owner: &str) -> StoreResult<bool> {
        Ok(true)
    }

    async fn reap_expired(&self, _lease: Duration) -> StoreResult<u64> {
        Ok(0)
    }

    async fn requeue(&self, request: Requeue) -> StoreResult<u64> {
        self.writer.write(move |conn| requeue(conn, &request)).await
    }

    async fn dead_letters(&self, filter: &DeadLetterFilter) -> StoreResult<Vec<DeadLetter>> {
        let f = filter.clone();
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(DEAD_LETTERS)?;
                let params = params![
                    f.dead_since,
                    f.dead_until,
                    f.app.as_ref().map(|a| a.as_str().to_owned()),
                    f.endpoint.as_ref().map(|e| e.as_str().to_owned()),
                    f.status_code,
                    f.error_class,
                    f.event_type,
                    f.limit as i64,
                ];
                let rows = stmt.query_map(params, |r| {
                    Ok(DeadLetter {
                        delivery_id: r.get(0)?,
                        app_id: AppId::from_trusted(r.get(1)?),
                        endpoint_id: EndpointId::from_trusted(r.get(2)?),
                        msg_id: MessageId::from_trusted(r.get(3)?),
                        event_type: r.get(4)?,
                        dead_at: r.get(5)?,
                        attempts: r.get(6)?,
                        status_code: r.get(7)?,
                        error_class: r.get(8)?,
                        error: r.get(9)?,
                    })
                })?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
    }
}

/// Due, unclaimed deliveries of endpoints without strict ordering, oldest due first. A
/// claim's attempt starts after every resend accepted before it: the claim clears `resend`.
const CLAIM_DUE: &str = "UPDATE delivery SET owner = ?1, resend = 0 WHERE id IN (
         SELECT id FROM delivery WHERE state = 0 AND owner IS NULL AND strict = 0 AND next_at <= ?2
         ORDER BY next_at LIMIT ?3)
     RETURNING id, msg_id, endpoint_id, attempts, next_at, trigger";

/// The head (oldest pending delivery) of each strictly ordered endpoint, if nobody holds it
/// and it is due: at most one delivery per such endpoint is ever out.
const CLAIM_HEADS: &str = "UPDATE delivery SET owner = ?1, resend = 0 WHERE id IN (
         SELECT d.id FROM (SELECT min(id) AS id FROM delivery WHERE state = 0 AND strict = 1 GROUP BY endpoint_id) h
         JOIN delivery d ON d.id = h.id
         WHERE d.owner IS NULL AND d.next_at <= ?2 LIMIT ?3)
     RETURNING id, msg_id, endpoint_id, attempts, next_at, trigger";

fn claim(
    conn: &Connection,
    owner: &str,
    due_before: Millis,
    limit: usize,
    sql: &str,
) -> StoreResult<Vec<ClaimedDelivery>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let claimed: Vec<(i64, String, String, u32, Millis, i64)> = stmt
        .query_map(params![owner, due_before, limit as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut messages: HashMap<String, Option<Arc<Message>>> = HashMap::new();
    let mut load = conn.prepare_cached(&format!("SELECT {MESSAGE_COLUMNS} FROM message m WHERE m.id = ?"))?;
    let mut out = Vec::with_capacity(claimed.len());
    for (delivery_id, msg_id, endpoint_id, attempts, next_at, trigger) in claimed {
        if !messages.contains_key(&msg_id) {
            let found = load.query_row([&msg_id], |row| rows::message(row, true)).optional()?;
            messages.insert(msg_id.clone(), found.map(Arc::new));
        }
        let Some(message) = messages[&msg_id].clone() else {
            // The message is gone (its application was deleted): nothing to send.
            conn.execute("UPDATE delivery SET state = 3, owner = NULL WHERE id = ?", [delivery_id])?;
            continue;
        };
        out.push(ClaimedDelivery {
            delivery_id,
            endpoint_id: EndpointId::from_trusted(endpoint_id),
            message,
            attempts,
            next_at,
            trigger: Trigger::from_code(trigger),
        });
    }
    Ok(out)
}

/// Records one outcome if `owner` still holds the delivery. A held delivery settles with a
/// success alone; any other outcome gives it a row in its next state. A delivery with a row
/// is updated if `owner` holds it; a resend accepted meanwhile (`resend`) overrides the
/// outcome's next state: the attempt may have started before the request, so the delivery
/// goes back, unclaimed, for a manual attempt of its own. (Plain statements rather than one
/// with `RETURNING`, which makes SQLite stage its output.)
fn record_outcome(conn: &Connection, seqs: &Seqs, owner: &str, outcome: &OutcomeRecord) -> StoreResult<Recorded> {
    let now = now_ms();
    let (state, next_at, keep) = match outcome.next {
        NextState::Delivered => (DeliveryState::Delivered, now, false),
        NextState::Retry { at, keep } => (DeliveryState::Pending, at, keep),
        NextState::Dead => (DeliveryState::Dead, now, false),
        NextState::Canceled => (DeliveryState::Canceled, now, false),
    };
    let id = outcome.delivery_id;
    let last = outcome.attempt.as_ref();
    let recorded = if deliveries::unhold(conn, id, owner)? {
        if state != DeliveryState::Delivered {
            let row = Materialize {
                id,
                state,
                attempts: outcome.attempts,
                next_at,
                manual: false,
                owner: keep.then_some(owner),
                resend: false,
                strict: None,
                last,
            };
            deliveries::materialize(conn, &row, None)?;
        }
        Recorded::Applied
    } else {
        let (status, class, error) =
            last.map_or((None, None, None), |a| (Some(a.status_code), a.error_class.as_deref(), a.error.as_deref()));
        let applied = conn
            .prepare_cached(
                "UPDATE delivery SET state = ?, attempts = ?, next_at = ?, trigger = 0,
                    owner = CASE WHEN ? THEN owner ELSE NULL END,
                    last_status = coalesce(?, last_status), last_error_class = CASE WHEN ? THEN ? ELSE last_error_class END,
                    last_error = CASE WHEN ? THEN ? ELSE last_error END
                 WHERE id = ? AND owner = ? AND resend = 0",
            )?
            .execute(params![
                state.code(),
                outcome.attempts,
                next_at,
                keep,
                status,
                last.is_some(),
                class,
                last.is_some(),
                error,
                id,
                owner
            ])?;
        if applied == 1 {
            Recorded::Applied
        } else {
            let resent = conn
                .prepare_cached(
                    "UPDATE delivery SET state = 0, attempts = 0, next_at = ?, trigger = 1, owner = NULL, resend = 0
                     WHERE id = ? AND owner = ? AND resend = 1",
                )?
                .execute(params![now, id, owner])?;
            if resent == 0 {
                // Our claim was lost (released or taken over): the outcome is not ours to record.
                return Ok(Recorded::ClaimLost);
            }
            Recorded::Resent
        }
    };
    if let Some(attempt) = last {
        insert_attempt(conn, seqs, id, attempt)?;
    }
    Ok(recorded)
}

fn requeue(conn: &Connection, request: &Requeue) -> StoreResult<u64> {
    let now = now_ms();
    match request {
        Requeue::Resend { app, msg, endpoint } => resend(conn, app, msg, endpoint, now),
        Requeue::Recover { endpoint, since, until } => {
            Ok(conn.execute(sqlite(sql::RECOVER), params![now, endpoint.as_str(), since, until])? as u64)
        }
        Requeue::DeadLetters { ids } => {
            let mut stmt = conn.prepare_cached(
                "UPDATE delivery SET state = 0, attempts = 0, next_at = ?, trigger = 1, owner = NULL
                 WHERE id = ? AND state = 2",
            )?;
            let mut changed = 0;
            for id in ids {
                changed += stmt.execute(params![now, id])? as u64;
            }
            Ok(changed)
        }
    }
}

/// Svix `resend` of one message to one endpoint. A delivery held pending by a dispatcher may
/// have its attempt on the wire already: it is marked, so that attempt's outcome requeues it
/// (see `record_outcome`). Otherwise it is pending again at once, with a fresh retry budget:
/// a row for a settled delivery made at ingest, a new delivery for an endpoint the message
/// did not go to (provided the message belongs to the application).
fn resend(conn: &Connection, app: &AppId, msg: &MessageId, endpoint: &EndpointId, now: Millis) -> StoreResult<u64> {
    let found: Option<(i64, Option<i64>)> = conn
        .prepare_cached(
            "SELECT m.seq, (SELECT key FROM json_each(m.dests) WHERE value = ?3) FROM message m
             WHERE m.id = ?1 AND m.app_id = ?2",
        )?
        .query_row(params![msg.as_str(), app.as_str(), endpoint.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    let Some((seq, place)) = found else { return Ok(0) };
    let row: Option<i64> = conn
        .prepare_cached("SELECT id FROM delivery WHERE msg_seq = ? AND endpoint_id = ?")?
        .query_row(params![seq, endpoint.as_str()], |r| r.get(0))
        .optional()?;
    if let Some(id) = row {
        let changed = conn
            .prepare_cached(
                "UPDATE delivery SET resend = (state = 0 AND owner IS NOT NULL),
                attempts = CASE WHEN state = 0 AND owner IS NOT NULL THEN attempts ELSE 0 END,
                next_at = CASE WHEN state = 0 AND owner IS NOT NULL THEN next_at ELSE ?1 END,
                trigger = CASE WHEN state = 0 AND owner IS NOT NULL THEN trigger ELSE 1 END,
                owner = CASE WHEN state = 0 THEN owner ELSE NULL END,
                state = 0
             WHERE id = ?2",
            )?
            .execute(params![now, id])?;
        return Ok(changed as u64);
    }
    let (id, manual) = match place {
        Some(place) => (delivery_id(seq, place), None),
        None => {
            let later: i64 = conn
                .prepare_cached("SELECT count(*) FROM delivery WHERE msg_seq = ? AND id % 65536 >= ?")?
                .query_row(params![seq, LATER_PLACES], |r| r.get(0))?;
            let exists: bool = conn
                .prepare_cached("SELECT 1 FROM endpoint WHERE id = ? AND app_id = ?")?
                .query_row(params![endpoint.as_str(), app.as_str()], |_| Ok(()))
                .optional()?
                .is_some();
            if !exists {
                return Ok(0);
            }
            (delivery_id(seq, LATER_PLACES + later), Some(endpoint.as_str()))
        }
    };
    let holder = deliveries::holder(conn, id)?;
    if let Some(holder) = &holder {
        conn.prepare_cached("DELETE FROM held WHERE id = ?")?.execute([id])?;
        // Still held: its attempt may be under way; the mark makes its outcome requeue it.
        let marked = Materialize {
            id,
            state: DeliveryState::Pending,
            attempts: 0,
            next_at: now,
            manual: false,
            owner: Some(holder),
            resend: true,
            strict: None,
            last: None,
        };
        deliveries::materialize(conn, &marked, manual)?;
        return Ok(1);
    }
    let pending = Materialize {
        id,
        state: DeliveryState::Pending,
        attempts: 0,
        next_at: now,
        manual: true,
        owner: None,
        resend: false,
        strict: None,
        last: None,
    };
    Ok(u64::from(deliveries::materialize(conn, &pending, manual)?))
}

/// Dead letters with their last attempt's result (kept in the row); a dead delivery's
/// `next_at` is when it died.
const DEAD_LETTERS: &str = "
    SELECT d.id, d.app_id, d.endpoint_id, d.msg_id, m.event_type, d.next_at, d.attempts,
           coalesce(d.last_status, 0), d.last_error_class, d.last_error
    FROM delivery d
    JOIN message m ON m.seq = d.msg_seq
    WHERE d.state = 2 AND d.next_at >= ?1 AND (?2 IS NULL OR d.next_at < ?2)
      AND (?3 IS NULL OR d.app_id = ?3) AND (?4 IS NULL OR d.endpoint_id = ?4)
      AND (?5 IS NULL OR coalesce(d.last_status, 0) = ?5) AND (?6 IS NULL OR d.last_error_class = ?6)
      AND (?7 IS NULL OR m.event_type = ?7)
    ORDER BY d.next_at DESC
    LIMIT ?8";
