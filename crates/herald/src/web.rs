//! What a process's HTTP port serves: the API and the dashboard, composed here, above
//! both (the dashboard calls the API's handlers; the API knows nothing of the dashboard).

use axum::Router;
use axum::middleware::from_fn_with_state;

use crate::api::{self, ApiError, AppState, Route};
use crate::dashboard;

/// What a full process serves: the API and the dashboard, and Svix's answers for routes
/// and methods that do not exist.
pub fn router(state: AppState) -> Router {
    let dashboard =
        dashboard::routes().into_router().layer(from_fn_with_state(state.clone(), dashboard::security_headers));
    api::router(&state)
        .merge(dashboard)
        .fallback(|| async { ApiError::NotFound("route") })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .with_state(state)
}

/// Every (method, path) that [`router`] serves, read from the routes as they are built.
pub fn route_table() -> Vec<Route> {
    api::routes().merge(dashboard::routes()).table().to_vec()
}
