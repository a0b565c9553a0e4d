//! Cache keys ([`CacheIndex`], ADR-048) in the `cache_keys` table
//! (schema v4; owners since v5).
//!
//! `record`, `remove`, `touch` and `remove_unchanged` are jobs of the
//! group-committing writer thread (like puts and reference writes): each
//! runs inside the writer's transaction and answers after its commit, so
//! a batch of `remove_unchanged` is one atomic step. `touch` (recency
//! only) is bulk work in chunks of `BULK_ROWS` digests, run after the
//! queued foreground writes (ADR-058, ADR-073). `lookup`, `cached`,
//! `oldest` (one statement) and `usage` run on the reader pool; `cached` asks the `(namespace, digest)`
//! index through the engine's batched existence query.
//!
//! `record` reads the key's digest and owner (schema v5; NULL: the
//! library, and every key older than v5), checks the precondition and the
//! author's right to change the key (issue 39, [`Author::check`]) and
//! upserts, all in its job: the writer is the only write connection and
//! holds `BEGIN IMMEDIATE`, so nothing changes the row in between. A
//! refused record writes nothing and is an answer, not a failed write. A
//! record of the digest the key holds keeps its owner.
//!
//! SQLite has no clock of its own here: access times are the `now` the
//! caller passes (the store's clock), in milliseconds.
//!
//! # Cancellation
//!
//! Every method is cancel-safe: a write job is queued when the method is
//! called and runs to its commit whether or not anyone still waits; a
//! dropped read returns its connection when its blocking closure ends.

use store_types::{
    Author, CacheEntry, CacheIndex, CachePage, CacheTrim, CacheUsage, Digest, Error, ErrorKind,
    Namespace, RefExpect, RefName, Result, Timestamp,
};

use crate::error::SqlResultExt;
use crate::refs::OwnedAuthor;
use crate::sql::{self, digest_at, namespace_at, to_i64};
use crate::writer::BULK_ROWS;
use crate::SqliteEngine;

/// `?6` is the owner the job decided on (the row's own for the digest it
/// holds).
const RECORD: &str = "INSERT INTO cache_keys (namespace, key, digest, size, accessed_at, owner)
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                      ON CONFLICT (namespace, key) DO UPDATE SET
                        digest = excluded.digest, size = excluded.size,
                        accessed_at = max(accessed_at, excluded.accessed_at),
                        owner = excluded.owner";
const LOOKUP: &str = "SELECT digest FROM cache_keys WHERE namespace = ?1 AND key = ?2";
const LOOKUP_OWNED: &str = "SELECT digest, owner FROM cache_keys WHERE namespace = ?1 AND key = ?2";
const REMOVE: &str = "DELETE FROM cache_keys WHERE namespace = ?1 AND key = ?2";
const REMOVE_IF: &str = "DELETE FROM cache_keys WHERE namespace = ?1 AND key = ?2 AND digest = ?3";
/// `INDEXED BY`: without statistics SQLite prefers `(namespace,
/// accessed_at)` for `accessed_at < ?3`, a scan of nearly every key of the
/// namespace per digest (a flush of 128 digests over 10,000 keys took
/// 225 ms on the writer).
const TOUCH: &str = "UPDATE cache_keys INDEXED BY cache_keys_by_digest SET accessed_at = ?3
                     WHERE namespace = ?1 AND digest = ?2 AND accessed_at < ?3";
/// The keys last accessed no later than the `?2 + 1`-th least recently
/// accessed one, and the namespace's bytes (one statement: one snapshot).
const OLDEST: &str = "SELECT key, digest, size, accessed_at,
                        (SELECT COALESCE(SUM(size), 0) FROM cache_keys WHERE namespace = ?1)
                      FROM cache_keys WHERE namespace = ?1 AND accessed_at <= COALESCE(
                        (SELECT accessed_at FROM cache_keys WHERE namespace = ?1
                          ORDER BY accessed_at LIMIT 1 OFFSET ?2), 9223372036854775807)";
const REMOVE_UNCHANGED: &str = "DELETE FROM cache_keys WHERE namespace = ?1 AND key = ?2
                                AND digest = ?3 AND size = ?4 AND accessed_at = ?5";
const USAGE: &str = "SELECT namespace, COUNT(*), COALESCE(SUM(size), 0) FROM cache_keys
                     GROUP BY namespace ORDER BY namespace";
/// The table and namespace column [`sql::present_in`] reads.
const CACHE_BY_NAMESPACE: &str = "cache_keys.namespace";

/// The [`CacheIndex`] of a [`SqliteEngine`] (returned by
/// `KvEngine::cache`).
pub(crate) struct SqliteCacheKeys {
    engine: SqliteEngine,
}

