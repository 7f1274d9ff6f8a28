//! Checkpoints in two steps, so that commits never wait behind the copy.
//!
//! Copying the write-ahead log back into the database (and the database's fsync) takes
//! about as long as the traffic it copies: at 7,500 messages a second, 11 ms per
//! 250 ms. Done by the writer, every commit queued behind it waited that long. Here a
//! thread of its own, on its own connection, does the copy (`PASSIVE`: the writer and the
//! readers go on meanwhile) and then says so; the writer finishes it between two batches,
//! copying only what was committed during the copy. The log is then wholly copied while
//! nothing is being written, so the writer's next commit starts it over from its
//! beginning. A checkpointer alone never sees that moment on a busy server, and the log
//! would grow until a blocking truncation stalled every commit.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use rusqlite::Connection;

use crate::supervisor::{Liveness, spawn_thread};

/// The writer's side: whether a copy has ended since it last finished one. Dropping it
/// stops the checkpointer's thread.
pub struct Checkpoints {
    copied: Arc<AtomicBool>,
    _stop: mpsc::Sender<()>,
}

impl Checkpoints {
    /// Whether a copy has ended since the last call (the writer then finishes it).
    pub fn copied(&self) -> bool {
        self.copied.swap(false, Ordering::AcqRel)
    }
}

/// Starts the thread that copies the log into the database at `path` every `interval`.
pub fn start(path: &Path, interval: Duration, liveness: &Arc<Liveness>) -> rusqlite::Result<Checkpoints> {
    let conn = Connection::open(path)?;
    // The copy ends with the database's fsync; this connection never writes a row.
    conn.execute_batch("PRAGMA synchronous = FULL; PRAGMA wal_autocheckpoint = 0;")?;
    let copied = Arc::new(AtomicBool::new(false));
    let (stop, stopped) = mpsc::channel::<()>();
    let flag = copied.clone();
    spawn_thread(liveness, "herald sqlite checkpointer", move || {
        while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
            copy(&conn);
            flag.store(true, Ordering::Release);
        }
    });
    Ok(Checkpoints { copied, _stop: stop })
}

/// Copies the log into the database, never blocking the writer or readers (whatever a
/// reader's snapshot still needs stays in the log for the next copy).
pub fn copy(conn: &Connection) {
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "WAL checkpoint failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::writer::{Batching, Writer};

    /// 64 MB written without a pause, while the checkpointer copies every 10 ms: the log is
    /// started over again and again, so it never holds more than a fraction of what went
    /// through it. (Copies alone, with no finish between two batches, leave it at about
    /// everything written.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_log_starts_over_under_continuous_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (b BLOB);")
            .unwrap();
        let liveness = Arc::default();
        let checkpoints = start(&path, Duration::from_millis(10), &liveness).unwrap();
        let batching = Batching { max_ops: 64, commit_interval: Duration::ZERO };
        let writer = Writer::start(conn, batching, checkpoints, crate::store::sqlite::keys::Keys::empty(), &liveness);
        for _ in 0..128 {
            let writes = (0..64).map(|_| {
                writer.write_hot(|conn| Ok(conn.execute("INSERT INTO t VALUES (zeroblob(8192))", []).map(drop)?))
            });
            for written in futures_util::future::join_all(writes).await {
                written.unwrap();
            }
        }
        let log = std::fs::metadata(dir.path().join("c.db-wal")).unwrap().len();
        assert!(log < 24 << 20, "the log grew to {} MB of the 64 MB written", log >> 20);
    }
}
