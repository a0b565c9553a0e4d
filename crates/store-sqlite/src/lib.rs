//! SQLite kv engine for Blobpool (rusqlite, WAL).
//!
//! [`SqliteEngine`] stores whole small blobs as rows of one embedded SQLite
//! file and implements [`store_types::Engine`] and [`store_types::KvEngine`].
//! It is also a member of the GC state seam (ADR-012 §5, row "sqlite"): it
//! hosts the durable delete window `gc_window` and nothing else — no pin
//! clauses, no sweep lock.
//!
//! # Layout
//!
//! ```sql
//! CREATE TABLE schema_version (version INTEGER NOT NULL PRIMARY KEY,
//!                              applied_at INTEGER NOT NULL);      -- unix ms
//! -- v2 (v1 had the same columns in a WITHOUT ROWID table keyed by
//! -- (ns, digest); opening a v1 file rebuilds it in place, data kept)
//! CREATE TABLE entries (
//!     id         INTEGER PRIMARY KEY,
//!     ns         TEXT    NOT NULL,
//!     digest     BLOB    NOT NULL CHECK (length(digest) = 32),
//!     size       INTEGER NOT NULL,
//!     created_at INTEGER NOT NULL,                               -- unix ms
//!     content    BLOB    NOT NULL,
//!     UNIQUE (ns, digest)
//! );
//! -- v3: named references (KvEngine::refs; see the `refs` module)
//! CREATE TABLE refs (namespace TEXT NOT NULL, name TEXT NOT NULL,
//!     digest BLOB NOT NULL CHECK (length(digest) = 32),
//!     updated_at INTEGER NOT NULL,                                -- unix ms
//!     PRIMARY KEY (namespace, name)) WITHOUT ROWID;
//! CREATE INDEX refs_by_digest ON refs (namespace, digest);
//! CREATE TABLE ref_namespaces (namespace TEXT PRIMARY KEY,
//!     since INTEGER NOT NULL) WITHOUT ROWID;                      -- unix ms
//! -- v4: cache keys (KvEngine::cache, ADR-048; see the `cache_keys` module)
//! CREATE TABLE cache_keys (namespace TEXT NOT NULL, key TEXT NOT NULL,
//!     digest BLOB NOT NULL CHECK (length(digest) = 32), size INTEGER NOT NULL,
//!     accessed_at INTEGER NOT NULL,                               -- unix ms
//!     PRIMARY KEY (namespace, key)) WITHOUT ROWID;
//! CREATE INDEX cache_keys_by_digest ON cache_keys (namespace, digest);
//! CREATE INDEX cache_keys_by_access ON cache_keys (namespace, accessed_at);
//! -- v5: owners (issue 39): the author that wrote the digest, NULL for the
//! -- library (and for every row older than v5)
//! ALTER TABLE refs ADD COLUMN owner TEXT;
//! ALTER TABLE cache_keys ADD COLUMN owner TEXT;
//! -- created by GcSchema::ensure_gc_schema only
//! CREATE TABLE gc_window (ns TEXT NOT NULL, digest BLOB NOT NULL,
//!     size INTEGER NOT NULL, visible_after INTEGER NOT NULL,      -- unix ms
//!     PRIMARY KEY (ns, digest)) WITHOUT ROWID;
//! ```
//!
//! `entries` is a rowid table with `(ns, digest)` as a separate unique
//! index, and `content` is its last column. Rows larger than a page spill
//! their content onto overflow pages; neither b-tree ever compares against
//! that content: the index holds only `(ns, digest, rowid)` (so `has_many`
//! and `namespaces` are answered from it alone and `scan` walks it in
//! digest order), and the table is searched by rowid. Metadata reads
//! (`meta`, `scan`'s sizes) stop in a row's local prefix, before the
//! overflow pages. (Schema v1 was `WITHOUT ROWID` with the content inline:
//! there every b-tree comparison against a row whose content overflowed
//! read the whole content, which slowed lookups and inserts by one to two
//! orders of magnitude on tables holding rows above ~1 KiB.) `gc_window`
//! rows are small and stay `WITHOUT ROWID`.
//!
//! Migrations are numbered; [`SqliteEngine::open`] applies the
//! missing ones under `BEGIN IMMEDIATE`, so opening a file twice (or from
//! two processes at once) is harmless, and a file newer than the build is
//! refused.
//!
//! # Instance lock
//!
//! A non-fleet store holds the database exclusively
//! (`Engine::lock_instance`): an exclusive `flock` on `<db file>.lock`
//! beside it, naming the holder; a second non-fleet store on the same file
//! fails to build (see the `instance_lock` module).
//!
//! # Threading
//!
//! The engine never blocks the async runtime:
//!
//! - **Writes** (`put`, `delete_many`, window `stage`/`unstage`, reference
//!   `set`/`delete`, schema changes) go over a channel to one dedicated
//!   writer thread owning the only write connection. It **group-commits**: it drains every queued
//!   write (up to 1000, or 64 MiB of payload) into one transaction, commits,
//!   and only then answers each waiter. (When the previous batch was larger
//!   than what is queued now, it first waits up to 200 µs for the writers it
//!   just answered; a lone writer never waits.) Each job that may run several
//!   statements gets its own savepoint, so one failing job does not fail its
//!   batch neighbours (details in the `writer` module).
//! - **Reads** (`meta`, `read`, `has_many`, `scan`, window and reference
//!   queries) run with one of [`SqliteOptions::readers`] connections. A
//!   point read first tries the calling thread, through a VFS that refuses
//!   to wait for the disk (the `nowait` module, ADR-055): it answers there
//!   when every page it reads is in memory, and otherwise runs again on
//!   tokio's blocking pool, where every other read runs
//!   ([`SqliteEngine::read_path`] counts which). In WAL mode reads never
//!   wait for the writer, and since a write is acknowledged only after its
//!   commit, every read that starts after an acknowledged write sees it.
//!
//! # Durability
//!
//! WAL journal. [`Durability::Full`] (default) is `synchronous=FULL`: a
//! commit fsyncs the WAL, so an acknowledged write survives power loss.
//! [`Durability::Normal`] is `synchronous=NORMAL`: an acknowledged write
//! survives a process crash but the last commits may be lost on power loss
//! or an OS crash (a suffix of them; the file is never corrupted and no
//! write is half-applied). Either way the engine describes itself as
//! `durable` (the descriptor's definition is "survives a process crash").
//!
//! After a commit fails with an I/O error (a failed WAL fsync), the
//! transaction's outcome is unknown until the file is opened again, so the
//! engine refuses every further write (reads keep working); reopen it.
//!
//! These promises are checked at every durability point by the crash model
//! (feature `crash-model`, module `crash`; ADR-029 "## SQLite").

