//! The GC seam clauses of ADR-012 §5's postgres row: schema management
//! ([`host_gc_schema`]), fleet pin rows (`gc_pins`) and the advisory sweep
//! lock. The window clauses ([`store_pg::PgWindow`]) and the
//! [`PgGcSchema`] clause are shared with the `pg-lo` row, in store-pg.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Connection;
use store_pg::plumbing::{db_err, duration_ms, sql, stable_key, upsert_pin};
use store_pg::{Component, PgGcSchema};
use store_types::{
    BatchClauses, BoundLivenessTable, FleetBatch, FleetPolicy, Instance, Key, LivenessClauses,
    LivenessTable, Namespace, PinGeneration, PinIntent, PinRows, PolicyClauses, PolicyRow,
    ProtectReason, PublishOutcome, Result, SweepLockClause, SweepLockGuard, Timestamp,
};

use crate::fleet;

/// Migration component of `gc_pins`.
pub const GC_PINS_COMPONENT: &str = "gc_pins";

/// Migration steps of `gc_pins`.
///
/// 1. the table `(ns, digest, owner, expires_at)` and its expiry index;
/// 2. the row generation (ADR-054): the sequence `gc_pins_pin_id` and the
///    column `pin_id bigint` drawing from it. Existing rows get a fresh
///    generation each (a set pinned under the old code then fails its
///    guard once and is retried, which pins again).
pub const GC_PINS_STEPS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {schema}.gc_pins (
        ns text COLLATE \"C\" NOT NULL,
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        owner text NOT NULL,
        expires_at bigint NOT NULL,
        PRIMARY KEY (ns, digest, owner)
    );
    CREATE INDEX IF NOT EXISTS gc_pins_expiry ON {schema}.gc_pins (expires_at)",
    "CREATE SEQUENCE IF NOT EXISTS {schema}.gc_pins_pin_id;
    ALTER TABLE {schema}.gc_pins ADD COLUMN IF NOT EXISTS pin_id bigint NOT NULL
        DEFAULT nextval('{schema}.gc_pins_pin_id');
    ALTER SEQUENCE {schema}.gc_pins_pin_id OWNED BY {schema}.gc_pins.pin_id",
];

/// The fleet host's GC components beyond `gc_window`, in migration order:
/// `gc_pins`, the fences and liveness registry (`gc_deleting`,
/// `gc_liveness`), the policies (`gc_policies`).
pub const GC_HOST_COMPONENTS: &[Component] = &[
    (GC_PINS_COMPONENT, GC_PINS_STEPS),
    (
        crate::fence::GC_FENCE_COMPONENT,
        crate::fence::GC_FENCE_STEPS,
    ),
    (
        crate::policy::GC_POLICY_COMPONENT,
        crate::policy::GC_POLICY_STEPS,
    ),
];

/// The `postgres` row's [`GcSchema`](store_types::GcSchema): `gc_window`, then
/// [`GC_HOST_COMPONENTS`] (the `pg-lo` row is
/// [`PgGcSchema::window_only`]).
pub fn host_gc_schema(pool: PgPool, schema: impl Into<String>) -> PgGcSchema {
    PgGcSchema::with_host(pool, schema, GC_HOST_COMPONENTS)
}

/// [`PinClauses`](store_types::PinClauses) over `<schema>.gc_pins`. A row is live while
/// `expires_at > {schema}.gc_now()`: rows are written and judged by the
/// database's clock (see [`GC_WINDOW_STEPS`](store_pg::plumbing::GC_WINDOW_STEPS)),
/// so the `now` parameters of the trait (a node's clock) are not used and
/// TTLs are bound as durations.
///
/// Every writer of a row (`pin_commit`, `pin_renew`, `put_pinned`,
/// `pin_first`, and pg-lo's joint publish through
/// [`upsert_pin`]) holds the key's fleet
/// lock shared and judges the row's expiry by the clock at a statement
/// after that lock, so the row's generation (`pin_id`, ADR-054) is kept
/// only across extensions of a row no sweep batch could have judged
/// expired.
///
/// The fleet clauses (`put_pinned`, `pin_first`, `arbitrate`,
/// `begin_batch`; the lock protocol is described at [`store_pg::plumbing::key_lock`])
/// also use the engine's `<schema>.entries` and `<schema>.gc_window`.
/// `put_pinned` is one transaction of its own per put, not batched through
/// the engine's group commit.
#[derive(Clone, Debug)]
pub struct PgPins {
    pool: PgPool,
    schema: String,
    host: Instance,
}

