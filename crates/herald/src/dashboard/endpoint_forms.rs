//! The endpoint forms of the portal. Each checks the session's CSRF token, turns the form
//! into the JSON body of the API call it stands for and calls that API handler with the
//! viewer's principal: the tenant rules, the destination guard and every validation are
//! the API's. A refused settings form comes back with the API's reasons next to its fields.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde_json::{Value, json};

use super::destination::{self, DestinationDraft};
use super::endpoints::{Draft, endpoint_page, new_page};
use super::form::{Fields, body, problems};
use super::{Page, Viewer, view};
use super::{catalog, credentials};
use crate::api::{ApiError, AppState, VisibleApp, VisibleEndpoint, endpoint, endpoint_ops, stats};

type EndpointPath = Path<(String, String)>;

/// The settings a form carries, as typed (for showing them again after a refusal).
fn draft(fields: &Fields, problems: Vec<(Option<String>, String)>) -> Draft {
    Draft {
        url: fields.get("url").unwrap_or_default().trim().to_owned(),
        description: fields.get("description").unwrap_or_default().to_owned(),
        event_types: fields.all("event_types"),
        channels: fields.get("channels").unwrap_or_default().to_owned(),
        throttle_rate: fields.get("throttle_rate").unwrap_or_default().to_owned(),
        filter: fields.get("filter").unwrap_or_default().to_owned(),
        transform: fields.get("transform").unwrap_or_default().to_owned(),
        credentials: Default::default(),
        destination: DestinationDraft::typed(fields),
        problems,
    }
}

/// The settings form as an API body; an empty subscription, channel list or rate limit
/// is `null` (none), which a PATCH needs to clear them.
fn settings_json(fields: &Fields) -> Result<Value, ApiError> {
    let types = fields.all("event_types");
    let rate = match fields.given("throttle_rate") {
        Some(rate) => Some(rate.parse::<u16>().map_err(|_| ApiError::invalid("throttleRate", "must be a number"))?),
        None => None,
    };
    let mut body = json!({
        "url": fields.get("url").unwrap_or_default().trim(),
        "description": fields.get("description").unwrap_or_default(),
        "filterTypes": (!types.is_empty()).then_some(types),
        "channels": fields.list("channels"),
        "throttleRate": rate,
        "filter": fields.given("filter"),
        "transform": fields.given("transform"),
    });
    // Credentials are write-only: left blank, they stay as they are.
    credentials::apply(fields, &mut body)?;
    destination::apply(fields, &mut body)?;
    Ok(body)
}

fn to_endpoint(app: &str, endpoint: &str) -> Response {
    Redirect::to(&format!("/app/{app}/endpoint/{endpoint}")).into_response()
}

/// Adds an endpoint (`POST /api/v1/app/{app}/endpoint`).
pub async fn create(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(app_id): Path<String>,
    form: Bytes,
) -> Result<Response, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    let call = async {
        let input = body(settings_json(&fields)?)?;
        endpoint::create_endpoint(State(state.clone()), viewer.principal.clone(), app.clone(), input).await
    };
    match call.await {
        Ok((_, created)) => Ok(to_endpoint(app.id.as_str(), &created.0.id)),
        Err(e) if !problems(&e).is_empty() => {
            let types = catalog::load(&state, &viewer.principal).await?;
            let draft = draft(&fields, problems(&e));
            Ok(new_page(&viewer, &app, &draft, &types, StatusCode::UNPROCESSABLE_ENTITY).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

/// Changes an endpoint's settings (`PATCH …/endpoint/{ep}`).
pub async fn update(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): EndpointPath,
    form: Bytes,
) -> Result<Response, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let scoped = VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?;
    let (app, existing) = scoped.clone().into_parts();
    let call = async {
        let input = body(settings_json(&fields)?)?;
        endpoint::patch_endpoint(State(state.clone()), viewer.principal.clone(), scoped, input).await
    };
    match call.await {
        Ok(_) => Ok(to_endpoint(app.id.as_str(), existing.id.as_str())),
        Err(e) if !problems(&e).is_empty() => {
            let credentials = endpoint::credentials_summary(&state, &existing);
            let mut draft = Draft { credentials, ..draft(&fields, problems(&e)) };
            let stored = DestinationDraft::of(endpoint::destination_shown(&state, &existing));
            draft.destination.password_set = stored.kind == draft.destination.kind && stored.password_set;
            let status = StatusCode::UNPROCESSABLE_ENTITY;
            Ok(endpoint_page(&state, &viewer, &app, &existing, &draft, Default::default(), status)
                .await?
                .into_response())
        }
        Err(e) => Err(e.into()),
    }
}

/// Disables or enables an endpoint (`PATCH …/endpoint/{ep}` with `disabled`).
pub async fn enabled(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): EndpointPath,
    form: Bytes,
) -> Result<Response, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let disabled = fields.get("enabled") != Some("true");
    let scoped = VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?;
    let input = body(json!({ "disabled": disabled }))?;
    let done = endpoint::patch_endpoint(State(state), viewer.principal.clone(), scoped, input).await?;
    Ok(to_endpoint(&app_id, &done.0.id))
}

