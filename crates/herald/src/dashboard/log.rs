//! The delivery log: an application's attempts with filters (endpoint, status, event type,
//! time), each with the request as Herald sends it (the signature and the endpoint's header
//! values masked) and the receiver's response shown as text; a message's page; a bulk
//! replay's progress.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use maud::{Markup, html};
use serde::Deserialize;

use super::names::Names;
use super::pages::{Pager, form_time, page_of};
use super::view::{csrf, live, when};
use super::{Page, Viewer};
use crate::api::{ApiError, AppState, VisibleApp, VisibleMessage, endpoint_ops};
use crate::deliver::Standard;
use crate::ids::EndpointId;
use crate::postback::{BodyFormat, PostbackMethod};
use crate::store::{App, Attempt, AttemptFilter, DeliveryStatus, Endpoint, MessageFilter};

/// What an attempt's request looked like, from its endpoint's settings.
pub struct RequestShape {
    method: &'static str,
    body_format: BodyFormat,
    /// The endpoint's own header names (their values are write-only).
    headers: Vec<String>,
}

/// The request shapes of these endpoints (deleted ones have none).
pub async fn shapes<'a>(
    state: &AppState,
    endpoints: impl IntoIterator<Item = &'a EndpointId>,
) -> HashMap<EndpointId, RequestShape> {
    // Owned before the first await, so the future stays `Send`.
    let endpoints: Vec<EndpointId> = endpoints.into_iter().cloned().collect();
    let mut shapes = HashMap::new();
    for id in &endpoints {
        if shapes.contains_key(id) {
            continue;
        }
        if let Ok(Some(target)) = state.catalog.target(id).await {
            shapes.insert(id.clone(), shape_of(state, &target.endpoint));
        }
    }
    shapes
}

fn shape_of(state: &AppState, endpoint: &Endpoint) -> RequestShape {
    let settings = endpoint.request.clone().unwrap_or_default();
    let method = match settings.method() {
        PostbackMethod::Get => "GET",
        PostbackMethod::Post => "POST",
        PostbackMethod::Put => "PUT",
    };
    let headers = endpoint_ops::header_names(state, endpoint).unwrap_or_default();
    RequestShape { method, body_format: settings.body_format(), headers }
}

/// Attempts, newest first, each row followed by its request and response (folded).
pub fn attempts_table(
    attempts: &[Attempt],
    names: &Names,
    shapes: &HashMap<EndpointId, RequestShape>,
    user_agent: &str,
    with_endpoint: bool,
) -> Markup {
    html! {
        @if attempts.is_empty() { p.muted { "No attempts." } } @else {
            table.attempts {
                thead { tr { th { "When" } @if with_endpoint { th { "Endpoint" } } th { "Message" } th { "Status" }
                     th { "Duration" } th { "Error" } th { "Trigger" } th { "Request and response" } } }
                tbody { @for a in attempts {
                    tr class={ @if a.delivered { "delivered" } @else { "failed" } } {
                        td { (when(Some(a.created_at))) }
                        @if with_endpoint { td { (names.endpoint(&a.endpoint_id)) } }
                        td { a href={ "/app/" (a.app_id) "/msg/" (a.msg_id) } { (a.msg_id) } }
                        td.code { @if a.status_code == 0 { "—" } @else { (a.status_code) } }
                        td { (a.duration_ms) " ms" }
                        td { (a.error_class.clone().unwrap_or_default()) @if let Some(e) = &a.error { br; span.muted { (e) } } }
                        td { (if a.trigger.code() == 1 { "manual" } else { "scheduled" }) " #" (a.attempt_no) }
                        td { (exchange(a, shapes.get(&a.endpoint_id), user_agent)) }
                    }
                } }
            }
        }
    }
}

