//! Ingest and the record of messages, deliveries and attempts on SQLite.

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use super::rows::{self, ATTEMPT_COLUMNS, MESSAGE_COLUMNS, Query};
use super::{SqliteStore, is_unique_violation};
use crate::clock::Millis;
use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::{
    Attempt, AttemptFilter, DeliveryState, DeliveryStatus, DeliveryView, EndpointStats, IngestResult, Message,
    MessageFilter, MessageStore, NewMessage, PageQuery, StoreResult, StoredResponse, Trigger,
};

#[async_trait]
impl MessageStore for SqliteStore {
    async fn ingest(&self, new: NewMessage) -> StoreResult<IngestResult> {
        // Hot: a duplicate eventId fails only its own INSERT statement, nothing else can.
        self.writer.write_hot(move |conn| ingest(conn, &new)).await
    }

    async fn message(&self, app: &AppId, id: &str) -> StoreResult<Option<Message>> {
        let (app, id) = (app.clone(), id.to_owned());
        self.readers
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(&format!(
                        "SELECT {MESSAGE_COLUMNS} FROM message m
                         WHERE m.app_id = ?1 AND (m.id = ?2 OR m.event_id = ?2) ORDER BY m.id = ?2 DESC LIMIT 1"
                    ))?
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
                let mut q = Query::default();
                q.and("m.app_id = ?", [Value::Text(app.to_string())]);
                q.messages(&filter);
                let tail = q.page("m.id", &page);
                let sql = format!("SELECT {MESSAGE_COLUMNS} FROM message m{}{tail}", q.where_clause());
                let mut stmt = conn.prepare_cached(&sql)?;
                let found = stmt
                    .query_map(params_from_iter(q.params), |row| rows::message(row, true))?
                    .collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn expunge_message(&self, app: &AppId, id: &MessageId) -> StoreResult<bool> {
        let (app, id) = (app.clone(), id.clone());
        self.writer
            .write(move |conn| {
                let changed = conn.execute(
                    "UPDATE message SET payload = NULL WHERE id = ? AND app_id = ?",
                    [id.as_str(), app.as_str()],
                )?;
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
                let sql =
                    format!("SELECT {ATTEMPT_COLUMNS} FROM attempt a WHERE a.id = ? AND a.msg_id = ? AND a.app_id = ?");
                Ok(conn
                    .prepare_cached(&sql)?
                    .query_row([id.as_str(), msg.as_str(), app.as_str()], |row| rows::attempt(row, true))
                    .optional()?)
            })
            .await
    }

    async fn expunge_attempt(&self, app: &AppId, msg: &MessageId, id: &str) -> StoreResult<bool> {
        let (app, msg, id) = (app.clone(), msg.clone(), id.to_owned());
        self.writer
            .write(move |conn| {
                let changed = conn.execute(
                    "UPDATE attempt SET response = 'EXPUNGED' WHERE id = ? AND msg_id = ? AND app_id = ?",
                    [id.as_str(), msg.as_str(), app.as_str()],
                )?;
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
        self.readers
            .read(move |conn| {
                let mut q = Query::default();
                q.and("d.endpoint_id = ?", [Value::Text(endpoint.to_string())]);
                q.messages(&filter);
                if let Some(status) = status {
                    q.and(delivery_status_condition(status), []);
                }
                let tail = q.page("d.msg_id", &page);
                let sql = format!(
                    "SELECT {MESSAGE_COLUMNS}, d.endpoint_id, d.state, d.attempts, d.next_at
                     FROM delivery d JOIN message m ON m.id = d.msg_id{}{tail}",
                    q.where_clause()
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                let found = stmt
                    .query_map(params_from_iter(q.params), |row| {
                        Ok((rows::message(row, true)?, rows::delivery_view(row, 7)?))
                    })?
                    .collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn message_deliveries(&self, msg: &MessageId, page: &PageQuery) -> StoreResult<Vec<DeliveryView>> {
        let (msg, page) = (msg.clone(), page.clone());
        self.readers
            .read(move |conn| {
                let mut q = Query::default();
                q.and("d.msg_id = ?", [Value::Text(msg.to_string())]);
                let tail = q.page("d.endpoint_id", &page);
                let sql = format!(
                    "SELECT d.endpoint_id, d.state, d.attempts, d.next_at FROM delivery d{}{tail}",
                    q.where_clause()
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                let found = stmt
                    .query_map(params_from_iter(q.params), |row| rows::delivery_view(row, 0))?
                    .collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn endpoint_stats(
        &self,
        endpoint: &EndpointId,
        since: Option<Millis>,
        until: Option<Millis>,
    ) -> StoreResult<EndpointStats> {
        let endpoint = endpoint.clone();
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT state, attempts > 0, count(*) FROM delivery
                     WHERE endpoint_id = ? AND created_at >= ? AND created_at < ? GROUP BY 1, 2",
                )?;
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
            })
            .await
    }
}

fn ingest(conn: &Connection, new: &NewMessage) -> StoreResult<IngestResult> {
    if let Some(record) = &new.idempotency
        && let Some(stored) = stored_response(conn, &record.scope, &record.key)?
    {
        return Ok(IngestResult::Replayed(stored));
    }
    let m = &new.message;
    let inserted = conn
        .prepare_cached(
            "INSERT INTO message (id, app_id, event_type, event_id, channels, payload, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )?
        .execute(params![
            m.id.as_str(),
            m.app_id.as_str(),
            m.event_type,
            m.event_id,
            rows::opt_json_value(&m.channels),
            m.payload.as_deref(),
            m.created_at
        ]);
    match inserted {
        Err(e) if is_unique_violation(&e) => return Ok(IngestResult::DuplicateEventId),
        other => other?,
    };
    let mut insert = conn.prepare_cached(
        "INSERT INTO delivery (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict, created_at)
         VALUES (?, ?, ?, 0, 0, ?, 0, ?, ?, ?)",
    )?;
    let mut deliveries = Vec::with_capacity(new.deliveries.len());
    for delivery in &new.deliveries {
        // Strictly ordered deliveries are never claimed here: they go out head first.
        let owner = if delivery.strict { None } else { new.owner.as_deref() };
        insert.execute(params![
            m.id.as_str(),
            delivery.endpoint.as_str(),
            m.app_id.as_str(),
            m.created_at,
            owner,
            delivery.strict,
            m.created_at
        ])?;
        deliveries.push(conn.last_insert_rowid());
    }
    if let Some(record) = &new.idempotency {
        save_response(conn, &record.scope, &record.key, &record.response)?;
    }
    Ok(IngestResult::Created { deliveries })
}

pub(super) fn stored_response(conn: &Connection, scope: &str, key: &str) -> StoreResult<Option<StoredResponse>> {
    Ok(conn
        .prepare_cached("SELECT status, body, created_at FROM idempotency WHERE scope = ? AND key = ?")?
        .query_row([scope, key], |row| {
            Ok(StoredResponse { status: row.get(0)?, body: row.get(1)?, created_at: row.get(2)? })
        })
        .optional()?)
}

pub(super) fn save_response(conn: &Connection, scope: &str, key: &str, r: &StoredResponse) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT OR IGNORE INTO idempotency (scope, key, status, body, created_at) VALUES (?, ?, ?, ?, ?)",
    )?
    .execute(params![scope, key, r.status, r.body, r.created_at])?;
    Ok(())
}

fn delivery_status_condition(status: DeliveryStatus) -> &'static str {
    match status {
        DeliveryStatus::Success => "d.state = 1",
        DeliveryStatus::Fail => "d.state IN (2, 3)",
        DeliveryStatus::Pending => "d.state = 0 AND d.attempts = 0",
        DeliveryStatus::Sending => "d.state = 0 AND d.attempts > 0",
    }
}

fn list_attempts(conn: &Connection, filter: &AttemptFilter, page: &PageQuery) -> StoreResult<Vec<Attempt>> {
    let mut q = Query::default();
    q.and("a.app_id = ?", [Value::Text(filter.app.to_string())]);
    if let Some(msg) = &filter.msg {
        q.and("a.msg_id = ?", [Value::Text(msg.to_string())]);
    }
    if let Some(endpoint) = &filter.endpoint {
        q.and("a.endpoint_id = ?", [Value::Text(endpoint.to_string())]);
    }
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
    let join = if filter.messages.channel.is_some() || !filter.messages.event_types.is_empty() {
        " JOIN message m ON m.id = a.msg_id"
    } else {
        ""
    };
    q.messages(&MessageFilter { before: None, after: None, ..filter.messages.clone() });
    if let Some(before) = filter.messages.before {
        q.and("a.created_at <= ?", [Value::Integer(before)]);
    }
    if let Some(after) = filter.messages.after {
        q.and("a.created_at >= ?", [Value::Integer(after)]);
    }
    let tail = q.page("a.id", page);
    let sql = format!("SELECT {ATTEMPT_COLUMNS} FROM attempt a{join}{}{tail}", q.where_clause());
    let mut stmt = conn.prepare_cached(&sql)?;
    let with_content = filter.with_content;
    let found = stmt
        .query_map(params_from_iter(q.params), |row| rows::attempt(row, with_content))?
        .collect::<Result<_, _>>()?;
    Ok(found)
}

/// Appends an attempt row.
pub(super) fn insert_attempt(conn: &Connection, delivery_id: i64, a: &Attempt) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO attempt (id, delivery_id, msg_id, endpoint_id, app_id, created_at, url, status_code,
            duration_ms, delivered, error_class, error, response, trigger, attempt_no)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        a.id.as_str(),
        delivery_id,
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
