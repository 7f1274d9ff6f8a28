//! Turning rows into records and records into column values, plus the shared pieces of
//! query building (pagination, message filters).

use std::sync::Arc;

use rusqlite::Row;
use rusqlite::types::Value;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ids::{AppId, AttemptId, EndpointId, MessageId};
pub use crate::store::sql::{
    APP_COLUMNS, ATTEMPT_COLUMNS, ENDPOINT_COLUMNS, EVENT_TYPE_COLUMNS, KEPT_ENDPOINT_COLUMNS, MESSAGE_COLUMNS,
};
use crate::store::{
    App, AppProxy, Attempt, DeliveryState, DeliveryView, Endpoint, EventType, Message, MessageFilter, PageQuery,
    SealedAuth, SealedDestination, SealedHeaders, SealedSecrets, Trigger,
};
use crate::store::{packing, sql};
use crate::traceparent::parse_traceparent;

pub fn to_json<T: Serialize + ?Sized>(value: &T) -> String {
    serde_json::to_string(value).expect("records always serialize")
}

pub(super) fn from_json<T: DeserializeOwned>(row: &Row<'_>, idx: usize) -> rusqlite::Result<T> {
    let text: String = row.get(idx)?;
    serde_json::from_str(&text)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e)))
}

pub(super) fn opt_json<T: DeserializeOwned>(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<T>> {
    match row.get::<_, Option<String>>(idx)? {
        None => Ok(None),
        Some(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, Box::new(e))),
    }
}

pub fn opt_json_value<T: Serialize>(value: &Option<T>) -> Option<String> {
    value.as_ref().map(|v| to_json(v))
}

pub fn app(row: &Row<'_>) -> rusqlite::Result<App> {
    Ok(App {
        id: AppId::from_trusted(row.get(0)?),
        uid: row.get(1)?,
        name: row.get(2)?,
        metadata: from_json(row, 3)?,
        throttle_rate: row.get(4)?,
        max_concurrency: row.get(5)?,
        weight: row.get(6)?,
        created_at: row.get(7)?,
        updated_at: row.get(8)?,
        portal_brand: opt_json(row, 9)?,
        proxy: row
            .get::<_, Option<String>>(10)?
            .map(|url| AppProxy { url, credentials: SealedAuth(row.get(11).unwrap_or_default()) }),
    })
}

pub fn endpoint(row: &Row<'_>) -> rusqlite::Result<Endpoint> {
    Ok(Endpoint {
        id: EndpointId::from_trusted(row.get(0)?),
        app_id: AppId::from_trusted(row.get(1)?),
        uid: row.get(2)?,
        url: row.get(3)?,
        description: row.get(4)?,
        disabled: row.get(5)?,
        event_types: opt_json(row, 6)?,
        channels: opt_json(row, 7)?,
        metadata: from_json(row, 8)?,
        throttle_rate: row.get(9)?,
        headers: SealedHeaders(row.get(10)?),
        secrets: SealedSecrets(row.get(11)?),
        delivery: from_json(row, 12)?,
        request: opt_json(row, 13)?,
        created_at: row.get(14)?,
        updated_at: row.get(15)?,
        scripts: opt_json(row, 16)?.unwrap_or_default(),
        auth: SealedAuth(row.get(17)?),
        version: row.get(18)?,
        destination: SealedDestination(row.get(19)?),
    })
}