/// The request as Herald sends it (from the same header list the deliverer uses) and the
/// response as text.
fn exchange(a: &Attempt, shape: Option<&RequestShape>, user_agent: &str) -> Markup {
    let masked = "v1,•••••••• (masked)";
    let standard = Standard {
        body_format: shape.map_or(BodyFormat::Json, |s| s.body_format),
        user_agent,
        msg_id: a.msg_id.as_str(),
        timestamp: a.created_at.div_euclid(1000),
        signature: masked,
        attempt_no: a.attempt_no,
        sequence: a.delivery_id,
    };
    html! {
        details.exchange {
            summary { "Show" }
            h3 { "Request" }
            pre.request tabindex="0" {
                (shape.map_or("POST", |s| s.method)) " " (a.url) "\n"
                @for (name, value) in standard.headers() { (name) ": " (value) "\n" }
                @for name in shape.map(|s| s.headers.as_slice()).unwrap_or_default() { (name) ": •••••• (write-only)\n" }
            }
            h3 { "Response" }
            pre.response tabindex="0" { @if a.response.is_empty() { "(no body)" } @else { (a.response) } }
        }
    }
}

#[derive(Deserialize, Default)]
pub struct LogQuery {
    endpoint: Option<String>,
    status: Option<String>,
    event_type: Option<String>,
    after: Option<String>,
    before: Option<String>,
    next: Option<String>,
}

