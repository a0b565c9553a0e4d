//! Connections, pragmas and the schema: the versioned migrations of the
//! entries table and the GC window table created on demand.

use std::path::Path;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode, OpenFlags};
use store_types::{Error, Result, Timestamp};

use crate::error::{sql_err, SqlResultExt};
use crate::nowait;
use crate::Durability;

/// How long a connection waits for another connection's lock (another
/// process holding the write lock, a concurrent migration) before failing.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Prepared statements each connection keeps compiled.
const STATEMENT_CACHE: usize = 64;

/// The writer connection's page cache, in KiB (SQLite's default size,
/// ADR-078). Every write transaction that rebalances a b-tree parks a page
/// at SQLite's pending-byte page number (page 262,145 with 4 KiB pages),
/// and the commit then walks the whole cache to drop pages past the end
/// of a file smaller than 1 GiB: the larger the cache, the longer every
/// commit takes. A bound of this connection's own only when the page cache
/// is not shared ([`page_cache_shared`], ADR-082).
const WRITER_CACHE_KIB: i64 = 2 * 1024;

/// Whether the linked SQLite keeps every connection of the process in one
/// page-cache group (compiled with `SQLITE_ENABLE_MEMORY_MANAGEMENT`, as
/// libsqlite3-sys builds its bundled copy unless `LIBSQLITE3_FLAGS` says
/// `-USQLITE_ENABLE_MEMORY_MANAGEMENT`; ADR-082). Then `cache_size` bounds
/// only the group's total, so the writer's cache outgrows its 2 MiB
/// (ADR-078), and the page walk of its commits holds the one mutex every
/// reader's page fetch takes.
pub fn page_cache_shared() -> bool {
    static SHARED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SHARED.get_or_init(|| {
        let used = Connection::open_in_memory().and_then(|c| {
            c.query_row(
                "SELECT sqlite_compileoption_used('ENABLE_MEMORY_MANAGEMENT')",
                [],
                |r| r.get::<_, bool>(0),
            )
        });
        // Unknown counts as shared: the warning is then a false alarm,
        // never a missed one.
        used.unwrap_or(true)
    })
}

/// Warns once per process when the page cache is shared (ADR-082).
fn warn_if_page_cache_shared() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if page_cache_shared() {
        WARNED.call_once(|| {
            tracing::warn!(
                "sqlite: this build shares one page cache between all connections \
                 (SQLITE_ENABLE_MEMORY_MANAGEMENT); reads and the writer contend on its \
                 mutex. Build with LIBSQLITE3_FLAGS=-USQLITE_ENABLE_MEMORY_MANAGEMENT \
                 (ADR-082)"
            );
        });
    }
}

/// Each reader connection's page cache, in KiB (ADR-055): the b-tree's
/// inner pages between two commits (a reader's cache is emptied whenever
/// another connection has committed since its last read).
const READER_CACHE_KIB: i64 = 8 * 1024;

/// Version 1: the entries table as first shipped (superseded by v2).
///
/// `WITHOUT ROWID` clustered the rows by `(ns, digest)` with `content`
/// inline. That made every b-tree comparison against a row whose content
/// spills onto overflow pages read the whole content (SQLite compares the
/// full record of a `WITHOUT ROWID` cell), so lookups and inserts slowed
/// down by one to two orders of magnitude once rows above ~1 KiB were
/// stored. Kept as the first step so that every file, new or old, reaches
/// the current layout through the same migrations.
const V1_ENTRIES: &str = "
CREATE TABLE entries (
    ns         TEXT    NOT NULL,
    digest     BLOB    NOT NULL CHECK (length(digest) = 32),
    size       INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content    BLOB    NOT NULL,
    PRIMARY KEY (ns, digest)
) WITHOUT ROWID;
";

/// Version 2: `entries` becomes a rowid table with a separate unique index
/// on `(ns, digest)`, rebuilt in place (data kept).
///
/// The index holds only `(ns, digest, rowid)`: `has_many` and
/// `namespaces` never leave it, `scan` walks it in digest order, and its
/// comparisons never meet content. `meta`, `read` and `scan` (for `size`)
/// follow the rowid into the table, whose interior pages are keyed by the
/// integer rowid alone, so that descent never reads a row's payload
/// either. `content` stays the last column, so reading
/// `size`/`created_at` stops in the row's local prefix and does not read
/// the overflow pages of a large content. New rows get increasing rowids,
/// so puts append to the table instead of splitting random leaves.
///
/// The migration is SQLite's table-rebuild procedure (create the new
/// table, copy, drop the old one, rename), which runs inside the
/// migration transaction like every step: a crash or a failure leaves the
/// v1 table as it was. Opening a v1 file therefore rewrites every row
/// once, taking time and temporary WAL space proportional to the file.
const V2_ENTRIES_ROWID: &str = "
CREATE TABLE entries_v2 (
    id         INTEGER PRIMARY KEY,
    ns         TEXT    NOT NULL,
    digest     BLOB    NOT NULL CHECK (length(digest) = 32),
    size       INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content    BLOB    NOT NULL,
    CONSTRAINT entries_key UNIQUE (ns, digest)
);
INSERT INTO entries_v2 (ns, digest, size, created_at, content)
    SELECT ns, digest, size, created_at, content FROM entries ORDER BY ns, digest;
