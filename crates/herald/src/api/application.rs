//! `/api/v1/app`: applications (our user's customers).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::auth::Principal;
use super::error::{ApiError, ApiResult, ValidationItem};
use super::extract::{JsonBody, QueryMap};
use super::list::{Cursor, ListResponse, Order, Page};
use super::routes::Routes;
use super::validate::{Problems, chosen_id, double_option, same_id};
use super::{AppState, VisibleApp, optimistic, require_admin_for};
use crate::brand::Brand;
use crate::clock::{now_ms, to_rfc3339};
use crate::egress::EgressProxy;
use crate::ids::AppId;
use crate::store::{App, AppProxy, Metadata};
use utoipa_axum::routes;

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationIn {
    /// Herald extension (operator only, on creation): keep an id another server minted
    /// (`app_` and 16 to 64 letters and digits), as `herald import svix` does. Herald
    /// mints its own when absent.
    pub id: Option<String>,
    pub name: String,
    pub uid: Option<String>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
    /// Also accepted as `rateLimit` (Svix's deprecated name).
    #[serde(alias = "rateLimit")]
    pub throttle_rate: Option<u16>,
    /// Herald extension: attempts in flight at most (default 16).
    pub max_concurrency: Option<u32>,
    /// Herald extension: share of contended delivery capacity (default 1).
    pub weight: Option<u32>,
    /// Herald extension: the portal's brand for this application, over the server's. A
    /// `PUT` without it keeps the current one (the SDKs do not know the field).
    pub portal_brand: Option<Brand>,
    /// Herald extension (operator only): the egress proxy this application's attempts go
    /// through, over the server's `delivery.proxy_url` (`http://[user:password@]host:port`).
    /// A `PUT` without it keeps the current one.
    pub proxy_url: Option<String>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationPatch {
    pub name: Option<String>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub uid: Option<Option<String>>,
    pub metadata: Option<Metadata>,
    #[serde(default, alias = "rateLimit", deserialize_with = "double_option")]
    #[schema(value_type = Option<u16>)]
    pub throttle_rate: Option<Option<u16>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<u32>)]
    pub max_concurrency: Option<Option<u32>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<u32>)]
    pub weight: Option<Option<u32>>,
    /// `null` removes it (the server's brand applies).
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Brand>)]
    pub portal_brand: Option<Option<Brand>>,
    /// `null` removes it (the server's proxy, if any, applies).
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub proxy_url: Option<Option<String>>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationOut {
    pub id: String,
    pub uid: Option<String>,
    pub name: String,
    pub metadata: Metadata,
    pub throttle_rate: Option<u16>,
    /// Deprecated in Svix, still returned when set: `throttleRate`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<u16>,
    /// Attempts in flight at most (Herald extension; absent: 16).
    pub max_concurrency: Option<u32>,
    /// Share of contended delivery capacity (Herald extension; absent: 1).
    pub weight: Option<u32>,
    /// The portal's brand for this application (Herald extension; absent: the server's).
    pub portal_brand: Option<Brand>,
    /// The application's egress proxy, without its credentials (Herald extension; absent:
    /// the server's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy_url: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl From<&App> for ApplicationOut {
    fn from(app: &App) -> Self {
        Self {
            id: app.id.to_string(),
            uid: app.uid.clone(),
            name: app.name.clone(),
            metadata: app.metadata.clone(),
            throttle_rate: app.throttle_rate,
            rate_limit: app.throttle_rate,
            max_concurrency: app.max_concurrency,
            weight: app.weight,
            portal_brand: app.portal_brand.clone(),
            proxy_url: app.proxy.as_ref().map(|p| p.url.clone()),
            created_at: to_rfc3339(app.created_at),
            updated_at: to_rfc3339(app.updated_at),
        }
    }
}

pub fn routes() -> Routes {
    Routes::new()
        .operations(routes!(list_apps, create_app))
        .operations(routes!(get_app, upsert_app, patch_app, delete_app))
}

/// Why a portal token may not change its application.
const OPERATOR_OWNS_APPS: &str = "the operator owns the application (its uid, name, metadata, limits and deletion): \
     an app-portal token may read it but not change it";

/// The largest `maxConcurrency` and `weight` accepted.
const MAX_CONCURRENCY: u32 = 10_000;
const MAX_WEIGHT: u32 = 1_000;

fn check(app: &App) -> ApiResult<()> {
    let mut p = Problems::default();
    p.check(!app.name.trim().is_empty(), "name", "must not be empty");
    if let Some(uid) = &app.uid {
        p.uid("uid", uid, AppId::PREFIX);
    }
    p.check(app.throttle_rate != Some(0), "throttleRate", "must be at least 1");
    let within = |v: Option<u32>, max: u32| v.is_none_or(|v| (1..=max).contains(&v));
    p.check(within(app.max_concurrency, MAX_CONCURRENCY), "maxConcurrency", "must be between 1 and 10000");
    p.check(within(app.weight, MAX_WEIGHT), "weight", "must be between 1 and 1000");
    for (field, message) in app.portal_brand.as_ref().map(Brand::problems).unwrap_or_default() {
        p.check(false, &format!("portalBrand.{field}"), &message);
    }
    p.finish()
}

