//! The dashboard's state-changing forms: replay one message to one endpoint, replay an
//! endpoint's dead letters in a time range, and the filtered bulk replay (a count first,
//! then the replay after confirmation). Each checks the session's CSRF token.

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use super::view::csrf;
use super::{Page, Viewer};
use crate::api::{ApiError, AppState, VisibleApp, VisibleEndpoint, VisibleMessage, portal_access};
use crate::clock::Millis;
use crate::store::{DeadLetterFilter, Requeue};

#[derive(Deserialize)]
pub struct CsrfOnly {
    csrf: String,
}

/// Svix `resend`: the message to that endpoint again, as a manual attempt.
pub async fn resend(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, msg_id, endpoint_id)): Path<(String, String, String)>,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, Page> {
    viewer.check_csrf(&form.csrf)?;
    let (app, message) = VisibleMessage::resolve(&state, &viewer.principal, &app_id, &msg_id).await?.into_parts();
    let (_, endpoint) =
        VisibleEndpoint::resolve(&state, &viewer.principal, app.id.as_str(), &endpoint_id).await?.into_parts();
    let request = Requeue::Resend { app: app.id.clone(), msg: message.id.clone(), endpoint: endpoint.id };
    state.store.requeue(request).await.map_err(ApiError::from)?;
    state.dispatcher.poke();
    Ok(Redirect::to(&format!("/app/{}/msg/{}", app.id, message.id)).into_response())
}

#[derive(Deserialize)]
pub struct RecoverForm {
    csrf: String,
    since: String,
    until: Option<String>,
}

/// Svix `recover`: the endpoint's dead letters from `since` on, back in the queue.
pub async fn recover(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    Form(form): Form<RecoverForm>,
) -> Result<Response, Page> {
    viewer.check_csrf(&form.csrf)?;
    let (app, endpoint) =
        VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?.into_parts();
    let since = time("since", Some(&form.since))?.unwrap_or(0);
    let until = time("until", form.until.as_deref())?.unwrap_or(i64::MAX);
    let request = Requeue::Recover { endpoint: endpoint.id, since, until };
    state.store.requeue(request).await.map_err(ApiError::from)?;
    state.dispatcher.poke();
    Ok(Redirect::to(&format!("/app/{}", app.id)).into_response())
}

#[derive(Deserialize, Clone)]
pub struct BulkForm {
    csrf: String,
    status_code: Option<String>,
    error_class: Option<String>,
    event_type: Option<String>,
    since: Option<String>,
    until: Option<String>,
    confirmed: Option<String>,
}

/// The filtered bulk replay: unconfirmed, it shows how many dead letters match and asks;
/// confirmed, it starts the background task and shows its progress.
pub async fn bulk_replay(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(app_id): Path<String>,
    Form(form): Form<BulkForm>,
) -> Result<Response, Page> {
    viewer.check_csrf(&form.csrf)?;
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    let given = |v: &Option<String>| v.clone().filter(|s| !s.trim().is_empty());
    let status_code = match given(&form.status_code) {
        Some(code) => {
            Some(code.trim().parse::<u16>().map_err(|_| ApiError::invalid("status_code", "is not a number"))?)
        }
        None => None,
    };
    let filter = DeadLetterFilter {
        app: Some(app.id.clone()),
        endpoint: None,
        dead_since: time("since", given(&form.since).as_deref())?.unwrap_or(0),
        dead_until: time("until", given(&form.until).as_deref())?,
        status_code,
        error_class: given(&form.error_class),
        event_type: given(&form.event_type),
        limit: 100_000,
    };
    let ids: Vec<i64> =
        state.store.dead_letters(&filter).await.map_err(ApiError::from)?.iter().map(|d| d.delivery_id).collect();
    if form.confirmed.as_deref() != Some("true") {
        let keep = |name: &str, value: &Option<String>| {
            html! { input type="hidden" name=(name) value=(value.clone().unwrap_or_default()); }
        };
        let body = html! {
            p #dry-run-count { @if ids.len() == 1 { "1 dead letter matches." } @else { (ids.len()) " dead letters match." } }
            form method="post" action={ "/app/" (app.id) "/replay" } {
                (csrf(&viewer.csrf))
                (keep("status_code", &form.status_code)) (keep("error_class", &form.error_class))
                (keep("event_type", &form.event_type)) (keep("since", &form.since)) (keep("until", &form.until))
                input type="hidden" name="confirmed" value="true";
                button #confirm-replay type="submit" disabled[ids.is_empty()] { "Replay " (ids.len()) " dead letters" }
            }
            p { a href={ "/app/" (app.id) } { "Cancel" } }
        };
        return Ok(Page::of(&viewer, "Replay dead letters", body).into_response());
    }
    let task = state.replays.start(state.store.clone(), state.dispatcher.clone(), app.id.clone(), ids);
    Ok(Redirect::to(&format!("/app/{}/replay/{}", app.id, task.id)).into_response())
}

/// Revokes every portal link of the application (`POST /api/v1/auth/app/{app}/expire-all`);
/// the operator's only.
pub async fn revoke_portal_links(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(app_id): Path<String>,
    Form(form): Form<CsrfOnly>,
) -> Result<Response, Page> {
    viewer.check_csrf(&form.csrf)?;
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    portal_access::expire_all(State(state), viewer.principal.clone(), app.clone(), Default::default()).await?;
    Ok(Redirect::to(&format!("/app/{}", app.id)).into_response())
}

/// A form's time field (RFC 3339, or a `datetime-local` value read as UTC); left empty, it
/// is not given.
fn time(field: &str, raw: Option<&str>) -> Result<Option<Millis>, Page> {
    match raw.map(str::trim).filter(|r| !r.is_empty()) {
        None => Ok(None),
        Some(raw) => match super::pages::form_time(Some(raw)) {
            Some(at) => Ok(Some(at)),
            None => Err(ApiError::invalid(field, "is not a time (2026-12-01T14:30, or RFC 3339)").into()),
        },
    }
}
