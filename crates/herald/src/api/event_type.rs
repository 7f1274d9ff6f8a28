//! `/api/v1/event-type`: the catalogue of event types (global, not per application).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap};
use super::list::{Cursor, ListResponse, Order, Page};
use super::routes::Routes;
use super::validate::{Problems, double_option};
use super::{AppState, optimistic};
use crate::clock::{Millis, now_ms, to_rfc3339};
use crate::store::EventType;
use utoipa_axum::routes;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeIn {
    pub name: String,
    #[serde(flatten)]
    pub fields: EventTypeUpdate,
}

/// Body of PUT, and the fields of `EventTypeIn` besides the name (which PUT takes from the path).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeUpdate {
    pub description: String,
    pub archived: Option<bool>,
    pub deprecated: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<serde_json::Value>,
    pub feature_flag: Option<String>,
}

impl EventTypeUpdate {
    fn into_event_type(self, name: String, created_at: Millis) -> EventType {
        EventType {
            name,
            description: self.description,
            archived: self.archived.unwrap_or(false),
            deprecated: self.deprecated.unwrap_or(false),
            schemas: self.schemas,
            feature_flag: self.feature_flag,
            created_at,
            updated_at: now_ms(),
        }
    }
}

#[derive(Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypePatch {
    pub description: Option<String>,
    pub archived: Option<bool>,
    pub deprecated: Option<bool>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<Option<serde_json::Value>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub feature_flag: Option<Option<String>>,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventTypeOut {
    pub name: String,
    pub description: String,
    pub archived: bool,
    pub deprecated: bool,
    #[schema(value_type = Option<Object>)]
    pub schemas: Option<serde_json::Value>,
    pub feature_flag: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl EventTypeOut {
    fn new(et: EventType, with_schemas: bool) -> Self {
        Self {
            name: et.name,
            description: et.description,
            archived: et.archived,
            deprecated: et.deprecated,
            schemas: et.schemas.filter(|_| with_schemas),
            feature_flag: et.feature_flag,
            created_at: to_rfc3339(et.created_at),
            updated_at: to_rfc3339(et.updated_at),
        }
    }
}

pub fn routes() -> Routes {
    Routes::new().operations(routes!(list_event_types, create_event_type)).operations(routes!(
        get_event_type,
        upsert_event_type,
        patch_event_type,
        delete_event_type
    ))
}

fn check(et: &EventType) -> ApiResult<()> {
    let mut p = Problems::default();
    p.slug("name", &et.name, 256);
    if let Some(flag) = &et.feature_flag {
        p.slug("featureFlag", flag, 256);
    }
    match &et.schemas {
        None => {}
        Some(serde_json::Value::Object(versions)) => {
            // Each version must be a JSON Schema (draft 7, as Svix checks) that compiles:
            // valid keywords, references that resolve.
            for (version, schema) in versions {
                if let Err(e) = jsonschema::options().with_draft(jsonschema::Draft::Draft7).build(schema) {
                    p.push("schemas", format!("version {version} is not a valid JSON Schema: {e}"));
                }
            }
        }
        Some(_) => p.push("schemas", "must be an object keyed by version"),
    }
    p.finish()
}

#[utoipa::path(get, path = "/api/v1/event-type", operation_id = "v1.event-type.list", tag = "Event Type",
    params(("limit" = Option<usize>, Query), ("iterator" = Option<String>, Query), ("order" = Option<String>, Query),
        ("include_archived" = Option<bool>, Query), ("with_content" = Option<bool>, Query)),
    responses((status = 200, body = ListResponse<EventTypeOut>)))]
pub async fn list_event_types(
    State(state): State<AppState>,
    principal: Principal,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<EventTypeOut>>> {
    let page = Page::from_query(&query, Order::AlwaysAscending, Cursor::Name)?;
    let with_content = query.flag("with_content", false)?;
    let found = visible_page(&state, &principal, &page, query.flag("include_archived", false)?).await?;
    Ok(Json(page.finish(found, |et| et.name.clone(), |et| EventTypeOut::new(et, with_content))))
}

/// The event types of `page` that `principal` may see: those gated by a feature flag it
/// lacks are passed over (as in Svix), reading on until the page (and the one row more
/// that says whether more follow) is full or the catalog ends.
async fn visible_page(
    state: &AppState,
    principal: &Principal,
    page: &Page,
    archived: bool,
) -> ApiResult<Vec<EventType>> {
    let mut query = page.query();
    let mut visible = Vec::new();
    loop {
        let batch = state.store.list_event_types(&query, archived).await?;
        let ended = batch.len() < query.limit;
        query.iterator = batch.last().map(|et| et.name.clone());
        visible.extend(batch.into_iter().filter(|et| principal.has_feature(et.feature_flag.as_deref())));
        if ended || visible.len() >= query.limit {
            return Ok(visible);
        }
    }
}

#[utoipa::path(post, path = "/api/v1/event-type", operation_id = "v1.event-type.create", tag = "Event Type",
    request_body = EventTypeIn, responses((status = 201, body = EventTypeOut), (status = 409, body = super::error::HttpErrorOut)))]
