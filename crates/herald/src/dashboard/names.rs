//! What people read where records hold ids: an endpoint by its description or URL, an
//! application by its name, each a link with the id beside it, small and copyable. A page
//! looks the names up once ([`Names::of`]) and renders from that.

use std::collections::HashMap;

use maud::{Markup, html};

use crate::api::AppState;
use crate::ids::{AppId, EndpointId};
use crate::store::Endpoint;

/// An endpoint's name: its description, else its URL.
pub fn endpoint_name(endpoint: &Endpoint) -> String {
    if endpoint.description.trim().is_empty() { endpoint.url.clone() } else { endpoint.description.clone() }
}

struct Known {
    app: AppId,
    name: String,
    url: String,
    deleted: bool,
}

#[derive(Default)]
pub struct Names {
    endpoints: HashMap<EndpointId, Known>,
    apps: HashMap<AppId, String>,
}

impl Names {
    /// Looks up these endpoints (deleted ones too) and applications, and the applications
    /// of the endpoints.
    pub async fn of<'a>(
        state: &AppState,
        endpoints: impl IntoIterator<Item = &'a EndpointId>,
        apps: impl IntoIterator<Item = &'a AppId>,
    ) -> Self {
        // Owned before the first await, so the future stays `Send` whatever iterators come in.
        let endpoints: Vec<EndpointId> = endpoints.into_iter().cloned().collect();
        let apps: Vec<AppId> = apps.into_iter().cloned().collect();
        Self::lookup(state, endpoints, apps).await
    }

    async fn lookup(state: &AppState, endpoints: Vec<EndpointId>, apps: Vec<AppId>) -> Self {
        let mut names = Self::default();
        for id in &endpoints {
            if names.endpoints.contains_key(id) {
                continue;
            }
            let (endpoint, deleted) = match state.catalog.target(id).await {
                Ok(Some(target)) => (Some(target.endpoint.clone()), false),
                _ => (state.store.deleted_endpoint(id).await.ok().flatten(), true),
            };
            if let Some(e) = endpoint {
                let known = Known { app: e.app_id.clone(), name: endpoint_name(&e), url: e.url.clone(), deleted };
                names.endpoints.insert(id.clone(), known);
            }
        }
        let wanted: Vec<AppId> = apps.into_iter().chain(names.endpoints.values().map(|k| k.app.clone())).collect();
        for id in wanted {
            if names.apps.contains_key(&id) {
                continue;
            }
            if let Ok(Some(app)) = state.catalog.app(id.as_str()).await {
                names.apps.insert(id, app.name.clone());
            }
        }
        names
    }

    /// The endpoint's name as a link to its page, its URL (when the name is a description)
    /// and id below.
    pub fn endpoint(&self, id: &EndpointId) -> Markup {
        let Some(known) = self.endpoints.get(id) else { return id_only(id.as_str()) };
        html! {
            @if known.deleted { (known.name) " " span.muted { "(deleted)" } }
            @else { a href={ "/app/" (known.app) "/endpoint/" (id) } { (known.name) } }
            @if known.name != known.url { br; span.url { (known.url) } }
            br; (small_id(id.as_str()))
        }
    }

    /// The application's name as a link to its page, its id below.
    pub fn app(&self, id: &AppId) -> Markup {
        match self.apps.get(id) {
            Some(name) => html! { a href={ "/app/" (id) } { (name) } br; (small_id(id.as_str())) },
            None => id_only(id.as_str()),
        }
    }
}

/// An id, small and selectable in one click.
pub fn small_id(id: &str) -> Markup {
    html! { span.id title="id" { (id) } }
}

fn id_only(id: &str) -> Markup {
    html! { (small_id(id)) }
}
