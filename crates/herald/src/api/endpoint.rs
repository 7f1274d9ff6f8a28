//! `/api/v1/app/{app_id}/endpoint`: an application's endpoints (CRUD). Secrets, headers,
//! stats and manual retries are in `endpoint_ops`.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap};
use super::list::{Cursor, ListResponse, Order, Page};
use super::routes::Routes;
use super::validate::{Problems, chosen_id, double_option, same_id};
use super::{AppState, optimistic, visible_app, visible_endpoint};
use crate::clock::{now_ms, to_rfc3339};
use crate::delivery_auth::{AuthSummary, ClientTls, Credentials, CredentialsSummary, DeliveryAuth, TlsSummary};
use crate::endpoint_settings::{DeliverySettings, EffectiveSettings};
use crate::headers::is_reserved_header;
use crate::ids::EndpointId;
use crate::postback::{RequestSettings, Template};
use crate::signing::{EndpointKey, SigningKey};
use crate::store::{App, Endpoint, Headers, Metadata, Scripts, SealedAuth, SealedHeaders, Secrets};

/// Body of create (POST) and update (PUT). `secret` is only used when creating.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointIn {
    /// Herald extension (admin token only, on creation): keep an id another server minted
    /// (`ep_` and 16 to 64 letters and digits), as `herald import svix` does. Herald
    /// mints its own when absent.
    pub id: Option<String>,
    pub url: String,
    pub description: Option<String>,
    pub disabled: Option<bool>,
    /// Also accepted as `filterTypes` (Svix's deprecated name).
    #[serde(alias = "filterTypes")]
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    pub metadata: Option<Metadata>,
    pub secret: Option<String>,
    /// Also accepted as `rateLimit` (Svix's deprecated name).
    #[serde(alias = "rateLimit")]
    pub throttle_rate: Option<u16>,
    pub uid: Option<String>,
    pub headers: Option<Headers>,
    /// Herald extension: timeout, retry policy and retried failures.
    pub delivery: Option<DeliverySettings>,
    /// Herald extension: method, URL template and body format (postbacks).
    pub request: Option<RequestSettings>,
    /// Herald extension: a jq expression run on `{eventType, channels, payload, headers,
    /// method, url}` at ingest; the endpoint gets the message only if it yields `true`.
    pub filter: Option<String>,
    /// Herald extension: a jq expression run on the same object before each attempt; its
    /// result (an object with any of `payload`, `headers`, `method`, `url`) replaces those
    /// parts of the request, and `null` drops the delivery.
    pub transform: Option<String>,
    /// Herald extension: credentials presented to the receiver (write-only). Kept when an
    /// update leaves it out.
    pub auth: Option<DeliveryAuth>,
    /// Herald extension: the client certificate presented when the receiver asks (mutual
    /// TLS), and the CAs trusted for it (write-only). Kept when an update leaves it out.
    pub tls: Option<ClientTls>,
    /// Svix's deprecated version number (at least 1; default 1, kept when an update leaves
    /// it out). Read back as set; nothing else uses it.
    pub version: Option<i32>,
}

