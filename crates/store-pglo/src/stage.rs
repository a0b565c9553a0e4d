//! [`PgLoStage`]: a large object written inside an open transaction.

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgPool, Postgres};
use sqlx::{Row, Transaction};
use store_pg::fence::wait_unfenced;
use store_pg::plumbing::{
    db_err, lock_key_shared, now_ms, sql, to_i64, upsert_pin, validate_schema,
};
use store_types::{
    Error, Instance, JointStagedWrite, Key, Namespace, PinIntent, PublishOutcome, Result,
    StagedWrite,
};

/// `INV_WRITE` for `lo_open`.
const INV_WRITE: i32 = 0x20000;

/// Largest piece sent per `lowrite` call; bigger chunks are split.
const MAX_WRITE: usize = 1024 * 1024;

/// An in-progress large write: a transaction on a dedicated pooled
/// connection holding a new large object opened for writing.
///
/// Chunks go to the server as they arrive (`lowrite`), so the blob is never
/// held in memory. Nothing is visible to other sessions until
/// [`StagedWrite::publish`] commits the large object together with its
/// `lo_entries` row; dropping or aborting the stage rolls the transaction
/// back, which discards the large object with it.
///
/// [`JointStagedWrite::publish_pinned`] (fleet mode) commits the pin row in the
/// same transaction: the GC host's `gc_pins` must live in the same
/// database (ADR-012 §4).
pub struct PgLoStage {
    tx: Option<Transaction<'static, Postgres>>,
    schema: String,
    instance: Instance,
    ns: Namespace,
    oid: Oid,
    fd: i32,
    size: u64,
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    backend_pid: i32,
    /// The pool, for the dedup path's outboard update.
    pool: PgPool,
    /// The entry's outboard, inserted with the companion row.
    outboard: Option<Bytes>,
}

impl std::fmt::Debug for PgLoStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLoStage")
            .field("ns", &self.ns)
            .field("oid", &self.oid.0)
            .field("size", &self.size)
            .finish()
    }
}

impl PgLoStage {
    /// Begins the transaction and creates the large object.
    pub(crate) async fn open(
        pool: &PgPool,
        schema: &str,
        instance: &Instance,
        ns: &Namespace,
    ) -> Result<Self> {
        // READ COMMITTED whatever the server's default: the joint fleet
        // publish must see fences and entries committed while it uploaded.
        let mut tx = pool
            .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
            .await
            .map_err(db_err)?;
        let row =
            sqlx::query("SELECT o, lo_open(o, $1), pg_backend_pid() FROM lo_create(0) AS t(o)")
                .bind(INV_WRITE)
                .fetch_one(&mut *tx)
                .await
                .map_err(db_err)?;
        Ok(PgLoStage {
            oid: row.try_get(0).map_err(db_err)?,
            fd: row.try_get(1).map_err(db_err)?,
            backend_pid: row.try_get(2).map_err(db_err)?,
            tx: Some(tx),
            schema: schema.to_string(),
            instance: instance.clone(),
            ns: ns.clone(),
            size: 0,
            pool: pool.clone(),
            outboard: None,
        })
    }

    /// The OID of the (uncommitted) large object.
    pub fn oid(&self) -> u32 {
        self.oid.0
    }

    /// Bytes written so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The server process id of the staging connection (for tests that
    /// kill it with `pg_terminate_backend`).
    #[cfg(feature = "testing")]
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    fn check_namespace(&self, key: &Key) -> Result<()> {
        if key.namespace != self.ns {
            return Err(Error::KeyInvalid(format!(
                "stage opened for namespace {} published as {key}",
                self.ns
            )));
        }
        Ok(())
    }

    /// The schema of the pin's GC host, which must be a schema of this
    /// engine's database.
    fn host_schema<'p>(&self, pin: &'p PinIntent) -> Result<&'p str> {
        match &pin.host {
            Instance::Postgres { schema, .. } if pin.host.same_database(&self.instance) => {
                validate_schema(schema)?;
                Ok(schema)
            }
            other => Err(Error::Config(format!(
                "pg-lo on {:?} cannot commit a pin row on {other:?}: the GC host must be \
                 the same PostgreSQL database",
                self.instance
            ))),
        }
    }

    /// Inserts the companion row; `false` when the key already exists.
    async fn insert_row(&mut self, key: &Key) -> Result<bool> {
        let (oid, size, schema) = (self.oid, to_i64(self.size)?, self.schema.clone());
        let outboard = self.outboard.clone();
        let tx = self.tx()?;
        let inserted = sqlx::query(sql(
            &schema,
            "INSERT INTO {schema}.lo_entries (ns, digest, oid, size, created_at, outboard)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (ns, digest) DO NOTHING",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .bind(oid)
        .bind(size)
        .bind(now_ms())
        .bind(outboard.as_deref())
        .execute(&mut **tx)
        .await
        .map_err(db_err)?
        .rows_affected();
        Ok(inserted > 0)
    }

    fn take_tx(&mut self) -> Result<Transaction<'static, Postgres>> {
        self.tx.take().ok_or_else(finished)
    }

    fn tx(&mut self) -> Result<&mut Transaction<'static, Postgres>> {
        self.tx.as_mut().ok_or_else(finished)
    }
}

