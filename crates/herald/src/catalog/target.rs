//! An endpoint prepared for delivery (parsed URL, decoded signing keys, resolved settings,
//! credentials and proxy), the limits of its application, and the routing rule.

use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use url::Url;

use crate::clock::Millis;
use crate::delivery_auth::{Credentials, EndpointTls, OAuth2Grant};
use crate::destinations::Destination;
use crate::egress::EgressProxy;
use crate::endpoint_settings::{Defaults, EffectiveSettings};
use crate::headers::{is_reserved_header, is_sensitive_header};
use crate::outcome::Failure;
use crate::postback::{PostbackMethod, Template};
use crate::scripts::{self, EvalError, Rewrite, Sandbox, Verdict};
use crate::sealing::Keyring;
use crate::signing::EndpointKey;

use crate::store::{App, Endpoint, Headers, Message};

/// The settings of an application the dispatcher enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppLimits {
    /// Attempts in flight at most.
    pub max_concurrency: u32,
    /// Share of contended capacity.
    pub weight: u32,
    /// Messages per second at most, across the application's endpoints.
    pub throttle_rate: Option<u16>,
}

/// Attempts in flight per application unless it says otherwise.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 16;

impl Default for AppLimits {
    fn default() -> Self {
        Self { max_concurrency: DEFAULT_MAX_CONCURRENCY, weight: 1, throttle_rate: None }
    }
}

impl AppLimits {
    pub fn of(app: &App) -> Self {
        Self {
            max_concurrency: app.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY).max(1),
            weight: app.weight.unwrap_or(1).max(1),
            throttle_rate: app.throttle_rate.filter(|r| *r > 0),
        }
    }
}

/// An endpoint prepared for delivery.
#[derive(Debug)]
pub struct Target {
    pub endpoint: Endpoint,
    pub app: AppLimits,
    /// `None` when the stored URL no longer parses (every attempt then fails as internal).
    pub url: Option<Url>,
    pub settings: EffectiveSettings,
    /// The parsed URL template of a postback endpoint; `Err` when the stored one no longer
    /// fits the endpoint (its attempts then fail as template errors).
    pub template: Result<Option<Template>, String>,
    /// The current key first, then earlier keys with the time their overlap ends.
    keys: Vec<(EndpointKey, Option<Millis>)>,
    /// The endpoint's own headers, opened and parsed once (Herald's own names left out);
    /// `None` when they do not open, and its attempts then fail as internal errors rather
    /// than go out without them.
    pub headers: Option<Vec<(HeaderName, HeaderValue)>>,
    /// The application's own egress proxy, over the server's.
    pub proxy: Option<EgressProxy>,
    /// The endpoint's OAuth2 grant, whose tokens `deliver::oauth2` fetches and caches.
    pub oauth2: Option<Arc<OAuth2Grant>>,
    /// The endpoint's mutual TLS settings; `Err` when they no longer load (its attempts
    /// then fail as TLS errors rather than go out without the certificate).
    pub tls: Result<Option<Arc<EndpointTls>>, String>,
    /// The broker the endpoint publishes to instead (event destinations); `Err` when it
    /// no longer opens (its attempts then fail as internal errors).
    pub destination: Result<Option<Arc<Destination>>, String>,
}

