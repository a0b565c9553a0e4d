//! The writer thread and its group commit.
//!
//! Every write (put, delete, window stage/unstage, schema changes) is a
//! [`Job`] sent over a channel to one dedicated OS thread owning the only
//! write connection. The thread blocks for the first job, then drains what
//! else is already queued (up to [`MAX_BATCH_JOBS`] jobs or
//! [`MAX_BATCH_BYTES`] of payload) and runs the whole batch in ONE
//! `BEGIN IMMEDIATE ... COMMIT`. Only after `COMMIT` returns does it answer
//! the jobs' oneshot channels, so an acknowledged write is a committed (and,
//! under `synchronous=FULL`, fsynced) write. Concurrent writers therefore
//! share one fsync instead of paying one each.
//!
//! A lone writer pays no added latency: whatever is queued when the thread
//! looks is the batch. Only when the channel holds fewer jobs than the
//! previous batch had (the writers it just answered are still preparing
//! their next write) does the thread wait for them, at most
//! [`GATHER_WAIT`] (200 µs) — the idea of PostgreSQL's `commit_delay` /
//! `commit_siblings`. Measured with 16 putters of 4 KiB under
//! `synchronous=FULL`, this raised the mean batch from ~8 to ~16 puts per
//! commit and throughput from ~2.1x to ~2.5x the one-insert-per-transaction
//! rate.
//!
//! # Failure isolation inside a batch
//!
//! - A job that may execute several statements (`delete_many`, `stage`,
//!   `unstage`, ...) runs inside its own `SAVEPOINT`; if it fails, it is
//!   rolled back to the savepoint and answered with its error, and the rest
//!   of the batch proceeds and commits.
//! - A single-statement job (`put`) needs no savepoint: SQLite already
//!   undoes a failed statement without touching the rest of the transaction
//!   (statement journal).
//! - Some errors (I/O, full disk, out of memory) make SQLite roll back the
//!   whole transaction. The writer notices (`is_autocommit()`), answers the
//!   failing job with its error, and re-runs the jobs that had already
//!   succeeded in the lost transaction, together with the rest of the batch,
//!   in a fresh transaction. Every round either commits or removes at least
//!   one job, so this terminates.
//! - If `BEGIN` or `COMMIT` itself fails, every job in the transaction is
//!   answered with that error.
//! - If `COMMIT` fails with an I/O error (`SQLITE_IOERR*`, e.g. a failed
//!   WAL fsync), the outcome of that transaction is unknown: its frames may
//!   all be in the WAL, invisible to this process (the wal-index was not
//!   advanced) but replayed by the recovery after a restart. A later
//!   transaction that writes nothing (a delete of an absent key, an
//!   `unstage` of that transaction's row, a put answered `AlreadyPresent`)
//!   would then be acknowledged against a state the restart contradicts.
//!   So the writer stops: it answers every later write with that I/O
//!   error until the engine is reopened (the recovery of the next open
//!   settles the outcome). Reads keep working. This is PostgreSQL's answer
//!   to a failed fsync; the crash model found it (ADR-029 "## SQLite").
//! - A panicking job is caught and treated as a failed job.
//!
//! A caller that stops waiting (drops its future) does not cancel its job:
//! a put already queued is still committed.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, TryRecvError};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::Connection;
use store_types::{Error, Result, Timestamp};
use tokio::sync::oneshot;

use crate::error::SqlResultExt;

/// Most jobs in one transaction.
pub(crate) const MAX_BATCH_JOBS: usize = 1000;

/// Payload bytes after which the writer stops adding jobs to a batch
/// (a batch always holds at least one job, whatever its size).
pub(crate) const MAX_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// Longest the writer waits for more jobs when fewer arrived than in its
/// previous batch (see the module docs). A lone writer never waits.
pub(crate) const GATHER_WAIT: Duration = Duration::from_micros(200);

/// One unit of work for the writer thread.
pub(crate) trait Job: Send {
    /// Payload bytes, for the batch size cap.
    fn cost(&self) -> usize;
    /// Whether the job needs its own savepoint (it may run more than one
    /// statement).
    fn needs_savepoint(&self) -> bool;
    /// Executes the job inside the open transaction. May be called again
    /// (in a new transaction) if the first transaction was lost.
    fn apply(&mut self, conn: &Connection, now: Timestamp) -> Result<()>;
    /// Answers the waiter: `Ok` after the commit, or the error.
    fn complete(self: Box<Self>, outcome: Result<()>);
}

/// What runs on the writer thread once a job's transaction has committed
/// or failed, before its waiter is answered.
pub(crate) type AfterCommit = Box<dyn FnOnce() + Send>;

/// A job made of a closure and the channel its result goes to.
struct FnJob<T, F> {
    f: F,
    cost: usize,
    savepoint: bool,
    result: Option<T>,
    reply: oneshot::Sender<Result<T>>,
    after: Option<AfterCommit>,
}

