//! Deletion fences and the shared liveness-table registry of a fleet's GC
//! host (ADR-021).
//!
//! # Deletion fences (`gc_deleting`)
//!
//! A sweep's execute batch arbitrates under exclusive per-key locks held by
//! one PostgreSQL session. Large-tier media (files on shared media, pg-lo
//! objects, S3 objects) are not part of that transaction, so if the batch
//! deleted them while still holding the locks, the death of its session
//! (`idle_in_transaction_session_timeout`, `pg_terminate_backend`, a
//! failover, a network cut) would free the locks while the unlink still
//! runs: another node's put could then pin the key, find the file and
//! answer `deduplicated: true` — and lose it a moment later.
//!
//! So the batch writes a **fence** row per doomed key *inside* its locked
//! transaction and commits; only then are the media deleted, and the fences
//! cleared (`BatchClauses::unfence`) once every delete has finished. Every fleet put,
//! pin and joint publish takes the key's shared lock and then checks the
//! fence: a fenced key is waited out
//! ([`wait_unfenced`](store_pg::fence::wait_unfenced)), never deduplicated
//! onto. A fence whose sweeper never cleared it (crash) is older than the
//! grace by the database's clock and is finished — media deleted again,
//! idempotently, then cleared — by the next sweep (`BatchClauses::stale_fences`).
//!
//! This module is the GC host's side: the tables, writing, clearing and
//! finishing fences. The put's side (checking and waiting out a fence) is
//! [`store_pg::fence`], which the `pg-lo` engine's joint publish shares.
//!
//! # The liveness-table registry (`gc_liveness`)
//!
//! ADR-012 §6.6: a fleet liveness source "registers a named table reference
//! in the shared engine". Registrations are rows here, so every node's
//! sweep consults every table registered for a namespace, by any node.

use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPool};
use sqlx::Row;
use store_pg::plumbing::{db_err, digest_col, sql, GC_NOW_STATEMENT};
use store_types::{BoundLivenessTable, Key, LivenessTable, Namespace, Result};

/// Migration component of the fence and registry tables (on the pin host).
pub const GC_FENCE_COMPONENT: &str = "gc_fence";

/// Migration steps of [`GC_FENCE_COMPONENT`].
pub const GC_FENCE_STEPS: &[&str] = &["CREATE TABLE IF NOT EXISTS {schema}.gc_deleting (
        ns text COLLATE \"C\" NOT NULL,
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        fenced_at bigint NOT NULL,
        PRIMARY KEY (ns, digest)
    );
    CREATE INDEX IF NOT EXISTS gc_deleting_fenced_at ON {schema}.gc_deleting (fenced_at);
    CREATE TABLE IF NOT EXISTS {schema}.gc_liveness (
        ns text COLLATE \"C\" NOT NULL,
        table_schema text NOT NULL,
        table_name text NOT NULL,
        digest_column text NOT NULL,
        namespace_column text NOT NULL DEFAULT '',
        registrant text NOT NULL,
        digest_is_text boolean NOT NULL,
        registered_at bigint NOT NULL,
        PRIMARY KEY (ns, table_schema, table_name, digest_column, namespace_column, registrant)
    )"];

fn key_arrays(keys: &[Key]) -> (Vec<&str>, Vec<&[u8]>) {
    (
        keys.iter().map(|k| k.namespace.as_str()).collect(),
        keys.iter().map(|k| &k.digest.as_bytes()[..]).collect(),
    )
}

/// Which of `keys` are fenced, on `conn` (the batch transaction, after its
/// locks: a fresh `READ COMMITTED` statement).
pub(crate) async fn fenced_many(
    conn: &mut PgConnection,
    host_schema: &str,
    keys: &[Key],
) -> Result<Vec<bool>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let (ns, digests) = key_arrays(keys);
    let hits: Vec<i64> = sqlx::query_scalar(sql(
        host_schema,
        "SELECT k.i FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS k(ns, digest, i)
         WHERE EXISTS (SELECT 1 FROM {schema}.gc_deleting d
                       WHERE d.ns = k.ns AND d.digest = k.digest)",
    ))
    .bind(ns)
    .bind(digests)
    .fetch_all(conn)
    .await
    .map_err(db_err)?;
    Ok(store_pg::plumbing::ordinal_mask(hits, keys.len()))
}

