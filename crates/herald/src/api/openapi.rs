//! Herald's OpenAPI document, generated from the handlers and types themselves: the Svix
//! operations plus Herald's extensions. Served at `/api/v1/openapi.json`. Its operations
//! are the router's ([`super::routes`]): each route is written once, in its handler's
//! `#[utoipa::path]`, and this file adds only what is not an operation.

use axum::Json;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "Herald API", description = "Svix-compatible webhook delivery API, with Herald's extensions."),
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

/// The document: every operation the API serves.
pub fn document() -> utoipa::openapi::OpenApi {
    super::routes().document(ApiDoc::openapi())
}

/// This document (it is built once per process).
#[utoipa::path(get, path = "/api/v1/openapi.json", operation_id = "herald.openapi", tag = "Health",
    security(()), responses((status = 200, content_type = "application/json", body = Object)))]
pub async fn serve() -> Json<&'static utoipa::openapi::OpenApi> {
    static DOCUMENT: std::sync::LazyLock<utoipa::openapi::OpenApi> = std::sync::LazyLock::new(document);
    Json(&DOCUMENT)
}
