//! An endpoint as stored: built from a request, its credentials and headers sealed under
//! the server key, inserted within its application's cap, and changed atomically.

use super::dto::EndpointIn;
use super::rules::{apply_owner_rules, check_endpoint, check_headers, check_new_scripts, parse_secret};
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::api::validate::{Problems, chosen_id};
use crate::api::{AppState, VisibleEndpoint, optimistic};
use crate::clock::now_ms;
use crate::delivery_auth::{AuthSummary, ClientTls, Credentials, CredentialsSummary, DeliveryAuth};
use crate::ids::EndpointId;
use crate::store::{App, Endpoint, Headers, Scripts, SealedAuth, SealedHeaders, Secrets};

/// Which credentials an endpoint has (`unreadable` when the server key cannot open them).
pub fn credentials_summary(state: &AppState, e: &Endpoint) -> CredentialsSummary {
    match state.catalog.keyring().open_credentials(&e.auth, &e.id) {
        Ok(credentials) => credentials.summary(),
        Err(_) => CredentialsSummary { auth: Some(AuthSummary::kind("unreadable")), tls: None },
    }
}

/// The endpoint's credentials with `auth` and `tls` replaced where given, checked and
/// sealed for its row.
pub(super) fn seal_credentials(
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

pub(super) fn new_endpoint(
    state: &AppState,
    app: &App,
    input: EndpointIn,
    uid_from_path: Option<&str>,
) -> ApiResult<Endpoint> {
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
        destination: Default::default(),
    };
    replace_fields(state, blank, input)
}

/// The endpoint `input` describes, keeping from `base` what an update does not replace:
/// identity, secrets, the uid and headers when not given, the creation time.
pub(super) fn replace_fields(state: &AppState, base: Endpoint, input: EndpointIn) -> ApiResult<Endpoint> {
    let headers = match &input.headers {
        Some(headers) => seal_headers(state, headers, &base.id)?,
        None => base.headers.clone(),
    };
    let auth = seal_credentials(state, &base, input.auth.map(Some), input.tls.map(Some))?;
    let mut e = Endpoint {
        uid: input.uid.or_else(|| base.uid.clone()),
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
    };
    super::destination::apply(state, &mut e, input.destination, Some(input.url))?;
    Ok(e)
}

/// Stores a new endpoint, within the application's cap. A uid taken meanwhile is a lost race
/// (`Stale`) where the caller may retry as an update.
pub(super) async fn insert(state: &AppState, endpoint: &Endpoint) -> ApiResult<()> {
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

/// Changes the endpoint `endpoint_id` as `change` says, atomically: the change is applied
/// to the endpoint as stored, then checked (the caller's limits, every field, the
/// expressions) and written back only if nobody wrote it meanwhile; otherwise it is
/// applied again to the newer version (see `optimistic`). Returns the endpoint as written.
pub async fn modify(
    state: &AppState,
    principal: &Principal,
    scoped: &VisibleEndpoint,
    mut change: impl FnMut(&mut Endpoint) -> ApiResult<()>,
) -> ApiResult<Endpoint> {
    optimistic::retry_stale! {
        let (app, before) = scoped.reread(state).await?.into_parts();
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
pub(super) async fn save(state: &AppState, before: &Endpoint, endpoint: &Endpoint) -> ApiResult<()> {
    check_endpoint(state, endpoint)?;
    check_new_scripts(state, Some(before), endpoint).await?;
    optimistic::won(state.store.update_endpoint(endpoint, before.updated_at).await?, "endpoint")?;
    state.catalog.invalidate_endpoint(&endpoint.app_id, &endpoint.id);
    state.dispatcher.endpoint_changed(&endpoint.id).await;
    Ok(())
}
