//! The migration runner: per-schema, per-component versions in
//! `{schema}.schema_version`, steps applied under an advisory lock.

use sqlx::postgres::PgPool;
use store_types::{Error, Result};

use super::{sql, stable_key, validate_schema};
use crate::error::db_err;

/// Name of the per-schema migration bookkeeping table.
pub const SCHEMA_VERSION_TABLE: &str = "schema_version";

/// Creates the schema if missing (serialised by an advisory lock, so
/// concurrent engines do not race on the catalog).
pub async fn create_schema(pool: &PgPool, schema: &str) -> Result<()> {
    validate_schema(schema)?;
    let mut tx = pool.begin().await.map_err(db_err)?;
    lock_migrations(&mut tx, schema).await?;
    sqlx::raw_sql(sql(
        schema,
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.schema_version (
             component text PRIMARY KEY,
             version integer NOT NULL
         )",
    ))
    .execute(&mut *tx)
    .await
    .map_err(db_err)?;
    tx.commit().await.map_err(db_err)
}

async fn lock_migrations(tx: &mut sqlx::PgConnection, schema: &str) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(stable_key(&["blobpool/migrate", schema]))
        .execute(tx)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// The applied version of `component` in `schema` (0 when never migrated).
pub async fn schema_version(pool: &PgPool, schema: &str, component: &str) -> Result<u32> {
    let v: Option<i32> = sqlx::query_scalar(sql(
        schema,
        "SELECT version FROM {schema}.schema_version WHERE component = $1",
    ))
    .bind(component)
    .fetch_optional(pool)
    .await
    .map_err(db_err)?;
    Ok(v.unwrap_or(0).max(0) as u32)
}

/// Brings `component` in `schema` to version `steps.len()`.
///
/// Creates the schema and its `schema_version(component text primary key,
/// version integer)` table if missing. Step `i` (0-based) takes the
/// component from version `i` to `i + 1`; each step is one transaction
/// holding a per-schema advisory lock, re-reads the version under the lock
/// and is skipped when already applied, so concurrent runners and reruns
/// are harmless. Steps may hold several statements (`;`-separated) and use
/// `{schema}` for the quoted schema name. A component at a version newer
/// than `steps.len()` is [`Error::Config`]. Returns the final version.
pub async fn migrate(pool: &PgPool, schema: &str, component: &str, steps: &[&str]) -> Result<u32> {
    create_schema(pool, schema).await?;
    let target = steps.len() as u32;
    let current = schema_version(pool, schema, component).await?;
    if current > target {
        return Err(Error::Config(format!(
            "schema {schema} has {component} at version {current}, newer than this build's {target}"
        )));
    }
    for (i, step) in steps.iter().enumerate().skip(current as usize) {
        let version = i as u32 + 1;
        let mut tx = pool.begin().await.map_err(db_err)?;
        lock_migrations(&mut tx, schema).await?;
        let now: Option<i32> = sqlx::query_scalar(sql(
            schema,
            "SELECT version FROM {schema}.schema_version WHERE component = $1 FOR UPDATE",
        ))
        .bind(component)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_err)?;
        if now.unwrap_or(0) as u32 >= version {
            tx.commit().await.map_err(db_err)?;
            continue;
        }
        sqlx::raw_sql(sql(schema, step))
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        sqlx::query(sql(
            schema,
            "INSERT INTO {schema}.schema_version (component, version) VALUES ($1, $2)
             ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
        ))
        .bind(component)
        .bind(version as i32)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        tracing::debug!(schema, component, version, "applied migration step");
    }
    Ok(target)
}

/// Names of the `gc_*` tables in `schema`, sorted.
pub async fn gc_tables(pool: &PgPool, schema: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname LIKE 'gc\\_%'",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    names.sort();
    Ok(names)
}
