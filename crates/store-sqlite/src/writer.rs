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
//! # Bulk jobs wait their turn (ADR-058)
//!
//! A sweep's window writes and deletes are **bulk** jobs
//! ([`Writer::submit_bulk`]), each at most [`BULK_ROWS`] rows (their callers
//! split larger requests). A bulk job never shares a transaction: the
//! thread runs whatever foreground work is queued (puts, reference writes,
//! a direct delete) as one group commit first, then **one** bulk job in a
//! transaction of its own, then looks at the queue again. So a put waits
//! for at most one small bulk transaction, and a sweep still progresses by
//! one bulk job per foreground commit however busy the puts are. After a
//! bulk transaction the thread starts no other bulk job for as long as
//! that one ran ([`BULK_REST`], ADR-076; foreground jobs run at once), so
//! a sweep takes at most half the writer's time and leaves the rest of the
//! core to requests — but only while the store serves them (ADR-084): a
//! flag set by every read and foreground commit, cleared after each bulk
//! transaction, says whether it rests, and on a store that served none
//! up to [`IDLE_BULK_JOBS`] queued bulk jobs share one transaction.
//!
//! # Checkpoints are bulk work too (ADR-083)
//!
//! SQLite's automatic checkpoint runs inside the `COMMIT` that takes the
//! WAL past 1,000 pages, whichever transaction that is: a group commit of
//! puts then waits for every page of the WAL to be copied and the database
//! file fsynced before its puts are answered, and the checkpoint's time
//! escapes the bulk lane's rest. The writer connection's WAL hook replaces
//! it: the hook only notes the WAL's size, and once it reaches
//! [`CHECKPOINT_PAGES`] the thread runs a `PASSIVE` checkpoint in the bulk
//! lane (before the next bulk job, after the queued foreground commit) and
//! rests after it as after a bulk transaction. Past
//! [`CHECKPOINT_BACKSTOP`] it checkpoints after the current group commit,
//! rest or not, so puts alone cannot grow the WAL without bound.
//!
//! The thread also times every job: how long it waited for the writer
//! (and how much of that behind a bulk transaction), and how long its
//! own transaction's statements and `COMMIT` (the fsync) took — see
//! [`SqliteWaits`] — and keeps each foreground wait and each bulk
//! transaction in a histogram ([`WaitHistograms`], `/metrics`, ADR-073).
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

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// Most rows of one bulk job (a sweep's stage, unstage or delete chunk).
/// Measured with the tail benchmark (ADR-058): 1000-row jobs made a put
/// wait ~40 ms at p99 during a sweep. 32 rather than 128 (ADR-087): a
/// request that shares a core with the writer waits for the bulk
/// transaction running on it, and 128-row ones doubled p99 GET over HTTP.
pub(crate) const BULK_ROWS: usize = 32;

/// After a bulk transaction that took `t`, the writer runs no other bulk
/// job for `t` (foreground jobs run at once): a sweep takes at most half
/// of the writer thread's time, and so at most half a core from requests
/// on a busy machine (ADR-076).
pub(crate) const BULK_REST: u32 = 1;

/// Most queued bulk jobs one transaction runs on a store that served no
/// request since the last bulk transaction (ADR-084): 32 × [`BULK_ROWS`]
/// = 1,024 rows, about the 1,000-row transactions sweeps ran before
/// ADR-058. The first request after idleness waits for at most one such
/// transaction; from then on the lane runs one job at a time and rests.
pub(crate) const IDLE_BULK_JOBS: usize = 32;

/// WAL pages at which the writer checkpoints: SQLite's own default for its
/// automatic checkpoint, which the writer replaces (ADR-083). The
/// checkpoint runs in the bulk lane, after the queued foreground commit
/// and followed by the same rest as a bulk transaction.
pub(crate) const CHECKPOINT_PAGES: i32 = 1000;

/// WAL pages at which the writer checkpoints after the current group
/// commit even while the bulk lane rests: under a stream of large puts the
/// WAL would otherwise grow by whatever they write during each rest.
pub(crate) const CHECKPOINT_BACKSTOP: i32 = 4 * CHECKPOINT_PAGES;

