//! Pollers (Herald extension): `/api/v1/app/{app_id}/poller` for consumers that cannot
//! receive webhooks and pull their messages instead. A poller filters like an endpoint
//! (event types, channels, a jq filter); each named consumer keeps its own position server
//! side, which moves only when the consumer asks for the next page with the iterator it was
//! given (at-least-once), or seeks. This file holds the pollers' own routes; `consumer`
//! the consumers' (reading a page, seeking), `scan` the read through the message log and
//! the long-poll around it, `iterator` the iterator codec, `waiting` the long-poll caps.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap};
use super::list::{Cursor, ListResponse, Order, Page};
use super::routes::Routes;
use super::validate::{Problems, double_option};
use super::{AppState, VisibleApp, VisiblePoller, optimistic};
use crate::clock::{now_ms, to_rfc3339};
use crate::ids::PollerId;
use crate::store::{Metadata, Poller};
use utoipa_axum::routes;

mod consumer;
mod iterator;
mod scan;
mod waiting;

pub use waiting::WaitingPolls;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PollerIn {
    pub uid: Option<String>,
    pub description: Option<String>,
    #[serde(alias = "filterTypes")]
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    /// A jq expression on `{eventType, channels, payload}`; the poller holds a message only
    /// if it yields `true`.
    pub filter: Option<String>,
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PollerPatch {
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub uid: Option<Option<String>>,
    pub description: Option<String>,
    #[serde(default, alias = "filterTypes", deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<String>>)]
    pub event_types: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<String>>)]
    pub channels: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub filter: Option<Option<String>>,
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PollerOut {
    pub id: String,
    pub uid: Option<String>,
    pub description: String,
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    pub metadata: Metadata,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&Poller> for PollerOut {
    fn from(p: &Poller) -> Self {
        Self {
            id: p.id.to_string(),
            uid: p.uid.clone(),
            description: p.description.clone(),
            event_types: p.event_types.clone(),
            channels: p.channels.clone(),
            filter: p.filter.clone(),
            metadata: p.metadata.clone(),
            created_at: to_rfc3339(p.created_at),
            updated_at: to_rfc3339(p.updated_at),
        }
    }
}

pub fn routes() -> Routes {
    Routes::new()
        .operations(routes!(list_pollers, create_poller))
        .operations(routes!(get_poller, patch_poller, delete_poller))
        .operations(routes!(consumer::consume))
        .operations(routes!(consumer::seek))
}

/// Checks every field of a poller about to be stored; its filter only if it differs from
/// the stored one (`before`), in the sandbox.
async fn check_poller(state: &AppState, before: Option<&Poller>, p: &Poller) -> ApiResult<()> {
    let mut problems = Problems::default();
    if let Some(uid) = &p.uid {
        problems.uid("uid", uid, PollerId::PREFIX);
    }
    match &p.event_types {
        Some(types) if types.is_empty() => problems.push("eventTypes", "must have at least one item"),
        Some(types) => problems.slug_list("eventTypes", types, 256, 1000),
        None => {}
    }
    if let Some(channels) = &p.channels {
        problems.slug_list("channels", channels, 128, 10);
    }
    problems.finish()?;
    match &p.filter {
        Some(code) if Some(code) != before.and_then(|b| b.filter.as_ref()) => {
            super::transformation::check_expressions(state, &p.app_id, &[("filter", code)]).await
        }
        _ => Ok(()),
    }
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller", operation_id = "herald.poller.list", tag = "Poller",
    params(("app_id" = String, Path)), responses((status = 200, body = ListResponse<PollerOut>)))]
pub async fn list_pollers(
    State(state): State<AppState>,
    app: VisibleApp,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<PollerOut>>> {
    let page = Page::from_query(&query, Order::Descending, Cursor::Id(PollerId::PREFIX))?;
    let found = state.store.list_pollers(&app.id, &page.query()).await?;
    Ok(Json(page.finish(found, |p| p.id.to_string(), |p| PollerOut::from(&p))))
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/poller", operation_id = "herald.poller.create", tag = "Poller",
    request_body = PollerIn, params(("app_id" = String, Path)),
    responses((status = 201, body = PollerOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn create_poller(
    State(state): State<AppState>,
    app: VisibleApp,
    body: JsonBody<PollerIn>,
) -> ApiResult<(StatusCode, Json<PollerOut>)> {
    let input = body.value;
    let now = now_ms();
    let poller = Poller {
        id: PollerId::generate(),
        app_id: app.id.clone(),
        uid: input.uid,
        description: input.description.unwrap_or_default(),
        event_types: input.event_types,
        channels: input.channels,
        filter: input.filter,
        metadata: input.metadata.unwrap_or_default(),
        created_at: now,
        updated_at: now,
    };
    check_poller(&state, None, &poller).await?;
    let cap = state.settings.tenants.max_pollers;
    if !state.store.insert_poller(&poller, cap).await? {
        return Err(ApiError::invalid(
            "",
            format!("this application has {cap} pollers, the most it may have (tenants.max_pollers)"),
        ));
    }
    Ok((StatusCode::CREATED, Json(PollerOut::from(&poller))))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller/{poller_id}", operation_id = "herald.poller.get", tag = "Poller",
    params(("app_id" = String, Path), ("poller_id" = String, Path)), responses((status = 200, body = PollerOut)))]
pub async fn get_poller(poller: VisiblePoller) -> ApiResult<Json<PollerOut>> {
    let (_, poller) = poller.into_parts();
    Ok(Json(PollerOut::from(&poller)))
}

#[utoipa::path(patch, path = "/api/v1/app/{app_id}/poller/{poller_id}", operation_id = "herald.poller.patch", tag = "Poller",
    request_body = PollerPatch, params(("app_id" = String, Path), ("poller_id" = String, Path)),
    responses((status = 200, body = PollerOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn patch_poller(
    State(state): State<AppState>,
    scoped: VisiblePoller,
    body: JsonBody<PollerPatch>,
) -> ApiResult<Json<PollerOut>> {
    let patch = body.value;
    let poller = optimistic::retry_stale! {
        let before = scoped.reread(&state).await?.into_parts().1;
        let mut poller = before.clone();
        let patch = patch.clone();
        if let Some(uid) = patch.uid {
            poller.uid = uid;
        }
        if let Some(description) = patch.description {
            poller.description = description;
        }
        if let Some(types) = patch.event_types {
            poller.event_types = types;
        }
        if let Some(channels) = patch.channels {
            poller.channels = channels;
        }
        if let Some(filter) = patch.filter {
            poller.filter = filter;
        }
        if let Some(metadata) = patch.metadata {
            poller.metadata = metadata;
        }
        poller.updated_at = optimistic::next_version(before.updated_at);
        check_poller(&state, Some(&before), &poller).await?;
        optimistic::won(state.store.update_poller(&poller, before.updated_at).await?, "poller")?;
        Ok(poller)
    }?;
    Ok(Json(PollerOut::from(&poller)))
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}/poller/{poller_id}", operation_id = "herald.poller.delete", tag = "Poller",
    params(("app_id" = String, Path), ("poller_id" = String, Path)), responses((status = 204)))]
pub async fn delete_poller(State(state): State<AppState>, poller: VisiblePoller) -> ApiResult<StatusCode> {
    let (app, poller) = poller.into_parts();
    state.store.delete_poller(&app.id, &poller.id).await?;
    Ok(StatusCode::NO_CONTENT)
}
