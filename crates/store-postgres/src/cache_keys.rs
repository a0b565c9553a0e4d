//! Cache keys (ADR-048): [`PgCacheKeys`], the [`CacheIndex`] of a
//! [`PostgresEngine`](crate::PostgresEngine), and the migration component
//! creating its table in the engine's schema.
//!
//! # Table
//!
//! | table | columns | key |
//! |---|---|---|
//! | `cache_keys` | `namespace text, key text, digest bytea(32), size bigint, accessed_at bigint (unix ms), owner text` (v2) | `(namespace, key)`; indexes `(namespace, digest)`, `(namespace, accessed_at)` |
//!
//! # One clock
//!
//! Every method ignores the caller's `now` and uses the database's clock
//! (`statement_timestamp()`, in milliseconds; `oldest` answers it as
//! [`CachePage::now`], the `now` of the trim's age cut): in a fleet every
//! node's reads and puts, and every node's trim, are timed by the one
//! clock they share.
//!
//! # Fleet liveness
//!
//! [`CacheIndex::liveness_table`] answers
//! `LivenessTable::new(schema, "cache_keys", "digest").with_namespace_column("namespace")`;
//! the collector binds it into every arbitration, like the references, so
//! a key committed through any node before a sweep's locked statement
//! protects its entry.
//!
//! # Owners and `record`
//!
//! `owner` (issue 39, ADR-052; step 2 of the component) is the name of the
//! author that wrote the key's digest, NULL for the embedding application
//! and for every key older than the step (which only `Replace::Any` may
//! then replace). `record` first tries one `INSERT … ON CONFLICT DO
//! NOTHING` when its precondition allows an absent key (creating is always
//! allowed), then one `UPDATE … WHERE digest = $new` when it allows the
//! key to hold the new digest (re-recording it is always allowed and keeps
//! the owner); otherwise (a replace, or a precondition to report) it
//! runs the references' protocol in one `READ COMMITTED` transaction: the
//! row is read `FOR UPDATE`, the precondition and then [`Author::check`] are judged under
//! that lock (refused: [`Error::RefConflict`]
//! or [`Error::NotOwner`], nothing written),
//! and the row is updated — a record of the digest it holds keeps its
//! owner and moves its access time forward. An insert that loses a race
//! for an absent key is retried and then finds the winner's row.
//!
//! # Cancellation
//!
//! Every method but `record` is one statement, committed whole or not at
//! all (a trim's batch: one `remove_unchanged`); `record`'s
//! transaction rolls back when dropped before its commit: cancel-safe.

use sqlx::postgres::PgPool;
use sqlx::Row;
use store_pg::plumbing::{db_err, digest_col, digest_params, named_in, namespace_col, sql};
use store_types::{
    Author, CacheEntry, CacheIndex, CachePage, CacheTrim, CacheUsage, Digest, Error, LivenessTable,
    Namespace, RefExpect, RefName, Result, Timestamp,
};

use crate::refs::{admit, begin_read_committed, stored_name};

/// Migration component of the cache-key table.
pub const CACHE_COMPONENT: &str = "cache";

/// Name of the cache-key table.
pub const CACHE_TABLE: &str = "cache_keys";

/// Migration steps of [`CACHE_COMPONENT`].
///
/// - v1: `cache_keys` and its indexes.
/// - v2: `cache_keys.owner` (issue 39): the author that wrote the digest.
///   Existing keys get NULL, i.e. they are the library's: only
///   `Replace::Any` (the `delete` scope, or the library) may replace them.
///   A nullable column without a default rewrites nothing.
pub const CACHE_STEPS: &[&str] = &[
    "CREATE TABLE {schema}.cache_keys (
        namespace text COLLATE \"C\" NOT NULL,
        key text COLLATE \"C\" NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 255),
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        size bigint NOT NULL CHECK (size >= 0),
        accessed_at bigint NOT NULL,
        PRIMARY KEY (namespace, key)
    );
    CREATE INDEX cache_keys_digest ON {schema}.cache_keys (namespace, digest);
    CREATE INDEX cache_keys_access ON {schema}.cache_keys (namespace, accessed_at)",
    "ALTER TABLE {schema}.cache_keys ADD COLUMN owner text COLLATE \"C\"",
];

