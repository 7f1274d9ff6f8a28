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
    /// Whether Herald's own ingests store large payloads packed (`store.pack_payloads`);
    /// `herald.send_message` always stores text.
    pub pack_payloads: bool,
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
            pack_payloads: true,
            probe_interval: None,
        }
    }
}

pub struct PgStore {
    pool: Pool,
    ingest: ingest::Batcher,
    /// Whether new payloads are stored packed (`store.pack_payloads`).
    pack_payloads: bool,
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
        Ok(Self { pool, ingest, pack_payloads: options.pack_payloads, signals, liveness: liveness.clone() })
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

    /// Herald's own ingests store a large payload packed, on both ingest statements (with
    /// and without an idempotency key), and a small one as text; a process with
    /// `store.pack_payloads` off stores text; `herald.send_message` stores text; and every
    /// process reads every form back.
    #[tokio::test]
    async fn large_payloads_are_stored_packed_and_every_form_reads_back() {
        use crate::store::conformance;
        use crate::store::{CatalogStore, IdempotencyRecord, Message, MessageStore, NewMessage, StoredResponse};
        let cluster = TempCluster::start().expect("starting a throwaway PostgreSQL");
        let url = cluster.create_database().await.unwrap();
        let packing = PgStore::connect(&url, &PgOptions::for_tests(2, 8), &Arc::default()).await.unwrap();
        let options = PgOptions { pack_payloads: false, ..PgOptions::for_tests(2, 8) };
        let plain = PgStore::connect(&url, &options, &Arc::default()).await.unwrap();
        let app = conformance::app();
        packing.insert_app(&app).await.unwrap();
        let event = format!(r#"{{"lines":[{}]}}"#, vec![r#"{"sku":"SKU-1","qty":1}"#; 60].join(","));
        let small = r#"{"small":true}"#.to_owned();
        let key = |key: &str| IdempotencyRecord {
            scope: app.id.to_string(),
            key: key.to_owned(),
            response: StoredResponse { status: 202, body: String::new(), created_at: 1 },
        };
        let cases = [
            (&packing, &event, None, "packed"),
            (&packing, &small, None, "text"),
            (&packing, &event, Some(key("k1")), "packed"),
            (&packing, &small, Some(key("k2")), "text"),
            (&plain, &event, None, "text"),
            (&plain, &event, Some(key("k3")), "text"),
        ];
        let mut expected = Vec::new();
        for (store, payload, idempotency, form) in cases {
            let message = Message { payload: Some(payload.as_str().into()), ..conformance::message(&app, None) };
            expected.push((message.id.to_string(), payload.clone(), form));
            let new = NewMessage { message, deliveries: vec![], owner: None, idempotency };
            store.ingest(new).await.unwrap();
        }
        let db = packing.client().await.unwrap();
        db.execute(
            "SELECT herald.send_message(app => $1, event_type => 'e', payload => $2::text::jsonb)",
            &[&app.id.as_str(), &event],
        )
        .await
        .unwrap();
        let outbox: String =
            db.query_one("SELECT id FROM herald.message WHERE event_type = 'e'", &[]).await.unwrap().get(0);
        // The outbox stores the payload as jsonb's text, which need not be the bytes sent.
        let outbox_text: String = db.query_one("SELECT $1::text::jsonb::text", &[&event]).await.unwrap().get(0);
        expected.push((outbox, outbox_text, "text"));
        for (id, payload, form) in &expected {
            let row = db.query_one("SELECT payload, packed FROM herald.message WHERE id = $1", &[id]).await.unwrap();
            let (text, packed): (Option<String>, Option<Vec<u8>>) = (row.get(0), row.get(1));
            match *form {
                "packed" => assert!(
                    text.is_none() && packed.as_ref().is_some_and(|p| p.len() < payload.len() / 4),
                    "{id}: {text:?} {packed:?}"
                ),
                _ => assert_eq!((text.as_deref(), packed), (Some(payload.as_str()), None), "{id}"),
            }
            for store in [&packing, &plain] {
                let read = store.message(&app.id, id).await.unwrap().expect("kept");
                assert_eq!(read.payload.as_deref(), Some(payload.as_str()), "{id} read back");
            }
        }
    }

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
