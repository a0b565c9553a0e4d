//! The engine's registry entry (ADR-027): `file://PATH`, large tier.

use std::path::Path;

use async_trait::async_trait;
use store_types::registry::{EngineFactory, EngineUrl, Opened, Options};
use store_types::{Error, LargeEngine, Result, Tier};

use crate::{LocalEngine, LocalOptions};

/// `file://PATH` (relative to the working directory; `file:///abs` for
/// an absolute one). Takes [`Options::shared_media`] and
/// [`Options::fsync`]; setting `open_files = N` (the open-file cache,
/// TUNING.md §local-small-reads; `0` turns it off).
pub static REGISTRATION: &dyn EngineFactory = &LocalFactory;

/// The factory behind [`REGISTRATION`].
struct LocalFactory;

/// The settings [`LocalFactory`] takes.
const PARAMS: &[&str] = &["open_files"];

fn options(options: &Options) -> Result<LocalOptions> {
    let mut o = LocalOptions {
        shared_media: options.shared_media,
        fsync: options.fsync,
        ..LocalOptions::default()
    };
    if let Some(n) = options.parsed(
        "local",
        "open_files",
        store_types::registry::parse_count_param,
    )? {
        o.open_files = n;
    }
    Ok(o)
}

fn root(url: &EngineUrl) -> Result<&Path> {
    if url.rest().is_empty() {
        return Err(Error::Config(format!(
            "{url:?}: missing path after file://"
        )));
    }
    Ok(Path::new(url.rest()))
}

#[async_trait]
impl EngineFactory for LocalFactory {
    fn name(&self) -> &'static str {
        "local"
    }

    fn schemes(&self) -> &'static [&'static str] {
        &["file"]
    }

    fn tiers(&self) -> &'static [Tier] {
        &[Tier::Large]
    }

    fn usage(&self, _tier: Tier) -> &'static str {
        "file://PATH"
    }

    fn accepts_param(&self, _url: &EngineUrl, key: &str) -> bool {
        PARAMS.contains(&key)
    }

    fn param_names(&self) -> &'static [&'static str] {
        PARAMS
    }

    fn check(&self, url: &EngineUrl, _tier: Tier, options: &Options) -> Result<()> {
        root(url)?;
        self::options(options).map(drop)
    }

    fn describe(&self, url: &EngineUrl, _tier: Tier, options: &Options) -> String {
        format!(
            "file {}{}{}",
            url.rest(),
            if options.shared_media {
                " (shared media)"
            } else {
                ""
            },
            if options.fsync { "" } else { " (no fsync)" }
        )
    }

    async fn open_large(
        &self,
        url: &EngineUrl,
        options: &Options,
    ) -> Result<Opened<dyn LargeEngine>> {
        let engine = LocalEngine::open(root(url)?, self::options(options)?).await?;
        Ok(store_types::opened!(engine, hooks::LocalTesting))
    }
}

#[cfg(feature = "testing")]
mod hooks {
    use async_trait::async_trait;
    use store_types::registry::Testing;
    use store_types::{Error, Key, Result};

    use crate::LocalEngine;

    /// The test hooks: corruption in place, stage-file count.
    pub(super) struct LocalTesting(pub(super) LocalEngine);

    #[async_trait]
    impl Testing for LocalTesting {
        async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
            self.0.corrupt_one_byte(key).await
        }

        async fn corrupt_byte_at(&self, key: &Key, offset: u64) -> Result<()> {
            self.0.corrupt_byte_at(key, offset).await
        }

        async fn stage_files(&self) -> Result<usize> {
            self.0.stage_file_count().map_err(Error::from)
        }
    }
}