#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointPatch {
    pub url: Option<String>,
    pub description: Option<String>,
    pub disabled: Option<bool>,
    #[serde(default, alias = "filterTypes", deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<String>>)]
    pub event_types: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Vec<String>>)]
    pub channels: Option<Option<Vec<String>>>,
    pub metadata: Option<Metadata>,
    #[serde(default, alias = "rateLimit", deserialize_with = "double_option")]
    #[schema(value_type = Option<u16>)]
    pub throttle_rate: Option<Option<u16>>,
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub uid: Option<Option<String>>,
    /// `null` resets every delivery setting to the server defaults.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<DeliverySettings>)]
    pub delivery: Option<Option<DeliverySettings>>,
    /// `null` goes back to plain signed JSON POSTs to `url`.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<RequestSettings>)]
    pub request: Option<Option<RequestSettings>>,
    /// `null` removes the filter.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub filter: Option<Option<String>>,
    /// `null` removes the transform.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<String>)]
    pub transform: Option<Option<String>>,
    /// `null` removes the credentials.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<DeliveryAuth>)]
    pub auth: Option<Option<DeliveryAuth>>,
    /// `null` removes the client certificate.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<ClientTls>)]
    pub tls: Option<Option<ClientTls>>,
    /// Svix's deprecated version number (at least 1).
    pub version: Option<i32>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointOut {
    pub id: String,
    pub uid: Option<String>,
    pub url: String,
    pub description: String,
    pub disabled: bool,
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    pub metadata: Metadata,
    pub throttle_rate: Option<u16>,
    pub created_at: String,
    pub updated_at: String,
    /// Deprecated in Svix, still returned: always 1.
    pub version: i32,
    /// Deprecated in Svix, still returned: `throttleRate`.
    pub rate_limit: Option<u16>,
    /// Deprecated in Svix, still returned: `eventTypes`.
    pub filter_types: Option<Vec<String>>,
    /// Herald extension: the delivery settings in force, defaults filled in.
    pub delivery: EffectiveSettings,
    /// Herald extension: the request settings, when set (postbacks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestSettings>,
    /// Herald extension: the jq filter, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Herald extension: the jq transform, when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transform: Option<String>,
    /// Herald extension: which credentials are presented to the receiver, when set (never
    /// the credentials themselves).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSummary>,
    /// Herald extension: the client certificate's and trusted CAs' subjects and expiry,
    /// when set (never the key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSummary>,
}

impl EndpointOut {
    pub fn new(e: &Endpoint, state: &AppState) -> Self {
        let credentials = credentials_summary(state, e);
        Self {
            id: e.id.to_string(),
            uid: e.uid.clone(),
            url: e.url.clone(),
            description: e.description.clone(),
            disabled: e.disabled,
            event_types: e.event_types.clone(),
            channels: e.channels.clone(),
            metadata: e.metadata.clone(),
            throttle_rate: e.throttle_rate,
            created_at: to_rfc3339(e.created_at),
            updated_at: to_rfc3339(e.updated_at),
            version: e.version,
            rate_limit: e.throttle_rate,
            filter_types: e.event_types.clone(),
            delivery: e.delivery.resolve(state.catalog.defaults()),
            request: e.request.clone(),
            filter: e.scripts.filter.clone(),
            transform: e.scripts.transform.clone(),
            auth: credentials.auth,
            tls: credentials.tls,
        }
    }
}

/// Which credentials an endpoint has (`unreadable` when the server key cannot open them).
pub fn credentials_summary(state: &AppState, e: &Endpoint) -> CredentialsSummary {
    match state.catalog.keyring().open_credentials(&e.auth, &e.id) {
        Ok(credentials) => credentials.summary(),
        Err(_) => CredentialsSummary { auth: Some(AuthSummary::kind("unreadable")), tls: None },
    }
}

/// The endpoint's credentials with `auth` and `tls` replaced where given, checked and
/// sealed for its row.
fn seal_credentials(
    state: &AppState,
    base: &Endpoint,
    auth: Option<Option<DeliveryAuth>>,
    tls: Option<Option<ClientTls>>,
) -> ApiResult<SealedAuth> {
    if auth.is_none() && tls.is_none() {
        return Ok(base.auth.clone());
    }
    let keyring = state.catalog.keyring();
    let replaces_both = auth.is_some() && tls.is_some();
    let mut credentials = match keyring.open_credentials(&base.auth, &base.id) {
        Ok(credentials) => credentials,
        // What cannot be read can still be replaced as a whole.
        Err(_) if replaces_both => Credentials::default(),
        Err(e) => {
            tracing::error!(endpoint = %base.id, error = %e, "the endpoint's credentials do not open");
            return Err(ApiError::Conflict(
                "the endpoint's credentials cannot be read with the configured server key; give both auth and tls \
                 (or null) to replace them"
                    .into(),
            ));
        }
    };
    if let Some(auth) = auth {
        credentials.auth = auth;
    }
    if let Some(tls) = tls {
        credentials.tls = tls;
    }
    let mut p = Problems::default();
    for (field, msg) in credentials.problems() {
        p.push(field, msg);
    }
    if let Some(grant) = credentials.auth.as_ref().and_then(DeliveryAuth::oauth2) {
        match state.guard.check_url(&grant.token_url) {
            Err(problem) => p.push("auth.tokenUrl", problem.to_string()),
            // RFC 6749 §2.3.1: the client's secret travels over TLS only (plain HTTP just
            // to hosts the operator opened up, such as a test rig's own).
            Ok(url) => p.check(
                url.scheme() == "https" || url.host().is_some_and(|host| state.guard.opened_up(&host)),
                "auth.tokenUrl",
                "must be an https URL (the client secret is sent to it)",
            ),
        }
    }
    p.finish()?;
    Ok(keyring.seal_credentials(&credentials, &base.id))
}