impl PgPins {
    /// Pin clauses over `schema` (already validated); `host` is the
    /// engine's identity (`Instance::Postgres` of that schema), answered by
    /// [`PinRows::pin_host`].
    pub fn new(pool: PgPool, schema: impl Into<String>, host: Instance) -> Self {
        PgPins {
            pool,
            schema: schema.into(),
            host,
        }
    }
}

#[async_trait]
impl PinRows for PgPins {
    async fn pin_commit(
        &self,
        key: &Key,
        owner: &str,
        _now: Timestamp,
        ttl: Duration,
    ) -> Result<()> {
        let mut tx = fleet::begin_key_locked(&self.pool, &self.schema, key).await?;
        let intent = PinIntent {
            owner: owner.to_string(),
            now: Timestamp(0),
            ttl,
            host: self.host.clone(),
        };
        upsert_pin(&mut tx, &self.schema, key, &intent).await?;
        tx.commit().await.map_err(db_err)
    }

    async fn pin_renew(
        &self,
        key: &Key,
        owner: &str,
        _now: Timestamp,
        ttl: Duration,
    ) -> Result<bool> {
        // Under the key's shared lock and by the clock after it: a row a
        // sweep batch judged expired is never extended (it would keep its
        // generation, ADR-054).
        let mut tx = fleet::begin_key_locked(&self.pool, &self.schema, key).await?;
        let n = sqlx::query(sql(
            &self.schema,
            "UPDATE {schema}.gc_pins SET expires_at = {schema}.gc_now_statement() + $4
             WHERE ns = $1 AND digest = $2 AND owner = $3
               AND expires_at > {schema}.gc_now_statement()",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .bind(owner)
        .bind(duration_ms(ttl))
        .execute(&mut *tx)
        .await
        .map_err(db_err)?
        .rows_affected();
        tx.commit().await.map_err(db_err)?;
        Ok(n > 0)
    }

    async fn pin_check(&self, keys: &[Key], _now: Timestamp) -> Result<Vec<bool>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let ns: Vec<&str> = keys.iter().map(|k| k.namespace.as_str()).collect();
        let digests: Vec<&[u8]> = keys.iter().map(|k| &k.digest.as_bytes()[..]).collect();
        let hits: Vec<i64> = sqlx::query_scalar(sql(
            &self.schema,
            "SELECT k.i FROM UNNEST($1::text[], $2::bytea[]) WITH ORDINALITY AS k(ns, digest, i)
             WHERE EXISTS (SELECT 1 FROM {schema}.gc_pins p
                           WHERE p.ns = k.ns AND p.digest = k.digest
                             AND p.expires_at > {schema}.gc_now())",
        ))
        .bind(ns)
        .bind(digests)
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        Ok(store_pg::plumbing::ordinal_mask(hits, keys.len()))
    }

    async fn reap_expired(&self, _now: Timestamp) -> Result<u64> {
        let n = sqlx::query(sql(
            &self.schema,
            "DELETE FROM {schema}.gc_pins WHERE expires_at <= {schema}.gc_now()",
        ))
        .execute(&self.pool)
        .await
        .map_err(db_err)?
        .rows_affected();
        Ok(n)
    }

    fn pin_host(&self) -> Instance {
        self.host.clone()
    }

    async fn put_pinned(&self, key: &Key, bytes: Bytes, pin: &PinIntent) -> Result<PublishOutcome> {
        fleet::check_host(&self.host, pin)?;
        fleet::put_pinned(&self.pool, &self.schema, key, bytes, pin).await
    }

    async fn pin_first(&self, key: &Key, pin: &PinIntent) -> Result<PinGeneration> {
        fleet::check_host(&self.host, pin)?;
        fleet::pin_first(&self.pool, &self.schema, key, pin).await
    }
}

#[async_trait]
impl LivenessClauses for PgPins {
    async fn bind_liveness_table(
        &self,
        ns: &Namespace,
        table: &LivenessTable,
    ) -> Result<BoundLivenessTable> {
        fleet::bind_liveness_table(&self.pool, ns, table).await
    }

    async fn register_liveness_table(
        &self,
        ns: &Namespace,
        table: &LivenessTable,
        registrant: &str,
    ) -> Result<BoundLivenessTable> {
        let bound = fleet::bind_liveness_table(&self.pool, ns, table).await?;
        crate::fence::register(&self.pool, &self.schema, &bound, registrant).await?;
        Ok(bound)
    }

    async fn deregister_liveness_table(
        &self,
        ns: &Namespace,
        table: &LivenessTable,
        registrant: Option<&str>,
    ) -> Result<bool> {
        crate::fence::deregister(&self.pool, &self.schema, ns, table, registrant).await
    }

