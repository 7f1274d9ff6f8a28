//! Pollers and their consumers' positions on PostgreSQL; an application's messages in
//! commit order. Transactions commit in any order, so a message's place is (the inserting
//! transaction's id, its id), and readers see only messages below the oldest transaction
//! still running: everything that can still commit sorts after what they have read.

use async_trait::async_trait;
use tokio_postgres::Row;
use tokio_postgres::types::{Json, ToSql};

use super::catalog::under_cap;
use super::rows::{self, MESSAGE_COLUMNS};
use super::{PgStore, db_err, pg_err};
use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, MessageId, PollerId, first_body_at};
use crate::store::sql::{self, POLLER_COLUMNS};
use crate::store::{ConsumerState, LogPosition, Message, Move, PageQuery, PollStore, Poller, StoreResult};

const UID_TAKEN: &str = "a poller with this uid already exists";
/// Messages no running transaction can still join, in commit order.
const SETTLED: &str = "m.tx < pg_snapshot_xmin(pg_current_snapshot())";

fn poller(row: &Row) -> Poller {
    Poller {
        id: PollerId::from_trusted(row.get(0)),
        app_id: AppId::from_trusted(row.get(1)),
        uid: row.get(2),
        description: row.get(3),
        event_types: row.get(4),
        channels: row.get(5),
        filter: row.get(6),
        metadata: row.get::<_, Json<_>>(7).0,
        created_at: row.get(8),
        updated_at: row.get(9),
    }
}

fn poller_params(p: &Poller) -> Vec<Box<dyn ToSql + Sync + Send>> {
    vec![
        Box::new(p.id.to_string()),
        Box::new(p.app_id.to_string()),
        Box::new(p.uid.clone()),
        Box::new(p.description.clone()),
        Box::new(p.event_types.clone()),
        Box::new(p.channels.clone()),
        Box::new(p.filter.clone()),
        Box::new(Json(p.metadata.clone())),
        Box::new(p.created_at),
        Box::new(p.updated_at),
    ]
}

fn position(row: &Row) -> LogPosition {
    LogPosition { major: row.get(0), minor: row.get(1) }
}

