//! Applications, endpoints and event types on SQLite.

use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{OptionalExtension, params, params_from_iter};

use super::rows::{
    self, APP_COLUMNS, ENDPOINT_COLUMNS, EVENT_TYPE_COLUMNS, KEPT_ENDPOINT_COLUMNS, Query, opt_json_value, to_json,
};
use super::{SqliteStore, is_unique_violation};
use crate::clock::Millis;
use crate::ids::{AppId, EndpointId};
use crate::store::sql::{self, sqlite};
use crate::store::{
    App, CatalogStore, DeliveryState, Endpoint, EventType, PageQuery, StoreError, StoreResult, contains_pattern,
};

fn conflict(what: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| {
        if is_unique_violation(&e) { StoreError::Conflict(what) } else { e.into() }
    }
}

#[async_trait]
impl CatalogStore for SqliteStore {
    async fn insert_app(&self, app: &App) -> StoreResult<()> {
        let app = app.clone();
        self.writer
            .write(move |conn| {
                conn.prepare_cached(sqlite(sql::INSERT_APP.as_str()))?
                    .execute(params![
                        app.id.as_str(),
                        app.uid,
                        app.name,
                        to_json(&app.metadata),
                        app.throttle_rate,
                        app.max_concurrency,
                        app.weight,
                        app.created_at,
                        app.updated_at,
                        opt_json_value(&app.portal_brand),
                        app.proxy.as_ref().map(|p| p.url.as_str()),
                        app.proxy.as_ref().map(|p| p.credentials.0.as_str()),
                    ])
                    .map_err(conflict("an application with this id or uid already exists"))?;
                Ok(())
            })
            .await
    }

    async fn app(&self, id_or_uid: &str) -> StoreResult<Option<App>> {
        let key = id_or_uid.to_owned();
        self.readers
            .read(move |conn| {
                let by_id = conn
                    .prepare_cached(&format!("SELECT {APP_COLUMNS} FROM app WHERE id = ?"))?
                    .query_row([&key], rows::app)
                    .optional()?;
                match by_id {
                    Some(app) => Ok(Some(app)),
                    None => Ok(conn
                        .prepare_cached(&format!("SELECT {APP_COLUMNS} FROM app WHERE uid = ?"))?
                        .query_row([&key], rows::app)
                        .optional()?),
                }
            })
            .await
    }

    async fn list_apps(&self, page: &PageQuery) -> StoreResult<Vec<App>> {
        let page = page.clone();
        self.readers
            .read(move |conn| {
                let mut q = Query::default();
                let tail = q.page("id", &page);
                let sql = format!("{}{}{tail}", sql::to_sqlite(&sql::list_head(APP_COLUMNS, "app")), q.where_clause());
                let mut stmt = conn.prepare_cached(&sql)?;
                let apps = stmt.query_map(params_from_iter(q.params), rows::app)?.collect::<Result<_, _>>()?;
                Ok(apps)
            })
            .await
    }

    async fn update_app(&self, app: &App, read_at: Millis) -> StoreResult<bool> {
        let app = app.clone();
        self.writer
            .write(move |conn| {
                conn.prepare_cached(
                    "UPDATE app SET uid = ?, name = ?, metadata = ?, throttle_rate = ?, max_concurrency = ?, weight = ?,
                        portal_brand = ?, proxy_url = ?, proxy_credentials = ?, updated_at = ? WHERE id = ? AND updated_at = ?",
                )?
                .execute(params![
                    app.uid,
                    app.name,
                    to_json(&app.metadata),
                    app.throttle_rate,
                    app.max_concurrency,
                    app.weight,
                    opt_json_value(&app.portal_brand),
                    app.proxy.as_ref().map(|p| p.url.as_str()),
                    app.proxy.as_ref().map(|p| p.credentials.0.as_str()),
                    app.updated_at,
                    app.id.as_str(),
                    read_at
                ])
                .map_err(conflict("an application with this uid already exists"))
                .map(|changed| changed == 1)
            })
            .await
    }

