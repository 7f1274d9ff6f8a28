//! An application's pollers in the portal and the dashboard: the list on the application's
//! page with the URL consumers read and where each consumer stands, a form that adds one,
//! and deletion after a confirmation. Each form calls the API handler with the viewer's
//! principal, so the tenant rules and every check are the API's.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde_json::json;

use super::form::{Fields, body, problems};
use super::names::small_id;
use super::view::{csrf, when};
use super::{Page, Viewer};
use crate::api::{ApiError, AppState, VisibleApp, VisiblePoller, poller};
use crate::store::{App, ConsumerState, PageQuery, Poller};

/// Pollers listed on the application's page at most.
const LISTED: usize = 50;
/// Consumers listed per poller at most (the most recently active).
const CONSUMERS_LISTED: usize = 10;

/// The application page's section: its pollers and the form that adds one.
pub async fn section(
    state: &AppState,
    app: &App,
    token: &str,
    refused: &[(Option<String>, String)],
) -> Result<Markup, Page> {
    let page = PageQuery { limit: LISTED, iterator: None, descending: false };
    let mut pollers = Vec::new();
    for p in state.store.list_pollers(&app.id, &page).await.map_err(ApiError::from)? {
        let consumers = state.store.consumers(&p.id, CONSUMERS_LISTED).await.map_err(ApiError::from)?;
        pollers.push((p, consumers));
    }
    let base = format!("/app/{}", app.id);
    let problem = |field: &str| {
        html! { @for (_, msg) in refused.iter().filter(|(f, _)| f.as_deref() == Some(field)) {
            p.error.field-error role="alert" { (msg) }
        } }
    };
    Ok(html! {
        h2 #pollers { "Pollers (read messages without a webhook endpoint)" }
        @if pollers.is_empty() { p.muted { "No pollers yet." } } @else {
            table.pollers {
                thead { tr { th { "Poller" } th { "Event types" } th { "Channels" } th { "Filter" } th { "Read from" } th { "Consumers" } th { "" } } }
                tbody { @for (p, consumers) in &pollers { (row(app, p, consumers, token)) } }
            }
        }
        form.settings #add-poller method="post" action={ (base) "/poller/new" } {
            (csrf(token))
            @for (_, msg) in refused.iter().filter(|(f, _)| f.is_none()) { p.error role="alert" { (msg) } }
            label for="poller_description" { "Description" }
            input #poller_description type="text" name="description";
            label for="poller_uid" { "Name (optional; usable in the URL instead of the id)" }
            input #poller_uid type="text" name="uid";
            (problem("uid"))
            label for="poller_event_types" { "Event types (comma-separated; empty: every event type)" }
            input #poller_event_types type="text" name="event_types";
            (problem("eventTypes"))
            label for="poller_channels" { "Channels (comma-separated; empty: every channel)" }
            input #poller_channels type="text" name="channels";
            (problem("channels"))
            label for="poller_filter" { "Filter (jq; a message is held only if this yields true; empty: every message)" }
            textarea #poller_filter name="filter" rows="2" spellcheck="false" {}
            (problem("filter"))
            button type="submit" { "Add a poller" }
        }
    })
}

fn row(app: &App, p: &Poller, consumers: &[ConsumerState], token: &str) -> Markup {
    let list = |items: &Option<Vec<String>>| items.as_ref().map_or("all".to_owned(), |v| v.join(", "));
    let key = p.uid.clone().unwrap_or_else(|| p.id.to_string());
    html! {
        tr {
            td {
                (if p.description.is_empty() { key.clone() } else { p.description.clone() })
                br; (small_id(p.id.as_str()))
            }
            td { (list(&p.event_types)) }
            td { (list(&p.channels)) }
            td { @if let Some(filter) = &p.filter { code { (filter) } } @else { "none" } }
            td { code.url { "GET /api/v1/app/" (app.id) "/poller/" (key) "/consumer/{name}" } }
            td.consumers {
                @if consumers.is_empty() { span.muted { "none has acknowledged a page yet" } } @else {
                    ul { @for c in consumers { li { code { (c.name) } " moved " (when(Some(c.moved_at))) } } }
                }
            }
            td {
                form.inline method="post" action={ "/app/" (app.id) "/poller/" (p.id) "/delete" } {
                    (csrf(token))
                    button.danger type="submit" { "Delete" }
                }
            }
        }
    }
}

/// Adds a poller (`POST /api/v1/app/{app}/poller`); a refusal shows the application's
/// page again with the API's reasons next to the fields.
pub async fn create(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(app_id): Path<String>,
    form: Bytes,
) -> Result<Response, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    let input = json!({
        "description": fields.get("description").unwrap_or_default(),
        "uid": fields.given("uid"),
        "eventTypes": fields.list("event_types"),
        "channels": fields.list("channels"),
        "filter": fields.given("filter"),
    });
    let call = async { poller::create_poller(State(state.clone()), app.clone(), body(input)?).await };
    match call.await {
        Ok(_) => Ok(Redirect::to(&format!("/app/{}#pollers", app.id)).into_response()),
        Err(e) if !problems(&e).is_empty() => {
            let refused = problems(&e);
            let body = html! {
                p { a href={ "/app/" (app.id) } { "← " (app.name) } }
                (section(&state, &app, &viewer.csrf, &refused).await?)
            };
            Ok(Page::of(&viewer, "Add a poller", body).with_status(StatusCode::UNPROCESSABLE_ENTITY).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

/// Deletes a poller and its consumers' positions, after a confirmation.
pub async fn delete(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, poller_id)): Path<(String, String)>,
    form: Bytes,
) -> Result<Response, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let scoped = VisiblePoller::resolve(&state, &viewer.principal, &app_id, &poller_id).await?;
    let existing = poller::get_poller(scoped.clone()).await?.0;
    if fields.get("confirmed") != Some("true") {
        let body = html! {
            p #confirm-delete { "Delete the poller " code { (existing.uid.clone().unwrap_or(existing.id.clone())) }
                "? Its consumers' positions go with it; the messages stay." }
            form.inline method="post" action={ "/app/" (app_id) "/poller/" (existing.id) "/delete" } {
                (csrf(&viewer.csrf))
                input type="hidden" name="confirmed" value="true";
                button.danger #confirm type="submit" { "Delete it" }
            }
            p { a href={ "/app/" (app_id) "#pollers" } { "Cancel" } }
        };
        return Ok(Page::of(&viewer, "Delete the poller?", body).into_response());
    }
    poller::delete_poller(State(state), scoped).await?;
    Ok(Redirect::to(&format!("/app/{app_id}#pollers")).into_response())
}
