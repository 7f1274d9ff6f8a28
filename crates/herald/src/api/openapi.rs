//! Herald's OpenAPI document, generated from the handlers and types themselves: the Svix
//! operations plus Herald's extensions. Served at `/api/v1/openapi.json`.

use axum::Json;
use utoipa::OpenApi;

use super::{
    application, attempt, auth, consumer, dead_letters, endpoint, endpoint_ops, event_type, health, message, poller,
    portal_access, session, stats, transformation,
};

#[derive(OpenApi)]
#[openapi(
    info(title = "Herald API", description = "Svix-compatible webhook delivery API, with Herald's extensions."),
    paths(
        application::list_apps, application::create_app, application::get_app, application::upsert_app,
        application::patch_app, application::delete_app,
        endpoint::list_endpoints, endpoint::create_endpoint, endpoint::get_endpoint, endpoint::upsert_endpoint,
        endpoint::patch_endpoint, endpoint::delete_endpoint,
        endpoint_ops::get_secret, endpoint_ops::rotate_secret, endpoint_ops::get_headers, endpoint_ops::update_headers,
        endpoint_ops::patch_headers, endpoint_ops::get_stats, endpoint_ops::recover, endpoint_ops::send_example,
        transformation::simulate, transformation::filtered,
        message::list_messages, message::create_message, message::get_message, message::expunge_content,
        attempt::list_by_endpoint, attempt::list_by_msg, attempt::list_attempted_messages,
        attempt::list_attempted_destinations, attempt::get_attempt, attempt::expunge_attempt_content, attempt::resend,
        portal_access::app_portal_access, portal_access::dashboard_access, portal_access::expire_all, auth::logout,
        session::list_sessions, session::end_sessions, session::end_session,
        event_type::list_event_types, event_type::create_event_type, event_type::get_event_type,
        event_type::upsert_event_type, event_type::patch_event_type, event_type::delete_event_type,
        health::health, health::health_head, health::ping, health::ping_head,
        stats::endpoint_health, stats::retry_now, stats::slow_endpoints, stats::summary,
        dead_letters::dead_letter_stats, dead_letters::replay, dead_letters::replay_progress,
        poller::list_pollers, poller::create_poller, poller::get_poller, poller::patch_poller, poller::delete_poller,
        consumer::consume, consumer::seek,
    ),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "HTTPBearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        doc.security = Some(vec![SecurityRequirement::new("HTTPBearer", Vec::<String>::new())]);
    }
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

pub async fn serve() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}
