//! Another client holding Herald's store, for the faults that need the store to stop
//! answering: an exclusive transaction on SQLite, an exclusive lock on the delivery tables
//! on PostgreSQL.

use std::time::Duration;

use super::server::Storage;

/// The lock, held until `release`.
pub enum StoreLock {
    Sqlite(std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<()>),
    Postgres(tokio_postgres::Client),
}

impl StoreLock {
    pub async fn take(storage: &Storage) -> Self {
        if let Some(url) = &storage.database_url {
            let db = herald_test_support::pg_cluster::connect(url, Duration::from_secs(10)).await.unwrap();
            db.batch_execute("BEGIN; LOCK TABLE herald.delivery, herald.held IN ACCESS EXCLUSIVE MODE").await.unwrap();
            return StoreLock::Postgres(db);
        }
        let path = storage.dir.path().join("herald.db");
        let (release, released) = std::sync::mpsc::channel();
        let (locked, is_locked) = tokio::sync::oneshot::channel();
        let holder = tokio::task::spawn_blocking(move || {
            let db = rusqlite::Connection::open(path).unwrap();
            db.busy_timeout(Duration::from_secs(30)).unwrap();
            db.execute_batch("BEGIN EXCLUSIVE").unwrap();
            locked.send(()).unwrap();
            let _ = released.recv();
            db.execute_batch("ROLLBACK").unwrap();
        });
        is_locked.await.unwrap();
        StoreLock::Sqlite(release, holder)
    }

    pub async fn release(self) {
        match self {
            StoreLock::Sqlite(release, holder) => {
                release.send(()).unwrap();
                holder.await.unwrap();
            }
            StoreLock::Postgres(db) => db.batch_execute("ROLLBACK").await.unwrap(),
        }
    }
}