impl<T, F> Job for FnJob<T, F>
where
    T: Send,
    F: FnMut(&Connection, Timestamp) -> Result<T> + Send,
{
    fn cost(&self) -> usize {
        self.cost
    }

    fn needs_savepoint(&self) -> bool {
        self.savepoint
    }

    fn apply(&mut self, conn: &Connection, now: Timestamp) -> Result<()> {
        self.result = Some((self.f)(conn, now)?);
        Ok(())
    }

    fn complete(mut self: Box<Self>, outcome: Result<()>) {
        if let Some(after) = self.after.take() {
            after();
        }
        let answer = match (outcome, self.result) {
            (Ok(()), Some(v)) => Ok(v),
            (Ok(()), None) => Err(Error::backend(
                store_types::ErrorKind::Other,
                "sqlite: write job",
            )
            .with_source("the job committed without a result")),
            (Err(e), _) => Err(e),
        };
        // The waiter may have given up; the work is done either way.
        let _ = self.reply.send(answer);
    }
}

/// Counters kept by the writer thread.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) submitted: AtomicU64,
    pub(crate) commits: AtomicU64,
    pub(crate) jobs_committed: AtomicU64,
    pub(crate) jobs_failed: AtomicU64,
    pub(crate) largest_batch: AtomicU64,
    pub(crate) lost_transactions: AtomicU64,
}

/// Handle to the writer thread. Dropping the last handle closes the channel;
/// the thread finishes the batch in hand and exits, closing the connection.
pub(crate) struct Writer {
    tx: mpsc::Sender<Box<dyn Job>>,
    counters: Arc<Counters>,
}

impl Writer {
    /// Starts the writer thread on `conn`.
    pub(crate) fn spawn(conn: Connection) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Box<dyn Job>>();
        let counters = Arc::new(Counters::default());
        let thread_counters = counters.clone();
        thread::Builder::new()
            .name("blobpool-sqlite-writer".into())
            .spawn(move || run(conn, rx, &thread_counters))
            .map_err(|e| Error::from_io("sqlite: start writer thread", e))?;
        Ok(Writer { tx, counters })
    }

    /// The writer's counters.
    pub(crate) fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Queues `f` and returns a future resolving after the commit of the
    /// transaction that ran it. The job is queued when `submit` is called,
    /// not when the future is first polled.
    ///
    /// `cost` is the payload size (for the batch cap); `savepoint` says
    /// whether `f` may run more than one statement.
    pub(crate) fn submit<T, F>(
        &self,
        cost: usize,
        savepoint: bool,
        f: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static
    where
        T: Send + 'static,
        F: FnMut(&Connection, Timestamp) -> Result<T> + Send + 'static,
    {
        self.submit_then(cost, savepoint, f, None)
    }

    /// [`submit`](Self::submit), and `after` runs on the writer thread once
    /// the job's transaction has committed or failed (whatever the outcome,
    /// and whether or not anyone still awaits the answer), before the
    /// answer is sent. It must not block. The hot-entry cache's
    /// invalidation of deleted keys runs here (TUNING.md §sqlite-hot-cache).
    pub(crate) fn submit_then<T, F>(
        &self,
        cost: usize,
        savepoint: bool,
        f: F,
        after: Option<AfterCommit>,
    ) -> impl Future<Output = Result<T>> + Send + 'static
    where
        T: Send + 'static,
        F: FnMut(&Connection, Timestamp) -> Result<T> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let job = Box::new(FnJob {
            f,
            cost,
            savepoint,
            result: None,
            reply,
            after,
        });
        let sent = self.tx.send(job).is_ok();
        if sent {
            self.counters.submitted.fetch_add(1, Ordering::Relaxed);
        }
        async move {
            if !sent {
                return Err(stopped());
            }
            rx.await.unwrap_or_else(|_| Err(stopped()))
        }
    }
}

fn stopped() -> Error {
    Error::backend(
        store_types::ErrorKind::Other,
        "sqlite: send to writer thread",
    )
    .with_source("the writer thread has stopped")
}

/// The writer thread's loop.
fn run(conn: Connection, rx: mpsc::Receiver<Box<dyn Job>>, counters: &Counters) {
    tracing::debug!("sqlite writer thread started");
    let mut last_batch = 1;
    // Set when a COMMIT failed with an I/O error (see the module docs).
    let mut stopped_by: Option<Error> = None;
    while let Ok(first) = rx.recv() {
        if let Some(e) = &stopped_by {
            fail_all(std::iter::once(first).chain(rx.try_iter()), e, counters);
            continue;
        }
        let mut bytes = first.cost();
        let mut batch = VecDeque::with_capacity(last_batch.max(16));
        batch.push_back(first);
        let deadline = Instant::now() + GATHER_WAIT;
        while batch.len() < MAX_BATCH_JOBS && bytes < MAX_BATCH_BYTES {
            let job = match rx.try_recv() {
                Ok(job) => job,
                Err(TryRecvError::Disconnected) => break,
                // Nothing queued. If the previous batch was larger, the
                // writers it answered are probably about to come back:
                // wait (briefly) for them rather than commit a small batch.
                Err(TryRecvError::Empty) if batch.len() < last_batch => {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    match rx.recv_timeout(deadline - now) {
                        Ok(job) => job,
                        Err(_) => break,
                    }
                }
                Err(TryRecvError::Empty) => break,
            };
            bytes = bytes.saturating_add(job.cost());
            batch.push_back(job);
        }
        last_batch = batch.len();
        stopped_by = run_batch(&conn, batch, counters);
    }
    tracing::debug!("sqlite writer thread exiting");
}