pub fn routes() -> Routes {
    Routes::new()
        .get("/api/v1/app/{app_id}/endpoint", list_endpoints)
        .post("/api/v1/app/{app_id}/endpoint", create_endpoint)
        .get("/api/v1/app/{app_id}/endpoint/{endpoint_id}", get_endpoint)
        .put("/api/v1/app/{app_id}/endpoint/{endpoint_id}", upsert_endpoint)
        .patch("/api/v1/app/{app_id}/endpoint/{endpoint_id}", patch_endpoint)
        .delete("/api/v1/app/{app_id}/endpoint/{endpoint_id}", delete_endpoint)
}

/// What a customer (portal token) may not decide about its endpoint: it may slow the
/// endpoint down, never past the rate limit the operator gave its application; and
/// `delivery.propagateTraceContext` is the operator's (a trace id is information about
/// the sender): a portal token keeps whatever the endpoint had (`before`), and asking for
/// anything else is refused.
fn apply_owner_rules(principal: &Principal, app: &App, before: Option<&Endpoint>, e: &mut Endpoint) -> ApiResult<()> {
    if matches!(principal, Principal::Admin) {
        return Ok(());
    }
    if let (Some(limit), Some(rate)) = (app.throttle_rate, e.throttle_rate)
        && rate > limit
    {
        return Err(ApiError::invalid(
            "throttleRate",
            format!("must be at most {limit}, the rate limit of the application"),
        ));
    }
    let kept = before.and_then(|b| b.delivery.propagate_trace_context);
    match e.delivery.propagate_trace_context {
        Some(asked) if asked != kept.unwrap_or(false) => {
            Err(ApiError::Forbidden("delivery.propagateTraceContext is set by the operator's admin token"))
        }
        _ => {
            e.delivery.propagate_trace_context = kept;
            Ok(())
        }
    }
}

/// Only the operator keeps ids from elsewhere (an import): a portal token's endpoints get
/// Herald's.
fn refuse_chosen_id(principal: &Principal, input: &EndpointIn) -> ApiResult<()> {
    match input.id {
        Some(_) => principal.require_admin_because("only the operator's admin token chooses an endpoint's id"),
        None => Ok(()),
    }
}

/// An endpoint URL as Svix stores it: in its normal form (`http://h.example` reads back as
/// `http://h.example/`, the host in lower case, a default port dropped). A URL the guard
/// refuses is kept as sent, for `check_endpoint` to refuse with its reason (normalizing
/// first would hide a backslash or whitespace the guard refuses).
fn normalized_url(state: &AppState, raw: String) -> String {
    state.guard.check_url(&raw).map_or(raw, String::from)
}

/// Checks every field of an endpoint about to be stored.
pub fn check_endpoint(state: &AppState, e: &Endpoint) -> ApiResult<()> {
    let mut p = Problems::default();
    if let Err(problem) = state.guard.check_url(&e.url) {
        p.push("url", problem.to_string());
    }
    if let Some(uid) = &e.uid {
        p.uid("uid", uid, EndpointId::PREFIX);
    }
    match &e.event_types {
        Some(types) if types.is_empty() => {
            p.push("eventTypes", "filterTypes can't be empty, it must have at least one item.");
        }
        Some(types) => p.slug_list("eventTypes", types, 256, 1000),
        None => {}
    }
    if let Some(channels) = &e.channels {
        p.slug_list("channels", channels, 128, 10);
    }
    p.check(e.throttle_rate != Some(0), "throttleRate", "must be at least 1");
    p.check(e.version >= 1, "version", "must be at least 1");
    for (field, msg) in e.delivery.problems() {
        p.push(&format!("delivery.{field}"), msg);
    }
    if let (Some(template), Ok(url)) =
        (e.request.as_ref().and_then(|r| r.url_template.as_deref()), url::Url::parse(&e.url))
    {
        if template.len() > crate::ssrf::MAX_URL_LEN {
            p.push("request.urlTemplate", format!("is longer than {} bytes", crate::ssrf::MAX_URL_LEN));
        }
        if template.chars().any(|c| c.is_whitespace() || c.is_control() || c == '\\') {
            p.push("request.urlTemplate", "contains whitespace, a control character or a backslash");
        }
        if let Err(problem) = Template::parse(template, &url) {
            p.push("request.urlTemplate", problem.to_string());
        }
    }
    check_scripts(&mut p, e);
    p.finish()
}

