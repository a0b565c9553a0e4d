//! The engine-registration vocabulary (ADR-027).
//!
//! Each engine crate exports one `REGISTRATION`, a `&'static dyn`
//! [`EngineFactory`]: the URL schemes it answers, the tiers it serves, the
//! settings it accepts, how it describes itself and how it opens. The
//! `store-registry` crate lists the registrations (one line each) and
//! turns a URL plus [`Options`] into an engine. Everything here depends
//! on this crate only, so an engine still depends on `store-types` alone.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{Error, Key, KvEngine, LargeEngine, Result, Tier, Timestamp};

/// An engine URL as written by the operator: `scheme://rest`.
///
/// The bare forms `mem` and `mem:` read as `mem://`. The scheme compares
/// case-insensitively (it is kept in lower case). [`fmt::Display`] and
/// [`fmt::Debug`] print it with any password redacted.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct EngineUrl {
    /// The whole URL, scheme in lower case.
    text: String,
    /// Length of the scheme (before `://`).
    scheme_len: usize,
}

impl EngineUrl {
    /// Parses `text` (surrounding white space ignored).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when there is no `scheme://`, or the scheme is
    /// not `ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`; the message shows
    /// the URL redacted.
    pub fn parse(text: &str) -> Result<EngineUrl> {
        let t = text.trim();
        let (scheme, rest) = match t.split_once("://") {
            Some(parts) => parts,
            None => {
                let word = t.strip_suffix(':').unwrap_or(t);
                if word.is_empty() || word.contains([':', '/', '?', '@']) {
                    return Err(Error::Config(format!(
                        "engine URL {:?} has no scheme (expected SCHEME://…)",
                        redact_url(t)
                    )));
                }
                (word, "")
            }
        };
        let valid = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !valid {
            return Err(Error::Config(format!(
                "engine URL {:?} has no valid scheme (expected SCHEME://…)",
                redact_url(t)
            )));
        }
        Ok(EngineUrl {
            text: format!("{}://{rest}", scheme.to_ascii_lowercase()),
            scheme_len: scheme.len(),
        })
    }

    /// The whole URL (scheme in lower case), with credentials: hand it to
    /// drivers, never to logs (use [`EngineUrl::redacted`]).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The scheme, lower case, without `://`.
    pub fn scheme(&self) -> &str {
        &self.text[..self.scheme_len]
    }

    /// Everything after `scheme://`.
    pub fn rest(&self) -> &str {
        &self.text[self.scheme_len + 3..]
    }

    /// The URL with any password replaced by `***` ([`redact_url`]).
    pub fn redacted(&self) -> String {
        redact_url(&self.text)
    }

    /// [`EngineUrl::rest`] without its query string, and the query's
    /// `key=value` pairs (a key without `=` has an empty value). Used by
    /// engines whose settings may ride in the URL (`?part_size=16MiB`).
    pub fn split_query(&self) -> (&str, Vec<(String, String)>) {
        let rest = self.rest();
        let Some((base, query)) = rest.split_once('?') else {
            return (rest, Vec::new());
        };
        let pairs = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (p.to_string(), String::new()),
            })
            .collect();
        (base, pairs)
    }

    /// A new URL with `scheme` in place of this one's.
    pub fn with_scheme(&self, scheme: &str) -> Result<EngineUrl> {
        EngineUrl::parse(&format!("{scheme}://{}", self.rest()))
    }
}

impl fmt::Display for EngineUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for EngineUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

impl std::str::FromStr for EngineUrl {
    type Err = Error;

    fn from_str(s: &str) -> Result<EngineUrl> {
        EngineUrl::parse(s)
    }
}

/// `url` with any password replaced by `***` (`scheme://user:***@host`,
/// and `password=` query parameters), for messages and logs.
pub fn redact_url(url: &str) -> String {
    let mut out = url.to_string();
    if !out.contains("://") {
        // No authority to find: anything before an `@` may be a password.
        if let Some(at) = out.rfind('@') {
            out.replace_range(..at, "***");
        }
    }
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?', '#'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                let start = rest_start + colon + 1;
                out.replace_range(start..rest_start + at, "***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (base, query) = out.split_at(q + 1);
        let query = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _))
                    if k.eq_ignore_ascii_case("password")
                        || k.to_ascii_lowercase().ends_with("secret_access_key")
                        || k.to_ascii_lowercase().ends_with("session_token") =>
                {
                    format!("{k}=***")
                }
                _ => p.to_string(),
            })
            .collect::<Vec<_>>()
            .join("&");
        out = format!("{base}{query}");
    }
    out
}

