//! The work queue on SQLite: claims, outcomes, releases and manual requeues.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::messages::insert_attempt;
use super::rows::{self, MESSAGE_COLUMNS};
use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::{
    ClaimedDelivery, DeadLetter, DeadLetterFilter, DeliveryState, HourCounts, Message, MinuteCounts, NextState,
    OutcomeRecord, QueueCounts, QueueStore, Recorded, Requeue, StoreResult, Trigger,
};

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
        let owner = owner.to_owned();
        self.writer
            .write_hot(move |conn| {
                let applied: Vec<Recorded> =
                    outcomes.iter().map(|outcome| record_outcome(conn, &owner, outcome)).collect::<StoreResult<_>>()?;
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

    async fn release(&self, owner: &str, deliveries: Vec<i64>) -> StoreResult<()> {
        let owner = owner.to_owned();
        self.writer
            .write(move |conn| {
                let mut stmt = conn.prepare_cached("UPDATE delivery SET owner = NULL WHERE id = ? AND owner = ?")?;
                for id in deliveries {
                    stmt.execute(params![id, owner])?;
                }
                Ok(())
            })
            .await
    }

    async fn release_message(&self, owner: &str, msg: &MessageId) -> StoreResult<u64> {
        let (owner, msg) = (owner.to_owned(), msg.to_string());
        self.writer
            .write(move |conn| {
                let sql = "UPDATE delivery SET owner = NULL WHERE msg_id = ? AND owner = ? AND state = 0";
                Ok(conn.execute(sql, params![msg, owner])? as u64)
            })
            .await
    }

    async fn release_owner(&self, owner: &str) -> StoreResult<u64> {
        let owner = owner.to_owned();
        self.writer
            .write(move |conn| Ok(conn.execute("UPDATE delivery SET owner = NULL WHERE owner = ?", [&owner])? as u64))
            .await
    }

    async fn release_all(&self) -> StoreResult<u64> {
        self.writer
            .write(|conn| Ok(conn.execute("UPDATE delivery SET owner = NULL WHERE owner IS NOT NULL", [])? as u64))
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

    async fn queue_counts(&self) -> StoreResult<QueueCounts> {
        self.readers
            .read(|conn| {
                let mut counts = QueueCounts::default();
                let mut stmt =
                    conn.prepare_cached("SELECT state, owner IS NOT NULL, count(*) FROM delivery GROUP BY 1, 2")?;
                let mut rows = stmt.query([])?;
                while let Some(row) = rows.next()? {
                    let (state, owned, count): (i64, bool, u64) = (row.get(0)?, row.get(1)?, row.get(2)?);
                    match DeliveryState::from_code(state) {
                        DeliveryState::Pending if owned => counts.claimed += count,
                        DeliveryState::Pending => counts.pending += count,
                        DeliveryState::Delivered => counts.delivered += count,
                        DeliveryState::Dead => counts.dead += count,
                        DeliveryState::Canceled => {}
                    }
                }
                Ok(counts)
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

/// Records one outcome if `owner` still holds the delivery. A resend accepted meanwhile
/// (`resend`) overrides the outcome's next state: the attempt may have started before the
/// request, so the delivery goes back, unclaimed, for a manual attempt of its own. (Two
/// plain statements rather than one with `RETURNING`, which makes SQLite stage its output:
/// the first is the only one on the hot path.)
fn record_outcome(conn: &Connection, owner: &str, outcome: &OutcomeRecord) -> StoreResult<Recorded> {
    let now = now_ms();
    let (state, next_at, keep) = match outcome.next {
        NextState::Delivered => (DeliveryState::Delivered, now, false),
        NextState::Retry { at, keep } => (DeliveryState::Pending, at, keep),
        NextState::Dead => (DeliveryState::Dead, now, false),
        NextState::Canceled => (DeliveryState::Canceled, now, false),
    };
    let applied = conn
        .prepare_cached(
            "UPDATE delivery SET state = ?, attempts = ?, next_at = ?, trigger = 0,
                owner = CASE WHEN ? THEN owner ELSE NULL END
             WHERE id = ? AND owner = ? AND resend = 0",
        )?
        .execute(params![state.code(), outcome.attempts, next_at, keep, outcome.delivery_id, owner])?;
    let recorded = if applied == 1 {
        Recorded::Applied
    } else {
        let resent = conn
            .prepare_cached(
                "UPDATE delivery SET state = 0, attempts = 0, next_at = ?, trigger = 1, owner = NULL, resend = 0
                 WHERE id = ? AND owner = ? AND resend = 1",
            )?
            .execute(params![now, outcome.delivery_id, owner])?;
        if resent == 0 {
            // Our claim was lost (released or taken over): the outcome is not ours to record.
            return Ok(Recorded::ClaimLost);
        }
        Recorded::Resent
    };
    if let Some(attempt) = &outcome.attempt {
        insert_attempt(conn, outcome.delivery_id, attempt)?;
    }
    Ok(recorded)
}

fn requeue(conn: &Connection, request: &Requeue) -> StoreResult<u64> {
    let now = now_ms();
    match request {
        Requeue::Resend { app, msg, endpoint } => {
            // Held pending by a dispatcher, its attempt may be on the wire already: mark it,
            // so that attempt's outcome requeues it (see `record_outcome`). Otherwise it is
            // pending again at once, with a fresh retry budget.
            let changed = conn
                .prepare_cached(
                    "UPDATE delivery SET resend = (state = 0 AND owner IS NOT NULL),
                    attempts = CASE WHEN state = 0 AND owner IS NOT NULL THEN attempts ELSE 0 END,
                    next_at = CASE WHEN state = 0 AND owner IS NOT NULL THEN next_at ELSE ?1 END,
                    trigger = CASE WHEN state = 0 AND owner IS NOT NULL THEN trigger ELSE 1 END,
                    owner = CASE WHEN state = 0 THEN owner ELSE NULL END,
                    state = 0
                 WHERE msg_id = ?2 AND endpoint_id = ?3",
                )?
                .execute(params![now, msg.as_str(), endpoint.as_str()])?;
            if changed > 0 {
                return Ok(changed as u64);
            }
            insert_manual_delivery(conn, app.as_str(), msg, endpoint, now)
        }
        Requeue::Recover { endpoint, since, until } => Ok(conn.execute(
            "UPDATE delivery SET state = 0, attempts = 0, next_at = ?, trigger = 1, owner = NULL
             WHERE endpoint_id = ? AND state = 2 AND created_at >= ? AND created_at < ?",
            params![now, endpoint.as_str(), since, until],
        )? as u64),
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

/// Resending a message to an endpoint it never went to (e.g. created later) makes a new
/// delivery, provided the message belongs to the application.
fn insert_manual_delivery(
    conn: &Connection,
    app: &str,
    msg: &MessageId,
    endpoint: &EndpointId,
    now: Millis,
) -> StoreResult<u64> {
    Ok(conn.execute(
        "INSERT INTO delivery (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict, created_at)
         SELECT m.id, e.id, m.app_id, 0, 0, ?, 1, NULL, json_extract(e.delivery, '$.ordering') IS 'strict', m.created_at
         FROM message m JOIN endpoint e ON e.id = ? WHERE m.id = ? AND m.app_id = ?",
        params![now, endpoint.as_str(), msg.as_str(), app],
    )? as u64)
}

/// Dead letters with their last attempt; a dead delivery's `next_at` is when it died.
const DEAD_LETTERS: &str = "
    SELECT d.id, d.app_id, d.endpoint_id, d.msg_id, m.event_type, d.next_at, d.attempts,
           coalesce(a.status_code, 0), a.error_class, a.error
    FROM delivery d
    JOIN message m ON m.id = d.msg_id
    LEFT JOIN attempt a ON a.id = (SELECT id FROM attempt
                                   WHERE msg_id = d.msg_id AND endpoint_id = d.endpoint_id
                                   ORDER BY id DESC LIMIT 1)
    WHERE d.state = 2 AND d.next_at >= ?1 AND (?2 IS NULL OR d.next_at < ?2)
      AND (?3 IS NULL OR d.app_id = ?3) AND (?4 IS NULL OR d.endpoint_id = ?4)
      AND (?5 IS NULL OR coalesce(a.status_code, 0) = ?5) AND (?6 IS NULL OR a.error_class = ?6)
      AND (?7 IS NULL OR m.event_type = ?7)
    ORDER BY d.next_at DESC
    LIMIT ?8";