/// Creates an application from `input`; `path_uid` is the uid to use when the input has
/// none (upserts name the application in the path).
pub async fn create_app_from(state: &AppState, input: ApplicationIn, path_uid: Option<&str>) -> ApiResult<App> {
    let now = now_ms();
    let id = chosen_id(input.id.as_deref(), AppId::PREFIX, AppId::parse_foreign, AppId::generate)?;
    let proxy = input.proxy_url.as_deref().map(|text| app_proxy(state, text, &id)).transpose()?;
    let app = App {
        id,
        proxy,
        uid: input.uid.or_else(|| path_uid.map(str::to_owned)),
        name: input.name,
        metadata: input.metadata.unwrap_or_default(),
        throttle_rate: input.throttle_rate,
        max_concurrency: input.max_concurrency,
        weight: input.weight,
        portal_brand: input.portal_brand,
        created_at: now,
        updated_at: now,
    };
    check(&app)?;
    state.store.insert_app(&app).await?;
    Ok(app)
}

/// The application a request names in its path, or the one it creates inline (Svix's
/// `application` field of message creation and portal access, ignored when the application
/// exists). The inline application must carry the path's value as its `uid`: otherwise the
/// request is a 422, rather than an application created under a name nobody asked for.
/// Without it, an unknown application is a 404.
pub async fn app_for_inline(state: &AppState, id_or_uid: &str, inline: Option<ApplicationIn>) -> ApiResult<Arc<App>> {
    if let Some(app) = state.catalog.app(id_or_uid).await? {
        return Ok(app);
    }
    let Some(input) = inline else { return Err(ApiError::NotFound("application")) };
    let refused = |msg: &str, kind: &str| {
        let loc = ["body", "application", "uid"].map(str::to_owned).to_vec();
        ApiError::Validation(vec![ValidationItem { loc, msg: msg.into(), kind: kind.into() }])
    };
    match input.uid.as_deref() {
        // Boxed: creating is rare, and its future would otherwise make every message
        // create's as large.
        Some(uid) if uid == id_or_uid => Ok(Arc::new(Box::pin(create_app_from(state, input, None)).await?)),
        Some(_) => Err(refused("Application UID in the path and body must match", "application_uid_mismatch")),
        None => Err(refused("Application UID not set in body", "application_uid_missing")),
    }
}

/// Lists applications: the operator's (a portal token gets 403, as in Svix; it reads its own
/// application at `GET /api/v1/app/{app_id}`).
#[utoipa::path(get, path = "/api/v1/app", operation_id = "v1.application.list", tag = "Application",
    params(("limit" = Option<usize>, Query), ("iterator" = Option<String>, Query), ("order" = Option<String>, Query)),
    responses((status = 200, body = ListResponse<ApplicationOut>)))]
pub async fn list_apps(
    State(state): State<AppState>,
    principal: Principal,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<ApplicationOut>>> {
    principal.require_admin()?;
    let page = Page::from_query(&query, Order::Ascending, Cursor::Id(AppId::PREFIX))?;
    let apps = state.store.list_apps(&page.query()).await?;
    Ok(Json(page.finish(apps, |a| a.id.to_string(), |a| ApplicationOut::from(&a))))
}

/// Creates an application; with `get_if_exists=true` an existing uid returns it (200).
#[utoipa::path(post, path = "/api/v1/app", operation_id = "v1.application.create", tag = "Application",
    request_body = ApplicationIn, params(("get_if_exists" = Option<bool>, Query)),
    responses((status = 201, body = ApplicationOut), (status = 200, body = ApplicationOut),
        (status = 409, body = super::error::HttpErrorOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn create_app(
    State(state): State<AppState>,
    principal: Principal,
    query: QueryMap,
    body: JsonBody<ApplicationIn>,
) -> ApiResult<(StatusCode, Json<ApplicationOut>)> {
    principal.require_admin()?;
    if query.flag("get_if_exists", false)?
        && let Some(uid) = &body.value.uid
        && let Some(existing) = state.store.app(uid).await?.filter(|a| a.uid.as_deref() == Some(uid))
    {
        return Ok((StatusCode::OK, Json(ApplicationOut::from(&existing))));
    }
    let app = create_app_from(&state, body.value, None).await?;
    Ok((StatusCode::CREATED, Json(ApplicationOut::from(&app))))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}", operation_id = "v1.application.get", tag = "Application",
    params(("app_id" = String, Path)), responses((status = 200, body = ApplicationOut), (status = 404, body = super::error::HttpErrorOut)))]
pub async fn get_app(app: VisibleApp) -> ApiResult<Json<ApplicationOut>> {
    Ok(Json(ApplicationOut::from(&*app)))
}

/// Updates an application, or creates it (with the path as its uid) when it does not exist.
/// The operator owns applications: a portal token may read its own, never change it.
#[utoipa::path(put, path = "/api/v1/app/{app_id}", operation_id = "v1.application.update", tag = "Application",
    request_body = ApplicationIn, params(("app_id" = String, Path)),
    responses((status = 200, body = ApplicationOut), (status = 201, body = ApplicationOut)))]