/// An application's delivery log.
pub async fn page(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(app_id): Path<String>,
    Query(q): Query<LogQuery>,
) -> Result<Page, Page> {
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    let endpoints = state.store.app_endpoints(&app.id).await.map_err(ApiError::from)?;
    let chosen: Vec<&Endpoint> = match q.endpoint.as_deref().filter(|e| !e.is_empty()) {
        Some(wanted) => endpoints.iter().filter(|e| e.id.as_str() == wanted).collect(),
        None => endpoints.iter().collect(),
    };
    let status = match q.status.as_deref() {
        Some("succeeded") => Some(DeliveryStatus::Success),
        Some("failed") => Some(DeliveryStatus::Fail),
        _ => None,
    };
    let filter = MessageFilter {
        channel: None,
        event_types: q.event_type.clone().filter(|t| !t.trim().is_empty()).into_iter().collect(),
        after: form_time(q.after.as_deref()),
        before: form_time(q.before.as_deref()),
    };
    let pager = Pager::new(q.next.as_deref());
    let (attempts, next) =
        pager.cut(log_attempts(&state, &app, &chosen, status, filter, &pager).await?, |a| a.id.to_string());
    let names = Names::of(&state, attempts.iter().map(|a| &a.endpoint_id), [&app.id]).await;
    let shapes = shapes(&state, attempts.iter().map(|a| &a.endpoint_id)).await;
    let base = format!("/app/{}/log", app.id);
    let value = |v: &Option<String>| v.clone().unwrap_or_default();
    let (endpoint, status_text) = (value(&q.endpoint), value(&q.status));
    let (event_type, after, before) = (value(&q.event_type), value(&q.after), value(&q.before));
    let params = [
        ("endpoint", endpoint.as_str()),
        ("status", &status_text),
        ("event_type", &event_type),
        ("after", &after),
        ("before", &before),
    ];
    let body = html! {
        p { a href={ "/app/" (app.id) } { "← " (app.name) } }
        form.filters method="get" action=(base) {
            div { label for="log-endpoint" { "Endpoint" }
                select #log-endpoint name="endpoint" {
                    option value="" { "Every endpoint" }
                    @for e in &endpoints { option value=(e.id) selected[e.id.as_str() == endpoint] { (super::names::endpoint_name(e)) } }
                } }
            div { label for="log-status" { "Status" }
                select #log-status name="status" {
                    option value="" { "Any" }
                    option value="succeeded" selected[status_text == "succeeded"] { "Succeeded" }
                    option value="failed" selected[status_text == "failed"] { "Failed" }
                } }
            div { label for="log-type" { "Event type" } input #log-type type="text" name="event_type" value=(event_type); }
            div { label for="log-after" { "Message after (UTC)" } input #log-after type="datetime-local" name="after" value=(after); }
            div { label for="log-before" { "Message before (UTC)" } input #log-before type="datetime-local" name="before" value=(before); }
            button type="submit" { "Filter" }
        }
        (attempts_table(&attempts, &names, &shapes, &state.settings.user_agent, true))
        (pager.links(&base, &params, next.as_deref()))
        p.muted { "Attempts to deleted endpoints are listed on each message's page." }
    };
    Ok(Page::of(&viewer, "Delivery log", body))
}

/// One page (and one more) of the chosen endpoints' attempts, newest first: each endpoint's
/// newest through its own index, merged. The responses are read for the page's rows only.
async fn log_attempts(
    state: &AppState,
    app: &App,
    endpoints: &[&Endpoint],
    status: Option<DeliveryStatus>,
    messages: MessageFilter,
    pager: &Pager,
) -> Result<Vec<Attempt>, Page> {
    let mut all = vec![];
    for endpoint in endpoints {
        let filter = AttemptFilter {
            status,
            messages: messages.clone(),
            ..AttemptFilter::of_endpoint(&app.id, &endpoint.id, false)
        };
        all.extend(state.store.list_attempts(&filter, &pager.query()).await.map_err(ApiError::from)?);
    }
    all.sort_by(|a, b| b.id.as_str().cmp(a.id.as_str()));
    all.truncate(Pager::SIZE + 1);
    let mut with_content = Vec::with_capacity(all.len());
    for a in all {
        let full = state.store.attempt(&app.id, &a.msg_id, a.id.as_str()).await.map_err(ApiError::from)?;
        with_content.push(full.unwrap_or(a));
    }
    Ok(with_content)
}

/// A message: its payload (masked for viewers without the permission), where it went,
/// and every attempt with its request and the receiver's response shown as text.
pub async fn message(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, msg_id)): Path<(String, String)>,
) -> Result<Page, Page> {
    let (app, message) = VisibleMessage::resolve(&state, &viewer.principal, &app_id, &msg_id).await?.into_parts();
    let err = ApiError::from;
    let payload = message.payload.as_deref().map(|p| {
        let masked = state.mask_for(&viewer.principal).and_then(|r| r.mask(&message.event_type, p));
        let text = masked.unwrap_or_else(|| p.to_owned());
        serde_json::from_str::<serde_json::Value>(&text).and_then(|v| serde_json::to_string_pretty(&v)).unwrap_or(text)
    });
    let deliveries = state.store.message_deliveries(&message.id, &page_of(250)).await.map_err(err)?;
    let filter = AttemptFilter::of_message(&app.id, &message.id, true);
    let attempts = state.store.list_attempts(&filter, &page_of(250)).await.map_err(err)?;
    let endpoints = deliveries.iter().map(|d| &d.endpoint_id).chain(attempts.iter().map(|a| &a.endpoint_id));
    let names = Names::of(&state, endpoints, [&app.id]).await;
    let shapes = shapes(&state, attempts.iter().map(|a| &a.endpoint_id)).await;
    let base = format!("/app/{}/msg/{}", app.id, message.id);
    let body = html! {
        p { a href={ "/app/" (app.id) } { "← " (app.name) } }
        p.muted { (message.event_type) " · accepted " (when(Some(message.created_at)))
                  @if let Some(e) = &message.event_id { " · eventId " (e) } }
        h2 { "Payload" }
        @match &payload { Some(p) => pre.payload tabindex="0" { (p) }, None => p.muted { "Expunged." } }
        h2 { "Deliveries" }
        table.deliveries {
            thead { tr { th { "Endpoint" } th { "Status" } th { "Attempts" } th { "Next attempt" } th { span.visually-hidden { "Replay" } } } }
            tbody { @for d in &deliveries {
                tr {
                    td { (names.endpoint(&d.endpoint_id)) }
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
            } }
        }
        h2 { "Attempts" }
        (attempts_table(&attempts, &names, &shapes, &state.settings.user_agent, true))
    };
    Ok(Page::of(&viewer, &format!("Message {}", message.id), body))
}

/// A bulk replay's progress (reloads itself while it runs).
pub async fn replay_progress(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, task_id)): Path<(String, String)>,
) -> Result<Page, Page> {
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    let task = state.replays.get(&app.id, &task_id).ok_or(ApiError::NotFound("replay"))?;
    let body = html! {
        @if task.status() == "running" { (live(3)) }
        div.cards {
            div.card { div.n #replay-status { (task.status()) } div.l { "status" } }
            div.card { div.n #replay-done { (task.replayed()) " / " (task.total) } div.l { "dead letters put back" } }
        }
        p { a href={ "/app/" (app.id) } { "Back to the application" } }
    };
    Ok(Page::of(&viewer, "Replay", body))
}
