//! Blobpool's engine registry (ADR-027): the one place a configuration —
//! an engine URL plus [`Options`] — becomes an engine.
//!
//! ```no_run
//! # async fn f() -> store_types::Result<()> {
//! use store_registry::{Options, Registry};
//!
//! let registry = Registry::default();
//! let kv = registry.open_kv("sqlite://./data/kv.sqlite", &Options::default()).await?;
//! let large = registry.open_large("file://./data/large", &Options::default()).await?;
//! # Ok(()) }
//! ```
//!
//! Each engine crate exports a `REGISTRATION` (an
//! [`EngineFactory`], vocabulary of
//! `store-types`); [`Registry::default`] lists them, one line per engine,
//! each behind the engine's cargo feature (`mem`, `sqlite`, `postgres`,
//! `pglo`, `local`, `object`; `s3`, `gcs`, `azure`, `http` for object-store
//! backends; `example` for the toy engine). The binary's config, the
//! contract suite and the bench fixtures all open engines through it, so
//! adding an engine is the engine crate, one line here and one line in the
//! contract suite (docs/ENGINES.md, "Adding an engine").
//!
//! | URL | engine | tier |
//! |---|---|---|
//! | `mem://` | store-mem | kv, large |
//! | `sqlite://PATH` | store-sqlite | kv |
//! | `postgres://…[?schema=S]`, `postgresql://…` | store-postgres | kv |
//! | `file://PATH` | store-local | large |
//! | `pglo://…[?schema=S]`, `postgres+lo://…`, `postgresql+lo://…` | store-pglo | large |
//! | `s3://BUCKET/PREFIX`, `gs://…`, `az://…`, `http(s)://…`, `object+file:///PATH`, `object+memory://` | store-object | large |
//!
//! Every error is an [`Error::Config`] whose message shows the URL with
//! its password redacted. An unknown param key is an error naming the key
//! and the keys the engine takes.
//!
//! With the `testing` feature the engines fill [`Opened::testing`]: the
//! hooks test suites need (corrupting a byte, counting stage files, moving
//! a database's clock, reopening in-memory data) without naming engines.
//!
//! Architecture invariant: this crate depends on `store-types` and the
//! engine crates only; engines never depend on it and the facade
//! (`store-core`) never names it.

use std::fmt;
use std::sync::Arc;

pub use store_types::registry::{
    redact_url, EngineFactory, EngineUrl, Opened, Options, Testing, DEFAULT_SCHEMA,
};
use store_types::{Error, KvEngine, LargeEngine, Result, Tier};

/// The table from URL scheme to engine factory.
#[derive(Clone)]
pub struct Registry {
    factories: Vec<&'static dyn EngineFactory>,
}

impl Default for Registry {
    /// Every engine this build enables, one line each.
    fn default() -> Self {
        let mut r = Registry::empty();
        #[cfg(feature = "mem")]
        r.register(store_mem::REGISTRATION);
        #[cfg(feature = "sqlite")]
        r.register(store_sqlite::REGISTRATION);
        #[cfg(feature = "postgres")]
        r.register(store_postgres::REGISTRATION);
        #[cfg(feature = "local")]
        r.register(store_local::REGISTRATION);
        #[cfg(feature = "pglo")]
        r.register(store_pglo::REGISTRATION);
        #[cfg(feature = "object")]
        r.register(store_object::REGISTRATION);
        #[cfg(feature = "example")]
        r.register(store_example::REGISTRATION);
        r
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.factories.iter().map(|e| e.name()))
            .finish()
    }
}

impl Registry {
    /// A registry without engines.
    pub fn empty() -> Self {
        Registry {
            factories: Vec::new(),
        }
    }

