//! Applications, endpoints and event types on PostgreSQL. Every change is announced on
//! `herald_catalog` in the same transaction, so other processes drop their cached copies.

use async_trait::async_trait;
use tokio_postgres::types::{Json, ToSql};

use super::held::Move;
use super::rows::{self, APP_COLUMNS, ENDPOINT_COLUMNS, EVENT_TYPE_COLUMNS, KEPT_ENDPOINT_COLUMNS, Query};
use super::{PgStore, db_err, pg_err};
use crate::clock::Millis;
use crate::ids::{AppId, EndpointId};
use crate::store::sql;
use crate::store::{App, CatalogStore, DeliveryState, Endpoint, EventType, PageQuery, StoreResult, contains_pattern};

const APP_CONFLICT: &str = "an application with this uid already exists";
const ENDPOINT_CONFLICT: &str = "an endpoint with this uid already exists";
/// A new row may also take an id that exists (an import keeping another server's ids).
const NEW_APP_CONFLICT: &str = "an application with this id or uid already exists";
const NEW_ENDPOINT_CONFLICT: &str = "an endpoint with this id or uid already exists";

/// The `herald_catalog` payload naming what changed (see `listen`).
fn app_change(app: &AppId) -> String {
    format!("app:{app}")
}

fn endpoint_change(app: &AppId, endpoint: &EndpointId) -> String {
    format!("endpoint:{app}:{endpoint}")
}

const NOTIFY: &str = "SELECT pg_notify('herald_catalog', $1)";

impl PgStore {
    /// Runs one statement and the catalog announcement in one transaction.
    async fn change(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        announce: String,
        conflict: &'static str,
    ) -> StoreResult<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        let changed = tx.execute(sql, params).await.map_err(pg_err(conflict))?;
        tx.execute(NOTIFY, &[&announce]).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(changed)
    }
}

/// Whether `app` has fewer than `cap` rows in `table` (endpoints, pollers), counted under a
/// lock on the application for the rest of `tx`, so that two inserts cannot both pass.
pub(super) async fn under_cap(
    tx: &tokio_postgres::Transaction<'_>,
    app: &AppId,
    table: &'static str,
    cap: usize,
) -> StoreResult<bool> {
    let lock = format!("{table}:{app}");
    tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", &[&lock]).await.map_err(db_err)?;
    let sql = format!("SELECT count(*) FROM herald.{table} WHERE app_id = $1");
    let count: i64 = tx.query_one(&sql, &[&app.as_str()]).await.map_err(db_err)?.get(0);
    Ok(count < cap as i64)
}

fn endpoint_params(e: &Endpoint) -> Vec<Box<dyn ToSql + Sync + Send>> {
    vec![
        Box::new(e.id.to_string()),
        Box::new(e.app_id.to_string()),
        Box::new(e.uid.clone()),
        Box::new(e.url.clone()),
        Box::new(e.description.clone()),
        Box::new(e.disabled),
        Box::new(e.event_types.clone()),
        Box::new(e.channels.clone()),
        Box::new(Json(e.metadata.clone())),
        Box::new(e.throttle_rate.map(i32::from)),
        Box::new(e.headers.0.clone()),
        Box::new(e.secrets.0.clone()),
        Box::new(Json(e.delivery.clone())),
        Box::new(e.request.clone().map(Json)),
        Box::new(e.created_at),
        Box::new(e.updated_at),
        Box::new((!e.scripts.is_empty()).then(|| Json(e.scripts.clone()))),
        Box::new(e.auth.0.clone()),
        Box::new(e.version),
        Box::new(e.destination.0.clone()),
    ]
}

/// An application's egress proxy columns (URL, sealed credentials), as stored.
fn proxy_columns(app: &App) -> (Option<&str>, Option<&str>) {
    (app.proxy.as_ref().map(|p| p.url.as_str()), app.proxy.as_ref().map(|p| p.credentials.0.as_str()))
}

/// The optional numeric settings of an application, as stored.
fn app_limits(app: &App) -> (Option<i32>, Option<i32>, Option<i32>) {
    (app.throttle_rate.map(i32::from), app.max_concurrency.map(|v| v as i32), app.weight.map(|v| v as i32))
}

fn refs(params: &[Box<dyn ToSql + Sync + Send>]) -> Vec<&(dyn ToSql + Sync)> {
    params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect()
}

