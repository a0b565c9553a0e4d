//! The [`Engine`] and [`KvEngine`] implementations: reads on the reader
//! pool, writes as jobs of the group-committing writer thread.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use rusqlite::{ErrorCode, OptionalExtension};
use store_types::{
    BlobReader, Capabilities, Digest, Engine, EntryMeta, Error, GcSeam, Instance, InstanceLock,
    Key, KvEngine, Namespace, PublishOutcome, ReadOptions, RefStore, Result, Sharing, SizedRead,
    Timestamp,
};

use crate::cache::Hot;
use crate::error::SqlResultExt;
use crate::sql::{self, digest_at, namespace_at, to_i64, to_u64};
use crate::window::{SqliteGcSeam, UNSTAGE};
use crate::writer::BULK_ROWS;
use crate::{SqliteEngine, MAX_BLOB_LEN};

const META: &str = "SELECT size, created_at FROM entries WHERE ns = ?1 AND digest = ?2";
const READ: &str = "SELECT content, size, created_at FROM entries WHERE ns = ?1 AND digest = ?2";
/// `substr` of a zero-length blob is NULL in SQLite; `ifnull` keeps it a blob.
const READ_RANGE: &str =
    "SELECT ifnull(substr(content, ?3, ?4), x'') FROM entries WHERE ns = ?1 AND digest = ?2";
/// Keyset pagination; `?2` is `x''` (below every digest) for the first page.
const SCAN: &str = "SELECT digest, size FROM entries
                    WHERE ns = ?1 AND digest > ?2 ORDER BY digest LIMIT ?3";
/// A skip scan over the `(ns, digest)` index: one b-tree descent per
/// namespace instead of a walk over every entry.
const NAMESPACES: &str = "
WITH RECURSIVE n(ns) AS (
    SELECT min(ns) FROM entries
    UNION ALL
    SELECT (SELECT min(ns) FROM entries WHERE ns > n.ns) FROM n WHERE n.ns IS NOT NULL
)
SELECT ns FROM n WHERE ns IS NOT NULL";
const PUT: &str = "INSERT INTO entries (ns, digest, size, created_at, content)
                   VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING";
const DELETE: &str = "DELETE FROM entries WHERE ns = ?1 AND digest = ?2 RETURNING size";

fn blob(bytes: Vec<u8>) -> BlobReader {
    BlobReader::from_bytes(Bytes::from(bytes))
}

/// The stored row of `key`: its content, recorded size and creation time.
fn read_row(conn: &rusqlite::Connection, key: &Key) -> Result<Option<(Bytes, i64, i64)>> {
    let mut stmt = conn.prepare_cached(READ).sql()?;
    stmt.query_row((key.namespace.as_str(), &key.digest.as_bytes()[..]), |r| {
        Ok((Bytes::from(r.get::<_, Vec<u8>>(0)?), r.get(1)?, r.get(2)?))
    })
    .optional()
    .sql()
}

impl SqliteEngine {
    /// The engine-state seam: `gc_window` only (ADR-012 §5), and deletes
    /// that unstage in the same transaction (ADR-081).
    fn seam(&self) -> GcSeam {
        let seam = Arc::new(SqliteGcSeam::new(self.clone()));
        GcSeam {
            schema: seam.clone(),
            window: Some(seam.clone()),
            pins: None,
            sweep_lock: None,
            window_deletes: Some(seam),
        }
    }

    /// The bytes of `span` of a stored entry (within its size), in one
    /// query on a reader connection.
    async fn read_span(&self, key: &Key, span: Range<u64>) -> Result<Option<BlobReader>> {
        let key = key.clone();
        let start = to_i64(span.start).saturating_add(1);
        let len = to_i64(span.end.saturating_sub(span.start));
        self.inner
            .readers
            .run_inline_first(move |conn| {
                let mut stmt = conn.prepare_cached(READ_RANGE).sql()?;
                let content = stmt
                    .query_row(
                        (
                            key.namespace.as_str(),
                            &key.digest.as_bytes()[..],
                            start,
                            len,
                        ),
                        |r| r.get::<_, Vec<u8>>(0),
                    )
                    .optional()
                    .sql()?;
                Ok(content.map(blob))
            })
            .await
    }

