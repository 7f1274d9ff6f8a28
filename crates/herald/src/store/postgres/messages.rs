//! The record of messages, deliveries and attempts on PostgreSQL (ingest itself is in
//! `ingest`, batched).

use async_trait::async_trait;

use super::ingest::Ingest;
use super::rows::{self, ATTEMPT_COLUMNS, MESSAGE_COLUMN_COUNT, MESSAGE_COLUMNS, Query};
use super::{PgStore, db_err};
use crate::clock::Millis;
use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::{
    Attempt, AttemptFilter, DeliveryState, DeliveryStatus, DeliveryView, EndpointStats, IngestResult, Message,
    MessageFilter, MessageStore, NewMessage, PageQuery, StoreResult,
};
use crate::store::{packing, sql};

fn delivery_status_condition(status: DeliveryStatus) -> &'static str {
    match status {
        DeliveryStatus::Success => "d.state = 1",
        DeliveryStatus::Fail => "d.state IN (2, 3)",
        DeliveryStatus::Pending => "d.state = 0 AND d.attempts = 0",
        DeliveryStatus::Sending => "d.state = 0 AND d.attempts > 0",
    }
}

#[async_trait]
impl MessageStore for PgStore {
    async fn ingest(&self, new: NewMessage) -> StoreResult<IngestResult> {
        let app = new.message.app_id.clone();
        let packed = packing::packed_payload(&new.message, self.pack_payloads);
        let done = self.ingest.submit(Ingest { new, packed }).await;
        if done.is_ok() {
            self.signals.messages.notify(&app);
        }
        done
    }

    async fn message(&self, app: &AppId, id_or_event_id: &str) -> StoreResult<Option<Message>> {
        let client = self.client().await?;
        let sql = sql::MESSAGE.as_str();
        let row = client.query_opt(sql, &[&app.as_str(), &id_or_event_id]).await.map_err(db_err)?;
        Ok(row.map(|r| rows::message(&r, true)))
    }

