//! Configuration: defaults < TOML file < `BLOBPOOL_*` environment < flags.
//!
//! ```toml
//! kv = "sqlite://./blobpool-data/kv.sqlite"   # sqlite://PATH | postgres://…[?schema=S] | mem://
//! large = "file://./blobpool-data/large"      # file://PATH | pglo://… | postgres+lo://… | s3://BUCKET/PREFIX | object+file:///PATH | mem:// | none
//! mode = "dual-tier"                          # mem-only | kv-only | dual-tier (default: derived)
//! threshold = 65536                           # bytes; kv/large boundary (kv-only: the size limit)
//! fleet = false                               # ADR-012 §3 fleet admission
//! window = 3600                               # delete window, seconds
//! pin_ttl = 900                               # fleet pin-row lifetime, seconds
//! schema = "blobpool"                         # PostgreSQL schema when the URL has no ?schema=
//! shared_media = false                        # file:// large tier is on media shared by the fleet
//! fsync = true                                # file:// large tier fsyncs publishes
//! listen = "127.0.0.1:7070"                   # serve: listen address
//! max_blob_size = 17179869184                 # serve: largest accepted put, bytes
//! # token_ttl = 900                           # serve: pin-token idle lifetime, seconds
//!                                             #   (unset: none outside a fleet, pin_ttl in one)
//! max_tokens = 100000                         # serve: cap on live pin tokens (+ puts in flight)
//! max_tokens_per_identity = 10000             # serve: the same cap per identity
//! insecure_no_auth = false                    # serve: allow a non-loopback listen without identities
//! log_format = "text"                         # serve: text | json
//!
//! [gc]
//! unreferenced_namespaces = ["tmp"]           # namespaces whose entries nothing references
//! ```
//!
//! The server's `[auth]`, `[http]`, `[tls]` and `[limits]` sections are
//! described in `security.rs` (and docs/SERVER.md, Security).
//!
//! Every key has an environment override: `BLOBPOOL_KV`, `BLOBPOOL_LARGE`,
//! `BLOBPOOL_MODE`, … and `BLOBPOOL_GC_UNREFERENCED_NAMESPACES` (comma
//! separated). Relative paths in `sqlite://` and `file://` URLs are relative
//! to the working directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use store_core::{Mode, Store, DEFAULT_THRESHOLD};
use store_types::{Error, KvEngine, LargeEngine, Namespace};

/// Default config file, used when present and no `--config` is given.
pub const DEFAULT_CONFIG_FILE: &str = "blobpool.toml";
/// Default kv engine URL.
pub const DEFAULT_KV: &str = "sqlite://./blobpool-data/kv.sqlite";
/// Default large engine URL.
pub const DEFAULT_LARGE: &str = "file://./blobpool-data/large";
/// Default listen address of `serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// Default PostgreSQL schema.
pub const DEFAULT_SCHEMA: &str = "blobpool";

/// The TOML file's shape. Unknown keys are errors (typos must not pass
/// silently).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    kv: Option<String>,
    large: Option<String>,
    mode: Option<String>,
    threshold: Option<u64>,
    fleet: Option<bool>,
    window: Option<u64>,
    pin_ttl: Option<u64>,
    schema: Option<String>,
    shared_media: Option<bool>,
    fsync: Option<bool>,
    listen: Option<String>,
    max_blob_size: Option<u64>,
    token_ttl: Option<u64>,
    max_tokens: Option<usize>,
    max_tokens_per_identity: Option<usize>,
    insecure_no_auth: Option<bool>,
    log_format: Option<String>,
    gc: Option<crate::gc::GcSection>,
    auth: Option<crate::security::AuthSection>,
    http: Option<crate::security::HttpSection>,
    tls: Option<crate::security::TlsSection>,
    limits: Option<crate::security::LimitsSection>,
}

/// The server's log format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format {other:?}: expected text or json")),
        }
    }
}

/// Default largest put of a `mem-only` server: 64 MiB. Everything it
/// stores is held in memory, so the 16 GiB default of the other modes
/// would let one client exhaust it (docs/SERVER.md).
pub const DEFAULT_MEM_ONLY_MAX_BLOB_SIZE: u64 = 64 << 20;

