//! Turning rows into records, and building queries with numbered parameters.

use std::sync::Arc;

use tokio_postgres::Row;
use tokio_postgres::types::{Json, ToSql};

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

pub fn app(row: &Row) -> App {
    App {
        id: AppId::from_trusted(row.get(0)),
        uid: row.get(1),
        name: row.get(2),
        metadata: row.get::<_, Json<_>>(3).0,
        throttle_rate: row.get::<_, Option<i32>>(4).map(|v| v as u16),
        max_concurrency: row.get::<_, Option<i32>>(5).map(|v| v as u32),
        weight: row.get::<_, Option<i32>>(6).map(|v| v as u32),
        created_at: row.get(7),
        updated_at: row.get(8),
        portal_brand: row.get::<_, Option<Json<_>>>(9).map(|b| b.0),
        proxy: row
            .get::<_, Option<String>>(10)
            .map(|url| AppProxy { url, credentials: SealedAuth(row.get::<_, Option<String>>(11).unwrap_or_default()) }),
    }
}

pub fn endpoint(row: &Row) -> Endpoint {
    Endpoint {
        id: EndpointId::from_trusted(row.get(0)),
        app_id: AppId::from_trusted(row.get(1)),
        uid: row.get(2),
        url: row.get(3),
        description: row.get(4),
        disabled: row.get(5),
        event_types: row.get(6),
        channels: row.get(7),
        metadata: row.get::<_, Json<_>>(8).0,
        throttle_rate: row.get::<_, Option<i32>>(9).map(|v| v as u16),
        headers: SealedHeaders(row.get(10)),
        secrets: SealedSecrets(row.get(11)),
        delivery: row.get::<_, Json<_>>(12).0,
        request: row.get::<_, Option<Json<_>>>(13).map(|j| j.0),
        created_at: row.get(14),
        updated_at: row.get(15),
        scripts: row.get::<_, Option<Json<_>>>(16).map(|j| j.0).unwrap_or_default(),
        auth: SealedAuth(row.get(17)),
        destination: SealedDestination(row.get(19)),
        version: row.get(18),
    }
}

pub fn event_type(row: &Row) -> EventType {
    EventType {
        name: row.get(0),
        description: row.get(1),
        archived: row.get(2),
        deprecated: row.get(3),
        schemas: row.get::<_, Option<Json<serde_json::Value>>>(4).map(|j| j.0),
        feature_flag: row.get(5),
        created_at: row.get(6),
        updated_at: row.get(7),
    }
}

/// How many columns [`MESSAGE_COLUMNS`] names.
pub const MESSAGE_COLUMN_COUNT: usize = 9;

pub fn message(row: &Row, with_payload: bool) -> Message {
    message_at(row, 0, with_payload)
}

/// A message whose [`MESSAGE_COLUMNS`] start at column `at`.
pub fn message_at(row: &Row, at: usize, with_payload: bool) -> Message {
    Message {
        id: MessageId::from_trusted(row.get(at)),
        app_id: AppId::from_trusted(row.get(at + 1)),
        event_type: row.get(at + 2),
        event_id: row.get(at + 3),
        channels: row.get(at + 4),
        payload: if with_payload { payload(row, at + 5, at + 8) } else { None },
        created_at: row.get(at + 6),
        trace: row.get::<_, Option<&str>>(at + 7).and_then(parse_traceparent),
    }
}

/// A message's payload: the text in column `text`, or else the packed form in `packed`
/// unpacked (Herald's ingests pack large payloads; `herald.send_message` writes text). A
/// damaged one reads as no payload, and says so in the log.
fn payload(row: &Row, text: usize, packed: usize) -> Option<Arc<str>> {
    if let Some(text) = row.get::<_, Option<&str>>(text) {
        return Some(Arc::from(text));
    }
    let packed = row.get::<_, Option<&[u8]>>(packed)?;
    packing::unpack(packed)
        .inspect_err(|e| tracing::error!(error = %e, "a message's packed payload could not be read"))
        .ok()
        .map(Arc::from)
}

