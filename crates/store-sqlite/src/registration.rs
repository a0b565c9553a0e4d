//! The engine's registry entry (ADR-027): `sqlite://PATH`, kv tier.

use std::path::Path;

use async_trait::async_trait;
use store_types::registry::{EngineFactory, EngineUrl, Opened, Options};
use store_types::{Error, KvEngine, Result, Tier};

use crate::{Durability, SqliteEngine, SqliteOptions};

/// `sqlite://PATH` (relative to the working directory; `sqlite:///abs`
/// for an absolute one). Settings: `durability = full | normal`,
/// `readers = N`, `cache_bytes = SIZE` (the hot-entry cache, e.g. `64MiB`;
/// `0` turns it off).
pub static REGISTRATION: &dyn EngineFactory = &SqliteFactory;

/// The factory behind [`REGISTRATION`].
struct SqliteFactory;

/// The settings [`SqliteFactory`] takes.
const PARAMS: &[&str] = &["durability", "readers", "cache_bytes"];

impl SqliteFactory {
    fn options(options: &Options) -> Result<SqliteOptions> {
        let mut o = SqliteOptions::default();
        if let Some(d) = options.parsed("sqlite", "durability", |v| {
            match v.to_ascii_lowercase().as_str() {
                "full" => Ok(Durability::Full),
                "normal" => Ok(Durability::Normal),
                _ => Err(store_types::registry::ParamError::NotOneOf(
                    "full or normal",
                )),
            }
        })? {
            o.durability = d;
        }
        if let Some(n) = options.parsed(
            "sqlite",
            "readers",
            store_types::registry::parse_count_param,
        )? {
            o.readers = n;
        }
        if let Some(n) = options.parsed(
            "sqlite",
            "cache_bytes",
            store_types::registry::parse_size_param,
        )? {
            o.cache_bytes = n;
        }
        Ok(o)
    }

    fn path(url: &EngineUrl) -> Result<&Path> {
        if url.rest().is_empty() {
            return Err(Error::Config(format!(
                "{url:?}: missing path after sqlite://"
            )));
        }
        Ok(Path::new(url.rest()))
    }
}

#[async_trait]
impl EngineFactory for SqliteFactory {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["sqlite"]
    }

    fn tiers(&self) -> &'static [Tier] {
        &[Tier::Kv]
    }

    fn usage(&self, _tier: Tier) -> &'static str {
        "sqlite://PATH"
    }

    fn accepts_param(&self, _url: &EngineUrl, key: &str) -> bool {
        PARAMS.contains(&key)
    }

    fn param_names(&self) -> &'static [&'static str] {
        PARAMS
    }

    fn check(&self, url: &EngineUrl, _tier: Tier, options: &Options) -> Result<()> {
        Self::path(url)?;
        Self::options(options).map(drop)
    }

    fn describe(&self, url: &EngineUrl, _tier: Tier, options: &Options) -> String {
        let normal = matches!(
            Self::options(options).map(|o| o.durability),
            Ok(Durability::Normal)
        );
        format!(
            "sqlite {}{}",
            url.rest(),
            if normal { " (synchronous=NORMAL)" } else { "" }
        )
    }

    async fn open_kv(&self, url: &EngineUrl, options: &Options) -> Result<Opened<dyn KvEngine>> {
        let engine = SqliteEngine::open(Self::path(url)?, Self::options(options)?).await?;
        Ok(store_types::opened!(engine, hooks::SqliteTesting))
    }
}

#[cfg(feature = "testing")]
mod hooks {
    use async_trait::async_trait;
    use store_types::registry::Testing;
    use store_types::{Key, Result};

    use crate::SqliteEngine;

    /// The test hooks: corruption in place.
    pub(super) struct SqliteTesting(pub(super) SqliteEngine);

    #[async_trait]
    impl Testing for SqliteTesting {
        async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
            self.0.corrupt_one_byte(key).await
        }
    }
}
