//! The dashboard's HTML: the layout and the small pieces pages are built from. maud
//! escapes every interpolated value, so receiver responses and payloads show as text.

use axum::http::StatusCode;
use maud::{DOCTYPE, Markup, PreEscaped, html};

use crate::brand::Brand;

use crate::clock::{Millis, to_rfc3339};

pub const STYLE: &str = include_str!("style.css");
pub const PORTAL_JS: &str = include_str!("portal.js");
pub const LIVE_JS: &str = include_str!("live.js");
pub const ICON: &str = include_str!("icon.svg");

/// What the navigation shows: the CSRF token for the sign-out form, and whether the viewer
/// is the operator.
pub struct Nav<'a> {
    pub csrf: &'a str,
    pub admin: bool,
    /// The application a portal viewer is scoped to.
    pub app: Option<&'a str>,
}

pub fn layout(title: &str, nav: Option<Nav<'_>>, brand: &Brand, body: Markup) -> Markup {
    let theme = brand.theme.unwrap_or_default().name();
    html! {
        (DOCTYPE)
        html lang="en" data-theme=(theme) {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · " (brand.display_name()) }
                link rel="stylesheet" href="/assets/style.css";
                link rel="icon" href="/assets/icon.svg" type="image/svg+xml";
                // The brand's colours: allowed by their hash in the page's policy.
                @if let Some(style) = brand.style() { style { (PreEscaped(style)) } }
            }
            body {
                header {
                    a.brand href="/" {
                        @if let Some(logo) = &brand.logo_url { img.logo src=(logo) alt=""; }
                        (brand.display_name())
                    }
                    @if let Some(nav) = &nav {
                        nav {
                            @if nav.admin {
                                a href="/" { "Overview" }
                                a href="/apps" { "Applications" }
                                a href="/dead-letters" { "Dead letters" }
                                a href="/search" { "Search" }
                            } @else if let Some(app) = nav.app {
                                a href={ "/app/" (app) } { "My application" }
                                a href={ "/app/" (app) "/log" } { "Delivery log" }
                                a href={ "/app/" (app) "/event-types" } { "Event catalog" }
                            }
                            form.inline method="post" action="/logout" {
                                input type="hidden" name="csrf" value=(nav.csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { h1 { (title) } (body) }
            }
        }
    }
}

pub fn login(csrf_token: &str, problem: Option<&str>) -> Markup {
    html! {
        @if let Some(problem) = problem { p.error { (problem) } }
        form method="post" action="/login" {
            (csrf(csrf_token))
            label for="token" { "Token (the admin token, or an app-portal token)" }
            input #token type="password" name="token" autocomplete="off" required;
            button type="submit" { "Sign in" }
        }
    }
}

pub fn portal(csrf_token: &str) -> Markup {
    html! {
        noscript { p.error { "The portal link needs JavaScript to sign you in." } }
        form #portal method="post" action="/login" {
            (csrf(csrf_token))
            input type="hidden" name="token";
        }
        script src="/assets/portal.js" {}
    }
}

pub fn error(status: StatusCode, message: &str) -> Markup {
    html! {
        p.error { (status.as_u16()) " — " (message) }
        p { a href="/" { "Back" } }
    }
}

/// A time as people read it ("3 min ago"), the exact time on hover and in `datetime`.
pub fn when(at: Option<Millis>) -> Markup {
    when_from(at, crate::clock::now_ms())
}

fn when_from(at: Option<Millis>, now: Millis) -> Markup {
    let Some(at) = at else { return html! { "—" } };
    let exact = to_rfc3339(at);
    html! { time datetime=(exact) title=(exact) { (relative(now - at)) } }
}

/// `ago_ms` as the largest whole unit: "just now", "5 s ago", "3 min ago", "2 h ago",
/// "4 days ago"; a time ahead reads "in 3 min".
fn relative(ago_ms: i64) -> String {
    let secs = ago_ms.abs() / 1000;
    let amount = match secs {
        0..=1 => return "just now".into(),
        2..=59 => format!("{secs} s"),
        60..=3599 => format!("{} min", secs / 60),
        3600..=86_399 => format!("{} h", secs / 3600),
        _ => format!("{} days", secs / 86_400),
    };
    if ago_ms < 0 { format!("in {amount}") } else { format!("{amount} ago") }
}

pub fn ms(value: Option<f64>) -> String {
    match value {
        Some(v) if v > 0.0 && v < 10.0 => format!("{v:.1} ms"),
        Some(v) => format!("{v:.0} ms"),
        None => "—".into(),
    }
}

/// A hidden CSRF field for a form.
pub fn csrf(token: &str) -> Markup {
    html! { input type="hidden" name="csrf" value=(token); }
}

/// Makes a page reload itself every `seconds` (summary, running replays, a test event
/// under way), with a button that turns it off for the rest of the visit (`live.js`).
pub fn live(seconds: u32) -> Markup {
    html! {
        p.live { button #live-toggle type="button" aria-pressed="true" data-seconds=(seconds) {
            "Refreshing every " (seconds) " s: on" } }
        script src="/assets/live.js" {}
    }
}

/// A circuit breaker's state as the pages write it.
pub fn circuit_label(state: crate::breaker::BreakerState) -> &'static str {
    match state {
        crate::breaker::BreakerState::Closed => "closed",
        crate::breaker::BreakerState::Open => "open",
        crate::breaker::BreakerState::HalfOpen => "half-open",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_relative_with_the_exact_time_on_hover() {
        let html = when_from(Some(0), 185_000).into_string();
        assert_eq!(
            html,
            r#"<time datetime="1970-01-01T00:00:00.000Z" title="1970-01-01T00:00:00.000Z">3 min ago</time>"#
        );
        assert_eq!(relative(500), "just now");
        assert_eq!(relative(-7_200_000), "in 2 h");
        assert_eq!(relative(3 * 86_400_000 + 5), "3 days ago");
        assert_eq!(when_from(None, 0).into_string(), "—");
    }
}