/// Attempts of a `record` whose insert lost to a concurrent insert (as
/// the references' `set`).
const RECORD_ATTEMPTS: usize = 64;

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

    /// Inserts a new key owned by `owner`; `false` when the key exists.
    async fn insert(
        &self,
        exec: impl sqlx::PgExecutor<'_>,
        ns: &Namespace,
        key: &RefName,
        digest: Digest,
        size: u64,
        owner: Option<&str>,
    ) -> Result<bool> {
        let r = sqlx::query(self.sql(
            "INSERT INTO {schema}.cache_keys (namespace, key, digest, size, accessed_at, owner)
             VALUES ($1, $2, $3, $4, {now}, $5)
             ON CONFLICT (namespace, key) DO NOTHING",
        ))
        .bind(ns.as_str())
        .bind(key.as_str())
        .bind(&digest.as_bytes()[..])
        .bind(to_i64(size))
        .bind(owner)
        .execute(exec)
        .await
        .map_err(db_err)?;
        Ok(r.rows_affected() > 0)
    }

    /// Records `key` again if it holds `digest` (its owner kept, its
    /// access time moved forward); `false` when it does not.
    async fn rerecord(
        &self,
        ns: &Namespace,
        key: &RefName,
        digest: Digest,
        size: u64,
    ) -> Result<bool> {
        let r = sqlx::query(self.sql(
            "UPDATE {schema}.cache_keys SET size = $4, accessed_at = greatest(accessed_at, {now})
             WHERE namespace = $1 AND key = $2 AND digest = $3",
        ))
        .bind(ns.as_str())
        .bind(key.as_str())
        .bind(&digest.as_bytes()[..])
        .bind(to_i64(size))
        .execute(&self.pool)
        .await
        .map_err(db_err)?;
        Ok(r.rows_affected() > 0)
    }

    /// One locked attempt of `record`: `Ok(None)` when the key was absent
    /// and a concurrent insert won the race to create it (retry).
    #[allow(clippy::too_many_arguments)]
    async fn try_record(
        &self,
        ns: &Namespace,
        key: &RefName,
        digest: Digest,
        size: u64,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Option<Digest>>> {
        let mut tx = begin_read_committed(&self.pool).await?;
        let row = sqlx::query(self.sql(
            "SELECT digest, owner FROM {schema}.cache_keys
             WHERE namespace = $1 AND key = $2 FOR UPDATE",
        ))
        .bind(ns.as_str())
        .bind(key.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_err)?
        .map(|r| Ok::<_, Error>((digest_col(&r, 0)?, r.try_get(1).map_err(db_err)?)))
        .transpose()?;
        let owner = match admit(author, key, row.as_ref(), expect, Some(digest)) {
            Ok(owner) => owner,
            Err(refused) => {
                // Roll back now: the row lock must not outlive the call.
                tx.rollback().await.map_err(db_err)?;
                return Err(refused);
            }
        };
        if row.is_some() {
            sqlx::query(self.sql(
                "UPDATE {schema}.cache_keys SET digest = $3, size = $4, owner = $5,
                   accessed_at = greatest(accessed_at, {now})
                 WHERE namespace = $1 AND key = $2",
            ))
            .bind(ns.as_str())
            .bind(key.as_str())
            .bind(&digest.as_bytes()[..])
            .bind(to_i64(size))
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        } else if !self
            .insert(&mut *tx, ns, key, digest, size, owner.as_deref())
            .await?
        {
            tx.rollback().await.map_err(db_err)?;
            return Ok(None);
        }
        tx.commit().await.map_err(db_err)?;
        Ok(Some(row.map(|r| r.0)))
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
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>> {
        // A new key: one statement (creating is always allowed).
        if expect.holds(None)
            && self
                .insert(&self.pool, ns, key, digest, size, author.name)
                .await?
        {
            return Ok(None);
        }
        // The digest the key holds: one statement too (always allowed; the
        // owner stays, the access time moves forward).
        if (expect == RefExpect::Any || expect == RefExpect::Digest(digest))
            && self.rerecord(ns, key, digest, size).await?
        {
            return Ok(Some(digest));
        }
        for _ in 0..RECORD_ATTEMPTS {
            if let Some(previous) = self
                .try_record(ns, key, digest, size, expect, author)
                .await?
            {
                return Ok(previous);
            }
        }
        Err(Error::backend(
            store_types::ErrorKind::Contended,
            "postgres: record cache key",
        )
        .with_target(format!("{ns}/{key}"))
        .with_source(format!(
            "it kept changing under {RECORD_ATTEMPTS} attempts to record it"
        )))
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

    async fn lookup_many(&self, ns: &Namespace, keys: &[RefName]) -> Result<Vec<Option<Digest>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        // One statement (one snapshot) for the lot, by the primary key.
        let names: Vec<&str> = keys.iter().map(|k| k.as_str()).collect();
        let rows = sqlx::query(self.sql(
            "SELECT key, digest FROM {schema}.cache_keys WHERE namespace = $1 AND key = ANY($2)",
        ))
        .bind(ns.as_str())
        .bind(&names)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for r in &rows {
            found.insert(r.get::<String, _>(0), digest_col(r, 1)?);
        }
        Ok(names.iter().map(|k| found.get(*k).copied()).collect())
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

    async fn oldest(&self, ns: &Namespace, limit: usize, _now: Timestamp) -> Result<CachePage> {
        // One statement: the page, the bytes and the clock of one snapshot.
        let rows = sqlx::query(self.sql(
            "SELECT key, digest, size, accessed_at, {now},
                    (SELECT coalesce(sum(size), 0)::bigint FROM {schema}.cache_keys
                      WHERE namespace = $1)
               FROM {schema}.cache_keys WHERE namespace = $1 AND accessed_at <= coalesce(
                    (SELECT accessed_at FROM {schema}.cache_keys WHERE namespace = $1
                      ORDER BY accessed_at LIMIT 1 OFFSET $2), 9223372036854775807)",
        ))
        .bind(ns.as_str())
        .bind(to_i64(limit.max(1) as u64 - 1))
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        let mut page = CachePage {
            now: Timestamp(0),
            bytes: 0,
            entries: Vec::with_capacity(rows.len()),
        };
        for r in &rows {
            let (size, at, now, bytes): (i64, i64, i64, i64) =
                (r.get(2), r.get(3), r.get(4), r.get(5));
            (page.now, page.bytes) = (Timestamp(now), u64::try_from(bytes).unwrap_or(0));
            page.entries.push(CacheEntry {
                key: stored_name(r.get(0))?,
                digest: digest_col(r, 1)?,
                size: u64::try_from(size).unwrap_or(0),
                accessed_at: Timestamp(at),
            });
        }
        Ok(page)
    }

    async fn remove_unchanged(&self, ns: &Namespace, entries: &[CacheEntry]) -> Result<CacheTrim> {
        // One statement: each row is deleted only as read; a row a
        // concurrent touch or record changed first is rechecked and stays.
        let row = sqlx::query(self.sql(
            "WITH gone AS (
                DELETE FROM {schema}.cache_keys c
                 USING unnest($2::text[], $3::bytea[], $4::bigint[], $5::bigint[])
                       AS u(key, digest, size, accessed_at)
                 WHERE c.namespace = $1 AND c.key = u.key AND c.digest = u.digest
                   AND c.size = u.size AND c.accessed_at = u.accessed_at
                RETURNING c.size)
             SELECT count(*)::bigint, coalesce(sum(size), 0)::bigint FROM gone",
        ))
        .bind(ns.as_str())
        .bind(entries.iter().map(|e| e.key.as_str()).collect::<Vec<_>>())
        .bind(
            entries
                .iter()
                .map(|e| &e.digest.as_bytes()[..])
                .collect::<Vec<_>>(),
        )
        .bind(entries.iter().map(|e| to_i64(e.size)).collect::<Vec<_>>())
        .bind(entries.iter().map(|e| e.accessed_at.0).collect::<Vec<_>>())
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
