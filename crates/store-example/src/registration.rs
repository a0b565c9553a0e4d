//! The engine's registry entry (ADR-027): `example://`, either tier.
//!
//! This file and the one line in `store-registry`'s `Registry::default`
//! are all it takes to make an engine reachable from every configuration
//! (docs/ENGINES.md, "Adding an engine").

use std::sync::Arc;

use async_trait::async_trait;
use store_types::registry::{EngineFactory, EngineUrl, Opened, Options, Testing};
use store_types::{Error, KvEngine, LargeEngine, Result, Tier};

use crate::ExampleEngine;

/// `example://`: a fresh, private [`ExampleEngine`] per open, for either
/// tier. Takes no settings.
pub static REGISTRATION: &dyn EngineFactory = &ExampleFactory;

/// The factory behind [`REGISTRATION`].
struct ExampleFactory;

#[async_trait]
impl EngineFactory for ExampleFactory {
    fn name(&self) -> &'static str {
        "example"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["example"]
    }

    fn tiers(&self) -> &'static [Tier] {
        &[Tier::Kv, Tier::Large]
    }

    fn usage(&self, _tier: Tier) -> &'static str {
        "example://"
    }

    fn private(&self, _url: &EngineUrl) -> bool {
        true
    }

    fn check(&self, url: &EngineUrl, _tier: Tier, _options: &Options) -> Result<()> {
        if url.rest().is_empty() {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "{url:?}: example:// takes no path or parameters"
            )))
        }
    }

    fn describe(&self, _url: &EngineUrl, _tier: Tier, _options: &Options) -> String {
        "example (toy, in memory, lost on exit)".to_string()
    }

    async fn open_kv(&self, _url: &EngineUrl, _options: &Options) -> Result<Opened<dyn KvEngine>> {
        Ok(kv(ExampleEngine::new()))
    }

    async fn open_large(
        &self,
        _url: &EngineUrl,
        _options: &Options,
    ) -> Result<Opened<dyn LargeEngine>> {
        Ok(large(ExampleEngine::new()))
    }
}

fn kv(engine: ExampleEngine) -> Opened<dyn KvEngine> {
    Opened {
        testing: hooks(&engine),
        engine: Arc::new(engine),
    }
}

fn large(engine: ExampleEngine) -> Opened<dyn LargeEngine> {
    Opened {
        testing: hooks(&engine),
        engine: Arc::new(engine),
    }
}

/// The test hooks, with feature `testing`.
fn hooks(engine: &ExampleEngine) -> Option<Arc<dyn Testing>> {
    if cfg!(feature = "testing") {
        Some(Arc::new(ExampleTesting(engine.clone())))
    } else {
        None
    }
}

/// The test hooks: flip a byte in place (the middle one, or one chosen), and reopen as the same data (a
/// restart of an in-memory engine that kept its map, which is what the
/// contract suite's restart cases need).
struct ExampleTesting(ExampleEngine);

#[async_trait]
impl Testing for ExampleTesting {
    async fn corrupt_one_byte(&self, key: &store_types::Key) -> Result<()> {
        let mut entries = self.0.entries();
        let entry = entries.get_mut(key).ok_or(Error::Missing)?;
        let mut data = entry.bytes.to_vec();
        let mid = data.len() / 2;
        match data.get_mut(mid) {
            Some(b) => *b ^= 0xff,
            None => data.push(0),
        }
        entry.bytes = data.into();
        Ok(())
    }

    async fn corrupt_byte_at(&self, key: &store_types::Key, offset: u64) -> Result<()> {
        let mut entries = self.0.entries();
        let entry = entries.get_mut(key).ok_or(Error::Missing)?;
        let mut data = entry.bytes.to_vec();
        let byte = usize::try_from(offset)
            .ok()
            .and_then(|i| data.get_mut(i))
            .ok_or_else(|| {
                Error::backend(
                    store_types::ErrorKind::InvalidData,
                    "corrupting a byte past the end",
                )
                .with_key(key)
            })?;
        *byte ^= 0xff;
        entry.bytes = data.into();
        Ok(())
    }

    async fn reopen_kv(&self) -> Option<Result<Opened<dyn KvEngine>>> {
        Some(Ok(kv(self.0.clone())))
    }

    async fn reopen_large(&self) -> Option<Result<Opened<dyn LargeEngine>>> {
        Some(Ok(large(self.0.clone())))
    }
}