    async fn liveness_tables(&self) -> Result<Vec<BoundLivenessTable>> {
        crate::fence::registered(&self.pool, &self.schema).await
    }
}

#[async_trait]
impl BatchClauses for PgPins {
    async fn arbitrate(
        &self,
        keys: &[Key],
        tables: &[BoundLivenessTable],
        _now: Timestamp,
    ) -> Result<Vec<Option<ProtectReason>>> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.pool.acquire().await.map_err(db_err)?;
        fleet::arbitrate_on(&mut conn, &self.schema, keys, tables).await
    }

    async fn begin_batch(&self, keys: &[Key]) -> Result<Box<dyn FleetBatch>> {
        fleet::begin_batch(&self.pool, &self.schema, keys).await
    }

    async fn unfence(&self, keys: &[Key]) -> Result<()> {
        crate::fence::unfence(&self.pool, &self.schema, keys).await
    }

    async fn stale_fences(&self, grace: Duration, limit: usize) -> Result<Vec<Key>> {
        crate::fence::stale_fences(&self.pool, &self.schema, grace, limit).await
    }
}

#[async_trait]
impl PolicyClauses for PgPins {
    async fn set_gc_policy(
        &self,
        ns: &Namespace,
        owner: &str,
        policy: Option<FleetPolicy>,
    ) -> Result<()> {
        crate::policy::set(&self.pool, &self.schema, ns, owner, policy).await
    }

    async fn gc_policies(&self) -> Result<Vec<PolicyRow>> {
        crate::policy::all(&self.pool, &self.schema).await
    }
}

/// The fleet sweep lock: a session-level `pg_try_advisory_lock` whose key
/// is a stable hash of (database, schema), so every engine on one schema
/// contends for the same lock, whatever process it runs in.
#[derive(Clone, Debug)]
pub struct PgSweepLock {
    pool: PgPool,
    key: i64,
}

impl PgSweepLock {
    /// The sweep lock of `schema` in `database`.
    pub fn new(pool: PgPool, database: &str, schema: &str) -> Self {
        PgSweepLock {
            pool,
            key: Self::lock_key(database, schema),
        }
    }

    /// The advisory-lock key of (database, schema).
    pub fn lock_key(database: &str, schema: &str) -> i64 {
        stable_key(&["blobpool/sweep-lock", database, schema])
    }
}

#[async_trait]
impl SweepLockClause for PgSweepLock {
    async fn try_lock(&self) -> Result<Option<Box<dyn SweepLockGuard>>> {
        // Detach first: the session lock then lives on a connection that
        // never returns to the pool. If this future is cancelled after the
        // server granted the lock, dropping the connection closes its
        // session, which releases the lock.
        let mut conn: PgConnection = self.pool.acquire().await.map_err(db_err)?.detach();
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(self.key)
            .fetch_one(&mut conn)
            .await
            .map_err(db_err)?;
        if !got {
            let _ = conn.close().await;
            return Ok(None);
        }
        Ok(Some(Box::new(PgSweepGuard {
            conn: Some(conn),
            key: self.key,
        })))
    }
}

/// Holds the advisory lock on a dedicated (detached) connection.
///
/// Dropping it unlocks and closes that connection on a spawned task; with
/// no runtime available it drops the connection, whose session end
/// releases the lock server-side. Either way the connection never goes
/// back to a pool still holding the lock.
struct PgSweepGuard {
    conn: Option<PgConnection>,
    key: i64,
}

#[async_trait]
impl SweepLockGuard for PgSweepGuard {
    async fn release(mut self: Box<Self>) -> Result<()> {
        let Some(mut conn) = self.conn.take() else {
            return Ok(());
        };
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(self.key)
            .execute(&mut conn)
            .await;
        // Closing the session releases the lock even if the unlock failed.
        let _ = conn.close().await;
        unlocked.map(|_| ()).map_err(db_err)
    }

    async fn held(&mut self) -> Result<bool> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(false);
        };
        // A session lock lives exactly as long as its session: if this
        // round trip succeeds on the session that took it, it is held.
        Ok(sqlx::query_scalar::<_, bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
                            AND pid = pg_backend_pid() AND granted)",
        )
        .fetch_one(conn)
        .await
        .unwrap_or(false))
    }
}

impl Drop for PgSweepGuard {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let key = self.key;
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
                        .bind(key)
                        .execute(&mut conn)
                        .await;
                    if let Err(e) = unlocked {
                        tracing::warn!("sweep-lock unlock failed ({e}); closing the session");
                    }
                    let _ = conn.close().await;
                });
            }
            Err(_) => drop(conn),
        }
    }
}
