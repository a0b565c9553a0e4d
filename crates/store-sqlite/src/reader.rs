//! The pool of read connections.
//!
//! Reads never queue behind the writer: in WAL mode readers see the last
//! committed snapshot while the writer appends. Each read takes a semaphore
//! permit (one per connection), then runs on tokio's blocking pool
//! (`spawn_blocking`) with a connection it checks out of the pool. The
//! connection and the permit go back when the blocking closure ends — even
//! if the awaiting future was dropped or the closure panicked — so a
//! cancelled read cannot leak a connection.

use std::sync::{Arc, Mutex, PoisonError};

use rusqlite::Connection;
use store_types::{Error, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A fixed set of read connections.
pub(crate) struct Readers {
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

/// A checked-out connection; returns itself (and then the permit) on drop.
struct Lease<'a> {
    pool: &'a Readers,
    conn: Option<Connection>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if !conn.is_autocommit() {
                // A read transaction left open by an error or panic.
                let _ = conn.execute_batch("ROLLBACK");
            }
            self.pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
        }
        // `_permit` is released after the connection is back.
    }
}

impl Readers {
    /// A pool over `conns` (at least one).
    pub(crate) fn new(conns: Vec<Connection>) -> Arc<Self> {
        assert!(!conns.is_empty(), "a reader pool needs a connection");
        Arc::new(Readers {
            permits: Arc::new(Semaphore::new(conns.len())),
            idle: Mutex::new(conns),
        })
    }

    /// Runs `f` on a read connection on the blocking pool.
    pub(crate) async fn run<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let permit = self.permits.clone().acquire_owned().await.map_err(|e| {
            Error::backend(store_types::ErrorKind::Other, "sqlite: acquire reader").with_source(e)
        })?;
        let pool = self.clone();
        tokio::task::spawn_blocking(move || {
            let conn = pool
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop()
                .ok_or_else(|| {
                    Error::backend(store_types::ErrorKind::Other, "sqlite: acquire reader")
                        .with_source("the reader pool is empty")
                })?;
            let lease = Lease {
                pool: &pool,
                conn: Some(conn),
                _permit: permit,
            };
            f(lease.conn.as_ref().expect("leased connection"))
        })
        .await
        .map_err(|e| {
            Error::backend(store_types::ErrorKind::Other, "sqlite: run read task").with_source(e)
        })?
    }
}
