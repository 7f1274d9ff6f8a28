//! The event catalog: every event type the operator declared, grouped by the part of its
//! name before the first dot, with its description, schema and example; searchable. The
//! subscription picker of the endpoint forms is built from the same list.

use axum::extract::{Path, Query, State};
use maud::{Markup, html};
use serde::Deserialize;

use super::{Page, Viewer};
use crate::api::{ApiError, AppState, Principal, VisibleApp};
use crate::store::PageQuery;

/// The most event types a catalog shows.
const MAX_TYPES: usize = 1000;

/// An event type as the catalog shows it.
pub struct Catalogued {
    pub name: String,
    pub description: String,
    pub deprecated: bool,
    /// The schemas, pretty-printed.
    pub schema: Option<String>,
    /// The first example, pretty-printed.
    pub example: Option<String>,
}

impl Catalogued {
    /// The part of the name before the first dot (`invoice` for `invoice.paid`).
    pub fn group(&self) -> &str {
        self.name.split('.').next().unwrap_or(&self.name)
    }

    fn matches(&self, query: &str) -> bool {
        let query = query.to_lowercase();
        self.name.to_lowercase().contains(&query) || self.description.to_lowercase().contains(&query)
    }
}

/// Every event type that is not archived and that `viewer` may see (a portal session only
/// those its token's feature flags open), by name.
pub async fn load(state: &AppState, viewer: &Principal) -> Result<Vec<Catalogued>, Page> {
    let page = PageQuery { limit: MAX_TYPES, iterator: None, descending: false };
    let mut types = state.store.list_event_types(&page, false).await.map_err(ApiError::from)?;
    types.retain(|t| viewer.has_feature(t.feature_flag.as_deref()));
    types.sort_by(|a, b| a.name.cmp(&b.name));
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    Ok(types
        .into_iter()
        .map(|t| Catalogued {
            example: t.schemas.as_ref().and_then(crate::api::endpoint_ops::first_example).map(|e| pretty(&e)),
            schema: t.schemas.as_ref().map(pretty),
            name: t.name,
            description: t.description,
            deprecated: t.deprecated,
        })
        .collect())
}

/// `types` in groups, in name order.
fn grouped<'a>(types: impl Iterator<Item = &'a Catalogued>) -> Vec<(&'a str, Vec<&'a Catalogued>)> {
    let mut groups: Vec<(&str, Vec<&Catalogued>)> = vec![];
    for t in types {
        match groups.last_mut() {
            Some((group, members)) if *group == t.group() => members.push(t),
            _ => groups.push((t.group(), vec![t])),
        }
    }
    groups
}

/// Checkboxes, one per event type, by group; `selected` ones ticked.
pub fn picker(types: &[Catalogued], selected: &[String]) -> Markup {
    html! {
        @if types.is_empty() { p.muted { "The operator has declared no event types yet." } }
        @for (group, members) in grouped(types.iter()) {
            div.group {
                h3 { (group) }
                @for t in members {
                    label.check {
                        input type="checkbox" name="event_types" value=(t.name) checked[selected.contains(&t.name)];
                        " " code { (t.name) }
                        @if !t.description.is_empty() { " — " span.muted { (t.description) } }
                    }
                }
            }
        }
    }
}

#[derive(Deserialize, Default)]
pub struct CatalogQuery {
    #[serde(default)]
    q: String,
}

/// The catalog page of an application (the same for every application: event types are
/// the operator's).
pub async fn page(
    State(state): State<AppState>,
    viewer: Viewer,
    Path(app_id): Path<String>,
    Query(query): Query<CatalogQuery>,
) -> Result<Page, Page> {
    let app = VisibleApp::resolve(&state, &viewer.principal, &app_id).await?;
    let types = load(&state, &viewer.principal).await?;
    let q = query.q.trim();
    let shown: Vec<&Catalogued> = types.iter().filter(|t| q.is_empty() || t.matches(q)).collect();
    let body = html! {
        p { a href={ "/app/" (app.id) } { "← " (app.name) } }
        form.filters role="search" method="get" action={ "/app/" (app.id) "/event-types" } {
            div { label for="q" { "Search event types" } input #q type="search" name="q" value=(q); }
            button type="submit" { "Search" }
        }
        p.muted #catalog-count { (shown.len()) " of " (types.len()) " event types" }
        @for (group, members) in grouped(shown.into_iter()) {
            section.catalog-group {
                h2 { (group) }
                @for t in members {
                    article.event-type id={ "type-" (t.name) } {
                        h3 { code { (t.name) } @if t.deprecated { " " span.error { "deprecated" } } }
                        @if !t.description.is_empty() { p { (t.description) } }
                        @if let Some(example) = &t.example {
                            details { summary { "Example payload" } pre.payload tabindex="0" { (example) } }
                        }
                        @if let Some(schema) = &t.schema {
                            details { summary { "Schema" } pre.payload tabindex="0" { (schema) } }
                        }
                    }
                }
            }
        }
    };
    Ok(Page::of(&viewer, "Event catalog", body))
}