    /// Adds an engine.
    ///
    /// # Panics
    ///
    /// When one of its schemes is taken already: two engines answering one
    /// URL is a build mistake, not a configuration error.
    pub fn register(&mut self, factory: &'static dyn EngineFactory) -> &mut Self {
        for scheme in factory.schemes() {
            if let Some(other) = self.factory(scheme) {
                panic!(
                    "engine registry: scheme {scheme}:// of {} is taken by {}",
                    factory.name(),
                    other.name()
                );
            }
        }
        self.factories.push(factory);
        self
    }

    /// The registered engines, in registration order.
    pub fn factories(&self) -> &[&'static dyn EngineFactory] {
        &self.factories
    }

    /// The engine answering `scheme` (lower case, without `://`).
    pub fn factory(&self, scheme: &str) -> Option<&'static dyn EngineFactory> {
        self.factories
            .iter()
            .copied()
            .find(|f| f.schemes().contains(&scheme))
    }

    /// The URL forms of `tier`'s engines, for messages: `sqlite://PATH,
    /// postgres://…, or mem://`.
    pub fn usage(&self, tier: Tier) -> String {
        let forms: Vec<&str> = self
            .factories
            .iter()
            .filter(|f| f.tiers().contains(&tier))
            .map(|f| f.usage(tier))
            .collect();
        match forms.as_slice() {
            [] => "no engine (this build enables none for this tier)".to_string(),
            [one] => one.to_string(),
            [init @ .., last] => format!("{}, or {last}", init.join(", ")),
        }
    }

    /// Checks `url` for `tier` without I/O: the scheme names a registered
    /// engine of that tier, the params are ones it takes (the URL's query
    /// joins them for engines whose query carries settings), and the
    /// engine accepts the rest.
    ///
    /// # Errors
    ///
    /// [`Error::Config`], the URL redacted.
    pub fn resolve(&self, url: &str, tier: Tier, options: &Options) -> Result<EngineSpec> {
        let unsupported = || {
            Error::Config(format!(
                "unsupported {tier} URL {:?}: expected {}",
                redact_url(url.trim()),
                self.usage(tier)
            ))
        };
        let parsed = EngineUrl::parse(url).map_err(|_| unsupported())?;
        let factory = self.factory(parsed.scheme()).ok_or_else(unsupported)?;
        if !factory.tiers().contains(&tier) {
            let other = factory
                .tiers()
                .iter()
                .map(Tier::to_string)
                .collect::<Vec<_>>()
                .join(" and ");
            return Err(Error::Config(format!(
                "{parsed:?} is a {other} engine ({}), not a {tier} engine: expected {}",
                factory.name(),
                self.usage(tier)
            )));
        }
        let mut options = options.clone();
        let mut parsed = parsed;
        if factory.query_params() {
            let (base, pairs) = parsed.split_query();
            if !pairs.is_empty() {
                let base = EngineUrl::parse(&format!("{}://{base}", parsed.scheme()))?;
                for (k, v) in pairs {
                    if options.params.contains_key(&k) {
                        return Err(Error::Config(format!(
                            "{parsed:?}: option {k} is set both in the URL and in the options"
                        )));
                    }
                    options.params.insert(k, v);
                }
                parsed = base;
            }
        }
        for key in options.params.keys() {
            if !factory.accepts_param(&parsed, key) {
                let takes = match factory.param_names() {
                    [] => "it takes none".to_string(),
                    names => format!("it takes {}", names.join(", ")),
                };
                return Err(Error::Config(format!(
                    "{parsed:?}: unknown option {key:?} for the {} engine ({takes})",
                    factory.name()
                )));
            }
        }
        factory.check(&parsed, tier, &options)?;
        Ok(EngineSpec {
            factory,
            url: parsed,
            tier,
            options,
        })
    }

    /// [`Registry::resolve`] for the large tier; `none` or an empty string
    /// mean no large tier (`Ok(None)`).
    pub fn resolve_large(&self, url: &str, options: &Options) -> Result<Option<EngineSpec>> {
        match url.trim() {
            "" | "none" => Ok(None),
            _ => self.resolve(url, Tier::Large, options).map(Some),
        }
    }

    /// Opens `url` as the kv engine.
    ///
    /// Cancel-safe: dropped before it completes, no engine stays open; what
    /// the engine created on its storage by then (a database file, its
    /// tables) stays, as after a failed open.
    pub async fn open_kv(&self, url: &str, options: &Options) -> Result<Arc<dyn KvEngine>> {
        Ok(self
            .resolve(url, Tier::Kv, options)?
            .open_kv()
            .await?
            .engine)
    }

    /// Opens `url` as the large engine, `None` for `none` (see
    /// [`Registry::resolve_large`]).
    ///
    /// Cancel-safe in the sense of [`Registry::open_kv`].
    pub async fn open_large(
        &self,
        url: &str,
        options: &Options,
    ) -> Result<Option<Arc<dyn LargeEngine>>> {
        match self.resolve_large(url, options)? {
            None => Ok(None),
            Some(spec) => Ok(Some(spec.open_large().await?.engine)),
        }
    }
}

