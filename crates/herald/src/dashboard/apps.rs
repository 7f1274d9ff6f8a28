//! Applications: the operator's list, and an application's page (its endpoints' health, its
//! charts, dead letters and their replay, its portal links, its messages).

use axum::extract::{Path, Query, State};
use maud::{Markup, html};
use serde::Deserialize;

use super::names::{Names, endpoint_name, small_id};
use super::pages::{Pager, dead_letter_rows, dead_letter_table, form_time, page_of};
use super::pollers;
use super::trends::{self, Window};
use super::view::{circuit_label, csrf, ms, when};
use super::{Page, Viewer};
use crate::api::{ApiError, AppState, Principal, VisibleApp};
use crate::breaker::BreakerState;
use crate::clock::now_ms;
use crate::health;
use crate::ids::EndpointId;
use crate::store::{App, MessageFilter};

#[derive(Deserialize, Default)]
pub struct ListQuery {
    next: Option<String>,
}

pub async fn list(State(state): State<AppState>, viewer: Viewer, Query(q): Query<ListQuery>) -> Result<Page, Page> {
    viewer.principal.require_admin()?;
    let pager = Pager::new(q.next.as_deref());
    let apps = state.store.list_apps(&pager.query()).await.map_err(ApiError::from)?;
    let (apps, next) = pager.cut(apps, |a| a.id.to_string());
    let mut endpoints = Vec::with_capacity(apps.len());
    for app in &apps {
        endpoints.push(state.catalog.targets_of(&app.id).await.map(|t| t.len()).unwrap_or(0));
    }
    let body = html! {
        table.apps {
            thead { tr { th { "Application" } th { "uid" } th { "Endpoints" } th { "Created" } } }
            tbody { @for (app, endpoints) in apps.iter().zip(&endpoints) {
                tr { td { a href={ "/app/" (app.id) } { (app.name) } br; (small_id(app.id.as_str())) }
                     td { (app.uid.clone().unwrap_or_default()) } td { (endpoints) } td { (when(Some(app.created_at))) } }
            } }
        }
        (pager.links("/apps", &[], next.as_deref()))
    };
    Ok(Page::of(&viewer, "Applications", body))
}

#[derive(Deserialize, Default)]
pub struct AppQuery {
    window: Option<String>,
    /// The endpoints' page.
    endpoints_next: Option<String>,
    event_type: Option<String>,
    channel: Option<String>,
    after: Option<String>,
    before: Option<String>,
    next: Option<String>,
}

/// An application: its endpoints' health, its charts (summed over its endpoints), its
/// dead letters and the bulk replay form, its pollers, its portal links (the operator's),
/// its messages.
pub async fn page(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(app_id): Path<String>,
    Query(q): Query<AppQuery>,
) -> Result<Page, Page> {
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    let ids: Vec<EndpointId> = state
        .catalog
        .targets_of(&app.id)
        .await
        .map_err(ApiError::from)?
        .iter()
        .map(|t| t.endpoint.id.clone())
        .collect();
    let endpoint_pager = Pager::named("endpoints_next", q.endpoints_next.as_deref());
    let listed = state.store.list_endpoints(&app.id, &endpoint_pager.query()).await.map_err(ApiError::from)?;
    let (endpoints, endpoints_next) = endpoint_pager.cut(listed, |e| e.id.to_string());
    let window = Window::from_query(q.window.as_deref());
    let base = format!("/app/{}", app.id);
    let dead = dead_letter_rows(&state, Some(&app.id), None).await?;
    let names = Names::of(&state, dead.iter().map(|r| &r.endpoint_id), [&app.id]).await;
    let body = html! {
        p.muted { (small_id(app.id.as_str())) @if let Some(uid) = &app.uid { " · uid " (uid) } }
        h2 { "Endpoints" }
        p { a.button #add-endpoint href={ (base) "/endpoint/new" } { "Add an endpoint" } " "
            a href={ (base) "/event-types" } { "Event catalog" } " · " a href={ (base) "/log" } { "Delivery log" } }
        (endpoint_table(&state, &app, &endpoints).await?)
        (endpoint_pager.links(&base, &[], endpoints_next.as_deref()))
        (trends::switch(&base, window, "last 24 hours"))
        (trends::deliveries(&state, &ids, window, "app").await?)
        h2 { "Dead letters, last 24 hours" }
        (dead_letter_table(&dead, &names, true, &viewer.csrf))
        h2 { "Replay dead letters by filter" }
        (replay_form(&base, &viewer.csrf))
        (pollers::section(&state, &app, &viewer.csrf, &[]).await?)
        @if viewer.principal == Principal::Admin { (portal_links(&state, &app, &viewer.csrf).await?) }
        h2 #messages { "Messages" }
        (messages(&state, &app, &q).await?)
    };
    Ok(Page::of(&viewer, &app.name, body))
}

