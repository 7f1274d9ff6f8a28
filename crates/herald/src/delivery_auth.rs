//! How Herald authenticates to an endpoint's receiver (Herald extension `auth`): HTTP
//! Basic credentials. Stored sealed (`sealing::Purpose::EndpointAuth`), never returned by
//! the API (reads say only which kind is set), never shown to filters and transforms, and
//! sent as the `authorization` header of every attempt, over the endpoint's own headers.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::HeaderValue;
use serde::{Deserialize, Serialize};

/// Longest username or password accepted.
const MAX_PART: usize = 1024;

/// The credentials as given (and as sealed).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum DeliveryAuth {
    /// RFC 7617: `authorization: Basic base64(username:password)`.
    Basic { username: String, password: String },
}

/// What reads show of the credentials: their kind only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct AuthSummary {
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl std::fmt::Debug for DeliveryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Basic { .. } => f.write_str("DeliveryAuth::Basic(<redacted>)"),
        }
    }
}

impl DeliveryAuth {
    pub fn summary(&self) -> AuthSummary {
        match self {
            Self::Basic { .. } => AuthSummary { kind: "basic" },
        }
    }

    /// Why these credentials cannot be used, as (field, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        match self {
            Self::Basic { username, password } => {
                if username.is_empty() || username.contains(':') {
                    out.push(("auth.username", "must be non-empty and contain no colon".into()));
                }
                for (field, part) in [("auth.username", username), ("auth.password", password)] {
                    if part.len() > MAX_PART || part.chars().any(char::is_control) {
                        out.push((field, format!("must be at most {MAX_PART} bytes, without control characters")));
                    }
                }
            }
        }
        out
    }

    /// The `authorization` header value an attempt carries.
    pub fn header(&self) -> Option<HeaderValue> {
        match self {
            Self::Basic { username, password } => {
                let token = STANDARD.encode(format!("{username}:{password}"));
                let mut value = HeaderValue::try_from(format!("Basic {token}")).ok()?;
                value.set_sensitive(true);
                Some(value)
            }
        }
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
}
