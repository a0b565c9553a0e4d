//! Test hooks (feature `testing`): corrupting an entry, and probing which
//! large objects exist and which this engine's table references.

use sqlx::postgres::types::Oid;
use store_pg::plumbing::db_err;
use store_types::{Key, Result};

use crate::PgLoEngine;

impl PgLoEngine {
    /// Flips the first byte of the entry's large object (writes one byte,
    /// and bumps `size`, for an empty one) so verification must catch it.
    pub async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
        let n = sqlx::query(self.sql(
            "WITH e AS (
                 UPDATE {schema}.lo_entries SET size = greatest(size, 1)
                 WHERE ns = $1 AND digest = $2 RETURNING oid, size
             )
             SELECT lo_put(e.oid, 0, CASE WHEN octet_length(lo_get(e.oid, 0, 1)) = 0
                 THEN '\\x00'::bytea
                 ELSE set_byte(lo_get(e.oid, 0, 1), 0, get_byte(lo_get(e.oid, 0, 1), 0) # 255)
                 END)
             FROM e",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .execute(self.pool())
        .await
        .map_err(db_err)?
        .rows_affected();
        if n == 0 {
            return Err(store_types::Error::Missing);
        }
        Ok(())
    }

    /// Flips (`^ 0xff`) the byte at `offset` of the entry's large object,
    /// size unchanged. [`Error::Missing`](store_types::Error::Missing)
    /// when absent; an offset past the end fails in the database.
    pub async fn corrupt_byte_at(&self, key: &Key, offset: u64) -> Result<()> {
        let offset = i64::try_from(offset).map_err(|_| {
            store_types::Error::backend(
                store_types::ErrorKind::InvalidData,
                "corrupting a byte past the end",
            )
            .with_key(key)
        })?;
        let n = sqlx::query(self.sql(
            "SELECT lo_put(e.oid, $3,
                 set_byte(lo_get(e.oid, $3, 1), 0, get_byte(lo_get(e.oid, $3, 1), 0) # 255))
             FROM {schema}.lo_entries e WHERE e.ns = $1 AND e.digest = $2",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .bind(offset)
        .execute(self.pool())
        .await
        .map_err(db_err)?
        .rows_affected();
        if n == 0 {
            return Err(store_types::Error::Missing);
        }
        Ok(())
    }

    /// Every large-object OID referenced by this engine's `lo_entries`.
    pub async fn referenced_oids(&self) -> Result<Vec<u32>> {
        let oids: Vec<Oid> =
            sqlx::query_scalar(self.sql("SELECT oid FROM {schema}.lo_entries ORDER BY oid"))
                .fetch_all(self.pool())
                .await
                .map_err(db_err)?;
        Ok(oids.into_iter().map(|o| o.0).collect())
    }

    /// Whether each OID exists as a (committed) large object, index-aligned.
    pub async fn large_objects_exist(&self, oids: &[u32]) -> Result<Vec<bool>> {
        let params: Vec<Oid> = oids.iter().map(|o| Oid(*o)).collect();
        let found: Vec<Oid> =
            sqlx::query_scalar("SELECT oid FROM pg_largeobject_metadata WHERE oid = ANY($1)")
                .bind(params)
                .fetch_all(self.pool())
                .await
                .map_err(db_err)?;
        let found: std::collections::HashSet<u32> = found.into_iter().map(|o| o.0).collect();
        Ok(oids.iter().map(|o| found.contains(o)).collect())
    }

    /// Of `candidates` (OIDs a test saw this engine create), those that
    /// exist as large objects but no `lo_entries` row references: leaks.
    ///
    /// Large objects are database-wide and other tests' schemas create
    /// their own concurrently, so a leak check must be scoped to OIDs the
    /// test knows came from this engine; a database-wide count would not
    /// be correct under parallel tests.
    pub async fn orphan_large_objects(&self, candidates: &[u32]) -> Result<Vec<u32>> {
        let params: Vec<Oid> = candidates.iter().map(|o| Oid(*o)).collect();
        let orphans: Vec<Oid> = sqlx::query_scalar(self.sql(
            "SELECT m.oid FROM pg_largeobject_metadata m
             WHERE m.oid = ANY($1)
               AND NOT EXISTS (SELECT 1 FROM {schema}.lo_entries e WHERE e.oid = m.oid)
             ORDER BY m.oid",
        ))
        .bind(params)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        Ok(orphans.into_iter().map(|o| o.0).collect())
    }
}
