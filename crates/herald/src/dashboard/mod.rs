//! The dashboard: server-rendered HTML (maud escapes every value), every asset embedded.
//! Operators sign in with the admin token; customers arrive through the app-portal link
//! (`/portal#token=…`: the token is in the fragment, never sent in a URL, and the page
//! trades it for a session at once). Sessions and CSRF tokens are in [`session`]. A viewer
//! sees what its token may see through the API, with sensitive fields masked.

mod actions;
mod apps;
mod catalog;
mod chart;
mod credentials;
mod destination;
mod endpoint_forms;
mod endpoints;
mod form;
mod log;
mod look;
mod names;
mod overview;
mod pages;
mod pollers;
mod scripts;
mod session;
mod trends;
mod view;

use axum::Form;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::api::{ApiError, AppState, Principal, Routes, client_address, token_hash};
use crate::store::EndSessions;
use look::Look;
pub use look::headers as security_headers;

pub fn routes() -> Routes {
    Routes::new()
        .get("/", overview::home)
        .get("/login", login_form)
        .post("/login", login)
        .post("/logout", logout)
        .get("/portal", portal)
        .get("/assets/style.css", style)
        .get("/assets/portal.js", portal_js)
        .get("/assets/live.js", live_js)
        .get("/assets/icon.svg", icon)
        .get("/apps", apps::list)
        .get("/search", overview::search)
        .get("/dead-letters", overview::dead_letters)
        .get("/app/{app_id}", apps::page)
        .get("/app/{app_id}/log", log::page)
        .post("/app/{app_id}/portal-links/revoke", actions::revoke_portal_links)
        .get("/app/{app_id}/event-types", catalog::page)
        .get("/app/{app_id}/endpoint/new", endpoints::new_form)
        .post("/app/{app_id}/endpoint/new", endpoint_forms::create)
        .get("/app/{app_id}/endpoint/{endpoint_id}", endpoints::detail)
        .post("/app/{app_id}/endpoint/{endpoint_id}/settings", endpoint_forms::update)
        .post("/app/{app_id}/endpoint/{endpoint_id}/enabled", endpoint_forms::enabled)
        .post("/app/{app_id}/endpoint/{endpoint_id}/delete", endpoint_forms::delete)
        .post("/app/{app_id}/endpoint/{endpoint_id}/headers", endpoint_forms::headers)
        .post("/app/{app_id}/endpoint/{endpoint_id}/secret/rotate", endpoint_forms::rotate)
        .post("/app/{app_id}/endpoint/{endpoint_id}/test", endpoint_forms::test_event)
        .post("/app/{app_id}/endpoint/{endpoint_id}/retry", endpoint_forms::retry)
        .post("/app/{app_id}/endpoint/{endpoint_id}/simulate", scripts::try_it)
        .get("/app/{app_id}/msg/{msg_id}", log::message)
        .get("/app/{app_id}/replay/{task_id}", log::replay_progress)
        .post("/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend", actions::resend)
        .post("/app/{app_id}/endpoint/{endpoint_id}/recover", actions::recover)
        .post("/app/{app_id}/replay", actions::bulk_replay)
        .post("/app/{app_id}/poller/new", pollers::create)
        .post("/app/{app_id}/poller/{poller_id}/delete", pollers::delete)
}

/// The signed-in viewer of a dashboard page.
pub struct Viewer {
    pub principal: Principal,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
    /// The brand its pages carry, and whether they may be framed.
    pub look: Look,
}

/// Why a page is not served: not signed in (or no longer), back to the login page; or the
/// session's token is over its request budget, a 429 that says when to come back.
pub enum SignIn {
    Needed,
    Busy(std::time::Duration),
}

impl IntoResponse for SignIn {
    fn into_response(self) -> Response {
        match self {
            SignIn::Needed => Redirect::to("/login").into_response(),
            SignIn::Busy(wait) => {
                let page = Page::error(StatusCode::TOO_MANY_REQUESTS, "Too many requests at once; wait a moment.");
                let mut response = page.into_response();
                let secs = wait.as_secs().max(1).to_string();
                response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_str(&secs).expect("digits"));
                response
            }
        }
    }
}

impl FromRequestParts<AppState> for Viewer {
    type Rejection = SignIn;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, SignIn> {
        let secret = session::cookie(&parts.headers, session::COOKIE).ok_or(SignIn::Needed)?;
        let principal = session::resolve(state, &secret).await.ok_or(SignIn::Needed)?.map_err(SignIn::Busy)?;
        let look = Look::of(state, &principal).await;
        Ok(Self { principal, csrf: session::csrf_token(&secret), look })
    }
}

impl Viewer {
    /// Refuses a state-changing form without this session's CSRF token.
    pub fn check_csrf(&self, given: &str) -> Result<(), Page> {
        if given.as_bytes().ct_eq(self.csrf.as_bytes()).into() {
            Ok(())
        } else {
            Err(Page::error(StatusCode::FORBIDDEN, "This form expired or did not come from the dashboard."))
        }
    }
}

/// A page or an error page, with the look its security headers are built from
/// ([`look::headers`]).
pub struct Page {
    status: StatusCode,
    html: String,
    look: Look,
}

impl Page {
    /// A signed-in viewer's page.
    pub fn of(viewer: &Viewer, title: &str, body: maud::Markup) -> Self {
        let html = view::layout(title, Some(pages::nav_for(viewer)), &viewer.look.brand, body).into_string();
        Self { status: StatusCode::OK, html, look: viewer.look.clone() }
    }

