//! Assembling Herald from its configuration: `Server::build(config)` opens the store,
//! wires the services and binds the listener; `run_until_stopped(shutdown)` serves until
//! the token is cancelled, then drains (HTTP first, then in-flight attempts) and releases
//! what it holds. Tests start the real server this way on port 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::alerts::{Alerts, Sender};
use crate::api::{self, AdminToken, ApiSettings, AppState, Limits, RateLimiter, Services};
use crate::catalog::Catalog;
use crate::config::{Config, Role};
use crate::data_dir::DataDir;
use crate::deliver::{Deliverer, DelivererConfig};
use crate::dispatch::{DispatchConfig, Dispatcher};
use crate::endpoint_settings::Defaults;
use crate::history::Recorder;
use crate::housekeeping;
use crate::ids::random_token;
use crate::ingest::Ingestor;
use crate::metrics::Metrics;
use crate::redaction::Redactor;
use crate::scripts::Sandbox;
use crate::sealing::{Keyring, generate_key};
use crate::signing::SigningKey;
use crate::ssrf::Guard;
use crate::store::Store;
use crate::store::postgres::{PgOptions, PgStore};
use crate::store::sqlite::SqliteStore;
use crate::supervisor::{Liveness, StopDeadline, spawn_loop, spawn_task};
use crate::telemetry::Traces;

/// How often housekeeping runs.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(600);
/// Room for the JSON around a maximal payload.
const BODY_OVERHEAD_BYTES: usize = 64 * 1024;

pub struct Server {
    listener: TcpListener,
    router: axum::Router,
    dispatcher: Arc<Dispatcher>,
    history: Arc<Recorder>,
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    alerts: Arc<Alerts>,
    /// Flushed last, once nothing makes spans any more.
    traces: Traces,
    config: Config,
    /// Failed once any supervised task fails; the process then stops.
    liveness: Arc<Liveness>,
    /// When a stop must be over, from the moment it begins.
    deadline: StopDeadline,
    /// Held for the life of the process (SQLite): a second Herald on the same data
    /// directory fails at once.
    _data_dir: Option<DataDir>,
}

