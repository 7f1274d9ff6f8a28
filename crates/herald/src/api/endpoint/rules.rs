//! What an endpoint may be, and who may decide what: field checks, header limits, the
//! signing secret's forms, event types that must exist, expressions that must compile in
//! the sandbox, and the fields only the operator sets.

use super::dto::EndpointIn;
use crate::api::AppState;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::validate::Problems;
use crate::headers::is_reserved_header;
use crate::ids::EndpointId;
use crate::postback::Template;
use crate::signing::{EndpointKey, SigningKey};
use crate::store::{App, Endpoint};

/// What a customer (portal token) may not decide about its endpoint: it may slow the
/// endpoint down, never past the rate limit the operator gave its application; and
/// `delivery.propagateTraceContext` is the operator's (a trace id is information about
/// the sender): a portal token keeps whatever the endpoint had (`before`), and asking for
/// anything else is refused.
pub(super) fn apply_owner_rules(
    principal: &Principal,
    app: &App,
    before: Option<&Endpoint>,
    e: &mut Endpoint,
) -> ApiResult<()> {
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
pub(super) fn refuse_chosen_id(principal: &Principal, input: &EndpointIn) -> ApiResult<()> {
    match input.id {
        Some(_) => principal.require_admin_because("only the operator's admin token chooses an endpoint's id"),
        None => Ok(()),
    }
}

/// An endpoint URL as Svix stores it: in its normal form (`http://h.example` reads back as
/// `http://h.example/`, the host in lower case, a default port dropped). A URL the guard
/// refuses is kept as sent, for `check_endpoint` to refuse with its reason (normalizing
/// first would hide a backslash or whitespace the guard refuses).
pub(super) fn normalized_url(state: &AppState, raw: String) -> String {
    state.guard.check_url(&raw).map_or(raw, String::from)
}

/// Checks every field of an endpoint about to be stored.
pub fn check_endpoint(state: &AppState, e: &Endpoint) -> ApiResult<()> {
    let mut p = Problems::default();
    // An event destination's URL is its broker's, checked with it (`destination.rs`).
    let http = e.destination.0.is_empty();
    if http && let Err(problem) = state.guard.check_url(&e.url) {
        p.push("url", problem.to_string());
    }
    p.check(
        http || e.request.is_none(),
        "destination",
        "cannot be combined with request settings (postbacks are HTTP)",
    );
    let http_auth = !http && super::credentials_summary(state, e).auth.is_some();
    p.check(
        !http_auth,
        "destination",
        "cannot be combined with auth (HTTP credentials): give the broker's in destination.credentials",
    );
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
pub(super) fn check_scripts(p: &mut Problems, e: &Endpoint) {
    p.check(
        e.scripts.transform.is_none() || e.request.is_none(),
        "transform",
        "cannot be combined with request settings (a transform sets the method, URL and body itself)",
    );
}

/// Every event type an endpoint filters on must exist and not be archived, as in Svix (a
/// 422 naming the missing ones); checked when the filter is given, not on every save.
pub(super) async fn check_event_types_exist(state: &AppState, types: Option<&Vec<String>>) -> ApiResult<()> {
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
pub(super) const MAX_HEADERS: usize = 50;

pub(super) const MAX_HEADER_NAME: usize = 256;

pub(super) const MAX_HEADER_VALUE: usize = 4096;

/// The secret given (`whsec_…`, plain base64, or an asymmetric `whsk_…`), in its canonical
/// form, or a fresh symmetric one.
pub fn parse_secret(field: &str, secret: Option<&str>) -> ApiResult<String> {
    match secret {
        None => Ok(SigningKey::generate().to_secret_string()),
        Some(given) => EndpointKey::parse_endpoint_secret(given).map_err(|e| ApiError::invalid(field, e.to_string())),
    }
}

/// The endpoint's filter and transform, where they differ from `before`'s: within their
/// bounds and valid jq, compiled in the sandbox (never in this process).
pub(super) async fn check_new_scripts(state: &AppState, before: Option<&Endpoint>, e: &Endpoint) -> ApiResult<()> {
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
    crate::api::transformation::check_expressions(state, &e.app_id, &fields).await
}