impl Target {
    /// Prepares `endpoint`, opening its sealed secrets. Secrets that do not open (a server
    /// key that is missing from the configuration) leave the target without keys, and its
    /// attempts fail as internal errors rather than go out unsigned.
    pub fn new(endpoint: Endpoint, app: AppLimits, defaults: &Defaults, keyring: &Keyring) -> Self {
        let mut keys = Vec::new();
        match keyring.open_secrets(&endpoint.secrets, &endpoint.id) {
            Ok(secrets) => {
                if let Ok(key) = EndpointKey::decode(&secrets.current) {
                    keys.push((key, None));
                }
                for previous in &secrets.previous {
                    if let Ok(key) = EndpointKey::decode(&previous.key) {
                        keys.push((key, Some(previous.expires_at)));
                    }
                }
            }
            Err(e) => {
                tracing::error!(endpoint = %endpoint.id, error = %e, "the endpoint's signing secrets do not open")
            }
        }
        // The endpoint's own headers, then its credentials (which win over a header of the
        // same name).
        let opened = keyring.open_headers(&endpoint.headers, &endpoint.id).and_then(|headers| {
            Ok((request_headers(&headers), keyring.open_credentials(&endpoint.auth, &endpoint.id)?))
        });
        let (headers, credentials) = match opened {
            Ok((mut headers, credentials)) => {
                let basic = credentials.auth.as_ref().and_then(|a| a.header());
                headers.extend(basic.map(|v| (http::header::AUTHORIZATION, v)));
                (Some(headers), credentials)
            }
            Err(e) => {
                tracing::error!(endpoint = %endpoint.id, error = %e, "the endpoint's headers or credentials do not open");
                (None, Credentials::default())
            }
        };
        let oauth2 = credentials.auth.as_ref().and_then(|a| a.oauth2()).cloned().map(Arc::new);
        let tls = match &credentials.tls {
            None => Ok(None),
            Some(tls) => tls.prepare().map(|t| Some(Arc::new(t))).map_err(|(field, why)| {
                tracing::error!(endpoint = %endpoint.id, field, why, "the endpoint's TLS settings do not load");
                format!("the endpoint's TLS settings do not load: {field} {why}")
            }),
        };
        let destination = keyring.open_destination(&endpoint.destination, &endpoint.id).map(|d| d.map(Arc::new));
        let destination = destination.map_err(|e| {
            tracing::error!(endpoint = %endpoint.id, error = %e, "the endpoint's destination does not open");
            format!("the endpoint's destination cannot be opened with the configured server key: {e}")
        });
        let url = Url::parse(&endpoint.url).ok();
        let template = match (endpoint.request.as_ref().and_then(|r| r.url_template.as_deref()), &url) {
            (None, _) => Ok(None),
            (Some(template), Some(url)) => Template::parse(template, url).map(Some).map_err(|e| e.to_string()),
            (Some(_), None) => Err("the endpoint URL does not parse".into()),
        };
        let settings = endpoint.delivery.resolve(defaults);
        Self { url, settings, template, keys, headers, endpoint, app, proxy: None, oauth2, tls, destination }
    }

    /// The target with its application's egress proxy.
    pub fn with_proxy(self, proxy: Option<EgressProxy>) -> Self {
        Self { proxy, ..self }
    }

    /// The keys that sign at `now`: the current one and those still inside their overlap.
    pub fn signing_keys(&self, now: Millis) -> impl Iterator<Item = &EndpointKey> {
        self.keys.iter().filter(move |(_, until)| until.is_none_or(|t| t > now)).map(|(key, _)| key)
    }

    /// A fingerprint of how the endpoint is reached: its URL and request settings, its own
    /// headers (where receivers' credentials live) and whether it is enabled. A circuit
    /// breaker's verdict holds only for the way it judged (see `Lanes::reach_changed`).
    pub fn reach(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.endpoint.url.hash(&mut h);
        self.endpoint.disabled.hash(&mut h);
        serde_json::to_string(&self.endpoint.request).unwrap_or_default().hash(&mut h);
        for (name, value) in self.headers.iter().flatten() {
            (name.as_str(), value.as_bytes()).hash(&mut h);
        }
        self.proxy.hash(&mut h);
        self.oauth2.as_ref().map(|grant| grant.fingerprint()).hash(&mut h);
        self.tls.as_ref().ok().and_then(Option::as_ref).map(|tls| tls.fingerprint).hash(&mut h);
        let destination = self.destination.as_ref().ok().and_then(Option::as_ref);
        destination.map(|d| serde_json::to_vec(d.as_ref()).unwrap_or_default()).hash(&mut h);
        h.finish()
    }

    /// Whether a message with this event type and these channels goes to this endpoint.
    pub fn accepts(&self, event_type: &str, channels: Option<&[String]>) -> bool {
        routes_to(&self.endpoint, event_type, channels)
    }

    /// Whether the endpoint's filter (if any) lets `message` through.
    pub async fn filter(&self, sandbox: &Sandbox, message: &Message) -> Verdict {
        match &self.endpoint.scripts.filter {
            None => Verdict::Pass,
            Some(code) => Verdict::of(sandbox.eval(&self.endpoint.app_id, code, &self.script_input(message)).await),
        }
    }

    /// Runs the endpoint's transform (if any) on the request its settings make: `None`
    /// without a transform, else the request to send, `Ok(None)` to drop the delivery, or
    /// why the attempt fails: the transform's fault (`Failure::Transform`), or Herald's
    /// (`Failure::Internal`: no sandbox, a URL that no longer parses).
    pub async fn transform(
        &self,
        sandbox: &Sandbox,
        message: &Message,
    ) -> Option<Result<Option<Rewrite>, (Failure, String)>> {
        let code = self.endpoint.scripts.transform.as_ref()?;
        let Some(plain) = self.plain_request(message) else {
            return Some(Err((Failure::Internal, "the stored URL does not parse".into())));
        };
        // Boxed: the sandbox's future is large, and most endpoints have no transform.
        let input = self.script_input(message);
        Some(match Box::pin(sandbox.eval(&self.endpoint.app_id, code, &input)).await {
            Err(e @ EvalError::Unavailable(_)) => Err((Failure::Internal, e.to_string())),
            Err(e) => Err((Failure::Transform, e.to_string())),
            Ok(output) => scripts::rewrite(output, &plain).map_err(|e| (Failure::Transform, e)),
        })
    }

