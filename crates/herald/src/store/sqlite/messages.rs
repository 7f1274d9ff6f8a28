//! Ingest and the record of messages, deliveries and attempts on SQLite (schema version 4,
//! see `deliveries` and `indexer`): ingest writes the message row with its destinations,
//! a `held` row per delivery this process will attempt from memory, and a delivery row only
//! for the others. Listings by application, endpoint or message read the index tables up
//! to their watermark and the rows beyond it, in one statement (one snapshot).

use std::sync::atomic::{AtomicI64, Ordering};

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use super::deliveries::{self, LATER_PLACES, Materialize, delivery_id, msg_seq_of};
use super::keys::{self, Keys};
use super::rows::{self, ATTEMPT_COLUMNS, Branch, MESSAGE_COLUMN_COUNT, MESSAGE_COLUMNS, Query, merged_page};
use super::{SqliteStore, is_unique_violation};
use crate::clock::Millis;
use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::packing;
use crate::store::sql::{self, sqlite};
use crate::store::{
    Attempt, AttemptFilter, DeliveryState, DeliveryStatus, DeliveryView, EndpointStats, IngestResult, Message,
    MessageFilter, MessageStore, NewMessage, PageQuery, StoreResult, Trigger,
};
use crate::traceparent::format_traceparent;

/// The next seq of messages and of attempts: assigned in the writer thread, so in commit
/// order, and never given twice (not even after the newest rows were deleted).
#[derive(Debug, Default)]
pub struct Seqs {
    message: AtomicI64,
    attempt: AtomicI64,
}

impl Seqs {
    /// Past every seq in use or indexed.
    pub fn load(conn: &Connection) -> rusqlite::Result<Self> {
        let top = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0));
        let message = top("SELECT max(coalesce((SELECT max(seq) FROM message), 0),
                                    coalesce((SELECT seq FROM watermark WHERE name = 'message'), 0))")?;
        let attempt = top("SELECT max(coalesce((SELECT max(seq) FROM attempt), 0),
                                    coalesce((SELECT seq FROM watermark WHERE name = 'attempt'), 0))")?;
        Ok(Self { message: AtomicI64::new(message + 1), attempt: AtomicI64::new(attempt + 1) })
    }

    fn next_message(&self) -> i64 {
        self.message.fetch_add(1, Ordering::Relaxed)
    }

    fn next_attempt(&self) -> i64 {
        self.attempt.fetch_add(1, Ordering::Relaxed)
    }
}

/// The rows of `message` past the index tables' watermark.
const MESSAGE_TAIL: &str = "m.seq > (SELECT seq FROM watermark WHERE name = 'message')";
/// The rows of `attempt` past it.
const ATTEMPT_TAIL: &str = "a.seq > (SELECT seq FROM watermark WHERE name = 'attempt')";

#[async_trait]
impl MessageStore for SqliteStore {
    async fn ingest(&self, new: NewMessage) -> StoreResult<IngestResult> {
        let app = new.message.app_id.clone();
        // Hot: a duplicate eventId fails only its own INSERT statement, nothing else can.
        let (seqs, keys) = (self.seqs.clone(), self.keys.clone());
        // Packed here, on the request's thread: the writer is one thread for every tenant.
        let packed = packing::packed_payload(&new.message, self.pack_payloads);
        // So is the key's hash.
        let key_hash = new.idempotency.as_ref().map(|r| keys::hash(&r.scope, &r.key));
        let done =
            self.writer.write_hot(move |conn| ingest(conn, &seqs, &keys, &new, packed.as_deref(), key_hash)).await;
        if done.is_ok() {
            self.signals.messages.notify(&app);
        }
        done
    }