#![warn(missing_docs)]

#[macro_use]
mod vfs_forward;

mod cache;
mod cache_keys;
#[cfg(feature = "crash-model")]
pub mod crash;
mod engine;
mod error;
mod instance_lock;
mod nowait;
mod reader;
mod refs;
mod registration;
mod schema;
mod sql;
#[cfg(feature = "testing")]
mod testing;
mod window;
mod writer;

#[cfg(test)]
mod cache_tests;
#[cfg(all(test, target_os = "linux"))]
mod nowait_tests;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use store_types::{Error, Result};

use crate::cache::HotCache;
use crate::reader::{ReadPathStats, Readers};
use crate::writer::{Counters, Writer};

pub use crate::registration::REGISTRATION;
pub use crate::schema::{page_cache_shared, SCHEMA_VERSION};
pub use crate::writer::{SqliteWaits, WaitHistogram, WaitHistograms, WAIT_BUCKETS_US};

/// Largest blob a put accepts: SQLite's default `SQLITE_MAX_LENGTH`.
pub const MAX_BLOB_LEN: u64 = 1_000_000_000;

/// How hard a commit works to survive a crash.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=FULL`: every commit is fsynced; survives power loss.
    #[default]
    Full,
    /// `synchronous=NORMAL`: survives a process crash; the WAL is fsynced
    /// only at checkpoints, so power loss may lose the last commits.
    Normal,
}

/// How to open a [`SqliteEngine`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteOptions {
    /// Commit durability. Default [`Durability::Full`].
    pub durability: Durability,
    /// Number of read connections (0 is treated as 1). Default 4.
    pub readers: usize,
    /// The name of a registered SQLite VFS every connection of the engine
    /// (writer and readers) opens the file with; `None` (default) is
    /// SQLite's default VFS. The crash model's tests set it to
    /// `store_sqlite::crash::CrashModel::vfs_name` (feature `crash-model`).
    pub vfs: Option<String>,
    /// Capacity in bytes of the hot-entry cache (TUNING.md §sqlite-hot-cache): entries read
    /// recently (each at most 256 KiB and 1/16 of the capacity) are
    /// answered by `read`, `meta` and `has_many` without a hand-off to the
    /// blocking pool. 0 turns it off. Default [`DEFAULT_CACHE_BYTES`].
    ///
    /// Invalidation is exact within the process (see the `cache` module);
    /// turn it off for an engine opened *without* a store when another
    /// process may delete rows of the same file (a store's instance lock
    /// rules that out).
    pub cache_bytes: u64,
}

