//! Applications, their endpoints (secrets, headers, expressions) and event types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clock::Millis;
use crate::endpoint_settings::DeliverySettings;
use crate::ids::{AppId, EndpointId};

pub type Metadata = BTreeMap<String, String>;

/// One of our user's customers.
#[derive(Debug, Clone, PartialEq)]
pub struct App {
    pub id: AppId,
    pub uid: Option<String>,
    pub name: String,
    pub metadata: Metadata,
    pub throttle_rate: Option<u16>,
    /// Attempts in flight at most (Herald extension; default 16).
    pub max_concurrency: Option<u32>,
    /// Share of contended delivery capacity (Herald extension; default 1).
    pub weight: Option<u32>,
    /// The portal's brand for this application, over the server's (Herald extension).
    pub portal_brand: Option<crate::brand::Brand>,
    /// The egress proxy this application's attempts go through, over the server's
    /// (Herald extension; operator only): its URL without credentials, and those sealed.
    pub proxy: Option<AppProxy>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// An application's egress proxy as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppProxy {
    /// `http://host:port`, without credentials.
    pub url: String,
    /// `user:password`, sealed (empty text: none).
    pub credentials: SealedAuth,
}

/// An endpoint's signing secrets: the current one, and earlier ones that keep signing until
/// their overlap after a rotation ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Secrets {
    pub current: String,
    #[serde(default)]
    pub previous: Vec<PreviousSecret>,
}

/// An endpoint's [`Secrets`] as stored: sealed under the server key, bound to the endpoint's
/// id (see `crate::sealing`). Stores keep it as opaque text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSecrets(pub String);

/// An endpoint's own request headers (e.g. `Authorization` for the receiver), by name.
pub type Headers = BTreeMap<String, String>;

/// An endpoint's [`Headers`] as stored: sealed like its secrets (empty text: none). Rows
/// written before headers were sealed hold plain JSON until the start-up pass seals them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealedHeaders(pub String);

/// What an endpoint presents to its receiver (`delivery_auth::Credentials`: `auth` and
/// `tls`) as stored: sealed (empty text: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealedAuth(pub String);

/// An endpoint's event destination (`destinations::Destination`, broker credentials
/// included) as stored: sealed (empty text: the endpoint delivers over HTTP).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SealedDestination(pub String);

impl SealedHeaders {
    /// Whether this is a plain JSON object left from before headers were sealed.
    pub fn is_plaintext(&self) -> bool {
        self.0.starts_with('{')
    }
}

/// An endpoint's jq expressions, as set through the API (stored with the endpoint).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Scripts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transform: Option<String>,
}

impl Scripts {
    pub fn is_empty(&self) -> bool {
        self.filter.is_none() && self.transform.is_none()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreviousSecret {
    pub key: String,
    pub expires_at: Millis,
}

/// A URL of an application that receives messages, with its filters and settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub id: EndpointId,
    pub app_id: AppId,
    pub uid: Option<String>,
    pub url: String,
    pub description: String,
    pub disabled: bool,
    pub event_types: Option<Vec<String>>,
    pub channels: Option<Vec<String>>,
    pub metadata: Metadata,
    pub throttle_rate: Option<u16>,
    pub headers: SealedHeaders,
    pub secrets: SealedSecrets,
    pub delivery: DeliverySettings,
    /// Herald extension: the request's method, URL template and body format (postbacks).
    pub request: Option<crate::postback::RequestSettings>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// Herald extension: the jq filter and transform.
    pub scripts: Scripts,
    /// Herald extension: the credentials presented to the receiver.
    pub auth: SealedAuth,
    /// Herald extension: the broker the endpoint publishes to instead of POSTing to `url`.
    pub destination: SealedDestination,
    /// Svix's deprecated `version`: set by callers (at least 1), read back, used by nothing.
    pub version: i32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EventType {
    pub name: String,
    pub description: String,
    pub archived: bool,
    pub deprecated: bool,
    pub schemas: Option<serde_json::Value>,
    pub feature_flag: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}
