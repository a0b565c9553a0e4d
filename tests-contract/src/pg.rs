//! Per-test PostgreSQL schemas, dropped when the test ends (the guard is
//! store-postgres's shared `testing::TestSchema`).

use sqlx::Connection;
use store_pg::testing::{database_url, unreachable_msg, TestSchema};

/// A pair of fresh schemas (kv engine and pg-lo engine) in the test
/// database. Dropping it unlinks the large objects they own and drops both.
pub struct PgSchemas {
    /// Connection URL.
    pub url: String,
    /// Schema of the kv engine.
    pub kv_schema: String,
    /// Schema of the pg-lo engine.
    pub lo_schema: String,
    _guards: [TestSchema; 2],
}

impl PgSchemas {
    /// Checks the server is reachable and picks fresh schema names (the
    /// engines create them). Panics naming `DATABASE_URL` when the server
    /// cannot be reached: PostgreSQL tests never pass by skipping.
    pub async fn create() -> Self {
        let url = database_url();
        if let Err(e) = sqlx::PgConnection::connect(&url).await {
            panic!("{}", unreachable_msg(&url, &e));
        }
        let (kv, lo) = (TestSchema::new(), TestSchema::new());
        PgSchemas {
            url,
            kv_schema: kv.name.clone(),
            lo_schema: lo.name.clone(),
            _guards: [kv, lo],
        }
    }
}
