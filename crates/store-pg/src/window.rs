//! The durable delete window (`gc_window`), shared by both PostgreSQL
//! engines.

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use store_types::{Digest, Key, Namespace, Result, StagedCandidate, Timestamp, WindowClauses};

use crate::plumbing::{
    db_err, digest_col, migrate, namespace_col, present_many, size_col, sql, to_i64,
    GC_WINDOW_COMPONENT, GC_WINDOW_STEPS,
};

/// [`WindowClauses`] over `<schema>.gc_window`:
/// `(ns text, digest bytea, size bigint, visible_after bigint,
/// primary key (ns, digest))`. Every clause is one statement.
///
/// Time is the database's: [`WindowClauses::now`] answers
/// `<schema>.gc_now()` and `take_due` compares `visible_after <= gc_now()`,
/// ignoring its `now` parameter (a node's clock), so every node of a fleet
/// judges the window by the same clock (see
/// [`GC_WINDOW_STEPS`]).
#[derive(Clone, Debug)]
pub struct PgWindow {
    pool: PgPool,
    schema: String,
}

impl PgWindow {
    /// Window clauses over `schema` (already validated by the engine).
    pub fn new(pool: PgPool, schema: impl Into<String>) -> Self {
        PgWindow {
            pool,
            schema: schema.into(),
        }
    }

    /// Creates (or migrates) `gc_window` in the schema.
    pub async fn ensure(&self) -> Result<()> {
        migrate(
            &self.pool,
            &self.schema,
            GC_WINDOW_COMPONENT,
            GC_WINDOW_STEPS,
        )
        .await?;
        Ok(())
    }
}

#[async_trait]
impl WindowClauses for PgWindow {
    async fn stage(&self, candidates: &[StagedCandidate]) -> Result<()> {
        if candidates.is_empty() {
            return Ok(());
        }
        let mut ns = Vec::with_capacity(candidates.len());
        let mut digests = Vec::with_capacity(candidates.len());
        let mut sizes = Vec::with_capacity(candidates.len());
        let mut after = Vec::with_capacity(candidates.len());
        for c in candidates {
            ns.push(c.key.namespace.as_str());
            digests.push(&c.key.digest.as_bytes()[..]);
            sizes.push(to_i64(c.size)?);
            after.push(c.visible_after.0);
        }
        // ON CONFLICT DO NOTHING keeps the row staged first (also for
        // duplicates inside one call: the first occurrence wins).
        sqlx::query(sql(
            &self.schema,
            "INSERT INTO {schema}.gc_window (ns, digest, size, visible_after)
             SELECT * FROM UNNEST($1::text[], $2::bytea[], $3::int8[], $4::int8[])
             ON CONFLICT (ns, digest) DO NOTHING",
        ))
        .bind(ns)
        .bind(digests)
        .bind(sizes)
        .bind(after)
        .execute(&self.pool)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn staged_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        present_many(&self.pool, &self.schema, "gc_window", ns, digests).await
    }

    async fn take_due(
        &self,
        _now: Timestamp,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<StagedCandidate>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = match after {
            None => {
                sqlx::query(sql(
                    &self.schema,
                    "SELECT ns, digest, size, visible_after FROM {schema}.gc_window
                     WHERE visible_after <= {schema}.gc_now() ORDER BY ns, digest LIMIT $1",
                ))
                .bind(limit)
                .fetch_all(&self.pool)
                .await
            }
            Some(k) => {
                sqlx::query(sql(
                    &self.schema,
                    "SELECT ns, digest, size, visible_after FROM {schema}.gc_window
                     WHERE visible_after <= {schema}.gc_now() AND (ns, digest) > ($1, $2)
                     ORDER BY ns, digest LIMIT $3",
                ))
                .bind(k.namespace.as_str())
                .bind(&k.digest.as_bytes()[..])
                .bind(limit)
                .fetch_all(&self.pool)
                .await
            }
        }
        .map_err(db_err)?;
        rows.iter()
            .map(|r| {
                Ok(StagedCandidate {
                    key: Key::new(namespace_col(r, 0)?, digest_col(r, 1)?),
                    size: size_col(r, 2)?,
                    visible_after: Timestamp(sqlx::Row::try_get(r, 3).map_err(db_err)?),
                })
            })
            .collect()
    }

    async fn unstage(&self, keys: &[Key]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let ns: Vec<&str> = keys.iter().map(|k| k.namespace.as_str()).collect();
        let digests: Vec<&[u8]> = keys.iter().map(|k| &k.digest.as_bytes()[..]).collect();
        sqlx::query(sql(
            &self.schema,
            "DELETE FROM {schema}.gc_window w
             USING UNNEST($1::text[], $2::bytea[]) AS k(ns, digest)
             WHERE w.ns = k.ns AND w.digest = k.digest",
        ))
        .bind(ns)
        .bind(digests)
        .execute(&self.pool)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn now(&self) -> Result<Option<Timestamp>> {
        let now: i64 = sqlx::query_scalar(sql(&self.schema, "SELECT {schema}.gc_now()"))
            .fetch_one(&self.pool)
            .await
            .map_err(db_err)?;
        Ok(Some(Timestamp(now)))
    }

    async fn staged_count(&self) -> Result<u64> {
        let n: i64 =
            sqlx::query_scalar(sql(&self.schema, "SELECT count(*) FROM {schema}.gc_window"))
                .fetch_one(&self.pool)
                .await
                .map_err(db_err)?;
        Ok(n as u64)
    }
}