/// What a configuration says besides the URL.
///
/// The typed fields are the settings a whole configuration shares (the
/// blobpool config's `schema`, `shared_media`, `fsync`); an engine uses
/// those that apply to it and ignores the others. [`Options::params`] are
/// engine-specific: every key must be one the engine accepts
/// ([`EngineFactory::accepts_param`]), or opening fails naming the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// PostgreSQL schema when the URL has no `?schema=`. Default
    /// `blobpool`.
    pub schema: String,
    /// File-based large tiers: the root is on media shared by every node
    /// of a fleet (ADR-008 §3). Default `false`.
    pub shared_media: bool,
    /// File-based large tiers: fsync publishes and deletes. Default
    /// `true`; `false` is not crash-safe.
    pub fsync: bool,
    /// Engine-specific settings, e.g. `durability = normal` (sqlite),
    /// `part_size = 16MiB` or object_store keys such as `aws_endpoint`
    /// (object). Engines whose URLs carry no driver query take them from
    /// the URL's query string too.
    pub params: BTreeMap<String, String>,
}

/// The schema [`Options::default`] names.
pub const DEFAULT_SCHEMA: &str = "blobpool";

impl Default for Options {
    fn default() -> Self {
        Options {
            schema: DEFAULT_SCHEMA.to_string(),
            shared_media: false,
            fsync: true,
            params: BTreeMap::new(),
        }
    }
}

impl Options {
    /// These options with `key = value` among the params.
    pub fn param(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.params.insert(key.into(), value.into());
        self
    }

    /// The param `key` parsed by `parse`, or `None` when unset. A bad
    /// value is an [`Error::Config`] naming the key and the engine.
    pub fn parsed<T>(
        &self,
        engine: &str,
        key: &str,
        parse: impl FnOnce(&str) -> std::result::Result<T, ParamError>,
    ) -> Result<Option<T>> {
        match self.params.get(key) {
            None => Ok(None),
            Some(v) => parse(v.trim())
                .map(Some)
                .map_err(|e| Error::Config(format!("{engine} option {key} = {v:?}: {e}"))),
        }
    }
}

/// Why an engine option's value was refused ([`Options::parsed`] names
/// the engine and the option around it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamError {
    /// Not a size: digits with an optional unit.
    #[error("{0:?} is not a size (bytes, or e.g. 64KiB, 16MiB)")]
    NotASize(String),
    /// A size with a unit this parser does not know.
    #[error("{input:?}: unknown size unit {unit:?}")]
    UnknownUnit {
        /// The value as given.
        input: String,
        /// The unit part of it.
        unit: String,
    },
    /// A size or count beyond what the setting can hold.
    #[error("{0:?} is too large")]
    TooLarge(String),
    /// Not `true`/`false` (or `1`/`0`, `yes`/`no`, `on`/`off`).
    #[error("expected true or false")]
    NotABool,
    /// Not a whole number.
    #[error("{0}")]
    NotACount(#[from] std::num::ParseIntError),
    /// Not a whole number of seconds (an `s` suffix is allowed).
    #[error("seconds: {0}")]
    NotSeconds(std::num::ParseIntError),
    /// Not one of the words the setting takes.
    #[error("expected {0}")]
    NotOneOf(&'static str),
}

/// Parses a count setting (a whole number).
pub fn parse_count_param(s: &str) -> std::result::Result<usize, ParamError> {
    Ok(s.parse::<usize>()?)
}

/// Parses a size setting: bytes, or a binary/decimal unit (`64KiB`,
/// `16MiB`, `1GB`).
pub fn parse_size_param(s: &str) -> std::result::Result<u64, ParamError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| ParamError::NotASize(s.to_string()))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        _ => {
            return Err(ParamError::UnknownUnit {
                input: s.to_string(),
                unit: unit.to_string(),
            })
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| ParamError::TooLarge(s.to_string()))
}

/// `Opened { engine, testing }` for an engine crate's registration: the
/// test hooks are `$hooks(engine.clone())` when the invoking crate is built
/// with its `testing` feature (the `cfg` is the invoking crate's), none
/// otherwise. One line instead of the same six in every engine.
#[macro_export]
macro_rules! opened {
    ($engine:expr, $hooks:expr) => {{
        let engine = $engine;
        #[cfg(feature = "testing")]
        let testing: Option<std::sync::Arc<dyn $crate::registry::Testing>> =
            Some(std::sync::Arc::new($hooks(engine.clone())));
        #[cfg(not(feature = "testing"))]
        let testing = None;
        $crate::registry::Opened {
            engine: std::sync::Arc::new(engine),
            testing,
        }
    }};
}

