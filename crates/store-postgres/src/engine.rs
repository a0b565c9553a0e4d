//! [`PostgresEngine`]: the `Engine` + `KvEngine` implementation.

use std::ops::Range;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::postgres::PgPool;
use store_pg::plumbing::{
    connect_pool, db_err, digest_col, digest_params, instance_identity, list_namespaces, migrate,
    now_ms, present_many, scan_entries, size_col, sql, to_i64, validate_schema,
};
use store_pg::PgWindow;
use store_types::{
    BlobReader, Capabilities, Digest, EntryMeta, GcSeam, Instance, InstanceLock, Key, Namespace,
    PublishOutcome, Result, Sharing,
};
use store_types::{Engine, KvEngine, ReadOptions, SizedRead};

use crate::batch::{GroupCommit, PutStats};
use crate::refs::{PgRefs, REFS_COMPONENT, REFS_STEPS};
use crate::seam::{host_gc_schema, PgPins, PgSweepLock};

/// Migration component of the kv tables.
pub const KV_COMPONENT: &str = "kv";

/// Migration steps of the kv tables (see the crate docs for the layout).
///
/// - v1: `entries`.
/// - v2: `content` stored out of line uncompressed (`STORAGE EXTERNAL`):
///   content is mostly incompressible, and uncompressed TOAST lets
///   `substring` fetch only the chunks a range read needs.
pub const KV_STEPS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {schema}.entries (
        ns text COLLATE \"C\" NOT NULL,
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        size bigint NOT NULL,
        created_at bigint NOT NULL,
        content bytea NOT NULL,
        PRIMARY KEY (ns, digest)
    )",
    "ALTER TABLE {schema}.entries ALTER COLUMN content SET STORAGE EXTERNAL",
];

/// The PostgreSQL kv engine: entries are rows of `<schema>.entries`.
///
/// Cloning is cheap and shares the pool and the group-commit writers.
#[derive(Clone)]
pub struct PostgresEngine {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: String,
    instance: Instance,
    writer: GroupCommit,
}

impl std::fmt::Debug for PostgresEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresEngine")
            .field("instance", &self.inner.instance)
            .finish()
    }
}

impl PostgresEngine {
    /// Connects to `url`, creates `schema` if missing and migrates it.
    ///
    /// `schema` must match `[a-z_][a-z0-9_]{0,62}` ([`Error::Config`](store_types::Error::Config)
    /// otherwise).
    pub async fn connect(url: &str, schema: &str) -> Result<Self> {
        validate_schema(schema)?;
        let pool = connect_pool(url).await?;
        Self::from_pool(pool, schema).await
    }

