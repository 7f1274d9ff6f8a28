//! Group commit: one thread owns the only writing connection. Callers hand it operations;
//! it runs every operation that is waiting in one transaction, commits once, and only then
//! answers each caller.
//!
//! Two kinds of operation share a batch. A *guarded* operation runs inside its own
//! savepoint, so its failure (a uniqueness conflict, say) undoes only its own changes.
//! A *hot* operation (ingest, claims, outcomes: the delivery path) skips the savepoint —
//! savepoints make SQLite copy every page they touch — and may fail only for reasons that
//! doom the whole transaction (I/O, disk full); if one does, the batch is rolled back and
//! every caller in it is told so.
//!
//! While the writer is busy, each commit starts at least `commit_interval` after the previous
//! one ended: waiting
//! that long lets more operations join a batch, so each committed page carries more rows
//! (less written per message, fewer fsyncs). An operation arriving after a quiet spell is
//! committed at once.
//!
//! Between batches the writer also fills the index tables every `INDEX_INTERVAL`
//! (`indexer`), and finishes each checkpoint the checkpointer's thread has copied
//! (`checkpointer`): only what was committed during that copy, so the log is wholly copied
//! while nothing is being written and the next commit starts it over.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::checkpointer::{self, Checkpoints};
use super::keys::Keys;
use super::map_err;
use crate::store::{StoreError, StoreResult};
use crate::supervisor::{Liveness, spawn_thread};

/// Delivers an operation's result once the batch's commit outcome is known.
type Finish = Box<dyn FnOnce(StoreResult<()>) + Send>;

trait WriteOp: Send {
    fn guarded(&self) -> bool;
    /// Runs against the open transaction; returns whether it succeeded and how to answer
    /// the caller after the commit.
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Finish);
    /// Answers the caller without running.
    fn abort(self: Box<Self>, error: StoreError);
}

struct Op<F, R> {
    op: F,
    guarded: bool,
    reply: oneshot::Sender<StoreResult<R>>,
}

impl<F, R> WriteOp for Op<F, R>
where
    R: Send + 'static,
    F: FnOnce(&Connection) -> StoreResult<R> + Send,
{
    fn guarded(&self) -> bool {
        self.guarded
    }

    fn run(self: Box<Self>, conn: &Connection) -> (bool, Finish) {
        let Op { op, reply, .. } = *self;
        let result = op(conn);
        let ok = result.is_ok();
        (ok, Box::new(move |commit| drop(reply.send(commit.and(result)))))
    }

    fn abort(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }
}

#[derive(Clone)]
pub struct Writer {
    ops: mpsc::Sender<Box<dyn WriteOp>>,
}

/// How the writer batches.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    pub max_ops: usize,
    pub commit_interval: Duration,
}

impl Writer {
    /// Starts the writer thread on `conn`, finishing the checkpoints of `checkpoints`; it
    /// runs until the store is dropped (a panic fails the process).
    pub fn start(
        conn: Connection,
        batching: Batching,
        checkpoints: Checkpoints,
        keys: Keys,
        liveness: &Arc<Liveness>,
    ) -> Self {
        let (ops, rx) = mpsc::channel();
        let between = Between { checkpoints, keys, last_index: Instant::now() };
        spawn_thread(liveness, "herald sqlite writer", move || run(conn, rx, batching, between));
        Self { ops }
    }

    /// Runs `op` in its own savepoint within the next batch; a failure undoes only its
    /// own changes.
    pub async fn write<R, F>(&self, op: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        self.submit(op, true).await
    }

    /// Runs `op` in the next batch without a savepoint. Only for operations that fail
    /// solely when the whole transaction fails; their failure rolls back the batch.
    pub async fn write_hot<R, F>(&self, op: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        self.submit(op, false).await
    }