/// Each endpoint with its circuit, latency, success rate and last attempt.
async fn endpoint_table(state: &AppState, app: &App, endpoints: &[crate::store::Endpoint]) -> Result<Markup, Page> {
    let err = ApiError::from;
    let now = now_ms();
    let breakers = health::breakers(&*state.store, &state.dispatcher, None).await.map_err(err)?;
    let ids: Vec<_> = endpoints.iter().map(|e| e.id.clone()).collect();
    let latency = health::latency(&*state.store, &state.dispatcher, Some(&ids), now).await.map_err(err)?;
    let mut rows = vec![];
    for endpoint in endpoints {
        let stats =
            state.store.endpoint_stats(&endpoint.id, Some(now - super::pages::DAY_MS), None).await.map_err(err)?;
        let tried = stats.success + stats.fail;
        let rate = (tried > 0).then(|| format!("{:.1} %", 100.0 * stats.success as f64 / tried as f64));
        let circuit = breakers.get(&endpoint.id).map_or(BreakerState::Closed, |b| b.state);
        let lat = latency.get(&endpoint.id).map(|h| h.summary()).unwrap_or_default();
        let filter = crate::store::AttemptFilter::of_endpoint(&app.id, &endpoint.id, false);
        let last = state.store.list_attempts(&filter, &page_of(1)).await.map_err(err)?.first().map(|a| a.created_at);
        rows.push((endpoint, circuit, lat, rate, last));
    }
    let base = format!("/app/{}", app.id);
    Ok(html! {
        @if rows.is_empty() { p.muted { "No endpoints yet." } } @else {
            table.endpoints {
                thead { tr { th { "Endpoint" } th { "Circuit" } th { "p50" } th { "p95" } th { "p99" }
                     th { "Success, 24 h" } th { "Last attempt" } } }
                tbody { @for (endpoint, circuit, lat, rate, last) in &rows {
                    tr {
                        td {
                            a href={ (base) "/endpoint/" (endpoint.id) } { (endpoint_name(endpoint)) }
                            @if !endpoint.description.is_empty() { br; span.url { (endpoint.url) } }
                            br; (small_id(endpoint.id.as_str()))
                            @if endpoint.disabled { br; span.error { "disabled" } }
                        }
                        td { span class={ "state-" (circuit_label(*circuit)) } { (circuit_label(*circuit)) } }
                        td { (ms(lat.p50_ms)) } td { (ms(lat.p95_ms)) } td { (ms(lat.p99_ms)) }
                        td { (rate.clone().unwrap_or_else(|| "—".into())) }
                        td { (when(*last)) }
                    }
                } }
            }
        }
    })
}

fn replay_form(base: &str, token: &str) -> Markup {
    html! {
        form.filters method="post" action={ (base) "/replay" } {
            (csrf(token))
            div { label for="replay-status" { "Status code" } input #replay-status type="number" name="status_code" min="0" max="599"; }
            div { label for="replay-class" { "Error class" } input #replay-class type="text" name="error_class" placeholder="http_status, timeout…"; }
            div { label for="replay-type" { "Event type" } input #replay-type type="text" name="event_type"; }
            div { label for="replay-since" { "Dead since (UTC)" } input #replay-since type="datetime-local" name="since"; }
            div { label for="replay-until" { "Dead until (UTC)" } input #replay-until type="datetime-local" name="until"; }
            input type="hidden" name="confirmed" value="false";
            button type="submit" { "Count matching dead letters" }
        }
    }
}

/// The application's live portal links, and a button that revokes them all.
async fn portal_links(state: &AppState, app: &App, token: &str) -> Result<Markup, Page> {
    let tokens = state.store.app_tokens(&app.id, now_ms()).await.map_err(ApiError::from)?;
    Ok(html! {
        h2 { "Portal links" }
        @if tokens.is_empty() { p.muted #portal-links { "No portal link is valid now." } } @else {
            p #portal-links { (tokens.len()) " valid; the last expires " (when(tokens.iter().map(|t| t.expires_at).max())) "." }
            form.inline method="post" action={ "/app/" (app.id) "/portal-links/revoke" } {
                (csrf(token))
                button.danger #revoke-links type="submit" { "Revoke every portal link" }
                span.muted { " Customers signed in with them are signed out." }
            }
        }
    })
}

/// The application's messages, filtered and paged.
async fn messages(state: &AppState, app: &App, q: &AppQuery) -> Result<Markup, Page> {
    let filter = MessageFilter {
        channel: q.channel.clone().filter(|c| !c.trim().is_empty()),
        event_types: q.event_type.clone().filter(|t| !t.trim().is_empty()).into_iter().collect(),
        after: form_time(q.after.as_deref()),
        before: form_time(q.before.as_deref()),
    };
    let pager = Pager::new(q.next.as_deref());
    let found = state.store.list_messages(&app.id, &filter, &pager.query()).await.map_err(ApiError::from)?;
    let (messages, next) = pager.cut(found, |m| m.id.to_string());
    let base = format!("/app/{}", app.id);
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    let (event_type, channel, after, before) =
        (value(&q.event_type), value(&q.channel), value(&q.after), value(&q.before));
    let params = [("event_type", event_type.as_str()), ("channel", &channel), ("after", &after), ("before", &before)];
    Ok(html! {
        form.filters method="get" action={ (base) "#messages" } {
            div { label for="msg-type" { "Event type" } input #msg-type type="text" name="event_type" value=(event_type); }
            div { label for="msg-channel" { "Channel" } input #msg-channel type="text" name="channel" value=(channel); }
            div { label for="msg-after" { "After (UTC)" } input #msg-after type="datetime-local" name="after" value=(after); }
            div { label for="msg-before" { "Before (UTC)" } input #msg-before type="datetime-local" name="before" value=(before); }
            button type="submit" { "Filter" }
        }
        table.messages {
            thead { tr { th { "Message" } th { "Event type" } th { "Event id" } th { "Channels" } th { "Accepted" } } }
            tbody { @for m in &messages {
                tr { td { a href={ (base) "/msg/" (m.id) } { (m.id) } } td { (m.event_type) }
                     td { (m.event_id.clone().unwrap_or_default()) }
                     td { (m.channels.clone().unwrap_or_default().join(", ")) } td { (when(Some(m.created_at))) } }
            } }
        }
        (pager.links(&base, &params, next.as_deref()))
    })
}
