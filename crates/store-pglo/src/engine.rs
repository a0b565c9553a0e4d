//! [`PgLoEngine`]: the `Engine` + `LargeEngine` implementation.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::types::Oid;
use sqlx::postgres::PgPool;
use sqlx::Row;
use store_pg::plumbing::{
    connect_pool, db_err, digest_col, digest_params, instance_identity, list_namespaces, migrate,
    present_many, scan_entries, size_col, sql, to_i64, validate_schema, PgWindow,
};
use store_pg::PgGcSchema;
use store_types::{
    BlobReader, Capabilities, Digest, Engine, EntryMeta, GcSeam, Instance, InstanceLock, Key,
    LargeEngine, Namespace, ReadOptions, Result, Sharing, SizedRead, Stage, CHUNK_SIZE,
};

use crate::reader::inline_reader;
use crate::stage::PgLoStage;

/// Migration component of the companion table.
pub const PGLO_COMPONENT: &str = "pglo";

/// Migration steps of the companion table.
///
/// - v1: `lo_entries`.
/// - v2: a unique index on `oid` (one entry per large object; makes
///   "is this large object referenced?" an index probe).
/// - v3: the `outboard` column: the entry's BLAKE3 outboard (ADR-032),
///   inserted with the row in the publishing transaction, so an entry
///   given one is never visible without it; `NULL` for entries of at most
///   1 MiB (the facade hands none over, TUNING.md §small-outboards) and for entries stored
///   before outboards until their first range read gives them one.
pub const PGLO_STEPS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {schema}.lo_entries (
        ns text COLLATE \"C\" NOT NULL,
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        oid oid NOT NULL,
        size bigint NOT NULL,
        created_at bigint NOT NULL,
        PRIMARY KEY (ns, digest)
    )",
    "CREATE UNIQUE INDEX IF NOT EXISTS lo_entries_oid ON {schema}.lo_entries (oid)",
    "ALTER TABLE {schema}.lo_entries ADD COLUMN IF NOT EXISTS outboard bytea",
];

/// Gives the row of `key` the outboard `outboard` if it has none.
pub(crate) async fn set_outboard_if_missing(
    pool: &PgPool,
    schema: &str,
    key: &Key,
    outboard: &[u8],
) -> Result<()> {
    sqlx::query(sql(
        schema,
        "UPDATE {schema}.lo_entries SET outboard = $3
         WHERE ns = $1 AND digest = $2 AND outboard IS NULL",
    ))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .bind(outboard)
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// The PostgreSQL large-object engine: each entry is a large object plus a
/// row of `<schema>.lo_entries` naming it.
///
/// Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct PgLoEngine {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: String,
    instance: Instance,
}

impl std::fmt::Debug for PgLoEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLoEngine")
            .field("instance", &self.inner.instance)
            .finish()
    }
}

