//! The dashboard: server-rendered HTML (maud escapes every value), every asset embedded.
//! Operators sign in with the admin token; customers arrive through the app-portal link
//! (`/portal#token=…`: the token is in the fragment, never sent in a URL, and the page
//! trades it for a cookie at once). The session is an `HttpOnly`, `SameSite=Strict`
//! cookie holding the token; every form carries a CSRF token derived from it. A viewer
//! sees what its token may see through the API, with sensitive fields masked.

mod actions;
mod pages;
mod view;

use axum::Form;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::api::{ApiError, AppState, Principal};

const COOKIE: &str = "herald_session";

pub fn router() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/", get(pages::home))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .route("/portal", get(portal))
        .route("/assets/style.css", get(style))
        .route("/assets/portal.js", get(portal_js))
        .route("/apps", get(pages::apps))
        .route("/dead-letters", get(pages::dead_letters))
        .route("/app/{app_id}", get(pages::app))
        .route("/app/{app_id}/msg/{msg_id}", get(pages::message))
        .route("/app/{app_id}/replay/{task_id}", get(pages::replay_progress))
        .route("/app/{app_id}/msg/{msg_id}/endpoint/{endpoint_id}/resend", post(actions::resend))
        .route("/app/{app_id}/endpoint/{endpoint_id}/recover", post(actions::recover))
        .route("/app/{app_id}/replay", post(actions::bulk_replay))
}

/// The signed-in viewer of a dashboard page.
pub struct Viewer {
    pub principal: Principal,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
}

/// Not signed in (or no longer): back to the login page.
pub struct SignIn;

impl IntoResponse for SignIn {
    fn into_response(self) -> Response {
        Redirect::to("/login").into_response()
    }
}

impl FromRequestParts<AppState> for Viewer {
    type Rejection = SignIn;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, SignIn> {
        let token = session_token(&parts.headers).ok_or(SignIn)?;
        let principal = Principal::from_token(state, &token).await.map_err(|_| SignIn)?;
        Ok(Self { principal, csrf: csrf_token(&token) })
    }
}

fn session_token(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|c| {
        let (name, value) = c.trim().split_once('=')?;
        (name == COOKIE && !value.is_empty()).then(|| value.to_owned())
    })
}

/// The CSRF token of a session: an HMAC of a fixed label under the session's token, so a
/// page of another site (which cannot read the cookie) cannot forge it.
fn csrf_token(session: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(session.as_bytes()).expect("HMAC takes any key length");
    mac.update(b"herald-dashboard-csrf");
    mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect()
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

/// A page or an error page.
pub struct Page {
    status: StatusCode,
    html: String,
}

impl Page {
    pub fn ok(html: maud::Markup) -> Self {
        Self { status: StatusCode::OK, html: html.into_string() }
    }

    pub fn error(status: StatusCode, message: &str) -> Self {
        Self { status, html: view::layout("Error", None, view::error(status, message)).into_string() }
    }
}

impl IntoResponse for Page {
    fn into_response(self) -> Response {
        let mut response = (self.status, Html(self.html)).into_response();
        let headers = response.headers_mut();
        // Nothing inline runs; nothing loads from elsewhere; no framing.
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; style-src 'self'; script-src 'self'; img-src 'self'; form-action 'self'; \
                 frame-ancestors 'none'; base-uri 'none'",
            ),
        );
        headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
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

async fn login_form() -> Page {
    Page::ok(view::layout("Sign in", None, view::login(None)))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

/// Trades a token for a session cookie.
async fn login(State(state): State<AppState>, Form(form): Form<LoginForm>) -> Response {
    let token = form.token.trim();
    let principal = match Principal::from_token(&state, token).await {
        Ok(principal) => principal,
        Err(_) => {
            let page = view::layout("Sign in", None, view::login(Some("That token is not valid.")));
            return (StatusCode::UNAUTHORIZED, Page::ok(page)).into_response();
        }
    };
    let secure = if state.settings.public_url.starts_with("https://") { "; Secure" } else { "" };
    let cookie = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}");
    let home = match &principal {
        Principal::Admin => "/".to_owned(),
        Principal::App { app_id, .. } => format!("/app/{app_id}"),
    };
    let mut response = Redirect::to(&home).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

#[derive(Deserialize)]
struct LogoutForm {
    csrf: String,
}

async fn logout(viewer: Viewer, Form(form): Form<LogoutForm>) -> Result<Response, Page> {
    viewer.check_csrf(&form.csrf)?;
    let mut response = Redirect::to("/login").into_response();
    let expired = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    response.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&expired).expect("ASCII"));
    Ok(response)
}

/// The app-portal entry: a page whose script posts the fragment's token to `/login`.
async fn portal() -> Page {
    Page::ok(view::layout("Signing in…", None, view::portal()))
}

async fn portal_js() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript"), (header::CACHE_CONTROL, "max-age=3600")], view::PORTAL_JS)
}

async fn style() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css"), (header::CACHE_CONTROL, "max-age=3600")], view::STYLE)
}