DROP TABLE entries;
ALTER TABLE entries_v2 RENAME TO entries;
";

/// Version 3: named references (ADR-024, see the `refs` module).
///
/// `refs` maps `(namespace, name)` to a digest stored like `entries.digest`
/// (the 32 raw bytes); names compare with the default `BINARY` collation,
/// i.e. in byte order, which is the order `list` promises. The
/// `(namespace, digest)` index answers `referenced`. `ref_namespaces`
/// records every namespace that ever had a reference (never pruned). Both
/// tables are `WITHOUT ROWID`: small rows clustered by their key (which
/// also makes the `TEXT PRIMARY KEY` of `ref_namespaces` NOT NULL).
const V3_REFS: &str = "
CREATE TABLE refs (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    digest     BLOB    NOT NULL CHECK (length(digest) = 32),
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
CREATE INDEX refs_by_digest ON refs (namespace, digest);
CREATE TABLE ref_namespaces (
    namespace TEXT    PRIMARY KEY,
    since     INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Version 4: cache keys (ADR-048, see the `cache_keys` module):
/// `(namespace, key) → digest` with the entry's size and the last access
/// (milliseconds, the store's clock). The `(namespace, digest)` index
/// answers `cached` and `touch`; `(namespace, accessed_at)` orders `oldest`.
const V4_CACHE_KEYS: &str = "
CREATE TABLE cache_keys (
    namespace   TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    digest      BLOB    NOT NULL CHECK (length(digest) = 32),
    size        INTEGER NOT NULL,
    accessed_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
CREATE INDEX cache_keys_by_digest ON cache_keys (namespace, digest);
CREATE INDEX cache_keys_by_access ON cache_keys (namespace, accessed_at);
";

/// Version 5: owners (issue 39, ADR-052). `refs.owner` and
/// `cache_keys.owner` hold the name of the author that wrote the row's
/// digest (an identity), or NULL for the embedding application. Rows that
/// existed before this version get NULL, i.e. they count as the library's:
/// an author who may replace only its own rows (`Replace::Own`, the
/// `write` scope) cannot replace or remove them; only `Replace::Any` (the
/// `delete` scope, or the library) can. Adding a nullable column without a
/// default rewrites nothing (the rows are read as NULL), so the step is
/// instant on any file.
const V5_OWNERS: &str = "
ALTER TABLE refs ADD COLUMN owner TEXT;
ALTER TABLE cache_keys ADD COLUMN owner TEXT;
";

/// The migrations, in order. Each runs once, in the same transaction as the
/// `schema_version` row recording it.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, V1_ENTRIES),
    (2, V2_ENTRIES_ROWID),
    (3, V3_REFS),
    (4, V4_CACHE_KEYS),
    (5, V5_OWNERS),
];

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// The GC delete window (ADR-012 §5: the only GC table sqlite hosts).
pub(crate) const GC_WINDOW_DDL: &str = "
CREATE TABLE IF NOT EXISTS gc_window (
    ns            TEXT    NOT NULL,
    digest        BLOB    NOT NULL,
    size          INTEGER NOT NULL,
    visible_after INTEGER NOT NULL,
    PRIMARY KEY (ns, digest)
) WITHOUT ROWID;
";

/// Opens one connection to `path` with the common settings, through the
/// VFS named `vfs` (`None`: SQLite's default). No URI interpretation: the
/// path is a file name.
fn open_connection(path: &Path, flags: OpenFlags, vfs: Option<&str>) -> Result<Connection> {
    let conn = match vfs {
        None => Connection::open_with_flags(path, flags),
        Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs),
    }
    .sql()?;
    // First, before any statement that may touch the file's locks (schema
    // reads, the WAL switch, the migration's BEGIN IMMEDIATE).
    conn.busy_timeout(BUSY_TIMEOUT).sql()?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.pragma_update(None, "temp_store", "MEMORY").sql()?;
    Ok(conn)
}

/// Opens the writer connection: creates the file, switches it to WAL,
/// applies the durability setting and runs the migrations.
pub(crate) fn open_writer(
    path: &Path,
    durability: Durability,
    vfs: Option<&str>,
) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    warn_if_page_cache_shared();
    let mut conn = open_connection(path, flags, vfs)?;
    switch_to_wal(&conn, path)?;
    let sync = match durability {
        Durability::Full => "FULL",
        Durability::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync).sql()?;
    // Keep the WAL file from staying huge after a burst of large puts.
    conn.pragma_update(None, "journal_size_limit", 64 * 1024 * 1024)
        .sql()?;
    conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
        .sql()?;
    migrate(&mut conn)?;
    Ok(conn)
}