impl PgLoEngine {
    /// One statement for an entry of at most [`CHUNK_SIZE`] bytes (its row
    /// and its bytes together); a larger one is streamed from the OID this
    /// statement found.
    async fn read_content(&self, key: &Key) -> Result<Option<BlobReader>> {
        let row = sqlx::query(self.sql(
            "SELECT e.oid, e.size,
                    CASE WHEN e.size <= $3 THEN lo_get(e.oid, 0, e.size::int4) END
             FROM {schema}.lo_entries e WHERE e.ns = $1 AND e.digest = $2",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .bind(CHUNK_SIZE as i64)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let oid: Oid = row.try_get(0).map_err(db_err)?;
        let size = size_col(&row, 1)?;
        let inline: Option<Vec<u8>> = row.try_get(2).map_err(db_err)?;
        Ok(Some(match inline {
            Some(bytes) => inline_reader(key, size, bytes),
            None => self.reader(key, oid, 0..size),
        }))
    }

    /// A range of at most [`CHUNK_SIZE`] bytes is one statement: the entry's
    /// row joined with `lo_get(oid, offset, len)`, row and bytes read in one
    /// snapshot, so a read racing a delete finds no row (`None`) rather than
    /// reading a recycled OID. Larger ranges are streamed.
    async fn read_span(&self, key: &Key, range: Range<u64>) -> Result<Option<BlobReader>> {
        let len = range.end.saturating_sub(range.start);
        if len > CHUNK_SIZE as u64 {
            return Ok(self
                .locate(key)
                .await?
                .map(|(oid, _)| self.reader(key, oid, range)));
        }
        let bytes: Option<Vec<u8>> = sqlx::query_scalar(self.sql(
            "SELECT lo_get(e.oid, $3, $4) FROM {schema}.lo_entries e
             WHERE e.ns = $1 AND e.digest = $2",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .bind(to_i64(range.start)?)
        .bind(len as i32)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        Ok(bytes.map(|b| inline_reader(key, len, b)))
    }

    /// The engine-state seam: `gc_window` only (ADR-012 §5).
    fn seam(&self) -> GcSeam {
        let (pool, schema) = (self.inner.pool.clone(), self.inner.schema.clone());
        GcSeam {
            schema: Arc::new(PgGcSchema::window_only(pool.clone(), schema.clone())),
            window: Some(Arc::new(PgWindow::new(pool, schema))),
            pins: None,
            sweep_lock: None,
            window_deletes: None,
        }
    }

    /// Connects to `url`, creates `schema` if missing and migrates it.
    ///
    /// `schema` must match `[a-z_][a-z0-9_]{0,62}` ([`Error::Config`](store_types::Error::Config)
    /// otherwise).
    pub async fn connect(url: &str, schema: &str) -> Result<Self> {
        validate_schema(schema)?;
        let pool = connect_pool(url).await?;
        Self::from_pool(pool, schema).await
    }

    /// Builds the engine over an existing pool (for custom pool settings;
    /// every open stage holds one connection until it finishes), creating
    /// and migrating `schema` like [`PgLoEngine::connect`].
    pub async fn from_pool(pool: PgPool, schema: &str) -> Result<Self> {
        validate_schema(schema)?;
        migrate(&pool, schema, PGLO_COMPONENT, PGLO_STEPS).await?;
        let instance = instance_identity(&pool, schema).await?;
        Ok(PgLoEngine {
            inner: Arc::new(Inner {
                pool,
                schema: schema.to_string(),
                instance,
            }),
        })
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema holding the engine's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// Opens a typed stage ([`LargeEngine::stage`] boxes this).
    pub async fn open_stage(&self, ns: &Namespace) -> Result<PgLoStage> {
        PgLoStage::open(self.pool(), self.schema(), &self.inner.instance, ns).await
    }

    /// `template` with `{schema}` replaced by this engine's schema.
    pub(crate) fn sql(&self, template: &str) -> sqlx::SqlStr {
        sql(&self.inner.schema, template)
    }
}

#[async_trait]
impl Engine for PgLoEngine {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "pg-lo",
            instance: self.inner.instance.clone(),
            sharing: Sharing::DatabaseServer,
            durable: true,
            seam: Some(self.seam()),
        }
    }

    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
        store_pg::plumbing::entry_meta(self.pool(), &self.inner.schema, "lo_entries", key).await
    }

    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        present_many(self.pool(), &self.inner.schema, "lo_entries", ns, digests).await
    }

    /// A whole read: see `read_content`; a span is sized first, then read
    /// (see `read_span`).
    async fn read(&self, key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>> {
        let size = async { Ok(self.meta(key).await?.map(|m| m.size)) };
        options
            .read_with(
                size,
                || self.read_content(key),
                |span| self.read_span(key, span),
            )
            .await
    }

    /// The `outboard` column of the entry's row (`None` when the row is
    /// absent or the column `NULL`).
    async fn read_outboard(&self, key: &Key) -> Result<Option<bytes::Bytes>> {
        let got: Option<Option<Vec<u8>>> = sqlx::query_scalar(
            self.sql("SELECT outboard FROM {schema}.lo_entries WHERE ns = $1 AND digest = $2"),
        )
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        Ok(got.flatten().map(bytes::Bytes::from))
    }

    /// Sets the `outboard` column where it is `NULL` (one statement).
    async fn store_outboard(&self, key: &Key, outboard: bytes::Bytes) -> Result<()> {
        set_outboard_if_missing(self.pool(), &self.inner.schema, key, &outboard).await
    }

    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let rows = sqlx::query(self.sql(
            "DELETE FROM {schema}.lo_entries e USING unnest($2::bytea[]) AS q(d)
             WHERE e.ns = $1 AND e.digest = q.d
             RETURNING e.digest, e.oid, e.size",
        ))
        .bind(ns.as_str())
        .bind(digest_params(digests))
        .fetch_all(&mut *tx)
        .await
        .map_err(db_err)?;
        let mut freed = HashMap::with_capacity(rows.len());
        let mut oids: Vec<Oid> = Vec::with_capacity(rows.len());
        for r in &rows {
            freed.insert(digest_col(r, 0)?, size_col(r, 2)?);
            oids.push(r.try_get(1).map_err(db_err)?);
        }
        if !oids.is_empty() {
            sqlx::query("SELECT count(lo_unlink(o)) FROM UNNEST($1::oid[]) AS t(o)")
                .bind(oids)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        // A digest listed twice is freed once: the first occurrence.
        Ok(digests.iter().map(|d| freed.remove(d)).collect())
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        list_namespaces(self.pool(), &self.inner.schema, "lo_entries").await
    }

    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        scan_entries(
            self.pool(),
            &self.inner.schema,
            "lo_entries",
            ns,
            after,
            limit,
        )
        .await
    }

    /// A session-level advisory lock (its own id, `"pglo-instance"` of the
    /// schema) on a dedicated connection, through store-postgres's
    /// `instance_lock` module; lost if that session dies.
    async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
        let database = match &self.inner.instance {
            Instance::Postgres { database, .. } => database.clone(),
            other => format!("{other:?}"),
        };
        let data = format!(
            "the PostgreSQL large-object tier in schema {} of database {database}",
            self.inner.schema
        );
        store_pg::instance_lock::lock_instance(
            &self.inner.pool,
            &self.inner.schema,
            store_pg::instance_lock::PGLO_INSTANCE,
            &data,
        )
        .await
        .map(Some)
    }
}

#[async_trait]
impl LargeEngine for PgLoEngine {
    /// Stages commit the pin row with the publish when asked
    /// ([`PgLoStage`]'s `publish_pinned`, given a GC host on this
    /// database): they are joint stages.
    async fn stage(&self, ns: &Namespace) -> Result<Stage> {
        Ok(Stage::Joint(Box::new(self.open_stage(ns).await?)))
    }
}
