//! Shared test plumbing: a fresh schema per test; at the end (also on
//! panic) its large objects are unlinked and the schema is dropped.
#![allow(dead_code, unused_imports)] // each test binary uses a different subset

use bytes::Bytes;
use store_pglo::PgLoEngine;
use store_types::{LargeEngine, PublishOutcome};

use store_pg::testing::unreachable_msg;
pub use store_pg::testing::{blob, key_of, ns, read_all, TestSchema};

/// Opens this crate's engine on a test schema.
pub trait OpenEngine {
    /// An engine on the schema; fails the test (naming DATABASE_URL) when
    /// the server is unreachable.
    async fn engine(&self) -> PgLoEngine;
}

impl OpenEngine for TestSchema {
    async fn engine(&self) -> PgLoEngine {
        PgLoEngine::connect(&self.url, &self.name)
            .await
            .unwrap_or_else(|e| panic!("{}", unreachable_msg(&self.url, &e)))
    }
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