/// An engine opened by a factory, with its test hooks when the engine was
/// built with them.
pub struct Opened<E: ?Sized> {
    /// The engine.
    pub engine: Arc<E>,
    /// Test hooks (`Some` only when the engine crate's `testing` feature is
    /// on and it has any).
    pub testing: Option<Arc<dyn Testing>>,
}

impl<E: ?Sized> Opened<E> {
    /// An engine without test hooks.
    pub fn plain(engine: Arc<E>) -> Self {
        Opened {
            engine,
            testing: None,
        }
    }
}

impl<E: ?Sized> Clone for Opened<E> {
    fn clone(&self) -> Self {
        Opened {
            engine: self.engine.clone(),
            testing: self.testing.clone(),
        }
    }
}

impl<E: ?Sized> fmt::Debug for Opened<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("testing", &self.testing.is_some())
            .finish_non_exhaustive()
    }
}

/// One engine crate's entry in the registry: the URL schemes it answers,
/// the tiers it serves, how it checks, describes and opens a URL.
///
/// Implementations are stateless `static`s exported as `REGISTRATION`;
/// `store-registry` lists them. [`EngineFactory::check`] and
/// [`EngineFactory::describe`] do no I/O (configuration time); the opens
/// do all of it.
#[async_trait]
pub trait EngineFactory: Send + Sync + 'static {
    /// Short name for messages (`"sqlite"`), usually the descriptor kind.
    fn name(&self) -> &'static str;

    /// The URL schemes this engine answers, lower case, without `://`.
    fn schemes(&self) -> &'static [&'static str];

    /// The tiers it can serve.
    fn tiers(&self) -> &'static [Tier];

    /// The URL forms for error messages, e.g. `"sqlite://PATH"`.
    fn usage(&self, tier: Tier) -> &'static str;

    /// Whether `key` is a setting this engine takes in [`Options::params`]
    /// (or its URL's query, see [`EngineFactory::query_params`]). Default:
    /// none.
    fn accepts_param(&self, url: &EngineUrl, key: &str) -> bool {
        let _ = (url, key);
        false
    }

    /// The settings [`EngineFactory::accepts_param`] lists, for messages.
    fn param_names(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether this engine's URL query carries settings (merged into
    /// [`Options::params`] by the registry) rather than driver parameters
    /// it keeps in the URL. Default `false`.
    fn query_params(&self) -> bool {
        false
    }

    /// Whether every open of a URL is a fresh store private to that open
    /// (`mem://`): two such tiers are never the same store.
    fn private(&self, url: &EngineUrl) -> bool {
        let _ = url;
        false
    }

    /// What identifies the stored data `url` names, for "is this the same
    /// store" checks (copying a store onto itself): by default the URL;
    /// engines whose options choose the data (a PostgreSQL schema) add
    /// them.
    fn store_id(&self, url: &EngineUrl, options: &Options) -> String {
        let _ = options;
        url.as_str().to_string()
    }

    /// Checks `url` and the options without I/O. The registry has already
    /// checked the scheme, the tier and the param keys.
    fn check(&self, url: &EngineUrl, tier: Tier, options: &Options) -> Result<()>;

    /// The engine and where its data lives, for one line of a log, with
    /// passwords redacted: `sqlite ./data/kv.sqlite`.
    fn describe(&self, url: &EngineUrl, tier: Tier, options: &Options) -> String;

    /// Opens `url` as a kv engine. Default: this engine has no kv tier.
    ///
    /// Implementations must be cancel-safe: a dropped open may leave a
    /// created-but-empty database, directory or connection pool behind
    /// (an open is idempotent, so the next one adopts it), never a half
    /// applied migration (migrations run in transactions) or a held
    /// instance lock (locks are taken by the store builder, later).
    async fn open_kv(&self, url: &EngineUrl, options: &Options) -> Result<Opened<dyn KvEngine>> {
        let _ = options;
        Err(Error::Config(format!(
            "{} is not a kv engine ({})",
            self.name(),
            url.redacted()
        )))
    }

    /// Opens `url` as a large engine. Default: this engine has no large
    /// tier. Cancel-safe under the same rule as [`EngineFactory::open_kv`].
    async fn open_large(
        &self,
        url: &EngineUrl,
        options: &Options,
    ) -> Result<Opened<dyn LargeEngine>> {
        let _ = options;
        Err(Error::Config(format!(
            "{} is not a large engine ({})",
            self.name(),
            url.redacted()
        )))
    }
}

