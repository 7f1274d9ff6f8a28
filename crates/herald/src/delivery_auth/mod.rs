//! How Herald authenticates to an endpoint's receiver (Herald extensions `auth` and `tls`):
//! HTTP Basic credentials or an OAuth2 client-credentials grant (`auth`), and a client
//! certificate for mutual TLS (`tls`). Both are kept in one sealed value per endpoint
//! ([`Credentials`], `sealing::Purpose::EndpointAuth`), never returned by the API (reads
//! show a [`CredentialsSummary`]), never shown to filters and transforms, and never logged.
//! Tokens are fetched and cached by `deliver::oauth2`; certificates are read by [`tls`].

mod tls;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::HeaderValue;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use tls::{CertificateSummary, ClientTls, EndpointTls, TlsSummary, client_config};

/// Longest username, password, client id, secret, scope or audience accepted.
const MAX_PART: usize = 1024;
/// Scopes accepted at most.
const MAX_SCOPES: usize = 32;

/// The credentials Herald presents in the request itself.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum DeliveryAuth {
    /// RFC 7617: `authorization: Basic base64(username:password)`.
    Basic { username: String, password: String },
    /// RFC 6749 §4.4: a bearer token from `tokenUrl`, cached until shortly before it expires.
    #[serde(rename = "oauth2")]
    OAuth2(OAuth2Grant),
}

/// An OAuth2 client-credentials grant.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OAuth2Grant {
    pub token_url: String,
    pub client_id: String,
    pub client_secret: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// Sent as the `audience` parameter (Auth0, Okta and others ask for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
    /// How the client authenticates to the token endpoint (RFC 6749 §2.3.1): HTTP Basic
    /// (the default every server must support) or in the form body.
    #[serde(default)]
    pub client_auth_method: ClientAuthMethod,
}

/// The OpenID Connect names of the two client-secret methods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuthMethod {
    #[default]
    ClientSecretBasic,
    ClientSecretPost,
}

/// Everything an endpoint presents to its receiver, as sealed in its row.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<DeliveryAuth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTls>,
}

/// What reads show of an endpoint's `auth`: its kind, and for OAuth2 the parts that are
/// not secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthSummary {
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scopes: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub audience: Option<String>,
}

impl AuthSummary {
    pub fn kind(kind: &'static str) -> Self {
        Self { kind, token_url: None, client_id: None, scopes: None, audience: None }
    }
}

impl std::fmt::Debug for DeliveryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Basic { .. } => f.write_str("DeliveryAuth::Basic(<redacted>)"),
            Self::OAuth2(grant) => write!(f, "DeliveryAuth::{grant:?}"),
        }
    }
}

impl std::fmt::Debug for OAuth2Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "OAuth2Grant({}, <redacted>)", self.token_url)
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("auth", &self.auth).field("tls", &self.tls.is_some()).finish()
    }
}

impl Credentials {
    /// Reads a sealed value: both parts, or the bare `auth` of schema 6's first rows.
    pub fn from_json(json: &[u8]) -> Option<Self> {
        serde_json::from_slice(json)
            .ok()
            .or_else(|| serde_json::from_slice(json).ok().map(|auth| Self { auth: Some(auth), tls: None }))
    }

    pub fn is_empty(&self) -> bool {
        self.auth.is_none() && self.tls.is_none()
    }

    /// Why these credentials cannot be used, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = self.auth.as_ref().map(DeliveryAuth::problems).unwrap_or_default();
        out.extend(self.tls.as_ref().map(ClientTls::problems).unwrap_or_default());
        out
    }

    pub fn summary(&self) -> CredentialsSummary {
        CredentialsSummary {
            auth: self.auth.as_ref().map(DeliveryAuth::summary),
            tls: self.tls.as_ref().map(ClientTls::summary),
        }
    }
}

/// What reads show of an endpoint's credentials.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialsSummary {
    pub auth: Option<AuthSummary>,
    pub tls: Option<TlsSummary>,
}

impl DeliveryAuth {
    pub fn summary(&self) -> AuthSummary {
        match self {
            Self::Basic { .. } => AuthSummary::kind("basic"),
            Self::OAuth2(grant) => AuthSummary {
                token_url: Some(grant.token_url.clone()),
                client_id: Some(grant.client_id.clone()),
                scopes: Some(grant.scopes.clone()),
                audience: grant.audience.clone(),
                ..AuthSummary::kind("oauth2")
            },
        }
    }

