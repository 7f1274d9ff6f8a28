//! The configuration as written in TOML (unknown keys refused), and its validation into the
//! typed [`Config`](super::Config).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use ipnet::IpNet;
use serde::Deserialize;

use super::*;
use crate::retry::RetryPolicy;

/// Raw values as written in TOML; unknown keys are an error so typos do not pass silently.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Raw {
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
pub(super) fn frame_ancestor(raw: &str) -> anyhow::Result<String> {
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
pub(super) fn allow_faults(faults: &FaultsConfig, hooks_built: bool) -> anyhow::Result<()> {
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
    pack_payloads: bool,
    idempotency_run_keys: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    format: String,
    level: String,
}

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

impl Raw {
    pub(super) fn validate(self) -> anyhow::Result<Config> {
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
            ("store.idempotency_run_keys", self.store.idempotency_run_keys),
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
                pack_payloads: self.store.pack_payloads,
                idempotency_run_keys: self.store.idempotency_run_keys,
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
pub(super) fn parse_network(s: &str) -> anyhow::Result<IpNet> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from))
        .with_context(|| format!("{s:?} is not a CIDR"))
}