/// A transform cannot be combined with postback request settings (whether the
/// expressions themselves are acceptable is the sandbox's to say: `check_new_scripts`).
fn check_scripts(p: &mut Problems, e: &Endpoint) {
    p.check(
        e.scripts.transform.is_none() || e.request.is_none(),
        "transform",
        "cannot be combined with request settings (a transform sets the method, URL and body itself)",
    );
}

/// Every event type an endpoint filters on must exist and not be archived, as in Svix (a
/// 422 naming the missing ones); checked when the filter is given, not on every save.
async fn check_event_types_exist(state: &AppState, types: Option<&Vec<String>>) -> ApiResult<()> {
    let Some(types) = types else { return Ok(()) };
    let mut missing = Vec::new();
    for name in types {
        if state.store.event_type(name).await?.is_none_or(|et| et.archived) {
            missing.push(name.as_str());
        }
    }
    let mut p = Problems::default();
    p.check(missing.is_empty(), "eventTypes", format!("The following event types don't exist: {}", missing.join(", ")));
    p.finish()
}

/// Checks an endpoint's own headers and seals them for its row (they often carry the
/// receiver's credentials).
pub fn seal_headers(state: &AppState, headers: &Headers, endpoint: &EndpointId) -> ApiResult<SealedHeaders> {
    let mut p = Problems::default();
    check_headers(&mut p, "headers", headers);
    p.finish()?;
    Ok(state.catalog.keyring().seal_headers(headers, endpoint))
}

/// An endpoint's own headers in the clear; a row the server key cannot open is a server-side
/// configuration problem (a key missing from `auth.previous_secret_keys`).
pub fn open_headers(state: &AppState, endpoint: &Endpoint) -> ApiResult<Headers> {
    state.catalog.keyring().open_headers(&endpoint.headers, &endpoint.id).map_err(|e| {
        tracing::error!(endpoint = %endpoint.id, error = %e, "the endpoint's headers do not open");
        ApiError::Internal(anyhow::anyhow!("the endpoint's headers cannot be read with the configured server key"))
    })
}

/// Endpoint headers must be valid HTTP, free of CR/LF, at most 4,096 bytes each, and not use
/// a reserved name (`headers::is_reserved_header`, Svix's list and Herald's own).
pub fn check_headers<'a>(p: &mut Problems, path: &str, headers: impl IntoIterator<Item = (&'a String, &'a String)>) {
    for (count, (name, value)) in headers.into_iter().enumerate() {
        if count == MAX_HEADERS {
            p.push(path, format!("at most {MAX_HEADERS} headers"));
            return;
        }
        let at = format!("{path}.{name}");
        p.check(name.len() <= MAX_HEADER_NAME, &at, format!("names are at most {MAX_HEADER_NAME} bytes"));
        p.check(value.len() <= MAX_HEADER_VALUE, &at, format!("values are at most {MAX_HEADER_VALUE} bytes"));
        let lower = name.to_ascii_lowercase();
        p.check(http::HeaderName::try_from(lower.as_str()).is_ok(), &at, "is not a valid header name");
        p.check(!is_reserved_header(&lower), &at, "is reserved (set by Herald, or by proxies and CDNs on the way)");
        let value_ok = http::HeaderValue::try_from(value.as_str()).is_ok() && !value.contains(['\r', '\n']);
        p.check(value_ok, &at, "is not a valid header value");
    }
}