/// Column values of an endpoint, in `ENDPOINT_COLUMNS` order.
pub fn endpoint_values(e: &Endpoint) -> Vec<Value> {
    vec![
        Value::Text(e.id.to_string()),
        Value::Text(e.app_id.to_string()),
        e.uid.clone().map_or(Value::Null, Value::Text),
        Value::Text(e.url.clone()),
        Value::Text(e.description.clone()),
        Value::Integer(e.disabled.into()),
        opt_json_value(&e.event_types).map_or(Value::Null, Value::Text),
        opt_json_value(&e.channels).map_or(Value::Null, Value::Text),
        Value::Text(to_json(&e.metadata)),
        e.throttle_rate.map_or(Value::Null, |v| Value::Integer(v.into())),
        Value::Text(e.headers.0.clone()),
        Value::Text(e.secrets.0.clone()),
        Value::Text(to_json(&e.delivery)),
        opt_json_value(&e.request).map_or(Value::Null, Value::Text),
        Value::Integer(e.created_at),
        Value::Integer(e.updated_at),
        if e.scripts.is_empty() { Value::Null } else { Value::Text(to_json(&e.scripts)) },
        Value::Text(e.auth.0.clone()),
        Value::Integer(e.version.into()),
        Value::Text(e.destination.0.clone()),
    ]
}

pub fn event_type(row: &Row<'_>) -> rusqlite::Result<EventType> {
    Ok(EventType {
        name: row.get(0)?,
        description: row.get(1)?,
        archived: row.get(2)?,
        deprecated: row.get(3)?,
        schemas: opt_json(row, 4)?,
        feature_flag: row.get(5)?,
        created_at: row.get(6)?,
        updated_at: row.get(7)?,
    })
}

/// How many columns [`MESSAGE_COLUMNS`] names.
pub const MESSAGE_COLUMN_COUNT: usize = 9;

/// A message; the payload is left out (`None`) unless `with_payload`.
pub fn message(row: &Row<'_>, with_payload: bool) -> rusqlite::Result<Message> {
    message_at(row, 0, with_payload)
}

/// A message whose [`MESSAGE_COLUMNS`] start at column `at`.
pub fn message_at(row: &Row<'_>, at: usize, with_payload: bool) -> rusqlite::Result<Message> {
    let payload = if with_payload { payload(row, at + 5, at + 8)? } else { None };
    Ok(Message {
        id: MessageId::from_trusted(row.get(at)?),
        app_id: AppId::from_trusted(row.get(at + 1)?),
        event_type: row.get(at + 2)?,
        event_id: row.get(at + 3)?,
        channels: opt_json(row, at + 4)?,
        payload,
        created_at: row.get(at + 6)?,
        trace: row.get::<_, Option<String>>(at + 7)?.as_deref().and_then(parse_traceparent),
    })
}

/// A message's payload: the text in column `text`, or else the packed form in `packed`
/// unpacked (a damaged one fails the read, as any unreadable column does).
fn payload(row: &Row<'_>, text: usize, column: usize) -> rusqlite::Result<Option<Arc<str>>> {
    if let Some(text) = row.get::<_, Option<String>>(text)? {
        return Ok(Some(Arc::from(text)));
    }
    let Some(packed) = row.get_ref(column)?.as_blob_or_null()? else { return Ok(None) };
    let unpacked = packing::unpack(packed)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Blob, Box::new(e)))?;
    Ok(Some(Arc::from(unpacked)))
}

pub fn attempt(row: &Row<'_>, with_content: bool) -> rusqlite::Result<Attempt> {
    Ok(Attempt {
        id: AttemptId::from_trusted(row.get(0)?),
        msg_id: MessageId::from_trusted(row.get(1)?),
        endpoint_id: EndpointId::from_trusted(row.get(2)?),
        app_id: AppId::from_trusted(row.get(3)?),
        created_at: row.get(4)?,
        url: row.get(5)?,
        status_code: row.get(6)?,
        duration_ms: row.get(7)?,
        delivered: row.get(8)?,
        error_class: row.get(9)?,
        error: row.get(10)?,
        response: if with_content { row.get(11)? } else { String::new() },
        trigger: Trigger::from_code(row.get(12)?),
        attempt_no: row.get(13)?,
        delivery_id: row.get(14)?,
    })
}