/// A checked engine configuration: which engine, the URL (its settings
/// moved into the options) and the options. Opening it does the I/O.
#[derive(Clone)]
pub struct EngineSpec {
    factory: &'static dyn EngineFactory,
    url: EngineUrl,
    tier: Tier,
    options: Options,
}

impl EngineSpec {
    /// The engine's name (`"sqlite"`).
    pub fn engine(&self) -> &'static str {
        self.factory.name()
    }

    /// The URL (settings of engines with [`EngineFactory::query_params`]
    /// moved into [`EngineSpec::options`]).
    pub fn url(&self) -> &EngineUrl {
        &self.url
    }

    /// The tier it was resolved for.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// The options it opens with.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// One line for logs, passwords redacted: `sqlite ./data/kv.sqlite`,
    /// `postgres postgres://u:***@db/pool (schema blobpool)`.
    pub fn describe(&self) -> String {
        self.factory.describe(&self.url, self.tier, &self.options)
    }

    /// Whether each open is a fresh store private to it (`mem://`).
    pub fn is_private(&self) -> bool {
        self.factory.private(&self.url)
    }

    /// Whether `self` and `other` name the same stored data: the same
    /// engine and [`EngineFactory::store_id`], and not private (two opens
    /// of `mem://` are two stores).
    pub fn same_store(&self, other: &EngineSpec) -> bool {
        self.engine() == other.engine()
            && self.factory.store_id(&self.url, &self.options)
                == other.factory.store_id(&other.url, &other.options)
            && !self.is_private()
    }

    /// Opens the kv engine.
    ///
    /// Cancel-safe in the sense of [`Registry::open_kv`].
    pub async fn open_kv(&self) -> Result<Opened<dyn KvEngine>> {
        if self.tier != Tier::Kv {
            return Err(Error::Config(format!(
                "{:?} was resolved for the {} tier, not kv",
                self.url, self.tier
            )));
        }
        self.factory.open_kv(&self.url, &self.options).await
    }

    /// Opens the large engine.
    ///
    /// Cancel-safe in the sense of [`Registry::open_kv`].
    pub async fn open_large(&self) -> Result<Opened<dyn LargeEngine>> {
        if self.tier != Tier::Large {
            return Err(Error::Config(format!(
                "{:?} was resolved for the {} tier, not large",
                self.url, self.tier
            )));
        }
        self.factory.open_large(&self.url, &self.options).await
    }
}

impl PartialEq for EngineSpec {
    fn eq(&self, other: &Self) -> bool {
        self.factory.name() == other.factory.name()
            && self.url == other.url
            && self.tier == other.tier
            && self.options == other.options
    }
}

impl Eq for EngineSpec {}

impl fmt::Debug for EngineSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineSpec")
            .field("engine", &self.factory.name())
            .field("url", &self.url)
            .field("tier", &self.tier)
            .field("params", &self.options.params.keys().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests;