pub async fn upsert_app(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    body: JsonBody<ApplicationIn>,
) -> ApiResult<(StatusCode, Json<ApplicationOut>)> {
    require_admin_for(&state, &principal, &app_id, OPERATOR_OWNS_APPS).await?;
    let input = body.value;
    if state.store.app(&app_id).await?.is_none() {
        match create_app_from(&state, input.clone(), Some(&app_id)).await {
            Ok(app) => return Ok((StatusCode::CREATED, Json(ApplicationOut::from(&app)))),
            // Created by a simultaneous PUT: this one updates it.
            Err(ApiError::Conflict(_)) if state.store.app(&app_id).await?.is_some() => {}
            Err(e) => return Err(e),
        }
    }
    let app = modify(&state, &app_id, |app| {
        let input = input.clone();
        same_id(input.id.as_deref(), app.id.as_str())?;
        *app = App {
            uid: input.uid.or_else(|| app.uid.clone()),
            name: input.name,
            metadata: input.metadata.unwrap_or_default(),
            throttle_rate: input.throttle_rate,
            max_concurrency: input.max_concurrency,
            weight: input.weight,
            portal_brand: input.portal_brand.or_else(|| app.portal_brand.clone()),
            proxy: match input.proxy_url.as_deref() {
                Some(text) => Some(app_proxy(&state, text, &app.id)?),
                None => app.proxy.clone(),
            },
            ..app.clone()
        };
        Ok(())
    })
    .await?;
    Ok((StatusCode::OK, Json(ApplicationOut::from(&app))))
}

#[utoipa::path(patch, path = "/api/v1/app/{app_id}", operation_id = "patch_application", tag = "Application",
    request_body = ApplicationPatch, params(("app_id" = String, Path)), responses((status = 200, body = ApplicationOut)))]
pub async fn patch_app(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    body: JsonBody<ApplicationPatch>,
) -> ApiResult<Json<ApplicationOut>> {
    require_admin_for(&state, &principal, &app_id, OPERATOR_OWNS_APPS).await?;
    let patch = body.value;
    let app = modify(&state, &app_id, |app| {
        let patch = patch.clone();
        if let Some(name) = patch.name {
            app.name = name;
        }
        if let Some(uid) = patch.uid {
            app.uid = uid;
        }
        if let Some(metadata) = patch.metadata {
            app.metadata = metadata;
        }
        if let Some(rate) = patch.throttle_rate {
            app.throttle_rate = rate;
        }
        if let Some(cap) = patch.max_concurrency {
            app.max_concurrency = cap;
        }
        if let Some(weight) = patch.weight {
            app.weight = weight;
        }
        if let Some(brand) = patch.portal_brand {
            app.portal_brand = brand;
        }
        if let Some(proxy) = patch.proxy_url {
            app.proxy = proxy.as_deref().map(|text| app_proxy(&state, text, &app.id)).transpose()?;
        }
        Ok(())
    })
    .await?;
    Ok(Json(ApplicationOut::from(&app)))
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}", operation_id = "v1.application.delete", tag = "Application",
    params(("app_id" = String, Path)), responses((status = 204)))]
pub async fn delete_app(State(state): State<AppState>, principal: Principal, app: VisibleApp) -> ApiResult<StatusCode> {
    principal.require_admin_because(OPERATOR_OWNS_APPS)?;
    state.store.delete_app(&app.id).await?;
    state.catalog.invalidate_app(&app);
    state.dispatcher.app_changed(&app.id).await;
    Ok(StatusCode::NO_CONTENT)
}

/// An application's egress proxy as stored: its address, and its credentials sealed.
fn app_proxy(state: &AppState, text: &str, app: &AppId) -> ApiResult<AppProxy> {
    let proxy = EgressProxy::parse(text).map_err(|e| ApiError::invalid("proxyUrl", e))?;
    let credentials = state.keyring.seal_proxy_credentials(proxy.authorization().unwrap_or_default(), app.as_str());
    Ok(AppProxy { url: proxy.address(), credentials })
}

/// Changes the application `id_or_uid` as `change` says, atomically: applied to the row as
/// stored (never a cached copy), checked, and written back only if nobody wrote it meanwhile
/// (otherwise applied again to the newer one; see `optimistic`).
async fn modify(
    state: &AppState,
    id_or_uid: &str,
    mut change: impl FnMut(&mut App) -> ApiResult<()>,
) -> ApiResult<App> {
    optimistic::retry_stale! {
        let before = state.store.app(id_or_uid).await?.ok_or(ApiError::NotFound("application"))?;
        let mut app = before.clone();
        change(&mut app)?;
        app.updated_at = optimistic::next_version(before.updated_at);
        check(&app)?;
        optimistic::won(state.store.update_app(&app, before.updated_at).await?, "application")?;
        state.catalog.invalidate_app(&app);
        Ok(app)
    }
}
