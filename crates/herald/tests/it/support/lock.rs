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

/// Takes both delivery tables' locks in one transaction. Herald's statements that move a
/// held delivery into its row take them in the other order, so PostgreSQL may find a
/// deadlock and cancel this side: it then tries again, as any client would (long fault
/// run, PostgreSQL seed 2, 2026-12-07).
async fn lock_delivery_tables(db: &tokio_postgres::Client) {
    const LOCK: &str = "BEGIN; LOCK TABLE herald.delivery, herald.held IN ACCESS EXCLUSIVE MODE";
    const TRIES: usize = 20;
    for _ in 1..TRIES {
        match db.batch_execute(LOCK).await {
            Ok(()) => return,
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED) => {
                db.batch_execute("ROLLBACK").await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("locking the delivery tables: {e}"),
        }
    }
    db.batch_execute(LOCK).await.unwrap();
}

impl StoreLock {
    pub async fn take(storage: &Storage) -> Self {
        if let Some(url) = &storage.database_url {
            let db = herald_test_support::pg_cluster::connect(url, Duration::from_secs(10)).await.unwrap();
            lock_delivery_tables(&db).await;
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