/// Reads `d.endpoint_id, d.state, d.attempts, d.next_at` starting at column `at`.
pub fn delivery_view(row: &Row<'_>, at: usize) -> rusqlite::Result<DeliveryView> {
    let state = DeliveryState::from_code(row.get(at + 1)?);
    let next_at: i64 = row.get(at + 3)?;
    Ok(DeliveryView {
        endpoint_id: EndpointId::from_trusted(row.get(at)?),
        state,
        attempts: row.get(at + 2)?,
        next_at: (state == DeliveryState::Pending).then_some(next_at),
    })
}

/// Accumulates a WHERE clause and its parameters.
#[derive(Default)]
pub struct Query {
    pub conditions: Vec<String>,
    pub params: Vec<Value>,
}

impl Query {
    pub fn and(&mut self, condition: impl Into<String>, params: impl IntoIterator<Item = Value>) {
        self.conditions.push(condition.into());
        self.params.extend(params);
    }

    /// Adds the keyset condition on `column` and returns the ORDER BY / LIMIT tail.
    pub fn page(&mut self, column: &str, page: &PageQuery) -> String {
        let (op, dir) = if page.descending { ("<", "DESC") } else { (">", "ASC") };
        if let Some(iterator) = &page.iterator {
            self.and(format!("{column} {op} ?"), [Value::Text(iterator.clone())]);
        }
        format!(" ORDER BY {column} {dir} LIMIT {}", page.limit)
    }

    /// Adds the standard message filters against the message alias `m`.
    pub fn messages(&mut self, filter: &MessageFilter) {
        if let Some(channel) = &filter.channel {
            self.and(
                "EXISTS (SELECT 1 FROM json_each(m.channels) WHERE json_each.value = ?)",
                [Value::Text(channel.clone())],
            );
        }
        if !filter.event_types.is_empty() {
            let marks = vec!["?"; filter.event_types.len()].join(", ");
            self.and(format!("m.event_type IN ({marks})"), filter.event_types.iter().map(|t| Value::Text(t.clone())));
        }
        if let Some(before) = filter.before {
            self.and("m.created_at < ?", [Value::Integer(before)]);
        }
        if let Some(after) = filter.after {
            self.and("m.created_at >= ?", [Value::Integer(after)]);
        }
    }

    pub fn where_clause(&self) -> String {
        if self.conditions.is_empty() { String::new() } else { format!(" WHERE {}", self.conditions.join(" AND ")) }
    }
}

/// One page (by id) of an application's rows of `table`: the statement and its parameters.
pub fn app_page(columns: &str, table: &str, app: &AppId, page: &PageQuery) -> (String, Vec<Value>) {
    let mut q = Query::default();
    q.and("app_id = ?", [Value::Text(app.to_string())]);
    let tail = q.page("id", page);
    (format!("{}{}{tail}", sql::to_sqlite(&sql::list_head(columns, table)), q.where_clause()), q.params)
}

/// A source of one page: `FROM {from}` with its conditions, in the order of `key` (an
/// indexed column holding the page's ordering value, the same in every branch).
pub struct Branch<'a> {
    pub from: &'a str,
    pub key: &'a str,
    pub query: Query,
}

/// One page from several sources at once (an index table up to its watermark and the tail
/// beyond it, say): each branch is ordered and cut on its own key, then the branches are
/// merged and cut again. The rows are `columns` followed by the key.
pub fn merged_page(columns: &str, branches: Vec<Branch<'_>>, page: &PageQuery) -> (String, Vec<Value>) {
    let dir = if page.descending { "DESC" } else { "ASC" };
    let mut parts = Vec::with_capacity(branches.len());
    let mut params = Vec::new();
    for Branch { from, key, mut query } in branches {
        let tail = query.page(key, page);
        parts.push(format!(
            "SELECT * FROM (SELECT {columns}, {key} AS page_key FROM {from}{}{tail})",
            query.where_clause()
        ));
        params.extend(query.params);
    }
    (format!("{} ORDER BY page_key {dir} LIMIT {}", parts.join(" UNION ALL "), page.limit), params)
}