#[async_trait]
impl CatalogStore for PgStore {
    async fn insert_app(&self, app: &App) -> StoreResult<()> {
        let sql = sql::INSERT_APP.as_str();
        let (rate, cap, weight) = app_limits(app);
        let brand = app.portal_brand.as_ref().map(Json);
        let (proxy_url, proxy_credentials) = proxy_columns(app);
        let params: [&(dyn ToSql + Sync); 12] = [
            &app.id.as_str(),
            &app.uid,
            &app.name,
            &Json(&app.metadata),
            &rate,
            &cap,
            &weight,
            &app.created_at,
            &app.updated_at,
            &brand,
            &proxy_url,
            &proxy_credentials,
        ];
        self.change(sql, &params, app_change(&app.id), NEW_APP_CONFLICT).await.map(drop)
    }

    async fn app(&self, id_or_uid: &str) -> StoreResult<Option<App>> {
        let client = self.client().await?;
        let sql =
            format!("SELECT {APP_COLUMNS} FROM herald.app WHERE id = $1 OR uid = $1 ORDER BY id = $1 DESC LIMIT 1");
        let row = client.query_opt(&sql, &[&id_or_uid]).await.map_err(db_err)?;
        Ok(row.as_ref().map(rows::app))
    }

    async fn list_apps(&self, page: &PageQuery) -> StoreResult<Vec<App>> {
        let client = self.client().await?;
        let mut q = Query::default();
        let tail = q.page("id", page);
        let sql = format!("{}{}{tail}", sql::list_head(APP_COLUMNS, "app"), q.where_clause());
        let found = client.query(&sql, &q.params()).await.map_err(db_err)?;
        Ok(found.iter().map(rows::app).collect())
    }

    async fn update_app(&self, app: &App, read_at: Millis) -> StoreResult<bool> {
        let (rate, cap, weight) = app_limits(app);
        let brand = app.portal_brand.as_ref().map(Json);
        let (proxy_url, proxy_credentials) = proxy_columns(app);
        let params: [&(dyn ToSql + Sync); 12] = [
            &app.uid,
            &app.name,
            &Json(&app.metadata),
            &rate,
            &cap,
            &weight,
            &app.updated_at,
            &app.id.as_str(),
            &brand,
            &proxy_url,
            &proxy_credentials,
            &read_at,
        ];
        let sql = "UPDATE herald.app SET uid = $1, name = $2, metadata = $3, throttle_rate = $4, max_concurrency = $5,
                       weight = $6, updated_at = $7, portal_brand = $9, proxy_url = $10, proxy_credentials = $11
                   WHERE id = $8 AND updated_at = $12";
        self.change(sql, &params, app_change(&app.id), APP_CONFLICT).await.map(|changed| changed == 1)
    }