    async fn submit<R, F>(&self, op: F, guarded: bool) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the SQLite writer has stopped".into());
        self.ops.send(Box::new(Op { op, guarded, reply })).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

/// How often the index tables are brought up to date (in passes of a bounded size, see
/// `indexer`): what queries read past them is about this much of the traffic.
const INDEX_INTERVAL: Duration = Duration::from_millis(100);

/// What the writer does between batches, and when it last filled the index tables.
struct Between {
    checkpoints: Checkpoints,
    keys: Keys,
    last_index: Instant,
}

fn run(conn: Connection, rx: mpsc::Receiver<Box<dyn WriteOp>>, batching: Batching, mut between: Between) {
    let mut batch = Vec::with_capacity(batching.max_ops);
    let mut last_commit = Instant::now() - batching.commit_interval;
    loop {
        match rx.recv_timeout(INDEX_INTERVAL) {
            Ok(first) => {
                batch.push(first);
                collect(&rx, &mut batch, batching.max_ops, last_commit + batching.commit_interval);
                commit_batch(&conn, &mut batch);
                between_batches(&conn, &mut between);
                // Spacing counts from the end of a commit: a commit takes about as long as
                // the interval itself, so counting from its start would hardly ever wait.
                last_commit = Instant::now();
            }
            Err(RecvTimeoutError::Timeout) => between_batches(&conn, &mut between),
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    checkpointer::copy(&conn);
}

/// Fills the index tables when they are due, writes the next chunk of a run of idempotency
/// keys if one is due, and finishes a checkpoint the checkpointer has copied.
fn between_batches(conn: &Connection, between: &mut Between) {
    if between.last_index.elapsed() >= INDEX_INTERVAL {
        index(conn, &mut between.last_index);
    }
    between.keys.write_some(conn);
    if between.checkpoints.copied() {
        checkpointer::copy(conn);
    }
}

/// Brings the index tables up to date (a failure leaves them behind, to catch up later).
fn index(conn: &Connection, last: &mut Instant) {
    *last = Instant::now();
    if let Err(e) = super::indexer::catch_up(conn) {
        tracing::warn!(error = %e, "filling the index tables failed");
    }
}

/// Adds waiting operations to the batch until it is full or the deadline passes. It sleeps
/// through the wait rather than waking for each arrival: senders then find no parked
/// receiver to wake, which on a busy server saves a thread switch per operation.
fn collect(rx: &mpsc::Receiver<Box<dyn WriteOp>>, batch: &mut Vec<Box<dyn WriteOp>>, max: usize, deadline: Instant) {
    let wait = deadline.saturating_duration_since(Instant::now());
    if !wait.is_zero() {
        std::thread::sleep(wait);
    }
    while batch.len() < max {
        match rx.try_recv() {
            Ok(op) => batch.push(op),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => return,
        }
    }
}

/// Runs `body` in a transaction of its own between batches, committed if it succeeds;
/// on any failure (a failed COMMIT included) nothing of it stays and no transaction is left
/// open for the next batch to find.
pub(super) fn own_transaction<R>(conn: &Connection, body: impl FnOnce() -> StoreResult<R>) -> StoreResult<R> {
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let done = body().and_then(|r| Ok(conn.execute_batch("COMMIT").map(|()| r)?));
    if done.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    done
}

fn execute(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

fn commit_batch(conn: &Connection, batch: &mut Vec<Box<dyn WriteOp>>) {
    if !conn.is_autocommit() {
        tracing::error!("a transaction was left open on the writing connection; rolling it back");
        let _ = execute(conn, "ROLLBACK");
    }
    if let Err(e) = execute(conn, "BEGIN IMMEDIATE") {
        let message = map_err(e).to_string();
        batch.drain(..).for_each(|op| op.abort(StoreError::Unavailable(message.clone())));
        return;
    }
    let mut finishes = Vec::with_capacity(batch.len());
    let mut doomed = false;
    let mut ops = batch.drain(..);
    for op in ops.by_ref() {
        if op.guarded() {
            finishes.extend(run_guarded(conn, op));
        } else {
            let (ok, finish) = op.run(conn);
            finishes.push(finish);
            doomed = !ok;
        }
        // SQLite answers some errors (a full disk, an I/O error) by rolling back the whole
        // transaction: the operations after it would run outside any, each statement
        // committed on its own (a message without its deliveries), so the batch ends here.
        doomed |= conn.is_autocommit();
        if doomed {
            break;
        }
    }
    let commit = if doomed {
        let reason = "a write in the same transaction failed; the transaction was rolled back";
        ops.for_each(|op| op.abort(StoreError::Unavailable(reason.into())));
        let _ = execute(conn, "ROLLBACK");
        Err(StoreError::Unavailable(reason.into()))
    } else {
        execute(conn, "COMMIT").map_err(map_err).inspect_err(|_| {
            let _ = execute(conn, "ROLLBACK");
        })
    };
    for finish in finishes {
        finish(match &commit {
            Ok(()) => Ok(()),
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
        });
    }
}

/// Runs a guarded operation inside a savepoint, undoing its changes if it fails.
fn run_guarded(conn: &Connection, op: Box<dyn WriteOp>) -> Option<Finish> {
    if let Err(e) = execute(conn, "SAVEPOINT op") {
        op.abort(map_err(e));
        return None;
    }
    let (ok, finish) = op.run(conn);
    let restored = if ok {
        execute(conn, "RELEASE op")
    } else if conn.is_autocommit() {
        // The error took the whole transaction with it; the batch is doomed (see above).
        Ok(())
    } else {
        execute(conn, "ROLLBACK TO op").and_then(|()| execute(conn, "RELEASE op"))
    };
    if let Err(e) = restored {
        tracing::error!(error = %e, "restoring a savepoint failed");
    }
    Some(finish)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer() -> (Writer, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (x INTEGER UNIQUE);").unwrap();
        let batching = Batching { max_ops: 100, commit_interval: Duration::from_millis(20) };
        let liveness = Arc::default();
        let checkpoints = checkpointer::start(&path, Duration::from_secs(1), &liveness).unwrap();
        (Writer::start(conn, batching, checkpoints, Keys::empty(), &liveness), dir)
    }

    fn insert(x: i64) -> impl FnOnce(&Connection) -> StoreResult<()> + Send + 'static {
        move |conn| {
            conn.execute("INSERT INTO t (x) VALUES (?)", [x]).map_err(|_| StoreError::Conflict("duplicate"))?;
            Ok(())
        }
    }

    fn count(w: &Writer) -> impl std::future::Future<Output = StoreResult<i64>> + '_ {
        w.write(|conn| Ok(conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?))
    }

    /// Runs `ops` in one batch: a slow first write holds the writer while they queue up.
    async fn same_batch<T: Send + 'static>(
        w: &Writer,
        ops: Vec<std::pin::Pin<Box<dyn Future<Output = T> + Send + '_>>>,
    ) -> Vec<T> {
        let blocker = w.write(|_| {
            std::thread::sleep(Duration::from_millis(50));
            Ok(())
        });
        let (_, results) = tokio::join!(blocker, async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            futures_util::future::join_all(ops).await
        });
        results
    }