    /// Reads `key`'s row on a reader connection and offers it to the
    /// hot-entry cache (the epoch is taken before the query: see the
    /// `cache` module).
    ///
    /// A row the cache can take is hashed (after the reader connection is
    /// released) and its digest handed on with the bytes; a larger one is
    /// not, and the facade hashes it as it streams (on several cores when
    /// it is large), as before ADR-080.
    async fn read_through(&self, key: &Key) -> Result<Option<BlobReader>> {
        let query_key = key.clone();
        let cache = self.inner.cache.clone();
        let found = self
            .inner
            .readers
            .run_inline_first(move |conn| {
                let seen = cache.epoch();
                Ok(read_row(conn, &query_key)?.map(|row| (row, seen)))
            })
            .await?;
        let Some(((content, size, created_at), seen)) = found else {
            return Ok(None);
        };
        if !self.inner.cache.takes(content.len()) {
            return Ok(Some(BlobReader::from_bytes(content)));
        }
        let hot = Hot::read(content, size, created_at);
        let reader = BlobReader::hashed_bytes(hot.content.clone(), hot.digest);
        self.inner.cache.offer(key, hot, seen);
        Ok(Some(reader))
    }
}

impl SqliteEngine {
    /// Where the engine's writes waited so far: queued for the writer
    /// (and behind a sweep's bulk transaction), in their statements, in
    /// `COMMIT` (ADR-058).
    pub fn waits(&self) -> crate::SqliteWaits {
        self.inner.writer.counters().waits.snapshot()
    }

    /// Deletes `digests` of `ns` in bulk jobs of at most [`BULK_ROWS`]
    /// keys, each committed on its own after the queued puts (ADR-058);
    /// with `unstage` as in [`delete_chunk`](Self::delete_chunk).
    pub(crate) async fn delete_bulk(
        &self,
        ns: &Namespace,
        digests: &[Digest],
        unstage: bool,
    ) -> Result<Vec<Option<u64>>> {
        let mut freed = Vec::with_capacity(digests.len());
        for chunk in digests.chunks(BULK_ROWS) {
            freed.extend(self.delete_chunk(ns, chunk, true, unstage).await?);
        }
        Ok(freed)
    }

    /// Deletes `digests` of `ns` in one write job (bulk or foreground); the
    /// hot-entry cache forgets them after the commit (or failure), before
    /// the answer: no cache of this file answers for a deleted key once
    /// this returns (TUNING.md §sqlite-hot-cache). With `unstage`, the
    /// same transaction removes the `gc_window` row of every digest it
    /// deleted (ADR-081).
    async fn delete_chunk(
        &self,
        ns: &Namespace,
        digests: &[Digest],
        bulk: bool,
        unstage: bool,
    ) -> Result<Vec<Option<u64>>> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let ns = ns.clone();
        let digests = digests.to_vec();
        let cost = digests.len() * 64;
        let cache = self.inner.cache.clone();
        let gone: Vec<Key> = digests.iter().map(|d| Key::new(ns.clone(), *d)).collect();
        let invalidate: crate::writer::AfterCommit = Box::new(move || cache.invalidate(&gone));
        let job = move |conn: &rusqlite::Connection, _now| {
            let mut stmt = conn.prepare_cached(DELETE).sql()?;
            let mut unstage = unstage
                .then(|| conn.prepare_cached(UNSTAGE))
                .transpose()
                .sql()?;
            digests
                .iter()
                .map(|d| {
                    let key = (ns.as_str(), &d.as_bytes()[..]);
                    let freed = stmt
                        .query_row(key, |r| r.get::<_, i64>(0))
                        .optional()
                        .sql()?;
                    if let (Some(_), Some(unstage)) = (freed, unstage.as_mut()) {
                        unstage.execute(key).sql()?;
                    }
                    freed.map(to_u64).transpose()
                })
                .collect()
        };
        let writer = &self.inner.writer;
        if bulk {
            writer.submit_bulk(cost, job, Some(invalidate)).await
        } else {
            writer.submit_then(cost, true, job, Some(invalidate)).await
        }
    }
}

