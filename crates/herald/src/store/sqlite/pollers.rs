//! Pollers and their consumers' positions; an application's messages in commit order. One
//! writer commits messages in seq order, so a position is a message seq and no message can
//! later appear behind it.

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{OptionalExtension, Row, params, params_from_iter};

use super::SqliteStore;
use super::rows::{self, MESSAGE_COLUMNS};
use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, MessageId, PollerId};
use crate::store::sql::{self, POLLER_COLUMNS, sqlite};
use crate::store::{ConsumerState, LogPosition, Message, Move, PageQuery, PollStore, Poller, StoreError, StoreResult};

fn poller(row: &Row<'_>) -> rusqlite::Result<Poller> {
    Ok(Poller {
        id: PollerId::from_trusted(row.get(0)?),
        app_id: AppId::from_trusted(row.get(1)?),
        uid: row.get(2)?,
        description: row.get(3)?,
        event_types: rows::opt_json(row, 4)?,
        channels: rows::opt_json(row, 5)?,
        filter: row.get(6)?,
        metadata: rows::opt_json(row, 7)?.unwrap_or_default(),
        created_at: row.get(8)?,
        updated_at: row.get(9)?,
    })
}

fn poller_values(p: &Poller) -> Vec<Value> {
    let json = |v: &Option<Vec<String>>| v.as_ref().map(|v| serde_json::to_string(v).expect("a list serializes"));
    vec![
        Value::Text(p.id.to_string()),
        Value::Text(p.app_id.to_string()),
        p.uid.clone().map_or(Value::Null, Value::Text),
        Value::Text(p.description.clone()),
        json(&p.event_types).map_or(Value::Null, Value::Text),
        json(&p.channels).map_or(Value::Null, Value::Text),
        p.filter.clone().map_or(Value::Null, Value::Text),
        Value::Text(serde_json::to_string(&p.metadata).expect("metadata serializes")),
        Value::Integer(p.created_at),
        Value::Integer(p.updated_at),
    ]
}

fn uid_taken(e: rusqlite::Error) -> StoreError {
    if super::is_unique_violation(&e) {
        StoreError::Conflict("a poller with this uid already exists")
    } else {
        e.into()
    }
}

#[async_trait]
impl PollStore for SqliteStore {
    async fn insert_poller(&self, poller: &Poller, cap: usize) -> StoreResult<bool> {
        let mut values = poller_values(poller);
        values.push(Value::Text(poller.app_id.to_string()));
        values.push(Value::Integer(cap as i64));
        self.writer
            .write(move |conn| {
                let marks = vec!["?"; values.len() - 2].join(", ");
                let sql = format!(
                    "INSERT INTO poller ({POLLER_COLUMNS}) SELECT {marks}
                     WHERE (SELECT count(*) FROM poller WHERE app_id = ?) < ?"
                );
                let added = conn.prepare_cached(&sql)?.execute(params_from_iter(values)).map_err(uid_taken)?;
                Ok(added == 1)
            })
            .await
    }