    #[tokio::test]
    async fn a_failing_guarded_write_undoes_only_itself() {
        let (w, _dir) = writer();
        w.write(insert(1)).await.unwrap();
        let results = same_batch(&w, vec![Box::pin(w.write(insert(1))), Box::pin(w.write(insert(2)))]).await;
        assert!(matches!(results[0], Err(StoreError::Conflict(_))));
        assert!(results[1].is_ok());
        assert_eq!(count(&w).await.unwrap(), 2);
    }

    /// A full disk makes SQLite roll back the whole transaction, not just the statement:
    /// nothing after it in the batch may run, since it would be committed piecemeal.
    #[tokio::test]
    async fn a_write_that_ends_the_transaction_fails_the_whole_batch() {
        let (w, _dir) = writer();
        w.write(|conn| {
            conn.execute_batch("CREATE TABLE u (b BLOB)")?;
            let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
            conn.execute_batch(&format!("PRAGMA max_page_count = {}", pages + 4))?;
            Ok(())
        })
        .await
        .unwrap();
        let full = w.write(|conn: &Connection| {
            conn.execute("INSERT INTO u VALUES (zeroblob(100000))", [])?;
            Ok(())
        });
        let after = w.write_hot(|conn: &Connection| {
            conn.execute("INSERT INTO t (x) VALUES (1)", [])?;
            conn.execute("INSERT INTO t (x) VALUES (2)", [])?;
            Ok(())
        });
        let results = same_batch(&w, vec![Box::pin(w.write(insert(3))), Box::pin(full), Box::pin(after)]).await;
        assert!(results.iter().all(|r| matches!(r, Err(StoreError::Unavailable(_)))), "{results:?}");
        assert_eq!(count(&w).await.unwrap(), 0, "nothing of the batch was committed, before or after");
        w.write_hot(insert(4)).await.unwrap();
        assert_eq!(count(&w).await.unwrap(), 1, "the writer carries on");
    }

    #[tokio::test]
    async fn a_failing_hot_write_rolls_back_its_whole_batch() {
        let (w, _dir) = writer();
        let failing = w.write_hot(|conn: &Connection| {
            conn.execute("INSERT INTO t (x) VALUES (10)", [])?;
            Err::<(), _>(StoreError::Unavailable("disk full".into()))
        });
        let results = same_batch(&w, vec![Box::pin(w.write(insert(3))), Box::pin(failing)]).await;
        assert!(results.iter().all(|r| matches!(r, Err(StoreError::Unavailable(_)))), "{results:?}");
        assert_eq!(count(&w).await.unwrap(), 0, "nothing of the batch was committed");
        w.write_hot(insert(4)).await.unwrap();
        assert_eq!(count(&w).await.unwrap(), 1, "the writer carries on");
    }
}