#[async_trait]
impl PollStore for PgStore {
    async fn insert_poller(&self, p: &Poller, cap: usize) -> StoreResult<bool> {
        let mut client = self.client().await?;
        let params = poller_params(p);
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|b| b.as_ref() as &(dyn ToSql + Sync)).collect();
        let sql =
            format!("INSERT INTO herald.poller ({POLLER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)");
        let tx = client.transaction().await.map_err(db_err)?;
        if !under_cap(&tx, &p.app_id, "poller", cap).await? {
            return Ok(false);
        }
        tx.execute(&sql, &params).await.map_err(pg_err(UID_TAKEN))?;
        tx.commit().await.map_err(db_err)?;
        Ok(true)
    }

    async fn poller(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Poller>> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT {POLLER_COLUMNS} FROM herald.poller WHERE app_id = $1 AND (id = $2 OR uid = $2)
             ORDER BY id = $2 DESC LIMIT 1"
        );
        let row = client.query_opt(&sql, &[&app.as_str(), &id_or_uid]).await.map_err(db_err)?;
        Ok(row.as_ref().map(poller))
    }

    async fn list_pollers(&self, app: &AppId, page: &PageQuery) -> StoreResult<Vec<Poller>> {
        let client = self.client().await?;
        let (sql, q) = rows::app_page(POLLER_COLUMNS, "poller", app, page);
        let found = client.query(&sql, &q.params()).await.map_err(db_err)?;
        Ok(found.iter().map(poller).collect())
    }

    async fn update_poller(&self, p: &Poller, read_at: Millis) -> StoreResult<bool> {
        let client = self.client().await?;
        let mut params = poller_params(p);
        params.remove(8); // created_at does not change
        params.push(Box::new(read_at));
        let params: Vec<&(dyn ToSql + Sync)> = params.iter().map(|b| b.as_ref() as &(dyn ToSql + Sync)).collect();
        let sql = sql::UPDATE_POLLER;
        Ok(client.execute(sql, &params).await.map_err(pg_err(UID_TAKEN))? == 1)
    }

    async fn delete_poller(&self, app: &AppId, id: &PollerId) -> StoreResult<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        tx.execute(sql::DELETE_CONSUMERS, &[&id.as_str()]).await.map_err(db_err)?;
        tx.execute(sql::DELETE_POLLER, &[&app.as_str(), &id.as_str()]).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)
    }

    async fn consumer_position(&self, poller: &PollerId, consumer: &str) -> StoreResult<Option<LogPosition>> {
        let client = self.client().await?;
        let sql = "SELECT tx, msg_id FROM herald.poller_consumer WHERE poller_id = $1 AND name = $2";
        let row = client.query_opt(sql, &[&poller.as_str(), &consumer]).await.map_err(db_err)?;
        Ok(row.as_ref().map(position))
    }

    async fn move_consumer(
        &self,
        poller: &PollerId,
        consumer: &str,
        at: &LogPosition,
        how: Move,
        cap: usize,
    ) -> StoreResult<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        let known = "SELECT 1 FROM herald.poller_consumer WHERE poller_id = $1 AND name = $2";
        if tx.query_opt(known, &[&poller.as_str(), &consumer]).await.map_err(db_err)?.is_none() {
            // A new consumer: counted under a lock on the poller, so two cannot both pass.
            let lock = format!("consumer:{poller}");
            tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", &[&lock]).await.map_err(db_err)?;
            let count: i64 = tx.query_one(sql::COUNT_CONSUMERS, &[&poller.as_str()]).await.map_err(db_err)?.get(0);
            if count >= cap as i64 {
                return Ok(false);
            }
        }
        let only_forward = match how {
            Move::Forward => {
                "WHERE (herald.poller_consumer.tx, herald.poller_consumer.msg_id) < (excluded.tx, excluded.msg_id)"
            }
            Move::To => "",
        };
        let sql = format!(
            "INSERT INTO herald.poller_consumer VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (poller_id, name) DO UPDATE SET tx = excluded.tx, msg_id = excluded.msg_id,
                 updated_at = excluded.updated_at {only_forward}"
        );
        tx.execute(&sql, &[&poller.as_str(), &consumer, &at.major, &at.minor, &now_ms()]).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(true)
    }

    async fn consumers(&self, poller: &PollerId, limit: usize) -> StoreResult<Vec<ConsumerState>> {
        let client = self.client().await?;
        let rows = client.query(sql::CONSUMERS, &[&poller.as_str(), &(limit as i64)]).await.map_err(db_err)?;
        Ok(rows.iter().map(|r| ConsumerState { name: r.get(0), moved_at: r.get(1) }).collect())
    }

    async fn messages_after(
        &self,
        app: &AppId,
        after: &LogPosition,
        limit: usize,
    ) -> StoreResult<Vec<(LogPosition, Message)>> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT m.tx::text::bigint, m.id, {MESSAGE_COLUMNS} FROM herald.message m
             WHERE m.app_id = $1 AND (m.tx, m.id) > ($2::text::xid8, $3) AND {SETTLED}
             ORDER BY m.tx, m.id LIMIT $4"
        );
        let params: [&(dyn ToSql + Sync); 4] = [&app.as_str(), &after.major.to_string(), &after.minor, &(limit as i64)];
        let found = client.query(&sql, &params).await.map_err(db_err)?;
        Ok(found.iter().map(|row| (position(row), rows::message_at(row, 2, true))).collect())
    }

    async fn message_position(&self, app: &AppId, id: &MessageId) -> StoreResult<Option<LogPosition>> {
        let client = self.client().await?;
        let sql = "SELECT m.tx::text::bigint, m.id FROM herald.message m WHERE m.app_id = $1 AND m.id = $2";
        let row = client.query_opt(sql, &[&app.as_str(), &id.as_str()]).await.map_err(db_err)?;
        Ok(row.as_ref().map(position))
    }

    async fn position_at(&self, app: &AppId, at: Millis) -> StoreResult<LogPosition> {
        let client = self.client().await?;
        // The first message created at `at` or later, in commit order; the position before
        // it is the start of its transaction (an empty id sorts before every id).
        let bound = format!("{}{}", MessageId::PREFIX, first_body_at(at));
        let sql = "SELECT m.tx::text::bigint FROM herald.message m WHERE m.app_id = $1 AND m.id >= $2
                   ORDER BY m.tx, m.id LIMIT 1";
        if let Some(row) = client.query_opt(sql, &[&app.as_str(), &bound]).await.map_err(db_err)? {
            return Ok(LogPosition { major: row.get(0), minor: String::new() });
        }
        // Nothing that recent: after the newest message settled so far.
        Ok(self.log_head(app).await?.unwrap_or_default())
    }

    async fn log_head(&self, app: &AppId) -> StoreResult<Option<LogPosition>> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT m.tx::text::bigint, m.id FROM herald.message m WHERE m.app_id = $1 AND {SETTLED}
             ORDER BY m.tx DESC, m.id DESC LIMIT 1"
        );
        let newest = client.query_opt(&sql, &[&app.as_str()]).await.map_err(db_err)?;
        Ok(newest.as_ref().map(position))
    }
}
