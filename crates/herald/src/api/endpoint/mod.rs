//! `/api/v1/app/{app_id}/endpoint`: an application's endpoints (CRUD). Secrets, headers,
//! stats and manual retries are in `endpoint_ops`. The handlers are here; `dto.rs` holds
//! the bodies, `rules.rs` the checks and the operator's fields, `stored.rs` the rows,
//! `destination.rs` the event destination an endpoint may publish to instead.

mod destination;
mod dto;
mod rules;
mod stored;

pub use destination::shown as destination_shown;
pub use dto::{EndpointIn, EndpointOut, EndpointPatch};
pub use rules::parse_secret;
use rules::{apply_owner_rules, check_event_types_exist, refuse_chosen_id};
pub use stored::{credentials_summary, modify, open_headers, seal_headers};
use stored::{insert, new_endpoint, replace_fields, seal_credentials};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap};
use super::list::{Cursor, ListResponse, Order, Page};
use super::routes::Routes;
use super::validate::same_id;
use super::{AppState, VisibleApp, VisibleEndpoint};
use crate::ids::EndpointId;
use crate::store::Endpoint;
use utoipa_axum::routes;

pub fn routes() -> Routes {
    Routes::new().operations(routes!(list_endpoints, create_endpoint)).operations(routes!(
        get_endpoint,
        upsert_endpoint,
        patch_endpoint,
        delete_endpoint
    ))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint", operation_id = "v1.endpoint.list", tag = "Endpoint",
    params(("app_id" = String, Path), ("limit" = Option<usize>, Query), ("iterator" = Option<String>, Query), ("order" = Option<String>, Query)),
    responses((status = 200, body = ListResponse<EndpointOut>)))]
pub async fn list_endpoints(
    State(state): State<AppState>,
    app: VisibleApp,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<EndpointOut>>> {
    let page = Page::from_query(&query, Order::Descending, Cursor::Id(EndpointId::PREFIX))?;
    let found = state.store.list_endpoints(&app.id, &page.query()).await?;
    Ok(Json(page.finish(found, |e| e.id.to_string(), |e| EndpointOut::new(&e, &state))))
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint", operation_id = "v1.endpoint.create", tag = "Endpoint",
    request_body = EndpointIn, params(("app_id" = String, Path)),
    responses((status = 201, body = EndpointOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn create_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    app: VisibleApp,
    body: JsonBody<EndpointIn>,
) -> ApiResult<(StatusCode, Json<EndpointOut>)> {
    refuse_chosen_id(&principal, &body.value)?;
    check_event_types_exist(&state, body.value.event_types.as_ref()).await?;
    let mut endpoint = new_endpoint(&state, &app, body.value, None)?;
    apply_owner_rules(&principal, &app, None, &mut endpoint)?;
    insert(&state, &endpoint).await?;
    Ok((StatusCode::CREATED, Json(EndpointOut::new(&endpoint, &state))))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", operation_id = "v1.endpoint.get", tag = "Endpoint",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)), responses((status = 200, body = EndpointOut)))]
pub async fn get_endpoint(State(state): State<AppState>, endpoint: VisibleEndpoint) -> ApiResult<Json<EndpointOut>> {
    let (_, endpoint) = endpoint.into_parts();
    Ok(Json(EndpointOut::new(&endpoint, &state)))
}

/// Replaces an endpoint's fields, or creates it (with the path as its uid).
#[utoipa::path(put, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", operation_id = "v1.endpoint.update", tag = "Endpoint",
    request_body = EndpointIn, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointOut), (status = 201, body = EndpointOut)))]
pub async fn upsert_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    app: VisibleApp,
    Path((_, endpoint_id)): Path<(String, String)>,
    body: JsonBody<EndpointIn>,
) -> ApiResult<(StatusCode, Json<EndpointOut>)> {
    let input = body.value;
    refuse_chosen_id(&principal, &input)?;
    check_event_types_exist(&state, input.event_types.as_ref()).await?;
    if state.store.endpoint(&app.id, &endpoint_id).await?.is_none() {
        let mut endpoint = new_endpoint(&state, &app, input.clone(), Some(&endpoint_id))?;
        apply_owner_rules(&principal, &app, None, &mut endpoint)?;
        match insert(&state, &endpoint).await {
            Ok(()) => return Ok((StatusCode::CREATED, Json(EndpointOut::new(&endpoint, &state)))),
            // Created by a simultaneous PUT: this one updates it.
            Err(ApiError::Conflict(_)) if state.store.endpoint(&app.id, &endpoint_id).await?.is_some() => {}
            Err(e) => return Err(e),
        }
    }
    let scoped = app.endpoint(&state, &endpoint_id).await?;
    let endpoint = modify(&state, &principal, &scoped, |e| {
        same_id(input.id.as_deref(), e.id.as_str())?;
        *e = replace_fields(&state, e.clone(), input.clone())?;
        Ok(())
    })
    .await?;
    Ok((StatusCode::OK, Json(EndpointOut::new(&endpoint, &state))))
}

#[utoipa::path(patch, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", operation_id = "patch_endpoint", tag = "Endpoint",
    request_body = EndpointPatch, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointOut)))]
pub async fn patch_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    endpoint: VisibleEndpoint,
    body: JsonBody<EndpointPatch>,
) -> ApiResult<Json<EndpointOut>> {
    let patch = body.value;
    check_event_types_exist(&state, patch.event_types.as_ref().and_then(Option::as_ref)).await?;
    let e = modify(&state, &principal, &endpoint, |e| apply_patch(&state, e, patch.clone())).await?;
    Ok(Json(EndpointOut::new(&e, &state)))
}

/// The fields a PATCH gives replace the endpoint's; the rest stay.
fn apply_patch(state: &AppState, e: &mut Endpoint, patch: EndpointPatch) -> ApiResult<()> {
    if patch.url.is_some() || patch.destination.is_some() {
        destination::apply(state, e, patch.destination, patch.url)?;
    }
    if let Some(description) = patch.description {
        e.description = description;
    }
    if let Some(version) = patch.version {
        e.version = version;
    }
    if let Some(disabled) = patch.disabled {
        e.disabled = disabled;
    }
    if let Some(types) = patch.event_types {
        e.event_types = types;
    }
    if let Some(channels) = patch.channels {
        e.channels = channels;
    }
    if let Some(metadata) = patch.metadata {
        e.metadata = metadata;
    }
    if let Some(rate) = patch.throttle_rate {
        e.throttle_rate = rate;
    }
    if let Some(uid) = patch.uid {
        e.uid = uid;
    }
    if let Some(request) = patch.request {
        e.request = request;
    }
    if let Some(delivery) = patch.delivery {
        e.delivery = delivery.unwrap_or_default();
    }
    if let Some(filter) = patch.filter {
        e.scripts.filter = filter;
    }
    if let Some(transform) = patch.transform {
        e.scripts.transform = transform;
    }
    e.auth = seal_credentials(state, e, patch.auth, patch.tls)?;
    Ok(())
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", operation_id = "v1.endpoint.delete", tag = "Endpoint",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)), responses((status = 204)))]
pub async fn delete_endpoint(State(state): State<AppState>, endpoint: VisibleEndpoint) -> ApiResult<StatusCode> {
    let (app, endpoint) = endpoint.into_parts();
    state.store.delete_endpoint(&app.id, &endpoint.id).await?;
    state.catalog.invalidate_endpoint(&app.id, &endpoint.id);
    state.dispatcher.endpoint_changed(&endpoint.id).await;
    Ok(StatusCode::NO_CONTENT)
}
