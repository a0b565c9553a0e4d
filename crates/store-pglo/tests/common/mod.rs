//! Shared test plumbing: a fresh schema per test; at the end (also on
//! panic) its large objects are unlinked and the schema is dropped.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use store_pglo::PgLoEngine;
use store_types::{Digest, Key, LargeEngine, Namespace, PublishOutcome};

/// The default when `DATABASE_URL` is unset.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `DATABASE_URL`, or the local default.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// A uniquely named schema, cleaned up when this guard drops.
pub struct TestSchema {
    pub url: String,
    pub name: String,
}

impl TestSchema {
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let seed = format!(
            "lo/{nanos}/{}/{}/{:?}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            std::thread::current().id()
        );
        let name = format!("t_{}", &Digest::of(seed.as_bytes()).to_hex()[..24]);
        TestSchema {
            url: database_url(),
            name,
        }
    }

    /// An engine on this schema; fails the test (naming DATABASE_URL) when
    /// the server is unreachable.
    pub async fn engine(&self) -> PgLoEngine {
        PgLoEngine::connect(&self.url, &self.name)
            .await
            .unwrap_or_else(|e| panic!("{}", unreachable_msg(&self.url, &e)))
    }

    /// A raw pool to the test database.
    pub async fn pool(&self) -> sqlx::PgPool {
        sqlx::PgPool::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("{}", unreachable_msg(&self.url, &e)))
    }
}

fn unreachable_msg(url: &str, e: &dyn std::fmt::Display) -> String {
    format!(
        "cannot use PostgreSQL at DATABASE_URL={url} ({e}); set DATABASE_URL to a reachable \
         server (tests never skip)"
    )
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let url = self.url.clone();
        let q = format!("\"{}\"", self.name);
        // Large objects are database-wide: unlink ours before the schema goes.
        let stmt = format!(
            "DO $$ BEGIN
                IF to_regclass('{q}.lo_entries') IS NOT NULL THEN
                    PERFORM lo_unlink(m.oid) FROM pg_largeobject_metadata m
                    WHERE m.oid IN (SELECT oid FROM {q}.lo_entries);
                END IF;
             END $$;
             DROP SCHEMA IF EXISTS {q} CASCADE"
        );
        let joined = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                use sqlx::Connection;
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

pub fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

pub fn key_of(namespace: &str, content: &[u8]) -> Key {
    Key::new(ns(namespace), Digest::of(content))
}

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

/// Stages `data` in `chunk`-sized writes and publishes it under its digest.
pub async fn put(e: &PgLoEngine, namespace: &str, data: &Bytes, chunk: usize) -> PublishOutcome {
    let k = key_of(namespace, data);
    let mut stage = e.stage(&k.namespace).await.unwrap();
    for piece in data.chunks(chunk.max(1)) {
        stage.write(data.slice_ref(piece)).await.unwrap();
    }
    stage.publish(&k).await.unwrap()
}

pub async fn read_all(r: store_types::BlobReader) -> std::io::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut reader = r.reader;
    reader.read_to_end(&mut out).await?;
    Ok(out)
}