/// Default per-identity cap on pin tokens plus puts in flight (the global
/// cap, `max_tokens`, still applies).
pub const DEFAULT_MAX_TOKENS_PER_IDENTITY: usize = 10_000;

/// A kv engine choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvSpec {
    /// `sqlite://PATH`.
    Sqlite(PathBuf),
    /// `postgres://…`: the connection URL (without `schema=`) and schema.
    Postgres {
        /// Connection URL handed to the driver.
        url: String,
        /// Schema holding the tables.
        schema: String,
    },
    /// `mem://`.
    Mem,
}

/// A large engine choice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LargeSpec {
    /// `file://PATH`.
    File(PathBuf),
    /// `pglo://…` or `postgres+lo://…`: the `postgres://` connection URL
    /// and schema.
    PgLo {
        /// Connection URL handed to the driver.
        url: String,
        /// Schema holding the tables.
        schema: String,
    },
    /// `s3://bucket/prefix` (settings from `AWS_*` variables),
    /// `object+file:///abs/path` or `object+memory://`: an object-store
    /// large tier (`store-object`), with the URL it takes.
    Object(String),
    /// `mem://`.
    Mem,
}

/// The resolved configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The kv engine.
    pub kv: KvSpec,
    /// The large engine, if any.
    pub large: Option<LargeSpec>,
    /// The dispatch mode.
    pub mode: Mode,
    /// Fleet admission.
    pub fleet: bool,
    /// Delete-window length.
    pub window: Duration,
    /// Fleet pin-row lifetime.
    pub pin_ttl: Duration,
    /// `file://` large tier: shared-media declaration.
    pub shared_media: bool,
    /// `file://` large tier: fsync publishes.
    pub fsync: bool,
    /// `serve` listen address.
    pub listen: String,
    /// `serve`: largest accepted put.
    pub max_blob_size: u64,
    /// `serve`: pin-token idle lifetime, when set (ADR-018). Unset, tokens
    /// never expire outside a fleet and live `pin_ttl` after their last
    /// renewal in one. In fleet mode it is at most `pin_ttl`.
    pub token_ttl: Option<Duration>,
    /// `serve`: cap on live pin tokens plus puts in flight (at least 1).
    pub max_tokens: usize,
    /// `serve`: cap on the live tokens plus puts in flight of one
    /// identity (at least 1).
    pub max_tokens_per_identity: usize,
    /// Namespaces registered with a liveness source that reports nothing
    /// live (ADR-017): their unpinned entries are garbage.
    pub unreferenced_namespaces: Vec<Namespace>,
    /// `[gc]`: policies, liveness tables, scheduled sweeps (ADR-024).
    pub gc: crate::gc::GcSettings,
    /// `serve`: allow a non-loopback listen address without any identity.
    pub insecure_no_auth: bool,
    /// `serve`: log format.
    pub log_format: LogFormat,
    /// `serve`: `[auth]`, `[http]`, `[tls]`, `[limits]`.
    pub sections: crate::security::Sections,
}

fn env_parse<T: std::str::FromStr>(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<T>, String>
where
    T::Err: std::fmt::Display,
{
    match env(name) {
        None => Ok(None),
        Some(v) => v
            .trim()
            .parse::<T>()
            .map(Some)
            .map_err(|e| format!("{name}={v:?}: {e}")),
    }
}

fn env_bool(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<bool>, String> {
    match env(name) {
        None => Ok(None),
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => Err(format!("{name}={v:?}: expected true or false")),
        },
    }
}

/// Splits `schema=` out of a PostgreSQL URL's query string.
fn split_schema(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|p| {
            if let Some(v) = p.strip_prefix("schema=") {
                schema = Some(v.to_string());
                false
            } else {
                !p.is_empty()
            }
        })
        .collect();
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, schema)
}

fn path_of(url: &str, scheme: &str) -> Result<PathBuf, String> {
    let p = &url[scheme.len()..];
    if p.is_empty() {
        return Err(format!("{url:?}: missing path after {scheme}"));
    }
    Ok(PathBuf::from(p))
}