impl Server {
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let liveness = Arc::new(Liveness::default());
        let (store, data_dir, admin_token) = open_store(&config, &liveness).await?;
        let keyring = Arc::new(keyring(&config, data_dir.as_ref())?);
        let listener = TcpListener::bind(config.server.listen)
            .await
            .with_context(|| format!("binding {}", config.server.listen))?;
        let local = listener.local_addr()?;
        let public_host =
            config.server.public_url.as_deref().and_then(|u| url::Url::parse(u).ok()?.host_str().map(str::to_owned));
        let guard = Arc::new(
            Guard::new(config.delivery.allowed_networks.clone())
                .with_any_port(config.delivery.any_port)
                .with_own(local, public_host),
        );
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
                proxy: config.delivery.proxy.clone(),
            },
        );
        let metrics = Arc::new(Metrics::default());
        let worker_program = match &config.scripts.worker_program {
            Some(program) => program.clone(),
            None => std::env::current_exe().context("finding the herald executable for the jq sandbox")?,
        };
        // A transform's output is a whole request: at most what Herald would accept.
        let max_output = config.server.max_payload_bytes + BODY_OVERHEAD_BYTES;
        let sandbox = Arc::new(Sandbox::new(worker_program, config.scripts.clone(), max_output));
        let database = if config.store.database_url.is_some() { "postgresql" } else { "sqlite" };
        let traces = Traces::start(&config.otel, database).context("starting the OpenTelemetry exporter")?;
        let dispatcher = Dispatcher::new(
            store.clone(),
            catalog.clone(),
            deliverer,
            sandbox.clone(),
            DispatchConfig {
                owner: format!("node-{}", random_token(12)),
                queue: config.queue.clone(),
                lease: config.queue.lease,
                max_in_flight: config.delivery.max_in_flight,
                faults: config.faults.clone(),
                traces: traces.clone(),
            },
            metrics.clone(),
            liveness.clone(),
        );
        // An API-only process never claims: what it accepts is left for the workers.
        let delivers = config.server.role != Role::Api;
        let history = Arc::new(Recorder::default());
        let ingestor = Arc::new(Ingestor::new(
            store.clone(),
            catalog.clone(),
            dispatcher.clone(),
            delivers,
            history.clone(),
            sandbox.clone(),
            traces.clone(),
        ));

        let state = AppState::new(Services {
            store: store.clone(),
            catalog: catalog.clone(),
            ingestor,
            sandbox,
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
                user_agent: config.delivery.user_agent.clone(),
                portal: config.portal.clone(),
                tenants: config.tenants,
            }),
            key_locks: Default::default(),
            rate_limiter: Arc::new(RateLimiter::new(
                config.auth.portal_requests_per_second,
                config.auth.admin_requests_per_second,
                config.auth.failed_auth_per_minute,
            )),
            redactor: Arc::new(Redactor::new(config.redaction.fields.clone(), &config.redaction.keys)),
            long_polls: Arc::new(crate::api::WaitingPolls::new(config.tenants)),
            replays: Default::default(),
            liveness: liveness.clone(),
            traces: traces.clone(),
        });
        let router = match config.server.role {
            Role::Worker => api::health_router(state),
            Role::All | Role::Api => crate::web::router(state),
        };
        let alerts = Arc::new(Alerts::new(
            config.alerts.settings.clone(),
            store.clone(),
            catalog.clone(),
            dispatcher.clone(),
            metrics,
            alert_sender(&config, &liveness)?,
        ));
        Ok(Self {
            listener,
            router,
            dispatcher,
            history,
            store,
            catalog,
            alerts,
            traces,
            config,
            liveness,
            deadline: StopDeadline::default(),
            _data_dir: data_dir,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// When the stop must be over, once it has begun: what is left of it bounds whatever
    /// the caller still does to exit (the runtime's shutdown).
    pub fn stop_deadline(&self) -> StopDeadline {
        self.deadline.clone()
    }

    /// Starts every background task, supervised, until `stop`; returns the dispatcher's
    /// (the one whose end matters), if this process delivers.
    fn start_background(&self, stop: &CancellationToken) -> Option<JoinHandle<()>> {
        let live = &self.liveness;
        let delivers = self.config.server.role != Role::Api;
        let dispatcher = delivers.then(|| {
            spawn_loop(
                live,
                "the dispatcher",
                stop.clone(),
                self.dispatcher.clone().run(stop.clone(), self.deadline.clone()),
            )
        });
        if !delivers {
            spawn_loop(live, "the lanes' owner", stop.clone(), self.dispatcher.clone().run_idle(stop.clone()));
        }
        let follow = self.catalog.clone().follow(self.store.signals().catalog.subscribe(), stop.clone());
        spawn_loop(live, "the catalog follower", stop.clone(), follow);
        if delivers {
            let resume = self.dispatcher.clone().follow(self.store.signals().catalog.subscribe(), stop.clone());
            spawn_loop(live, "the breaker follower", stop.clone(), resume);
        }
        let history = self.history.clone().run(self.store.clone(), stop.clone());
        spawn_loop(live, "the history recorder", stop.clone(), history);
        spawn_task(live, "the start-up reseal", reseal(self.catalog.clone()));
        if delivers {
            spawn_loop(live, "the alert evaluator", stop.clone(), self.alerts.clone().run(stop.clone()));
        }
        let ttl = self.config.server.idempotency_ttl;
        let upkeep = housekeeping::run(self.store.clone(), ttl, HOUSEKEEPING_EVERY, stop.clone());
        spawn_loop(live, "housekeeping", stop.clone(), upkeep);
        let retention = housekeeping::retention(self.store.clone(), self.config.retention.clone(), stop.clone());
        spawn_loop(live, "the retention purge", stop.clone(), retention);
        dispatcher
    }

    /// Serves until `shutdown` is cancelled, then stops taking requests, lets in-flight
    /// attempts finish within the grace period, and gives back every held delivery. If a
    /// supervised task fails first, the health check answers 503 at once, the background
    /// work stops the same way (HTTP last, so the failure stays visible meanwhile), and the
    /// result is an error, so the process exits non-zero.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        tracing::info!(addr = %self.local_addr(), role = ?self.config.server.role, "Herald is listening");
        let live = self.liveness.clone();
        let stop = CancellationToken::new();
        let dispatcher = self.start_background(&stop);
        let stop_http = CancellationToken::new();
        let serving = crate::serving::serve(self.listener, self.router, self.config.http.clone(), stop_http.clone());
        let served = spawn_task(&live, "the HTTP server", serving);
        let failure = tokio::select! {
            _ = shutdown.cancelled() => None,
            reason = live.failed() => Some(reason),
        };
        // A requested stop ends within the grace period: HTTP first (requests take
        // milliseconds), then the attempts in flight (see `Dispatcher::run`), both by one
        // deadline. After a failure HTTP stops last, so that the health check says 503
        // meanwhile.
        let deadline = self.deadline.start(self.config.queue.shutdown_grace);
        let served = async move {
            stop_http.cancel();
            match tokio::time::timeout_at(deadline, served).await {
                Ok(served) => served.context("the HTTP server task"),
                Err(_) => {
                    tracing::warn!("HTTP requests still open at the end of the grace period; closing them");
                    Ok(())
                }
            }
        };
        let background = async move {
            stop.cancel();
            if let Some(dispatcher) = dispatcher {
                let _ = dispatcher.await;
            }
        };
        let traces = self.traces.clone();
        // Each step's end, in milliseconds from the stop, is logged: an exit slower than
        // the grace period then shows where the time went.
        let stopping = std::time::Instant::now();
        let since = move || stopping.elapsed().as_millis() as u64;
        let (served, http_ms, background_ms) = if failure.is_none() {
            let served = served.await;
            let http_ms = since();
            background.await;
            (served, http_ms, since())
        } else {
            background.await;
            let background_ms = since();
            (served.await, since(), background_ms)
        };
        if tokio::time::timeout_at(deadline, traces.shutdown()).await.is_err() {
            tracing::warn!("the last traces were still being exported at the end of the grace period; dropped");
        }
        tracing::info!(http_ms, background_ms, traces_ms = since(), "stopped; exiting");
        match live.failure() {
            Some(reason) => Err(anyhow::anyhow!("stopped after a failure: {reason}")),
            None => served,
        }
    }
}

