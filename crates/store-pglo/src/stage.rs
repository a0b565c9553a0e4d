//! [`PgLoStage`]: a large object written inside an open transaction.

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::postgres::types::Oid;
use sqlx::postgres::{PgPool, Postgres};
use sqlx::{Row, Transaction};
use store_postgres::plumbing::{db_err, now_ms, sql, to_i64};
use store_types::{Error, Key, Namespace, PublishOutcome, Result, StagedWrite};

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
pub struct PgLoStage {
    tx: Option<Transaction<'static, Postgres>>,
    schema: String,
    ns: Namespace,
    oid: Oid,
    fd: i32,
    size: u64,
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    backend_pid: i32,
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
    pub(crate) async fn open(pool: &PgPool, schema: &str, ns: &Namespace) -> Result<Self> {
        let mut tx = pool.begin().await.map_err(db_err)?;
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
            ns: ns.clone(),
            size: 0,
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

    fn tx(&mut self) -> Result<&mut Transaction<'static, Postgres>> {
        self.tx
            .as_mut()
            .ok_or_else(|| Error::Backend("pg-lo stage already finished".into()))
    }
}

#[async_trait]
impl StagedWrite for PgLoStage {
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
                return Err(Error::Io(format!(
                    "lowrite wrote {written} of {} bytes",
                    piece.len()
                )));
            }
            self.size += piece.len() as u64;
        }
        Ok(())
    }

    async fn publish(mut self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        if key.namespace != self.ns {
            return Err(Error::KeyInvalid(format!(
                "stage opened for namespace {} published as {key}",
                self.ns
            )));
        }
        let mut tx = self
            .tx
            .take()
            .ok_or_else(|| Error::Backend("pg-lo stage already finished".into()))?;
        let inserted = sqlx::query(sql(
            &self.schema,
            "INSERT INTO {schema}.lo_entries (ns, digest, oid, size, created_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (ns, digest) DO NOTHING",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .bind(self.oid)
        .bind(to_i64(self.size)?)
        .bind(now_ms())
        .execute(&mut *tx)
        .await
        .map_err(db_err)?
        .rows_affected();
        if inserted == 0 {
            // The key exists: rolling back discards our large object.
            tx.rollback().await.map_err(db_err)?;
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