/// Limits on an endpoint's own headers.
const MAX_HEADERS: usize = 50;
const MAX_HEADER_NAME: usize = 256;
const MAX_HEADER_VALUE: usize = 4096;

/// The secret given (`whsec_…`, plain base64, or an asymmetric `whsk_…`), in its canonical
/// form, or a fresh symmetric one.
pub fn parse_secret(field: &str, secret: Option<&str>) -> ApiResult<String> {
    match secret {
        None => Ok(SigningKey::generate().to_secret_string()),
        Some(given) => EndpointKey::parse_endpoint_secret(given).map_err(|e| ApiError::invalid(field, e.to_string())),
    }
}

fn new_endpoint(state: &AppState, app: &App, input: EndpointIn, uid_from_path: Option<&str>) -> ApiResult<Endpoint> {
    let now = now_ms();
    let id = chosen_id(input.id.as_deref(), EndpointId::PREFIX, EndpointId::parse_foreign, EndpointId::generate)?;
    let secrets = Secrets { current: parse_secret("secret", input.secret.as_deref())?, previous: vec![] };
    let blank = Endpoint {
        secrets: state.catalog.keyring().seal_secrets(&secrets, &id),
        id,
        app_id: app.id.clone(),
        uid: uid_from_path.map(str::to_owned),
        url: String::new(),
        description: String::new(),
        disabled: false,
        event_types: None,
        channels: None,
        metadata: Default::default(),
        throttle_rate: None,
        headers: Default::default(),
        delivery: Default::default(),
        request: None,
        created_at: now,
        updated_at: now,
        scripts: Scripts::default(),
        auth: SealedAuth::default(),
        version: 1,
    };
    replace_fields(state, blank, input)
}

/// The endpoint `input` describes, keeping from `base` what an update does not replace:
/// identity, secrets, the uid and headers when not given, the creation time.
fn replace_fields(state: &AppState, base: Endpoint, input: EndpointIn) -> ApiResult<Endpoint> {
    let headers = match &input.headers {
        Some(headers) => seal_headers(state, headers, &base.id)?,
        None => base.headers.clone(),
    };
    let auth = seal_credentials(state, &base, input.auth.map(Some), input.tls.map(Some))?;
    Ok(Endpoint {
        uid: input.uid.or_else(|| base.uid.clone()),
        url: normalized_url(state, input.url),
        description: input.description.unwrap_or_default(),
        disabled: input.disabled.unwrap_or(false),
        event_types: input.event_types,
        channels: input.channels,
        metadata: input.metadata.unwrap_or_default(),
        throttle_rate: input.throttle_rate,
        headers,
        delivery: input.delivery.unwrap_or_default(),
        request: input.request,
        scripts: Scripts { filter: input.filter, transform: input.transform },
        auth,
        version: input.version.unwrap_or(base.version),
        updated_at: now_ms(),
        ..base
    })
}

/// Stores a new endpoint, within the application's cap. A uid taken meanwhile is a lost race
/// (`Stale`) where the caller may retry as an update.
async fn insert(state: &AppState, endpoint: &Endpoint) -> ApiResult<()> {
    check_endpoint(state, endpoint)?;
    check_new_scripts(state, None, endpoint).await?;
    let cap = state.settings.tenants.max_endpoints;
    if !state.store.insert_endpoint(endpoint, cap).await? {
        return Err(ApiError::invalid(
            "",
            format!("this application has {cap} endpoints, the most it may have (tenants.max_endpoints)"),
        ));
    }
    state.catalog.invalidate_endpoint(&endpoint.app_id, &endpoint.id);
    Ok(())
}

/// The endpoint's filter and transform, where they differ from `before`'s: within their
/// bounds and valid jq, compiled in the sandbox (never in this process).
async fn check_new_scripts(state: &AppState, before: Option<&Endpoint>, e: &Endpoint) -> ApiResult<()> {
    let old = before.map(|b| &b.scripts);
    let changed = [
        ("filter", &e.scripts.filter, old.and_then(|o| o.filter.as_ref())),
        ("transform", &e.scripts.transform, old.and_then(|o| o.transform.as_ref())),
    ];
    let fields: Vec<(&str, &str)> = changed
        .iter()
        .filter_map(|(field, new, old)| {
            new.as_deref().filter(|n| Some(*n) != old.map(String::as_str)).map(|n| (*field, n))
        })
        .collect();
    super::transformation::check_expressions(state, &e.app_id, &fields).await
}