/// Parses a kv engine URL.
pub fn parse_kv(url: &str, default_schema: &str) -> Result<KvSpec, String> {
    let url = url.trim();
    if url.starts_with("sqlite://") {
        return Ok(KvSpec::Sqlite(path_of(url, "sqlite://")?));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let (url, schema) = split_schema(url);
        return Ok(KvSpec::Postgres {
            url,
            schema: schema.unwrap_or_else(|| default_schema.to_string()),
        });
    }
    if url == "mem://" || url == "mem:" || url == "mem" {
        return Ok(KvSpec::Mem);
    }
    Err(format!(
        "unsupported kv URL {:?}: expected sqlite://PATH, postgres://…, or mem://",
        crate::security::redact_url(url)
    ))
}

/// Parses a large engine URL (`None` for `none` or an empty string).
pub fn parse_large(url: &str, default_schema: &str) -> Result<Option<LargeSpec>, String> {
    let url = url.trim();
    if url.is_empty() || url == "none" {
        return Ok(None);
    }
    if url.starts_with("file://") {
        return Ok(Some(LargeSpec::File(path_of(url, "file://")?)));
    }
    for scheme in ["pglo://", "postgres+lo://", "postgresql+lo://"] {
        if let Some(rest) = url.strip_prefix(scheme) {
            let (url, schema) = split_schema(&format!("postgres://{rest}"));
            return Ok(Some(LargeSpec::PgLo {
                url,
                schema: schema.unwrap_or_else(|| default_schema.to_string()),
            }));
        }
    }
    if url == "mem://" || url == "mem:" || url == "mem" {
        return Ok(Some(LargeSpec::Mem));
    }
    if url.starts_with("s3://") {
        return Ok(Some(LargeSpec::Object(url.to_string())));
    }
    if let Some(rest) = url.strip_prefix("object+") {
        if rest.starts_with("file://") || rest.starts_with("memory://") {
            return Ok(Some(LargeSpec::Object(rest.to_string())));
        }
    }
    Err(format!(
        "unsupported large URL {:?}: expected file://PATH, pglo://…, postgres+lo://…, s3://BUCKET/PREFIX, object+file:///PATH, object+memory://, mem://, or none",
        crate::security::redact_url(url)
    ))
}

fn parse_mode(s: &str, threshold: u64) -> Result<Mode, String> {
    match s.trim() {
        "mem-only" => Ok(Mode::MemOnly),
        "kv-only" => Ok(Mode::KvOnly { threshold }),
        "dual-tier" => Ok(Mode::DualTier { threshold }),
        other => Err(format!(
            "unknown mode {other:?}: expected mem-only, kv-only or dual-tier"
        )),
    }
}

impl Config {
    /// Loads the configuration: `file` (or `./blobpool.toml` when present),
    /// then the environment through `env`.
    pub fn load(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, String> {
        let fc = match file {
            Some(p) => Self::read_file(p)?,
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                Self::read_file(Path::new(DEFAULT_CONFIG_FILE))?
            }
            None => FileConfig::default(),
        };
        Self::resolve(fc, env)
    }

    /// Parses a TOML text (no file, no environment), for tests and tools.
    #[cfg(test)]
    pub fn from_toml(text: &str) -> Result<Config, String> {
        let fc: FileConfig = toml::from_str(text).map_err(|e| format!("config: {e}"))?;
        Self::resolve(fc, &|_| None)
    }

    fn read_file(p: &Path) -> Result<FileConfig, String> {
        let text = std::fs::read_to_string(p)
            .map_err(|e| format!("cannot read config file {}: {e}", p.display()))?;
        toml::from_str(&text).map_err(|e| format!("config file {}: {e}", p.display()))
    }

