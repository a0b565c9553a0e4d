//! The engine's registry entry (ADR-027): `postgres://…[?schema=S]`
//! (also `postgresql://`), kv tier.

use async_trait::async_trait;
use store_pg::url::target;
use store_types::registry::{EngineFactory, EngineUrl, Opened, Options};
use store_types::{KvEngine, Result, Tier};

use crate::PostgresEngine;

/// `postgres://…` or `postgresql://…`: the query goes to the driver
/// (`sslmode=…`), except `schema=S`, the schema holding the tables
/// (default [`Options::schema`]).
pub static REGISTRATION: &dyn EngineFactory = &PostgresFactory;

/// The factory behind [`REGISTRATION`].
struct PostgresFactory;

#[async_trait]
impl EngineFactory for PostgresFactory {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["postgres", "postgresql"]
    }

    fn tiers(&self) -> &'static [Tier] {
        &[Tier::Kv]
    }

    fn usage(&self, _tier: Tier) -> &'static str {
        "postgres://…[?schema=S]"
    }

    fn store_id(&self, url: &EngineUrl, options: &Options) -> String {
        let (driver, schema) = target(url, options);
        format!("{driver}#schema={schema}")
    }

    fn check(&self, _url: &EngineUrl, _tier: Tier, _options: &Options) -> Result<()> {
        Ok(())
    }

    fn describe(&self, url: &EngineUrl, _tier: Tier, options: &Options) -> String {
        let (driver, schema) = target(url, options);
        format!(
            "postgres {} (schema {schema})",
            store_types::registry::redact_url(&driver)
        )
    }

    async fn open_kv(&self, url: &EngineUrl, options: &Options) -> Result<Opened<dyn KvEngine>> {
        let (driver, schema) = target(url, options);
        let engine = PostgresEngine::connect(&driver, &schema).await?;
        Ok(store_types::opened!(engine, hooks::PgTesting))
    }
}

#[cfg(feature = "testing")]
mod hooks {
    use std::time::Duration;

    use async_trait::async_trait;
    use store_types::registry::Testing;
    use store_types::{Key, Result, Timestamp};

    use crate::PostgresEngine;

    /// The test hooks: corruption in place, the database's GC clock.
    pub(super) struct PgTesting(pub(super) PostgresEngine);

    #[async_trait]
    impl Testing for PgTesting {
        async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
            self.0.corrupt_one_byte(key).await
        }

        async fn set_clock(&self, at: Timestamp) -> Result<bool> {
            store_pg::testing::set_db_clock(self.0.pool(), self.0.schema(), at).await?;
            Ok(true)
        }

        async fn advance_clock(&self, d: Duration) -> Result<bool> {
            store_pg::testing::advance_db_clock(self.0.pool(), self.0.schema(), d).await?;
            Ok(true)
        }
    }
}