/// Switches the file of `conn` to WAL, waiting (up to [`BUSY_TIMEOUT`])
/// for openers that hold a conflicting lock.
///
/// `busy_timeout` alone does not cover this: `PRAGMA journal_mode=WAL` on
/// a file not yet in WAL first takes a read lock to look at the header,
/// then upgrades it to a write lock to rewrite it. When two connections
/// (threads or processes opening a fresh file together) both hold the read
/// lock, the one whose upgrade conflicts gets `SQLITE_BUSY` at once: SQLite
/// never calls the busy handler for a read-to-write upgrade, since waiting
/// could deadlock. It only has to try again with no lock held, so we
/// retry with a capped exponential backoff. A retry normally finds the
/// file already in WAL (the winner switched it) and succeeds without
/// taking the write lock.
fn switch_to_wal(conn: &Connection, path: &Path) -> Result<()> {
    const FIRST_PAUSE: Duration = Duration::from_millis(1);
    const MAX_PAUSE: Duration = Duration::from_millis(50);
    let deadline = Instant::now() + BUSY_TIMEOUT;
    let mut pause = FIRST_PAUSE;
    let mut retries = 0u32;
    let mode: String = loop {
        match conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0)) {
            Ok(mode) => break mode,
            Err(e) if is_busy(&e) && Instant::now() + pause < deadline => {
                retries += 1;
                std::thread::sleep(pause);
                pause = (pause * 2).min(MAX_PAUSE);
            }
            Err(e) => return Err(sql_err(e)),
        }
    };
    if retries > 0 {
        tracing::debug!(retries, "sqlite: WAL switch waited for concurrent openers");
    }
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::Config(format!(
            "sqlite: {} cannot use WAL mode (journal_mode is {mode})",
            path.display()
        )));
    }
    Ok(())
}

/// Whether `e` says another connection holds a conflicting lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Opens a read connection (`query_only`, so a bug cannot write through it)
/// through the VFS named `vfs`, or when `None` through the no-wait VFS
/// (ADR-055) where there is one. The second value says whether the
/// connection can run [`nowait::attempt`]s: only through the no-wait VFS,
/// with SQLite's memory-mapped reads off (a mapped page could fault) and a
/// busy handler that does not sleep inside an attempt.
pub(crate) fn open_reader(path: &Path, vfs: Option<&str>) -> Result<(Connection, bool)> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let nowait = match vfs {
        Some(_) => None,
        None => nowait::name(),
    };
    let conn = open_connection(path, flags, vfs.or(nowait))?;
    conn.busy_handler(Some(reader_busy)).sql()?;
    conn.pragma_update(None, "mmap_size", 0).sql()?;
    conn.pragma_update(None, "query_only", true).sql()?;
    conn.pragma_update(None, "cache_size", -READER_CACHE_KIB)
        .sql()?;
    Ok((conn, nowait.is_some()))
}

/// A reader's busy handler: [`BUSY_TIMEOUT`], but never a sleep inside a
/// no-wait attempt.
fn reader_busy(count: i32) -> bool {
    nowait::busy(count, BUSY_TIMEOUT)
}

/// Brings the schema to [`SCHEMA_VERSION`]; returns the version found
/// before migrating (0 for a new file).
///
/// Idempotent and safe against concurrent openers: everything, including
/// creating `schema_version`, runs under `BEGIN IMMEDIATE`, so a second
/// process waits for the first and then finds nothing to do. A file whose
/// version is newer than this build is refused with [`Error::Config`]
/// rather than guessed at.
pub(crate) fn migrate(conn: &mut Connection) -> Result<i64> {
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .sql()?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    INTEGER NOT NULL PRIMARY KEY,
             applied_at INTEGER NOT NULL
         );",
    )
    .sql()?;
    let found: i64 = tx
        .query_row(
            "SELECT coalesce(max(version), 0) FROM schema_version",
            [],
            |r| r.get(0),
        )
        .sql()?;
    if found > SCHEMA_VERSION {
        return Err(Error::Config(format!(
            "sqlite: database schema version {found} is newer than this build supports \
             ({SCHEMA_VERSION})"
        )));
    }
    for &(version, ddl) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        tx.execute_batch(ddl).sql()?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            (version, Timestamp::now().0),
        )
        .sql()?;
        tracing::info!(version, "sqlite: applied schema migration");
    }
    tx.commit().sql()?;
    Ok(found)
}

/// The schema version recorded in the file.
pub(crate) fn schema_version(conn: &Connection) -> Result<i64> {
    conn.prepare_cached("SELECT coalesce(max(version), 0) FROM schema_version")
        .sql()?
        .query_row([], |r| r.get(0))
        .sql()
}

/// Names of the existing tables whose name starts with `gc_`, sorted.
pub(crate) fn gc_tables(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT name FROM sqlite_schema
             WHERE type = 'table' AND substr(name, 1, 3) = 'gc_'
             ORDER BY name",
        )
        .sql()?;
    let names = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .sql()?
        .collect::<rusqlite::Result<Vec<_>>>()
        .sql()?;
    Ok(names)
}