/// Deletes an endpoint after a confirmation page (`DELETE …/endpoint/{ep}`).
pub async fn delete(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): EndpointPath,
    form: Bytes,
) -> Result<Response, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let scoped = VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?;
    let (app, existing) = (scoped.app().clone(), scoped.endpoint());
    if fields.get("confirmed") != Some("true") {
        let body = html! {
            p #confirm-delete { "Delete the endpoint " code { (existing.url) } "? Messages not yet delivered to it "
                "will not be, and its attempts stay in the log." }
            form.inline method="post" action={ "/app/" (app.id) "/endpoint/" (existing.id) "/delete" } {
                (view::csrf(&viewer.csrf))
                input type="hidden" name="confirmed" value="true";
                button.danger #confirm type="submit" { "Delete it" }
            }
            p { a href={ "/app/" (app.id) "/endpoint/" (existing.id) } { "Cancel" } }
        };
        return Ok(Page::of(&viewer, "Delete the endpoint?", body).into_response());
    }
    endpoint::delete_endpoint(State(state), scoped).await?;
    Ok(Redirect::to(&format!("/app/{}", app.id)).into_response())
}

/// Sets or removes one custom header (`PATCH …/headers`).
pub async fn headers(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): EndpointPath,
    form: Bytes,
) -> Result<Response, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let scoped = VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?;
    let name = fields.given("name").ok_or_else(|| ApiError::invalid("headers", "a header needs a name"))?;
    let value = match fields.get("remove") {
        Some("true") => Value::Null,
        _ => Value::String(fields.get("value").unwrap_or_default().to_owned()),
    };
    let input = body(json!({ "headers": { name: value } }))?;
    endpoint_ops::patch_headers(State(state), viewer.principal.clone(), scoped, input).await?;
    Ok(to_endpoint(&app_id, &endpoint_id))
}

/// Rotates the signing secret (`POST …/secret/rotate`); the old one keeps signing for the
/// configured overlap.
pub async fn rotate(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): EndpointPath,
    form: Bytes,
) -> Result<Response, Page> {
    Fields::checked(&viewer, &form)?;
    let scoped = VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?;
    endpoint_ops::rotate_secret(State(state), viewer.principal.clone(), scoped, body(json!({}))?).await?;
    Ok(to_endpoint(&app_id, &endpoint_id))
}

/// Sends a test event of a catalogued type (`POST …/send-example`) and shows its outcome.
pub async fn test_event(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): EndpointPath,
    form: Bytes,
) -> Result<Response, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let event_type = fields.given("event_type").unwrap_or("svix.ping");
    let scoped = VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?;
    let input = body(json!({ "eventType": event_type }))?;
    let sent = endpoint_ops::send_example(State(state), scoped, input).await?;
    Ok(Redirect::to(&format!("/app/{app_id}/endpoint/{endpoint_id}?test={}", sent.0.id)).into_response())
}

/// "Retry now" on an open circuit breaker (`POST …/health/retry`).
pub async fn retry(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): EndpointPath,
    form: Bytes,
) -> Result<Response, Page> {
    Fields::checked(&viewer, &form)?;
    let scoped = VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?;
    let _health = stats::retry_now(State(state), scoped).await?;
    Ok(to_endpoint(&app_id, &endpoint_id))
}
