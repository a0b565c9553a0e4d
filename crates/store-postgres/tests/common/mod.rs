//! Shared test plumbing: a fresh schema per test, dropped at the end
//! (also when the test panics).
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use store_postgres::PostgresEngine;
use store_types::{Digest, Key, Namespace};

/// The default when `DATABASE_URL` is unset.
pub const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// `DATABASE_URL`, or the local default.
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// A uniquely named schema, dropped (CASCADE) when this guard drops.
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
            "{nanos}/{}/{}/{:?}",
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
    pub async fn engine(&self) -> PostgresEngine {
        PostgresEngine::connect(&self.url, &self.name)
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
        let stmt = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name);
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
    // Deterministic, incompressible-looking bytes.
    let mut out = Vec::with_capacity(len + 32);
    let mut block = Digest::of(&seed.to_le_bytes());
    while out.len() < len {
        out.extend_from_slice(block.as_bytes());
        block = Digest::of(block.as_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

pub async fn read_all(r: store_types::BlobReader) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut out = Vec::new();
    let mut reader = r.reader;
    reader.read_to_end(&mut out).await.unwrap();
    out
}
