//! The embedded SQLite backend: WAL with `synchronous=FULL`, one writer thread doing group
//! commit ([`writer`]), a small pool of read-only connections for API queries
//! ([`readers`]). Queries are grouped by domain in the sibling files.

mod access;
mod catalog;
mod health;
mod history;
mod messages;
mod queue;
mod readers;
mod rows;
mod writer;

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use rusqlite::{Connection, OpenFlags};

use crate::config::StoreConfig;
use crate::store::{Signals, Store, StoreError};
use crate::supervisor::Liveness;
use readers::Readers;
use writer::{Batching, Writer};

/// (version, SQL) in order; `PRAGMA user_version` records the last one applied.
const MIGRATIONS: &[(i64, &str)] =
    &[(1, include_str!("v1.sql")), (2, include_str!("v2.sql")), (3, include_str!("v3.sql"))];
const STATEMENT_CACHE: usize = 256;

pub struct SqliteStore {
    writer: Writer,
    readers: Readers,
    signals: Signals,
}

impl Store for SqliteStore {
    fn signals(&self) -> &Signals {
        &self.signals
    }

    /// The data directory is locked to one process.
    fn shared(&self) -> bool {
        false
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date;
    /// a panic of its writer thread fails the process (`liveness`).
    pub fn open(path: &Path, config: &StoreConfig, liveness: &Arc<Liveness>) -> anyhow::Result<Self> {
        let conn = Connection::open(path).with_context(|| format!("opening {}", path.display()))?;
        // Page caches: the hot pages (right edges, the tenants' index leaves) fit many times
        // over; larger caches only filled with a backlog's pages (RSS 165 MB instead of 130
        // with 1,000,000 pending).
        conn.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = FULL;
             PRAGMA foreign_keys = ON;
             PRAGMA busy_timeout = 10000;
             PRAGMA temp_store = MEMORY;
             PRAGMA cache_size = -32768;
             PRAGMA wal_autocheckpoint = 0;
             PRAGMA journal_size_limit = 67108864;",
        )?;
        // Enough cached statements that none is ever re-prepared on the hot path.
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        migrate(&conn)?;
        let mut readers = Vec::with_capacity(config.read_connections);
        for _ in 0..config.read_connections {
            let reader = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI,
            )?;
            reader.execute_batch("PRAGMA busy_timeout = 10000; PRAGMA cache_size = -8192;")?;
            reader.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
            readers.push(reader);
        }
        let batching = Batching {
            max_ops: config.write_batch_max,
            commit_interval: config.commit_interval,
            checkpoint_interval: config.checkpoint_interval,
        };
        let writer = Writer::start(conn, batching, liveness);
        Ok(Self { writer, readers: Readers::new(readers), signals: Signals::default() })
    }
}

/// Brings the schema up to date, each version in its own transaction.
fn migrate(conn: &Connection) -> anyhow::Result<()> {
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let newest = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    if version > newest {
        anyhow::bail!("the database has schema version {version}; this Herald knows up to {newest}");
    }
    for (v, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > version) {
        conn.execute_batch(&format!("BEGIN; {sql}; PRAGMA user_version = {v}; COMMIT;"))
            .with_context(|| format!("applying schema version {v}"))?;
        if version > 0 {
            tracing::info!(version = v, "applied database migration");
        }
    }
    Ok(())
}

/// Maps SQLite failures: resource problems (disk full, I/O, locks) are `Unavailable`, so
/// the API answers 503 instead of pretending the request was wrong.
fn map_err(e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode::*;
    match e.sqlite_error_code() {
        Some(DiskFull) => StoreError::Unavailable("the disk holding the database is full".into()),
        Some(SystemIoFailure | DatabaseBusy | DatabaseLocked | CannotOpen | ReadOnly | OutOfMemory) => {
            StoreError::Unavailable(e.to_string())
        }
        _ => StoreError::Other(e.into()),
    }
}

/// Whether an error is a uniqueness violation.
fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _)
            if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    )
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        map_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::{AccessStore, CatalogStore};

    /// A fresh database in a temporary directory, removed when the fixture drops.
    struct Fixture {
        store: SqliteStore,
        _dir: tempfile::TempDir,
    }

    impl Fixture {
        async fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let store =
                SqliteStore::open(&dir.path().join("herald.db"), &Config::defaults().store, &Arc::default()).unwrap();
            Self { store, _dir: dir }
        }

        fn store(&self) -> &dyn Store {
            &self.store
        }
    }

    crate::conformance_suite!(Fixture::new());

    /// A database of schema version 1 (an earlier Herald) is brought to the latest version
    /// at open, keeping its rows; its plaintext endpoint headers read until they are sealed.
    #[tokio::test]
    async fn a_version_1_database_is_migrated_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.db");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(&format!("BEGIN; {}; PRAGMA user_version = 1; COMMIT;", MIGRATIONS[0].1)).unwrap();
        old.execute_batch(
            "INSERT INTO app VALUES ('app_1', NULL, 'old', '{}', NULL, NULL, NULL, 1, 1);
             INSERT INTO endpoint VALUES ('ep_1', 'app_1', NULL, 'https://example.com/', '', 0, NULL, NULL, '{}',
                 NULL, '{\"x-old\":\"1\"}', 'v1.k.s', '{}', NULL, 1, 1);
             INSERT INTO delivery (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict,
                 created_at) VALUES ('msg_1', 'ep_1', 'app_1', 0, 0, 1, 0, 'someone', 0, 1);",
        )
        .unwrap();
        drop(old);
        let store = SqliteStore::open(&path, &Config::defaults().store, &Arc::default()).unwrap();
        let endpoint = store.endpoint_by_id(&crate::ids::EndpointId::from_trusted("ep_1".into())).await.unwrap();
        let headers = endpoint.unwrap().headers;
        assert!(headers.is_plaintext() && headers.0.contains("x-old"), "{headers:?}");
        assert!(store.list_sessions(None).await.unwrap().is_empty(), "the session table exists");
        let app = store.app("app_1").await.unwrap().expect("the application is kept");
        assert_eq!((app.name.as_str(), app.portal_brand), ("old", None), "version 3 adds the brand column");
        drop(store);
        let reopened = Connection::open(&path).unwrap();
        let version: i64 = reopened.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        let resend: i64 = reopened.query_row("SELECT resend FROM delivery", [], |r| r.get(0)).unwrap();
        assert_eq!((version, resend), (MIGRATIONS.len() as i64, 0));
    }

    #[tokio::test]
    async fn reopening_keeps_the_schema_and_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.db");
        let config = Config::defaults().store;
        let app = crate::store::App {
            id: crate::ids::AppId::generate(),
            uid: Some("kept".into()),
            name: "kept".into(),
            metadata: Default::default(),
            throttle_rate: None,
            max_concurrency: Some(4),
            weight: Some(3),
            portal_brand: None,
            created_at: 1,
            updated_at: 1,
        };
        SqliteStore::open(&path, &config, &Arc::default()).unwrap().insert_app(&app).await.unwrap();
        let reopened = SqliteStore::open(&path, &config, &Arc::default()).unwrap();
        assert_eq!(reopened.app("kept").await.unwrap(), Some(app));
    }
}