/// Test hooks of one opened engine, for the contract suite and other
/// tests: they reach inside the engine, so no production path calls them.
/// Engines provide them with their `testing` feature.
///
/// Every method's default answers "this engine has no such thing".
#[async_trait]
pub trait Testing: Send + Sync {
    /// Damages the stored bytes of `key` so reads no longer hash to its
    /// digest. [`Error::Missing`] when absent.
    async fn corrupt_one_byte(&self, key: &Key) -> Result<()>;

    /// Flips (`^ 0xff`) the stored byte at `offset` of `key`'s content,
    /// leaving its size and every other byte as they were, so a range read
    /// must fail exactly where it covers that byte. [`Error::Missing`] when
    /// absent; an offset at or past the end is an error of the engine's
    /// choosing. The default: [`Error::Backend`] of kind
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), the
    /// engine has no positioned corruption.
    async fn corrupt_byte_at(&self, key: &Key, offset: u64) -> Result<()> {
        let _ = offset;
        Err(Error::backend(
            crate::ErrorKind::Unsupported,
            "corrupting the byte at an offset (no such test hook)",
        )
        .with_key(key))
    }

    /// Stage files (or stage objects) left behind; 0 for engines without
    /// them.
    async fn stage_files(&self) -> Result<usize> {
        Ok(0)
    }

    /// Stops the engine's own GC clock (a database's `gc_now()`) at `at`.
    /// `Ok(false)`: the engine judges by the injected clock, it has none.
    async fn set_clock(&self, at: Timestamp) -> Result<bool> {
        let _ = at;
        Ok(false)
    }

    /// Moves the engine's own GC clock by `d` (see
    /// [`Testing::set_clock`]).
    async fn advance_clock(&self, d: Duration) -> Result<bool> {
        let _ = d;
        Ok(false)
    }

    /// For engines whose data lives in the process (so reopening the URL
    /// would find nothing): the same data as a restarted engine sees it.
    /// `None`: reopen the URL.
    async fn reopen_kv(&self) -> Option<Result<Opened<dyn KvEngine>>> {
        None
    }

    /// [`Testing::reopen_kv`] for the large tier.
    async fn reopen_large(&self) -> Option<Result<Opened<dyn LargeEngine>>> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_redact() {
        let u = EngineUrl::parse(" Postgres://u:pw@h/db?schema=s ").unwrap();
        assert_eq!(u.scheme(), "postgres");
        assert_eq!(u.rest(), "u:pw@h/db?schema=s");
        assert_eq!(u.to_string(), "postgres://u:***@h/db?schema=s");
        assert_eq!(EngineUrl::parse("mem").unwrap().as_str(), "mem://");
        assert_eq!(EngineUrl::parse("mem:").unwrap().as_str(), "mem://");
        for bad in ["", "://x", "1x://y", "a b://c", "u:pw@h/x"] {
            let e = EngineUrl::parse(bad).unwrap_err().to_string();
            assert!(!e.contains("pw@"), "{e}");
        }
        let u = EngineUrl::parse("object+memory://?part_size=1MiB&x").unwrap();
        assert_eq!(
            u.split_query(),
            (
                "",
                vec![
                    ("part_size".to_string(), "1MiB".to_string()),
                    ("x".to_string(), String::new())
                ]
            )
        );
        assert_eq!(redact_url("u:pw@h/x"), "***@h/x");
        assert_eq!(
            redact_url("s3://b/p?aws_secret_access_key=k&region=x"),
            "s3://b/p?aws_secret_access_key=***&region=x"
        );
    }

    #[test]
    fn size_params() {
        assert_eq!(parse_size_param("8192"), Ok(8192));
        assert_eq!(parse_size_param("8KiB"), Ok(8192));
        assert_eq!(parse_size_param("5 MiB"), Ok(5 << 20));
        assert_eq!(parse_size_param("2MB"), Ok(2_000_000));
        assert!(parse_size_param("big").is_err());
        assert!(parse_size_param("99999999999999GiB").is_err());
    }
}