    /// The endpoint's headers whose values scripts never see (credentials): sent as set,
    /// after whatever a transform did.
    pub fn sensitive_headers(&self) -> impl Iterator<Item = &(HeaderName, HeaderValue)> {
        self.headers.iter().flatten().filter(|(name, _)| is_sensitive_header(name.as_str()))
    }

    fn visible_headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        self.headers.iter().flatten().filter(|(name, _)| !is_sensitive_header(name.as_str())).cloned().collect()
    }

    /// The method the endpoint's settings ask for (POST unless a postback says otherwise).
    pub fn method(&self) -> http::Method {
        match self.endpoint.request.as_ref().map(|r| r.method()) {
            Some(PostbackMethod::Get) => http::Method::GET,
            Some(PostbackMethod::Put) => http::Method::PUT,
            Some(PostbackMethod::Post) | None => http::Method::POST,
        }
    }

    /// The request as the endpoint's settings make it, before any transform (its
    /// credentials aside): what a transform's changes apply to.
    fn plain_request(&self, message: &Message) -> Option<Rewrite> {
        Some(Rewrite {
            method: self.method(),
            url: self.url.clone()?,
            headers: self.visible_headers(),
            body: message.payload.as_deref().map(|p| bytes::Bytes::copy_from_slice(p.as_bytes())).unwrap_or_default(),
        })
    }

    /// The JSON a filter or transform of this endpoint runs on for `message`.
    fn script_input(&self, message: &Message) -> Vec<u8> {
        scripts::input(message, &self.visible_headers(), self.method().as_str(), &self.endpoint.url)
    }
}

/// An endpoint's own headers as request headers: lower-case names, Herald's own names
/// skipped (the API refuses them; this guards rows written otherwise).
fn request_headers(headers: &Headers) -> Vec<(HeaderName, HeaderValue)> {
    headers
        .iter()
        .filter_map(|(name, value)| {
            let name = HeaderName::try_from(name.to_ascii_lowercase()).ok()?;
            let value = HeaderValue::try_from(value.as_str()).ok()?;
            (!is_reserved_header(name.as_str())).then_some((name, value))
        })
        .collect()
}

