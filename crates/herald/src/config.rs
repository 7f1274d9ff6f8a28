//! Configuration in two stages: raw values (embedded defaults, overlaid by an optional TOML
//! file and `HERALD_*` environment variables, then flags: `layers`), and one validated
//! [`Config`] (`raw` checks the raw values and builds it) that is passed explicitly to
//! whatever needs it. This file holds the validated types.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

use crate::retry::RetryPolicy;

mod layers;
mod limits;
mod otel;
mod raw;
pub use layers::Sources;
pub use limits::{HttpConfig, TenantLimits};
pub use otel::{OtelConfig, OtlpExport, SamplerChoice};

/// The commented default configuration, embedded in the binary.
pub const DEFAULT_TOML: &str = include_str!("config/default.toml");

#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub delivery: DeliveryConfig,
    pub queue: QueueConfig,
    pub store: StoreConfig,
    pub log: LogConfig,
    pub redaction: RedactionConfig,
    pub faults: FaultsConfig,
    pub alerts: AlertsConfig,
    pub retention: RetentionConfig,
    pub portal: PortalConfig,
    pub scripts: ScriptsConfig,
    pub otel: OtelConfig,
    pub http: HttpConfig,
    pub tenants: TenantLimits,
}

/// The jq sandbox that runs endpoint filters and transforms (see `scripts`).
#[derive(Debug, Clone)]
pub struct ScriptsConfig {
    /// Longest one evaluation may run before its worker is killed.
    pub timeout: Duration,
    /// Address space of one sandbox worker process.
    pub memory_bytes: u64,
    /// Sandbox worker processes (evaluations run in parallel across them).
    pub workers: usize,
    /// Workers one application holds at once at most (its fair share; see `scripts::turns`).
    pub max_workers_per_app: usize,
    /// The program started as a worker (with `sandbox-worker`); `None`: this executable.
    pub worker_program: Option<std::path::PathBuf>,
}

/// The customer portal: who may embed it, and the server's brand.
#[derive(Debug, Clone, Default)]
pub struct PortalConfig {
    /// Origins allowed to show the portal in a frame (`frame-ancestors`); empty: none.
    pub frame_ancestors: Vec<String>,
    pub brand: crate::brand::Brand,
}

/// How long data is kept; `None`: for ever.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    pub payloads: Option<Duration>,
    pub responses: Option<Duration>,
    pub attempts: Option<Duration>,
    pub interval: Duration,
    pub batch: usize,
}

/// Alert evaluation and where operational webhooks go.
#[derive(Debug, Clone)]
pub struct AlertsConfig {
    pub webhook_url: Option<String>,
    /// `whsec_…`; required with a URL.
    pub webhook_secret: Option<String>,
    pub settings: AlertSettings,
}

/// When the alert conditions are judged, and their thresholds.
#[derive(Debug, Clone)]
pub struct AlertSettings {
    pub interval: Duration,
    pub oldest_pending: Duration,
    pub p95_threshold_ms: f64,
    /// `None`: never disable endpoints.
    pub auto_disable_after: Option<Duration>,
}

/// Fault injection for Herald's own robustness tests. Only builds with the
/// `fault-injection` feature (test builds) accept the `[faults]` settings; the binary users
/// run refuses them and has no hooks to honour them.
#[derive(Debug, Clone, Default)]
pub struct FaultsConfig {
    /// Every attempt of a message of this event type panics inside its worker.
    pub panic_on_event_type: Option<String>,
    /// The dispatcher's pump panics when it takes a message of this event type.
    pub panic_pump_on_event_type: Option<String>,
}

/// Payload fields masked for readers without the `sensitive` permission.
#[derive(Debug, Clone, Default)]
pub struct RedactionConfig {
    /// Event type (or `*`) → JSON pointers.
    pub fields: BTreeMap<String, Vec<String>>,
    /// Key names masked at any depth (`*part*`: substring).
    pub keys: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub max_payload_bytes: usize,
    pub public_url: Option<String>,
    pub idempotency_ttl: Duration,
    pub role: Role,
    /// Threads of the async runtime; `None`: one per core.
    pub worker_threads: Option<usize>,
}