/// Default [`SqliteOptions::cache_bytes`]: 32 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 32 * 1024 * 1024;

impl Default for SqliteOptions {
    fn default() -> Self {
        SqliteOptions {
            durability: Durability::Full,
            readers: 4,
            vfs: None,
            cache_bytes: DEFAULT_CACHE_BYTES,
        }
    }
}

/// Counters of the writer thread, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SqliteStats {
    /// Write commands handed to the writer thread.
    pub writes_submitted: u64,
    /// Write transactions committed.
    pub commits: u64,
    /// Write commands (puts, deletes, window ops, ...) acknowledged as
    /// committed.
    pub writes_committed: u64,
    /// Write commands answered with an error.
    pub writes_failed: u64,
    /// Most commands committed by one transaction so far.
    pub largest_batch: u64,
    /// Transactions SQLite rolled back as a whole after an error (their
    /// surviving commands were re-run in a new transaction).
    pub lost_transactions: u64,
    /// WAL checkpoints the writer ran in its bulk lane (ADR-083).
    pub checkpoints: u64,
}

/// The SQLite kv engine. Cheap to clone: clones share the writer thread and
/// the read connections. The writer thread stops when the last clone is
/// dropped (after finishing the batch in hand).
#[derive(Clone)]
pub struct SqliteEngine {
    inner: Arc<Inner>,
}

struct Inner {
    /// Canonical path of the database file.
    path: PathBuf,
    durability: Durability,
    writer: Writer,
    readers: Arc<Readers>,
    cache: Arc<HotCache>,
}

impl std::fmt::Debug for SqliteEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteEngine")
            .field("path", &self.inner.path)
            .field("durability", &self.inner.durability)
            .finish_non_exhaustive()
    }
}

impl SqliteEngine {
    /// Opens (creating if needed) the database file at `path`.
    ///
    /// Creates missing parent directories, switches the file to WAL, applies
    /// the durability setting, runs the pending migrations, opens the read
    /// connections and starts the writer thread. The blocking work runs on
    /// the blocking pool.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] for `:memory:` or an empty path (every connection
    /// must see the same file), a file that cannot use WAL, or a schema newer
    /// than this build; [`Error::Io`] / [`Error::Backend`] when the file
    /// cannot be created or read.
    pub async fn open(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        tokio::task::spawn_blocking(move || Self::open_blocking(&path, options))
            .await
            .map_err(|e| {
                Error::backend(store_types::ErrorKind::Other, "sqlite: run open task")
                    .with_source(e)
            })?
    }

    fn open_blocking(path: &Path, options: SqliteOptions) -> Result<Self> {
        if path.as_os_str().is_empty() || path.as_os_str() == ":memory:" {
            return Err(Error::Config(
                "sqlite: the engine needs a database file path (not :memory: or empty)".into(),
            ));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::from_io("sqlite: create directory", e).with_path(parent))?;
        }
        let vfs = options.vfs.as_deref();
        let writer_conn = schema::open_writer(path, options.durability, vfs)?;
        let canonical = std::fs::canonicalize(path)
            .map_err(|e| Error::from_io("sqlite: resolve path", e).with_path(path))?;
        let mut inline = true;
        let readers = (0..options.readers.max(1))
            .map(|_| {
                let (conn, nowait) = schema::open_reader(&canonical, vfs)?;
                inline &= nowait;
                Ok(conn)
            })
            .collect::<Result<Vec<_>>>()?;
        let writer = Writer::spawn(writer_conn)?;
        let cache = HotCache::register(&canonical, options.cache_bytes);
        tracing::debug!(path = %canonical.display(), ?options, "sqlite engine opened");
        let readers = Readers::new(readers, inline);
        register_open(&canonical, writer.counters_shared(), readers.stats());
        Ok(SqliteEngine {
            inner: Arc::new(Inner {
                path: canonical,
                durability: options.durability,
                writer,
                readers,
                cache,
            }),
        })
    }

    /// The canonical path of the database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The durability the engine was opened with.
    pub fn durability(&self) -> Durability {
        self.inner.durability
    }

    /// The schema version recorded in the file (equals [`SCHEMA_VERSION`]
    /// once opened).
    pub async fn schema_version(&self) -> Result<i64> {
        self.inner.readers.run(schema::schema_version).await
    }

    /// Entries and bytes (content plus a fixed per-entry overhead) the
    /// hot-entry cache holds now.
    pub fn cache_usage(&self) -> (usize, u64) {
        self.inner.cache.usage()
    }

    /// A snapshot of the writer thread's counters.
    pub fn stats(&self) -> SqliteStats {
        let c = self.inner.writer.counters();
        SqliteStats {
            writes_submitted: c.submitted.load(Ordering::Relaxed),
            commits: c.commits.load(Ordering::Relaxed),
            writes_committed: c.jobs_committed.load(Ordering::Relaxed),
            writes_failed: c.jobs_failed.load(Ordering::Relaxed),
            largest_batch: c.largest_batch.load(Ordering::Relaxed),
            lost_transactions: c.lost_transactions.load(Ordering::Relaxed),
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
        }
    }

    /// How the engine's point reads were answered so far (ADR-055).
    pub fn read_path(&self) -> ReadPath {
        read_path_of(self.inner.readers.stats())
    }

    /// Where the engine's writes and reads waited so far, as histograms
    /// (ADR-058, ADR-073).
    pub fn wait_histograms(&self) -> WaitHistograms {
        histograms_of(self.inner.writer.counters(), self.inner.readers.stats())
    }
}

