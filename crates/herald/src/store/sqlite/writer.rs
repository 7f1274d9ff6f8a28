//! Group commit: one thread owns the only writing connection. Callers hand it operations;
//! it runs every operation that is waiting in one transaction (each inside its own
//! savepoint, so one failing operation does not undo the others), commits once, and only
//! then answers each caller. While a commit is being synced to disk new operations queue
//! up, so the batch size adapts to the load without any timer.

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

use super::map_err;
use crate::store::{StoreError, StoreResult};

/// Delivers an operation's result once the batch's commit outcome is known.
type Finish = Box<dyn FnOnce(StoreResult<()>) + Send>;

/// One queued write.
trait WriteOp: Send {
    /// Runs against the open transaction; returns whether it succeeded (else its savepoint
    /// is rolled back) and how to answer the caller after the commit.
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Finish);
    /// Answers the caller without running (the transaction could not start).
    fn abort(self: Box<Self>, error: StoreError);
}

struct Op<F, R> {
    op: F,
    reply: oneshot::Sender<StoreResult<R>>,
}

impl<F, R> WriteOp for Op<F, R>
where
    R: Send + 'static,
    F: FnOnce(&Connection) -> StoreResult<R> + Send,
{
    fn run(self: Box<Self>, conn: &Connection) -> (bool, Finish) {
        let Op { op, reply } = *self;
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
    ops: mpsc::UnboundedSender<Box<dyn WriteOp>>,
}

impl Writer {
    /// Starts the writer thread on `conn`.
    pub fn start(conn: Connection, batch_max: usize) -> Self {
        let (ops, rx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("herald-sqlite-writer".into())
            .spawn(move || run(conn, rx, batch_max))
            .expect("spawning the writer thread");
        Self { ops }
    }

    /// Runs `op` in the next group-commit transaction and returns its result once the
    /// commit is durable. If `op` fails, only its own changes are rolled back.
    pub async fn write<R, F>(&self, op: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let stopped = || StoreError::Unavailable("the SQLite writer has stopped".into());
        self.ops.send(Box::new(Op { op, reply })).map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

fn run(conn: Connection, mut rx: mpsc::UnboundedReceiver<Box<dyn WriteOp>>, batch_max: usize) {
    let mut batch = Vec::with_capacity(batch_max);
    while let Some(first) = rx.blocking_recv() {
        batch.push(first);
        while batch.len() < batch_max {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        commit_batch(&conn, &mut batch);
    }
}

fn commit_batch(conn: &Connection, batch: &mut Vec<Box<dyn WriteOp>>) {
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        let message = map_err(e).to_string();
        for op in batch.drain(..) {
            op.abort(StoreError::Unavailable(message.clone()));
        }
        return;
    }
    let mut finishes = Vec::with_capacity(batch.len());
    for op in batch.drain(..) {
        if let Err(e) = conn.execute_batch("SAVEPOINT op") {
            op.abort(map_err(e));
            continue;
        }
        let (ok, finish) = op.run(conn);
        let restore = if ok { "RELEASE op" } else { "ROLLBACK TO op; RELEASE op" };
        if let Err(e) = conn.execute_batch(restore) {
            tracing::error!(error = %e, "restoring a savepoint failed");
        }
        finishes.push(finish);
    }
    let commit = conn.execute_batch("COMMIT").map_err(map_err);
    if commit.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    for finish in finishes {
        finish(match &commit {
            Ok(()) => Ok(()),
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
        });
    }
}
