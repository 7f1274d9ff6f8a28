//! Tenant scoping by extractor. A handler that works on one application's resource takes
//! [`VisibleApp`], [`VisibleEndpoint`], [`VisibleMessage`] or [`VisiblePoller`]: the
//! extractor authenticates the caller, reads `{app_id}` (and `{endpoint_id}`, `{msg_id}`,
//! `{poller_id}`) from the path, and hands over the row only if the caller may see it;
//! another application's ids answer 404, exactly like ids that do not exist. The types have
//! no public constructor but [`VisibleApp::resolve`] and its kin (for ids that come from a
//! query or a form), so a handler cannot hold a resource it did not scope.

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use crate::store::{App, Endpoint, Message, Poller};

/// An application the caller may see (`{app_id}`: its id or uid).
#[derive(Debug, Clone)]
pub struct VisibleApp(Arc<App>);

/// An endpoint (fresh from the store) of an application the caller may see.
#[derive(Debug, Clone)]
pub struct VisibleEndpoint {
    app: Arc<App>,
    endpoint: Endpoint,
}

/// A message (by id or eventId) of an application the caller may see.
#[derive(Debug, Clone)]
pub struct VisibleMessage {
    app: Arc<App>,
    message: Message,
}

/// A poller of an application the caller may see.
#[derive(Debug, Clone)]
pub struct VisiblePoller {
    app: Arc<App>,
    poller: Poller,
}

impl VisibleApp {
    /// The application `id_or_uid`, if `principal` may see it (404 otherwise).
    pub async fn resolve(state: &AppState, principal: &Principal, id_or_uid: &str) -> ApiResult<Self> {
        match state.catalog.app(id_or_uid).await? {
            Some(app) if principal.can_see(&app.id) => Ok(Self(app)),
            _ => Err(ApiError::NotFound("application")),
        }
    }

    /// The endpoint `endpoint_id` (id or uid) of this application (404 if it holds none).
    pub async fn endpoint(&self, state: &AppState, endpoint_id: &str) -> ApiResult<VisibleEndpoint> {
        let endpoint = state.store.endpoint(&self.0.id, endpoint_id).await?.ok_or(ApiError::NotFound("endpoint"))?;
        Ok(VisibleEndpoint { app: self.0.clone(), endpoint })
    }

    pub fn app(&self) -> &Arc<App> {
        &self.0
    }

    pub fn into_app(self) -> Arc<App> {
        self.0
    }
}

impl Deref for VisibleApp {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

impl VisibleEndpoint {
    /// The endpoint `endpoint_id` (id or uid) of the application `app_id`, if `principal`
    /// may see that application (404 otherwise, and for an endpoint it does not hold).
    pub async fn resolve(state: &AppState, principal: &Principal, app_id: &str, endpoint_id: &str) -> ApiResult<Self> {
        VisibleApp::resolve(state, principal, app_id).await?.endpoint(state, endpoint_id).await
    }

    /// The same endpoint read again (after another writer may have changed it).
    pub async fn reread(&self, state: &AppState) -> ApiResult<Self> {
        VisibleApp(self.app.clone()).endpoint(state, self.endpoint.id.as_str()).await
    }

    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub fn into_parts(self) -> (Arc<App>, Endpoint) {
        (self.app, self.endpoint)
    }
}

impl VisibleMessage {
    /// The message `msg_id` (id or eventId) of the application `app_id`, if `principal`
    /// may see that application (404 otherwise).
    pub async fn resolve(state: &AppState, principal: &Principal, app_id: &str, msg_id: &str) -> ApiResult<Self> {
        let app = VisibleApp::resolve(state, principal, app_id).await?.into_app();
        let message = state.store.message(&app.id, msg_id).await?.ok_or(ApiError::NotFound("message"))?;
        Ok(Self { app, message })
    }

    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    pub fn message(&self) -> &Message {
        &self.message
    }

    pub fn into_parts(self) -> (Arc<App>, Message) {
        (self.app, self.message)
    }
}

impl VisiblePoller {
    /// The poller `poller_id` (id or uid) of the application `app_id`, if `principal` may
    /// see that application (404 otherwise).
    pub async fn resolve(state: &AppState, principal: &Principal, app_id: &str, poller_id: &str) -> ApiResult<Self> {
        let app = VisibleApp::resolve(state, principal, app_id).await?.into_app();
        let poller = state.store.poller(&app.id, poller_id).await?.ok_or(ApiError::NotFound("poller"))?;
        Ok(Self { app, poller })
    }

    /// The same poller read again (after another writer may have changed it).
    pub async fn reread(&self, state: &AppState) -> ApiResult<Self> {
        let poller = state.store.poller(&self.app.id, self.poller.id.as_str()).await?;
        Ok(Self { app: self.app.clone(), poller: poller.ok_or(ApiError::NotFound("poller"))? })
    }

    pub fn app(&self) -> &Arc<App> {
        &self.app
    }

    pub fn poller(&self) -> &Poller {
        &self.poller
    }

    pub fn into_parts(self) -> (Arc<App>, Poller) {
        (self.app, self.poller)
    }
}

/// The caller and the path's parameters, in that order: a request without a valid token
/// is a 401 whatever its path names.
async fn caller_and_path(parts: &mut Parts, state: &AppState) -> ApiResult<(Principal, HashMap<String, String>)> {
    let principal = Principal::from_request_parts(parts, state).await?;
    let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, state)
        .await
        .map_err(|rejection| ApiError::BadRequest(rejection.body_text()))?;
    Ok((principal, params))
}

/// The path parameter `name`; a route whose extractor names a parameter its path lacks is
/// a programming error, answered as a missing resource.
fn param<'a>(params: &'a HashMap<String, String>, name: &'static str) -> ApiResult<&'a str> {
    params.get(name).map(String::as_str).ok_or(ApiError::NotFound("route"))
}

impl FromRequestParts<AppState> for VisibleApp {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let (principal, params) = caller_and_path(parts, state).await?;
        Self::resolve(state, &principal, param(&params, "app_id")?).await
    }
}

impl FromRequestParts<AppState> for VisibleEndpoint {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let (principal, params) = caller_and_path(parts, state).await?;
        Self::resolve(state, &principal, param(&params, "app_id")?, param(&params, "endpoint_id")?).await
    }
}

impl FromRequestParts<AppState> for VisibleMessage {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let (principal, params) = caller_and_path(parts, state).await?;
        Self::resolve(state, &principal, param(&params, "app_id")?, param(&params, "msg_id")?).await
    }
}

impl FromRequestParts<AppState> for VisiblePoller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> ApiResult<Self> {
        let (principal, params) = caller_and_path(parts, state).await?;
        Self::resolve(state, &principal, param(&params, "app_id")?, param(&params, "poller_id")?).await
    }
}