    async fn find_messages(&self, id_or_event_id: &str, limit: usize) -> StoreResult<Vec<Message>> {
        let client = self.client().await?;
        // The event id lookup probes the (app_id, event_id) index once per application.
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS} FROM herald.message m WHERE m.id = $1
             UNION ALL
             SELECT e.* FROM herald.app a CROSS JOIN LATERAL
                 (SELECT {MESSAGE_COLUMNS} FROM herald.message m
                  WHERE m.app_id = a.id AND m.event_id = $1 AND m.id <> $1) e
             ORDER BY 1 DESC LIMIT $2"
        );
        let found = client.query(&sql, &[&id_or_event_id, &(limit as i64)]).await.map_err(db_err)?;
        Ok(found.iter().map(|r| rows::message(r, true)).collect())
    }

    async fn list_messages(&self, app: &AppId, filter: &MessageFilter, page: &PageQuery) -> StoreResult<Vec<Message>> {
        let client = self.client().await?;
        let mut q = Query::default();
        let p = q.bind(app.to_string());
        q.and(format!("m.app_id = {p}"));
        q.messages(filter);
        let tail = q.page("m.id", page);
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM herald.message m{}{tail}", q.where_clause());
        let found = client.query(&sql, &q.params()).await.map_err(db_err)?;
        Ok(found.iter().map(|r| rows::message(r, true)).collect())
    }

    async fn expunge_message(&self, app: &AppId, id: &MessageId) -> StoreResult<bool> {
        let client = self.client().await?;
        let sql = sql::EXPUNGE_MESSAGE;
        Ok(client.execute(sql, &[&id.as_str(), &app.as_str()]).await.map_err(db_err)? > 0)
    }

    async fn list_attempts(&self, filter: &AttemptFilter, page: &PageQuery) -> StoreResult<Vec<Attempt>> {
        let client = self.client().await?;
        let mut q = Query::default();
        let p = q.bind(filter.app.to_string());
        q.and(format!("a.app_id = {p}"));
        if let Some(msg) = &filter.msg {
            let p = q.bind(msg.to_string());
            q.and(format!("a.msg_id = {p}"));
        }
        if let Some(endpoint) = &filter.endpoint {
            let p = q.bind(endpoint.to_string());
            q.and(format!("a.endpoint_id = {p}"));
        }
        match filter.status {
            Some(DeliveryStatus::Success) => q.and("a.delivered"),
            Some(DeliveryStatus::Fail) => q.and("NOT a.delivered"),
            // Attempts are final records: none is ever pending or sending.
            Some(DeliveryStatus::Pending | DeliveryStatus::Sending) => q.and("false"),
            None => {}
        }
        if let Some(class) = filter.status_code_class {
            if class == 0 {
                q.and("a.status_code = 0");
            } else {
                let low = i32::from(class);
                let (lo, hi) = (q.bind(low), q.bind(low + 100));
                q.and(format!("a.status_code >= {lo} AND a.status_code < {hi}"));
            }
        }
        let join = if filter.messages.channel.is_some() || !filter.messages.event_types.is_empty() {
            " JOIN herald.message m ON m.id = a.msg_id"
        } else {
            ""
        };
        q.messages(&MessageFilter { before: None, after: None, ..filter.messages.clone() });
        if let Some(before) = filter.messages.before {
            let p = q.bind(before);
            q.and(format!("a.created_at < {p}"));
        }
        if let Some(after) = filter.messages.after {
            let p = q.bind(after);
            q.and(format!("a.created_at >= {p}"));
        }
        let tail = q.page("a.id", page);
        let sql = format!("{}{join}{}{tail}", sql::list_head(ATTEMPT_COLUMNS, "attempt a"), q.where_clause());
        let found = client.query(&sql, &q.params()).await.map_err(db_err)?;
        Ok(found.iter().map(|r| rows::attempt(r, filter.with_content)).collect())
    }

    async fn attempt(&self, app: &AppId, msg: &MessageId, id: &str) -> StoreResult<Option<Attempt>> {
        let client = self.client().await?;
        let sql = sql::ATTEMPT.as_str();
        let row = client.query_opt(sql, &[&id, &msg.as_str(), &app.as_str()]).await.map_err(db_err)?;
        Ok(row.map(|r| rows::attempt(&r, true)))
    }

    async fn expunge_attempt(&self, app: &AppId, msg: &MessageId, id: &str) -> StoreResult<bool> {
        let client = self.client().await?;
        let sql = sql::EXPUNGE_ATTEMPT;
        Ok(client.execute(sql, &[&id, &msg.as_str(), &app.as_str()]).await.map_err(db_err)? > 0)
    }

    async fn endpoint_messages(
        &self,
        endpoint: &EndpointId,
        filter: &MessageFilter,
        status: Option<DeliveryStatus>,
        page: &PageQuery,
    ) -> StoreResult<Vec<(Message, DeliveryView)>> {
        let client = self.client().await?;
        let mut q = Query::default();
        let p = q.bind(endpoint.to_string());
        q.and(format!("d.endpoint_id = {p}"));
        q.messages(filter);
        if let Some(status) = status {
            q.and(delivery_status_condition(status));
        }
        let tail = q.page("d.msg_id", page);
        let sql = format!(
            "SELECT {MESSAGE_COLUMNS}, d.endpoint_id, d.state, d.attempts, d.next_at
             FROM herald.deliveries d JOIN herald.message m ON m.id = d.msg_id{}{tail}",
            q.where_clause()
        );
        let found = client.query(&sql, &q.params()).await.map_err(db_err)?;
        Ok(found.iter().map(|r| (rows::message(r, true), rows::delivery_view(r, MESSAGE_COLUMN_COUNT))).collect())
    }

    async fn message_deliveries(&self, msg: &MessageId, page: &PageQuery) -> StoreResult<Vec<DeliveryView>> {
        let client = self.client().await?;
        let mut q = Query::default();
        let p = q.bind(msg.to_string());
        q.and(format!("d.msg_id = {p}"));
        let tail = q.page("d.endpoint_id", page);
        let sql = format!(
            "SELECT d.endpoint_id, d.state, d.attempts, d.next_at FROM herald.deliveries d{}{tail}",
            q.where_clause()
        );
        let found = client.query(&sql, &q.params()).await.map_err(db_err)?;
        Ok(found.iter().map(|r| rows::delivery_view(r, 0)).collect())
    }

    async fn endpoint_stats(
        &self,
        endpoint: &EndpointId,
        since: Option<Millis>,
        until: Option<Millis>,
    ) -> StoreResult<EndpointStats> {
        let client = self.client().await?;
        let sql = "SELECT state, attempts > 0, count(*) FROM herald.deliveries
                   WHERE endpoint_id = $1 AND created_at >= $2 AND created_at < $3 GROUP BY 1, 2";
        let (since, until) = (since.unwrap_or(i64::MIN), until.unwrap_or(i64::MAX));
        let mut stats = EndpointStats::default();
        for row in client.query(sql, &[&endpoint.as_str(), &since, &until]).await.map_err(db_err)? {
            let (state, tried, count): (i16, bool, i64) = (row.get(0), row.get(1), row.get(2));
            let state = DeliveryState::from_code(state.into());
            let count = count as u64;
            match DeliveryStatus::of(state, tried as u32) {
                DeliveryStatus::Success => stats.success += count,
                DeliveryStatus::Pending => stats.pending += count,
                DeliveryStatus::Sending => stats.sending += count,
                DeliveryStatus::Fail if state == DeliveryState::Canceled => stats.canceled += count,
                DeliveryStatus::Fail => stats.fail += count,
            }
        }
        Ok(stats)
    }
}