    async fn message(&self, app: &AppId, id: &str) -> StoreResult<Option<Message>> {
        let (app, id) = (app.clone(), id.to_owned());
        self.readers
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(sqlite(sql::MESSAGE.as_str()))?
                    .query_row([app.as_str(), id.as_str()], |row| rows::message(row, true))
                    .optional()?)
            })
            .await
    }

    async fn find_messages(&self, id_or_event_id: &str, limit: usize) -> StoreResult<Vec<Message>> {
        let key = id_or_event_id.to_owned();
        self.readers
            .read(move |conn| {
                // The event id lookup goes through the (app_id, event_id) index, one probe per
                // application, instead of scanning every message.
                let sql = format!(
                    "SELECT {MESSAGE_COLUMNS} FROM message m WHERE m.id = ?1
                     UNION ALL
                     SELECT {MESSAGE_COLUMNS} FROM message m
                     WHERE m.app_id IN (SELECT id FROM app) AND m.event_id = ?1 AND m.id <> ?1
                     ORDER BY 1 DESC LIMIT ?2"
                );
                let found = conn
                    .prepare_cached(&sql)?
                    .query_map(params![key, limit as i64], |row| rows::message(row, true))?
                    .collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn list_messages(&self, app: &AppId, filter: &MessageFilter, page: &PageQuery) -> StoreResult<Vec<Message>> {
        let (app, filter, page) = (app.clone(), filter.clone(), page.clone());
        self.readers
            .read(move |conn| {
                let app = Value::Text(app.to_string());
                let mut indexed = Query::default();
                indexed.and("b.app_id = ?", [app.clone()]);
                indexed.messages(&filter);
                let mut tail = Query::default();
                tail.and(MESSAGE_TAIL, []);
                tail.and("m.app_id = ?", [app]);
                tail.messages(&filter);
                let branches = vec![
                    Branch { from: "message_by_app b JOIN message m ON m.seq = b.seq", key: "b.id", query: indexed },
                    Branch { from: "message m", key: "m.id", query: tail },
                ];
                let (sql, params) = merged_page(MESSAGE_COLUMNS, branches, &page);
                let mut stmt = conn.prepare_cached(&sql)?;
                let found = stmt
                    .query_map(params_from_iter(params), |row| rows::message(row, true))?
                    .collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn expunge_message(&self, app: &AppId, id: &MessageId) -> StoreResult<bool> {
        let (app, id) = (app.clone(), id.clone());
        self.writer
            .write(move |conn| {
                let changed = conn.execute(sqlite(sql::EXPUNGE_MESSAGE), [id.as_str(), app.as_str()])?;
                Ok(changed > 0)
            })
            .await
    }

    async fn list_attempts(&self, filter: &AttemptFilter, page: &PageQuery) -> StoreResult<Vec<Attempt>> {
        let (filter, page) = (filter.clone(), page.clone());
        self.readers.read(move |conn| list_attempts(conn, &filter, &page)).await
    }

    async fn attempt(&self, app: &AppId, msg: &MessageId, id: &str) -> StoreResult<Option<Attempt>> {
        let (app, msg, id) = (app.clone(), msg.clone(), id.to_owned());
        self.readers
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(sqlite(sql::ATTEMPT.as_str()))?
                    .query_row([id.as_str(), msg.as_str(), app.as_str()], |row| rows::attempt(row, true))
                    .optional()?)
            })
            .await
    }

    async fn expunge_attempt(&self, app: &AppId, msg: &MessageId, id: &str) -> StoreResult<bool> {
        let (app, msg, id) = (app.clone(), msg.clone(), id.to_owned());
        self.writer
            .write(move |conn| {
                let changed = conn.execute(sqlite(sql::EXPUNGE_ATTEMPT), [id.as_str(), msg.as_str(), app.as_str()])?;
                Ok(changed > 0)
            })
            .await
    }

    async fn endpoint_messages(
        &self,
        endpoint: &EndpointId,
        filter: &MessageFilter,
        status: Option<DeliveryStatus>,
        page: &PageQuery,
    ) -> StoreResult<Vec<(Message, DeliveryView)>> {
        let (endpoint, filter, page) = (endpoint.clone(), filter.clone(), page.clone());
        self.readers.read(move |conn| endpoint_messages(conn, &endpoint, &filter, status, &page)).await
    }

    async fn message_deliveries(&self, msg: &MessageId, page: &PageQuery) -> StoreResult<Vec<DeliveryView>> {
        let (msg, page) = (msg.clone(), page.clone());
        self.readers.read(move |conn| message_deliveries(conn, &msg, &page)).await
    }

    async fn endpoint_stats(
        &self,
        endpoint: &EndpointId,
        since: Option<Millis>,
        until: Option<Millis>,
    ) -> StoreResult<EndpointStats> {
        let endpoint = endpoint.clone();
        self.readers.read(move |conn| endpoint_stats(conn, &endpoint, since, until)).await
    }
}

/// Commits `new`, its payload as `packed` when that is given (`packing::pack`), its key
/// (if it has one) looked up and kept by `key_hash` ([`keys::hash`]).
fn ingest(
    conn: &Connection,
    seqs: &Seqs,
    keys: &Keys,
    new: &NewMessage,
    packed: Option<&[u8]>,
    key_hash: Option<i64>,
) -> StoreResult<IngestResult> {
    let keyed = new.idempotency.as_ref().zip(key_hash);
    if let Some((record, h)) = keyed
        && let Some(stored) = keys.lock().find_hashed(conn, h, &record.scope, &record.key)?
    {
        return Ok(IngestResult::Replayed(stored));
    }
    let m = &new.message;
    let seq = seqs.next_message();
    let dests: Vec<&str> = new.deliveries.iter().map(|d| d.endpoint.as_str()).collect();
    let inserted = conn
        .prepare_cached(
            "INSERT INTO message (seq, id, app_id, event_type, event_id, channels, payload, created_at, dests, trace,
                                  packed)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )?
        .execute(params![
            seq,
            m.id.as_str(),
            m.app_id.as_str(),
            m.event_type,
            m.event_id,
            rows::opt_json_value(&m.channels),
            if packed.is_some() { None } else { m.payload.as_deref() },
            m.created_at,
            rows::to_json(&dests),
            m.trace.as_ref().map(format_traceparent),
            packed,
        ]);
    match inserted {
        Err(e) if is_unique_violation(&e) => return Ok(IngestResult::DuplicateEventId),
        other => other?,
    };
    let mut ids = Vec::with_capacity(new.deliveries.len());
    for (place, delivery) in new.deliveries.iter().enumerate() {
        let id = delivery_id(seq, place as i64);
        match new.owner.as_deref() {
            // Held in memory from now on (strictly ordered deliveries never are: they go out
            // head first, from the store).
            Some(owner) if !delivery.strict => {
                conn.prepare_cached("INSERT INTO held (id, owner) VALUES (?, ?)")?.execute(params![id, owner])?;
            }
            _ => {
                let pending = Materialize {
                    id,
                    state: DeliveryState::Pending,
                    attempts: 0,
                    next_at: m.created_at,
                    manual: false,
                    owner: None,
                    resend: false,
                    strict: Some(delivery.strict),
                    last: None,
                };
                deliveries::materialize(conn, &pending, None)?;
            }
        }
        ids.push(id);
    }
    if let Some((record, h)) = keyed {
        // Not found above, and this transaction is the writer's alone.
        keys.lock().append(conn, h, &record.scope, &record.key, &record.response)?;
    }
    Ok(IngestResult::Created { deliveries: ids })
}

/// The Svix status condition on a delivery's resolved `state` and `attempts`.
fn status_condition(status: DeliveryStatus) -> &'static str {
    match status {
        DeliveryStatus::Success => "m.state = 1",
        DeliveryStatus::Fail => "m.state IN (2, 3)",
        DeliveryStatus::Pending => "m.state = 0 AND m.attempts = 0",
        DeliveryStatus::Sending => "m.state = 0 AND m.attempts > 0",
    }
}

