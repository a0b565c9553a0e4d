//! The engine's registry entry (ADR-027): `pglo://…[?schema=S]` (also
//! `postgres+lo://`, `postgresql+lo://`), large tier.

use async_trait::async_trait;
use store_pg::url::target;
use store_types::registry::{EngineFactory, EngineUrl, Opened, Options};
use store_types::{LargeEngine, Result, Tier};

use crate::PgLoEngine;

/// `pglo://…`: a PostgreSQL URL whose scheme says "large objects"; the
/// query goes to the driver except `schema=S` (default
/// [`Options::schema`]).
pub static REGISTRATION: &dyn EngineFactory = &PgLoFactory;

/// The factory behind [`REGISTRATION`].
struct PgLoFactory;

#[async_trait]
impl EngineFactory for PgLoFactory {
    fn name(&self) -> &'static str {
        "pg-lo"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["pglo", "postgres+lo", "postgresql+lo"]
    }

    fn tiers(&self) -> &'static [Tier] {
        &[Tier::Large]
    }

    fn usage(&self, _tier: Tier) -> &'static str {
        "pglo://…[?schema=S] (or postgres+lo://…)"
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
            "pg-lo {} (schema {schema})",
            store_types::registry::redact_url(&driver)
        )
    }

    async fn open_large(
        &self,
        url: &EngineUrl,
        options: &Options,
    ) -> Result<Opened<dyn LargeEngine>> {
        let (driver, schema) = target(url, options);
        let engine = PgLoEngine::connect(&driver, &schema).await?;
        Ok(store_types::opened!(engine, hooks::PgLoTesting))
    }
}

#[cfg(feature = "testing")]
mod hooks {
    use std::time::Duration;

    use async_trait::async_trait;
    use store_pg::testing::{advance_db_clock, set_db_clock};
    use store_types::registry::Testing;
    use store_types::{Key, Result, Timestamp};

    use crate::PgLoEngine;

    /// The test hooks: corruption in place, the database's GC clock.
    pub(super) struct PgLoTesting(pub(super) PgLoEngine);

    #[async_trait]
    impl Testing for PgLoTesting {
        async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
            self.0.corrupt_one_byte(key).await
        }

        async fn corrupt_byte_at(&self, key: &Key, offset: u64) -> Result<()> {
            self.0.corrupt_byte_at(key, offset).await
        }

        async fn set_clock(&self, at: Timestamp) -> Result<bool> {
            set_db_clock(self.0.pool(), self.0.schema(), at).await?;
            Ok(true)
        }

        async fn advance_clock(&self, d: Duration) -> Result<bool> {
            advance_db_clock(self.0.pool(), self.0.schema(), d).await?;
            Ok(true)
        }
    }
}