/// Writes the fences of `keys` on `conn` (the batch transaction).
pub(crate) async fn fence(conn: &mut PgConnection, host_schema: &str, keys: &[Key]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let (ns, digests) = key_arrays(keys);
    sqlx::query(sql(
        host_schema,
        &"INSERT INTO {schema}.gc_deleting (ns, digest, fenced_at)
          SELECT k.ns, k.digest, {now} FROM unnest($1::text[], $2::bytea[]) AS k(ns, digest)
          ON CONFLICT (ns, digest) DO NOTHING"
            .replace("{now}", GC_NOW_STATEMENT),
    ))
    .bind(ns)
    .bind(digests)
    .execute(conn)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Clears the fences of `keys`.
pub(crate) async fn unfence(pool: &PgPool, host_schema: &str, keys: &[Key]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let (ns, digests) = key_arrays(keys);
    sqlx::query(sql(
        host_schema,
        "DELETE FROM {schema}.gc_deleting d USING unnest($1::text[], $2::bytea[]) AS k(ns, digest)
         WHERE d.ns = k.ns AND d.digest = k.digest",
    ))
    .bind(ns)
    .bind(digests)
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Fences older than `grace` by the database's clock, oldest first.
pub(crate) async fn stale_fences(
    pool: &PgPool,
    host_schema: &str,
    grace: Duration,
    limit: usize,
) -> Result<Vec<Key>> {
    let rows = sqlx::query(sql(
        host_schema,
        "SELECT ns, digest FROM {schema}.gc_deleting
         WHERE fenced_at <= {schema}.gc_now() - $1
         ORDER BY fenced_at, ns, digest LIMIT $2",
    ))
    .bind(i64::try_from(grace.as_millis()).unwrap_or(i64::MAX))
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    rows.iter()
        .map(|r| {
            let ns: String = r.try_get(0).map_err(db_err)?;
            Ok(Key::new(Namespace::new(ns)?, digest_col(r, 1)?))
        })
        .collect()
}

/// Inserts a (checked, bound) registration of `registrant`; idempotent.
pub(crate) async fn register(
    pool: &PgPool,
    host_schema: &str,
    bound: &BoundLivenessTable,
    registrant: &str,
) -> Result<()> {
    let t = &bound.table;
    sqlx::query(sql(
        host_schema,
        "INSERT INTO {schema}.gc_liveness
           (ns, table_schema, table_name, digest_column, namespace_column, registrant,
            digest_is_text, registered_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, {schema}.gc_now())
         ON CONFLICT (ns, table_schema, table_name, digest_column, namespace_column, registrant)
         DO UPDATE SET digest_is_text = EXCLUDED.digest_is_text",
    ))
    .bind(bound.namespace.as_str())
    .bind(&t.schema)
    .bind(&t.table)
    .bind(&t.digest_column)
    .bind(t.namespace_column.as_deref().unwrap_or(""))
    .bind(registrant)
    .bind(bound.digest_is_text)
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Deletes `registrant`'s registration (every registrant's with `None`);
/// `false` if there was none.
pub(crate) async fn deregister(
    pool: &PgPool,
    host_schema: &str,
    ns: &Namespace,
    t: &LivenessTable,
    registrant: Option<&str>,
) -> Result<bool> {
    let n = sqlx::query(sql(
        host_schema,
        "DELETE FROM {schema}.gc_liveness
         WHERE ns = $1 AND table_schema = $2 AND table_name = $3 AND digest_column = $4
           AND namespace_column = $5 AND ($6::text IS NULL OR registrant = $6)",
    ))
    .bind(ns.as_str())
    .bind(&t.schema)
    .bind(&t.table)
    .bind(&t.digest_column)
    .bind(t.namespace_column.as_deref().unwrap_or(""))
    .bind(registrant)
    .execute(pool)
    .await
    .map_err(db_err)?
    .rows_affected();
    Ok(n > 0)
}

/// Every registered table (once, whoever registered it), in a stable order.
pub(crate) async fn registered(
    pool: &PgPool,
    host_schema: &str,
) -> Result<Vec<BoundLivenessTable>> {
    let rows = sqlx::query(sql(
        host_schema,
        "SELECT ns, table_schema, table_name, digest_column, namespace_column,
                bool_or(digest_is_text)
         FROM {schema}.gc_liveness
         GROUP BY ns, table_schema, table_name, digest_column, namespace_column
         ORDER BY ns, table_schema, table_name, digest_column, namespace_column",
    ))
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    rows.iter()
        .map(|r| {
            let ns: String = r.try_get(0).map_err(db_err)?;
            let ns_col: String = r.try_get(4).map_err(db_err)?;
            let mut table = LivenessTable::new(
                r.try_get::<String, _>(1).map_err(db_err)?,
                r.try_get::<String, _>(2).map_err(db_err)?,
                r.try_get::<String, _>(3).map_err(db_err)?,
            );
            if !ns_col.is_empty() {
                table = table.with_namespace_column(ns_col);
            }
            Ok(BoundLivenessTable {
                namespace: Namespace::new(ns)?,
                table,
                digest_is_text: r.try_get(5).map_err(db_err)?,
            })
        })
        .collect()
}