/// Changes the endpoint `endpoint_id` as `change` says, atomically: the change is applied
/// to the endpoint as stored, then checked (the caller's limits, every field, the
/// expressions) and written back only if nobody wrote it meanwhile; otherwise it is
/// applied again to the newer version (see `optimistic`). Returns the endpoint as written.
pub async fn modify(
    state: &AppState,
    principal: &Principal,
    (app_id, endpoint_id): (&str, &str),
    mut change: impl FnMut(&mut Endpoint) -> ApiResult<()>,
) -> ApiResult<Endpoint> {
    optimistic::retry_stale! {
        let (app, before) = visible_endpoint(state, principal, app_id, endpoint_id).await?;
        let mut e = before.clone();
        change(&mut e)?;
        e.updated_at = optimistic::next_version(before.updated_at);
        apply_owner_rules(principal, &app, Some(&before), &mut e)?;
        save(state, &before, &e).await?;
        Ok(e)
    }
}

/// Validates and stores a changed endpoint if `before` is still the stored version, and
/// drops the cached copy; an endpoint now reached differently (URL, headers, enabled
/// again) gets its circuit breaker closed.
async fn save(state: &AppState, before: &Endpoint, endpoint: &Endpoint) -> ApiResult<()> {
    check_endpoint(state, endpoint)?;
    check_new_scripts(state, Some(before), endpoint).await?;
    optimistic::won(state.store.update_endpoint(endpoint, before.updated_at).await?, "endpoint")?;
    state.catalog.invalidate_endpoint(&endpoint.app_id, &endpoint.id);
    state.dispatcher.endpoint_changed(&endpoint.id).await;
    Ok(())
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint", operation_id = "v1.endpoint.list", tag = "Endpoint",
    params(("app_id" = String, Path), ("limit" = Option<usize>, Query), ("iterator" = Option<String>, Query), ("order" = Option<String>, Query)),
    responses((status = 200, body = ListResponse<EndpointOut>)))]
pub async fn list_endpoints(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    query: QueryMap,
) -> ApiResult<Json<ListResponse<EndpointOut>>> {
    let app = visible_app(&state, &principal, &app_id).await?;
    let page = Page::from_query(&query, Order::Descending, Cursor::Id(EndpointId::PREFIX))?;
    let found = state.store.list_endpoints(&app.id, &page.query()).await?;
    Ok(Json(page.finish(found, |e| e.id.to_string(), |e| EndpointOut::new(&e, &state))))
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/endpoint", operation_id = "v1.endpoint.create", tag = "Endpoint",
    request_body = EndpointIn, params(("app_id" = String, Path)),
    responses((status = 201, body = EndpointOut), (status = 422, body = super::error::HttpValidationError)))]
pub async fn create_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path(app_id): Path<String>,
    body: JsonBody<EndpointIn>,
) -> ApiResult<(StatusCode, Json<EndpointOut>)> {
    let app = visible_app(&state, &principal, &app_id).await?;
    refuse_chosen_id(&principal, &body.value)?;
    check_event_types_exist(&state, body.value.event_types.as_ref()).await?;
    let mut endpoint = new_endpoint(&state, &app, body.value, None)?;
    apply_owner_rules(&principal, &app, None, &mut endpoint)?;
    insert(&state, &endpoint).await?;
    Ok((StatusCode::CREATED, Json(EndpointOut::new(&endpoint, &state))))
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", operation_id = "v1.endpoint.get", tag = "Endpoint",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)), responses((status = 200, body = EndpointOut)))]
pub async fn get_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> ApiResult<Json<EndpointOut>> {
    let (_, endpoint) = visible_endpoint(&state, &principal, &app_id, &endpoint_id).await?;
    Ok(Json(EndpointOut::new(&endpoint, &state)))
}

/// Replaces an endpoint's fields, or creates it (with the path as its uid).
#[utoipa::path(put, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", operation_id = "v1.endpoint.update", tag = "Endpoint",
    request_body = EndpointIn, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointOut), (status = 201, body = EndpointOut)))]
