//! An application's endpoints as its owner manages them: the add form and an endpoint's
//! page (health and its charts, the breaker's history, settings, subscription, headers,
//! signing secret, test events, recent attempts, dead-letter analysis). The forms post to
//! `endpoint_forms`, which call the API's own handlers.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use maud::{Markup, html};
use serde::Deserialize;

use super::catalog::{self, Catalogued};
use super::credentials;
use super::destination::{self, DestinationDraft};
use super::log;
use super::names::{Names, small_id};
use super::pages::{DAY_MS, dead_letter_rows, dead_letter_table, page_of};
use super::scripts::{self, Trial};
use super::trends::{self, Window};
use super::view::{circuit_label, csrf, live, ms, when};
use super::{Page, Viewer};
use crate::api::{ApiError, AppState, VisibleApp, VisibleEndpoint, endpoint, endpoint_ops, stats};
use crate::breaker::BreakerState;
use crate::clock::now_ms;
use crate::delivery_auth::CredentialsSummary;
use crate::store::{App, AttemptFilter, BreakerEvent, BreakerEventKind, Endpoint};

/// What the settings form shows: the values (as typed, after a refusal) and the problems.
#[derive(Default)]
pub struct Draft {
    pub url: String,
    pub description: String,
    pub event_types: Vec<String>,
    pub channels: String,
    pub throttle_rate: String,
    pub filter: String,
    pub transform: String,
    /// What the endpoint's credentials are (never the secrets themselves).
    pub credentials: CredentialsSummary,
    /// HTTP, or the event destination and its settings (never its secrets).
    pub destination: DestinationDraft,
    /// (field, message); a `None` field is about the whole form.
    pub problems: Vec<(Option<String>, String)>,
}

impl Draft {
    pub fn of(state: &AppState, endpoint: &Endpoint) -> Self {
        Self {
            url: endpoint.url.clone(),
            description: endpoint.description.clone(),
            event_types: endpoint.event_types.clone().unwrap_or_default(),
            channels: endpoint.channels.clone().unwrap_or_default().join(", "),
            throttle_rate: endpoint.throttle_rate.map(|r| r.to_string()).unwrap_or_default(),
            filter: endpoint.scripts.filter.clone().unwrap_or_default(),
            transform: endpoint.scripts.transform.clone().unwrap_or_default(),
            credentials: endpoint::credentials_summary(state, endpoint),
            destination: DestinationDraft::of(endpoint::destination_shown(state, endpoint)),
            problems: vec![],
        }
    }

    pub fn problem(&self, field: &str) -> Markup {
        html! {
            @for (_, msg) in self.problems.iter().filter(|(f, _)| f.as_deref() == Some(field)) {
                p.error.field-error role="alert" { (msg) }
            }
        }
    }
}

/// The settings form, for a new endpoint (`endpoint` is `None`) or an existing one.
pub fn settings_form(app: &App, endpoint: Option<&str>, draft: &Draft, types: &[Catalogued], token: &str) -> Markup {
    let action = match endpoint {
        Some(ep) => format!("/app/{}/endpoint/{ep}/settings", app.id),
        None => format!("/app/{}/endpoint/new", app.id),
    };
    html! {
        form.settings method="post" action=(action) {
            (csrf(token))
            @for (field, msg) in draft.problems.iter().filter(|(f, _)| f.is_none()) {
                @if field.is_none() { p.error role="alert" { (msg) } }
            }
            div.http-url {
                label for="url" { "URL" }
                input #url type="url" name="url" value=(draft.url) placeholder="https://example.com/webhooks";
                (draft.problem("url"))
            }
            (destination::fieldset(&draft.destination, |field| draft.problem(field)))
            label for="description" { "Description" }
            input #description type="text" name="description" value=(draft.description);
            fieldset.subscription {
                legend { "Event types (none ticked: every event type)" }
                (catalog::picker(types, &draft.event_types))
                (draft.problem("eventTypes"))
            }
            label for="channels" { "Channels (comma-separated; empty: every channel)" }
            input #channels type="text" name="channels" value=(draft.channels);
            (draft.problem("channels"))
            label for="throttle_rate" {
                "Rate limit, messages per second (empty: none"
                @if let Some(limit) = app.throttle_rate { "; at most " (limit) ", your application's limit" }
                ")"
            }
            input #throttle_rate type="number" name="throttle_rate" min="1" max=[app.throttle_rate]
                value=(draft.throttle_rate);
            (draft.problem("throttleRate"))
            label for="filter" { "Filter (jq; the endpoint gets a message only if this yields true; empty: every message)" }
            textarea #filter name="filter" rows="2" spellcheck="false"
                placeholder=".payload.amount > 100" { (draft.filter) }
            (draft.problem("filter"))
            label for="transform" { "Transform (jq; yields {payload, headers, method, url} or null to skip; empty: none)" }
            textarea #transform name="transform" rows="4" spellcheck="false"
                placeholder="{payload: {id: .payload.id, kind: .eventType}}" { (draft.transform) }
            (draft.problem("transform"))
            (credentials::fieldsets(draft))
            button type="submit" { @if endpoint.is_some() { "Save" } @else { "Add endpoint" } }
        }
    }
}

