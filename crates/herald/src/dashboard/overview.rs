//! The operator's pages across applications: the overview (queue summary, charts, slow
//! endpoints, dead letters), the dead-letter page, and the search by message id, event id,
//! endpoint URL or application name.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::names::{Names, endpoint_name, small_id};
use super::pages::{dead_letter_names, dead_letter_rows, dead_letter_table};
use super::trends::{self, Window};
use super::view::{live, ms, when};
use super::{Page, Viewer};
use crate::api::{ApiError, AppState, Principal};
use crate::clock::now_ms;

/// Hits of each kind the search shows at most.
const SEARCH_LIMIT: usize = 50;

#[derive(Deserialize, Default)]
pub struct WindowQuery {
    window: Option<String>,
}

/// The operator's overview; a customer goes to its application.
pub async fn home(
    State(state): State<AppState>,
    viewer: Viewer,
    Query(q): Query<WindowQuery>,
) -> Result<Response, Page> {
    if let Principal::App { app_id, .. } = &viewer.principal {
        return Ok(Redirect::to(&format!("/app/{app_id}")).into_response());
    }
    let window = Window::from_query(q.window.as_deref());
    let s = state.store.summary(now_ms()).await.map_err(ApiError::from)?;
    let avg = (s.delivered_last_hour > 0).then(|| s.delivery_ms_last_hour as f64 / s.delivered_last_hour as f64);
    let cards: [(&str, Markup); 8] = [
        ("pending", html! { (s.pending) }),
        ("awaiting retry", html! { (s.awaiting_retry) }),
        ("in flight (this process)", html! { (state.dispatcher.in_flight()) }),
        ("dead letters", html! { (s.dead) }),
        ("delivered, last hour", html! { (s.delivered_last_hour) }),
        ("failed attempts, last hour", html! { (s.failed_last_hour) }),
        ("oldest pending", when(s.oldest_pending_at)),
        ("avg delivery, last hour", html! { (ms(avg)) }),
    ];
    let charts = trends::server(&state, window).await?;
    let dead = dead_letter_rows(&state, None, None).await?;
    let names = dead_letter_names(&state, &dead).await;
    let body = html! {
        @if window == Window::Short { (live(15)) }
        (search_form(""))
        div.cards #summary {
            @for (label, value) in &cards { div.card { div.n { (value) } div.l { (label) } } }
        }
        (trends::switch("/", window, "last hour"))
        (charts)
        h2 { "Dead letters, last 24 hours" }
        (dead_letter_table(&dead, &names, false, &viewer.csrf))
    };
    Ok(Page::of(&viewer, "Overview", body).into_response())
}

pub async fn dead_letters(State(state): State<AppState>, viewer: Viewer) -> Result<Page, Page> {
    viewer.principal.require_admin()?;
    let rows = dead_letter_rows(&state, None, None).await?;
    let names = dead_letter_names(&state, &rows).await;
    Ok(Page::of(&viewer, "Dead letters, last 24 hours", dead_letter_table(&rows, &names, false, &viewer.csrf)))
}

fn search_form(q: &str) -> Markup {
    html! {
        form.filters.search role="search" method="get" action="/search" {
            div {
                label for="search-q" { "Find a message id, event id, endpoint URL or application" }
                input #search-q type="search" name="q" value=(q) required placeholder="msg_…, evt-42, hooks.acme.example, Acme";
            }
            button type="submit" { "Search" }
        }
    }
}

#[derive(Deserialize, Default)]
pub struct SearchQuery {
    #[serde(default)]
    q: String,
}

/// The operator's search: messages by id or event id (in any application), endpoints by
/// URL, applications by name, id or uid.
pub async fn search(State(state): State<AppState>, viewer: Viewer, Query(q): Query<SearchQuery>) -> Result<Page, Page> {
    viewer.principal.require_admin()?;
    let text = q.q.trim();
    if text.is_empty() {
        return Ok(Page::of(&viewer, "Search", search_form("")));
    }
    let messages = state.store.find_messages(text, SEARCH_LIMIT).await.map_err(ApiError::from)?;
    let (apps, endpoints) = state.store.search_catalog(text, SEARCH_LIMIT).await.map_err(ApiError::from)?;
    let names = Names::of(&state, endpoints.iter().map(|e| &e.id), messages.iter().map(|m| &m.app_id)).await;
    let found = messages.len() + apps.len() + endpoints.len();
    let body = html! {
        (search_form(text))
        p.muted #search-count role="status" { (found) " found" }
        @if !messages.is_empty() {
            h2 { "Messages" }
            table.messages {
                thead { tr { th { "Message" } th { "Application" } th { "Event type" } th { "Event id" } th { "Accepted" } } }
                tbody { @for m in &messages {
                    tr { td { a href={ "/app/" (m.app_id) "/msg/" (m.id) } { (m.id) } } td { (names.app(&m.app_id)) }
                         td { (m.event_type) } td { (m.event_id.clone().unwrap_or_default()) } td { (when(Some(m.created_at))) } }
                } }
            }
        }
        @if !endpoints.is_empty() {
            h2 { "Endpoints" }
            table.endpoints {
                thead { tr { th { "Endpoint" } th { "Application" } th { "URL" } } }
                tbody { @for e in &endpoints {
                    tr { td { a href={ "/app/" (e.app_id) "/endpoint/" (e.id) } { (endpoint_name(e)) } br; (small_id(e.id.as_str())) }
                         td { (names.app(&e.app_id)) } td { span.url { (e.url) } } }
                } }
            }
        }
        @if !apps.is_empty() {
            h2 { "Applications" }
            table.apps {
                thead { tr { th { "Application" } th { "uid" } th { "Created" } } }
                tbody { @for a in &apps {
                    tr { td { a href={ "/app/" (a.id) } { (a.name) } br; (small_id(a.id.as_str())) }
                         td { (a.uid.clone().unwrap_or_default()) } td { (when(Some(a.created_at))) } }
                } }
            }
        }
    };
    Ok(Page::of(&viewer, &format!("Search: {text}"), body))
}