    /// Builds the engine over an existing pool (for custom pool settings);
    /// creates and migrates `schema` like [`PostgresEngine::connect`].
    /// Must run inside a Tokio runtime: it spawns the group-commit writers,
    /// which live as long as the engine.
    pub async fn from_pool(pool: PgPool, schema: &str) -> Result<Self> {
        validate_schema(schema)?;
        migrate(&pool, schema, KV_COMPONENT, KV_STEPS).await?;
        migrate(&pool, schema, REFS_COMPONENT, REFS_STEPS).await?;
        migrate(
            &pool,
            schema,
            crate::cache_keys::CACHE_COMPONENT,
            crate::cache_keys::CACHE_STEPS,
        )
        .await?;
        let instance = instance_identity(&pool, schema).await?;
        let writer = GroupCommit::spawn(pool.clone(), schema);
        Ok(PostgresEngine {
            inner: Arc::new(Inner {
                pool,
                schema: schema.to_string(),
                instance,
                writer,
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

    /// Group-commit counters.
    pub fn stats(&self) -> PutStats {
        self.inner.writer.stats()
    }

    /// Flips one stored content byte (appends one, and bumps `size`, for
    /// empty content) so the facade's verification must catch it.
    #[cfg(feature = "testing")]
    pub async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
        let n = sqlx::query(self.sql(
            "UPDATE {schema}.entries SET
                content = CASE WHEN octet_length(content) = 0 THEN '\\x00'::bytea
                          ELSE set_byte(content, 0, get_byte(content, 0) # 255) END,
                size = greatest(size, 1)
             WHERE ns = $1 AND digest = $2",
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

    /// The whole content of `key`, in one query.
    async fn read_content(&self, key: &Key) -> Result<Option<BlobReader>> {
        let content: Option<Vec<u8>> = sqlx::query_scalar(
            self.sql("SELECT content FROM {schema}.entries WHERE ns = $1 AND digest = $2"),
        )
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        Ok(content.map(|c| BlobReader::from_bytes(Bytes::from(c))))
    }

    /// `range` of the content of `key` (within its size), in one query.
    async fn read_span(&self, key: &Key, range: Range<u64>) -> Result<Option<BlobReader>> {
        let len = range.end.saturating_sub(range.start);
        let content: Option<Vec<u8>> = sqlx::query_scalar(self.sql(
            "SELECT substring(content FROM $3::int4 FOR $4::int4) FROM {schema}.entries
             WHERE ns = $1 AND digest = $2",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .bind(to_i64(range.start)?.saturating_add(1))
        .bind(to_i64(len)?)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        Ok(content.map(|c| BlobReader::from_bytes(Bytes::from(c))))
    }

    /// The engine-state seam: every clause family (ADR-012 §5).
    fn seam(&self) -> GcSeam {
        let pool = self.inner.pool.clone();
        let schema = self.inner.schema.clone();
        let database = match &self.inner.instance {
            Instance::Postgres { database, .. } => database.clone(),
            _ => String::new(),
        };
        GcSeam {
            schema: Arc::new(host_gc_schema(pool.clone(), schema.clone())),
            window: Some(Arc::new(PgWindow::new(pool.clone(), schema.clone()))),
            pins: Some(Arc::new(PgPins::new(
                pool.clone(),
                schema.clone(),
                self.inner.instance.clone(),
            ))),
            sweep_lock: Some(Arc::new(PgSweepLock::new(pool, &database, &schema))),
            window_deletes: None,
        }
    }

    fn sql(&self, template: &str) -> sqlx::SqlStr {
        sql(&self.inner.schema, template)
    }
}

#[async_trait]
impl Engine for PostgresEngine {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            kind: "postgres",
            instance: self.inner.instance.clone(),
            sharing: Sharing::DatabaseServer,
            durable: true,
            seam: Some(self.seam()),
        }
    }

    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
        store_pg::plumbing::entry_meta(self.pool(), &self.inner.schema, "entries", key).await
    }

    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        present_many(self.pool(), &self.inner.schema, "entries", ns, digests).await
    }

    /// A whole read is one query; a span is sized first (two queries).
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

    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(self.sql(
            "DELETE FROM {schema}.entries e USING unnest($2::bytea[]) AS q(d)
             WHERE e.ns = $1 AND e.digest = q.d
             RETURNING e.digest, e.size",
        ))
        .bind(ns.as_str())
        .bind(digest_params(digests))
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        let mut freed = std::collections::HashMap::with_capacity(rows.len());
        for r in &rows {
            freed.insert(digest_col(r, 0)?, size_col(r, 1)?);
        }
        // A digest listed twice is freed once: the first occurrence.
        Ok(digests.iter().map(|d| freed.remove(d)).collect())
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        list_namespaces(self.pool(), &self.inner.schema, "entries").await
    }

    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        scan_entries(self.pool(), &self.inner.schema, "entries", ns, after, limit).await
    }

    /// A session-level advisory lock on a dedicated connection (see the
    /// [`instance_lock`](store_pg::instance_lock) module; lost if that
    /// session dies).
    async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
        let data = format!(
            "the PostgreSQL schema {} of {}",
            self.inner.schema,
            database_of(&self.inner.instance)
        );
        store_pg::instance_lock::lock_instance(
            &self.inner.pool,
            &self.inner.schema,
            store_pg::instance_lock::KV_INSTANCE,
            &data,
        )
        .await
        .map(Some)
    }
}

#[async_trait]
impl KvEngine for PostgresEngine {
    async fn put(&self, key: &Key, bytes: Bytes) -> Result<PublishOutcome> {
        self.inner.writer.put(key, bytes, now_ms()).await
    }

    /// The references in `<schema>.ref_names` (see [`crate::refs`]).
    fn refs(&self) -> Option<Arc<dyn store_types::RefStore>> {
        Some(Arc::new(PgRefs::new(
            self.inner.pool.clone(),
            self.inner.schema.clone(),
        )))
    }

    fn cache(&self) -> Option<Arc<dyn store_types::CacheIndex>> {
        Some(Arc::new(crate::cache_keys::PgCacheKeys::new(
            self.inner.pool.clone(),
            self.inner.schema.clone(),
        )))
    }
}

/// `database <name>` of an instance, for messages.
fn database_of(instance: &Instance) -> String {
    match instance {
        Instance::Postgres { database, .. } => format!("database {database}"),
        other => format!("{other:?}"),
    }
}
