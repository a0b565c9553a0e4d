//! Shared test plumbing: a fresh schema per test, dropped at the end
//! (also when the test panics).
#![allow(dead_code)]

use bytes::Bytes;
use store_postgres::PostgresEngine;
use store_types::{Digest, Key, Namespace};

use store_postgres::testing::unreachable_msg;
pub use store_postgres::testing::TestSchema;

/// Opens this crate's engine on a test schema.
pub trait OpenEngine {
    /// An engine on the schema; fails the test (naming DATABASE_URL) when
    /// the server is unreachable.
    async fn engine(&self) -> PostgresEngine;
}

impl OpenEngine for TestSchema {
    async fn engine(&self) -> PostgresEngine {
        PostgresEngine::connect(&self.url, &self.name)
            .await
            .unwrap_or_else(|e| panic!("{}", unreachable_msg(&self.url, &e)))
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