    /// A page shown before sign-in, in the server's brand.
    pub fn public(state: &AppState, title: &str, body: maud::Markup) -> Self {
        let look = Look::public(state);
        let html = view::layout(title, None, &look.brand, body).into_string();
        Self { status: StatusCode::OK, html, look }
    }

    pub fn with_status(self, status: StatusCode) -> Self {
        Self { status, ..self }
    }

    /// An error page, in Herald's own colours (it may be shown before anything is known).
    pub fn error(status: StatusCode, message: &str) -> Self {
        let look = Look { brand: Default::default(), embeddable: true };
        let html = view::layout("Error", None, &look.brand, view::error(status, message)).into_string();
        Self { status, html, look }
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let mut response = (self.status, Html(self.html)).into_response();
        response.extensions_mut().insert(self.look);
        response
    }
}

impl From<ApiError> for Page {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::NotFound(what) => Page::error(StatusCode::NOT_FOUND, &format!("No such {what}.")),
            ApiError::Forbidden(why) => Page::error(StatusCode::FORBIDDEN, why),
            ApiError::Validation(items) => {
                let text: Vec<String> = items.iter().map(|i| format!("{}: {}", i.loc.join("."), i.msg)).collect();
                Page::error(StatusCode::UNPROCESSABLE_ENTITY, &text.join("; "))
            }
            other => {
                tracing::warn!(error = %other, "dashboard page failed");
                Page::error(StatusCode::INTERNAL_SERVER_ERROR, "Something went wrong; try again.")
            }
        }
    }
}

/// The sign-in page, with a fresh sign-in token in its form and cookie.
async fn login_form(State(state): State<AppState>, headers: HeaderMap) -> Response {
    login_page(&state, &headers, StatusCode::OK, None)
}

fn login_page(state: &AppState, request: &HeaderMap, status: StatusCode, problem: Option<&str>) -> Response {
    let (cookie, token) = session::login_token(state, request);
    let page = Page::public(state, "Sign in", view::login(&token, problem));
    let mut response = (status, page).into_response();
    response.headers_mut().insert(header::SET_COOKIE, cookie);
    response
}

#[derive(Deserialize)]
struct LoginForm {
    #[serde(default)]
    token: String,
    #[serde(default)]
    csrf: String,
}

/// Trades a token for a session, if the form came from Herald's own sign-in page.
async fn login(State(state): State<AppState>, parts: Parts, Form(form): Form<LoginForm>) -> Response {
    if !session::login_is_genuine(&state, &parts.headers, &form.csrf) {
        let why = "This sign-in form expired or did not come from Herald's own page; sign in again.";
        return login_page(&state, &parts.headers, StatusCode::FORBIDDEN, Some(why));
    }
    let token = form.token.trim();
    let principal = match Principal::from_token(&state, token, client_address(&parts)).await {
        Ok(principal) => principal,
        Err(ApiError::TooManyFailedAuthentications(_)) => {
            let why = "Too many failed sign-ins from this address; wait a minute and try again.";
            return login_page(&state, &parts.headers, StatusCode::TOO_MANY_REQUESTS, Some(why));
        }
        Err(_) => {
            return login_page(&state, &parts.headers, StatusCode::UNAUTHORIZED, Some("That token is not valid."));
        }
    };
    let (secret, lifetime) = match session::open(&state, &principal, token).await {
        Ok(opened) => opened,
        Err(e) => return Page::from(ApiError::from(e)).into_response(),
    };
    let home = match &principal {
        Principal::Admin => "/".to_owned(),
        Principal::App { app_id, .. } => format!("/app/{app_id}"),
    };
    let mut response = Redirect::to(&home).into_response();
    let headers = response.headers_mut();
    headers.append(header::SET_COOKIE, session::set_cookie(&state, &parts.headers, session::COOKIE, &secret, lifetime));
    headers.append(header::SET_COOKIE, session::set_cookie(&state, &parts.headers, session::LOGIN_COOKIE, "", 0));
    response
}

#[derive(Deserialize)]
struct LogoutForm {
    csrf: String,
}

/// Ends the session: its row is deleted, so the cookie opens nothing even if kept.
async fn logout(
    State(state): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Form(form): Form<LogoutForm>,
) -> Result<Response, Page> {
    viewer.check_csrf(&form.csrf)?;
    if let Some(secret) = session::cookie(&headers, session::COOKIE) {
        state.store.end_sessions(EndSessions::Hash(token_hash(&secret))).await.map_err(ApiError::from)?;
    }
    let mut response = Redirect::to("/login").into_response();
    let cleared = session::set_cookie(&state, &headers, session::COOKIE, "", 0);
    response.headers_mut().insert(header::SET_COOKIE, cleared);
    Ok(response)
}

/// The app-portal entry: a page whose script posts the fragment's token to `/login`, with
/// a sign-in token like the sign-in page's.
async fn portal(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let (cookie, token) = session::login_token(&state, &headers);
    let mut response = Page::public(&state, "Signing in…", view::portal(&token)).into_response();
    response.headers_mut().insert(header::SET_COOKIE, cookie);
    response
}

async fn icon() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "image/svg+xml"), (header::CACHE_CONTROL, "max-age=86400")], view::ICON)
}

async fn live_js() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript"), (header::CACHE_CONTROL, "max-age=3600")], view::LIVE_JS)
}

async fn portal_js() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript"), (header::CACHE_CONTROL, "max-age=3600")], view::PORTAL_JS)
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css"), (header::CACHE_CONTROL, "max-age=3600")], view::STYLE)
}
