//! A router that remembers what it serves. Every route of the API and of the dashboard is
//! registered through [`Routes`] with its method, so the table of (method, path) pairs is
//! the router's own, not a copy kept beside it: the tests derive the tenant-isolation
//! matrix from it. Like Svix, every route also answers with a trailing slash
//! (`/api/v1/app/`): both forms are registered, the table lists the canonical one.
//!
//! An API route is written once, in its handler's `#[utoipa::path]`: [`Routes::operations`]
//! takes what `utoipa_axum::routes!` makes of the handlers (path, methods, operation and
//! schemas) and serves it, so the OpenAPI document is built from the same table the router
//! serves ([`Routes::document`]). The plain methods (`get`, `post`, …) are for the
//! dashboard's HTML pages and refuse `/api/` paths.

use axum::Router;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{self, MethodRouter};
use utoipa::openapi::path::Paths;
use utoipa::openapi::schema::Schema;
use utoipa::openapi::{OpenApi, RefOr};
use utoipa_axum::router::UtoipaMethodRouter;

use super::AppState;

/// One route: a method and a path template (`/api/v1/app/{app_id}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Route {
    pub method: Method,
    pub path: String,
}

/// A router under construction and the table of everything it serves.
#[derive(Default)]
pub struct Routes {
    router: Router<AppState>,
    table: Vec<Route>,
    /// The OpenAPI operations of the routes added by [`Routes::operations`].
    paths: Paths,
    schemas: Vec<(String, RefOr<Schema>)>,
}

macro_rules! method {
    ($name:ident, $method:ident) => {
        pub fn $name<H, T>(self, path: &str, handler: H) -> Self
        where
            H: Handler<T, AppState>,
            T: 'static,
        {
            assert!(!path.starts_with("/api/"), "{path}: an API route is added by `operations`, with its document");
            self.add(Method::$method, path, routing::$name(handler))
        }
    };
}

impl Routes {
    pub fn new() -> Self {
        Self::default()
    }

    method!(get, GET);
    method!(head, HEAD);
    method!(post, POST);
    method!(put, PUT);
    method!(patch, PATCH);
    method!(delete, DELETE);

    fn add(mut self, method: Method, path: &str, route: MethodRouter<AppState>) -> Self {
        self.mount(path, route);
        self.table.push(Route { method, path: path.to_owned() });
        self
    }

    fn mount(&mut self, path: &str, route: MethodRouter<AppState>) {
        let router = std::mem::take(&mut self.router);
        self.router = match path {
            "/" => router.route(path, route),
            _ => router.route(&format!("{path}/"), route.clone()).route(path, route),
        };
    }

    /// Serves API operations as their `#[utoipa::path]` attributes describe them: the
    /// output of `utoipa_axum::routes!(handler, …)` (handlers of one path).
    pub fn operations(mut self, (schemas, paths, route): UtoipaMethodRouter<AppState>) -> Self {
        for (path, item) in &paths.paths {
            self.mount(path, route.clone());
            let served = [
                (Method::GET, item.get.is_some()),
                (Method::HEAD, item.head.is_some()),
                (Method::POST, item.post.is_some()),
                (Method::PUT, item.put.is_some()),
                (Method::PATCH, item.patch.is_some()),
                (Method::DELETE, item.delete.is_some()),
            ];
            let methods = served.into_iter().filter(|(_, is)| *is).map(|(method, _)| method);
            self.table.extend(methods.map(|method| Route { method, path: path.clone() }));
        }
        self.paths.merge(paths);
        self.schemas.extend(schemas);
        self
    }

    pub fn merge(mut self, other: Routes) -> Self {
        self.router = self.router.merge(other.router);
        self.table.extend(other.table);
        self.paths.merge(other.paths);
        self.schemas.extend(other.schemas);
        self
    }

    /// `base` with the operations of these routes and the schemas they name.
    pub fn document(&self, mut base: OpenApi) -> OpenApi {
        base.paths.merge(self.paths.clone());
        let components = base.components.get_or_insert_with(Default::default);
        components.schemas.extend(self.schemas.iter().cloned());
        base
    }

    pub fn table(&self) -> &[Route] {
        &self.table
    }

    pub fn into_router(self) -> Router<AppState> {
        self.router
    }
}