pub async fn create_event_type(
    State(state): State<AppState>,
    principal: Principal,
    body: JsonBody<EventTypeIn>,
) -> ApiResult<(StatusCode, Json<EventTypeOut>)> {
    principal.require_admin()?;
    let input = body.value;
    let et = input.fields.into_event_type(input.name, now_ms());
    check(&et)?;
    state.store.insert_event_type(&et).await?;
    Ok((StatusCode::CREATED, Json(EventTypeOut::new(et, true))))
}

#[utoipa::path(get, path = "/api/v1/event-type/{event_type_name}", operation_id = "v1.event-type.get", tag = "Event Type",
    params(("event_type_name" = String, Path)), responses((status = 200, body = EventTypeOut)))]
pub async fn get_event_type(
    State(state): State<AppState>,
    principal: Principal,
    Path(name): Path<String>,
) -> ApiResult<Json<EventTypeOut>> {
    let et = state.store.event_type(&name).await?;
    // Gated by a feature flag the caller lacks: as if it did not exist (Svix).
    let et =
        et.filter(|et| principal.has_feature(et.feature_flag.as_deref())).ok_or(ApiError::NotFound("event type"))?;
    Ok(Json(EventTypeOut::new(et, true)))
}

#[utoipa::path(put, path = "/api/v1/event-type/{event_type_name}", operation_id = "v1.event-type.update", tag = "Event Type",
    request_body = EventTypeUpdate, params(("event_type_name" = String, Path)),
    responses((status = 200, body = EventTypeOut), (status = 201, body = EventTypeOut)))]
pub async fn upsert_event_type(
    State(state): State<AppState>,
    principal: Principal,
    Path(name): Path<String>,
    body: JsonBody<EventTypeUpdate>,
) -> ApiResult<(StatusCode, Json<EventTypeOut>)> {
    principal.require_admin()?;
    let created_at = state.store.event_type(&name).await?.map_or_else(now_ms, |e| e.created_at);
    let et = body.value.into_event_type(name, created_at);
    check(&et)?;
    let created = state.store.upsert_event_type(&et).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(EventTypeOut::new(et, true))))
}

#[utoipa::path(patch, path = "/api/v1/event-type/{event_type_name}", operation_id = "patch_event_type", tag = "Event Type",
    request_body = EventTypePatch, params(("event_type_name" = String, Path)), responses((status = 200, body = EventTypeOut)))]
pub async fn patch_event_type(
    State(state): State<AppState>,
    principal: Principal,
    Path(name): Path<String>,
    body: JsonBody<EventTypePatch>,
) -> ApiResult<Json<EventTypeOut>> {
    principal.require_admin()?;
    let patch = body.value;
    let et = optimistic::retry_stale! {
        let before = state.store.event_type(&name).await?.ok_or(ApiError::NotFound("event type"))?;
        let mut et = before.clone();
        let patch = patch.clone();
        if let Some(description) = patch.description {
            et.description = description;
        }
        if let Some(archived) = patch.archived {
            et.archived = archived;
        }
        if let Some(deprecated) = patch.deprecated {
            et.deprecated = deprecated;
        }
        if let Some(schemas) = patch.schemas {
            et.schemas = schemas;
        }
        if let Some(flag) = patch.feature_flag {
            et.feature_flag = flag;
        }
        et.updated_at = optimistic::next_version(before.updated_at);
        check(&et)?;
        optimistic::won(state.store.update_event_type(&et, before.updated_at).await?, "event type")?;
        Ok(et)
    }?;
    Ok(Json(EventTypeOut::new(et, true)))
}

/// Archives an event type (or removes it with `expunge=true`).
#[utoipa::path(delete, path = "/api/v1/event-type/{event_type_name}", operation_id = "v1.event-type.delete", tag = "Event Type",
    params(("event_type_name" = String, Path), ("expunge" = Option<bool>, Query)), responses((status = 204)))]
pub async fn delete_event_type(
    State(state): State<AppState>,
    principal: Principal,
    Path(name): Path<String>,
    query: QueryMap,
) -> ApiResult<StatusCode> {
    principal.require_admin()?;
    if state.store.delete_event_type(&name, query.flag("expunge", false)?).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound("event type"))
    }
}