fn exec(conn: &Connection, sql: &str) -> Result<()> {
    conn.prepare_cached(sql).sql()?.execute([]).sql()?;
    Ok(())
}

/// Runs a batch of jobs in as few transactions as possible (normally one).
/// Returns the error of a `COMMIT` that failed with an I/O error: the
/// writer must stop writing (see the module docs).
fn run_batch(
    conn: &Connection,
    mut pending: VecDeque<Box<dyn Job>>,
    counters: &Counters,
) -> Option<Error> {
    while !pending.is_empty() {
        if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
            tracing::warn!(error = %store_types::Report::new(&e), jobs = pending.len(), "sqlite: cannot begin write transaction");
            fail_all(pending.drain(..), &e, counters);
            return None;
        }
        let now = Timestamp::now();
        let mut done: Vec<Box<dyn Job>> = Vec::with_capacity(pending.len());
        let mut lost = false;
        while let Some(mut job) = pending.pop_front() {
            match apply_one(conn, job.as_mut(), now) {
                Ok(()) => done.push(job),
                Err(e) => {
                    counters.jobs_failed.fetch_add(1, Ordering::Relaxed);
                    job.complete(Err(e));
                    if conn.is_autocommit() {
                        // SQLite rolled the whole transaction back: redo the
                        // jobs it had already applied, in order, first.
                        counters.lost_transactions.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            redo = done.len(),
                            "sqlite: write transaction rolled back by an error; retrying the rest"
                        );
                        for j in done.drain(..).rev() {
                            pending.push_front(j);
                        }
                        lost = true;
                        break;
                    }
                }
            }
        }
        if lost {
            continue;
        }
        match commit(conn) {
            Ok(()) => {
                counters.commits.fetch_add(1, Ordering::Relaxed);
                counters
                    .jobs_committed
                    .fetch_add(done.len() as u64, Ordering::Relaxed);
                counters
                    .largest_batch
                    .fetch_max(done.len() as u64, Ordering::Relaxed);
                for job in done {
                    job.complete(Ok(()));
                }
            }
            Err((e, io)) => {
                tracing::warn!(error = %store_types::Report::new(&e), jobs = done.len(), "sqlite: commit failed");
                if !conn.is_autocommit() {
                    let _ = exec(conn, "ROLLBACK");
                }
                fail_all(done.into_iter().chain(pending.drain(..)), &e, counters);
                if io {
                    tracing::error!(
                        error = %store_types::Report::new(&e),
                        "sqlite: a commit failed with an I/O error; its outcome is unknown \
                         until the database is reopened, so this engine accepts no more writes"
                    );
                    return Some(e);
                }
                return None;
            }
        }
    }
    None
}

/// `COMMIT`; on failure the error and whether it is an I/O error (the
/// transaction's outcome is then unknown, see the module docs).
fn commit(conn: &Connection) -> std::result::Result<(), (Error, bool)> {
    let result = conn
        .prepare_cached("COMMIT")
        .and_then(|mut stmt| stmt.execute([]));
    match result {
        Ok(_) => Ok(()),
        Err(e) => {
            let io = e.sqlite_error_code() == Some(rusqlite::ErrorCode::SystemIoFailure);
            Err((crate::error::sql_err(e), io))
        }
    }
}

fn fail_all(jobs: impl Iterator<Item = Box<dyn Job>>, e: &Error, counters: &Counters) {
    for job in jobs {
        counters.jobs_failed.fetch_add(1, Ordering::Relaxed);
        job.complete(Err(e.clone()));
    }
}

/// Applies one job, inside its own savepoint when it asks for one.
fn apply_one(conn: &Connection, job: &mut dyn Job, now: Timestamp) -> Result<()> {
    let guarded = |job: &mut dyn Job| {
        catch_unwind(AssertUnwindSafe(|| job.apply(conn, now))).unwrap_or_else(|_| {
            Err(
                Error::backend(store_types::ErrorKind::Other, "sqlite: write job")
                    .with_source("the job panicked"),
            )
        })
    };
    if !job.needs_savepoint() {
        return guarded(job);
    }
    exec(conn, "SAVEPOINT job")?;
    let result = guarded(job).and_then(|()| exec(conn, "RELEASE job"));
    if result.is_err() && !conn.is_autocommit() {
        // Undo the job's partial work, keep the batch's transaction.
        let _ = exec(conn, "ROLLBACK TO job");
        let _ = exec(conn, "RELEASE job");
    }
    result
}
