//! Configuration in two stages: raw values (embedded defaults, overlaid by an optional TOML
//! file and `HERALD_*` environment variables, then flags), and one validated [`Config`] that
//! is passed explicitly to whatever needs it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use ipnet::IpNet;
use serde::Deserialize;
use toml::Value;

use crate::retry::RetryPolicy;

mod limits;
mod otel;
pub use limits::{HttpConfig, TenantLimits};
pub use otel::{OtelConfig, OtlpExport, SamplerChoice};

/// The commented default configuration, embedded in the binary.
pub const DEFAULT_TOML: &str = include_str!("config/default.toml");

impl RawAlerts {
    fn validate(self) -> anyhow::Result<AlertsConfig> {
        let (url, secret) = (non_empty(self.webhook_url), non_empty(self.webhook_secret));
        if url.is_some() && secret.is_none() {
            bail!(
                "alerts.webhook_secret (whsec_…) is required with alerts.webhook_url: operational webhooks are signed"
            );
        }
        if let Some(secret) = &secret {
            crate::signing::SigningKey::decode(secret).map_err(|e| anyhow::anyhow!("alerts.webhook_secret: {e}"))?;
        }
        if let Some(url) = &url {
            url.parse::<http::Uri>().with_context(|| format!("alerts.webhook_url: {url:?} is not a URL"))?;
        }
        if self.interval_secs.is_nan() || self.interval_secs <= 0.0 {
            bail!("alerts.interval_secs must be positive");
        }
        let settings = AlertSettings {
            interval: Duration::from_secs_f64(self.interval_secs),
            oldest_pending: Duration::from_secs(self.oldest_pending_secs),
            p95_threshold_ms: self.p95_threshold_ms,
            auto_disable_after: (self.auto_disable_after_hours > 0.0)
                .then(|| Duration::from_secs_f64(self.auto_disable_after_hours * 3600.0)),
        };
        Ok(AlertsConfig { webhook_url: url, webhook_secret: secret, settings })
    }
}

/// Short environment variable names and the key each sets.
const ENV_ALIASES: &[(&str, &str)] = &[
    ("HERALD_LISTEN", "server.listen"),
    ("HERALD_DATA_DIR", "server.data_dir"),
    ("HERALD_ADMIN_TOKEN", "auth.admin_token"),
    ("HERALD_SECRET_KEY", "auth.secret_key"),
    ("HERALD_ALLOWED_NETWORKS", "delivery.allowed_networks"),
    ("HERALD_DATABASE_URL", "store.database_url"),
    ("HERALD_ROLE", "server.role"),
];

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
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub json: bool,
    pub level: String,
}

/// Raw values as written in TOML; unknown keys are an error so typos do not pass silently.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    server: RawServer,
    auth: RawAuth,
    delivery: RawDelivery,
    queue: RawQueue,
    store: RawStore,
    log: RawLog,
    redaction: RawRedaction,
    #[serde(default)]
    faults: RawFaults,
    alerts: RawAlerts,
    retention: RawRetention,
    portal: RawPortal,
    scripts: RawScripts,
    otel: otel::RawOtel,
    http: limits::RawHttp,
    tenants: limits::RawTenants,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScripts {
    timeout_ms: u64,
    memory_mb: u64,
    workers: usize,
    max_workers_per_app: usize,
    worker_program: String,
}

/// `delivery.proxy_url`: empty for none, else `http://[user:pass@]host:port`.
fn egress_proxy(text: &str) -> anyhow::Result<Option<crate::egress::EgressProxy>> {
    if text.is_empty() {
        return Ok(None);
    }
    crate::egress::EgressProxy::parse(text).map(Some).map_err(|e| anyhow::anyhow!("delivery.proxy_url {e}"))
}

