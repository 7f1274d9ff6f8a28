//! The dashboard's pages: each gathers what its viewer may see (through the same scoping
//! as the API) and renders it.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;

use super::view::{self, Nav, csrf, live, ms, time, when};
use super::{Page, Viewer};
use crate::api::{AppState, Principal, visible_app, visible_message};
use crate::breaker::BreakerState;
use crate::clock::{Millis, now_ms, parse_time};
use crate::dead_letters::{EndpointDeadLetters, analyse};
use crate::health;
use crate::latency::MIN_SAMPLES;
use crate::store::{AttemptFilter, DeadLetterFilter, MessageFilter, PageQuery};

/// Endpoints listed as slow on the overview above this p95.
const SLOW_P95_MS: f64 = 2000.0;
const DAY_MS: Millis = 24 * 3_600_000;

pub fn nav_for(viewer: &Viewer) -> Nav<'_> {
    let app = match &viewer.principal {
        Principal::App { app_id, .. } => Some(app_id.as_str()),
        Principal::Admin => None,
    };
    Nav { csrf: &viewer.csrf, admin: viewer.principal == Principal::Admin, app }
}

fn page(viewer: &Viewer, title: &str, body: Markup) -> Page {
    Page::ok(view::layout(title, Some(nav_for(viewer)), body))
}

pub(super) fn page_of(limit: usize) -> PageQuery {
    PageQuery { limit, iterator: None, descending: true }
}

/// The operator's overview; a portal viewer goes to its application.
pub async fn home(State(state): State<AppState>, viewer: Viewer) -> Result<Response, Page> {
    if let Principal::App { app_id, .. } = &viewer.principal {
        return Ok(Redirect::to(&format!("/app/{app_id}")).into_response());
    }
    let now = now_ms();
    let s = state.store.summary(now).await.map_err(crate::api::ApiError::from)?;
    let avg = (s.delivered_last_hour > 0).then(|| s.delivery_ms_last_hour as f64 / s.delivered_last_hour as f64);
    let cards = [
        ("pending", s.pending.to_string()),
        ("awaiting retry", s.awaiting_retry.to_string()),
        ("in flight (this process)", state.dispatcher.in_flight().to_string()),
        ("dead letters", s.dead.to_string()),
        ("delivered, last hour", s.delivered_last_hour.to_string()),
        ("failed attempts, last hour", s.failed_last_hour.to_string()),
        ("oldest pending", time(s.oldest_pending_at)),
        ("avg delivery, last hour", ms(avg)),
    ];
    let slow = slow_endpoints(&state, now).await?;
    let dead = dead_letter_rows(&state, None).await?;
    let body = html! {
        (live())
        div.cards #summary {
            @for (label, value) in &cards { div.card { div.n { (value) } div.l { (label) } } }
        }
        h2 { "Slow endpoints (p95 above " (SLOW_P95_MS) " ms)" }
        @if slow.is_empty() { p.muted { "None." } } @else {
            table { tr { th { "Endpoint" } th { "Application" } th { "p50" } th { "p95" } th { "p99" } th { "Samples" } }
                @for (endpoint, app, p50, p95, p99, n) in &slow {
                    tr { td { (endpoint) } td { a href={ "/app/" (app) } { (app) } } td { (ms(*p50)) } td { (ms(*p95)) }
                         td { (ms(*p99)) } td { (n) } }
                }
            }
        }
        h2 { "Dead letters, last 24 hours" }
        (dead_letter_table(&dead, None, &viewer.csrf))
    };
    Ok(page(&viewer, "Overview", body).into_response())
}

async fn slow_endpoints(
    state: &AppState,
    now: Millis,
) -> Result<Vec<(String, String, Option<f64>, Option<f64>, Option<f64>, u64)>, Page> {
    let latency =
        health::latency(&*state.store, &state.dispatcher, None, now).await.map_err(crate::api::ApiError::from)?;
    let mut out = Vec::new();
    for (endpoint, histogram) in latency {
        let s = histogram.summary();
        if s.sample_count < MIN_SAMPLES || s.p95_ms.is_none_or(|p| p <= SLOW_P95_MS) {
            continue;
        }
        if let Ok(Some(target)) = state.catalog.target(&endpoint).await {
            out.push((
                endpoint.to_string(),
                target.endpoint.app_id.to_string(),
                s.p50_ms,
                s.p95_ms,
                s.p99_ms,
                s.sample_count,
            ));
        }
    }
    out.sort_by(|a, b| b.3.partial_cmp(&a.3).unwrap_or(std::cmp::Ordering::Equal));
    Ok(out)
}