    fn resolve(fc: FileConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, String> {
        let schema = env("BLOBPOOL_SCHEMA")
            .or(fc.schema)
            .unwrap_or_else(|| DEFAULT_SCHEMA.to_string());
        let kv_url = env("BLOBPOOL_KV").or(fc.kv);
        let large_url = env("BLOBPOOL_LARGE").or(fc.large);
        // The embedded default applies only when neither tier is chosen.
        let (kv_url, large_url) = match (kv_url, large_url) {
            (None, None) => (DEFAULT_KV.to_string(), Some(DEFAULT_LARGE.to_string())),
            (None, large) => (DEFAULT_KV.to_string(), large),
            (Some(kv), large) => (kv, large),
        };
        let kv = parse_kv(&kv_url, &schema)?;
        let large = match large_url {
            Some(u) => parse_large(&u, &schema)?,
            None => None,
        };
        let threshold = env_parse::<u64>(env, "BLOBPOOL_THRESHOLD")?
            .or(fc.threshold)
            .unwrap_or(DEFAULT_THRESHOLD);
        let mode = match env("BLOBPOOL_MODE").or(fc.mode) {
            Some(m) => parse_mode(&m, threshold)?,
            None => match (&kv, &large) {
                (KvSpec::Mem, None) => Mode::MemOnly,
                (_, None) => Mode::KvOnly { threshold },
                (_, Some(_)) => Mode::DualTier { threshold },
            },
        };
        let secs = |env_name: &str, v: Option<u64>, d: u64| -> Result<Duration, String> {
            Ok(Duration::from_secs(
                env_parse::<u64>(env, env_name)?.or(v).unwrap_or(d),
            ))
        };
        let unreferenced = match env("BLOBPOOL_GC_UNREFERENCED_NAMESPACES") {
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            None => fc
                .gc
                .as_ref()
                .and_then(|g| g.unreferenced_namespaces.clone())
                .unwrap_or_default(),
        };
        let fleet = env_bool(env, "BLOBPOOL_FLEET")?
            .or(fc.fleet)
            .unwrap_or(false);
        let pin_ttl = secs("BLOBPOOL_PIN_TTL", fc.pin_ttl, 900)?;
        let token_ttl = env_parse::<u64>(env, "BLOBPOOL_TOKEN_TTL")?
            .or(fc.token_ttl)
            .map(Duration::from_secs);
        match token_ttl {
            Some(t) if t.is_zero() => {
                return Err(
                    "token_ttl = 0: the idle lifetime must be at least 1 second \
                     (leave token_ttl unset for no idle expiry outside a fleet)"
                        .into(),
                )
            }
            Some(t) if fleet && t > pin_ttl => {
                return Err(format!(
                    "token_ttl = {} exceeds pin_ttl = {}: in fleet mode a pin token must not \
                     outlive the pin row it renews (ADR-018)",
                    t.as_secs(),
                    pin_ttl.as_secs()
                ))
            }
            _ => {}
        }
        let max_tokens = env_parse::<usize>(env, "BLOBPOOL_MAX_TOKENS")?
            .or(fc.max_tokens)
            .unwrap_or(store_ops::DEFAULT_MAX_TOKENS);
        if max_tokens == 0 {
            return Err("max_tokens = 0 would refuse every put; it must be at least 1".into());
        }
        let max_tokens_per_identity = env_parse::<usize>(env, "BLOBPOOL_MAX_TOKENS_PER_IDENTITY")?
            .or(fc.max_tokens_per_identity)
            .unwrap_or(DEFAULT_MAX_TOKENS_PER_IDENTITY);
        if max_tokens_per_identity == 0 {
            return Err(
                "max_tokens_per_identity = 0 would refuse every put; it must be at least 1".into(),
            );
        }
        let log_format = match env("BLOBPOOL_LOG_FORMAT").or(fc.log_format) {
            Some(f) => f.parse::<LogFormat>()?,
            None => LogFormat::Text,
        };
        let default_max_blob = if mode == Mode::MemOnly {
            DEFAULT_MEM_ONLY_MAX_BLOB_SIZE
        } else {
            store_ops::DEFAULT_MAX_BLOB_SIZE
        };
        let gc = crate::gc::resolve(
            fc.gc.clone(),
            unreferenced.clone(),
            env("BLOBPOOL_GC_INTERVAL"),
            fleet,
        )?;
        let unreferenced_namespaces = unreferenced
            .into_iter()
            .map(|n| {
                Namespace::new(n.clone())
                    .map_err(|e| format!("gc.unreferenced_namespaces: {n:?}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Config {
            kv,
            large,
            mode,
            fleet,
            window: secs("BLOBPOOL_WINDOW", fc.window, 3600)?,
            pin_ttl,
            shared_media: env_bool(env, "BLOBPOOL_SHARED_MEDIA")?
                .or(fc.shared_media)
                .unwrap_or(false),
            fsync: env_bool(env, "BLOBPOOL_FSYNC")?
                .or(fc.fsync)
                .unwrap_or(true),
            listen: env("BLOBPOOL_LISTEN")
                .or(fc.listen)
                .unwrap_or_else(|| DEFAULT_LISTEN.to_string()),
            max_blob_size: env_parse::<u64>(env, "BLOBPOOL_MAX_BLOB_SIZE")?
                .or(fc.max_blob_size)
                .unwrap_or(default_max_blob),
            token_ttl,
            max_tokens,
            max_tokens_per_identity,
            unreferenced_namespaces,
            gc,
            insecure_no_auth: env_bool(env, "BLOBPOOL_INSECURE_NO_AUTH")?
                .or(fc.insecure_no_auth)
                .unwrap_or(false),
            log_format,
            sections: crate::security::Sections {
                auth: fc.auth,
                http: fc.http,
                tls: fc.tls,
                limits: fc.limits,
            },
        })
    }

    /// The ops-layer limits of `serve`. `Ops::new` resolves the token TTL:
    /// unset, none outside a fleet and `pin_ttl` in one (ADR-018).
    pub fn ops_config(&self) -> store_ops::OpsConfig {
        store_ops::OpsConfig {
            max_blob_size: self.max_blob_size,
            token_ttl: self.token_ttl,
            max_tokens: self.max_tokens,
            max_tokens_per_owner: Some(self.max_tokens_per_identity),
            pin_ttl: Some(self.pin_ttl),
            ..Default::default()
        }
    }

    /// Opens the engines and builds the store, registering the
    /// `gc.unreferenced_namespaces` sources.
    pub async fn open_store(&self) -> Result<Store, Error> {
        let kv: Arc<dyn KvEngine> = match &self.kv {
            KvSpec::Sqlite(path) => Arc::new(
                store_sqlite::SqliteEngine::open(path, store_sqlite::SqliteOptions::default())
                    .await?,
            ),
            KvSpec::Postgres { url, schema } => {
                Arc::new(store_postgres::PostgresEngine::connect(url, schema).await?)
            }
            KvSpec::Mem => Arc::new(store_mem::MemEngine::new()),
        };
        let large: Option<Arc<dyn LargeEngine>> = match &self.large {
            None => None,
            Some(LargeSpec::File(root)) => Some(Arc::new(
                store_local::LocalEngine::open(
                    root,
                    store_local::LocalOptions {
                        shared_media: self.shared_media,
                        fsync: self.fsync,
                    },
                )
                .await?,
            )),
            Some(LargeSpec::PgLo { url, schema }) => Some(Arc::new(
                store_pglo::PgLoEngine::connect(url, schema).await?,
            )),
            Some(LargeSpec::Object(url)) => Some(Arc::new(
                store_object::ObjectEngine::from_url(url, store_object::ObjectOptions::default())
                    .await?,
            )),
            Some(LargeSpec::Mem) => Some(Arc::new(store_mem::MemEngine::new())),
        };
        let mut b = Store::builder()
            .kv_shared(kv)
            .mode(self.mode)
            .fleet(self.fleet)
            .window(self.window)
            .pin_ttl(self.pin_ttl);
        if let Some(l) = large {
            b = b.large_shared(l);
        }
        let store = b.build().await?;
        for line in self.gc.apply(&store).await? {
            tracing::info!(target: "blobpool::gc", "namespace policy: {line}");
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_default_is_sqlite_plus_local_files() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.kv, KvSpec::Sqlite("./blobpool-data/kv.sqlite".into()));
        assert_eq!(
            c.large,
            Some(LargeSpec::File("./blobpool-data/large".into()))
        );
        assert_eq!(
            c.mode,
            Mode::DualTier {
                threshold: DEFAULT_THRESHOLD
            }
        );
        assert_eq!(c.listen, DEFAULT_LISTEN);
        assert!(!c.fleet);
        assert!(c.unreferenced_namespaces.is_empty());
    }

    #[test]
    fn mem_only_servers_default_to_a_small_max_blob_size() {
        let c = Config::from_toml("kv = \"mem://\"").unwrap();
        assert_eq!(c.mode, Mode::MemOnly);
        assert_eq!(c.max_blob_size, DEFAULT_MEM_ONLY_MAX_BLOB_SIZE);
        let c = Config::from_toml("kv = \"mem://\"\nmax_blob_size = 5").unwrap();
        assert_eq!(c.max_blob_size, 5);
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.max_blob_size, store_ops::DEFAULT_MAX_BLOB_SIZE);
        assert_eq!(c.max_tokens_per_identity, DEFAULT_MAX_TOKENS_PER_IDENTITY);
        assert_eq!(c.ops_config().max_tokens_per_owner, Some(10_000));
        assert!(Config::from_toml("max_tokens_per_identity = 0").is_err());
        assert!(Config::from_toml("log_format = \"xml\"").is_err());
        assert_eq!(
            Config::from_toml("log_format = \"json\"")
                .unwrap()
                .log_format,
            LogFormat::Json
        );
    }

    #[test]
    fn url_errors_never_print_passwords() {
        let e = Config::from_toml("kv = \"mysql://u:s3cret@h/db\"").unwrap_err();
        assert!(!e.contains("s3cret") && e.contains("u:***@h"), "{e}");
        let e = Config::from_toml("large = \"ftp://u:s3cret@h/x\"").unwrap_err();
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn object_store_urls_select_the_object_engine() {
        for (url, want) in [
            ("s3://bucket/pool", "s3://bucket/pool"),
            ("object+file:///srv/pool", "file:///srv/pool"),
            ("object+memory://", "memory://"),
        ] {
            assert_eq!(
                parse_large(url, "s").unwrap(),
                Some(LargeSpec::Object(want.into())),
                "{url}"
            );
        }
        assert!(parse_large("object+ftp://x", "s").is_err());
    }

    #[tokio::test]
    async fn an_object_store_large_tier_opens_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::from_toml(&format!(
            "kv = \"mem://\"\nlarge = \"object+file://{}\"\nthreshold = 16",
            dir.path().display()
        ))
        .unwrap();
        let store = c.open_store().await.unwrap();
        let ns = store_types::Namespace::new("t").unwrap();
        let body = vec![7u8; 1000];
        let r = store.put(&ns, &body[..], None, None).await.unwrap();
        assert_eq!(r.tier, store_types::Tier::Large);
        let got = store
            .get(r.key())
            .await
            .unwrap()
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(&got[..], &body[..]);
    }

    #[test]
    fn postgres_urls_carry_their_schema() {
        let c = Config::from_toml(
            r#"
            kv = "postgres://u:p@db:5432/pool?sslmode=disable&schema=tenant_a"
            large = "pglo://u:p@db:5432/pool"
            schema = "fallback"
            fleet = true
            pin_ttl = 60
            "#,
        )
        .unwrap();
        assert_eq!(
            c.kv,
            KvSpec::Postgres {
                url: "postgres://u:p@db:5432/pool?sslmode=disable".into(),
                schema: "tenant_a".into()
            }
        );
        assert_eq!(
            c.large,
            Some(LargeSpec::PgLo {
                url: "postgres://u:p@db:5432/pool".into(),
                schema: "fallback".into()
            })
        );
        assert!(c.fleet);
        assert_eq!(c.pin_ttl, Duration::from_secs(60));
        assert_eq!(
            parse_large("postgres+lo://h/db?schema=s", "x").unwrap(),
            Some(LargeSpec::PgLo {
                url: "postgres://h/db".into(),
                schema: "s".into()
            })
        );
    }

    #[test]
    fn modes_are_derived_from_the_tiers() {
        let c = Config::from_toml("kv = \"mem://\"").unwrap();
        assert_eq!((c.kv, c.large, c.mode), (KvSpec::Mem, None, Mode::MemOnly));
        let c = Config::from_toml("kv = \"sqlite://x.db\"\nthreshold = 10").unwrap();
        assert_eq!(c.mode, Mode::KvOnly { threshold: 10 });
        let c = Config::from_toml("kv = \"mem://\"\nlarge = \"file:///tmp/l\"").unwrap();
        assert_eq!(
            c.mode,
            Mode::DualTier {
                threshold: DEFAULT_THRESHOLD
            }
        );
        let c = Config::from_toml("large = \"none\"").unwrap();
        assert_eq!(c.large, None);
    }

    #[test]
    fn environment_overrides_the_file() {
        let fc: FileConfig =
            toml::from_str("kv = \"mem://\"\nwindow = 5\n[gc]\nunreferenced_namespaces = [\"a\"]")
                .unwrap();
        let env = env_of(&[
            ("BLOBPOOL_KV", "sqlite:///var/kv.db"),
            ("BLOBPOOL_LARGE", "file:///var/large"),
            ("BLOBPOOL_WINDOW", "0"),
            ("BLOBPOOL_FLEET", "false"),
            ("BLOBPOOL_GC_UNREFERENCED_NAMESPACES", "tmp, scratch"),
            ("BLOBPOOL_MODE", "dual-tier"),
            ("BLOBPOOL_THRESHOLD", "1024"),
        ]);
        let c = Config::resolve(fc, &env).unwrap();
        assert_eq!(c.kv, KvSpec::Sqlite("/var/kv.db".into()));
        assert_eq!(c.large, Some(LargeSpec::File("/var/large".into())));
        assert_eq!(c.window, Duration::ZERO);
        assert_eq!(c.mode, Mode::DualTier { threshold: 1024 });
        let names: Vec<&str> = c
            .unreferenced_namespaces
            .iter()
            .map(|n| n.as_str())
            .collect();
        assert_eq!(names, ["tmp", "scratch"]);
    }

    #[test]
    fn token_ttl_is_unset_by_default_and_bounded_by_pin_ttl_in_a_fleet() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.token_ttl, None);
        assert_eq!(c.ops_config().token_ttl, None);
        assert_eq!(c.ops_config().pin_ttl, Some(Duration::from_secs(900)));
        // Non-fleet: an explicit choice, whatever pin_ttl says.
        let c = Config::from_toml("token_ttl = 3600\npin_ttl = 60").unwrap();
        assert_eq!(c.ops_config().token_ttl, Some(Duration::from_secs(3600)));
        // Fleet: at most pin_ttl, refused (not clamped) beyond.
        let c = Config::from_toml("fleet = true\npin_ttl = 60\ntoken_ttl = 60").unwrap();
        assert_eq!(c.token_ttl, Some(Duration::from_secs(60)));
        let e = Config::from_toml("fleet = true\npin_ttl = 60\ntoken_ttl = 61").unwrap_err();
        assert!(e.contains("token_ttl = 61 exceeds pin_ttl = 60"), "{e}");
        let env = env_of(&[("BLOBPOOL_FLEET", "true"), ("BLOBPOOL_TOKEN_TTL", "901")]);
        assert!(Config::resolve(FileConfig::default(), &env).is_err());
        let e = Config::from_toml("token_ttl = 0").unwrap_err();
        assert!(e.contains("token_ttl = 0"), "{e}");
        let e = Config::from_toml("max_tokens = 0").unwrap_err();
        assert!(e.contains("max_tokens = 0"), "{e}");
    }

    #[test]
    fn bad_values_are_reported() {
        for bad in [
            "kv = \"redis://x\"",
            "large = \"ftp://bucket\"",
            "mode = \"fast\"",
            "typo_key = 1",
            "threshold = \"big\"",
            "[gc]\nunreferenced_namespaces = [\"../x\"]",
            "kv = \"sqlite://\"",
        ] {
            assert!(Config::from_toml(bad).is_err(), "{bad:?} must be rejected");
        }
        let env = env_of(&[("BLOBPOOL_FLEET", "maybe")]);
        assert!(Config::resolve(FileConfig::default(), &env).is_err());
    }
}
