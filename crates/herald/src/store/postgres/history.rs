//! The charts' history and the breakers' log on PostgreSQL.

use async_trait::async_trait;

use super::{PgStore, db_err};
use crate::clock::Millis;
use crate::ids::EndpointId;
use crate::store::{
    BreakerEvent, BreakerEventKind, HistoryStore, HourCounts, MinuteTotals, StoreError, StoreResult, sql,
};

#[async_trait]
impl HistoryStore for PgStore {
    async fn add_accepted(&self, counts: Vec<(i64, u64)>) -> StoreResult<()> {
        let (minutes, counts): (Vec<i64>, Vec<i64>) = counts.into_iter().map(|(m, c)| (m, c as i64)).unzip();
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO herald.stats_minute (minute, delivered, failed, delivery_ms, accepted)
                 SELECT m, 0, 0, 0, c FROM UNNEST($1::int8[], $2::int8[]) AS u(m, c) ORDER BY m
                 ON CONFLICT (minute) DO UPDATE SET accepted = herald.stats_minute.accepted + excluded.accepted",
                &[&minutes, &counts],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn sample_queue(&self, minute: i64, pending: u64, retrying: u64) -> StoreResult<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO herald.stats_minute (minute, delivered, failed, delivery_ms, pending, retrying)
                 VALUES ($1, 0, 0, 0, $2, $3)
                 ON CONFLICT (minute) DO UPDATE SET
                     pending = greatest(herald.stats_minute.pending, excluded.pending),
                     retrying = greatest(herald.stats_minute.retrying, excluded.retrying)",
                &[&minute, &(pending as i64), &(retrying as i64)],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn minute_totals(&self, since_minute: i64) -> StoreResult<Vec<MinuteTotals>> {
        let client = self.client().await?;
        let rows = client.query(sql::MINUTE_TOTALS, &[&since_minute]).await.map_err(db_err)?;
        let count = |r: &tokio_postgres::Row, i: usize| r.get::<_, i64>(i) as u64;
        let sampled = |r: &tokio_postgres::Row, i: usize| r.get::<_, Option<i64>>(i).map(|v| v as u64);
        Ok(rows
            .iter()
            .map(|r| MinuteTotals {
                minute: r.get(0),
                accepted: count(r, 1),
                delivered: count(r, 2),
                failed: count(r, 3),
                dead: count(r, 4),
                queue: sampled(r, 5).zip(sampled(r, 6)),
            })
            .collect())
    }

    async fn endpoint_hours(
        &self,
        since_hour: i64,
        endpoints: &[EndpointId],
    ) -> StoreResult<Vec<(EndpointId, i64, HourCounts)>> {
        let ids: Vec<&str> = endpoints.iter().map(|e| e.as_str()).collect();
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT endpoint_id, hour, succeeded, failed FROM herald.endpoint_hour
                 WHERE endpoint_id = ANY($1) AND hour >= $2 ORDER BY endpoint_id, hour",
                &[&ids, &since_hour],
            )
            .await
            .map_err(db_err)?;
        Ok(rows
            .iter()
            .map(|r| {
                let counts = HourCounts { succeeded: r.get(2), failed: r.get(3) };
                (EndpointId::from_trusted(r.get(0)), r.get(1), counts)
            })
            .collect())
    }

    async fn log_breaker(&self, endpoint: &EndpointId, event: &BreakerEvent) -> StoreResult<()> {
        let client = self.client().await?;
        client
            .execute(
                sql::LOG_BREAKER,
                &[
                    &endpoint.as_str(),
                    &event.at,
                    &event.kind.name(),
                    &(event.failures.min(i32::MAX as u32) as i32),
                    &(event.cooldown_ms.min(i64::MAX as u64) as i64),
                ],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn breaker_events(
        &self,
        endpoint: &EndpointId,
        since: Millis,
        limit: usize,
    ) -> StoreResult<Vec<BreakerEvent>> {
        let client = self.client().await?;
        let rows =
            client.query(sql::BREAKER_EVENTS, &[&endpoint.as_str(), &since, &(limit as i64)]).await.map_err(db_err)?;
        rows.iter()
            .map(|r| {
                let kind: String = r.get(1);
                let kind = BreakerEventKind::from_name(&kind)
                    .ok_or_else(|| StoreError::Other(anyhow::anyhow!("unknown breaker event {kind:?}")))?;
                Ok(BreakerEvent {
                    at: r.get(0),
                    kind,
                    failures: r.get::<_, i32>(2) as u32,
                    cooldown_ms: r.get::<_, i64>(3) as u64,
                })
            })
            .collect()
    }
}