/// The error of a use of a stage whose transaction already ended.
fn finished() -> Error {
    Error::backend(store_types::ErrorKind::Other, "pg-lo: use stage")
        .with_source("the stage already finished")
}

#[async_trait]
impl StagedWrite for PgLoStage {
    /// Keeps the outboard for the companion row, which the publishing
    /// transaction inserts with it.
    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        self.outboard = Some(outboard);
        Ok(())
    }

    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        let fd = self.fd;
        for piece in chunk.chunks(MAX_WRITE) {
            let tx = self.tx()?;
            let written: i32 = sqlx::query_scalar("SELECT lowrite($1, $2)")
                .bind(fd)
                .bind(piece)
                .fetch_one(&mut **tx)
                .await
                .map_err(db_err)?;
            if written as usize != piece.len() {
                return Err(Error::io(store_types::ErrorKind::Other, "pg-lo: lowrite")
                    .with_source(format!("wrote {written} of {} bytes", piece.len())));
            }
            self.size += piece.len() as u64;
        }
        Ok(())
    }

    async fn publish(mut self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        self.check_namespace(key)?;
        let inserted = self.insert_row(key).await?;
        let tx = self.take_tx()?;
        if !inserted {
            // The key exists: rolling back discards our large object.
            tx.rollback().await.map_err(db_err)?;
            // An entry stored before outboards gets this one.
            if let Some(ob) = &self.outboard {
                crate::engine::set_outboard_if_missing(&self.pool, &self.schema, key, ob).await?;
            }
            return Ok(PublishOutcome::AlreadyPresent);
        }
        tx.commit().await.map_err(db_err)?;
        Ok(PublishOutcome::Inserted)
    }

    async fn abort(mut self: Box<Self>) -> Result<()> {
        match self.tx.take() {
            Some(tx) => tx.rollback().await.map_err(db_err),
            None => Ok(()),
        }
    }
}

#[async_trait]
impl JointStagedWrite for PgLoStage {
    /// The joint fleet publish: in the staging transaction, takes the
    /// key's shared fleet lock on the GC host, inserts the companion row
    /// (or, on a dedup hit, unlinks this stage's large object), upserts
    /// the pin row into `<host schema>.gc_pins` and commits — large object,
    /// companion row and pin row become durable together. A dedup hit
    /// still commits the pin and leaves no orphan large object.
    ///
    /// `pin.host` must be on this engine's database ([`Error::Config`]
    /// otherwise; the stage is rolled back). Any error rolls the whole
    /// transaction back.
    async fn publish_pinned(
        mut self: Box<Self>,
        key: &Key,
        pin: &PinIntent,
    ) -> Result<PublishOutcome> {
        self.check_namespace(key)?;
        let host_schema = self.host_schema(pin)?;
        lock_key_shared(self.tx()?, host_schema, key).await?;
        // Never dedup onto an entry whose delete is in flight: wait for its
        // deletion fence to clear (inside this transaction: it holds the
        // staged large object).
        wait_unfenced(self.tx()?, host_schema, key).await?;
        let inserted = self.insert_row(key).await?;
        let oid = self.oid;
        let mut tx = self.take_tx()?;
        if !inserted {
            // The key exists: drop our large object but keep the
            // transaction, so the pin still commits with it. (`lo_unlink`
            // also closes this transaction's descriptor on it.)
            sqlx::query("SELECT lo_unlink($1)")
                .bind(oid)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
            // An entry stored before outboards gets this one.
            if let Some(ob) = &self.outboard {
                sqlx::query(sql(
                    &self.schema,
                    "UPDATE {schema}.lo_entries SET outboard = $3
                     WHERE ns = $1 AND digest = $2 AND outboard IS NULL",
                ))
                .bind(key.namespace.as_str())
                .bind(&key.digest.as_bytes()[..])
                .bind(&ob[..])
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
            }
        }
        upsert_pin(&mut tx, host_schema, key, pin).await?;
        tx.commit().await.map_err(db_err)?;
        Ok(if inserted {
            PublishOutcome::Inserted
        } else {
            PublishOutcome::AlreadyPresent
        })
    }
}