    async fn poller(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Poller>> {
        let (app, key) = (app.clone(), id_or_uid.to_owned());
        self.readers
            .read(move |conn| {
                let sql = format!("SELECT {POLLER_COLUMNS} FROM poller WHERE app_id = ?1 AND (id = ?2 OR uid = ?2)");
                let mut found: Vec<Poller> = conn
                    .prepare_cached(&sql)?
                    .query_map(params![app.as_str(), key], poller)?
                    .collect::<Result<_, _>>()?;
                // An id match wins over a uid that happens to look like another poller's id.
                found.sort_by_key(|p| p.id.as_str() != key);
                Ok(found.into_iter().next())
            })
            .await
    }

    async fn list_pollers(&self, app: &AppId, page: &PageQuery) -> StoreResult<Vec<Poller>> {
        let (app, page) = (app.clone(), page.clone());
        self.readers
            .read(move |conn| {
                let (sql, params) = rows::app_page(POLLER_COLUMNS, "poller", &app, &page);
                let mut stmt = conn.prepare_cached(&sql)?;
                let found = stmt.query_map(params_from_iter(params), poller)?.collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn update_poller(&self, poller: &Poller, read_at: Millis) -> StoreResult<bool> {
        let mut values = poller_values(poller);
        // The creation time does not change.
        values.remove(8);
        values.push(Value::Integer(read_at));
        self.writer
            .write(move |conn| {
                let changed = conn
                    .prepare_cached(sqlite(sql::UPDATE_POLLER))?
                    .execute(params_from_iter(values))
                    .map_err(uid_taken)?;
                Ok(changed == 1)
            })
            .await
    }

    async fn delete_poller(&self, app: &AppId, id: &PollerId) -> StoreResult<()> {
        let (app, id) = (app.clone(), id.clone());
        self.writer
            .write(move |conn| {
                conn.execute(sqlite(sql::DELETE_CONSUMERS), [id.as_str()])?;
                conn.execute(sqlite(sql::DELETE_POLLER), [app.as_str(), id.as_str()])?;
                Ok(())
            })
            .await
    }

    async fn consumer_position(&self, poller: &PollerId, consumer: &str) -> StoreResult<Option<LogPosition>> {
        let (poller, consumer) = (poller.clone(), consumer.to_owned());
        self.readers
            .read(move |conn| {
                Ok(conn
                    .prepare_cached("SELECT position FROM poller_consumer WHERE poller_id = ? AND name = ?")?
                    .query_row(params![poller.as_str(), consumer], |r| r.get(0))
                    .optional()?
                    .map(|major| LogPosition { major, minor: String::new() }))
            })
            .await
    }

    async fn move_consumer(
        &self,
        poller: &PollerId,
        consumer: &str,
        at: &LogPosition,
        how: Move,
        cap: usize,
    ) -> StoreResult<bool> {
        let (poller, consumer, at) = (poller.clone(), consumer.to_owned(), at.major);
        self.writer
            .write(move |conn| {
                // One writer: the count and the insert cannot interleave with another's.
                let known = conn
                    .prepare_cached("SELECT position FROM poller_consumer WHERE poller_id = ? AND name = ?")?
                    .query_row(params![poller.as_str(), consumer], |row| row.get::<_, i64>(0))
                    .optional()?;
                match known {
                    Some(position) if how == Move::Forward && position >= at => return Ok(true),
                    Some(_) => {}
                    None => {
                        let count: i64 = conn
                            .prepare_cached(sqlite(sql::COUNT_CONSUMERS))?
                            .query_row([poller.as_str()], |row| row.get(0))?;
                        if count >= cap as i64 {
                            return Ok(false);
                        }
                    }
                }
                conn.prepare_cached(
                    "INSERT INTO poller_consumer VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (poller_id, name) DO UPDATE SET position = excluded.position,
                     updated_at = excluded.updated_at",
                )?
                .execute(params![poller.as_str(), consumer, at, now_ms()])?;
                Ok(true)
            })
            .await
    }

    async fn consumers(&self, poller: &PollerId, limit: usize) -> StoreResult<Vec<ConsumerState>> {
        let poller = poller.clone();
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(sqlite(sql::CONSUMERS))?;
                let found = stmt
                    .query_map(params![poller.as_str(), limit as i64], |r| {
                        Ok(ConsumerState { name: r.get(0)?, moved_at: r.get(1)? })
                    })?
                    .collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn messages_after(
        &self,
        app: &AppId,
        after: &LogPosition,
        limit: usize,
    ) -> StoreResult<Vec<(LogPosition, Message)>> {
        let (app, after) = (app.clone(), after.major);
        self.readers
            .read(move |conn| {
                // The index table up to its watermark, the message table beyond it.
                let sql = format!(
                    "SELECT m.seq, {MESSAGE_COLUMNS} FROM (
                         SELECT seq FROM message_seq_by_app WHERE app_id = ?1 AND seq > ?2
                         UNION ALL
                         SELECT seq FROM message
                         WHERE seq > max(?2, coalesce((SELECT seq FROM watermark WHERE name = 'message'), 0))
                           AND app_id = ?1
                     ) s JOIN message m ON m.seq = s.seq ORDER BY s.seq LIMIT ?3"
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                let found = stmt
                    .query_map(params![app.as_str(), after, limit as i64], |row| {
                        let seq: i64 = row.get(0)?;
                        Ok((LogPosition { major: seq, minor: String::new() }, rows::message_at(row, 1, true)?))
                    })?
                    .collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn message_position(&self, app: &AppId, id: &MessageId) -> StoreResult<Option<LogPosition>> {
        let (app, id) = (app.clone(), id.clone());
        self.readers
            .read(move |conn| {
                Ok(conn
                    .prepare_cached("SELECT seq FROM message WHERE id = ? AND app_id = ?")?
                    .query_row([id.as_str(), app.as_str()], |r| r.get(0))
                    .optional()?
                    .map(|major| LogPosition { major, minor: String::new() }))
            })
            .await
    }

    async fn position_at(&self, app: &AppId, at: Millis) -> StoreResult<LogPosition> {
        let app = app.clone();
        self.readers
            .read(move |conn| {
                // Message ids sort by creation time; the seq before the first one at `at`.
                let bound = format!("{}{}", MessageId::PREFIX, crate::ids::first_body_at(at));
                let first: Option<i64> = conn
                    .prepare_cached("SELECT min(seq) FROM message WHERE app_id = ? AND id >= ?")?
                    .query_row([app.as_str(), bound.as_str()], |r| r.get(0))?;
                let newest: i64 =
                    conn.prepare_cached("SELECT coalesce(max(seq), 0) FROM message")?.query_row([], |r| r.get(0))?;
                Ok(LogPosition { major: first.map_or(newest, |seq| seq - 1), minor: String::new() })
            })
            .await
    }
}