thread_local! {
    /// Pages in the WAL after the last commit on this thread, as SQLite's
    /// WAL hook reports them; zero after a checkpoint. Only the writer
    /// thread registers the hook and commits.
    static WAL_PAGES: Cell<i32> = const { Cell::new(0) };
}

/// The writer connection's WAL hook: remembers the WAL's size and, unlike
/// SQLite's default hook, does not checkpoint inside the commit.
fn note_wal_pages(_: &rusqlite::hooks::Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.with(|p| p.set(pages));
    Ok(())
}

/// Whether the WAL has grown to [`CHECKPOINT_PAGES`] since the last
/// checkpoint.
fn checkpoint_due() -> bool {
    WAL_PAGES.with(Cell::get) >= CHECKPOINT_PAGES
}

/// Whether the WAL has grown to [`CHECKPOINT_BACKSTOP`].
fn checkpoint_urgent() -> bool {
    WAL_PAGES.with(Cell::get) >= CHECKPOINT_BACKSTOP
}

/// A `PASSIVE` checkpoint (what SQLite's automatic one runs): copies what
/// no reader still needs from the WAL into the database file. A failure is
/// logged; the next commit past the threshold tries again, as SQLite's
/// own would.
fn checkpoint(conn: &Connection, counters: &Counters) {
    WAL_PAGES.with(|p| p.set(0));
    counters.checkpoints.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
        tracing::warn!(error = %e, "sqlite: checkpoint failed; the next commit retries it");
    }
}

/// A write slower than this (queued to answered) is counted as slow and
/// logged at debug level with where its time went.
pub(crate) const SLOW_WRITE: Duration = Duration::from_millis(10);

/// One unit of work for the writer thread.
pub(crate) trait Job: Send {
    /// Payload bytes, for the batch size cap.
    fn cost(&self) -> usize;
    /// Whether the job is bulk work that runs in a transaction of its own,
    /// after the queued foreground jobs (see the module docs).
    fn bulk(&self) -> bool;
    /// When the job was queued.
    fn queued_at(&self) -> Instant;
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
    bulk: bool,
    queued_at: Instant,
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

    fn bulk(&self) -> bool {
        self.bulk
    }

