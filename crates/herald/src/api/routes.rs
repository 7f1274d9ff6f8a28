//! A router that remembers what it serves. Every route of the API and of the dashboard is
//! registered through [`Routes`] with its method, so the table of (method, path) pairs is
//! the router's own, not a copy kept beside it: the tests check it against the OpenAPI
//! document and derive the tenant-isolation matrix from it. Like Svix, every route also
//! answers with a trailing slash (`/api/v1/app/`): both forms are registered, the table
//! lists the canonical one.

use axum::Router;
use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{self, MethodRouter};

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
}

macro_rules! method {
    ($name:ident, $method:ident) => {
        pub fn $name<H, T>(self, path: &str, handler: H) -> Self
        where
            H: Handler<T, AppState>,
            T: 'static,
        {
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
        if path != "/" {
            self.router = self.router.route(&format!("{path}/"), route.clone());
        }
        self.router = self.router.route(path, route);
        self.table.push(Route { method, path: path.to_owned() });
        self
    }

    pub fn merge(mut self, other: Routes) -> Self {
        self.router = self.router.merge(other.router);
        self.table.extend(other.table);
        self
    }

    pub fn table(&self) -> &[Route] {
        &self.table
    }

    pub fn into_router(self) -> Router<AppState> {
        self.router
    }
}