fn list_attempts(conn: &Connection, filter: &AttemptFilter, page: &PageQuery) -> StoreResult<Vec<Attempt>> {
    let mut q = Query::default();
    q.and("a.app_id = ?", [Value::Text(filter.app.to_string())]);
    match filter.status {
        Some(DeliveryStatus::Success) => q.and("a.delivered = 1", []),
        Some(DeliveryStatus::Fail) => q.and("a.delivered = 0", []),
        // Attempts are final records: none is ever pending or sending.
        Some(DeliveryStatus::Pending | DeliveryStatus::Sending) => q.and("0", []),
        None => {}
    }
    if let Some(class) = filter.status_code_class {
        if class == 0 {
            q.and("a.status_code = 0", []);
        } else {
            let low = i64::from(class);
            q.and("a.status_code >= ? AND a.status_code < ?", [Value::Integer(low), Value::Integer(low + 100)]);
        }
    }
    let joined = filter.messages.channel.is_some() || !filter.messages.event_types.is_empty();
    q.messages(&MessageFilter { before: None, after: None, ..filter.messages.clone() });
    if let Some(before) = filter.messages.before {
        q.and("a.created_at < ?", [Value::Integer(before)]);
    }
    if let Some(after) = filter.messages.after {
        q.and("a.created_at >= ?", [Value::Integer(after)]);
    }
    if let (Some(_), Some(endpoint)) = (&filter.msg, &filter.endpoint) {
        q.and("a.endpoint_id = ?", [Value::Text(endpoint.to_string())]);
    }
    let join = if joined { " JOIN message m ON m.seq = a.msg_seq" } else { "" };
    // By message or by endpoint: the index table up to its watermark, and the tail.
    let keyed = match (&filter.msg, &filter.endpoint) {
        (Some(msg), _) => Some(("attempt_by_msg", "msg_seq = (SELECT seq FROM message WHERE id = ?)", msg.to_string())),
        (None, Some(endpoint)) => Some(("attempt_by_endpoint", "endpoint_id = ?", endpoint.to_string())),
        (None, None) => None,
    };
    let (sql, params) = match keyed {
        Some((index, key, value)) => {
            let mut indexed = Query { conditions: q.conditions.clone(), params: q.params.clone() };
            indexed.and(format!("x.{key}"), [Value::Text(value.clone())]);
            let mut tail = q;
            tail.and(ATTEMPT_TAIL, []);
            tail.and(format!("a.{key}"), [Value::Text(value)]);
            let from_index = format!("{index} x JOIN attempt a ON a.seq = x.seq{join}");
            let from_tail = format!("attempt a{join}");
            let branches = vec![
                Branch { from: &from_index, key: "x.id", query: indexed },
                Branch { from: &from_tail, key: "a.id", query: tail },
            ];
            merged_page(ATTEMPT_COLUMNS, branches, page)
        }
        None => {
            let tail = q.page("a.id", page);
            let head = sql::to_sqlite(&sql::list_head(ATTEMPT_COLUMNS, "attempt a"));
            (format!("{head}{join}{}{tail}", q.where_clause()), q.params)
        }
    };
    let mut stmt = conn.prepare_cached(&sql)?;
    let with_content = filter.with_content;
    let found =
        stmt.query_map(params_from_iter(params), |row| rows::attempt(row, with_content))?.collect::<Result<_, _>>()?;
    Ok(found)
}