    fn queued_at(&self) -> Instant {
        self.queued_at
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
    /// Checkpoints the writer ran (ADR-083).
    pub(crate) checkpoints: AtomicU64,
    /// Set by every read the engine answers, cleared by the writer after
    /// each bulk transaction: whether the store served requests meanwhile,
    /// and so whether the bulk lane rests (ADR-084).
    pub(crate) served: AtomicBool,
    /// Where writes waited.
    pub(crate) waits: WaitCounters,
}

impl Counters {
    /// Notes that the store served a request (a read, or a foreground
    /// write): the bulk lane rests after its next transaction (ADR-084).
    /// A load before the store, so a busy store's reads only read the
    /// flag's cache line.
    pub(crate) fn note_served(&self) {
        if !self.served.load(Ordering::Relaxed) {
            self.served.store(true, Ordering::Relaxed);
        }
    }
}

/// Where writes waited, in microseconds unless named otherwise, timed by
/// the writer thread.
#[derive(Debug, Default)]
pub(crate) struct WaitCounters {
    pub(crate) writes: AtomicU64,
    pub(crate) write_queued_us: AtomicU64,
    pub(crate) write_queued_max_us: AtomicU64,
    pub(crate) write_behind_bulk_us: AtomicU64,
    pub(crate) commits_us: AtomicU64,
    pub(crate) commit_max_us: AtomicU64,
    pub(crate) statements_us: AtomicU64,
    pub(crate) bulk_jobs: AtomicU64,
    pub(crate) bulk_us: AtomicU64,
    pub(crate) bulk_max_us: AtomicU64,
    pub(crate) slow_writes: AtomicU64,
    pub(crate) slow_write_queued_us: AtomicU64,
    pub(crate) slow_write_behind_bulk_us: AtomicU64,
    pub(crate) slow_write_txn_us: AtomicU64,
    /// Foreground writes: queued, behind bulk, their transaction, its commit.
    pub(crate) queued: AtomicHistogram,
    pub(crate) behind_bulk: AtomicHistogram,
    pub(crate) txn: AtomicHistogram,
    pub(crate) commit: AtomicHistogram,
    /// Each bulk transaction.
    pub(crate) bulk: AtomicHistogram,
}

/// Upper bounds (µs) of the wait histograms' buckets ([`WaitHistogram`]);
/// a last bucket takes every longer wait.
pub const WAIT_BUCKETS_US: [u64; 16] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// A histogram of waits, bumped from any thread.
#[derive(Debug, Default)]
pub(crate) struct AtomicHistogram {
    counts: [AtomicU64; WAIT_BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl AtomicHistogram {
    /// Counts one wait of `d`.
    pub(crate) fn observe(&self, d: Duration) {
        let us = micros(d);
        let i = WAIT_BUCKETS_US.partition_point(|b| *b < us);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WaitHistogram {
        WaitHistogram {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }
}

/// Waits counted by bucket: `counts[i]` waits of at most
/// [`WAIT_BUCKETS_US`]`[i]` µs and more than the bound before (not
/// cumulative); the last, longer than every bound. All monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitHistogram {
    /// Waits per bucket, the longer-than-every-bound bucket last.
    pub counts: [u64; WAIT_BUCKETS_US.len() + 1],
    /// Their summed time, µs.
    pub sum_us: u64,
}

impl WaitHistogram {
    /// Waits counted.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other`'s waits (another engine on the same file).
    pub fn add(&mut self, other: &WaitHistogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
        self.sum_us += other.sum_us;
    }
}

/// Where an engine's writes and reads waited, as histograms (ADR-058,
/// ADR-073; `/metrics`). A *foreground* write is anything but a bulk job
/// (a put, a reference or cache-key write, a direct delete).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitHistograms {
    /// Foreground writes: queued until their transaction began.
    pub write_queued: WaitHistogram,
    /// Of that, the part overlapping a bulk transaction.
    pub write_behind_bulk: WaitHistogram,
    /// Foreground writes: their transaction, begin to commit.
    pub write_transaction: WaitHistogram,
    /// Of that, the `COMMIT`.
    pub write_commit: WaitHistogram,
    /// Each bulk transaction (statements and commit).
    pub bulk_transaction: WaitHistogram,
    /// Reads run where they may wait: time until a read connection was free.
    pub read_connection: WaitHistogram,
    /// Point reads not answered from memory on the calling thread: their
    /// whole time where they may wait (connection, disk, hand-off).
    pub point_read: WaitHistogram,
}

impl WaitHistograms {
    /// Adds `other`'s waits (another engine on the same file).
    pub fn add(&mut self, o: &WaitHistograms) {
        self.write_queued.add(&o.write_queued);
        self.write_behind_bulk.add(&o.write_behind_bulk);
        self.write_transaction.add(&o.write_transaction);
        self.write_commit.add(&o.write_commit);
        self.bulk_transaction.add(&o.bulk_transaction);
        self.read_connection.add(&o.read_connection);
        self.point_read.add(&o.point_read);
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn add(counter: &AtomicU64, d: Duration) -> u64 {
    let us = micros(d);
    counter.fetch_add(us, Ordering::Relaxed);
    us
}

impl WaitCounters {
    /// Records one answered write.
    fn write(&self, t: &JobTimes) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let q = add(&self.write_queued_us, t.queued);
        self.write_queued_max_us.fetch_max(q, Ordering::Relaxed);
        let b = add(&self.write_behind_bulk_us, t.behind_bulk);
        if !t.bulk {
            self.queued.observe(t.queued);
            self.behind_bulk.observe(t.behind_bulk);
            self.txn.observe(t.txn);
            self.commit.observe(t.commit);
        }
        if t.queued + t.txn >= SLOW_WRITE {
            self.slow_writes.fetch_add(1, Ordering::Relaxed);
            add(&self.slow_write_queued_us, t.queued);
            add(&self.slow_write_behind_bulk_us, t.behind_bulk);
            add(&self.slow_write_txn_us, t.txn);
            tracing::debug!(
                bulk = t.bulk,
                queued_for_writer_us = q,
                of_which_behind_bulk_us = b,
                own_transaction_us = micros(t.txn),
                of_which_commit_us = micros(t.commit),
                "sqlite: slow write"
            );
        }
    }

    /// Records one committed transaction.
    fn transaction(&self, statements: Duration, commit: Duration, bulk: bool) {
        add(&self.statements_us, statements);
        let c = add(&self.commits_us, commit);
        self.commit_max_us.fetch_max(c, Ordering::Relaxed);
        if bulk {
            self.bulk_jobs.fetch_add(1, Ordering::Relaxed);
            let b = add(&self.bulk_us, statements + commit);
            self.bulk_max_us.fetch_max(b, Ordering::Relaxed);
            self.bulk.observe(statements + commit);
        }
    }

    /// The histograms of writes (the read ones left at zero).
    pub(crate) fn histograms(&self) -> WaitHistograms {
        WaitHistograms {
            write_queued: self.queued.snapshot(),
            write_behind_bulk: self.behind_bulk.snapshot(),
            write_transaction: self.txn.snapshot(),
            write_commit: self.commit.snapshot(),
            bulk_transaction: self.bulk.snapshot(),
            ..WaitHistograms::default()
        }
    }

    pub(crate) fn snapshot(&self) -> SqliteWaits {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SqliteWaits {
            writes: l(&self.writes),
            write_queued_us: l(&self.write_queued_us),
            write_queued_max_us: l(&self.write_queued_max_us),
            write_behind_bulk_us: l(&self.write_behind_bulk_us),
            commit_us: l(&self.commits_us),
            commit_max_us: l(&self.commit_max_us),
            statements_us: l(&self.statements_us),
            bulk_jobs: l(&self.bulk_jobs),
            bulk_us: l(&self.bulk_us),
            bulk_max_us: l(&self.bulk_max_us),
            slow_writes: l(&self.slow_writes),
            slow_write_queued_us: l(&self.slow_write_queued_us),
            slow_write_behind_bulk_us: l(&self.slow_write_behind_bulk_us),
            slow_write_txn_us: l(&self.slow_write_txn_us),
        }
    }
}

/// Where the engine's writes spent their time (ADR-058), all monotonic;
/// times in microseconds. A *slow* write took at least 10 ms from queued
/// to answered; each is also logged at debug level (`sqlite: slow write`)
/// with its own breakdown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqliteWaits {
    /// Writes answered after a commit (every job of every transaction).
    pub writes: u64,
    /// Summed time writes waited for their transaction to begin.
    pub write_queued_us: u64,
    /// Longest such wait.
    pub write_queued_max_us: u64,
    /// Of `write_queued_us`, the part spent behind a bulk (sweep)
    /// transaction.
    pub write_behind_bulk_us: u64,
    /// Summed time in `COMMIT` (the WAL fsync), per transaction.
    pub commit_us: u64,
    /// Longest `COMMIT`.
    pub commit_max_us: u64,
    /// Summed time running transactions' statements, per transaction.
    pub statements_us: u64,
    /// Bulk jobs (sweep stage, unstage, delete chunks) committed.
    pub bulk_jobs: u64,
    /// Summed time of their transactions (statements and commit).
    pub bulk_us: u64,
    /// Longest bulk transaction: the most a write waits behind a sweep.
    pub bulk_max_us: u64,
    /// Writes that took at least 10 ms.
    pub slow_writes: u64,
    /// Of slow writes' time: queued for the writer.
    pub slow_write_queued_us: u64,
    /// Of that: behind a bulk transaction.
    pub slow_write_behind_bulk_us: u64,
    /// Of slow writes' time: their own transaction (statements, commit).
    pub slow_write_txn_us: u64,
}

/// One job's times, as the writer saw them.
struct JobTimes {
    bulk: bool,
    /// Queued until its transaction began.
    queued: Duration,
    /// Of `queued`, overlapping the last bulk transaction.
    behind_bulk: Duration,
    /// Its transaction: begin to commit.
    txn: Duration,
    /// Of `txn`, the `COMMIT`.
    commit: Duration,
}

/// The writer thread's clock state: when the last bulk transaction ran.
#[derive(Default)]
struct Lanes {
    last_bulk: Option<(Instant, Instant)>,
}

impl Lanes {
    /// How much of `[from, to]` overlapped the last bulk transaction.
    fn behind_bulk(&self, from: Instant, to: Instant) -> Duration {
        match self.last_bulk {
            Some((b0, b1)) => to.min(b1).saturating_duration_since(from.max(b0)),
            None => Duration::ZERO,
        }
    }
}

/// Handle to the writer thread. Dropping the last handle closes the channel;
/// the thread finishes the batch in hand and exits, closing the connection.
pub(crate) struct Writer {
    tx: mpsc::Sender<Box<dyn Job>>,
    counters: Arc<Counters>,
}

impl Writer {
    /// The counters, shared (the process-wide list of open databases
    /// keeps a weak reference).
    pub(crate) fn counters_shared(&self) -> &Arc<Counters> {
        &self.counters
    }

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
        self.queue(cost, savepoint, false, f, None)
    }

    /// Queues bulk work (at most [`BULK_ROWS`] rows; in its own savepoint):
    /// it runs in a transaction of its own once the foreground jobs queued
    /// before it have committed (see the module docs). `after` as in
    /// [`submit_then`](Self::submit_then).
    pub(crate) fn submit_bulk<T, F>(
        &self,
        cost: usize,
        f: F,
        after: Option<AfterCommit>,
    ) -> impl Future<Output = Result<T>> + Send + 'static
    where
        T: Send + 'static,
        F: FnMut(&Connection, Timestamp) -> Result<T> + Send + 'static,
    {
        self.queue(cost, true, true, f, after)
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
        self.queue(cost, savepoint, false, f, after)
    }

    fn queue<T, F>(
        &self,
        cost: usize,
        savepoint: bool,
        bulk: bool,
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
            bulk,
            queued_at: Instant::now(),
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

/// The writer thread's loop: a foreground group commit of what is queued,
/// then one bulk job alone, and again (see the module docs).
fn run(conn: Connection, rx: mpsc::Receiver<Box<dyn Job>>, counters: &Counters) {
    tracing::debug!("sqlite writer thread started");
    // Replaces SQLite's automatic checkpoint (ADR-083).
    conn.wal_hook(Some(note_wal_pages));
    let mut last_batch = 1;
    // Set when a COMMIT failed with an I/O error (see the module docs).
    let mut stopped_by: Option<Error> = None;
    let mut bulk: VecDeque<Box<dyn Job>> = VecDeque::new();
    let mut lanes = Lanes::default();
    // No bulk job (or checkpoint) starts before this (`BULK_REST`).
    let mut bulk_after = Instant::now();
    // Whether the store served a request during the last bulk transaction.
    let mut served_last = false;
    loop {
        // Block for work only when no bulk job or checkpoint is waiting its
        // turn; while one rests, wait for foreground work until its turn.
        let waiting = !bulk.is_empty() || (checkpoint_due() && stopped_by.is_none());
        let first = if !waiting {
            match rx.recv() {
                Ok(job) => Some(job),
                Err(_) => break,
            }
        } else {
            match bulk_after.checked_duration_since(Instant::now()) {
                Some(rest) if !rest.is_zero() => match rx.recv_timeout(rest) {
                    Ok(job) => Some(job),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        std::thread::sleep(rest);
                        None
                    }
                },
                _ => rx.try_recv().ok(),
            }
        };
        if let Some(e) = &stopped_by {
            let jobs = first.into_iter().chain(rx.try_iter()).chain(bulk.drain(..));
            fail_all(jobs, e, counters);
            continue;
        }
        let batch = gather(first, &rx, &mut bulk, last_batch);
        if !batch.is_empty() {
            counters.note_served();
            last_batch = batch.len();
            stopped_by = run_batch(&conn, batch, counters, &lanes, false);
        }
        if stopped_by.is_none() && (Instant::now() >= bulk_after || checkpoint_urgent()) {
            let started = Instant::now();
            let ran = if checkpoint_due() {
                checkpoint(&conn, counters);
                true
            } else if !bulk.is_empty() {
                // An idle store's queued bulk jobs share a transaction
                // (ADR-084); a serving store's run one at a time (ADR-058).
                let take = if served_last || counters.served.load(Ordering::Relaxed) {
                    1
                } else {
                    bulk.len().min(IDLE_BULK_JOBS)
                };
                let jobs: VecDeque<_> = bulk.drain(..take).collect();
                stopped_by = run_batch(&conn, jobs, counters, &lanes, true);
                true
            } else {
                false
            };
            if ran {
                let ended = Instant::now();
                lanes.last_bulk = Some((started, ended));
                // Rest only while the store serves requests (ADR-084): an
                // idle store's sweep runs at the writer's speed.
                served_last = counters.served.swap(false, Ordering::Relaxed);
                if served_last {
                    bulk_after = ended + (ended - started) * BULK_REST;
                }
            }
        }
    }
    tracing::debug!("sqlite writer thread exiting");
}

/// The foreground jobs of the next transaction: `first` and what else is
/// queued (see the module docs for the brief wait). Bulk jobs met on the
/// way go to `bulk`, in order.
fn gather(
    first: Option<Box<dyn Job>>,
    rx: &mpsc::Receiver<Box<dyn Job>>,
    bulk: &mut VecDeque<Box<dyn Job>>,
    last_batch: usize,
) -> VecDeque<Box<dyn Job>> {
    let mut batch = VecDeque::with_capacity(last_batch.max(16));
    let mut bytes = 0usize;
    let mut take = |job: Box<dyn Job>, batch: &mut VecDeque<Box<dyn Job>>, bytes: &mut usize| {
        if job.bulk() {
            bulk.push_back(job);
        } else {
            *bytes = bytes.saturating_add(job.cost());
            batch.push_back(job);
        }
    };
    if let Some(job) = first {
        take(job, &mut batch, &mut bytes);
    }
    let deadline = Instant::now() + GATHER_WAIT;
    while batch.len() < MAX_BATCH_JOBS && bytes < MAX_BATCH_BYTES {
        let job = match rx.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Disconnected) => break,
            // Nothing queued. If the previous batch was larger, the
            // writers it answered are probably about to come back:
            // wait (briefly) for them rather than commit a small batch.
            Err(TryRecvError::Empty) if !batch.is_empty() && batch.len() < last_batch => {
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
        take(job, &mut batch, &mut bytes);
    }
    batch
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
    lanes: &Lanes,
    bulk: bool,
) -> Option<Error> {
    while !pending.is_empty() {
        let began = Instant::now();
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
        let applied = Instant::now();
        match commit(conn) {
            Ok(()) => committed(done, counters, lanes, bulk, [began, applied]),
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

/// Counts and times a committed transaction that began and finished its
/// statements at `[began, applied]`, and answers its jobs.
fn committed(
    done: Vec<Box<dyn Job>>,
    counters: &Counters,
    lanes: &Lanes,
    bulk: bool,
    [began, applied]: [Instant; 2],
) {
    let finished = Instant::now();
    let commit = finished.saturating_duration_since(applied);
    counters.commits.fetch_add(1, Ordering::Relaxed);
    counters
        .jobs_committed
        .fetch_add(done.len() as u64, Ordering::Relaxed);
    counters
        .largest_batch
        .fetch_max(done.len() as u64, Ordering::Relaxed);
    counters
        .waits
        .transaction(applied.saturating_duration_since(began), commit, bulk);
    for job in done {
        let queued_at = job.queued_at();
        counters.waits.write(&JobTimes {
            bulk,
            queued: began.saturating_duration_since(queued_at),
            behind_bulk: lanes.behind_bulk(queued_at, began),
            txn: finished.saturating_duration_since(began),
            commit,
        });
        job.complete(Ok(()));
    }
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

#[cfg(test)]
mod lane_tests {
    //! The bulk lane, deterministically: the writer is parked inside a
    //! job while the jobs under test queue up, then released.

    use std::sync::{Arc, Mutex};

    use super::*;

    fn record(
        log: &Arc<Mutex<Vec<&'static str>>>,
        name: &'static str,
    ) -> impl FnMut(&Connection, Timestamp) -> Result<()> + Send + 'static {
        let log = log.clone();
        move |_conn, _now| {
            log.lock().unwrap().push(name);
            Ok(())
        }
    }

    #[tokio::test]
    async fn queued_puts_commit_before_a_bulk_job_and_apart_from_it() {
        let writer = Writer::spawn(Connection::open_in_memory().unwrap()).unwrap();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let parked = writer.submit(0, false, move |_conn, _now| {
            let _ = started_tx.send(());
            let _ = release_rx.recv();
            Ok(())
        });
        started_rx.recv().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        // Queued in this order while the writer is parked.
        let b1 = writer.submit_bulk(0, record(&log, "bulk 1"), None);
        let p1 = writer.submit(0, false, record(&log, "put 1"));
        let b2 = writer.submit_bulk(0, record(&log, "bulk 2"), None);
        let p2 = writer.submit(0, false, record(&log, "put 2"));
        let before = writer.counters().commits.load(Ordering::Relaxed);
        release_tx.send(()).unwrap();
        parked.await.unwrap();
        b1.await.unwrap();
        b2.await.unwrap();
        p1.await.unwrap();
        p2.await.unwrap();
        // The puts first, together; then each bulk job alone.
        assert_eq!(*log.lock().unwrap(), ["put 1", "put 2", "bulk 1", "bulk 2"]);
        let commits = writer.counters().commits.load(Ordering::Relaxed) - before;
        assert_eq!(commits, 4, "parked, the puts, bulk 1, bulk 2");
        let waits = writer.counters().waits.snapshot();
        assert_eq!(waits.bulk_jobs, 2);
        assert_eq!(waits.writes, 5);
        // The histograms: the three foreground jobs' waits, each bulk
        // transaction once.
        let h = writer.counters().waits.histograms();
        for fg in [
            h.write_queued,
            h.write_behind_bulk,
            h.write_transaction,
            h.write_commit,
        ] {
            assert_eq!(fg.count(), 3, "{h:?}");
        }
        assert_eq!(h.bulk_transaction.count(), 2);
        assert_eq!(h.point_read.count(), 0);
    }

    /// ADR-083: a commit does not checkpoint (SQLite's automatic
    /// checkpoint is replaced); the writer checkpoints in the bulk lane
    /// once the WAL has [`CHECKPOINT_PAGES`], so the WAL file stays near
    /// that size however much is written.
    #[tokio::test]
    async fn the_writer_checkpoints_the_wal_in_its_bulk_lane() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        let conn = crate::schema::open_writer(&path, crate::Durability::Normal, None).unwrap();
        let writer = Writer::spawn(conn).unwrap();
        writer
            .submit(0, false, |c, _| {
                c.execute_batch("CREATE TABLE t (b BLOB)").sql()
            })
            .await
            .unwrap();
        // One commit at a time, each a little over 16 pages: ~12,000 pages.
        for _ in 0..720 {
            writer
                .submit(0, false, |c, _| {
                    c.execute("INSERT INTO t VALUES (zeroblob(65536))", [])
                        .sql()
                        .map(drop)
                })
                .await
                .unwrap();
        }
        let checkpoints = writer.counters().checkpoints.load(Ordering::Relaxed);
        assert!(
            checkpoints >= 3,
            "{checkpoints} checkpoints for ~12,000 pages"
        );
        // At most the backstop and the commit that crossed it (a frame is
        // a page and a 24-byte header).
        let wal = std::fs::metadata(dir.path().join("db-wal")).unwrap().len();
        let most = (CHECKPOINT_BACKSTOP as u64 + 64) * (4096 + 24);
        assert!(
            wal <= most,
            "the WAL grew to {wal} bytes (at most {most}): no checkpoint reset it"
        );
    }

    /// Submits a bulk job that notes a served request first when
    /// `serving`, then runs `hold`; returns its completion once it has
    /// started, so jobs queued next are not in its transaction.
    fn start_bulk(
        writer: &Writer,
        serving: bool,
        hold: impl FnOnce() + Send + 'static,
    ) -> impl Future<Output = Result<()>> {
        let counters = writer.counters_shared().clone();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let mut hold = Some(hold);
        let job = writer.submit_bulk(
            0,
            move |_conn, _now| {
                if serving {
                    counters.note_served();
                }
                let _ = started_tx.send(());
                if let Some(hold) = hold.take() {
                    hold();
                }
                Ok(())
            },
            None,
        );
        started_rx.recv().unwrap();
        job
    }

    /// Two bulk jobs in a row, the first running `RAN` and noting a served
    /// request while it runs when `serving`: how long after the first
    /// ended the second began.
    async fn bulk_gap(serving: bool) -> Duration {
        let writer = Writer::spawn(Connection::open_in_memory().unwrap()).unwrap();
        let first_ended = Arc::new(Mutex::new(None));
        let ended = first_ended.clone();
        let b1 = start_bulk(&writer, serving, move || {
            std::thread::sleep(RAN);
            *ended.lock().unwrap() = Some(Instant::now());
        });
        let b2 = writer.submit_bulk(0, |_conn, _now| Ok(Instant::now()), None);
        b1.await.unwrap();
        let second_started = b2.await.unwrap();
        let first_ended = first_ended.lock().unwrap().expect("the first job ran");
        second_started.duration_since(first_ended)
    }

    const RAN: Duration = Duration::from_millis(200);

    /// ADR-084: bulk jobs queued on an idle store share a transaction (at
    /// most `IDLE_BULK_JOBS`); after one during which the store served a
    /// request, the next runs alone.
    #[tokio::test]
    async fn an_idle_stores_queued_bulk_jobs_share_a_transaction() {
        const { assert!(IDLE_BULK_JOBS >= 3) };
        for serving in [false, true] {
            let writer = Writer::spawn(Connection::open_in_memory().unwrap()).unwrap();
            let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
            let parked = start_bulk(&writer, serving, move || {
                let _ = release_rx.recv();
            });
            let log = Arc::new(Mutex::new(Vec::new()));
            let queued: Vec<_> = ["bulk 1", "bulk 2", "bulk 3"]
                .map(|name| writer.submit_bulk(0, record(&log, name), None))
                .into_iter()
                .collect();
            let before = writer.counters().commits.load(Ordering::Relaxed);
            release_tx.send(()).unwrap();
            parked.await.unwrap();
            for q in queued {
                q.await.unwrap();
            }
            assert_eq!(*log.lock().unwrap(), ["bulk 1", "bulk 2", "bulk 3"]);
            let commits = writer.counters().commits.load(Ordering::Relaxed) - before;
            // Idle: the parked job, then the three together. Serving: the
            // next alone (and rested), then the other two together.
            let want = if serving { 3 } else { 2 };
            assert_eq!(commits, want, "serving: {serving}");
        }
    }

    /// ADR-076: after a bulk transaction during which the store served a
    /// request, the writer starts no other bulk job for `BULK_REST` times
    /// as long as that one ran. (A lower bound the writer enforces; a slow
    /// machine only widens the gap.)
    #[tokio::test]
    async fn a_bulk_job_waits_as_long_as_the_last_one_ran_while_the_store_serves() {
        const { assert!(BULK_REST >= 1, "bulk jobs rest") };
        let gap = bulk_gap(true).await;
        assert!(
            gap >= RAN * BULK_REST,
            "the second bulk job began {gap:?} after the first"
        );
    }

    /// ADR-084: on a store that served nothing meanwhile the next bulk job
    /// runs at once (the bound is the rest it would otherwise take).
    #[tokio::test]
    async fn an_idle_stores_bulk_jobs_do_not_rest() {
        let gap = bulk_gap(false).await;
        assert!(
            gap < RAN * BULK_REST,
            "the second bulk job rested {gap:?} on an idle store"
        );
    }

    #[test]
    fn a_wait_falls_into_the_first_bucket_whose_bound_it_does_not_pass() {
        let h = AtomicHistogram::default();
        h.observe(Duration::from_micros(0));
        h.observe(Duration::from_micros(100)); // bounds are inclusive
        h.observe(Duration::from_micros(101));
        h.observe(Duration::from_secs(60)); // beyond every bound
        let s = h.snapshot();
        assert_eq!(s.counts[0], 2);
        assert_eq!(s.counts[1], 1);
        assert_eq!(s.counts[WAIT_BUCKETS_US.len()], 1);
        assert_eq!(s.count(), 4);
        assert_eq!(s.sum_us, 60_000_201);
        let mut twice = s;
        twice.add(&s);
        assert_eq!(twice.count(), 8);
        assert_eq!(twice.sum_us, 2 * s.sum_us);
    }
}