pub fn attempt(row: &Row, with_content: bool) -> Attempt {
    Attempt {
        id: AttemptId::from_trusted(row.get(0)),
        msg_id: MessageId::from_trusted(row.get(1)),
        endpoint_id: EndpointId::from_trusted(row.get(2)),
        app_id: AppId::from_trusted(row.get(3)),
        created_at: row.get(4),
        url: row.get(5),
        status_code: row.get::<_, i32>(6) as u16,
        duration_ms: row.get::<_, i64>(7) as u64,
        delivered: row.get(8),
        error_class: row.get(9),
        error: row.get(10),
        response: if with_content { row.get(11) } else { String::new() },
        trigger: Trigger::from_code(row.get::<_, i16>(12).into()),
        attempt_no: row.get::<_, i32>(13) as u32,
        delivery_id: row.get(14),
    }
}

/// Reads `endpoint_id, state, attempts, next_at` starting at column `at`.
pub fn delivery_view(row: &Row, at: usize) -> DeliveryView {
    let state = DeliveryState::from_code(row.get::<_, i16>(at + 1).into());
    DeliveryView {
        endpoint_id: EndpointId::from_trusted(row.get(at)),
        state,
        attempts: row.get::<_, i32>(at + 2) as u32,
        next_at: (state == DeliveryState::Pending).then(|| row.get(at + 3)),
    }
}

pub type Param = Box<dyn ToSql + Sync + Send>;

/// One page (by id) of an application's rows of `table`: the statement and its parameters.
pub fn app_page(columns: &str, table: &str, app: &AppId, page: &PageQuery) -> (String, Query) {
    let mut q = Query::default();
    let p = q.bind(app.to_string());
    q.and(format!("app_id = {p}"));
    let tail = q.page("id", page);
    (format!("{}{}{tail}", sql::list_head(columns, table), q.where_clause()), q)
}

/// A WHERE clause with `$n` parameters.
#[derive(Default)]
pub struct Query {
    conditions: Vec<String>,
    params: Vec<Param>,
}

impl Query {
    /// Adds a parameter and returns its placeholder.
    pub fn bind(&mut self, value: impl ToSql + Sync + Send + 'static) -> String {
        self.params.push(Box::new(value));
        format!("${}", self.params.len())
    }

    pub fn and(&mut self, condition: impl Into<String>) {
        self.conditions.push(condition.into());
    }

    /// Adds the keyset condition on `column` and returns the ORDER BY / LIMIT tail.
    pub fn page(&mut self, column: &str, page: &PageQuery) -> String {
        let (op, dir) = if page.descending { ("<", "DESC") } else { (">", "ASC") };
        if let Some(iterator) = &page.iterator {
            let p = self.bind(iterator.clone());
            self.and(format!("{column} {op} {p}"));
        }
        format!(" ORDER BY {column} {dir} LIMIT {}", page.limit)
    }

    /// The standard message filters against the message alias `m`.
    pub fn messages(&mut self, filter: &MessageFilter) {
        if let Some(channel) = &filter.channel {
            let p = self.bind(channel.clone());
            self.and(format!("{p} = ANY (m.channels)"));
        }
        if !filter.event_types.is_empty() {
            let p = self.bind(filter.event_types.clone());
            self.and(format!("m.event_type = ANY ({p})"));
        }
        if let Some(before) = filter.before {
            let p = self.bind(before);
            self.and(format!("m.created_at < {p}"));
        }
        if let Some(after) = filter.after {
            let p = self.bind(after);
            self.and(format!("m.created_at >= {p}"));
        }
    }

    pub fn where_clause(&self) -> String {
        if self.conditions.is_empty() { String::new() } else { format!(" WHERE {}", self.conditions.join(" AND ")) }
    }

    pub fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect()
    }
}