/// The form for a new endpoint.
pub async fn new_form(State(state): State<AppState>, viewer: Viewer, Path(app_id): Path<String>) -> Result<Page, Page> {
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    let types = catalog::load(&state, &viewer.principal).await?;
    Ok(new_page(&viewer, &app, &Draft::default(), &types, StatusCode::OK))
}

pub fn new_page(viewer: &Viewer, app: &App, draft: &Draft, types: &[Catalogued], status: StatusCode) -> Page {
    let body = html! {
        p { a href={ "/app/" (app.id) } { "← " (app.name) } }
        (settings_form(app, None, draft, types, &viewer.csrf))
    };
    Page::of(viewer, "Add an endpoint", body).with_status(status)
}

#[derive(Deserialize, Default)]
pub struct DetailQuery {
    /// A test message just sent: its outcome is shown at the top.
    test: Option<String>,
    /// `7d`: the charts span a week.
    window: Option<String>,
}

/// An endpoint's page.
pub async fn detail(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    Query(q): Query<DetailQuery>,
) -> Result<Page, Page> {
    let (app, endpoint) =
        VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?.into_parts();
    let draft = Draft::of(&state, &endpoint);
    let shown = Shown { test: q.test.as_deref(), window: Window::from_query(q.window.as_deref()), trial: None };
    endpoint_page(&state, &viewer, &app, &endpoint, &draft, shown, StatusCode::OK).await
}

/// What an endpoint's page shows besides the endpoint: a test's outcome, a chart window.
#[derive(Clone, Copy)]
pub struct Shown<'a> {
    pub test: Option<&'a str>,
    pub window: Window,
    /// A "try it" just made, with what was tried (see `scripts`).
    pub trial: Option<&'a Trial>,
}

impl Default for Shown<'_> {
    fn default() -> Self {
        Self { test: None, window: Window::Short, trial: None }
    }
}

