//! The machine's limits: the least work any implementation of an operation
//! must do, done directly (no facade, no engine, no async hop).
//!
//! - BLAKE3 of the bytes in memory: the ceiling of every put and verified
//!   get (both hash every byte);
//! - [`RawFs`]: write + fsync + rename to a fresh name (never onto an
//!   existing file: that triggers ext4 `auto_da_alloc` flushes), and a plain
//!   file read — the ceilings of the local engine;
//! - [`RawSqlite`]: one `INSERT` per transaction / one point `SELECT` of the
//!   same row, WAL, same `synchronous` — the ceilings of the SQLite engine;
//! - [`RawPg`]: one bytea `INSERT` per transaction / one `SELECT`, and
//!   `lo_from_bytea` / `lo_get` — the ceilings of the PostgreSQL tiers.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension};
use sqlx::postgres::types::Oid;
use store_pg::plumbing::sql;
use store_sqlite::Durability;

use crate::data::unique;
use crate::fixtures::{err, BenchResult, PgScope};

/// BLAKE3 of `bytes`, one thread, as the facade hashes (`Hasher::update`).
pub fn blake3(bytes: &[u8]) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    h.update(bytes);
    h.finalize()
}

/// A fresh 32-byte key (the raw ceilings do not hash: hashing is its own
/// limit).
pub fn fresh_key() -> [u8; 32] {
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&unique().to_le_bytes());
    crate::data::fill_random(&mut k[8..], unique());
    k
}

/// Raw file writes and reads in one directory.
pub struct RawFs {
    dir: PathBuf,
}

impl RawFs {
    /// Uses (and creates) `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(RawFs { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `bytes` to a fresh temporary name, `fdatasync`s it when
    /// `fsync`, and renames it to a fresh final name, which it returns.
    pub fn put(&self, bytes: &[u8], fsync: bool) -> io::Result<PathBuf> {
        let n = unique();
        let tmp = self.dir.join(format!("tmp-{n}"));
        let dst = self.dir.join(format!("obj-{n}"));
        let mut f = File::create_new(&tmp)?;
        f.write_all(bytes)?;
        if fsync {
            f.sync_data()?;
        }
        drop(f);
        std::fs::rename(&tmp, &dst)?;
        Ok(dst)
    }

    /// Reads a whole file.
    pub fn get(path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    /// Reads `len` bytes at `offset` (open + pread).
    pub fn read_range(path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let f = File::open(path)?;
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, offset)?;
        Ok(buf)
    }

    /// Whether each path exists (one `stat` each).
    pub fn exists_many(paths: &[PathBuf]) -> Vec<bool> {
        paths.iter().map(|p| std::fs::metadata(p).is_ok()).collect()
    }
}

/// The entries table of the SQLite engine, as its current schema (v2)
/// leaves it: a rowid table with `(ns, digest)` a separate unique index and
/// `content` the last column. (A `WITHOUT ROWID` table, the engine's v1
/// layout, would be a different — and for large rows far slower —
/// ceiling.)
const SQLITE_DDL: &str = "
CREATE TABLE IF NOT EXISTS entries (
    id         INTEGER PRIMARY KEY,
    ns         TEXT    NOT NULL,
    digest     BLOB    NOT NULL CHECK (length(digest) = 32),
    size       INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content    BLOB    NOT NULL,
    CONSTRAINT entries_key UNIQUE (ns, digest)
);
CREATE TABLE IF NOT EXISTS gc_window (
    ns            TEXT    NOT NULL,
    digest        BLOB    NOT NULL,
    size          INTEGER NOT NULL,
    visible_after INTEGER NOT NULL,
    PRIMARY KEY (ns, digest)
) WITHOUT ROWID;
";

/// One rusqlite connection in WAL mode with the engine's settings.
pub struct RawSqlite {
    conn: Connection,
}

fn now_ms() -> i64 {
    store_core::Timestamp::now().0
}