async fn dead_letter_rows(state: &AppState, app: Option<&crate::ids::AppId>) -> Result<Vec<EndpointDeadLetters>, Page> {
    let filter =
        DeadLetterFilter { app: app.cloned(), dead_since: now_ms() - DAY_MS, limit: 100_000, ..Default::default() };
    let letters = state.store.dead_letters(&filter).await.map_err(crate::api::ApiError::from)?;
    Ok(analyse(&letters))
}

/// The analysis with its hints; inside an application, each row can recover its endpoint.
fn dead_letter_table(rows: &[EndpointDeadLetters], app: Option<&str>, csrf_token: &str) -> Markup {
    html! {
        @if rows.is_empty() { p.muted { "No dead letters." } } @else {
            table.dead-letters {
                tr { th { "Endpoint" } th { "Dead" } th { "Pattern" } th { "Primary error" } th { "Status" }
                     th { "First" } th { "Last" } th { "Avg attempts" } th { "" } }
                @for row in rows {
                    tr {
                        td { (row.endpoint_id) br; a href={ "/app/" (row.app_id) } { (row.app_id) } }
                        td { (row.dead_count) }
                        td { strong { (format!("{:?}", row.pattern)) } br; span.hint { (row.hint) } }
                        td { (row.primary_error) @if let Some(m) = &row.primary_error_message { br; span.muted { (m) } } }
                        td { (row.primary_status_code.map(|c| c.to_string()).unwrap_or_default()) }
                        td { (when(Some(row.first_dead_at))) }
                        td { (when(Some(row.last_dead_at))) }
                        td { (format!("{:.1}", row.avg_attempts)) }
                        td {
                            @if let Some(app) = app {
                                form method="post" action={ "/app/" (app) "/endpoint/" (row.endpoint_id) "/recover" } {
                                    (csrf(csrf_token))
                                    input type="hidden" name="since" value=(crate::clock::to_rfc3339(row.first_dead_at - 1));
                                    button type="submit" { "Replay this range" }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub async fn apps(State(state): State<AppState>, viewer: Viewer) -> Result<Page, Page> {
    viewer.principal.require_admin()?;
    let apps = state.store.list_apps(&page_of(250)).await.map_err(crate::api::ApiError::from)?;
    let body = html! {
        table { tr { th { "Application" } th { "Name" } th { "uid" } th { "Created" } }
            @for app in &apps {
                tr { td { a href={ "/app/" (app.id) } { (app.id) } } td { (app.name) }
                     td { (app.uid.clone().unwrap_or_default()) } td { (when(Some(app.created_at))) } }
            }
        }
    };
    Ok(page(&viewer, "Applications", body))
}

pub async fn dead_letters(State(state): State<AppState>, viewer: Viewer) -> Result<Page, Page> {
    viewer.principal.require_admin()?;
    let rows = dead_letter_rows(&state, None).await?;
    Ok(page(&viewer, "Dead letters, last 24 hours", dead_letter_table(&rows, None, &viewer.csrf)))
}

#[derive(Deserialize, Default)]
pub struct MessageQuery {
    event_type: Option<String>,
    channel: Option<String>,
    after: Option<String>,
    before: Option<String>,
}

/// An application: its endpoints' health, its messages (filtered), its dead letters and
/// the bulk replay form.
pub async fn app(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(app_id): Path<String>,
    Query(q): Query<MessageQuery>,
) -> Result<Page, Page> {
    let app = visible_app(&state, &viewer.principal, &app_id).await?;
    let now = now_ms();
    let err = crate::api::ApiError::from;
    let endpoints = state.store.app_endpoints(&app.id).await.map_err(err)?;
    let breakers = health::breakers(&*state.store, &state.dispatcher, None).await.map_err(err)?;
    let latency = health::latency(&*state.store, &state.dispatcher, None, now).await.map_err(err)?;
    let mut rows = Vec::new();
    for endpoint in &endpoints {
        let stats = state.store.endpoint_stats(&endpoint.id, None, None).await.map_err(err)?;
        let tried = stats.success + stats.fail;
        let rate = (tried > 0).then(|| 100.0 * stats.success as f64 / tried as f64);
        let circuit = breakers.get(&endpoint.id).map_or(BreakerState::Closed, |b| b.state);
        let lat = latency.get(&endpoint.id).map(|h| h.summary()).unwrap_or_default();
        rows.push((endpoint, circuit, lat, rate));
    }
    let filter = MessageFilter {
        channel: q.channel.clone().filter(|c| !c.is_empty()),
        event_types: q.event_type.clone().filter(|t| !t.is_empty()).into_iter().collect(),
        after: q.after.as_deref().and_then(parse_time),
        before: q.before.as_deref().and_then(parse_time),
    };
    let messages = state.store.list_messages(&app.id, &filter, &page_of(50)).await.map_err(err)?;
    let dead = dead_letter_rows(&state, Some(&app.id)).await?;
    let base = format!("/app/{}", app.id);
    let body = html! {
        p.muted { (app.id) @if let Some(uid) = &app.uid { " · uid " (uid) } }
        h2 { "Endpoints" }
        p { a.button #add-endpoint href={ (base) "/endpoint/new" } { "Add an endpoint" } " "
            a href={ (base) "/event-types" } { "Event catalog" } }
        table.endpoints {
            tr { th { "Endpoint" } th { "URL" } th { "Circuit" } th { "p50" } th { "p95" } th { "p99" } th { "Success" } }
            @for (endpoint, circuit, lat, rate) in &rows {
                tr {
                    td {
                        a href={ (base) "/endpoint/" (endpoint.id) } {
                            @if endpoint.description.is_empty() { "Endpoint" } @else { (endpoint.description) }
                        }
                        br; span.id { (endpoint.id) }
                        @if endpoint.disabled { br; span.error { "disabled" } }
                    }
                    td { (endpoint.url) }
                    td { span class={ "state-" (format!("{circuit:?}").to_lowercase().replace("halfopen", "halfOpen")) } {
                        (format!("{circuit:?}")) } }
                    td { (ms(lat.p50_ms)) } td { (ms(lat.p95_ms)) } td { (ms(lat.p99_ms)) }
                    td { (rate.map(|r| format!("{r:.1} %")).unwrap_or_else(|| "—".into())) }
                }
            }
        }
        h2 { "Dead letters, last 24 hours" }
        (dead_letter_table(&dead, Some(app.id.as_str()), &viewer.csrf))
        h2 { "Replay dead letters by filter" }
        form.filters method="post" action={ (base) "/replay" } {
            (csrf(&viewer.csrf))
            div { label { "Status code" } input type="number" name="status_code" min="0" max="599"; }
            div { label { "Error class" } input type="text" name="error_class" placeholder="http_status, timeout…"; }
            div { label { "Event type" } input type="text" name="event_type"; }
            div { label { "Dead since (RFC 3339)" } input type="text" name="since"; }
            div { label { "Dead until (RFC 3339)" } input type="text" name="until"; }
            input type="hidden" name="confirmed" value="false";
            button type="submit" { "Count matching dead letters" }
        }
        h2 { "Messages" }
        form.filters method="get" action=(base) {
            div { label { "Event type" } input type="text" name="event_type" value=(q.event_type.clone().unwrap_or_default()); }
            div { label { "Channel" } input type="text" name="channel" value=(q.channel.clone().unwrap_or_default()); }
            div { label { "After (RFC 3339)" } input type="text" name="after" value=(q.after.clone().unwrap_or_default()); }
            div { label { "Before (RFC 3339)" } input type="text" name="before" value=(q.before.clone().unwrap_or_default()); }
            button type="submit" { "Filter" }
        }
        table.messages {
            tr { th { "Message" } th { "Event type" } th { "Channels" } th { "Accepted" } }
            @for m in &messages {
                tr { td { a href={ (base) "/msg/" (m.id) } { (m.id) } } td { (m.event_type) }
                     td { (m.channels.clone().unwrap_or_default().join(", ")) } td { (when(Some(m.created_at))) } }
            }
        }
    };
    Ok(page(&viewer, &format!("Application {}", app.name), body))
}

/// A message: its payload (masked for viewers without the permission), where it went,
/// and every attempt with the receiver's response shown as text.
pub async fn message(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, msg_id)): Path<(String, String)>,
) -> Result<Page, Page> {
    let (app, message) = visible_message(&state, &viewer.principal, &app_id, &msg_id).await?;
    let err = crate::api::ApiError::from;
    let payload = message.payload.as_deref().map(|p| {
        let masked = state.mask_for(&viewer.principal).and_then(|r| r.mask(&message.event_type, p));
        let text = masked.unwrap_or_else(|| p.to_owned());
        serde_json::from_str::<serde_json::Value>(&text).and_then(|v| serde_json::to_string_pretty(&v)).unwrap_or(text)
    });
    let deliveries = state.store.message_deliveries(&message.id, &page_of(250)).await.map_err(err)?;
    let filter = AttemptFilter {
        app: app.id.clone(),
        msg: Some(message.id.clone()),
        endpoint: None,
        status: None,
        status_code_class: None,
        messages: MessageFilter::default(),
        with_content: true,
    };
    let attempts = state.store.list_attempts(&filter, &page_of(250)).await.map_err(err)?;
    let base = format!("/app/{}/msg/{}", app.id, message.id);
    let body = html! {
        p.muted { (message.event_type) " · accepted " (when(Some(message.created_at)))
                  @if let Some(e) = &message.event_id { " · eventId " (e) } }
        h2 { "Payload" }
        @match &payload { Some(p) => pre.payload { (p) }, None => p.muted { "Expunged." } }
        h2 { "Deliveries" }
        table.deliveries {
            tr { th { "Endpoint" } th { "Status" } th { "Attempts" } th { "Next attempt" } th { "" } }
            @for d in &deliveries {
                tr {
                    td { (d.endpoint_id) }
                    td.status { (d.status().text()) }
                    td { (d.attempts) }
                    td { (when(d.next_at)) }
                    td {
                        form.inline method="post" action={ (base) "/endpoint/" (d.endpoint_id) "/resend" } {
                            (csrf(&viewer.csrf))
                            button.replay type="submit" { "Replay" }
                        }
                    }
                }
            }
        }
        h2 { "Attempts" }
        table.attempts {
            tr { th { "When" } th { "Endpoint" } th { "Status code" } th { "Duration" } th { "Error" } th { "Trigger" } th { "Response" } }
            @for a in &attempts {
                tr class={ @if a.delivered { "delivered" } @else { "failed" } } {
                    td { (when(Some(a.created_at))) }
                    td { (a.endpoint_id) }
                    td.code { (a.status_code) }
                    td { (a.duration_ms) " ms" }
                    td { (a.error_class.clone().unwrap_or_default()) @if let Some(e) = &a.error { br; span.muted { (e) } } }
                    td { (if a.trigger.code() == 1 { "manual" } else { "scheduled" }) }
                    td { pre.response { (a.response) } }
                }
            }
        }
    };
    Ok(page(&viewer, &format!("Message {}", message.id), body))
}

/// A bulk replay's progress (reloads itself while it runs).
pub async fn replay_progress(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, task_id)): Path<(String, String)>,
) -> Result<Page, Page> {
    let app = visible_app(&state, &viewer.principal, &app_id).await?;
    let task = state.replays.get(&app.id, &task_id).ok_or(crate::api::ApiError::NotFound("replay"))?;
    let body = html! {
        @if task.status() == "running" { (live()) }
        div.cards {
            div.card { div.n #replay-status { (task.status()) } div.l { "status" } }
            div.card { div.n #replay-done { (task.replayed()) " / " (task.total) } div.l { "dead letters put back" } }
        }
        p { a href={ "/app/" (app.id) } { "Back to the application" } }
    };
    Ok(page(&viewer, "Replay", body))
}