    async fn delete_app(&self, id: &AppId) -> StoreResult<()> {
        let id = id.clone();
        self.writer
            .write(move |conn| {
                // The index tables and `held` first, while the rows they point at are there.
                conn.execute_batch(
                    "CREATE TEMP TABLE IF NOT EXISTS gone_endpoint (id TEXT PRIMARY KEY); DELETE FROM gone_endpoint;",
                )?;
                conn.execute(
                    "INSERT OR IGNORE INTO gone_endpoint SELECT id FROM endpoint WHERE app_id = ?1
                     UNION SELECT id FROM deleted_endpoint WHERE app_id = ?1",
                    [id.as_str()],
                )?;
                for sql in [
                    "DELETE FROM dest_by_endpoint WHERE endpoint_id IN (SELECT id FROM gone_endpoint)",
                    "DELETE FROM attempt_by_endpoint WHERE endpoint_id IN (SELECT id FROM gone_endpoint)",
                    "DELETE FROM attempt_by_msg WHERE msg_seq IN (SELECT seq FROM message_by_app WHERE app_id = ?1)
                        OR msg_seq IN (SELECT seq FROM message WHERE app_id = ?1)",
                    "DELETE FROM held WHERE id / 65536 IN (SELECT seq FROM message WHERE app_id = ?1)",
                    "DELETE FROM message_by_app WHERE app_id = ?1",
                    "DELETE FROM message_seq_by_app WHERE app_id = ?1",
                    sqlite(sql::DELETE_APP_CONSUMERS),
                    "DELETE FROM poller WHERE app_id = ?1",
                ] {
                    let uses_app = sql.contains("?1");
                    if uses_app {
                        conn.execute(sql, [id.as_str()])?;
                    } else {
                        conn.execute(sql, [])?;
                    }
                }
                conn.execute("DELETE FROM gone_endpoint", [])?;
                for table in ["attempt", "delivery", "message", "endpoint", "deleted_endpoint", "portal_token"] {
                    conn.execute(&sql::to_sqlite(&sql::delete_app_rows(table)), [id.as_str()])?;
                }
                conn.execute(sqlite(sql::DELETE_APP), [id.as_str()])?;
                Ok(())
            })
            .await
    }

    async fn insert_endpoint(&self, endpoint: &Endpoint, cap: usize) -> StoreResult<bool> {
        let mut values = rows::endpoint_values(endpoint);
        values.push(Value::Text(endpoint.app_id.to_string()));
        values.push(Value::Integer(cap as i64));
        self.writer
            .write(move |conn| {
                // One writer: the count and the insert cannot interleave with another insert.
                let marks = vec!["?"; values.len() - 2].join(", ");
                let sql = format!(
                    "INSERT INTO endpoint ({ENDPOINT_COLUMNS}) SELECT {marks}
                     WHERE (SELECT count(*) FROM endpoint WHERE app_id = ?) < ?"
                );
                let added = conn
                    .prepare_cached(&sql)?
                    .execute(params_from_iter(values))
                    .map_err(conflict("an endpoint with this id or uid already exists"))?;
                Ok(added == 1)
            })
            .await
    }

    async fn endpoint(&self, app: &AppId, id_or_uid: &str) -> StoreResult<Option<Endpoint>> {
        let (app, key) = (app.clone(), id_or_uid.to_owned());
        self.readers
            .read(move |conn| {
                let sql = format!("SELECT {ENDPOINT_COLUMNS} FROM endpoint WHERE app_id = ? AND (id = ? OR uid = ?)");
                let mut stmt = conn.prepare_cached(&sql)?;
                let mut found: Vec<Endpoint> =
                    stmt.query_map(params![app.as_str(), key, key], rows::endpoint)?.collect::<Result<_, _>>()?;
                // An id match wins over a uid that happens to look like another endpoint's id.
                found.sort_by_key(|e| e.id.as_str() != key);
                Ok(found.into_iter().next())
            })
            .await
    }

    async fn endpoint_by_id(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        self.endpoint_row(sql::ENDPOINT_BY_ID.as_str(), id).await
    }

    async fn deleted_endpoint(&self, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        self.endpoint_row(sql::DELETED_ENDPOINT.as_str(), id).await
    }

