//! The charts' history and the breakers' log on SQLite.

use async_trait::async_trait;
use rusqlite::params;

use super::SqliteStore;
use crate::clock::Millis;
use crate::ids::EndpointId;
use crate::store::sql::{self, sqlite};
use crate::store::{BreakerEvent, BreakerEventKind, HistoryStore, HourCounts, MinuteTotals, StoreError, StoreResult};

#[async_trait]
impl HistoryStore for SqliteStore {
    async fn add_accepted(&self, counts: Vec<(i64, u64)>) -> StoreResult<()> {
        self.writer
            .write(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "INSERT INTO stats_minute (minute, delivered, failed, delivery_ms, accepted) VALUES (?, 0, 0, 0, ?)
                     ON CONFLICT (minute) DO UPDATE SET accepted = accepted + excluded.accepted",
                )?;
                for (minute, count) in counts {
                    stmt.execute(params![minute, count as i64])?;
                }
                Ok(())
            })
            .await
    }

    async fn sample_queue(&self, minute: i64, pending: u64, retrying: u64) -> StoreResult<()> {
        self.writer
            .write(move |conn| {
                conn.prepare_cached(
                    "INSERT INTO stats_minute (minute, delivered, failed, delivery_ms, pending, retrying)
                     VALUES (?, 0, 0, 0, ?, ?)
                     ON CONFLICT (minute) DO UPDATE SET pending = max(coalesce(pending, 0), excluded.pending),
                         retrying = max(coalesce(retrying, 0), excluded.retrying)",
                )?
                .execute(params![minute, pending as i64, retrying as i64])?;
                Ok(())
            })
            .await
    }

    async fn minute_totals(&self, since_minute: i64) -> StoreResult<Vec<MinuteTotals>> {
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(sqlite(sql::MINUTE_TOTALS))?;
                let rows = stmt.query_map([since_minute], |r| {
                    let queue: (Option<u64>, Option<u64>) = (r.get(5)?, r.get(6)?);
                    Ok(MinuteTotals {
                        minute: r.get(0)?,
                        accepted: r.get(1)?,
                        delivered: r.get(2)?,
                        failed: r.get(3)?,
                        dead: r.get(4)?,
                        queue: queue.0.zip(queue.1),
                    })
                })?;
                Ok(rows.collect::<Result<_, _>>()?)
            })
            .await
    }

    async fn endpoint_hours(
        &self,
        since_hour: i64,
        endpoints: &[EndpointId],
    ) -> StoreResult<Vec<(EndpointId, i64, HourCounts)>> {
        let endpoints = endpoints.to_vec();
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT hour, succeeded, failed FROM endpoint_hour WHERE endpoint_id = ? AND hour >= ? ORDER BY hour",
                )?;
                let mut all = Vec::new();
                for endpoint in endpoints {
                    let rows = stmt.query_map(params![endpoint.as_str(), since_hour], |r| {
                        Ok((r.get(0)?, HourCounts { succeeded: r.get(1)?, failed: r.get(2)? }))
                    })?;
                    for row in rows {
                        let (hour, counts) = row?;
                        all.push((endpoint.clone(), hour, counts));
                    }
                }
                Ok(all)
            })
            .await
    }

    async fn log_breaker(&self, endpoint: &EndpointId, event: &BreakerEvent) -> StoreResult<()> {
        let (endpoint, event) = (endpoint.clone(), event.clone());
        self.writer
            .write(move |conn| {
                conn.prepare_cached(sqlite(sql::LOG_BREAKER))?.execute(params![
                    endpoint.as_str(),
                    event.at,
                    event.kind.name(),
                    event.failures,
                    event.cooldown_ms
                ])?;
                Ok(())
            })
            .await
    }

    async fn breaker_events(
        &self,
        endpoint: &EndpointId,
        since: Millis,
        limit: usize,
    ) -> StoreResult<Vec<BreakerEvent>> {
        let endpoint = endpoint.clone();
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(sqlite(sql::BREAKER_EVENTS))?;
                let rows = stmt.query_map(params![endpoint.as_str(), since, limit as i64], |r| {
                    Ok((r.get::<_, Millis>(0)?, r.get::<_, String>(1)?, r.get::<_, u32>(2)?, r.get::<_, u64>(3)?))
                })?;
                let mut events = Vec::new();
                for row in rows {
                    let (at, kind, failures, cooldown_ms) = row?;
                    let kind = BreakerEventKind::from_name(&kind)
                        .ok_or_else(|| StoreError::Other(anyhow::anyhow!("unknown breaker event {kind:?}")))?;
                    events.push(BreakerEvent { at, kind, failures, cooldown_ms });
                }
                Ok(events)
            })
            .await
    }
}
