//! Cache keys (ADR-048): [`PgCacheKeys`], the [`CacheIndex`] of a
//! [`PostgresEngine`](crate::PostgresEngine), and the migration component
//! creating its table in the engine's schema.
//!
//! # Table
//!
//! | table | columns | key |
//! |---|---|---|
//! | `cache_keys` | `namespace text, key text, digest bytea(32), size bigint, accessed_at bigint (unix ms)` | `(namespace, key)`; indexes `(namespace, digest)`, `(namespace, accessed_at)` |
//!
//! # One clock
//!
//! Every method ignores the caller's `now` and uses the database's clock
//! (`statement_timestamp()`, in milliseconds): in a fleet every node's
//! reads and puts, and every node's trim, are timed by the one clock they
//! share.
//!
//! # Fleet liveness
//!
//! [`CacheIndex::liveness_table`] answers
//! `LivenessTable::new(schema, "cache_keys", "digest").with_namespace_column("namespace")`;
//! the collector binds it into every arbitration, like the references, so
//! a key committed through any node before a sweep's locked statement
//! protects its entry.
//!
//! # Cancellation
//!
//! Every method is one statement (`trim`: one statement with two deletes
//! in CTEs), committed whole or not at all: cancel-safe.

use sqlx::postgres::PgPool;
use sqlx::Row;
use store_pg::plumbing::{db_err, digest_col, digest_params, named_in, namespace_col, sql};
use store_types::{
    CacheBounds, CacheIndex, CacheTrim, CacheUsage, Digest, LivenessTable, Namespace, RefName,
    Result, Timestamp,
};

/// Migration component of the cache-key table.
pub const CACHE_COMPONENT: &str = "cache";

/// Name of the cache-key table.
pub const CACHE_TABLE: &str = "cache_keys";

/// Migration steps of [`CACHE_COMPONENT`]. v1: `cache_keys` and its
/// indexes.
pub const CACHE_STEPS: &[&str] = &["CREATE TABLE {schema}.cache_keys (
        namespace text COLLATE \"C\" NOT NULL,
        key text COLLATE \"C\" NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        size bigint NOT NULL CHECK (size >= 0),
        accessed_at bigint NOT NULL,
        PRIMARY KEY (namespace, key)
    );
    CREATE INDEX cache_keys_digest ON {schema}.cache_keys (namespace, digest);
    CREATE INDEX cache_keys_access ON {schema}.cache_keys (namespace, accessed_at)"];

/// The database's now, in unix milliseconds.
const NOW_MS: &str = "(extract(epoch FROM statement_timestamp()) * 1000)::bigint";

/// The cache keys of one PostgreSQL schema.
#[derive(Clone, Debug)]
pub struct PgCacheKeys {
    pool: PgPool,
    schema: String,
}

impl PgCacheKeys {
    /// Cache keys in `schema` (validated, migrated) through `pool`.
    pub fn new(pool: PgPool, schema: impl Into<String>) -> Self {
        PgCacheKeys {
            pool,
            schema: schema.into(),
        }
    }