    async fn list_endpoints(&self, app: &AppId, page: &PageQuery) -> StoreResult<Vec<Endpoint>> {
        let (app, page) = (app.clone(), page.clone());
        self.readers
            .read(move |conn| {
                let (sql, params) = rows::app_page(ENDPOINT_COLUMNS, "endpoint", &app, &page);
                let mut stmt = conn.prepare_cached(&sql)?;
                let found = stmt.query_map(params_from_iter(params), rows::endpoint)?.collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn search_catalog(&self, text: &str, limit: usize) -> StoreResult<(Vec<App>, Vec<Endpoint>)> {
        let (text, pattern) = (text.to_owned(), contains_pattern(text));
        self.readers
            .read(move |conn| {
                let apps = conn
                    .prepare_cached(&format!(
                        "SELECT {APP_COLUMNS} FROM app WHERE id = ?1 OR uid = ?1 OR name LIKE ?2 ESCAPE '\\'
                         ORDER BY id LIMIT ?3"
                    ))?
                    .query_map(params![text, pattern, limit as i64], rows::app)?
                    .collect::<Result<_, _>>()?;
                let endpoints = conn
                    .prepare_cached(&format!(
                        "SELECT {ENDPOINT_COLUMNS} FROM endpoint WHERE id = ?1 OR url LIKE ?2 ESCAPE '\\'
                         ORDER BY id LIMIT ?3"
                    ))?
                    .query_map(params![text, pattern, limit as i64], rows::endpoint)?
                    .collect::<Result<_, _>>()?;
                Ok((apps, endpoints))
            })
            .await
    }

    async fn app_endpoints(&self, app: &AppId) -> StoreResult<Vec<Endpoint>> {
        let app = app.clone();
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(sqlite(sql::APP_ENDPOINTS.as_str()))?;
                let found = stmt.query_map([app.as_str()], rows::endpoint)?.collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn update_endpoint(&self, endpoint: &Endpoint, read_at: Millis) -> StoreResult<bool> {
        let values = rows::endpoint_values(endpoint);
        self.writer
            .write(move |conn| {
                // Same column order as ENDPOINT_COLUMNS; id and app_id are the key.
                let assignments = ENDPOINT_COLUMNS
                    .split(", ")
                    .map(str::trim)
                    .skip(2)
                    .map(|c| format!("{c} = ?"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let mut params: Vec<Value> = values[2..].to_vec();
                params.push(values[0].clone());
                params.push(Value::Integer(read_at));
                let sql = format!("UPDATE endpoint SET {assignments} WHERE id = ? AND updated_at = ?");
                let changed = conn
                    .prepare_cached(&sql)?
                    .execute(params_from_iter(params))
                    .map_err(conflict("an endpoint with this uid already exists"))?;
                if changed == 0 {
                    return Ok(false);
                }
                // Pending deliveries follow the endpoint's (possibly new) ordering.
                conn.prepare_cached(
                    "UPDATE delivery SET strict = (SELECT json_extract(delivery, '$.ordering') IS 'strict'
                                                   FROM endpoint WHERE id = ?1)
                     WHERE endpoint_id = ?1 AND state = 0",
                )?
                .execute([&values[0]])?;
                Ok(true)
            })
            .await
    }

    async fn delete_endpoint(&self, app: &AppId, id: &EndpointId) -> StoreResult<()> {
        let (app, id) = (app.clone(), id.clone());
        self.writer
            .write(move |conn| {
                conn.execute(
                    sqlite(sql::CANCEL_PENDING),
                    params![DeliveryState::Canceled.code(), id.as_str(), DeliveryState::Pending.code()],
                )?;
                let keep = format!(
                    "INSERT OR REPLACE INTO deleted_endpoint ({ENDPOINT_COLUMNS})
                     SELECT {KEPT_ENDPOINT_COLUMNS} FROM endpoint WHERE app_id = ? AND id = ?"
                );
                conn.execute(&keep, [app.as_str(), id.as_str()])?;
                conn.execute(sqlite(sql::DELETE_ENDPOINT), [app.as_str(), id.as_str()])?;
                Ok(())
            })
            .await
    }

    async fn upsert_event_type(&self, et: &EventType) -> StoreResult<bool> {
        let et = et.clone();
        self.writer
            .write(move |conn| {
                let existed: bool = conn
                    .prepare_cached("SELECT 1 FROM event_type WHERE name = ?")?
                    .query_row([&et.name], |_| Ok(()))
                    .optional()?
                    .is_some();
                conn.prepare_cached(&format!(
                    "INSERT INTO event_type ({EVENT_TYPE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                     ON CONFLICT (name) DO UPDATE SET description = excluded.description,
                        archived = excluded.archived, deprecated = excluded.deprecated,
                        schemas = excluded.schemas, feature_flag = excluded.feature_flag,
                        updated_at = excluded.updated_at"
                ))?
                .execute(params_from_iter(event_type_values(&et)))?;
                Ok(!existed)
            })
            .await
    }

    async fn insert_event_type(&self, et: &EventType) -> StoreResult<()> {
        let et = et.clone();
        self.writer
            .write(move |conn| {
                conn.prepare_cached(sqlite(sql::INSERT_EVENT_TYPE.as_str()))?
                    .execute(params_from_iter(event_type_values(&et)))
                    .map_err(conflict("an event type with this name already exists"))?;
                Ok(())
            })
            .await
    }

    async fn update_event_type(&self, et: &EventType, read_at: Millis) -> StoreResult<bool> {
        let et = et.clone();
        self.writer
            .write(move |conn| {
                // The creation time does not change.
                let mut values = event_type_values(&et);
                values.remove(6);
                values.push(Value::Integer(read_at));
                let changed = conn.prepare_cached(sqlite(sql::UPDATE_EVENT_TYPE))?.execute(params_from_iter(values))?;
                Ok(changed == 1)
            })
            .await
    }

    async fn event_type(&self, name: &str) -> StoreResult<Option<EventType>> {
        let name = name.to_owned();
        self.readers
            .read(move |conn| {
                Ok(conn
                    .prepare_cached(sqlite(sql::EVENT_TYPE.as_str()))?
                    .query_row([&name], rows::event_type)
                    .optional()?)
            })
            .await
    }

    async fn list_event_types(&self, page: &PageQuery, include_archived: bool) -> StoreResult<Vec<EventType>> {
        let page = page.clone();
        self.readers
            .read(move |conn| {
                let mut q = Query::default();
                if !include_archived {
                    q.and("archived = 0", []);
                }
                let tail = q.page("name", &page);
                let head = sql::to_sqlite(&sql::list_head(EVENT_TYPE_COLUMNS, "event_type"));
                let sql = format!("{head}{}{tail}", q.where_clause());
                let mut stmt = conn.prepare_cached(&sql)?;
                let found = stmt.query_map(params_from_iter(q.params), rows::event_type)?.collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn delete_event_type(&self, name: &str, expunge: bool) -> StoreResult<bool> {
        let name = name.to_owned();
        self.writer
            .write(move |conn| {
                let changed = if expunge {
                    conn.execute(sqlite(sql::DELETE_EVENT_TYPE), [&name])?
                } else {
                    conn.execute(
                        "UPDATE event_type SET archived = 1, updated_at = ? WHERE name = ?",
                        params![crate::clock::now_ms(), name],
                    )?
                };
                Ok(changed > 0)
            })
            .await
    }
}

/// An event type's columns in `EVENT_TYPE_COLUMNS` order, then the version read, if given.
/// An event type's columns, in `EVENT_TYPE_COLUMNS` order.
fn event_type_values(et: &EventType) -> Vec<Value> {
    vec![
        Value::Text(et.name.clone()),
        Value::Text(et.description.clone()),
        Value::Integer(et.archived.into()),
        Value::Integer(et.deprecated.into()),
        rows::opt_json_value(&et.schemas).map_or(Value::Null, Value::Text),
        et.feature_flag.clone().map_or(Value::Null, Value::Text),
        Value::Integer(et.created_at),
        Value::Integer(et.updated_at),
    ]
}

impl SqliteStore {
    /// The endpoint row `statement` (PostgreSQL's form, one `id` parameter) finds.
    async fn endpoint_row(&self, statement: &'static str, id: &EndpointId) -> StoreResult<Option<Endpoint>> {
        let id = id.clone();
        self.readers
            .read(move |conn| {
                Ok(conn.prepare_cached(sqlite(statement))?.query_row([id.as_str()], rows::endpoint).optional()?)
            })
            .await
    }
}
