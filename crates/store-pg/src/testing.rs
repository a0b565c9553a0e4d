//! Test support shared by every crate whose tests need PostgreSQL (feature
//! `testing`): a uniquely named schema per test, removed when the guard
//! drops — also when the test panics — with its large objects unlinked
//! first (they are database-wide and would otherwise leak); and control of
//! a schema's GC clock ([`set_db_clock`], [`advance_db_clock`]) through the
//! `gc_clock` test hook.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use sqlx::Connection;
use store_types::{Digest, Key, Namespace, Timestamp};

use crate::plumbing::{db_err, duration_ms, migrate, sql, GC_WINDOW_COMPONENT, GC_WINDOW_STEPS};

/// The server tests use when `DATABASE_URL` is unset.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`].
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_string())
}

/// The panic message of a test that cannot reach its server: tests never
/// pass by skipping.
pub fn unreachable_msg(url: &str, e: &dyn std::fmt::Display) -> String {
    format!(
        "cannot use PostgreSQL at DATABASE_URL={url} ({e}); set DATABASE_URL to a reachable \
         server (tests never skip)"
    )
}

/// A fresh schema name (not yet created), dropped with everything in it
/// when the guard drops.
pub struct TestSchema {
    /// The database URL.
    pub url: String,
    /// The schema name (`t_` + 24 hex).
    pub name: String,
}

impl Default for TestSchema {
    fn default() -> Self {
        Self::new()
    }
}

impl TestSchema {
    /// A new unique name on `DATABASE_URL`.
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let seed = format!(
            "{nanos}/{}/{}/{:?}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::thread::current().id()
        );
        TestSchema {
            url: database_url(),
            name: format!("t_{}", &Digest::of(seed.as_bytes()).to_hex()[..24]),
        }
    }

    /// A pool to the test database; panics naming `DATABASE_URL` when the
    /// server is unreachable.
    pub async fn pool(&self) -> sqlx::PgPool {
        sqlx::PgPool::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("{}", unreachable_msg(&self.url, &e)))
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let url = self.url.clone();
        let q = format!("\"{}\"", self.name);
        let stmt = format!(
            "DO $$ BEGIN
                IF to_regclass('{q}.lo_entries') IS NOT NULL THEN
                    PERFORM lo_unlink(m.oid) FROM pg_largeobject_metadata m
                    WHERE m.oid IN (SELECT oid FROM {q}.lo_entries);
                END IF;
             END $$;
             DROP SCHEMA IF EXISTS {q} CASCADE"
        );
        // Drop may run inside or outside a runtime: use a private one on a
        // thread of its own.
        let joined = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(sqlx::Error::Io)?;
            rt.block_on(async move {
                let mut conn = sqlx::PgConnection::connect(&url).await?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(stmt))
                    .execute(&mut conn)
                    .await?;
                conn.close().await
            })
        })
        .join();
        if let Ok(Err(e)) = joined {
            eprintln!("could not drop test schema {}: {e}", self.name);
        }
    }
}

/// Stops the GC clock of `schema` (`<schema>.gc_now()`, the clock every
/// pin and window judgement on the SQL hosts uses) at `at`, until the next
/// [`set_db_clock`]; [`advance_db_clock`] moves it from there. Migrates the
/// schema's `gc_window` component first (creating the schema if needed), so
/// it may run before any engine has.
///
/// Through the `gc_clock` test hook, which production leaves empty. A
/// frozen clock makes window and expiry boundaries exact in tests: a test
/// that moves an injected `ManualClock` and the database clock by the same
/// steps sees both agree to the millisecond.
pub async fn set_db_clock(
    pool: &sqlx::PgPool,
    schema: &str,
    at: Timestamp,
) -> store_types::Result<()> {
    migrate(pool, schema, GC_WINDOW_COMPONENT, GC_WINDOW_STEPS).await?;
    sqlx::query(sql(
        schema,
        "INSERT INTO {schema}.gc_clock (one, offset_ms, frozen_at_ms) VALUES (true, 0, $1)
         ON CONFLICT (one) DO UPDATE SET offset_ms = 0, frozen_at_ms = EXCLUDED.frozen_at_ms",
    ))
    .bind(at.0)
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Moves the GC clock of `schema` forward by `d` — the database's clock,
/// which every node of a fleet sees alike (unlike a node's clock skew) —
/// whether it runs (an offset to the server's `now()`) or is stopped
/// ([`set_db_clock`]). The schema's GC tables must exist.
pub async fn advance_db_clock(
    pool: &sqlx::PgPool,
    schema: &str,
    d: Duration,
) -> store_types::Result<()> {
    sqlx::query(sql(
        schema,
        "INSERT INTO {schema}.gc_clock AS c (one, offset_ms) VALUES (true, $1)
         ON CONFLICT (one) DO UPDATE SET offset_ms = c.offset_ms + EXCLUDED.offset_ms",
    ))
    .bind(duration_ms(d))
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// The GC clock of `schema` now (`SELECT <schema>.gc_now()`).
pub async fn db_now(pool: &sqlx::PgPool, schema: &str) -> store_types::Result<Timestamp> {
    let now: i64 = sqlx::query_scalar(sql(schema, "SELECT {schema}.gc_now()"))
        .fetch_one(pool)
        .await
        .map_err(db_err)?;
    Ok(Timestamp(now))
}

/// A valid namespace (panics on a bad name: test input).
pub fn ns(s: &str) -> Namespace {
    Namespace::new(s).expect("valid test namespace")
}

/// The key `content` gets in `namespace`.
pub fn key_of(namespace: &str, content: &[u8]) -> Key {
    Key::new(ns(namespace), Digest::of(content))
}

/// `len` deterministic, incompressible-looking bytes for `seed`.
pub fn blob(seed: u64, len: usize) -> Bytes {
    let mut out = Vec::with_capacity(len + 32);
    let mut block = Digest::of(&seed.to_le_bytes());
    while out.len() < len {
        out.extend_from_slice(block.as_bytes());
        block = Digest::of(block.as_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// Everything a reader yields.
pub async fn read_all(r: store_types::BlobReader) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut reader = r.into_stream().reader;
    reader.read_to_end(&mut out).await?;
    Ok(out)
}