#[async_trait]
impl Engine for SqliteEngine {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "sqlite",
            instance: Instance::Path(self.inner.path.clone()),
            sharing: Sharing::EmbeddedFile,
            durable: true,
            seam: Some(self.seam()),
        }
    }

    /// Locks `<db file>.lock` (see the `instance_lock` module).
    async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
        let path = self.inner.path.clone();
        tokio::task::spawn_blocking(move || crate::instance_lock::lock(&path).map(Some))
            .await
            .map_err(|e| {
                Error::io(
                    store_types::ErrorKind::Other,
                    "sqlite: run instance lock task",
                )
                .with_source(e)
            })?
    }

    /// Answered from the hot-entry cache when `key` is in it.
    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
        self.inner.writer.counters().note_served();
        if let Some(hot) = self.inner.cache.get(key) {
            return Ok(Some(EntryMeta {
                size: to_u64(hot.size)?,
                created_at: Timestamp(hot.created_at),
            }));
        }
        let key = key.clone();
        self.inner
            .readers
            .run_inline_first(move |conn| {
                let mut stmt = conn.prepare_cached(META).sql()?;
                let row = stmt
                    .query_row((key.namespace.as_str(), &key.digest.as_bytes()[..]), |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
                    })
                    .optional()
                    .sql()?;
                row.map(|(size, created)| {
                    Ok(EntryMeta {
                        size: to_u64(size)?,
                        created_at: Timestamp(created),
                    })
                })
                .transpose()
            })
            .await
    }

    /// Digests in the hot-entry cache are present without a query; the
    /// others are asked about in one query.
    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let mut present = vec![false; digests.len()];
        let mut ask = Vec::new();
        let mut key = Key::new(ns.clone(), digests[0]);
        for (i, d) in digests.iter().enumerate() {
            key.digest = *d;
            if self.inner.cache.get(&key).is_some() {
                present[i] = true;
            } else {
                ask.push(i);
            }
        }
        if ask.is_empty() {
            return Ok(present);
        }
        let ns = ns.clone();
        let asked: Vec<Digest> = ask.iter().map(|i| digests[*i]).collect();
        let readers = &self.inner.readers;
        let ask_one = move |conn: &rusqlite::Connection| {
            sql::present_in(conn, "entries", ns.as_str(), &asked)
        };
        let answer = readers.run_sized(ask.len(), ask_one).await?;
        for (i, a) in ask.into_iter().zip(answer) {
            present[i] = a;
        }
        Ok(present)
    }

    /// A hot entry's bytes (or span) come from the cache, in the calling
    /// task; a cold whole entry is read on a reader connection and offered
    /// to the cache; a cold span is sized, then read alone. A read
    /// `from_storage` is always the stored row, never the cache (and it
    /// does not fill it).
    async fn read(&self, key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>> {
        self.inner.writer.counters().note_served();
        if options.from_storage {
            let key = key.clone();
            let row = self
                .inner
                .readers
                .run(move |conn| read_row(conn, &key))
                .await?;
            return row
                .map(|(content, _, _)| SizedRead::from_bytes(content, options))
                .transpose();
        }
        if let Some(hot) = self.inner.cache.get(key) {
            return SizedRead::from_hashed_bytes(hot.content, hot.digest, options).map(Some);
        }
        let size = async { Ok(self.meta(key).await?.map(|m| m.size)) };
        let whole = || self.read_through(key);
        options
            .read_with(size, whole, |span| self.read_span(key, span))
            .await
    }

    /// One key: a foreground job (a direct delete). More (a sweep's
    /// batch): bulk jobs of at most `BULK_ROWS` keys, each committed on
    /// its own after the queued puts (ADR-058). A failure part way leaves
    /// the earlier chunks deleted and answers the error; their keys stay
    /// staged, and the next sweep counts them vanished.
    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        if digests.len() <= 1 {
            return self.delete_chunk(ns, digests, false, false).await;
        }
        self.delete_bulk(ns, digests, false).await
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        self.inner
            .readers
            .run(|conn| {
                let mut stmt = conn.prepare_cached(NAMESPACES).sql()?;
                let mut rows = stmt.query([]).sql()?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().sql()? {
                    out.push(namespace_at(row, 0)?);
                }
                Ok(out)
            })
            .await
    }

    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let ns = ns.clone();
        self.inner
            .readers
            .run(move |conn| {
                let after: &[u8] = after.as_ref().map_or(&[], |d| &d.as_bytes()[..]);
                let mut stmt = conn.prepare_cached(SCAN).sql()?;
                let mut rows = stmt.query((ns.as_str(), after, to_i64(limit))).sql()?;
                let mut out = Vec::with_capacity(limit.min(4096));
                while let Some(row) = rows.next().sql()? {
                    out.push((digest_at(row, 0)?, to_u64(row.get(1).sql()?)?));
                }
                Ok(out)
            })
            .await
    }
}