/// The resolved delivery columns (`endpoint_id, state, attempts, next_at`) of a source that
/// names the delivery's id as `id`, with `delivery d` LEFT JOINed on it.
fn delivery_columns(id: &str, endpoint: &str) -> String {
    let state = deliveries::state_sql("d", id);
    let attempts = deliveries::attempts_sql("d", id);
    format!(
        "{endpoint} AS endpoint_id, {state} AS state, {attempts} AS attempts, coalesce(d.next_at, m.created_at) AS next_at"
    )
}

fn endpoint_messages(
    conn: &Connection,
    endpoint: &EndpointId,
    filter: &MessageFilter,
    status: Option<DeliveryStatus>,
    page: &PageQuery,
) -> StoreResult<Vec<(Message, DeliveryView)>> {
    let e = Value::Text(endpoint.to_string());
    let query = || {
        let mut q = Query::default();
        q.and("m.e = ?", [e.clone()]);
        if let Some(status) = status {
            q.and(status_condition(status), []);
        }
        q.messages(filter);
        q
    };
    // Each source with its delivery resolved (so the status filter applies to the result),
    // in the order of an indexed message id.
    let indexed = format!(
        "(SELECT m.*, b.endpoint_id AS e, b.msg_id AS k, {} FROM dest_by_endpoint b
          JOIN message m ON m.seq = b.delivery_id / 65536 LEFT JOIN delivery d ON d.id = b.delivery_id) m",
        delivery_columns("b.delivery_id", "b.endpoint_id")
    );
    let tail = format!(
        "(SELECT m.*, j.value AS e, m.id AS k, {} FROM message m, json_each(m.dests) j
          LEFT JOIN delivery d ON d.id = m.seq * 65536 + j.key WHERE {MESSAGE_TAIL}) m",
        delivery_columns("m.seq * 65536 + j.key", "j.value")
    );
    // Resends to an endpoint the message had not gone to.
    let later = format!(
        "(SELECT m.*, d.endpoint_id AS e, d.msg_id AS k, {} FROM delivery d JOIN message m ON m.seq = d.msg_seq
          WHERE d.id % 65536 >= {LATER_PLACES}) m",
        delivery_columns("d.id", "d.endpoint_id")
    );
    let branches =
        [&indexed, &tail, &later].into_iter().map(|from| Branch { from, key: "m.k", query: query() }).collect();
    let columns = format!("{MESSAGE_COLUMNS}, m.endpoint_id, m.state, m.attempts, m.next_at");
    let (sql, params) = merged_page(&columns, branches, page);
    let mut stmt = conn.prepare_cached(&sql)?;
    let found = stmt
        .query_map(params_from_iter(params), |row| {
            Ok((rows::message(row, true)?, rows::delivery_view(row, MESSAGE_COLUMN_COUNT)?))
        })?
        .collect::<Result<_, _>>()?;
    Ok(found)
}

