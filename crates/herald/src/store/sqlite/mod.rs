//! The embedded SQLite backend: WAL with `synchronous=FULL`, one writer thread doing group
//! commit ([`writer`]), a small pool of read-only connections for API queries
//! ([`readers`]). Queries are grouped by domain in the sibling files.

mod access;
pub mod backup;
mod catalog;
mod checkpointer;
mod deliveries;
mod health;
mod history;
mod indexer;
pub mod keys;
mod messages;
mod pollers;
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
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("v1.sql")),
    (2, include_str!("v2.sql")),
    (3, include_str!("v3.sql")),
    (4, include_str!("v4.sql")),
    (5, include_str!("v5.sql")),
    (6, include_str!("v6.sql")),
    (7, include_str!("v7.sql")),
    (8, include_str!("v8.sql")),
    (9, include_str!("v9.sql")),
    (10, include_str!("v10.sql")),
    (11, include_str!("v11.sql")),
    (12, include_str!("v12.sql")),
    (13, include_str!("v13.sql")),
];
const STATEMENT_CACHE: usize = 256;

pub struct SqliteStore {
    writer: Writer,
    readers: Readers,
    signals: Signals,
    /// The next message and attempt seqs (assigned by the writer thread).
    seqs: Arc<messages::Seqs>,
    /// Whether new payloads are stored packed (`store.pack_payloads`).
    pack_payloads: bool,
    /// Where idempotency keys are found (used on the writer thread only).
    keys: keys::Keys,
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
        let seqs = Arc::new(messages::Seqs::load(&conn)?);
        let keys = keys::Keys::load(&conn, config.idempotency_run_keys)?;
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
        let batching = Batching { max_ops: config.write_batch_max, commit_interval: config.commit_interval };
        let checkpoints = checkpointer::start(path, config.checkpoint_interval, liveness)?;
        let writer = Writer::start(conn, batching, checkpoints, keys.clone(), liveness);
        Ok(Self {
            writer,
            readers: Readers::new(readers),
            signals: Signals::default(),
            seqs,
            pack_payloads: config.pack_payloads,
            keys,
        })
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

#[cfg(test)]
impl SqliteStore {
    /// Fills the index tables now (the writer does it between batches, every 100 ms).
    pub(crate) async fn index_now(&self) {
        self.writer.write(indexer::index).await.expect("indexing");
    }
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
    use crate::store::{AccessStore, CatalogStore, MessageStore};

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
             INSERT INTO message VALUES ('msg_1', 'app_1', 'order.paid', NULL, NULL, '{}', 1);
             INSERT INTO delivery (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict,
                 created_at) VALUES ('msg_1', 'ep_1', 'app_1', 0, 0, 1, 0, 'someone', 0, 1);
             INSERT INTO delivery (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict,
                 created_at) VALUES ('msg_gone', 'ep_1', 'app_1', 0, 0, 1, 0, NULL, 0, 1);
             INSERT INTO idempotency VALUES ('app_1', 'key-2', 'f', 202, '{\"b\":2}', 20);
             INSERT INTO idempotency VALUES ('app_1', 'key-1', 'f', 202, '{\"b\":1}', 10);",
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
        // Version 4: the message keeps its place in commit order, its delivery gets a row of
        // its own (a delivery whose message is gone could never be sent, and is dropped).
        let (seq, dests, delivery): (i64, String, i64) = reopened
            .query_row("SELECT m.seq, m.dests, d.id FROM message m JOIN delivery d ON d.msg_seq = m.seq", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!((dests.as_str(), delivery), ("[]", seq * 65_536 + 32_768));
        let left: i64 = reopened.query_row("SELECT count(*) FROM delivery", [], |r| r.get(0)).unwrap();
        assert_eq!(left, 1);
        // Version 5: idempotency records in creation order, still found by their key.
        let kept: Vec<(i64, String)> = reopened
            .prepare("SELECT seq, key FROM idempotency ORDER BY seq")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kept, [(1, "key-1".to_owned()), (2, "key-2".to_owned())]);
        drop(reopened);
        let store = SqliteStore::open(&path, &Config::defaults().store, &Arc::default()).unwrap();
        let stored = store.idempotent_response("app_1", "key-2").await.unwrap().expect("kept by its key");
        assert_eq!(stored.status, 202);
        // Version 11 packs new payloads; the ones written before stay text and read as such.
        let app = crate::ids::AppId::from_trusted("app_1".into());
        let message = store.message(&app, "msg_1").await.unwrap().expect("the message is kept");
        assert_eq!(message.payload.as_deref(), Some("{}"));
    }

