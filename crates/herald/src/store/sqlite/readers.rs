//! A fixed pool of read-only connections; queries run on the blocking thread pool so the
//! async workers never wait on disk.
//!
//! A connection is taken and given back inside the blocking task, and the permit is let go
//! only after it is back: a caller that stops waiting (an HTTP request cancelled while its
//! query runs) cannot leave a permit without a connection behind it.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use rusqlite::Connection;
use tokio::sync::Semaphore;

use crate::store::{StoreError, StoreResult};

pub struct Readers {
    idle: Arc<Mutex<Vec<Connection>>>,
    available: Arc<Semaphore>,
}

impl Readers {
    pub fn new(conns: Vec<Connection>) -> Self {
        let available = Arc::new(Semaphore::new(conns.len()));
        Self { idle: Arc::new(Mutex::new(conns)), available }
    }

    pub async fn read<R, F>(&self, query: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let closed = |_| StoreError::Unavailable("the SQLite readers are closed".into());
        let permit = self.available.clone().acquire_owned().await.map_err(closed)?;
        let idle = self.idle.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let conn =
                idle.lock().unwrap_or_else(|p| p.into_inner()).pop().expect("a permit implies an idle connection");
            // A panicking query leaves the connection usable (its statements are finalized
            // as the panic unwinds), so the connection goes back either way.
            let result = catch_unwind(AssertUnwindSafe(|| query(&conn)));
            idle.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
            drop(permit);
            result
        })
        .await;
        match joined {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(StoreError::Other(anyhow::anyhow!("a read query panicked"))),
            Err(e) => Err(StoreError::Other(anyhow::anyhow!("read task failed: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn one_reader() -> Readers {
        Readers::new(vec![Connection::open_in_memory().unwrap()])
    }

    fn select_one(conn: &Connection) -> StoreResult<i64> {
        Ok(conn.query_row("SELECT 1", [], |r| r.get(0))?)
    }

    /// A caller that gives up while its query runs (a cancelled request) must not cost the
    /// pool its connection.
    #[tokio::test]
    async fn a_cancelled_read_gives_its_connection_back() {
        let readers = one_reader();
        let slow = readers.read(|conn| {
            std::thread::sleep(Duration::from_millis(200));
            select_one(conn)
        });
        assert!(tokio::time::timeout(Duration::from_millis(20), slow).await.is_err(), "cancelled mid-query");
        for _ in 0..3 {
            assert_eq!(readers.read(select_one).await.unwrap(), 1);
        }
    }

    #[tokio::test]
    async fn a_panicking_read_is_an_error_and_the_pool_carries_on() {
        let readers = one_reader();
        let failed = readers.read(|_| -> StoreResult<i64> { panic!("a bug in a query") }).await;
        assert!(matches!(failed, Err(StoreError::Other(_))), "{failed:?}");
        assert_eq!(readers.read(select_one).await.unwrap(), 1);
    }
}