    fn sql(&self, template: &str) -> sqlx::SqlStr {
        sql(&self.schema, &template.replace("{now}", NOW_MS))
    }
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl CacheIndex for PgCacheKeys {
    async fn record(
        &self,
        ns: &Namespace,
        key: &RefName,
        digest: Digest,
        size: u64,
        _now: Timestamp,
    ) -> Result<()> {
        sqlx::query(self.sql(
            "INSERT INTO {schema}.cache_keys (namespace, key, digest, size, accessed_at)
             VALUES ($1, $2, $3, $4, {now})
             ON CONFLICT (namespace, key) DO UPDATE SET
               digest = EXCLUDED.digest, size = EXCLUDED.size,
               accessed_at = greatest({schema}.cache_keys.accessed_at, EXCLUDED.accessed_at)",
        ))
        .bind(ns.as_str())
        .bind(key.as_str())
        .bind(&digest.as_bytes()[..])
        .bind(to_i64(size))
        .execute(&self.pool)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn lookup(&self, ns: &Namespace, key: &RefName) -> Result<Option<Digest>> {
        let row = sqlx::query(
            self.sql("SELECT digest FROM {schema}.cache_keys WHERE namespace = $1 AND key = $2"),
        )
        .bind(ns.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(db_err)?;
        row.map(|r| digest_col(&r, 0)).transpose()
    }

    async fn remove(&self, ns: &Namespace, key: &RefName, expect: Option<Digest>) -> Result<bool> {
        let r = sqlx::query(self.sql(
            "DELETE FROM {schema}.cache_keys
             WHERE namespace = $1 AND key = $2 AND ($3::bytea IS NULL OR digest = $3)",
        ))
        .bind(ns.as_str())
        .bind(key.as_str())
        .bind(expect.map(|d| d.as_bytes().to_vec()))
        .execute(&self.pool)
        .await
        .map_err(db_err)?;
        Ok(r.rows_affected() > 0)
    }

    async fn touch(&self, ns: &Namespace, digests: &[Digest], _now: Timestamp) -> Result<u64> {
        if digests.is_empty() {
            return Ok(0);
        }
        let r = sqlx::query(self.sql(
            "UPDATE {schema}.cache_keys SET accessed_at = {now}
             WHERE namespace = $1 AND digest IN (SELECT unnest($2::bytea[]))
               AND accessed_at < {now}",
        ))
        .bind(ns.as_str())
        .bind(digest_params(digests))
        .execute(&self.pool)
        .await
        .map_err(db_err)?;
        Ok(r.rows_affected())
    }

    async fn cached(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        named_in(&self.pool, &self.schema, CACHE_TABLE, ns, digests).await
    }

    async fn trim(
        &self,
        ns: &Namespace,
        bounds: CacheBounds,
        _now: Timestamp,
    ) -> Result<CacheTrim> {
        if bounds == CacheBounds::default() {
            return Ok(CacheTrim::default());
        }
        // One statement: the age cut and the byte bound judge one snapshot
        // (keys the age cut removes do not count toward the bound).
        let row = sqlx::query(self.sql(
            "WITH ranked AS (
                SELECT key, size, accessed_at,
                       accessed_at < {now} - $2 AS too_old
                  FROM {schema}.cache_keys WHERE namespace = $1),
             kept AS (
                SELECT key, too_old,
                       sum(size) FILTER (WHERE NOT too_old) OVER (
                         ORDER BY too_old, accessed_at DESC, key
                         ROWS UNBOUNDED PRECEDING) AS cum
                  FROM ranked),
             gone AS (
                DELETE FROM {schema}.cache_keys c USING kept k
                 WHERE c.namespace = $1 AND c.key = k.key
                   AND (k.too_old OR k.cum > $3)
                RETURNING c.size)
             SELECT count(*)::bigint, coalesce(sum(size), 0)::bigint FROM gone",
        ))
        .bind(ns.as_str())
        .bind(bounds.max_age.map_or(i64::MAX / 2, |a| {
            i64::try_from(a.as_millis()).unwrap_or(i64::MAX / 2)
        }))
        .bind(bounds.max_bytes.map_or(i64::MAX, to_i64))
        .fetch_one(&self.pool)
        .await
        .map_err(db_err)?;
        let (keys, bytes): (i64, i64) = (row.get(0), row.get(1));
        Ok(CacheTrim {
            keys: u64::try_from(keys).unwrap_or(0),
            bytes: u64::try_from(bytes).unwrap_or(0),
        })
    }

    async fn usage(&self) -> Result<Vec<(Namespace, CacheUsage)>> {
        let rows = sqlx::query(self.sql(
            "SELECT namespace, count(*)::bigint, coalesce(sum(size), 0)::bigint
               FROM {schema}.cache_keys GROUP BY namespace ORDER BY namespace",
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        rows.iter()
            .map(|r| {
                let (keys, bytes): (i64, i64) = (r.get(1), r.get(2));
                Ok((
                    namespace_col(r, 0)?,
                    CacheUsage {
                        keys: u64::try_from(keys).unwrap_or(0),
                        bytes: u64::try_from(bytes).unwrap_or(0),
                    },
                ))
            })
            .collect()
    }

    fn liveness_table(&self) -> Option<LivenessTable> {
        Some(
            LivenessTable::new(&self.schema, CACHE_TABLE, "digest")
                .with_namespace_column("namespace"),
        )
    }
}