    async fn delete_app(&self, id: &AppId) -> StoreResult<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        tx.execute(sql::DELETE_APP_CONSUMERS, &[&id.as_str()]).await.map_err(db_err)?;
        for table in ["attempt", "delivery", "message", "endpoint", "deleted_endpoint", "portal_token", "poller"] {
            tx.execute(&sql::delete_app_rows(table), &[&id.as_str()]).await.map_err(db_err)?;
        }
        tx.execute(sql::DELETE_APP, &[&id.as_str()]).await.map_err(db_err)?;
        tx.execute(NOTIFY, &[&app_change(id)]).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)
    }

    async fn insert_endpoint(&self, endpoint: &Endpoint, cap: usize) -> StoreResult<bool> {
        let params = endpoint_params(endpoint);
        let marks = (1..=params.len()).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ");
        let sql = format!("INSERT INTO herald.endpoint ({ENDPOINT_COLUMNS}) VALUES ({marks})");
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        if !under_cap(&tx, &endpoint.app_id, "endpoint", cap).await? {
            return Ok(false);
        }
        tx.execute(&sql, &refs(&params)).await.map_err(pg_err(NEW_ENDPOINT_CONFLICT))?;
        tx.execute(NOTIFY, &[&endpoint_change(&endpoint.app_id, &endpoint.id)]).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(true)
    }

    async fn endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT {ENDPOINT_COLUMNS} FROM herald.endpoint WHERE app_id = $1 AND (id = $2 OR uid = $2)
             ORDER BY id = $2 DESC LIMIT 1"
        );
        let row = client.query_opt(&sql, &[&app.as_str(), &id_or_uid]).await.map_err(db_err)?;
        Ok(row.as_ref().map(rows::endpoint))
    }

    async fn endpoint_by_id(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        let client = self.client().await?;
        let row = client.query_opt(sql::ENDPOINT_BY_ID.as_str(), &[&id.as_str()]).await.map_err(db_err)?;
        Ok(row.as_ref().map(rows::endpoint))
    }

    async fn deleted_endpoint(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        let client = self.client().await?;
        let row = client.query_opt(sql::DELETED_ENDPOINT.as_str(), &[&id.as_str()]).await.map_err(db_err)?;
        Ok(row.as_ref().map(rows::endpoint))
    }

    async fn list_endpoints(&self, app: &AppId, page: &PageQuery) -> StoreResult<Vec<Endpoint>> {
        let client = self.client().await?;
        let (sql, q) = rows::app_page(ENDPOINT_COLUMNS, "endpoint", app, page);
        let found = client.query(&sql, &q.params()).await.map_err(db_err)?;
        Ok(found.iter().map(rows::endpoint).collect())
    }

    async fn search_catalog(&self, text: &str, limit: usize) -> StoreResult<(Vec<App>, Vec<Endpoint>)> {
        let client = self.client().await?;
        let (pattern, limit) = (contains_pattern(text), limit as i64);
        let apps_sql = format!(
            "SELECT {APP_COLUMNS} FROM herald.app WHERE id = $1 OR uid = $1 OR name ILIKE $2 ORDER BY id LIMIT $3"
        );
        let apps = client.query(&apps_sql, &[&text, &pattern, &limit]).await.map_err(db_err)?;
        let endpoints_sql = format!(
            "SELECT {ENDPOINT_COLUMNS} FROM herald.endpoint WHERE id = $1 OR url ILIKE $2 ORDER BY id LIMIT $3"
        );
        let endpoints = client.query(&endpoints_sql, &[&text, &pattern, &limit]).await.map_err(db_err)?;
        Ok((apps.iter().map(rows::app).collect(), endpoints.iter().map(rows::endpoint).collect()))
    }

    async fn app_endpoints(&self, app: &AppId) -> StoreResult<Vec<Endpoint>> {
        let client = self.client().await?;
        let found = client.query(sql::APP_ENDPOINTS.as_str(), &[&app.as_str()]).await.map_err(db_err)?;
        Ok(found.iter().map(rows::endpoint).collect())
    }

    async fn update_endpoint(&self, endpoint: &Endpoint, read_at: Millis) -> StoreResult<bool> {
        let sql = "UPDATE herald.endpoint SET uid = $2, url = $3, description = $4, disabled = $5, event_types = $6,
                       channels = $7, metadata = $8, throttle_rate = $9, headers = $10, secrets = $11, delivery = $12,
                       request = $13, updated_at = $14, scripts = $15, auth = $16, version = $17,
                       destination = $18
                   WHERE id = $1 AND updated_at = $19";
        let mut params = endpoint_params(endpoint);
        params.remove(14); // created_at never changes
        params.remove(1); // nor does app_id
        params.push(Box::new(read_at));
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        if tx.execute(sql, &refs(&params)).await.map_err(pg_err(ENDPOINT_CONFLICT))? == 0 {
            return Ok(false); // rolled back when dropped
        }
        // Pending deliveries follow the endpoint's (possibly new) ordering.
        let strict = endpoint.delivery.ordering == Some(crate::endpoint_settings::Ordering::Strict);
        tx.execute(
            "UPDATE herald.delivery SET strict = $2 WHERE endpoint_id = $1 AND state = 0 AND strict <> $2",
            &[&endpoint.id.as_str(), &strict],
        )
        .await
        .map_err(db_err)?;
        tx.execute(NOTIFY, &[&endpoint_change(&endpoint.app_id, &endpoint.id)]).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(true)
    }

    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        let held = Move {
            using: "",
            filter: "h.endpoint_id = $1",
            state: &(DeliveryState::Canceled.code()).to_string(),
            attempts: "0",
            next_at: "h.created_at",
            keep: "false",
        };
        tx.execute(&held.statement(), &[&id.as_str()]).await.map_err(db_err)?;
        tx.execute(
            sql::CANCEL_PENDING,
            &[&(DeliveryState::Canceled.code() as i16), &id.as_str(), &(DeliveryState::Pending.code() as i16)],
        )
        .await
        .map_err(db_err)?;
        let keep = format!(
            "INSERT INTO herald.deleted_endpoint ({ENDPOINT_COLUMNS}) SELECT {KEPT_ENDPOINT_COLUMNS}
             FROM herald.endpoint WHERE app_id = $1 AND id = $2 ON CONFLICT (id) DO NOTHING"
        );
        tx.execute(&keep, &[&app.as_str(), &id.as_str()]).await.map_err(db_err)?;
        tx.execute(sql::DELETE_ENDPOINT, &[&app.as_str(), &id.as_str()]).await.map_err(db_err)?;
        tx.execute(NOTIFY, &[&endpoint_change(app, id)]).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)
    }

    async fn upsert_event_type(&self, et: &EventType) -> StoreResult<bool> {
        let client = self.client().await?;
        let sql = format!(
            "INSERT INTO herald.event_type ({EVENT_TYPE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (name) DO UPDATE SET description = excluded.description, archived = excluded.archived,
                deprecated = excluded.deprecated, schemas = excluded.schemas, feature_flag = excluded.feature_flag,
                updated_at = excluded.updated_at
             RETURNING (xmax = 0)"
        );
        let schemas = et.schemas.as_ref().map(Json);
        let params = event_type_params(et, &schemas);
        let row = client.query_one(&sql, &params).await.map_err(db_err)?;
        Ok(row.get(0))
    }

    async fn update_event_type(&self, et: &EventType, read_at: Millis) -> StoreResult<bool> {
        let client = self.client().await?;
        let sql = sql::UPDATE_EVENT_TYPE;
        let schemas = et.schemas.as_ref().map(Json);
        let [name, description, archived, deprecated, schemas, flag, _, updated_at] = event_type_params(et, &schemas);
        let params = [name, description, archived, deprecated, schemas, flag, updated_at, &read_at];
        Ok(client.execute(sql, &params).await.map_err(db_err)? == 1)
    }

    async fn insert_event_type(&self, et: &EventType) -> StoreResult<()> {
        let client = self.client().await?;
        let sql = sql::INSERT_EVENT_TYPE.as_str();
        let schemas = et.schemas.as_ref().map(Json);
        client
            .execute(sql, &event_type_params(et, &schemas))
            .await
            .map_err(pg_err("an event type with this name already exists"))?;
        Ok(())
    }

    async fn event_type(&self, name: &str) -> StoreResult<Option<EventType>> {
        let client = self.client().await?;
        let row = client.query_opt(sql::EVENT_TYPE.as_str(), &[&name]).await.map_err(db_err)?;
        Ok(row.as_ref().map(rows::event_type))
    }

    async fn list_event_types(&self, page: &PageQuery, include_archived: bool) -> StoreResult<Vec<EventType>> {
        let client = self.client().await?;
        let mut q = Query::default();
        if !include_archived {
            q.and("NOT archived");
        }
        let tail = q.page("name", page);
        let sql = format!("{}{}{tail}", sql::list_head(EVENT_TYPE_COLUMNS, "event_type"), q.where_clause());
        let found = client.query(&sql, &q.params()).await.map_err(db_err)?;
        Ok(found.iter().map(rows::event_type).collect())
    }

    async fn delete_event_type(&self, name: &str, expunge: bool) -> StoreResult<bool> {
        let client = self.client().await?;
        let changed = if expunge {
            client.execute(sql::DELETE_EVENT_TYPE, &[&name]).await
        } else {
            let now = crate::clock::now_ms();
            client
                .execute(
                    "UPDATE herald.event_type SET archived = true, updated_at = $2 WHERE name = $1",
                    &[&name, &now],
                )
                .await
        }
        .map_err(db_err)?;
        Ok(changed > 0)
    }
}

/// An event type's columns, in `EVENT_TYPE_COLUMNS` order (`schemas` as JSON).
fn event_type_params<'a>(
    et: &'a EventType,
    schemas: &'a Option<Json<&'a serde_json::Value>>,
) -> [&'a (dyn ToSql + Sync); 8] {
    [&et.name, &et.description, &et.archived, &et.deprecated, schemas, &et.feature_flag, &et.created_at, &et.updated_at]
}