/// Where operational webhooks go, if anywhere (the configuration checked the pair).
fn alert_sender(config: &Config, liveness: &Arc<Liveness>) -> anyhow::Result<Option<Sender>> {
    let (Some(url), Some(secret)) = (&config.alerts.webhook_url, &config.alerts.webhook_secret) else {
        return Ok(None);
    };
    let key = SigningKey::decode(secret).map_err(|e| anyhow::anyhow!("alerts.webhook_secret: {e}"))?;
    Ok(Some(Sender::new(url.parse().context("alerts.webhook_url")?, key, liveness.clone())))
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

/// Opens the configured store; returns it with the data directory (SQLite) and the admin
/// token.
async fn open_store(
    config: &Config,
    liveness: &Arc<Liveness>,
) -> anyhow::Result<(Arc<dyn Store>, Option<DataDir>, String)> {
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
            pack_payloads: config.store.pack_payloads,
            // An API-only process claims nothing: nothing to probe for.
            probe_interval: config.queue.probe_interval.filter(|_| config.server.role != Role::Api),
        };
        let store: Arc<dyn Store> = Arc::new(PgStore::connect(url, &options, liveness).await?);
        return Ok((store, None, token));
    }
    let data_dir = DataDir::open(&config.server.data_dir)?;
    let token = admin_token(config, &data_dir)?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&data_dir.database(), &config.store, liveness)?);
    // Only this process can open the database, so every claim left in it belongs to a
    // process that is gone.
    let reclaimed = store.release_all().await?;
    if reclaimed > 0 {
        tracing::info!(reclaimed, "took back deliveries held by a previous process");
    }
    Ok((store, Some(data_dir), token))
}

/// The configured admin token, or the one generated into the data directory on first start
/// (mode 0600, printed once).
fn admin_token(config: &Config, data_dir: &DataDir) -> anyhow::Result<String> {
    if let Some(token) = &config.auth.admin_token {
        return Ok(token.clone());
    }
    let (token, generated) = data_dir.secret("admin-token", || format!("hrld_{}", random_token(32)))?;
    if generated {
        let path = data_dir.path().join("admin-token");
        println!("Generated an admin token (stored in {}, shown only this once):\n\n    {token}\n", path.display());
    }
    Ok(token)
}

/// The server key that seals secrets at rest: configured, or (SQLite only) generated into
/// the data directory on first start.
fn keyring(config: &Config, data_dir: Option<&DataDir>) -> anyhow::Result<Keyring> {
    let current = match (&config.auth.secret_key, data_dir) {
        (Some(key), _) => key.clone(),
        (None, None) => bail!(
            "HERALD_SECRET_KEY is required with PostgreSQL: every process sharing the database must seal endpoint \
             secrets with the same key (generate one with `openssl rand -base64 32`)"
        ),
        (None, Some(data_dir)) => {
            let (key, generated) = data_dir.secret("secret-key", generate_key)?;
            if generated {
                let path = data_dir.path().join("secret-key");
                tracing::info!(path = %path.display(), "generated the server key that seals endpoint secrets");
            }
            key
        }
    };
    Keyring::new(&current, &config.auth.previous_secret_keys).context("auth.secret_key / HERALD_SECRET_KEY")
}
