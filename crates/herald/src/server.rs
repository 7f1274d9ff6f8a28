//! Assembling Herald from its configuration: `Server::build(config)` opens the store,
//! wires the services and binds the listener; `run_until_stopped(shutdown)` serves until
//! the token is cancelled, then drains (HTTP first, then in-flight attempts) and releases
//! what it holds. Tests start the real server this way on port 0.

use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{self, AdminToken, ApiSettings, AppState, Limits};
use crate::catalog::Catalog;
use crate::config::Config;
use crate::deliver::{Deliverer, DelivererConfig};
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::endpoint_settings::Defaults;
use crate::housekeeping;
use crate::ids::random_token;
use crate::ingest::Ingestor;
use crate::ssrf::Guard;
use crate::store::Store;
use crate::store::sqlite::SqliteStore;

/// Attempts in flight per application (the fairness cap).
const APP_MAX_IN_FLIGHT: u32 = 16;
/// How often housekeeping runs.
const HOUSEKEEPING_EVERY: std::time::Duration = std::time::Duration::from_secs(600);
/// Room for the JSON around a maximal payload.
const BODY_OVERHEAD_BYTES: usize = 64 * 1024;

pub struct Server {
    listener: TcpListener,
    router: axum::Router,
    dispatcher: Arc<Dispatcher>,
    store: Arc<dyn Store>,
    idempotency_ttl: std::time::Duration,
    /// Held for the life of the process: a second Herald on the same data directory fails.
    _lock: File,
}

impl Server {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let data_dir = &config.server.data_dir;
        std::fs::create_dir_all(data_dir).with_context(|| format!("creating data directory {}", data_dir.display()))?;
        let lock = lock_data_dir(data_dir)?;
        let admin_token = admin_token(&config, data_dir)?;

        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data_dir.join("herald.db"), &config.store)?);
        // Only this process can open the database, so every claim left in it belongs to a
        // process that is gone.
        let reclaimed = store.release_all().await?;
        if reclaimed > 0 {
            tracing::info!(reclaimed, "took back deliveries held by a previous process");
        }

        let guard = Arc::new(Guard::new(config.delivery.allowed_networks.clone()));
        let defaults = Defaults { timeout: config.delivery.timeout, retry: config.delivery.default_retry.clone() };
        let catalog = Arc::new(Catalog::new(store.clone(), defaults));
        let deliverer = Deliverer::new(
            guard.clone(),
            DelivererConfig {
                read_limit: config.delivery.response_read_limit,
                store_limit: config.delivery.response_store_limit,
                user_agent: config.delivery.user_agent.clone(),
            },
        );
        let owner = format!("node-{}", random_token(12));
        let dispatcher = Dispatcher::new(
            owner,
            store.clone(),
            catalog.clone(),
            deliverer,
            DispatchConfig {
                queue: config.queue.clone(),
                max_in_flight: config.delivery.max_in_flight,
                app_max_in_flight: APP_MAX_IN_FLIGHT,
            },
        );
        let ingestor = Arc::new(Ingestor::new(store.clone(), catalog.clone(), dispatcher.clone()));

        let listener = TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("binding {}", config.server.listen))?;
        let local = listener.local_addr()?;
        let state = AppState {
            store: store.clone(),
            catalog,
            ingestor,
            dispatcher: dispatcher.clone(),
            guard,
            admin: Arc::new(AdminToken::new(&admin_token)),
            limits: Limits {
                body_bytes: config.server.max_payload_bytes + BODY_OVERHEAD_BYTES,
                max_payload_bytes: config.server.max_payload_bytes,
            },
            settings: Arc::new(ApiSettings {
                public_url: config.server.public_url.clone().unwrap_or_else(|| format!("http://{local}")),
                portal_token_ttl: config.auth.portal_token_ttl,
                secret_rotation_overlap: config.delivery.secret_rotation_overlap,
            }),
            key_locks: Default::default(),
        };
        Ok(Self {
            listener,
            router: api::router(state),
            dispatcher,
            store,
            idempotency_ttl: config.server.idempotency_ttl,
            _lock: lock,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Serves until `shutdown` is cancelled, then stops taking requests, lets in-flight
    /// attempts finish within the grace period, and gives back every held delivery.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(addr = %self.local_addr(), "Herald is listening");
        let stop_dispatch = CancellationToken::new();
        let dispatcher = tokio::spawn(self.dispatcher.clone().run(stop_dispatch.clone()));
        let upkeep =
            housekeeping::run(self.store.clone(), self.idempotency_ttl, HOUSEKEEPING_EVERY, stop_dispatch.clone());
        tokio::spawn(upkeep);
        let served = axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .context("serving HTTP");
        stop_dispatch.cancel();
        dispatcher.await.context("the dispatcher task failed")?;
        served
    }
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
    let path = data_dir.join("admin-token");
    if path.exists() {
        let token = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        return Ok(token.trim().to_owned());
    }
    let token = format!("hrld_{}", random_token(32));
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&path).with_context(|| format!("creating {}", path.display()))?;
    writeln!(file, "{token}")?;
    println!("Generated an admin token (stored in {}, shown only this once):\n\n    {token}\n", path.display());
    Ok(token)
}