#[async_trait]
impl KvEngine for SqliteEngine {
    /// Publishes with `INSERT ... ON CONFLICT DO NOTHING` in the writer's
    /// next group commit; answers after that commit. Two puts of one key in
    /// the same batch run in order, so the first is `Inserted` and the
    /// second `AlreadyPresent`.
    async fn put(&self, key: &Key, bytes: Bytes) -> Result<PublishOutcome> {
        let size = bytes.len() as u64;
        if size > MAX_BLOB_LEN {
            return Err(Error::TooLarge {
                limit: MAX_BLOB_LEN,
                got: size,
            });
        }
        let key = key.clone();
        self.inner
            .writer
            .submit(bytes.len(), false, move |conn, now| {
                let mut stmt = conn.prepare_cached(PUT).sql()?;
                let changed = stmt
                    .execute((
                        key.namespace.as_str(),
                        &key.digest.as_bytes()[..],
                        to_i64(size),
                        now.0,
                        &bytes[..],
                    ))
                    .map_err(|e| match e.sqlite_error_code() {
                        Some(ErrorCode::TooBig) => Error::TooLarge {
                            limit: MAX_BLOB_LEN,
                            got: size,
                        },
                        _ => crate::error::sql_err(e),
                    })?;
                Ok(if changed == 1 {
                    PublishOutcome::Inserted
                } else {
                    PublishOutcome::AlreadyPresent
                })
            })
            .await
    }

    /// The `refs` table (schema v3): compare-and-swap writes on the writer
    /// thread, reads on the reader pool (see the `refs` module).
    fn refs(&self) -> Option<Arc<dyn RefStore>> {
        Some(Arc::new(crate::refs::SqliteRefs::new(self.clone())))
    }

    fn cache(&self) -> Option<Arc<dyn store_types::CacheIndex>> {
        Some(Arc::new(crate::cache_keys::SqliteCacheKeys::new(
            self.clone(),
        )))
    }
}

#[cfg(test)]
mod plan_tests {
    //! The statements' query plans on the current schema: every lookup by
    //! key goes through the `(ns, digest)` index, never a table scan.

    use super::*;
    use crate::sql::plans::{fresh, plan};

    #[test]
    fn key_lookups_use_the_unique_index() {
        let (_dir, conn) = fresh();
        let has_many = "SELECT digest FROM entries WHERE ns = ?1 AND digest IN (?2, ?3, ?4)";
        for sql in [META, READ, READ_RANGE, SCAN, NAMESPACES, DELETE, has_many] {
            let p = plan(&conn, sql);
            assert!(p.contains("INDEX"), "{sql}: {p}");
            assert!(!p.contains("SCAN entries"), "{sql}: {p}");
            // `scan` pages come out of the index already in digest order.
            assert!(!p.contains("TEMP B-TREE"), "{sql}: {p}");
        }
        let p = plan(&conn, has_many);
        assert!(
            p.contains("COVERING INDEX"),
            "has_many reads the index only: {p}"
        );
    }
}
