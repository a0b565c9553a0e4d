//! Shared test plumbing: a fresh schema per test, dropped at the end
//! (also when the test panics).
#![allow(dead_code, unused_imports)] // each test binary uses a different subset

use store_postgres::PostgresEngine;

use store_pg::testing::unreachable_msg;
pub use store_pg::testing::{blob, key_of, ns, read_all, TestSchema};

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
