//! Assembling Herald from its configuration: `Server::build(config)` opens the store,
//! wires the services and binds the listener; `run_until_stopped(shutdown)` serves until
//! the token is cancelled, then drains (HTTP first, then in-flight attempts) and releases
//! what it holds. Tests start the real server this way on port 0.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::alerts::{Alerts, Sender};
use crate::api::{self, AdminToken, ApiSettings, AppState, Limits, RateLimiter};
use crate::catalog::Catalog;
use crate::config::{Config, Role};
use crate::deliver::{Deliverer, DelivererConfig};
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::endpoint_settings::Defaults;
use crate::housekeeping;
use crate::ids::random_token;
use crate::ingest::Ingestor;
use crate::metrics::Metrics;
use crate::redaction::Redactor;
use crate::sealing::{Keyring, generate_key};
use crate::signing::SigningKey;
use crate::ssrf::Guard;
use crate::store::Store;
use crate::store::postgres::{PgOptions, PgStore};
use crate::store::sqlite::SqliteStore;

/// How often housekeeping runs.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(600);
/// Room for the JSON around a maximal payload.
const BODY_OVERHEAD_BYTES: usize = 64 * 1024;

pub struct Server {
    listener: TcpListener,
    router: axum::Router,
    dispatcher: Arc<Dispatcher>,
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    alerts: Arc<Alerts>,
    config: Config,
    /// Held for the life of the process (SQLite): a second Herald on the same data
    /// directory fails at once.
    _lock: Option<File>,
}

impl Server {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let (store, lock, admin_token) = open_store(&config).await?;
        let keyring = Arc::new(keyring(&config)?);
        let listener = TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("binding {}", config.server.listen))?;
        let local = listener.local_addr()?;
        let public_host =
            config.server.public_url.as_deref().and_then(|u| url::Url::parse(u).ok()?.host_str().map(str::to_owned));
        let guard = Arc::new(Guard::new(config.delivery.allowed_networks.clone()).with_own(local, public_host));
        let defaults = Defaults { timeout: config.delivery.timeout, retry: config.delivery.default_retry.clone() };
        let catalog = Arc::new(Catalog::new(store.clone(), defaults, keyring.clone()));
        let deliverer = Deliverer::new(
            guard.clone(),
            DelivererConfig {
                read_limit: config.delivery.response_read_limit,
                store_limit: config.delivery.response_store_limit,
                user_agent: config.delivery.user_agent.clone(),
                dns_budget: config.delivery.dns_timeout,
                connect_budget: config.delivery.connect_timeout,
                tls_budget: config.delivery.tls_timeout,
                dns_servers: config.delivery.dns_servers.clone(),
            },
        );
        let metrics = Arc::new(Metrics::default());
        let dispatcher = Dispatcher::new(
            format!("node-{}", random_token(12)),
            store.clone(),
            catalog.clone(),
            deliverer,
            DispatchConfig {
                queue: config.queue.clone(),
                lease: config.queue.lease,
                max_in_flight: config.delivery.max_in_flight,
                panic_on_event_type: config.faults.panic_on_event_type.clone(),
            },
            metrics.clone(),
        );
        // An API-only process never claims: what it accepts is left for the workers.
        let delivers = config.server.role != Role::Api;
        let ingestor = Arc::new(Ingestor::new(store.clone(), catalog.clone(), dispatcher.clone(), delivers));

        let state = AppState {
            store: store.clone(),
            catalog: catalog.clone(),
            ingestor,
            dispatcher: dispatcher.clone(),
            metrics: metrics.clone(),
            guard,
            admin: Arc::new(AdminToken::new(&admin_token)),
            keyring,
            limits: Limits {
                body_bytes: config.server.max_payload_bytes + BODY_OVERHEAD_BYTES,
                max_payload_bytes: config.server.max_payload_bytes,
            },
            settings: Arc::new(ApiSettings {
                public_url: config.server.public_url.clone().unwrap_or_else(|| format!("http://{local}")),
                portal_token_ttl: config.auth.portal_token_ttl,
                secret_rotation_overlap: config.delivery.secret_rotation_overlap,
                session_ttl: config.auth.session_ttl,
            }),
            key_locks: Default::default(),
            rate_limiter: Arc::new(RateLimiter::new(
                config.auth.portal_requests_per_second,
                config.auth.admin_requests_per_second,
                config.auth.failed_auth_per_minute,
            )),
            redactor: Arc::new(Redactor::new(config.redaction.fields.clone(), &config.redaction.keys)),
            replays: Default::default(),
        };
        let router = match config.server.role {
            Role::Worker => api::health_router(state),
            Role::All | Role::Api => api::router(state),
        };
        let alerts = Arc::new(Alerts::new(
            config.alerts.settings.clone(),
            store.clone(),
            catalog.clone(),
            dispatcher.clone(),
            metrics,
            alert_sender(&config)?,
        ));
        Ok(Self { listener, router, dispatcher, store, catalog, alerts, config, _lock: lock })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Serves until `shutdown` is cancelled, then stops taking requests, lets in-flight
    /// attempts finish within the grace period, and gives back every held delivery.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(addr = %self.local_addr(), role = ?self.config.server.role, "Herald is listening");
        let stop_background = CancellationToken::new();
        let dispatcher = match self.config.server.role {
            Role::All | Role::Worker => Some(tokio::spawn(self.dispatcher.clone().run(stop_background.clone()))),
            Role::Api => None,
        };
        tokio::spawn(self.catalog.clone().follow(self.store.signals().catalog.subscribe(), stop_background.clone()));
        tokio::spawn(reseal(self.catalog.clone()));
        if self.config.server.role != Role::Api {
            tokio::spawn(self.alerts.clone().run(stop_background.clone()));
        }
        let ttl = self.config.server.idempotency_ttl;
        tokio::spawn(housekeeping::run(self.store.clone(), ttl, HOUSEKEEPING_EVERY, stop_background.clone()));
        tokio::spawn(housekeeping::retention(
            self.store.clone(),
            self.config.retention.clone(),
            stop_background.clone(),
        ));
        // Client addresses feed the failed-authentication budget.
        let service = self.router.into_make_service_with_connect_info::<SocketAddr>();
        let served = axum::serve(self.listener, service)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .context("serving HTTP");
        stop_background.cancel();
        if let Some(dispatcher) = dispatcher {
            dispatcher.await.context("the dispatcher task failed")?;
        }
        served
    }
}

