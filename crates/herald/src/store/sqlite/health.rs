//! Circuit breakers, latency histograms and summary counts on SQLite.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::rows::to_json;
use crate::breaker::Breaker;
use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, EndpointId};
use crate::latency::Histogram;
use crate::store::sql::{self, sqlite};
use crate::store::{HealthStore, StoreError, StoreResult, SummaryCounts};

fn json_err(e: serde_json::Error) -> StoreError {
    StoreError::Other(anyhow::anyhow!("corrupt stored JSON: {e}"))
}

#[async_trait]
impl HealthStore for SqliteStore {
    async fn announce_retry_now(&self, _app: &AppId, _endpoint: &EndpointId) -> StoreResult<()> {
        Ok(()) // one process: the API has told its own dispatcher already
    }

    async fn save_breaker(&self, endpoint: &EndpointId, breaker: Option<&Breaker>) -> StoreResult<()> {
        let (endpoint, breaker) = (endpoint.clone(), breaker.map(to_json));
        self.writer
            .write(move |conn| {
                match breaker {
                    Some(json) => {
                        conn.execute(sqlite(sql::SAVE_BREAKER), params![endpoint.as_str(), json, now_ms()])?
                    }
                    None => conn.execute(sqlite(sql::FORGET_BREAKER), [endpoint.as_str()])?,
                };
                Ok(())
            })
            .await
    }

    async fn breakers(&self) -> StoreResult<Vec<(EndpointId, Breaker)>> {
        self.readers
            .read(|conn| {
                let mut stmt = conn.prepare_cached(sqlite(sql::BREAKERS))?;
                let rows: Vec<(String, String)> =
                    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect::<Result<_, _>>()?;
                rows.into_iter()
                    .map(|(id, json)| {
                        Ok((EndpointId::from_trusted(id), serde_json::from_str(&json).map_err(json_err)?))
                    })
                    .collect()
            })
            .await
    }

    async fn merge_latency(&self, deltas: Vec<(EndpointId, i64, Histogram)>) -> StoreResult<()> {
        self.writer
            .write(move |conn| {
                for (endpoint, hour, delta) in &deltas {
                    let stored: Option<String> = conn
                        .prepare_cached("SELECT histogram FROM latency WHERE endpoint_id = ? AND hour = ?")?
                        .query_row(params![endpoint.as_str(), hour], |r| r.get(0))
                        .optional()?;
                    let mut merged: Histogram = match stored {
                        Some(json) => serde_json::from_str(&json).map_err(json_err)?,
                        None => Histogram::default(),
                    };
                    merged.merge(delta);
                    conn.prepare_cached(
                        "INSERT OR REPLACE INTO latency (endpoint_id, hour, histogram) VALUES (?, ?, ?)",
                    )?
                    .execute(params![endpoint.as_str(), hour, to_json(&merged)])?;
                }
                Ok(())
            })
            .await
    }

    async fn latency_since(
        &self,
        since_hour: i64,
        endpoints: Option<&[EndpointId]>,
    ) -> StoreResult<Vec<(EndpointId, i64, Histogram)>> {
        let endpoints = endpoints.map(|ids| serde_json::to_string(ids).expect("ids serialize"));
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT endpoint_id, hour, histogram FROM latency
                     WHERE hour >= ?1 AND (?2 IS NULL OR endpoint_id IN (SELECT value FROM json_each(?2)))",
                )?;
                let rows: Vec<(String, i64, String)> = stmt
                    .query_map(params![since_hour, endpoints], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?;
                rows.into_iter()
                    .map(|(id, hour, json)| {
                        Ok((EndpointId::from_trusted(id), hour, serde_json::from_str(&json).map_err(json_err)?))
                    })
                    .collect()
            })
            .await
    }

    async fn summary(&self, now: Millis) -> StoreResult<SummaryCounts> {
        self.readers
            .read(move |conn| {
                // One statement, so every count comes from the same snapshot.
                let mut stmt = conn.prepare_cached(
                    // Held deliveries are pending and not tried yet.
                    "SELECT (SELECT count(*) FROM delivery WHERE state = 0 AND attempts = 0) + (SELECT count(*) FROM held),
                            (SELECT count(*) FROM delivery WHERE state = 0 AND attempts > 0),
                            (SELECT count(*) FROM delivery WHERE state = 2),
                            (SELECT min(at) FROM (SELECT min(created_at) AS at FROM delivery WHERE state = 0
                                                  UNION ALL SELECT created_at FROM message
                                                  WHERE seq = (SELECT min(id) FROM held) / 65536)),
                            coalesce(sum(delivered), 0), coalesce(sum(failed), 0), coalesce(sum(delivery_ms), 0)
                     FROM stats_minute WHERE minute > ?",
                )?;
                let counts = stmt.query_row([(now - 3_600_000).div_euclid(60_000)], |r| {
                    Ok(SummaryCounts {
                        pending: r.get(0)?,
                        awaiting_retry: r.get(1)?,
                        dead: r.get(2)?,
                        oldest_pending_at: r.get(3)?,
                        delivered_last_hour: r.get(4)?,
                        failed_last_hour: r.get(5)?,
                        delivery_ms_last_hour: r.get(6)?,
                    })
                })?;
                Ok(counts)
            })
            .await
    }

    async fn prune_health(&self, before: Millis) -> StoreResult<u64> {
        self.writer
            .write(move |conn| {
                let hour = before.div_euclid(3_600_000);
                let hours = conn.execute(sqlite(sql::PRUNE_LATENCY), [hour])?
                    + conn.execute(sqlite(sql::PRUNE_ENDPOINT_HOURS), [hour])?
                    + conn.execute(sqlite(sql::PRUNE_BREAKER_EVENTS), [before])?;
                let minutes = conn.execute(sqlite(sql::PRUNE_MINUTES), [before.div_euclid(60_000)])?;
                Ok((hours + minutes) as u64)
            })
            .await
    }
}