/// Renders an endpoint's page, with `draft` in its settings form.
pub async fn endpoint_page(
    state: &AppState,
    viewer: &Viewer,
    app: &App,
    endpoint: &Endpoint,
    draft: &Draft,
    shown: Shown<'_>,
    status: StatusCode,
) -> Result<Page, Page> {
    let err = ApiError::from;
    let health = stats::health_of(state, endpoint).await?;
    let counts = state.store.endpoint_stats(&endpoint.id, None, None).await.map_err(err)?;
    let tried = counts.success + counts.fail;
    let rate = (tried > 0).then(|| format!("{:.1} %", 100.0 * counts.success as f64 / tried as f64));
    let filter = AttemptFilter::of_endpoint(&app.id, &endpoint.id, true);
    let attempts = state.store.list_attempts(&filter, &page_of(20)).await.map_err(err)?;
    let names = Names::of(state, [&endpoint.id], [&app.id]).await;
    let shapes = log::shapes(state, [&endpoint.id]).await;
    let history = state.store.breaker_events(&endpoint.id, now_ms() - 7 * DAY_MS, 50).await.map_err(err)?;
    let dead = dead_letter_rows(state, Some(&app.id), Some(&endpoint.id)).await?;
    let charts = trends::deliveries(state, std::slice::from_ref(&endpoint.id), shown.window, "endpoint").await?;
    let types = catalog::load(state, &viewer.principal).await?;
    let secret = endpoint_ops::shown_secret(state, endpoint)?;
    let headers = endpoint_ops::header_names(state, endpoint)?;
    let base = format!("/app/{}/endpoint/{}", app.id, endpoint.id);
    let tested = shown.test.map(|msg| test_outcome(&attempts, msg));
    let body = html! {
        @if tested.as_ref().is_some_and(|(done, _)| !done) { (live(2)) }
        p { a href={ "/app/" (app.id) } { "← " (app.name) } }
        p.muted { span.url { (endpoint.url) } br; (small_id(endpoint.id.as_str())) }
        @if let Some((_, outcome)) = &tested { (outcome) }
        div.cards #endpoint-health {
            div.card { div.n #circuit { (circuit_label(health.state)) } div.l { "circuit" } }
            div.card { div.n { (rate.unwrap_or_else(|| "—".into())) } div.l { "succeeded" } }
            div.card { div.n { (ms(health.p50_ms)) } div.l { "p50, 24 h" } }
            div.card { div.n { (ms(health.p95_ms)) } div.l { "p95, 24 h" } }
            div.card { div.n { (ms(health.p99_ms)) } div.l { "p99, 24 h" } }
            div.card { div.n { (when(attempts.first().map(|a| a.created_at))) } div.l { "last attempt" } }
        }
        @if health.state != BreakerState::Closed {
            form.inline method="post" action={ (base) "/retry" } {
                (csrf(&viewer.csrf))
                button #retry-now type="submit" { "Retry now" }
                span.muted { " The circuit is " (circuit_label(health.state)) "; deliveries wait until a probe succeeds." }
            }
        }
        (trends::switch(&base, shown.window, "last 24 hours"))
        (charts)
        h2 { "Circuit breaker history, last 7 days" }
        (breaker_history(&history))
        h2 { "Send a test event" }
        form.inline #test-event method="post" action={ (base) "/test" } {
            (csrf(&viewer.csrf))
            label for="test-type" { "Event type" }
            select #test-type name="event_type" {
                option value="svix.ping" { "svix.ping (a ping: {\"success\": true})" }
                @for t in types.iter().filter(|t| t.example.is_some()) { option value=(t.name) { (t.name) } }
            }
            button type="submit" { "Send" }
        }
        h2 { "Settings" }
        (settings_form(app, Some(endpoint.id.as_str()), draft, &types, &viewer.csrf))
        h2 { "Try the filter and transform" }
        (scripts::trial_form(&base, shown.trial, &viewer.csrf))
        form.inline method="post" action={ (base) "/enabled" } {
            (csrf(&viewer.csrf))
            @if endpoint.disabled {
                span.error { "Disabled: it receives nothing. " }
                input type="hidden" name="enabled" value="true";
                button #enable type="submit" { "Enable" }
            } @else {
                input type="hidden" name="enabled" value="false";
                button #disable type="submit" { "Disable" }
            }
        }
        h2 { "Signing secret" }
        details.secret {
            summary { code { "whsec_••••••••" } " Reveal" }
            code #secret { (secret) }
        }
        form.inline method="post" action={ (base) "/secret/rotate" } {
            (csrf(&viewer.csrf))
            button #rotate type="submit" { "Rotate the secret" }
            span.muted { " The current secret keeps signing (a second signature) for "
                (overlap(state)) " after a rotation, so receivers can switch without losing a message." }
        }
        h2 { "Custom headers" }
        (headers_section(&base, &headers, &viewer.csrf))
        h2 { "Recent attempts" }
        (log::attempts_table(&attempts, &names, &shapes, &state.settings.user_agent, false))
        p { a href={ "/app/" (app.id) "/log?endpoint=" (endpoint.id) } { "Every attempt of this endpoint" } }
        h2 { "Dead letters, last 24 hours" }
        (dead_letter_table(&dead, &names, true, &viewer.csrf))
        h2 { "Delete" }
        form.inline method="post" action={ (base) "/delete" } {
            (csrf(&viewer.csrf))
            button.danger #delete type="submit" { "Delete this endpoint…" }
        }
    };
    let title = if endpoint.description.is_empty() { "Endpoint" } else { endpoint.description.as_str() };
    Ok(Page::of(viewer, title, body).with_status(status))
}

