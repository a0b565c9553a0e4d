//! The pool of read connections.
//!
//! Reads never queue behind the writer: in WAL mode readers see the last
//! committed snapshot while the writer appends. Each read takes a semaphore
//! permit (one per connection), then runs on tokio's blocking pool
//! (`spawn_blocking`) with a connection it checks out of the pool. The
//! connection and the permit go back when the blocking closure ends — even
//! if the awaiting future was dropped or the closure panicked — so a
//! cancelled read cannot leak a connection.
//!
//! A point read ([`Readers::run_inline_first`]) first tries the calling
//! thread (ADR-055): when a connection is free at once and the connections
//! read through the no-wait VFS, the query runs right there inside a
//! [`nowait::attempt`], which succeeds only if every page it read was in
//! memory. A query that would have waited for the disk is run again: on a
//! multi-thread runtime in place (`block_in_place`, so tokio moves the
//! worker's other tasks to another thread and the caller waits for the disk
//! without a hand-off, like a synchronous read), otherwise on the blocking
//! pool as above. Neither the attempt nor the in-place read has an
//! `.await` once it holds a connection, so there is nothing to cancel
//! half-way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use rusqlite::Connection;
use store_types::{Error, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::nowait;
use crate::writer::AtomicHistogram;

/// The most keys (or digests) one read may ask on the calling thread
/// (ADR-055, ADR-075): an action result's outputs or a short `has_many`,
/// not a `FindMissingBlobs` of thousands, which could hold a runtime
/// worker too long.
pub(crate) const INLINE_MAX_KEYS: usize = 32;

/// A fixed set of read connections.
pub(crate) struct Readers {
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
    /// Whether the connections can run no-wait attempts.
    inline: bool,
    stats: Arc<ReadPathStats>,
}

/// How point reads were answered (ADR-055).
#[derive(Default)]
pub(crate) struct ReadPathStats {
    /// On the calling thread, every page in memory.
    pub(crate) inline: AtomicU64,
    /// Tried inline, would have waited: run again, in place or pooled.
    pub(crate) fell_back: AtomicU64,
    /// Run where they may wait: on the blocking pool, or in place on a
    /// multi-thread runtime (fallbacks included).
    pub(crate) pooled: AtomicU64,
    /// Reads run where they may wait: until a connection was free.
    pub(crate) connection: AtomicHistogram,
    /// Point reads not answered inline: their whole time from there.
    pub(crate) point: AtomicHistogram,
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
    /// `inline`: the connections read through the no-wait VFS.
    pub(crate) fn new(conns: Vec<Connection>, inline: bool) -> Arc<Self> {
        assert!(!conns.is_empty(), "a reader pool needs a connection");
        Arc::new(Readers {
            permits: Arc::new(Semaphore::new(conns.len())),
            idle: Mutex::new(conns),
            inline,
            stats: Arc::default(),
        })
    }

    /// How point reads were answered so far (shared: the process-wide
    /// list of open databases keeps a weak reference).
    pub(crate) fn stats(&self) -> &Arc<ReadPathStats> {
        &self.stats
    }

    /// Runs the read `f` of `keys` keys (or digests) where its size
    /// belongs: at most [`INLINE_MAX_KEYS`] is a point read
    /// ([`run_inline_first`](Self::run_inline_first)); more go to the
    /// pool ([`run`](Self::run)), where they may take a while without
    /// holding up the caller's runtime worker.
    pub(crate) async fn run_sized<T, F>(self: &Arc<Self>, keys: usize, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T> + Send + 'static,
    {
        if keys <= INLINE_MAX_KEYS {
            self.run_inline_first(f).await
        } else {
            self.run(f).await
        }
    }

    /// Runs the point read `f` on the calling thread if a connection is
    /// free and every page it reads is in memory; otherwise as [`run`](Self::run).
    /// `f` must be a short, read-only query: it may run twice.
    pub(crate) async fn run_inline_first<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: Fn(&Connection) -> Result<T> + Send + 'static,
    {
        if let Some(done) = self.attempt(&f) {
            self.stats.inline.fetch_add(1, Ordering::Relaxed);
            return done;
        }
        // Timed from here only: the inline path reads no clock.
        let from = Instant::now();
        let out = if in_place_allowed() {
            self.run_in_place(f).await
        } else {
            self.run(f).await
        };
        self.stats.point.observe(from.elapsed());
        out
    }

    /// Runs `f` on the calling thread with `block_in_place`: tokio hands
    /// the worker's other tasks to another thread while `f` waits for the
    /// disk, and the caller pays no wake-up of its own.
    async fn run_in_place<T>(self: &Arc<Self>, f: impl Fn(&Connection) -> Result<T>) -> Result<T> {
        let permit = self.permit().await?;
        let conn = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .ok_or_else(|| {
                Error::backend(store_types::ErrorKind::Other, "sqlite: acquire reader")
                    .with_source("the reader pool is empty")
            })?;
        let lease = Lease {
            pool: self,
            conn: Some(conn),
            _permit: permit,
        };
        self.stats.pooled.fetch_add(1, Ordering::Relaxed);
        tokio::task::block_in_place(|| f(lease.conn.as_ref().expect("leased connection")))
    }

    /// A read connection's permit, the wait for it counted.
    async fn permit(&self) -> Result<OwnedSemaphorePermit> {
        let from = Instant::now();
        let permit = self.permits.clone().acquire_owned().await.map_err(|e| {
            Error::backend(store_types::ErrorKind::Other, "sqlite: acquire reader").with_source(e)
        })?;
        self.stats.connection.observe(from.elapsed());
        Ok(permit)
    }

    /// One no-wait attempt of `f`; `None` when there is no free connection
    /// or a read would have waited.
    fn attempt<T>(&self, f: &impl Fn(&Connection) -> Result<T>) -> Option<Result<T>> {
        if !self.inline {
            return None;
        }
        let permit = self.permits.clone().try_acquire_owned().ok()?;
        let conn = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        let lease = Lease {
            pool: self,
            conn: Some(conn),
            _permit: permit,
        };
        let out = nowait::attempt(|| f(lease.conn.as_ref().expect("leased connection")));
        if out.is_none() {
            self.stats.fell_back.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// Runs `f` on a read connection on the blocking pool.
    pub(crate) async fn run<T, F>(self: &Arc<Self>, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let permit = self.permit().await?;
        let pool = self.clone();
        self.stats.pooled.fetch_add(1, Ordering::Relaxed);
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

/// Whether a read that must wait may wait on the calling thread
/// (`block_in_place`): only on a multi-thread runtime, where tokio moves
/// the worker's other tasks to another thread first; `block_in_place`
/// panics on a current-thread runtime.
fn in_place_allowed() -> bool {
    matches!(
        tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()),
        Ok(tokio::runtime::RuntimeFlavor::MultiThread)
    )
}