    /// Why these credentials cannot be used, as (field, message). The token URL is judged
    /// by the destination guard separately.
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut bounded = |field: &'static str, part: &str| {
            if part.len() > MAX_PART || part.chars().any(char::is_control) {
                out.push((field, format!("must be at most {MAX_PART} bytes, without control characters")));
            }
        };
        match self {
            Self::Basic { username, password } => {
                bounded("auth.username", username);
                bounded("auth.password", password);
                if username.is_empty() || username.contains(':') {
                    out.push(("auth.username", "must be non-empty and contain no colon".into()));
                }
            }
            Self::OAuth2(grant) => {
                bounded("auth.clientId", &grant.client_id);
                bounded("auth.clientSecret", &grant.client_secret);
                bounded("auth.audience", grant.audience.as_deref().unwrap_or_default());
                if grant.client_id.is_empty() {
                    out.push(("auth.clientId", "must be non-empty".into()));
                }
                if grant.client_secret.is_empty() {
                    out.push(("auth.clientSecret", "must be non-empty".into()));
                }
                // RFC 6749 §3.3: scope tokens are printable ASCII without spaces, quotes
                // or backslashes.
                let scope_ok = |s: &String| {
                    !s.is_empty()
                        && s.len() <= MAX_PART
                        && s.bytes().all(|b| b > b' ' && b < 0x7f && b != b'"' && b != b'\\')
                };
                if grant.scopes.len() > MAX_SCOPES || !grant.scopes.iter().all(scope_ok) {
                    out.push((
                        "auth.scopes",
                        format!(
                            "at most {MAX_SCOPES} scopes, each printable ASCII without spaces, quotes or backslashes"
                        ),
                    ));
                }
            }
        }
        out
    }

    /// The `authorization` header value every attempt carries, for credentials that are
    /// the same on every attempt (OAuth2 tokens come from `deliver::oauth2`).
    pub fn header(&self) -> Option<HeaderValue> {
        match self {
            Self::Basic { username, password } => {
                let token = STANDARD.encode(format!("{username}:{password}"));
                let mut value = HeaderValue::try_from(format!("Basic {token}")).ok()?;
                value.set_sensitive(true);
                Some(value)
            }
            Self::OAuth2(_) => None,
        }
    }

    pub fn oauth2(&self) -> Option<&OAuth2Grant> {
        match self {
            Self::OAuth2(grant) => Some(grant),
            Self::Basic { .. } => None,
        }
    }
}

impl OAuth2Grant {
    /// Identifies the grant (a cached token belongs to exactly one), without revealing it.
    pub fn fingerprint(&self) -> [u8; 32] {
        let json = serde_json::to_vec(self).expect("a grant serializes");
        Sha256::digest(&json).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_make_the_rfc_7617_header() {
        let auth = DeliveryAuth::Basic { username: "Aladdin".into(), password: "open sesame".into() };
        assert_eq!(auth.header().unwrap(), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
        assert!(auth.problems().is_empty());
        assert!(!format!("{auth:?}").contains("sesame"), "never in logs");
        let bad = DeliveryAuth::Basic { username: "a:b".into(), password: "x\n".into() };
        assert_eq!(bad.problems().len(), 2);
        let control = DeliveryAuth::Basic { username: "a\tb".into(), password: "x".into() };
        assert_eq!(control.problems().iter().map(|(f, _)| *f).collect::<Vec<_>>(), ["auth.username"]);
        let empty = DeliveryAuth::Basic { username: String::new(), password: "x".into() };
        assert_eq!(empty.problems().len(), 1);
    }

    #[test]
    fn oauth2_grants_are_checked_and_never_debug_printed() {
        let grant = |scopes: &[&str]| {
            DeliveryAuth::OAuth2(OAuth2Grant {
                token_url: "https://id.example/token".into(),
                client_id: "herald".into(),
                client_secret: "hunter2".into(),
                scopes: scopes.iter().map(|s| s.to_string()).collect(),
                audience: None,
                client_auth_method: ClientAuthMethod::default(),
            })
        };
        assert!(grant(&["read", "write:hooks"]).problems().is_empty());
        assert!(!format!("{:?}", grant(&[])).contains("hunter2"));
        assert_eq!(grant(&["two words"]).problems()[0].0, "auth.scopes");
        assert_eq!(grant(&[""]).problems()[0].0, "auth.scopes");
        assert!(grant(&[]).header().is_none(), "tokens are fetched, not derived");
    }

    #[test]
    fn sealed_values_of_both_shapes_read() {
        let bare = br#"{"type":"basic","username":"u","password":"p"}"#;
        let read = Credentials::from_json(bare).unwrap();
        assert_eq!(read.auth.unwrap().summary().kind, "basic");
        let both =
            Credentials { auth: Some(DeliveryAuth::Basic { username: "u".into(), password: "p".into() }), tls: None };
        let json = serde_json::to_vec(&both).unwrap();
        assert_eq!(Credentials::from_json(&json), Some(both));
        assert_eq!(Credentials::from_json(b"{}"), Some(Credentials::default()));
        assert_eq!(Credentials::from_json(b"[1]"), None);
    }
}