fn read_path_of(s: &ReadPathStats) -> ReadPath {
    ReadPath {
        inline: s.inline.load(Ordering::Relaxed),
        fell_back: s.fell_back.load(Ordering::Relaxed),
        pooled: s.pooled.load(Ordering::Relaxed),
    }
}

fn histograms_of(writes: &Counters, reads: &ReadPathStats) -> WaitHistograms {
    WaitHistograms {
        read_connection: reads.connection.snapshot(),
        point_read: reads.point.snapshot(),
        ..writes.waits.histograms()
    }
}

/// An engine of this process, for [`open_databases`]: its file and its
/// counters, weakly (they go with the engine).
struct Registered {
    path: PathBuf,
    writes: Weak<Counters>,
    reads: Weak<ReadPathStats>,
}

/// Every engine opened in this process and not yet dropped.
static OPEN: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

fn register_open(path: &Path, writes: &Arc<Counters>, reads: &Arc<ReadPathStats>) {
    let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
    open.retain(|r| r.writes.strong_count() > 0);
    open.push(Registered {
        path: path.to_path_buf(),
        writes: Arc::downgrade(writes),
        reads: Arc::downgrade(reads),
    });
}

/// Where one database file's writes and reads waited, summed over the
/// engines of this process open on it ([`open_databases`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatabaseWaits {
    /// The canonical path of the database file.
    pub path: PathBuf,
    /// Where its writes and reads waited ([`SqliteEngine::wait_histograms`]).
    pub histograms: WaitHistograms,
    /// How its point reads were answered ([`SqliteEngine::read_path`]).
    pub read_path: ReadPath,
    /// Its writes of 10 ms or more ([`SqliteWaits::slow_writes`]).
    pub slow_writes: u64,
}

/// Every database file an engine of this process has open (in path order),
/// with where its writes and reads waited since (ADR-073). `blobpool
/// serve` exports it on `/metrics`; the engines themselves need not be at
/// hand. Cheap: a few hundred atomic loads per engine.
pub fn open_databases() -> Vec<DatabaseWaits> {
    let open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
    let mut by_path: std::collections::BTreeMap<&Path, DatabaseWaits> = Default::default();
    for r in open.iter() {
        let (Some(writes), Some(reads)) = (r.writes.upgrade(), r.reads.upgrade()) else {
            continue;
        };
        let d = by_path.entry(&r.path).or_insert_with(|| DatabaseWaits {
            path: r.path.clone(),
            histograms: WaitHistograms::default(),
            read_path: ReadPath::default(),
            slow_writes: 0,
        });
        d.histograms.add(&histograms_of(&writes, &reads));
        let p = read_path_of(&reads);
        d.read_path.inline += p.inline;
        d.read_path.fell_back += p.fell_back;
        d.read_path.pooled += p.pooled;
        d.slow_writes += writes.waits.slow_writes.load(Ordering::Relaxed);
    }
    by_path.into_values().collect()
}

/// How point reads (`read`, `meta`, a short `has_many`, reference and
/// cache-key lookups) were answered, for tests and metrics (ADR-055).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadPath {
    /// Answered on the calling thread: every page was in memory.
    pub inline: u64,
    /// Tried on the calling thread, would have waited for the disk, so run
    /// again where it may wait.
    pub fell_back: u64,
    /// Queries run where they may wait: on the blocking pool, or on a
    /// multi-thread runtime in place (`block_in_place`); fallbacks included.
    pub pooled: u64,
}