/// What a process does (`server.role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The API and delivery.
    All,
    /// The API only: accepted deliveries are left for workers.
    Api,
    /// Delivery only: the HTTP listener answers health checks.
    Worker,
}

#[derive(Clone)]
pub struct AuthConfig {
    pub admin_token: Option<String>,
    pub portal_token_ttl: Duration,
    /// The server key sealing endpoint secrets (base64, 32 bytes).
    pub secret_key: Option<String>,
    /// Earlier server keys, still accepted for opening.
    pub previous_secret_keys: Vec<String>,
    /// Requests per second per app-portal token; `None`: unlimited.
    pub portal_requests_per_second: Option<u16>,
    /// Requests per second for the admin token; `None`: unlimited.
    pub admin_requests_per_second: Option<u16>,
    /// Failed authentications per client address and minute; `None`: unlimited.
    pub failed_auth_per_minute: Option<u16>,
    /// Lifetime of a dashboard session.
    pub session_ttl: Duration,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("admin_token", &self.admin_token.as_ref().map(|_| "<redacted>"))
            .field("portal_token_ttl", &self.portal_token_ttl)
            .field("secret_key", &self.secret_key.as_ref().map(|_| "<redacted>"))
            .field("previous_secret_keys", &format!("<{} redacted>", self.previous_secret_keys.len()))
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    pub timeout: Duration,
    pub max_in_flight: usize,
    pub response_read_limit: usize,
    pub response_store_limit: usize,
    pub allowed_networks: Vec<IpNet>,
    /// Endpoint URLs may use any port (otherwise 80, 443 and 1024 up).
    pub any_port: bool,
    pub dns_servers: Vec<SocketAddr>,
    pub dns_timeout: Duration,
    pub connect_timeout: Duration,
    pub tls_timeout: Duration,
    pub secret_rotation_overlap: Duration,
    pub user_agent: String,
    pub default_retry: RetryPolicy,
    /// Every attempt tunnels through this HTTP CONNECT proxy (`delivery.proxy_url`).
    pub proxy: Option<crate::egress::EgressProxy>,
}

#[derive(Debug, Clone)]
pub struct QueueConfig {
    pub memory_limit: usize,
    pub poll_interval: Duration,
    /// PostgreSQL: how often the database is asked whether claimable work waits; `None`: never.
    pub probe_interval: Option<Duration>,
    pub retry_horizon: Duration,
    pub shutdown_grace: Duration,
    pub lease: Duration,
}

#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub database_url: Option<String>,
    pub pool_size: usize,
    pub ingest_batch_max: usize,
    pub ingest_linger: Duration,
    pub read_connections: usize,
    pub write_batch_max: usize,
    pub commit_interval: Duration,
    pub checkpoint_interval: Duration,
    /// SQLite: store payloads of 256 bytes or more compressed (`store::packing`).
    pub pack_payloads: bool,
    /// SQLite: idempotency keys kept in memory before they are written as a run
    /// (`store/sqlite/keys/`).
    pub idempotency_run_keys: usize,
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub json: bool,
    pub level: String,
}

#[cfg(test)]
mod tests {
    use toml::Value;

    use super::raw::{allow_faults, frame_ancestor};
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn fault_injection_is_not_part_of_the_default_configuration_and_needs_a_test_build() {
        assert!(!DEFAULT_TOML.contains("[faults]") && !DEFAULT_TOML.contains("panic"), "no fault hook in the defaults");
        let defaults = Config::defaults().faults;
        assert_eq!((defaults.panic_on_event_type, defaults.panic_pump_on_event_type), (None, None));
        let poison = FaultsConfig { panic_on_event_type: Some("poison".into()), ..Default::default() };
        let refused = allow_faults(&poison, false).unwrap_err().to_string();
        assert!(refused.contains("test builds"), "{refused}");
        assert!(allow_faults(&poison, true).is_ok());
        assert!(allow_faults(&FaultsConfig::default(), false).is_ok());
    }