impl SqliteCacheKeys {
    pub(crate) fn new(engine: SqliteEngine) -> Self {
        SqliteCacheKeys { engine }
    }
}

/// [`LOOKUP`] of each of `keys` in `ns`, in order.
fn lookup_each(
    conn: &rusqlite::Connection,
    ns: &str,
    keys: &[RefName],
) -> Result<Vec<Option<Digest>>> {
    let mut stmt = conn.prepare_cached(LOOKUP).sql()?;
    let mut out = Vec::with_capacity(keys.len());
    for key in keys {
        let mut rows = stmt.query((ns, key.as_str())).sql()?;
        out.push(match rows.next().sql()? {
            Some(row) => Some(digest_at(row, 0)?),
            None => None,
        });
    }
    Ok(out)
}

#[async_trait::async_trait]
impl CacheIndex for SqliteCacheKeys {
    async fn record(
        &self,
        ns: &Namespace,
        key: &RefName,
        digest: Digest,
        size: u64,
        now: Timestamp,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>> {
        let (ns, key) = (ns.as_str().to_owned(), key.clone());
        let size = i64::try_from(size).unwrap_or(i64::MAX);
        let author = OwnedAuthor::new(author);
        // Ok(Err(_)): refused, nothing written (an answer, not a failed job).
        let outcome: std::result::Result<Option<Digest>, Error> = self
            .engine
            .inner
            .writer
            .submit(128, false, move |conn, _| {
                let row = {
                    let mut stmt = conn.prepare_cached(LOOKUP_OWNED).sql()?;
                    let mut rows = stmt.query((&ns, key.as_str())).sql()?;
                    match rows.next().sql()? {
                        Some(r) => Some((digest_at(r, 0)?, r.get::<_, Option<String>>(1).sql()?)),
                        None => None,
                    }
                };
                let owner = match author.admit(&key, row.as_ref(), expect, Some(digest)) {
                    Ok(owner) => owner,
                    Err(refused) => return Ok(Err(refused)),
                };
                conn.prepare_cached(RECORD)
                    .sql()?
                    .execute((
                        &ns,
                        key.as_str(),
                        &digest.as_bytes()[..],
                        size,
                        now.0,
                        owner.as_deref(),
                    ))
                    .sql()?;
                Ok(Ok(row.map(|r| r.0)))
            })
            .await?;
        outcome
    }

    async fn lookup(&self, ns: &Namespace, key: &RefName) -> Result<Option<Digest>> {
        let (ns, key) = (ns.clone(), key.clone());
        self.engine
            .inner
            .readers
            .run_inline_first(move |conn| {
                let mut stmt = conn.prepare_cached(LOOKUP).sql()?;
                let mut rows = stmt.query((ns.as_str(), key.as_str())).sql()?;
                match rows.next().sql()? {
                    Some(row) => Ok(Some(digest_at(row, 0)?)),
                    None => Ok(None),
                }
            })
            .await
    }

    async fn lookup_many(&self, ns: &Namespace, keys: &[RefName]) -> Result<Vec<Option<Digest>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let (n, ns, keys) = (keys.len(), ns.clone(), keys.to_vec());
        let read = move |conn: &rusqlite::Connection| {
            if keys.len() == 1 {
                return lookup_each(conn, ns.as_str(), &keys);
            }
            // One read transaction: every answer from one snapshot.
            conn.prepare_cached("BEGIN").sql()?.execute([]).sql()?;
            let found = lookup_each(conn, ns.as_str(), &keys);
            // A read transaction: ending it cannot lose anything.
            let _ = conn
                .prepare_cached("COMMIT")
                .and_then(|mut s| s.execute([]));
            found
        };
        self.engine.inner.readers.run_sized(n, read).await
    }

    async fn remove(&self, ns: &Namespace, key: &RefName, expect: Option<Digest>) -> Result<bool> {
        let (ns, key) = (ns.as_str().to_owned(), key.as_str().to_owned());
        self.engine
            .inner
            .writer
            .submit(64, false, move |conn, _| {
                let n = match expect {
                    None => conn.prepare_cached(REMOVE).sql()?.execute((&ns, &key)),
                    Some(d) => conn.prepare_cached(REMOVE_IF).sql()?.execute((
                        &ns,
                        &key,
                        &d.as_bytes()[..],
                    )),
                }
                .sql()?;
                Ok(n > 0)
            })
            .await
    }

