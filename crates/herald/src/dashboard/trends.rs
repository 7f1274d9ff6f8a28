//! The charts of the dashboard's pages, drawn from the store's history (`crate::history`):
//! an endpoint's (or an application's, summed) deliveries and latency per hour over the
//! last 24 hours or 7 days, and the server's accepted, delivered, failed and dead-lettered
//! messages and queue depth per minute over the last hour or per hour over 7 days, with the
//! slowest endpoints' p95.

use maud::{Markup, html};

use super::Page;
use super::chart::{self, Axis, Series};
use crate::api::{ApiError, AppState};
use crate::clock::{Millis, now_ms};
use crate::health;
use crate::history::{self, HOUR_MS, MINUTE_MS, Totals};
use crate::ids::EndpointId;
use crate::latency::MIN_SAMPLES;

/// How far back a page's charts look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Endpoints: the last 24 hours by hour. The server: the last hour by minute.
    Short,
    /// The last 7 days by hour.
    Week,
}

impl Window {
    /// `?window=7d` asks for the week; anything else is the short window.
    pub fn from_query(value: Option<&str>) -> Self {
        if value == Some("7d") { Self::Week } else { Self::Short }
    }

    fn query(self) -> &'static str {
        match self {
            Self::Short => "",
            Self::Week => "7d",
        }
    }
}

/// Links between the two windows of a page at `path` (the current one marked).
pub fn switch(path: &str, current: Window, short_label: &str) -> Markup {
    let link = |window: Window, label: &str| {
        let href = match window.query() {
            "" => path.to_owned(),
            q => format!("{path}?window={q}"),
        };
        html! {
            @if window == current { strong aria-current="page" { (label) } }
            @else { a href={ (href) "#charts" } { (label) } }
        }
    };
    html! { p.window-switch { "Charts: " (link(Window::Short, short_label)) " · " (link(Window::Week, "last 7 days")) } }
}

/// Deliveries (succeeded and failed attempts, stacked) and latency (p50, p95, p99) per
/// hour of these endpoints, summed.
pub async fn deliveries(state: &AppState, endpoints: &[EndpointId], window: Window, id: &str) -> Result<Markup, Page> {
    let hours = match window {
        Window::Short => 24,
        Window::Week => 7 * 24,
    };
    let points = history::endpoint_hours(&*state.store, endpoints, hours, now_ms()).await.map_err(ApiError::from)?;
    let axis = Axis { starts: points.iter().map(|p| p.start).collect(), period_ms: HOUR_MS };
    let count = |f: fn(&history::HourPoint) -> u64| points.iter().map(|p| Some(f(p) as f64)).collect();
    let counts = [
        Series { name: "succeeded", values: count(|p| p.succeeded) },
        Series { name: "failed", values: count(|p| p.failed) },
    ];
    let percentile = |f: fn(&history::HourPoint) -> Option<f64>| points.iter().map(f).collect();
    let latency = [
        Series { name: "p50", values: percentile(|p| p.latency.p50_ms) },
        Series { name: "p95", values: percentile(|p| p.latency.p95_ms) },
        Series { name: "p99", values: percentile(|p| p.latency.p99_ms) },
    ];
    let span = if window == Window::Week { "last 7 days" } else { "last 24 hours" };
    Ok(html! {
        div.charts #charts {
            (chart::stacked_bars(&format!("{id}-deliveries"), &format!("Attempts per hour, {span}"), &axis, &counts, ""))
            (chart::lines(&format!("{id}-latency"), &format!("Latency per hour, {span}"), &axis, &latency, "ms"))
        }
    })
}

/// The server's charts: messages per period, the queue's depth, the slowest endpoints.
pub async fn server(state: &AppState, window: Window) -> Result<Markup, Page> {
    let now = now_ms();
    let (period, periods, span) = match window {
        Window::Short => (MINUTE_MS, 60, "per minute, last hour"),
        Window::Week => (HOUR_MS, 7 * 24, "per hour, last 7 days"),
    };
    let totals = history::totals(&*state.store, period, periods, now).await.map_err(ApiError::from)?;
    let axis = Axis { starts: totals.iter().map(|t| t.start).collect(), period_ms: period };
    let of = |f: fn(&Totals) -> u64| totals.iter().map(|t| Some(f(t) as f64)).collect();
    let flow = [
        Series { name: "accepted", values: of(|t| t.accepted) },
        Series { name: "delivered", values: of(|t| t.delivered) },
        Series { name: "failed attempts", values: of(|t| t.failed) },
        Series { name: "dead-lettered", values: of(|t| t.dead) },
    ];
    let sampled = |f: fn((u64, u64)) -> u64| totals.iter().map(|t| t.queue.map(|q| f(q) as f64)).collect();
    let queue = [
        Series { name: "waiting for a first attempt", values: sampled(|q| q.0) },
        Series { name: "waiting for a retry", values: sampled(|q| q.1) },
    ];
    let slowest = slowest(state, now).await?;
    Ok(html! {
        div.charts #charts {
            (chart::lines("messages", &format!("Messages {span}"), &axis, &flow, ""))
            (chart::stacked_bars("queue", &format!("Queue depth {span} (the deepest sample)"), &axis, &queue, ""))
            @if slowest.is_empty() {
                figure.chart #slowest { figcaption { "Slowest endpoints (p95, 24 hours)" }
                    p.muted { "No endpoint has " (MIN_SAMPLES) " attempts in the last 24 hours yet." } }
            } @else {
                (chart::ranked_bars("slowest", "Slowest endpoints (p95, 24 hours)", &slowest, "ms"))
            }
        }
    })
}

/// The ten endpoints with the highest p95 (with enough samples), named by description or
/// URL and application.
async fn slowest(state: &AppState, now: Millis) -> Result<Vec<(String, f64)>, Page> {
    let latency = health::latency(&*state.store, &state.dispatcher, None, now).await.map_err(ApiError::from)?;
    let mut ranked: Vec<(EndpointId, f64)> = latency
        .into_iter()
        .filter_map(|(endpoint, h)| {
            let s = h.summary();
            (s.sample_count >= MIN_SAMPLES).then_some(())?;
            Some((endpoint, s.p95_ms?))
        })
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut rows = vec![];
    for (endpoint, p95) in ranked.into_iter().take(10) {
        if let Ok(Some(target)) = state.catalog.target(&endpoint).await {
            let app = state.catalog.app(target.endpoint.app_id.as_str()).await.ok().flatten();
            let name = app.map(|a| a.name.clone()).unwrap_or_default();
            rows.push((format!("{} · {}", name, super::names::endpoint_name(&target.endpoint)), p95));
        }
    }
    Ok(rows)
}
