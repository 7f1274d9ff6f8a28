//! `/api/v1/auth/session`: the operator's view of dashboard sessions (Herald extension).
//! Every route needs the admin token: the operator lists who is signed in and revokes one
//! session, every session of one application, or every session. A revoked session's cookie
//! opens nothing from the next request on.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::QueryMap;
use super::routes::Routes;
use super::{AppState, VisibleApp};
use crate::clock::to_rfc3339;
use crate::store::{EndSessions, Session};
use utoipa_axum::routes;

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionOut {
    pub id: String,
    /// The application of a portal session; `null` for an operator session.
    pub app_id: Option<String>,
    pub created_at: String,
    pub expires_at: String,
}

impl From<&Session> for SessionOut {
    fn from(s: &Session) -> Self {
        Self {
            id: s.id.clone(),
            app_id: s.app_id.as_ref().map(|a| a.to_string()),
            created_at: to_rfc3339(s.created_at),
            expires_at: to_rfc3339(s.expires_at),
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct SessionListOut {
    pub data: Vec<SessionOut>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct SessionsEndedOut {
    pub ended: u64,
}

pub fn routes() -> Routes {
    Routes::new().operations(routes!(list_sessions, end_sessions)).operations(routes!(end_session))
}

/// Why only the admin token manages sessions.
const OPERATOR_ONLY: &str = "dashboard sessions are managed with the operator's admin token";

/// Dashboard sessions, newest first (of one application with `app_id`).
#[utoipa::path(get, path = "/api/v1/auth/session", operation_id = "herald.session.list", tag = "Authentication",
    params(("app_id" = Option<String>, Query, description = "Only this application's portal sessions")),
    responses((status = 200, body = SessionListOut), (status = 403, body = super::error::HttpErrorOut)))]
pub async fn list_sessions(
    State(state): State<AppState>,
    principal: Principal,
    query: QueryMap,
) -> ApiResult<Json<SessionListOut>> {
    principal.require_admin_because(OPERATOR_ONLY)?;
    let app = match query.get::<String>("app_id")? {
        Some(app) => Some(VisibleApp::resolve(&state, &principal, &app).await?.id.clone()),
        None => None,
    };
    let sessions = state.store.list_sessions(app.as_ref()).await?;
    Ok(Json(SessionListOut { data: sessions.iter().map(SessionOut::from).collect() }))
}

/// Ends every dashboard session, or every session of one application (`app_id`).
#[utoipa::path(delete, path = "/api/v1/auth/session", operation_id = "herald.session.end-all", tag = "Authentication",
    params(("app_id" = Option<String>, Query, description = "Only this application's portal sessions")),
    responses((status = 200, body = SessionsEndedOut), (status = 403, body = super::error::HttpErrorOut)))]
pub async fn end_sessions(
    State(state): State<AppState>,
    principal: Principal,
    query: QueryMap,
) -> ApiResult<Json<SessionsEndedOut>> {
    principal.require_admin_because(OPERATOR_ONLY)?;
    let which = match query.get::<String>("app_id")? {
        Some(app) => EndSessions::App(VisibleApp::resolve(&state, &principal, &app).await?.id.clone()),
        None => EndSessions::All,
    };
    Ok(Json(SessionsEndedOut { ended: state.store.end_sessions(which).await? }))
}

/// Ends one dashboard session.
#[utoipa::path(delete, path = "/api/v1/auth/session/{session_id}", operation_id = "herald.session.end", tag = "Authentication",
    params(("session_id" = String, Path)),
    responses((status = 204), (status = 403, body = super::error::HttpErrorOut), (status = 404, body = super::error::HttpErrorOut)))]
pub async fn end_session(
    State(state): State<AppState>,
    principal: Principal,
    Path(session_id): Path<String>,
) -> ApiResult<StatusCode> {
    principal.require_admin_because(OPERATOR_ONLY)?;
    match state.store.end_sessions(EndSessions::Id(session_id)).await? {
        0 => Err(ApiError::NotFound("session")),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}