impl RawScripts {
    fn validate(self) -> anyhow::Result<ScriptsConfig> {
        if self.timeout_ms == 0 || self.memory_mb < 64 {
            bail!("scripts.timeout_ms must be positive and scripts.memory_mb at least 64");
        }
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let workers = if self.workers == 0 { cores.max(2) } else { self.workers };
        let share = if self.max_workers_per_app == 0 { workers / 2 } else { self.max_workers_per_app };
        Ok(ScriptsConfig {
            timeout: Duration::from_millis(self.timeout_ms),
            memory_bytes: self.memory_mb * 1024 * 1024,
            workers,
            max_workers_per_app: share.clamp(1, workers),
            worker_program: (!self.worker_program.is_empty()).then(|| self.worker_program.into()),
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPortal {
    frame_ancestors: Vec<String>,
    brand_name: String,
    logo_url: String,
    accent_color: String,
    theme: crate::brand::Theme,
}

impl RawPortal {
    fn validate(self) -> anyhow::Result<PortalConfig> {
        let brand = crate::brand::Brand {
            name: non_empty(self.brand_name),
            logo_url: non_empty(self.logo_url),
            accent_color: non_empty(self.accent_color),
            theme: Some(self.theme),
        };
        if let Some((field, problem)) = brand.problems().into_iter().next() {
            bail!("portal.{field}: {problem}");
        }
        let frame_ancestors = self.frame_ancestors.iter().map(|o| frame_ancestor(o)).collect::<anyhow::Result<_>>()?;
        Ok(PortalConfig { frame_ancestors, brand })
    }
}

/// A `frame-ancestors` source: an http(s) origin, its host optionally `*.`-prefixed.
fn frame_ancestor(raw: &str) -> anyhow::Result<String> {
    let refused = || anyhow::anyhow!("portal.frame_ancestors: {raw:?} is not an origin like https://app.example.com");
    let (scheme, rest) = raw.trim().split_once("://").ok_or_else(refused)?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let (wildcard, host) = match rest.strip_prefix("*.") {
        Some(host) => ("*.", host),
        None => ("", rest),
    };
    let url = url::Url::parse(&format!("{scheme}://{host}")).map_err(|_| refused())?;
    let plain = matches!(url.scheme(), "http" | "https") && url.path() == "/" && url.username().is_empty();
    if !plain || url.query().is_some() || url.fragment().is_some() || url.host().is_none() || url.password().is_some() {
        return Err(refused());
    }
    let origin = url.origin().ascii_serialization();
    let (scheme, host_port) = origin.split_once("://").ok_or_else(refused)?;
    // Only what a host and port are made of: nothing that could end or extend the policy.
    if !host_port.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b)) {
        return Err(refused());
    }
    Ok(format!("{scheme}://{wildcard}{host_port}"))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    payload_days: f64,
    response_days: f64,
    attempt_days: f64,
    interval_secs: f64,
    batch: usize,
}

impl RawRetention {
    fn validate(self) -> anyhow::Result<RetentionConfig> {
        let days = |d: f64| (d >= 0.0).then(|| Duration::from_secs_f64(d * 86_400.0));
        if self.interval_secs.is_nan() || self.interval_secs <= 0.0 || self.batch == 0 {
            bail!("retention.interval_secs and retention.batch must be positive");
        }
        Ok(RetentionConfig {
            payloads: days(self.payload_days),
            responses: days(self.response_days),
            attempts: days(self.attempt_days),
            interval: Duration::from_secs_f64(self.interval_secs),
            batch: self.batch,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlerts {
    webhook_url: String,
    webhook_secret: String,
    interval_secs: f64,
    oldest_pending_secs: u64,
    p95_threshold_ms: f64,
    auto_disable_after_hours: f64,
}

/// Not among the embedded defaults: test builds set these through `HERALD_FAULTS__*`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct RawFaults {
    panic_on_event_type: String,
    panic_pump_on_event_type: String,
}

impl RawFaults {
    fn validate(self) -> anyhow::Result<FaultsConfig> {
        let faults = FaultsConfig {
            panic_on_event_type: non_empty(self.panic_on_event_type),
            panic_pump_on_event_type: non_empty(self.panic_pump_on_event_type),
        };
        allow_faults(&faults, cfg!(feature = "fault-injection"))?;
        Ok(faults)
    }
}

/// Fault settings are refused by a build without the hooks that honour them.
fn allow_faults(faults: &FaultsConfig, hooks_built: bool) -> anyhow::Result<()> {
    let set = faults.panic_on_event_type.is_some() || faults.panic_pump_on_event_type.is_some();
    if set && !hooks_built {
        bail!("the [faults] settings exist only in test builds of Herald (the fault-injection feature)");
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRedaction {
    fields: BTreeMap<String, Vec<String>>,
    keys: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: String,
    data_dir: PathBuf,
    max_payload_bytes: usize,
    public_url: String,
    idempotency_ttl_secs: u64,
    role: String,
    worker_threads: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    admin_token: String,
    portal_token_ttl_secs: u64,
    secret_key: String,
    previous_secret_keys: Vec<String>,
    portal_requests_per_second: u16,
    admin_requests_per_second: u16,
    failed_auth_per_minute: u16,
    session_ttl_secs: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDelivery {
    timeout_ms: u64,
    max_in_flight: usize,
    response_read_limit: usize,
    response_store_limit: usize,
    allowed_networks: Vec<String>,
    any_port: bool,
    dns_servers: Vec<String>,
    dns_timeout_ms: u64,
    connect_timeout_ms: u64,
    tls_timeout_ms: u64,
    secret_rotation_overlap_secs: u64,
    user_agent: String,
    default_retry: RetryPolicy,
    proxy_url: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    memory_limit: usize,
    poll_interval_ms: u64,
    probe_interval_ms: u64,
    retry_horizon_ms: u64,
    shutdown_grace_ms: u64,
    lease_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    database_url: String,
    pool_size: usize,
    ingest_batch_max: usize,
    ingest_linger_us: u64,
    read_connections: usize,
    write_batch_max: usize,
    commit_interval_us: u64,
    checkpoint_interval_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: String,
    level: String,
}

/// Where configuration values come from, lowest precedence first.
#[derive(Debug, Default)]
pub struct Sources {
    /// An optional TOML file.
    pub file: Option<PathBuf>,
    /// Environment variables (pass `std::env::vars()`; tests pass their own).
    pub env: Vec<(String, String)>,
    /// `key.path = value` overrides from command-line flags.
    pub overrides: Vec<(String, Value)>,
}

impl Config {
    /// The embedded defaults alone (used by tests, which then adjust fields directly).
    pub fn defaults() -> Self {
        Self::load(&Sources::default()).expect("the embedded default configuration is valid")
    }

    /// Layers defaults, file, environment and overrides, then validates.
    pub fn load(sources: &Sources) -> anyhow::Result<Self> {
        Self::from_layers(Self::layers(sources)?)
    }

    /// Validates configuration already layered (see [`Config::layers`]).
    pub fn from_layers(merged: Value) -> anyhow::Result<Self> {
        let raw: Raw = merged.try_into().context("invalid configuration")?;
        raw.validate()
    }

    /// Defaults, file, environment and overrides layered into one TOML table, before
    /// validation: what is in effect, key by key (`herald check-config` prints it).
    pub fn layers(sources: &Sources) -> anyhow::Result<Value> {
        let mut merged: Value = toml::from_str(DEFAULT_TOML).context("embedded default configuration")?;
        if let Some(path) = &sources.file {
            merge(&mut merged, read_file(path)?);
        }
        let env = otel::env_overrides(&sources.env)?.into_iter().chain(env_overrides(&sources.env)?);
        for (key, value) in env {
            set_path(&mut merged, &key, value)?;
        }
        for (key, value) in &sources.overrides {
            set_path(&mut merged, key, value.clone())?;
        }
        Ok(merged)
    }
}

fn read_file(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
}

/// Deep-merges `over` into `base` (tables merge, everything else replaces).
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Table(base), Value::Table(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, over) => *base = over,
    }
}

fn set_path(root: &mut Value, dotted: &str, value: Value) -> anyhow::Result<()> {
    let mut node = root;
    let mut parts = dotted.split('.').peekable();
    while let Some(part) = parts.next() {
        let Value::Table(table) = node else { bail!("configuration key {dotted} does not name a table") };
        if parts.peek().is_none() {
            let merged = match table.remove(part) {
                Some(mut existing @ Value::Table(_)) => {
                    merge(&mut existing, value);
                    existing
                }
                _ => value,
            };
            table.insert(part.to_owned(), merged);
            return Ok(());
        }
        node = table.entry(part.to_owned()).or_insert_with(|| Value::Table(Default::default()));
    }
    Ok(())
}

/// Turns `HERALD_*` variables into (key path, value) pairs.
fn env_overrides(env: &[(String, String)]) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    for (name, raw) in env {
        if let Some((_, key)) = ENV_ALIASES.iter().find(|(alias, _)| alias == name) {
            let value = if *key == "delivery.allowed_networks" {
                let list = raw.split(',').map(str::trim).filter(|s| !s.is_empty());
                Value::Array(list.map(|s| Value::String(s.to_owned())).collect())
            } else {
                Value::String(raw.clone())
            };
            out.push((key.to_string(), value));
        } else if let Some(rest) = name.strip_prefix("HERALD_")
            && rest.contains("__")
        {
            let key = rest.split("__").map(str::to_ascii_lowercase).collect::<Vec<_>>().join(".");
            out.push((key, parse_env_value(raw)));
        }
    }
    Ok(out)
}

/// Reads an environment value as a TOML literal when it is one (numbers, booleans, arrays,
/// inline tables), else as a plain string.
fn parse_env_value(raw: &str) -> Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(raw.to_owned()))
}

impl Raw {
    fn validate(self) -> anyhow::Result<Config> {
        let listen: SocketAddr = self
            .server
            .listen
            .parse()
            .with_context(|| format!("server.listen: {:?} is not an address:port", self.server.listen))?;
        if self.server.max_payload_bytes == 0 {
            bail!("server.max_payload_bytes must be positive");
        }
        let allowed_networks = self
            .delivery
            .allowed_networks
            .iter()
            .map(|s| parse_network(s).context("delivery.allowed_networks"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let dns_servers = self
            .delivery
            .dns_servers
            .iter()
            .map(|s| s.parse().with_context(|| format!("delivery.dns_servers: {s:?} is not an address:port")))
            .collect::<anyhow::Result<Vec<SocketAddr>>>()?;
        if let Some((field, msg)) = self.delivery.default_retry.problems().into_iter().next() {
            bail!("delivery.default_retry.{field}: {msg}");
        }
        let positive = [
            ("delivery.timeout_ms", self.delivery.timeout_ms as usize),
            ("delivery.dns_timeout_ms", self.delivery.dns_timeout_ms as usize),
            ("delivery.connect_timeout_ms", self.delivery.connect_timeout_ms as usize),
            ("delivery.tls_timeout_ms", self.delivery.tls_timeout_ms as usize),
            ("delivery.max_in_flight", self.delivery.max_in_flight),
            ("queue.memory_limit", self.queue.memory_limit),
            ("queue.poll_interval_ms", self.queue.poll_interval_ms as usize),
            ("store.read_connections", self.store.read_connections),
            ("store.write_batch_max", self.store.write_batch_max),
            ("auth.session_ttl_secs", self.auth.session_ttl_secs as usize),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            bail!("{name} must be positive");
        }
        let role = match self.server.role.as_str() {
            "all" => Role::All,
            "api" => Role::Api,
            "worker" => Role::Worker,
            other => bail!("server.role must be \"all\", \"api\" or \"worker\", not {other:?}"),
        };
        let json = match self.log.format.as_str() {
            "text" => false,
            "json" => true,
            other => bail!("log.format must be \"text\" or \"json\", not {other:?}"),
        };
        Ok(Config {
            server: ServerConfig {
                listen,
                data_dir: self.server.data_dir,
                max_payload_bytes: self.server.max_payload_bytes,
                public_url: non_empty(self.server.public_url),
                idempotency_ttl: Duration::from_secs(self.server.idempotency_ttl_secs),
                role,
                worker_threads: Some(self.server.worker_threads).filter(|n| *n > 0),
            },
            auth: AuthConfig {
                admin_token: non_empty(self.auth.admin_token),
                portal_token_ttl: Duration::from_secs(self.auth.portal_token_ttl_secs),
                secret_key: non_empty(self.auth.secret_key),
                previous_secret_keys: self.auth.previous_secret_keys,
                portal_requests_per_second: Some(self.auth.portal_requests_per_second).filter(|r| *r > 0),
                admin_requests_per_second: Some(self.auth.admin_requests_per_second).filter(|r| *r > 0),
                failed_auth_per_minute: Some(self.auth.failed_auth_per_minute).filter(|r| *r > 0),
                session_ttl: Duration::from_secs(self.auth.session_ttl_secs),
            },
            delivery: DeliveryConfig {
                timeout: Duration::from_millis(self.delivery.timeout_ms),
                max_in_flight: self.delivery.max_in_flight,
                response_read_limit: self.delivery.response_read_limit,
                response_store_limit: self.delivery.response_store_limit.min(self.delivery.response_read_limit),
                allowed_networks,
                any_port: self.delivery.any_port,
                dns_servers,
                dns_timeout: Duration::from_millis(self.delivery.dns_timeout_ms),
                connect_timeout: Duration::from_millis(self.delivery.connect_timeout_ms),
                tls_timeout: Duration::from_millis(self.delivery.tls_timeout_ms),
                secret_rotation_overlap: Duration::from_secs(self.delivery.secret_rotation_overlap_secs),
                user_agent: self.delivery.user_agent,
                default_retry: self.delivery.default_retry,
                proxy: egress_proxy(&self.delivery.proxy_url)?,
            },
            queue: QueueConfig {
                memory_limit: self.queue.memory_limit,
                poll_interval: Duration::from_millis(self.queue.poll_interval_ms),
                probe_interval: (self.queue.probe_interval_ms > 0)
                    .then(|| Duration::from_millis(self.queue.probe_interval_ms)),
                retry_horizon: Duration::from_millis(self.queue.retry_horizon_ms),
                shutdown_grace: Duration::from_millis(self.queue.shutdown_grace_ms),
                lease: Duration::from_millis(self.queue.lease_ms.max(1000)),
            },
            store: StoreConfig {
                database_url: non_empty(self.store.database_url),
                pool_size: self.store.pool_size.max(2),
                ingest_batch_max: self.store.ingest_batch_max.max(1),
                ingest_linger: Duration::from_micros(self.store.ingest_linger_us),
                read_connections: self.store.read_connections,
                write_batch_max: self.store.write_batch_max,
                commit_interval: Duration::from_micros(self.store.commit_interval_us),
                checkpoint_interval: Duration::from_millis(self.store.checkpoint_interval_ms.max(10)),
            },
            log: LogConfig { json, level: self.log.level },
            redaction: RedactionConfig { fields: self.redaction.fields, keys: self.redaction.keys },
            faults: self.faults.validate()?,
            alerts: self.alerts.validate()?,
            retention: self.retention.validate()?,
            portal: self.portal.validate()?,
            scripts: self.scripts.validate()?,
            otel: self.otel.validate()?,
            http: self.http.validate()?,
            tenants: self.tenants.validate()?,
        })
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.trim().is_empty()).then_some(s)
}

/// Accepts a CIDR or a bare address (taken as a single-host network).
fn parse_network(s: &str) -> anyhow::Result<IpNet> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .with_context(|| format!("{s:?} is not a CIDR"))
}

#[cfg(test)]
mod tests {
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