    #[test]
    fn frame_ancestors_are_origins_only() {
        assert_eq!(frame_ancestor("https://app.example.com/").unwrap(), "https://app.example.com");
        assert_eq!(frame_ancestor("https://*.example.com").unwrap(), "https://*.example.com");
        assert_eq!(frame_ancestor("http://localhost:3000").unwrap(), "http://localhost:3000");
        for bad in
            ["*", "'none'", "https://a.example/path", "app.example.com", "javascript://x", "https://a b", "https://x;y"]
        {
            assert!(frame_ancestor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn embedded_defaults_match_the_documented_values() {
        let config = Config::defaults();
        assert_eq!(config.server.listen.to_string(), "127.0.0.1:8071");
        assert_eq!(config.server.data_dir, PathBuf::from("./herald-data"));
        assert_eq!(config.server.max_payload_bytes, 256 * 1024);
        assert_eq!(config.delivery.timeout, Duration::from_secs(10));
        assert_eq!(config.delivery.default_retry, RetryPolicy::default());
        assert!(config.auth.admin_token.is_none());
        assert!(config.delivery.allowed_networks.is_empty());
        assert_eq!(config.server.worker_threads, None, "0: one thread per core");
    }

    #[test]
    fn environment_overrides_defaults_with_short_and_long_names() {
        let sources = Sources {
            env: env(&[
                ("HERALD_LISTEN", "0.0.0.0:9000"),
                ("HERALD_ALLOWED_NETWORKS", "127.0.0.1/32, 10.0.0.0/8"),
                ("HERALD_DELIVERY__TIMEOUT_MS", "2500"),
                ("HERALD_LOG__FORMAT", "json"),
                ("HERALD_SERVER__WORKER_THREADS", "1"),
                ("HERALD_UNRELATED", "ignored"),
            ]),
            ..Default::default()
        };
        let config = Config::load(&sources).unwrap();
        assert_eq!(config.server.listen.to_string(), "0.0.0.0:9000");
        assert_eq!(config.delivery.allowed_networks.len(), 2);
        assert_eq!(config.delivery.timeout, Duration::from_millis(2500));
        assert!(config.log.json);
        assert_eq!(config.server.worker_threads, Some(1));
    }

    #[test]
    fn file_then_env_then_flags_take_precedence_in_that_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.toml");
        std::fs::write(&path, "[server]\nlisten = \"127.0.0.1:1111\"\nmax_payload_bytes = 1000\n").unwrap();
        let sources = Sources {
            file: Some(path),
            env: env(&[("HERALD_LISTEN", "127.0.0.1:2222")]),
            overrides: vec![("server.data_dir".into(), Value::String("/tmp/x".into()))],
        };
        let config = Config::load(&sources).unwrap();
        assert_eq!(config.server.listen.port(), 2222);
        assert_eq!(config.server.max_payload_bytes, 1000);
        assert_eq!(config.server.data_dir, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn invalid_values_and_unknown_keys_are_refused_with_the_key_named() {
        let bad = |pairs: &[(&str, &str)]| {
            let sources = Sources { env: env(pairs), ..Default::default() };
            format!("{:#}", Config::load(&sources).unwrap_err())
        };
        assert!(bad(&[("HERALD_LISTEN", "nope")]).contains("server.listen"));
        assert!(bad(&[("HERALD_ALLOWED_NETWORKS", "10.0.0.0/99")]).contains("allowed_networks"));
        assert!(bad(&[("HERALD_DELIVERY__TIMEOUT_MSS", "1")]).contains("timeout_mss"));
        assert!(bad(&[("HERALD_LOG__FORMAT", "xml")]).contains("log.format"));
    }

    #[test]
    fn admin_token_debug_output_is_redacted() {
        let sources = Sources { env: env(&[("HERALD_ADMIN_TOKEN", "sekrit")]), ..Default::default() };
        let config = Config::load(&sources).unwrap();
        assert_eq!(config.auth.admin_token.as_deref(), Some("sekrit"));
        assert!(!format!("{config:?}").contains("sekrit"));
    }
}
