//! A fixed pool of read-only connections; queries run on the blocking thread pool so the
//! async workers never wait on disk.

use std::sync::Mutex;

use rusqlite::Connection;
use tokio::sync::Semaphore;

use crate::store::{StoreError, StoreResult};

pub struct Readers {
    idle: Mutex<Vec<Connection>>,
    available: Semaphore,
}

impl Readers {
    pub fn new(conns: Vec<Connection>) -> Self {
        let available = Semaphore::new(conns.len());
        Self { idle: Mutex::new(conns), available }
    }

    pub async fn read<R, F>(&self, query: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<R> + Send + 'static,
    {
        let permit = self.available.acquire().await.map_err(|_| StoreError::Unavailable("closed".into()))?;
        let conn =
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop().expect("a permit implies an idle connection");
        let joined = tokio::task::spawn_blocking(move || {
            let result = query(&conn);
            (conn, result)
        })
        .await;
        match joined {
            Ok((conn, result)) => {
                self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
                result
            }
            Err(e) => {
                // The connection went down with the panicking query: shrink the pool for good.
                permit.forget();
                Err(StoreError::Other(anyhow::anyhow!("read task failed: {e}")))
            }
        }
    }
}
