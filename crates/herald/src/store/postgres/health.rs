//! Circuit breakers, latency histograms and summary counts on PostgreSQL.

use async_trait::async_trait;
use tokio_postgres::types::Json;

use super::{PgStore, db_err};
use crate::breaker::Breaker;
use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, EndpointId};
use crate::latency::Histogram;
use crate::store::sql;
use crate::store::{HealthStore, StoreResult, SummaryCounts};

#[async_trait]
impl HealthStore for PgStore {
    async fn save_breaker(&self, endpoint: &EndpointId, breaker: Option<&Breaker>) -> StoreResult<()> {
        let client = self.client().await?;
        match breaker {
            Some(breaker) => client.execute(sql::SAVE_BREAKER, &[&endpoint.as_str(), &Json(breaker), &now_ms()]).await,
            None => client.execute(sql::FORGET_BREAKER, &[&endpoint.as_str()]).await,
        }
        .map_err(db_err)?;
        Ok(())
    }

    async fn announce_retry_now(&self, app: &AppId, endpoint: &EndpointId) -> StoreResult<()> {
        let client = self.client().await?;
        let change = format!("retry:{app}:{endpoint}");
        client.execute("SELECT pg_notify('herald_catalog', $1)", &[&change]).await.map_err(db_err)?;
        Ok(())
    }

    async fn breakers(&self) -> StoreResult<Vec<(EndpointId, Breaker)>> {
        let client = self.client().await?;
        let rows = client.query(sql::BREAKERS, &[]).await.map_err(db_err)?;
        Ok(rows.iter().map(|r| (EndpointId::from_trusted(r.get(0)), r.get::<_, Json<Breaker>>(1).0)).collect())
    }

    async fn merge_latency(&self, deltas: Vec<(EndpointId, i64, Histogram)>) -> StoreResult<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        for (endpoint, hour, delta) in &deltas {
            // Rows are merged in Herald, not in SQL: lock the row (or its absence) first.
            let stored = tx
                .query_opt(
                    "SELECT histogram FROM herald.latency WHERE endpoint_id = $1 AND hour = $2 FOR UPDATE",
                    &[&endpoint.as_str(), hour],
                )
                .await
                .map_err(db_err)?;
            let mut merged = stored.map(|r| r.get::<_, Json<Histogram>>(0).0).unwrap_or_default();
            merged.merge(delta);
            tx.execute(
                "INSERT INTO herald.latency (endpoint_id, hour, histogram) VALUES ($1, $2, $3)
                 ON CONFLICT (endpoint_id, hour) DO UPDATE SET histogram = excluded.histogram",
                &[&endpoint.as_str(), hour, &Json(&merged)],
            )
            .await
            .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)
    }

    async fn latency_since(
        &self,
        since_hour: i64,
        endpoints: Option<&[EndpointId]>,
    ) -> StoreResult<Vec<(EndpointId, i64, Histogram)>> {
        let client = self.client().await?;
        let endpoints: Option<Vec<&str>> = endpoints.map(|ids| ids.iter().map(EndpointId::as_str).collect());
        let rows = client
            .query(
                "SELECT endpoint_id, hour, histogram FROM herald.latency
                 WHERE hour >= $1 AND ($2::text[] IS NULL OR endpoint_id = ANY ($2))",
                &[&since_hour, &endpoints],
            )
            .await
            .map_err(db_err)?;
        Ok(rows
            .iter()
            .map(|r| (EndpointId::from_trusted(r.get(0)), r.get(1), r.get::<_, Json<Histogram>>(2).0))
            .collect())
    }

    async fn summary(&self, now: Millis) -> StoreResult<SummaryCounts> {
        let client = self.client().await?;
        // One statement, so every count comes from the same snapshot.
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM herald.deliveries WHERE state = 0 AND attempts = 0),
                        (SELECT count(*) FROM herald.delivery WHERE state = 0 AND attempts > 0),
                        (SELECT count(*) FROM herald.delivery WHERE state = 2),
                        (SELECT min(created_at) FROM herald.deliveries WHERE state = 0),
                        coalesce(sum(delivered), 0)::int8, coalesce(sum(failed), 0)::int8,
                        coalesce(sum(delivery_ms), 0)::int8
                 FROM herald.stats_minute WHERE minute > $1",
                &[&(now - 3_600_000).div_euclid(60_000)],
            )
            .await
            .map_err(db_err)?;
        let count = |i: usize| row.get::<_, i64>(i) as u64;
        Ok(SummaryCounts {
            pending: count(0),
            awaiting_retry: count(1),
            dead: count(2),
            oldest_pending_at: row.get(3),
            delivered_last_hour: count(4),
            failed_last_hour: count(5),
            delivery_ms_last_hour: count(6),
        })
    }

    async fn prune_health(&self, before: Millis) -> StoreResult<u64> {
        let client = self.client().await?;
        let hour = before.div_euclid(3_600_000);
        let hours = client.execute(sql::PRUNE_LATENCY, &[&hour]).await.map_err(db_err)?
            + client.execute(sql::PRUNE_ENDPOINT_HOURS, &[&hour]).await.map_err(db_err)?
            + client.execute(sql::PRUNE_BREAKER_EVENTS, &[&before]).await.map_err(db_err)?;
        let minutes = client.execute(sql::PRUNE_MINUTES, &[&before.div_euclid(60_000)]).await.map_err(db_err)?;
        Ok(hours + minutes)
    }
}