/// A message's deliveries, by endpoint id: those made at ingest and any made later.
fn message_deliveries(conn: &Connection, msg: &MessageId, page: &PageQuery) -> StoreResult<Vec<DeliveryView>> {
    let sql = format!(
        "SELECT * FROM (
             SELECT {} FROM message m, json_each(m.dests) j LEFT JOIN delivery d ON d.id = m.seq * 65536 + j.key
             WHERE m.id = ?1
             UNION ALL
             SELECT {} FROM delivery d JOIN message m ON m.seq = d.msg_seq
             WHERE m.id = ?1 AND d.id % 65536 >= {LATER_PLACES})",
        delivery_columns("m.seq * 65536 + j.key", "j.value"),
        delivery_columns("d.id", "d.endpoint_id"),
    );
    let (op, dir) = if page.descending { ("<", "DESC") } else { (">", "ASC") };
    let mut params = vec![Value::Text(msg.to_string())];
    let mut sql = sql;
    if let Some(iterator) = &page.iterator {
        sql.push_str(&format!(" WHERE endpoint_id {op} ?2"));
        params.push(Value::Text(iterator.clone()));
    }
    sql.push_str(&format!(" ORDER BY endpoint_id {dir} LIMIT {}", page.limit));
    let mut stmt = conn.prepare_cached(&sql)?;
    let found =
        stmt.query_map(params_from_iter(params), |row| rows::delivery_view(row, 0))?.collect::<Result<_, _>>()?;
    Ok(found)
}

fn endpoint_stats(
    conn: &Connection,
    endpoint: &EndpointId,
    since: Option<Millis>,
    until: Option<Millis>,
) -> StoreResult<EndpointStats> {
    // Rows of their own, and the deliveries made at ingest that have none (held: pending;
    // else delivered), up to the watermark and past it.
    let sql = format!(
        "SELECT state, attempts > 0, count(*) FROM (
             SELECT d.state, d.attempts FROM delivery d
             WHERE d.endpoint_id = ?1 AND d.created_at >= ?2 AND d.created_at < ?3
             UNION ALL
             SELECT {held} AS state, 0 FROM dest_by_endpoint b JOIN message m ON m.seq = b.delivery_id / 65536
             WHERE b.endpoint_id = ?1 AND m.created_at >= ?2 AND m.created_at < ?3
               AND NOT EXISTS (SELECT 1 FROM delivery d WHERE d.id = b.delivery_id)
             UNION ALL
             SELECT {tail_held} AS state, 0 FROM message m, json_each(m.dests) j
             WHERE {MESSAGE_TAIL} AND j.value = ?1 AND m.created_at >= ?2 AND m.created_at < ?3
               AND NOT EXISTS (SELECT 1 FROM delivery d WHERE d.id = m.seq * 65536 + j.key)
         ) GROUP BY 1, 2",
        held = "CASE WHEN EXISTS (SELECT 1 FROM held h WHERE h.id = b.delivery_id) THEN 0 ELSE 1 END",
        tail_held = "CASE WHEN EXISTS (SELECT 1 FROM held h WHERE h.id = m.seq * 65536 + j.key) THEN 0 ELSE 1 END",
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut stats = EndpointStats::default();
    let range = params![endpoint.as_str(), since.unwrap_or(i64::MIN), until.unwrap_or(i64::MAX)];
    let mut rows = stmt.query(range)?;
    while let Some(row) = rows.next()? {
        let (state, tried, count): (i64, bool, u64) = (row.get(0)?, row.get(1)?, row.get(2)?);
        match DeliveryStatus::of(DeliveryState::from_code(state), tried as u32) {
            DeliveryStatus::Success => stats.success += count,
            DeliveryStatus::Pending => stats.pending += count,
            DeliveryStatus::Sending => stats.sending += count,
            DeliveryStatus::Fail if state == DeliveryState::Canceled.code() => stats.canceled += count,
            DeliveryStatus::Fail => stats.fail += count,
        }
    }
    Ok(stats)
}

/// Appends an attempt row.
pub(super) fn insert_attempt(conn: &Connection, seqs: &Seqs, delivery_id: i64, a: &Attempt) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO attempt (seq, id, delivery_id, msg_seq, msg_id, endpoint_id, app_id, created_at, url,
            status_code, duration_ms, delivered, error_class, error, response, trigger, attempt_no)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        seqs.next_attempt(),
        a.id.as_str(),
        delivery_id,
        msg_seq_of(delivery_id),
        a.msg_id.as_str(),
        a.endpoint_id.as_str(),
        a.app_id.as_str(),
        a.created_at,
        a.url,
        a.status_code,
        a.duration_ms,
        a.delivered,
        a.error_class,
        a.error,
        a.response,
        Trigger::code(a.trigger),
        a.attempt_no
    ])?;
    Ok(())
}