/// The routing rule: enabled endpoints whose event-type filter (if any) names the event type
/// and whose channel filter (if any) shares a channel with the message.
pub fn routes_to(endpoint: &Endpoint, event_type: &str, channels: Option<&[String]>) -> bool {
    if endpoint.disabled {
        return false;
    }
    let type_ok = match &endpoint.event_types {
        Some(types) if !types.is_empty() => types.iter().any(|t| t == event_type),
        _ => true,
    };
    let channel_ok = match &endpoint.channels {
        Some(wanted) if !wanted.is_empty() => channels.is_some_and(|given| given.iter().any(|c| wanted.contains(c))),
        _ => true,
    };
    type_ok && channel_ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{AppId, EndpointId};
    use crate::sealing::generate_key;
    use crate::signing::SigningKey;
    use crate::store::{PreviousSecret, SealedSecrets, Secrets};

    fn endpoint(event_types: Option<&[&str]>, channels: Option<&[&str]>, disabled: bool) -> Endpoint {
        let list = |v: Option<&[&str]>| v.map(|v| v.iter().map(|s| s.to_string()).collect());
        Endpoint {
            id: EndpointId::generate(),
            app_id: AppId::generate(),
            uid: None,
            url: "https://example.com/".into(),
            description: String::new(),
            disabled,
            event_types: list(event_types),
            channels: list(channels),
            metadata: Default::default(),
            throttle_rate: None,
            headers: Default::default(),
            secrets: SealedSecrets(String::new()),
            delivery: Default::default(),
            request: None,
            created_at: 0,
            updated_at: 0,
            scripts: Default::default(),
            auth: Default::default(),
            version: 1,
            destination: Default::default(),
        }
    }

    fn chans(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_endpoint_without_filters_receives_everything_enabled() {
        let e = endpoint(None, None, false);
        assert!(routes_to(&e, "user.created", None));
        assert!(routes_to(&e, "x", Some(&chans(&["a"]))));
        assert!(!routes_to(&endpoint(None, None, true), "user.created", None));
    }

    #[test]
    fn event_type_filters_select_by_name() {
        let e = endpoint(Some(&["invoice.paid", "invoice.failed"]), None, false);
        assert!(routes_to(&e, "invoice.paid", None));
        assert!(!routes_to(&e, "invoice.created", None));
    }

    #[test]
    fn channel_filters_need_a_shared_channel() {
        let e = endpoint(None, Some(&["project_1", "project_2"]), false);
        assert!(routes_to(&e, "t", Some(&chans(&["project_2", "other"]))));
        assert!(!routes_to(&e, "t", Some(&chans(&["other"]))));
        assert!(!routes_to(&e, "t", None), "a message without channels skips channel-filtered endpoints");
    }

    #[test]
    fn credentials_and_proxies_are_part_of_how_an_endpoint_is_reached() {
        let keyring = Keyring::new(&generate_key(), &[]).unwrap();
        let defaults = Defaults { timeout: std::time::Duration::from_secs(1), retry: Default::default() };
        let reach_with = |credentials: Credentials| {
            let mut e = endpoint(None, None, false);
            e.id = EndpointId::from_trusted("ep_same".into());
            e.auth = keyring.seal_credentials(&credentials, &e.id);
            Target::new(e, AppLimits::default(), &defaults, &keyring).reach()
        };
        let reach = |auth: Option<(&str, &str)>, proxy: Option<&str>| {
            let mut e = endpoint(None, None, false);
            e.id = EndpointId::from_trusted("ep_same".into());
            let auth =
                auth.map(|(u, p)| crate::delivery_auth::DeliveryAuth::Basic { username: u.into(), password: p.into() });
            e.auth = keyring.seal_credentials(&Credentials { auth, tls: None }, &e.id);
            let proxy = proxy.map(|p| EgressProxy::parse(p).unwrap());
            Target::new(e, AppLimits::default(), &defaults, &keyring).with_proxy(proxy).reach()
        };
        let plain = reach(None, None);
        assert_eq!(plain, reach(None, None));
        assert_ne!(plain, reach(Some(("u", "p")), None), "credentials set");
        assert_ne!(reach(Some(("u", "p")), None), reach(Some(("u", "q")), None), "credentials changed");
        assert_ne!(plain, reach(None, Some("http://proxy.internal:3128")), "an own proxy");
        let grant = |secret: &str| {
            let grant = serde_json::json!({"type": "oauth2", "tokenUrl": "https://id.example/t", "clientId": "c", "clientSecret": secret});
            Credentials { auth: Some(serde_json::from_value(grant).unwrap()), tls: None }
        };
        assert_ne!(plain, reach_with(grant("a")), "an OAuth2 grant set");
        assert_ne!(reach_with(grant("a")), reach_with(grant("b")), "an OAuth2 grant changed");
        assert_eq!(reach_with(grant("a")), reach_with(grant("a")));
        let certificate = || {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(vec!["herald".to_owned()]).unwrap().self_signed(&key).unwrap();
            let tls = crate::delivery_auth::ClientTls {
                client_certificate_pem: cert.pem(),
                client_key_pem: key.serialize_pem(),
                ca_pem: None,
            };
            Credentials { auth: None, tls: Some(tls) }
        };
        let with_certificate = certificate();
        assert_ne!(plain, reach_with(with_certificate.clone()), "a client certificate set");
        assert_eq!(reach_with(with_certificate.clone()), reach_with(with_certificate));
        assert_ne!(reach_with(certificate()), reach_with(certificate()), "a client certificate changed");
    }

    #[test]
    fn previous_keys_sign_only_until_their_overlap_ends() {
        let mut e = endpoint(None, None, false);
        let keyring = Keyring::new(&generate_key(), &[]).unwrap();
        let previous = vec![PreviousSecret { key: SigningKey::generate().to_secret_string(), expires_at: 1000 }];
        let secrets = Secrets { current: SigningKey::generate().to_secret_string(), previous };
        e.secrets = keyring.seal_secrets(&secrets, &e.id);
        let defaults = Defaults { timeout: std::time::Duration::from_secs(1), retry: Default::default() };
        let target = Target::new(e, AppLimits::default(), &defaults, &keyring);
        assert_eq!(target.signing_keys(999).count(), 2);
        assert_eq!(target.signing_keys(1000).count(), 1);
    }

    #[test]
    fn secrets_that_do_not_open_leave_no_keys() {
        let mut e = endpoint(None, None, false);
        let secrets = Secrets { current: SigningKey::generate().to_secret_string(), previous: vec![] };
        e.secrets = Keyring::new(&generate_key(), &[]).unwrap().seal_secrets(&secrets, &e.id);
        let defaults = Defaults { timeout: std::time::Duration::from_secs(1), retry: Default::default() };
        let other = Keyring::new(&generate_key(), &[]).unwrap();
        assert_eq!(Target::new(e, AppLimits::default(), &defaults, &other).signing_keys(0).count(), 0);
    }
}