impl RawSqlite {
    /// Opens (creating) `path` in WAL mode with `synchronous` matching
    /// `durability`.
    pub fn open(path: &Path, durability: Durability) -> BenchResult<Self> {
        let conn = Connection::open(path).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        let sync = match durability {
            Durability::Full => "FULL",
            Durability::Normal => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync).map_err(err)?;
        conn.pragma_update(None, "cache_size", -16 * 1024)
            .map_err(err)?;
        conn.pragma_update(None, "temp_store", "MEMORY")
            .map_err(err)?;
        conn.execute_batch(SQLITE_DDL).map_err(err)?;
        Ok(RawSqlite { conn })
    }

    /// One `INSERT` in its own (autocommit) transaction.
    pub fn insert(&self, ns: &str, key: &[u8; 32], bytes: &[u8]) -> BenchResult<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO entries (ns, digest, size, created_at, content)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
            )
            .map_err(err)?
            .execute((ns, &key[..], bytes.len() as i64, now_ms(), bytes))
            .map_err(err)?;
        Ok(())
    }

    /// One point `SELECT` of the content.
    pub fn select(&self, ns: &str, key: &[u8; 32]) -> BenchResult<Vec<u8>> {
        self.conn
            .prepare_cached("SELECT content FROM entries WHERE ns = ?1 AND digest = ?2")
            .map_err(err)?
            .query_row((ns, &key[..]), |r| r.get::<_, Vec<u8>>(0))
            .optional()
            .map_err(err)?
            .ok_or_else(|| "raw sqlite row missing".to_string())
    }

    /// Presence of each key with one `IN (...)` statement.
    pub fn has_many(&self, ns: &str, keys: &[[u8; 32]]) -> BenchResult<Vec<bool>> {
        let marks: Vec<String> = (0..keys.len()).map(|i| format!("?{}", i + 2)).collect();
        let q = format!(
            "SELECT digest FROM entries WHERE ns = ?1 AND digest IN ({})",
            marks.join(",")
        );
        let mut stmt = self.conn.prepare_cached(&q).map_err(err)?;
        let mut params: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(keys.len() + 1);
        params.push(&ns);
        let slices: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        for s in &slices {
            params.push(s);
        }
        let found: HashSet<Vec<u8>> = stmt
            .query_map(&params[..], |r| r.get::<_, Vec<u8>>(0))
            .map_err(err)?
            .collect::<Result<_, _>>()
            .map_err(err)?;
        Ok(keys.iter().map(|k| found.contains(&k[..])).collect())
    }

    /// The least work of a mark sweep that stages everything: page through
    /// `ns` `batch` entries at a time and insert each page into `gc_window`
    /// in one transaction. Returns the number of entries staged.
    pub fn mark_all(&mut self, ns: &str, batch: usize) -> BenchResult<u64> {
        let visible = now_ms() + 3_600_000;
        let mut after: Vec<u8> = Vec::new();
        let mut total = 0u64;
        loop {
            let page: Vec<(Vec<u8>, i64)> = self
                .conn
                .prepare_cached(
                    "SELECT digest, size FROM entries WHERE ns = ?1 AND digest > ?2
                     ORDER BY digest LIMIT ?3",
                )
                .map_err(err)?
                .query_map((ns, &after[..], batch as i64), |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(err)?
                .collect::<Result<_, _>>()
                .map_err(err)?;
            let Some(last) = page.last() else { break };
            after = last.0.clone();
            let tx = self.conn.transaction().map_err(err)?;
            {
                let mut ins = tx
                    .prepare_cached(
                        "INSERT INTO gc_window (ns, digest, size, visible_after)
                         VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                    )
                    .map_err(err)?;
                for (d, size) in &page {
                    ins.execute((ns, &d[..], size, visible)).map_err(err)?;
                }
            }
            tx.commit().map_err(err)?;
            total += page.len() as u64;
        }
        Ok(total)
    }

    /// Empties `gc_window`.
    pub fn clear_window(&self) -> BenchResult<()> {
        self.conn
            .execute("DELETE FROM gc_window", [])
            .map_err(err)?;
        Ok(())
    }

    /// Inserts `n` tiny entries in one transaction (setup).
    pub fn fill(&mut self, ns: &str, n: usize) -> BenchResult<()> {
        let tx = self.conn.transaction().map_err(err)?;
        {
            let mut ins = tx
                .prepare_cached(
                    "INSERT INTO entries (ns, digest, size, created_at, content)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .map_err(err)?;
            for _ in 0..n {
                let k = fresh_key();
                ins.execute((ns, &k[..], 16i64, now_ms(), &k[..16]))
                    .map_err(err)?;
            }
        }
        tx.commit().map_err(err)
    }
}

/// Raw PostgreSQL ceilings in the run's schema (`raw_entries` mirrors the
/// engine's `entries`, `STORAGE EXTERNAL` included).
pub struct RawPg<'a> {
    scope: &'a PgScope,
}

