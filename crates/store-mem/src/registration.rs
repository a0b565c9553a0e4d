//! The engine's registry entry (ADR-027): `mem://`, either tier.

use std::sync::Arc;

use async_trait::async_trait;
use store_types::registry::{EngineFactory, EngineUrl, Opened, Options};
use store_types::{Error, KvEngine, LargeEngine, Result, Tier};

use crate::MemEngine;

/// `mem://`: a fresh in-memory engine per open, for either tier.
pub static REGISTRATION: &dyn EngineFactory = &MemFactory;

/// The factory behind [`REGISTRATION`].
struct MemFactory;

#[async_trait]
impl EngineFactory for MemFactory {
    fn name(&self) -> &'static str {
        "mem"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["mem"]
    }

    fn tiers(&self) -> &'static [Tier] {
        &[Tier::Kv, Tier::Large]
    }

    fn usage(&self, _tier: Tier) -> &'static str {
        "mem://"
    }

    fn private(&self, _url: &EngineUrl) -> bool {
        true
    }

    fn check(&self, url: &EngineUrl, _tier: Tier, _options: &Options) -> Result<()> {
        if url.rest().is_empty() {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "{url:?}: mem:// takes no path or parameters"
            )))
        }
    }

    fn describe(&self, _url: &EngineUrl, _tier: Tier, _options: &Options) -> String {
        "mem (in memory, lost on exit)".to_string()
    }

    async fn open_kv(&self, _url: &EngineUrl, _options: &Options) -> Result<Opened<dyn KvEngine>> {
        Ok(kv(MemEngine::new()))
    }

    async fn open_large(
        &self,
        _url: &EngineUrl,
        _options: &Options,
    ) -> Result<Opened<dyn LargeEngine>> {
        Ok(large(MemEngine::new()))
    }
}

/// The test hooks of `engine` (feature `testing`).
fn testing(engine: &MemEngine) -> Option<Arc<dyn store_types::registry::Testing>> {
    #[cfg(feature = "testing")]
    return Some(Arc::new(hooks::MemTesting(engine.clone())));
    #[cfg(not(feature = "testing"))]
    {
        let _ = engine;
        None
    }
}

/// `engine` as an opened kv engine.
fn kv(engine: MemEngine) -> Opened<dyn KvEngine> {
    Opened {
        testing: testing(&engine),
        engine: Arc::new(engine),
    }
}

/// `engine` as an opened large engine.
fn large(engine: MemEngine) -> Opened<dyn LargeEngine> {
    Opened {
        testing: testing(&engine),
        engine: Arc::new(engine),
    }
}

#[cfg(feature = "testing")]
mod hooks {
    use async_trait::async_trait;
    use store_types::registry::{Opened, Testing};
    use store_types::{Key, KvEngine, LargeEngine, Result};

    use crate::MemEngine;

    /// The test hooks: corruption in place, and reopen as the same data
    /// (a clone shares it).
    pub(super) struct MemTesting(pub(super) MemEngine);

    #[async_trait]
    impl Testing for MemTesting {
        async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
            self.0.corrupt_one_byte(key)
        }

        async fn corrupt_byte_at(&self, key: &Key, offset: u64) -> Result<()> {
            self.0.corrupt_byte_at(key, offset)
        }

        async fn reopen_kv(&self) -> Option<Result<Opened<dyn KvEngine>>> {
            Some(Ok(super::kv(self.0.clone())))
        }

        async fn reopen_large(&self) -> Option<Result<Opened<dyn LargeEngine>>> {
            Some(Ok(super::large(self.0.clone())))
        }
    }
}
