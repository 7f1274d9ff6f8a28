//! The `[http]` and `[tenants]` sections: how long a client may take to send a request and
//! how many connections it may hold, and what one application (one customer) may have and
//! hold at once. Every customer is treated as a possible adversary: these are the bounds
//! that keep one from crowding out the rest.

use std::time::Duration;

use anyhow::bail;
use ipnet::IpNet;
use serde::Deserialize;

/// How the HTTP server treats its clients.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// A request's head (request line and headers) must arrive within this, counted from
    /// its first byte (or from the connection's start).
    pub header_read_timeout: Duration,
    /// A request's body must arrive within this, counted from the end of its head.
    pub body_read_timeout: Duration,
    /// A connection with no request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// Connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// Reverse proxies whose client-address header is believed (empty: none is).
    pub trusted_proxies: Vec<IpNet>,
    /// The header a trusted proxy puts the client's address in (`x-forwarded-for`).
    pub client_address_header: String,
}

/// What one application may have and hold at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantLimits {
    pub max_endpoints: usize,
    pub max_pollers: usize,
    pub max_consumers_per_poller: usize,
    /// Long-polls waiting at once for one application, and for one token.
    pub max_waiting_polls: usize,
    pub max_waiting_polls_per_token: usize,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self {
            max_endpoints: 1000,
            max_pollers: 100,
            max_consumers_per_poller: 1000,
            max_waiting_polls: 100,
            max_waiting_polls_per_token: 20,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    header_read_timeout_ms: u64,
    body_read_timeout_ms: u64,
    idle_timeout_ms: u64,
    max_connections: usize,
    trusted_proxies: Vec<String>,
    client_address_header: String,
}

impl RawHttp {
    pub(super) fn validate(self) -> anyhow::Result<HttpConfig> {
        let timeouts = [
            ("http.header_read_timeout_ms", self.header_read_timeout_ms),
            ("http.body_read_timeout_ms", self.body_read_timeout_ms),
            ("http.idle_timeout_ms", self.idle_timeout_ms),
        ];
        if let Some((name, _)) = timeouts.iter().find(|(_, ms)| *ms == 0) {
            bail!("{name} must be positive");
        }
        if self.max_connections == 0 {
            bail!("http.max_connections must be positive");
        }
        let trusted_proxies = self
            .trusted_proxies
            .iter()
            .map(|net| super::raw::parse_network(net))
            .collect::<anyhow::Result<Vec<_>>>()
            .map_err(|e| anyhow::anyhow!("http.trusted_proxies: {e:#}"))?;
        let header = self.client_address_header.trim().to_ascii_lowercase();
        if !trusted_proxies.is_empty() && http::HeaderName::try_from(header.as_str()).is_err() {
            bail!("http.client_address_header: {header:?} is not a header name");
        }
        Ok(HttpConfig {
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms),
            body_read_timeout: Duration::from_millis(self.body_read_timeout_ms),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms),
            max_connections: self.max_connections,
            trusted_proxies,
            client_address_header: header,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenants {
    max_endpoints: usize,
    max_pollers: usize,
    max_consumers_per_poller: usize,
    max_waiting_polls: usize,
    max_waiting_polls_per_token: usize,
}

impl RawTenants {
    pub(super) fn validate(self) -> anyhow::Result<TenantLimits> {
        let limits = TenantLimits {
            max_endpoints: self.max_endpoints,
            max_pollers: self.max_pollers,
            max_consumers_per_poller: self.max_consumers_per_poller,
            max_waiting_polls: self.max_waiting_polls,
            max_waiting_polls_per_token: self.max_waiting_polls_per_token,
        };
        if [limits.max_endpoints, limits.max_pollers, limits.max_consumers_per_poller].contains(&0) {
            bail!("tenants.max_endpoints, max_pollers and max_consumers_per_poller must be positive");
        }
        Ok(limits)
    }
}
