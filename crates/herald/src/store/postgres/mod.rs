//! The PostgreSQL backend: any number of Herald processes, on any number of machines, share
//! one database. Work is claimed with `FOR UPDATE SKIP LOCKED` under node leases
//! (`herald.node`), ingests are group-committed in multi-row statements ([`ingest`]),
//! processes wake each other and invalidate each other's caches with LISTEN/NOTIFY
//! ([`listen`]), and producers can enqueue from their own transactions with
//! `herald.send_message(…)` (the transactional outbox, in `v1.sql`).

mod access;
mod catalog;
mod health;
mod held;
mod history;
mod ingest;
mod listen;
mod messages;
mod migrate;
mod pollers;
mod probe;
mod queue;
#[cfg(test)]
mod races;
mod rows;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use crate::store::{Signals, Store, StoreError};
use crate::supervisor::Liveness;

pub use migrate::{LATEST as SCHEMA_VERSION, migrate};

/// How the PostgreSQL store connects and batches.
#[derive(Debug, Clone)]
pub struct PgOptions {
    pub pool_size: usize,
    /// How long a request waits for a connection before answering 503.
    pub connect_timeout: Duration,
    pub ingest_batch_max: usize,
    pub ingest_linger: Duration,
    /// Written to `herald.setting` for `herald.send_message`.
    pub max_payload_bytes: usize,
    /// How often the database is asked whether claimable work waits (outbox messages, due
    /// retries); `None`: never (the loader's poll only).
    pub probe_interval: Option<Duration>,
}

#[cfg(test)]
impl PgOptions {
    /// Options for a test's store: a pool of `pool_size`, batches of at most
    /// `ingest_batch_max` ingests, no probe.
    fn for_tests(pool_size: usize, ingest_batch_max: usize) -> Self {
        PgOptions {
            pool_size,
            connect_timeout: Duration::from_secs(5),
            ingest_batch_max,
            ingest_linger: Duration::from_millis(1),
            max_payload_bytes: 262_144,
            probe_interval: None,
        }
    }
}

pub struct PgStore {
    pool: Pool,
    ingest: ingest::Batcher,
    signals: Signals,
    /// Fails the process when a task the store spawned panics.
    liveness: Arc<Liveness>,
}

impl Store for PgStore {
    fn signals(&self) -> &Signals {
        &self.signals
    }

    fn shared(&self) -> bool {
        true
    }
}

impl PgStore {
    /// Connects (waiting for the database to come up), applies migrations and starts the
    /// notification listener.
    /// Connects, migrates, and starts the notification listener and the ingest batcher
    /// (their failure fails the process: `liveness`).
    pub async fn connect(url: &str, options: &PgOptions, liveness: &Arc<Liveness>) -> anyhow::Result<Self> {
        let config: tokio_postgres::Config = url.parse().context("parsing the database URL")?;
        let manager =
            Manager::from_config(config.clone(), NoTls, ManagerConfig { recycling_method: RecyclingMethod::Verified });
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(options.connect_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.connect_timeout))
            .build()
            .context("building the connection pool")?;
        wait_for_database(&pool).await?;
        migrate(&pool).await?;
        let client = pool.get().await?;
        client
            .execute(
                "INSERT INTO herald.setting (name, value) VALUES ('max_payload_bytes', $1)
                 ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                &[&options.max_payload_bytes.to_string()],
            )
            .await?;
        let signals = Signals::default();
        listen::start(config, signals.clone(), liveness);
        if let Some(every) = options.probe_interval {
            probe::start(pool.clone(), signals.clone(), every, liveness);
        }
        let ingest = ingest::Batcher::start(pool.clone(), options.ingest_batch_max, options.ingest_linger, liveness);
        Ok(Self { pool, ingest, signals, liveness: liveness.clone() })
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_err)
    }
}

/// `herald migrate`: applies the migrations to the database at `url`.
pub async fn migrate_url(url: &str) -> anyhow::Result<()> {
    let config: tokio_postgres::Config = url.parse().context("parsing the database URL")?;
    let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager).max_size(1).runtime(Runtime::Tokio1).build()?;
    wait_for_database(&pool).await?;
    migrate(&pool).await
}

/// Waits up to a minute for the database to accept connections (containers and services
/// often start together).
async fn wait_for_database(pool: &Pool) -> anyhow::Result<()> {
    let mut delay = Duration::from_millis(100);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        match pool.get().await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "waiting for PostgreSQL");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e).context("connecting to PostgreSQL"),
        }
    }
}

fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    StoreError::Unavailable(format!("no database connection: {e}"))
}

/// Maps database errors: connection and availability problems are `Unavailable` (503),
/// uniqueness violations `Conflict` with the given message, the rest internal.
fn pg_err(conflict: &'static str) -> impl Fn(tokio_postgres::Error) -> StoreError {
    move |e| {
        let Some(db) = e.as_db_error() else {
            return StoreError::Unavailable(e.to_string());
        };
        let code = db.code();
        if *code == SqlState::UNIQUE_VIOLATION {
            StoreError::Conflict(conflict)
        } else if code.code().starts_with("08")
            || code.code().starts_with("57")
            || code.code().starts_with("53")
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
            || *code == SqlState::T_R_DEADLOCK_DETECTED
        {
            StoreError::Unavailable(db.message().to_owned())
        } else {
            StoreError::Other(anyhow::anyhow!("database error: {e}"))
        }
    }
}

/// The usual mapping, for statements that cannot violate a uniqueness rule.
fn db_err(e: tokio_postgres::Error) -> StoreError {
    pg_err("a uniqueness rule was violated")(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use herald_test_support::pg_cluster::TempCluster;

    /// A fresh database on a throwaway cluster, removed when the fixture drops.
    struct Fixture {
        store: PgStore,
        _cluster: TempCluster,
    }

    impl Fixture {
        async fn new() -> Self {
            let cluster = TempCluster::start().expect("starting a throwaway PostgreSQL");
            let url = cluster.create_database().await.unwrap();
            let liveness = Arc::default();
            let store = PgStore::connect(&url, &PgOptions::for_tests(4, 64), &liveness).await.unwrap();
            Self { store, _cluster: cluster }
        }

        fn store(&self) -> &dyn Store {
            &self.store
        }
    }

    crate::conformance_suite!(Fixture::new());

    /// A database of schema version 1 (an earlier Herald) is brought to the latest version
    /// at connect, keeping its rows: headers become text (read as plaintext until sealed).
    #[tokio::test]
    async fn a_version_1_database_is_migrated_in_place() {
        use crate::store::{AccessStore, CatalogStore};
        let cluster = TempCluster::start().expect("starting a throwaway PostgreSQL");
        let url = cluster.create_database().await.unwrap();
        let db = herald_test_support::pg_cluster::connect(&url, Duration::from_secs(30)).await.unwrap();
        db.batch_execute(
            "CREATE SCHEMA herald;
             CREATE TABLE herald.schema_migrations (version integer PRIMARY KEY,
                                                    applied_at timestamptz NOT NULL DEFAULT now());",
        )
        .await
        .unwrap();
        db.batch_execute(include_str!("v1.sql")).await.unwrap();
        db.batch_execute(
            "INSERT INTO herald.schema_migrations (version) VALUES (1);
             INSERT INTO herald.app VALUES ('app_1', NULL, 'old', '{}', NULL, NULL, NULL, 1, 1);
             INSERT INTO herald.endpoint VALUES ('ep_1', 'app_1', NULL, 'https://example.com/', '', false, NULL,
                 NULL, '{}', NULL, '{\"x-old\": \"1\"}', 'v1.k.s', '{}', NULL, 1, 1);
             INSERT INTO herald.delivery (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner,
                 strict, created_at) VALUES ('msg_1', 'ep_1', 'app_1', 0, 0, 1, 0, NULL, false, 1);",
        )
        .await
        .unwrap();
        let store = PgStore::connect(&url, &PgOptions::for_tests(2, 8), &Arc::default()).await.unwrap();
        let endpoint = store.endpoint_by_id(&crate::ids::EndpointId::from_trusted("ep_1".into())).await.unwrap();
        let headers = endpoint.unwrap().headers;
        assert!(headers.is_plaintext() && headers.0.contains("x-old"), "{headers:?}");
        assert!(store.list_sessions(None).await.unwrap().is_empty(), "the session table exists");
        let resend: bool = db.query_one("SELECT resend FROM herald.delivery", &[]).await.unwrap().get(0);
        let versions: Vec<i32> = db
            .query("SELECT version FROM herald.schema_migrations ORDER BY version", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!((resend, versions), (false, (1..=SCHEMA_VERSION).collect::<Vec<_>>()));
    }
}