    /// A large payload is written packed (and read back whole, see the conformance suite);
    /// a small one as text.
    #[tokio::test]
    async fn large_payloads_are_stored_packed_and_small_ones_as_text() {
        use crate::store::conformance;
        let fixture = Fixture::new().await;
        let store = fixture.store();
        let app = conformance::app();
        store.insert_app(&app).await.unwrap();
        let event = format!(r#"{{"lines":[{}]}}"#, vec![r#"{"sku":"SKU-1","qty":1}"#; 60].join(","));
        let payloads = [event.clone(), r#"{"small":true}"#.to_owned()];
        for payload in &payloads {
            let message =
                crate::store::Message { payload: Some(payload.as_str().into()), ..conformance::message(&app, None) };
            let new = crate::store::NewMessage { message, deliveries: vec![], owner: None, idempotency: None };
            store.ingest(new).await.unwrap();
        }
        let raw = Connection::open(fixture._dir.path().join("herald.db")).unwrap();
        let stored: Vec<(Option<String>, Option<Vec<u8>>)> = raw
            .prepare("SELECT payload, packed FROM message ORDER BY seq")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let (text, packed) = &stored[0];
        let packed = packed.as_ref().expect("the large payload is packed");
        assert!(text.is_none() && packed.len() < event.len() / 4, "{} bytes for {}", packed.len(), event.len());
        assert_eq!(stored[1], (Some(payloads[1].clone()), None), "a small payload stays text");
    }

    /// With `store.pack_payloads` off, every payload is stored as text, and the ones packed
    /// before still read back.
    #[tokio::test]
    async fn with_packing_off_payloads_are_stored_as_text_and_packed_ones_still_read() {
        use crate::store::conformance;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.db");
        let event = format!(r#"{{"lines":[{}]}}"#, vec![r#"{"sku":"SKU-1","qty":1}"#; 60].join(","));
        let app = conformance::app();
        let mut ids = Vec::new();
        for pack_payloads in [true, false] {
            let config = crate::config::StoreConfig { pack_payloads, ..Config::defaults().store };
            let store = SqliteStore::open(&path, &config, &Arc::default()).unwrap();
            if pack_payloads {
                store.insert_app(&app).await.unwrap();
            }
            let message =
                crate::store::Message { payload: Some(event.as_str().into()), ..conformance::message(&app, None) };
            ids.push(message.id.clone());
            let new = crate::store::NewMessage { message, deliveries: vec![], owner: None, idempotency: None };
            store.ingest(new).await.unwrap();
            for id in &ids {
                let read = store.message(&app.id, id.as_str()).await.unwrap().unwrap();
                assert_eq!(read.payload.as_deref(), Some(event.as_str()), "packing {pack_payloads}, {id:?}");
            }
        }
        let raw = Connection::open(&path).unwrap();
        let packed: Vec<bool> = raw
            .prepare("SELECT packed IS NOT NULL AND payload IS NULL FROM message ORDER BY seq")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(packed, [true, false]);
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
            proxy: None,
            created_at: 1,
            updated_at: 1,
        };
        SqliteStore::open(&path, &config, &Arc::default()).unwrap().insert_app(&app).await.unwrap();
        let reopened = SqliteStore::open(&path, &config, &Arc::default()).unwrap();
        assert_eq!(reopened.app("kept").await.unwrap(), Some(app));
    }

    /// Listings read the index tables up to their watermark and the rows beyond it as one:
    /// the same answers, in the same order, wherever the watermark falls.
    #[tokio::test]
    async fn listings_read_the_index_tables_and_the_tail_as_one() {
        use crate::store::conformance::{app, attempt, endpoint, message};
        use crate::store::*;
        let fixture = Fixture::new().await;
        let store = &fixture.store;
        let app = app();
        store.insert_app(&app).await.unwrap();
        let (fast, failing) = (endpoint(&app), endpoint(&app));
        store.insert_endpoint(&fast, 1000).await.unwrap();
        store.insert_endpoint(&failing, 1000).await.unwrap();
        let mut sent = vec![];
        for i in 0..6 {
            if i == 3 {
                store.index_now().await;
            }
            let m = message(&app, None);
            let dests = [&fast, &failing].map(|e| NewDelivery { endpoint: e.id.clone(), strict: false }).to_vec();
            let new = NewMessage { message: m.clone(), deliveries: dests, owner: Some("me".into()), idempotency: None };
            let IngestResult::Created { deliveries } = store.ingest(new).await.unwrap() else { panic!("created") };
            sent.push((m, deliveries));
        }
        // Every fast delivery succeeds (half the attempts indexed); the first failing one dies.
        for (i, (m, ids)) in sent.iter().enumerate() {
            if i == 3 {
                store.index_now().await;
            }
            let mut outcomes = vec![OutcomeRecord {
                delivery_id: ids[0],
                message_created_at: m.created_at,
                attempt: Some(attempt(&app, &m.id, &fast.id, true)),
                attempts: 1,
                next: NextState::Delivered,
            }];
            if i == 0 {
                outcomes.push(OutcomeRecord {
                    delivery_id: ids[1],
                    message_created_at: m.created_at,
                    attempt: Some(attempt(&app, &m.id, &failing.id, false)),
                    attempts: 1,
                    next: NextState::Dead,
                });
            }
            assert!(store.record_outcomes("me", outcomes).await.unwrap().iter().all(|r| *r == Recorded::Applied));
        }
        let newest_first: Vec<MessageId> = sent.iter().rev().map(|(m, _)| m.id.clone()).collect();
        let page = |limit, iterator: Option<&MessageId>| PageQuery {
            limit,
            iterator: iterator.map(|i| i.to_string()),
            descending: true,
        };
        let first = store.list_messages(&app.id, &MessageFilter::default(), &page(4, None)).await.unwrap();
        let rest = store.list_messages(&app.id, &MessageFilter::default(), &page(4, Some(&first[3].id))).await.unwrap();
        let listed: Vec<MessageId> = first.iter().chain(&rest).map(|m| m.id.clone()).collect();
        assert_eq!(listed, newest_first, "one order, no duplicates, across the watermark");

        let (all, ten) = (MessageFilter::default(), page(10, None));
        let by_fast = store.list_attempts(&AttemptFilter::of_endpoint(&app.id, &fast.id, false), &ten).await.unwrap();
        assert_eq!(by_fast.len(), 6);
        let by_msg =
            store.list_attempts(&AttemptFilter::of_message(&app.id, &sent[0].0.id, false), &ten).await.unwrap();
        assert_eq!(by_msg.len(), 2);

        let to_fast = store.endpoint_messages(&fast.id, &all, None, &ten).await.unwrap();
        assert_eq!(to_fast.iter().map(|(m, _)| m.id.clone()).collect::<Vec<_>>(), newest_first);
        assert!(to_fast.iter().all(|(_, d)| d.status() == DeliveryStatus::Success), "settled at the first try");
        let dead = store.endpoint_messages(&failing.id, &all, Some(DeliveryStatus::Fail), &ten).await.unwrap();
        assert_eq!(dead.iter().map(|(m, _)| m.id.clone()).collect::<Vec<_>>(), vec![sent[0].0.id.clone()]);

        let ascending = PageQuery { limit: 10, iterator: None, descending: false };
        let first_message = store.message_deliveries(&sent[0].0.id, &ascending).await.unwrap();
        let statuses: Vec<(EndpointId, DeliveryStatus)> =
            first_message.iter().map(|d| (d.endpoint_id.clone(), d.status())).collect();
        let mut expected = vec![(fast.id.clone(), DeliveryStatus::Success), (failing.id.clone(), DeliveryStatus::Fail)];
        expected.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        assert_eq!(statuses, expected);

        assert_eq!(store.endpoint_stats(&fast.id, None, None).await.unwrap().success, 6);
        let failing_stats = store.endpoint_stats(&failing.id, None, None).await.unwrap();
        assert_eq!((failing_stats.fail, failing_stats.pending), (1, 5), "the held ones are pending");
        let summary = store.summary(crate::clock::now_ms()).await.unwrap();
        assert_eq!((summary.pending, summary.dead), (5, 1));
        assert_eq!(summary.oldest_pending_at, Some(sent[1].0.created_at));
    }
}