/// Where operational webhooks go, if anywhere (the configuration checked the pair).
fn alert_sender(config: &Config) -> anyhow::Result<Option<Sender>> {
    let (Some(url), Some(secret)) = (&config.alerts.webhook_url, &config.alerts.webhook_secret) else {
        return Ok(None);
    };
    let key = SigningKey::decode(secret).map_err(|e| anyhow::anyhow!("alerts.webhook_secret: {e}"))?;
    Ok(Some(Sender::new(url.parse().context("alerts.webhook_url")?, key)))
}

/// Rewrites secrets sealed under a previous server key (after a key rotation), and seals
/// headers stored before they were sealed.
async fn reseal(catalog: Arc<Catalog>) {
    match catalog.reseal_stale().await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(endpoints = n, "sealed endpoint secrets and headers again under the current server key")
        }
        Err(e) => tracing::warn!(error = %e, "resealing endpoint secrets failed; they stay readable with the old key"),
    }
}

/// Opens the configured store; returns it with the data-directory lock (SQLite) and the
/// admin token.
async fn open_store(config: &Config) -> anyhow::Result<(Arc<dyn Store>, Option<File>, String)> {
    if let Some(url) = &config.store.database_url {
        let Some(token) = config.auth.admin_token.clone() else {
            bail!(
                "HERALD_ADMIN_TOKEN is required with PostgreSQL: every process sharing the database must use the same one"
            )
        };
        let options = PgOptions {
            pool_size: config.store.pool_size,
            connect_timeout: Duration::from_secs(5),
            ingest_batch_max: config.store.ingest_batch_max,
            ingest_linger: config.store.ingest_linger,
            max_payload_bytes: config.server.max_payload_bytes,
        };
        let store: Arc<dyn Store> = Arc::new(PgStore::connect(url, &options).await?);
        return Ok((store, None, token));
    }
    let data_dir = &config.server.data_dir;
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating data directory {}", data_dir.display()))?;
    let lock = lock_data_dir(data_dir)?;
    let token = admin_token(config, data_dir)?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data_dir.join("herald.db"), &config.store)?);
    // Only this process can open the database, so every claim left in it belongs to a
    // process that is gone.
    let reclaimed = store.release_all().await?;
    if reclaimed > 0 {
        tracing::info!(reclaimed, "took back deliveries held by a previous process");
    }
    Ok((store, Some(lock), token))
}

fn lock_data_dir(data_dir: &Path) -> anyhow::Result<File> {
    let path = data_dir.join("herald.lock");
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            bail!("another Herald process is using the data directory {}", data_dir.display())
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e).context("locking the data directory"),
    }
}

/// The configured admin token, or the one generated into the data directory on first start
/// (mode 0600, printed once).
fn admin_token(config: &Config, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(token) = &config.auth.admin_token {
        return Ok(token.clone());
    }
    let (token, generated) = private_file(&data_dir.join("admin-token"), || format!("hrld_{}", random_token(32)))?;
    if generated {
        let path = data_dir.join("admin-token");
        println!("Generated an admin token (stored in {}, shown only this once):\n\n    {token}\n", path.display());
    }
    Ok(token)
}

/// The server key that seals endpoint secrets: configured, or (SQLite only) generated into
/// the data directory on first start.
fn keyring(config: &Config) -> anyhow::Result<Keyring> {
    let current = match (&config.auth.secret_key, &config.store.database_url) {
        (Some(key), _) => key.clone(),
        (None, Some(_)) => bail!(
            "HERALD_SECRET_KEY is required with PostgreSQL: every process sharing the database must seal endpoint \
             secrets with the same key (generate one with `openssl rand -base64 32`)"
        ),
        (None, None) => {
            let path = config.server.data_dir.join("secret-key");
            let (key, generated) = private_file(&path, generate_key)?;
            if generated {
                tracing::info!(path = %path.display(), "generated the server key that seals endpoint secrets");
            }
            key
        }
    };
    Keyring::new(&current, &config.auth.previous_secret_keys).context("auth.secret_key / HERALD_SECRET_KEY")
}

/// Reads a one-line private file, creating it (mode 0600) with `generate()` when it does
/// not exist yet; tells whether it was generated.
fn private_file(path: &Path, generate: impl FnOnce() -> String) -> anyhow::Result<(String, bool)> {
    if path.exists() {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        return Ok((text.trim().to_owned(), false));
    }
    let value = generate();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).with_context(|| format!("creating {}", path.display()))?;
    writeln!(file, "{value}")?;
    file.sync_all()?;
    Ok((value, true))
}
