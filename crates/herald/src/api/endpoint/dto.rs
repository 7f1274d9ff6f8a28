//! What the endpoint routes read and answer: the bodies of create, update and patch, and
//! an endpoint as the API shows it.

use super::stored::credentials_summary;
use crate::api::AppState;
use crate::api::validate::double_option;
use crate::clock::to_rfc3339;
use crate::delivery_auth::{AuthSummary, ClientTls, DeliveryAuth, TlsSummary};
use crate::destinations::{Destination, DestinationOut};
use crate::endpoint_settings::{DeliverySettings, EffectiveSettings};
use crate::postback::RequestSettings;
use crate::store::{Endpoint, Headers, Metadata};
use serde::{Deserialize, Serialize};

/// Body of create (POST) and update (PUT). `secret` is only used when creating.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointIn {
    /// Herald extension (admin token only, on creation): keep an id another server minted
    /// (`ep_` and 16 to 64 letters and digits), as `herald import svix` does. Herald
    /// mints its own when absent.
    pub id: Option<String>,
    /// May be left out when `destination` is set: the endpoint then reads back as its
    /// broker's URL.
    #[serde(default)]
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
    /// Herald extension: publish to this broker instead of POSTing to `url` (event
    /// destinations). Kept when an update leaves it out; `null` goes back to HTTP.
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Destination>)]
    pub destination: Option<Option<Destination>>,
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
    /// `null` goes back to delivering over HTTP (give `url` too).
    #[serde(default, deserialize_with = "double_option")]
    #[schema(value_type = Option<Destination>)]
    pub destination: Option<Option<Destination>>,
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
    /// Herald extension: the event destination, when set (never its secrets).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<DestinationOut>,
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
            destination: super::destination::shown(state, e),
        }
    }
}