pub async fn upsert_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    body: JsonBody<EndpointIn>,
) -> ApiResult<(StatusCode, Json<EndpointOut>)> {
    let app = visible_app(&state, &principal, &app_id).await?;
    let input = body.value;
    refuse_chosen_id(&principal, &input)?;
    check_event_types_exist(&state, input.event_types.as_ref()).await?;
    if state.store.endpoint(&app.id, &endpoint_id).await?.is_none() {
        let mut endpoint = new_endpoint(&state, &app, input.clone(), Some(&endpoint_id))?;
        apply_owner_rules(&principal, &app, None, &mut endpoint)?;
        match insert(&state, &endpoint).await {
            Ok(()) => return Ok((StatusCode::CREATED, Json(EndpointOut::new(&endpoint, &state)))),
            // Created by a simultaneous PUT: this one updates it.
            Err(ApiError::Conflict(_)) if state.store.endpoint(&app.id, &endpoint_id).await?.is_some() => {}
            Err(e) => return Err(e),
        }
    }
    let endpoint = modify(&state, &principal, (&app_id, &endpoint_id), |e| {
        same_id(input.id.as_deref(), e.id.as_str())?;
        *e = replace_fields(&state, e.clone(), input.clone())?;
        Ok(())
    })
    .await?;
    Ok((StatusCode::OK, Json(EndpointOut::new(&endpoint, &state))))
}

#[utoipa::path(patch, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", operation_id = "patch_endpoint", tag = "Endpoint",
    request_body = EndpointPatch, params(("app_id" = String, Path), ("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointOut)))]
pub async fn patch_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    body: JsonBody<EndpointPatch>,
) -> ApiResult<Json<EndpointOut>> {
    let patch = body.value;
    check_event_types_exist(&state, patch.event_types.as_ref().and_then(Option::as_ref)).await?;
    let e = modify(&state, &principal, (&app_id, &endpoint_id), |e| apply_patch(&state, e, patch.clone())).await?;
    Ok(Json(EndpointOut::new(&e, &state)))
}

/// The fields a PATCH gives replace the endpoint's; the rest stay.
fn apply_patch(state: &AppState, e: &mut Endpoint, patch: EndpointPatch) -> ApiResult<()> {
    if let Some(url) = patch.url {
        e.url = normalized_url(state, url);
    }
    if let Some(description) = patch.description {
        e.description = description;
    }
    if let Some(version) = patch.version {
        e.version = version;
    }
    if let Some(disabled) = patch.disabled {
        e.disabled = disabled;
    }
    if let Some(types) = patch.event_types {
        e.event_types = types;
    }
    if let Some(channels) = patch.channels {
        e.channels = channels;
    }
    if let Some(metadata) = patch.metadata {
        e.metadata = metadata;
    }
    if let Some(rate) = patch.throttle_rate {
        e.throttle_rate = rate;
    }
    if let Some(uid) = patch.uid {
        e.uid = uid;
    }
    if let Some(request) = patch.request {
        e.request = request;
    }
    if let Some(delivery) = patch.delivery {
        e.delivery = delivery.unwrap_or_default();
    }
    if let Some(filter) = patch.filter {
        e.scripts.filter = filter;
    }
    if let Some(transform) = patch.transform {
        e.scripts.transform = transform;
    }
    e.auth = seal_credentials(state, e, patch.auth, patch.tls)?;
    Ok(())
}

#[utoipa::path(delete, path = "/api/v1/app/{app_id}/endpoint/{endpoint_id}", operation_id = "v1.endpoint.delete", tag = "Endpoint",
    params(("app_id" = String, Path), ("endpoint_id" = String, Path)), responses((status = 204)))]
pub async fn delete_endpoint(
    State(state): State<AppState>,
    principal: Principal,
    Path((app_id, endpoint_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let (app, endpoint) = visible_endpoint(&state, &principal, &app_id, &endpoint_id).await?;
    state.store.delete_endpoint(&app.id, &endpoint.id).await?;
    state.catalog.invalidate_endpoint(&app.id, &endpoint.id);
    state.dispatcher.endpoint_changed(&endpoint.id).await;
    Ok(StatusCode::NO_CONTENT)
}