/// Whether a test message's attempt is in, and what to show about it.
fn test_outcome(attempts: &[crate::store::Attempt], msg: &str) -> (bool, Markup) {
    match attempts.iter().find(|a| a.msg_id.as_str() == msg) {
        None => (
            false,
            html! { p.notice #test-outcome role="status" { "Test event " (msg) " sent; waiting for the attempt…" } },
        ),
        Some(a) if a.delivered => (
            true,
            html! { p.notice.delivered #test-outcome role="status" {
            "Test event delivered: " (a.status_code) " in " (a.duration_ms) " ms." } },
        ),
        Some(a) => (
            true,
            html! { p.notice.failed #test-outcome role="status" {
            "Test event failed: " (a.error_class.clone().unwrap_or_else(|| a.status_code.to_string()))
            @if let Some(e) = &a.error { " — " (e) } } },
        ),
    }
}

fn overlap(state: &AppState) -> String {
    let secs = state.settings.secret_rotation_overlap.as_secs();
    if secs.is_multiple_of(3600) { format!("{} hours", secs / 3600) } else { format!("{secs} seconds") }
}

/// Header names with their values hidden (write-only), a form to set one, one to remove one.
fn headers_section(base: &str, names: &[String], token: &str) -> Markup {
    html! {
        @if names.is_empty() { p.muted { "None." } } @else {
            table.headers {
                tr { th { "Name" } th { "Value" } th { "" } }
                @for name in names {
                    tr { td { code { (name) } } td { span.muted { "•••••• (write-only)" } }
                         td { form.inline method="post" action={ (base) "/headers" } {
                             (csrf(token))
                             input type="hidden" name="name" value=(name);
                             input type="hidden" name="remove" value="true";
                             button type="submit" aria-label={ "Remove " (name) } { "Remove" } } } }
                }
            }
        }
        form.inline method="post" action={ (base) "/headers" } {
            (csrf(token))
            label for="header-name" { "Name" } input #header-name type="text" name="name" required;
            label for="header-value" { "Value" } input #header-value type="password" name="value" required autocomplete="off";
            button type="submit" { "Set header" }
        }
    }
}

/// The breaker's transitions, newest first, with what each means.
fn breaker_history(events: &[BreakerEvent]) -> Markup {
    let meaning = |kind: BreakerEventKind| match kind {
        BreakerEventKind::Opened => "opened: deliveries wait for a probe",
        BreakerEventKind::Reopened => "opened again: the probe failed, the cooldown doubles",
        BreakerEventKind::Closed => "closed: a probe succeeded",
        BreakerEventKind::Reset => "closed: the endpoint was changed or enabled again",
        BreakerEventKind::RetryNow => "retry now: the probe went before the cooldown ended",
    };
    html! {
        @if events.is_empty() { p.muted #breaker-history { "No transitions: the circuit stayed closed." } } @else {
            table #breaker-history {
                thead { tr { th { "When" } th { "What happened" } th { "Failures in a row" } th { "Cooldown" } } }
                tbody { @for e in events {
                    tr { td { (when(Some(e.at))) } td { (meaning(e.kind)) } td { (e.failures) }
                         td { (format!("{} s", e.cooldown_ms / 1000)) } }
                } }
            }
        }
    }
}