    async fn touch(&self, ns: &Namespace, digests: &[Digest], now: Timestamp) -> Result<u64> {
        let mut n = 0u64;
        // Bulk jobs (ADR-073): a batch of noted reads waits for the queued
        // puts, never they for it.
        for chunk in digests.chunks(BULK_ROWS) {
            let ns = ns.as_str().to_owned();
            let (chunk, cost) = (chunk.to_vec(), 32 * chunk.len());
            let job = move |conn: &rusqlite::Connection, _| {
                let mut stmt = conn.prepare_cached(TOUCH).sql()?;
                let mut n = 0u64;
                for d in &chunk {
                    n += stmt.execute((&ns, &d.as_bytes()[..], now.0)).sql()? as u64;
                }
                Ok(n)
            };
            n += self
                .engine
                .inner
                .writer
                .submit_bulk(cost, job, None)
                .await?;
        }
        Ok(n)
    }

    async fn cached(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let ns = ns.clone();
        let digests = digests.to_vec();
        self.engine
            .inner
            .readers
            .run(move |conn| sql::present_in(conn, CACHE_BY_NAMESPACE, ns.as_str(), &digests))
            .await
    }

    async fn oldest(&self, ns: &Namespace, limit: usize, now: Timestamp) -> Result<CachePage> {
        let ns = ns.clone();
        self.engine
            .inner
            .readers
            .run(move |conn| {
                let mut stmt = conn.prepare_cached(OLDEST).sql()?;
                let mut rows = stmt.query((ns.as_str(), to_i64(limit.max(1) - 1))).sql()?;
                let mut page = CachePage {
                    now,
                    bytes: 0,
                    entries: Vec::new(),
                };
                while let Some(row) = rows.next().sql()? {
                    let (key, size, at, bytes): (String, i64, i64, i64) = (
                        row.get(0).sql()?,
                        row.get(2).sql()?,
                        row.get(3).sql()?,
                        row.get(4).sql()?,
                    );
                    page.bytes = u64::try_from(bytes).unwrap_or(0);
                    page.entries.push(CacheEntry {
                        key: RefName::new(key).map_err(|e| {
                            Error::backend(
                                ErrorKind::InvalidData,
                                "sqlite: decode stored cache key",
                            )
                            .with_source(e)
                        })?,
                        digest: digest_at(row, 1)?,
                        size: u64::try_from(size).unwrap_or(0),
                        accessed_at: Timestamp(at),
                    });
                }
                Ok(page)
            })
            .await
    }

    async fn remove_unchanged(&self, ns: &Namespace, entries: &[CacheEntry]) -> Result<CacheTrim> {
        let ns = ns.as_str().to_owned();
        let entries = entries.to_vec();
        self.engine
            .inner
            .writer
            .submit(64 * entries.len(), true, move |conn, _| {
                let mut stmt = conn.prepare_cached(REMOVE_UNCHANGED).sql()?;
                let mut t = CacheTrim::default();
                for e in &entries {
                    let (d, at) = (&e.digest.as_bytes()[..], e.accessed_at.0);
                    let row = (&ns, e.key.as_str(), d, to_i64(e.size), at);
                    if stmt.execute(row).sql()? > 0 {
                        t.keys += 1;
                        t.bytes += e.size;
                    }
                }
                Ok(t)
            })
            .await
    }

    async fn usage(&self) -> Result<Vec<(Namespace, CacheUsage)>> {
        self.engine
            .inner
            .readers
            .run(|conn| {
                let mut stmt = conn.prepare_cached(USAGE).sql()?;
                let mut rows = stmt.query([]).sql()?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().sql()? {
                    let keys: i64 = row.get(1).sql()?;
                    let bytes: i64 = row.get(2).sql()?;
                    out.push((
                        namespace_at(row, 0)?,
                        CacheUsage {
                            keys: u64::try_from(keys).unwrap_or(0),
                            bytes: u64::try_from(bytes).unwrap_or(0),
                        },
                    ));
                }
                Ok(out)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::plans::{fresh, plan};

    /// Every point statement searches the index its columns name: a key by
    /// the primary key, a digest by `(namespace, digest)`, never a range
    /// of access times.
    #[test]
    fn point_statements_search_their_index() {
        let (_dir, conn) = fresh();
        for (sql, index) in [
            (LOOKUP, "PRIMARY KEY"),
            (LOOKUP_OWNED, "PRIMARY KEY"),
            (REMOVE, "PRIMARY KEY"),
            (REMOVE_IF, "PRIMARY KEY"),
            (REMOVE_UNCHANGED, "PRIMARY KEY"),
            (TOUCH, "cache_keys_by_digest"),
        ] {
            let p = plan(&conn, sql);
            assert!(p.contains("SEARCH") && p.contains(index), "{sql}: {p}");
        }
    }
}