impl<'a> RawPg<'a> {
    /// Creates the raw table.
    pub async fn new(scope: &'a PgScope) -> BenchResult<Self> {
        sqlx::raw_sql(sql(
            &scope.schema,
            "CREATE TABLE IF NOT EXISTS {schema}.raw_entries (
                ns text COLLATE \"C\" NOT NULL,
                digest bytea NOT NULL CHECK (octet_length(digest) = 32),
                size bigint NOT NULL,
                created_at bigint NOT NULL,
                content bytea NOT NULL,
                PRIMARY KEY (ns, digest)
            );
            ALTER TABLE {schema}.raw_entries ALTER COLUMN content SET STORAGE EXTERNAL",
        ))
        .execute(&scope.pool)
        .await
        .map_err(err)?;
        Ok(RawPg { scope })
    }

    /// One `INSERT` statement (its own transaction).
    pub async fn insert(&self, ns: &str, key: &[u8; 32], bytes: &[u8]) -> BenchResult<()> {
        sqlx::query(sql(
            &self.scope.schema,
            "INSERT INTO {schema}.raw_entries (ns, digest, size, created_at, content)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
        ))
        .bind(ns)
        .bind(&key[..])
        .bind(bytes.len() as i64)
        .bind(now_ms())
        .bind(bytes)
        .execute(&self.scope.pool)
        .await
        .map_err(err)?;
        Ok(())
    }

    /// One point `SELECT` of the content.
    pub async fn select(&self, ns: &str, key: &[u8; 32]) -> BenchResult<Vec<u8>> {
        sqlx::query_scalar(sql(
            &self.scope.schema,
            "SELECT content FROM {schema}.raw_entries WHERE ns = $1 AND digest = $2",
        ))
        .bind(ns)
        .bind(&key[..])
        .fetch_one(&self.scope.pool)
        .await
        .map_err(err)
    }

    /// Presence of each key with one `= ANY($2)` statement.
    pub async fn has_many(&self, ns: &str, keys: &[[u8; 32]]) -> BenchResult<Vec<bool>> {
        let params: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        let found: Vec<Vec<u8>> = sqlx::query_scalar(sql(
            &self.scope.schema,
            "SELECT digest FROM {schema}.raw_entries WHERE ns = $1 AND digest = ANY($2)",
        ))
        .bind(ns)
        .bind(params)
        .fetch_all(&self.scope.pool)
        .await
        .map_err(err)?;
        let found: HashSet<Vec<u8>> = found.into_iter().collect();
        Ok(keys.iter().map(|k| found.contains(&k[..])).collect())
    }

    /// `lo_from_bytea(0, bytes)`: one new large object, one statement.
    pub async fn lo_put(&self, bytes: &[u8]) -> BenchResult<u32> {
        let oid: Oid = sqlx::query_scalar("SELECT lo_from_bytea(0, $1)")
            .bind(bytes)
            .fetch_one(&self.scope.pool)
            .await
            .map_err(err)?;
        self.scope.record_oid(oid.0);
        Ok(oid.0)
    }

    /// `lo_get(oid)`: the whole large object.
    pub async fn lo_get(&self, oid: u32) -> BenchResult<Vec<u8>> {
        sqlx::query_scalar("SELECT lo_get($1)")
            .bind(Oid(oid))
            .fetch_one(&self.scope.pool)
            .await
            .map_err(err)
    }

    /// `lo_get(oid, offset, len)`.
    pub async fn lo_get_range(&self, oid: u32, offset: i64, len: i32) -> BenchResult<Vec<u8>> {
        sqlx::query_scalar("SELECT lo_get($1, $2, $3)")
            .bind(Oid(oid))
            .bind(offset)
            .bind(len)
            .fetch_one(&self.scope.pool)
            .await
            .map_err(err)
    }
}
