//! The GC seam (ADR-012 §5, row "sqlite"): the `gc_window` schema and the
//! durable delete-window clauses. sqlite hosts no pin rows and no sweep
//! lock; those families are absent from its [`store_types::GcSeam`].
//!
//! Window writes (`ensure_gc_schema`, `stage`, `unstage`) are jobs of the
//! writer thread and durable once acknowledged; window reads use the
//! reader pool. `stage` and `unstage` are a sweep's bulk work: jobs of at
//! most [`BULK_ROWS`] rows, each committed on its own after the queued puts
//! (ADR-058). A failure part way leaves the earlier chunks committed: a
//! staged row is only a candidate (re-arbitrated before any delete), an
//! unstaged one is re-marked by the next sweep.
//!
//! [`WindowDeletes`] (ADR-081): the gc_window rows and the entries are one
//! database's, so a sweep's delete chunk also unstages the rows of what it
//! deleted, in the same bulk transaction.

use async_trait::async_trait;
use store_types::{
    Digest, GcSchema, Key, Namespace, Result, StagedCandidate, Timestamp, WindowClauses,
    WindowDeletes,
};

use crate::error::SqlResultExt;
use crate::schema::{self, GC_WINDOW_DDL};
use crate::sql::{self, digest_at, namespace_at, to_i64, to_u64};
use crate::writer::BULK_ROWS;
use crate::SqliteEngine;

/// `INSERT OR IGNORE`: re-staging keeps the first (earliest) row.
const STAGE: &str = "INSERT OR IGNORE INTO gc_window (ns, digest, size, visible_after)
                     VALUES (?1, ?2, ?3, ?4)";
pub(crate) const UNSTAGE: &str = "DELETE FROM gc_window WHERE ns = ?1 AND digest = ?2";
/// Keyset pagination over the primary key; `('', x'')` sorts before every
/// valid key, so it stands for "from the start".
const TAKE_DUE: &str = "SELECT ns, digest, size, visible_after FROM gc_window
                        WHERE (ns, digest) > (?1, ?2) AND visible_after <= ?3
                        ORDER BY ns, digest LIMIT ?4";
const COUNT: &str = "SELECT count(*) FROM gc_window";

/// Bytes per staged row, for the writer's batch cap.
const ROW_COST: usize = 96;

/// The sqlite engine's [`GcSchema`] and [`WindowClauses`].
pub(crate) struct SqliteGcSeam {
    engine: SqliteEngine,
}

impl SqliteGcSeam {
    pub(crate) fn new(engine: SqliteEngine) -> Self {
        SqliteGcSeam { engine }
    }
}

#[async_trait]
impl GcSchema for SqliteGcSeam {
    /// Creates `gc_window` (and only it) if missing.
    async fn ensure_gc_schema(&self) -> Result<()> {
        self.engine
            .inner
            .writer
            .submit(0, true, |conn, _now| {
                conn.execute_batch(GC_WINDOW_DDL).sql()
            })
            .await
    }

    async fn gc_tables(&self) -> Result<Vec<String>> {
        self.engine.inner.readers.run(schema::gc_tables).await
    }
}

#[async_trait]
impl WindowClauses for SqliteGcSeam {
    /// Every chunk is queued at once, so an idle writer commits several in
    /// one transaction (ADR-084); a failed chunk fails the call, and the
    /// others stay staged, as a staged row is harmless.
    async fn stage(&self, candidates: &[StagedCandidate]) -> Result<()> {
        let mut queued = Vec::with_capacity(candidates.len().div_ceil(BULK_ROWS));
        for chunk in candidates.chunks(BULK_ROWS) {
            let chunk = chunk.to_vec();
            let cost = chunk.len() * ROW_COST;
            let job = move |conn: &rusqlite::Connection, _now| {
                let mut stmt = conn.prepare_cached(STAGE).sql()?;
                for c in &chunk {
                    stmt.execute((
                        c.key.namespace.as_str(),
                        &c.key.digest.as_bytes()[..],
                        to_i64(c.size),
                        c.visible_after.0,
                    ))
                    .sql()?;
                }
                Ok(())
            };
            queued.push(self.engine.inner.writer.submit_bulk(cost, job, None));
        }
        for chunk in queued {
            chunk.await?;
        }
        Ok(())
    }

    async fn staged_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let ns = ns.clone();
        let digests = digests.to_vec();
        self.engine
            .inner
            .readers
            .run(move |conn| sql::present_in(conn, "gc_window", ns.as_str(), &digests))
            .await
    }

    async fn take_due(
        &self,
        now: Timestamp,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<StagedCandidate>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let after = after.cloned();
        self.engine
            .inner
            .readers
            .run(move |conn| {
                let (ns, digest): (&str, &[u8]) = match &after {
                    Some(k) => (k.namespace.as_str(), &k.digest.as_bytes()[..]),
                    None => ("", &[]),
                };
                let mut stmt = conn.prepare_cached(TAKE_DUE).sql()?;
                let mut rows = stmt.query((ns, digest, now.0, to_i64(limit))).sql()?;
                let mut out = Vec::with_capacity(limit.min(4096));
                while let Some(row) = rows.next().sql()? {
                    out.push(StagedCandidate {
                        key: Key::new(namespace_at(row, 0)?, digest_at(row, 1)?),
                        size: to_u64(row.get(2).sql()?)?,
                        visible_after: Timestamp(row.get(3).sql()?),
                    });
                }
                Ok(out)
            })
            .await
    }

    async fn unstage(&self, keys: &[Key]) -> Result<()> {
        for chunk in keys.chunks(BULK_ROWS) {
            let chunk = chunk.to_vec();
            let cost = chunk.len() * ROW_COST;
            let job = move |conn: &rusqlite::Connection, _now| {
                let mut stmt = conn.prepare_cached(UNSTAGE).sql()?;
                for k in &chunk {
                    stmt.execute((k.namespace.as_str(), &k.digest.as_bytes()[..]))
                        .sql()?;
                }
                Ok(())
            };
            self.engine
                .inner
                .writer
                .submit_bulk(cost, job, None)
                .await?;
        }
        Ok(())
    }

    async fn staged_count(&self) -> Result<u64> {
        self.engine
            .inner
            .readers
            .run(|conn| {
                let n: i64 = conn
                    .prepare_cached(COUNT)
                    .sql()?
                    .query_row([], |r| r.get(0))
                    .sql()?;
                to_u64(n)
            })
            .await
    }
}

#[async_trait]
impl WindowDeletes for SqliteGcSeam {
    /// Chunks of at most [`BULK_ROWS`] digests, each one bulk transaction
    /// that deletes the entries and unstages the rows of those it held.
    async fn delete_unstaging(
        &self,
        ns: &Namespace,
        digests: &[Digest],
    ) -> Result<Vec<Option<u64>>> {
        self.engine.delete_bulk(ns, digests, true).await
    }
}
