//! What the dashboard's pages share: the navigation, keyset pagination of long lists,
//! time filters as people type them, and the dead-letter analysis table.

use chrono::NaiveDateTime;
use maud::{Markup, html};

use super::names::Names;
use super::view::{Nav, csrf, when};
use super::{Page, Viewer};
use crate::api::{ApiError, AppState, Principal};
use crate::clock::{Millis, now_ms, parse_time, to_rfc3339};
use crate::dead_letters::{EndpointDeadLetters, analyse};
use crate::ids::{AppId, EndpointId};
use crate::store::{DeadLetterFilter, PageQuery};

pub const DAY_MS: Millis = 24 * 3_600_000;

pub fn nav_for(viewer: &Viewer) -> Nav<'_> {
    let app = match &viewer.principal {
        Principal::App { app_id, .. } => Some(app_id.as_str()),
        Principal::Admin => None,
    };
    Nav { csrf: &viewer.csrf, admin: viewer.principal == Principal::Admin, app }
}

/// The first `limit` items, newest first.
pub(super) fn page_of(limit: usize) -> PageQuery {
    PageQuery { limit, iterator: None, descending: true }
}

/// Keyset pagination of a list that can grow: pages of [`Pager::SIZE`] items, newest first,
/// each after the last id of the page before (`?next=<id>`, or another parameter for a
/// second list on the same page).
pub struct Pager {
    pub next: Option<String>,
    param: &'static str,
}

impl Pager {
    pub const SIZE: usize = 50;

    pub fn new(next: Option<&str>) -> Self {
        Self::named("next", next)
    }

    /// A pager whose cursor is the query parameter `param`.
    pub fn named(param: &'static str, next: Option<&str>) -> Self {
        Self { next: next.map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned), param }
    }

    /// One more than a page, to know whether another follows.
    pub fn query(&self) -> PageQuery {
        PageQuery { limit: Self::SIZE + 1, iterator: self.next.clone(), descending: true }
    }

    /// The page's items, and the id the next page starts after (if there is one).
    pub fn cut<T>(&self, mut items: Vec<T>, id: impl Fn(&T) -> String) -> (Vec<T>, Option<String>) {
        let more = items.len() > Self::SIZE;
        items.truncate(Self::SIZE);
        let next = more.then(|| items.last().map(&id)).flatten();
        (items, next)
    }

    /// "Newest" and "Older" links for `path` with the list's other parameters.
    pub fn links(&self, path: &str, params: &[(&str, &str)], next: Option<&str>) -> Markup {
        let href = |cursor: Option<&str>| {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in params.iter().filter(|(_, v)| !v.is_empty()) {
                query.append_pair(k, v);
            }
            if let Some(cursor) = cursor {
                query.append_pair(self.param, cursor);
            }
            let query = query.finish();
            if query.is_empty() { path.to_owned() } else { format!("{path}?{query}") }
        };
        html! {
            nav.pager aria-label="Pages" {
                @if self.next.is_some() { a href=(href(None)) { "← Newest" } }
                @if let Some(next) = next { a rel="next" href=(href(Some(next))) { "Older →" } }
            }
        }
    }
}

/// A time filter as typed: RFC 3339, or a `datetime-local` value (taken as UTC).
pub fn form_time(raw: Option<&str>) -> Option<Millis> {
    let raw = raw.map(str::trim).filter(|r| !r.is_empty())?;
    parse_time(raw).or_else(|| {
        ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
            .iter()
            .find_map(|f| NaiveDateTime::parse_from_str(raw, f).ok())
            .map(|t| t.and_utc().timestamp_millis())
    })
}

/// The dead-letter analysis of the last 24 hours: of every application, one, or one
/// endpoint.
pub async fn dead_letter_rows(
    state: &AppState,
    app: Option<&AppId>,
    endpoint: Option<&EndpointId>,
) -> Result<Vec<EndpointDeadLetters>, Page> {
    let filter = DeadLetterFilter {
        app: app.cloned(),
        endpoint: endpoint.cloned(),
        dead_since: now_ms() - DAY_MS,
        limit: 100_000,
        ..Default::default()
    };
    let letters = state.store.dead_letters(&filter).await.map_err(ApiError::from)?;
    Ok(analyse(&letters))
}

/// The analysis with its hints; inside an application, each row can recover its endpoint.
pub fn dead_letter_table(rows: &[EndpointDeadLetters], names: &Names, recover: bool, csrf_token: &str) -> Markup {
    html! {
        @if rows.is_empty() { p.muted { "No dead letters." } } @else {
            table.dead-letters {
                thead { tr { th { "Endpoint" } th { "Application" } th { "Dead" } th { "Pattern" } th { "Primary error" }
                     th { "Status" } th { "First" } th { "Last" } th { "Avg attempts" } th { span.visually-hidden { "Replay" } } } }
                tbody { @for row in rows {
                    tr {
                        td { (names.endpoint(&row.endpoint_id)) }
                        td { (names.app(&row.app_id)) }
                        td { (row.dead_count) }
                        td { strong { (format!("{:?}", row.pattern)) } br; span.hint { (row.hint) } }
                        td { (row.primary_error) @if let Some(m) = &row.primary_error_message { br; span.muted { (m) } } }
                        td { (row.primary_status_code.map(|c| c.to_string()).unwrap_or_default()) }
                        td { (when(Some(row.first_dead_at))) }
                        td { (when(Some(row.last_dead_at))) }
                        td { (format!("{:.1}", row.avg_attempts)) }
                        td {
                            @if recover {
                                form method="post" action={ "/app/" (row.app_id) "/endpoint/" (row.endpoint_id) "/recover" } {
                                    (csrf(csrf_token))
                                    input type="hidden" name="since" value=(to_rfc3339(row.first_dead_at - 1));
                                    button type="submit" { "Replay this range" }
                                }
                            }
                        }
                    }
                } }
            }
        }
    }
}

/// Names for the endpoints and applications of a dead-letter analysis.
pub async fn dead_letter_names(state: &AppState, rows: &[EndpointDeadLetters]) -> Names {
    Names::of(state, rows.iter().map(|r| &r.endpoint_id), rows.iter().map(|r| &r.app_id)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_typed_in_a_form() {
        let at = parse_time("2026-12-01T05:40:00Z").unwrap();
        assert_eq!(form_time(Some("2026-12-01T05:40")), Some(at), "datetime-local, as UTC");
        assert_eq!(form_time(Some(" 2026-12-01T05:40:00Z ")), Some(at));
        assert_eq!(form_time(Some("")), None);
        assert_eq!(form_time(Some("yesterday")), None);
    }

    #[test]
    fn a_page_knows_whether_another_follows() {
        let pager = Pager::new(None);
        let (page, next) = pager.cut((0..=Pager::SIZE).collect(), |i| i.to_string());
        assert_eq!((page.len(), next.as_deref()), (Pager::SIZE, Some("49")));
        let (_, next) = pager.cut((0..Pager::SIZE).collect(), |i| i.to_string());
        assert_eq!(next, None);
        let links = Pager::new(Some("x")).links("/apps", &[("q", "a b"), ("empty", "")], Some("y")).into_string();
        assert!(
            links.contains(r#"href="/apps?q=a+b""#) && links.contains(r#"href="/apps?q=a+b&amp;next=y""#),
            "{links}"
        );
    }
}
