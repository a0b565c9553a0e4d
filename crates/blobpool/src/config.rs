//! Configuration: defaults < TOML file < `BLOBPOOL_*` environment < flags.
//!
//! ```toml
//! kv = "sqlite://./blobpool-data/kv.sqlite"   # sqlite://PATH | postgres://…[?schema=S] | mem://
//! large = "file://./blobpool-data/large"      # file://PATH | pglo://… | s3://BUCKET/PREFIX | … | none
//! threshold = "64KiB"                         # a size
//! window = "1h"                               # a duration
//!
//! [gc]
//! unreferenced_namespaces = ["tmp"]           # namespaces whose entries nothing references
//! ```
//!
//! Each key is one entry of the table in [`settings`] (ADR-059): its
//! type, default and meaning; its environment override is named after it
//! (`BLOBPOOL_KV`, `BLOBPOOL_GC_UNREFERENCED_NAMESPACES`, comma separated).
//! docs/SERVER.md's Configuration table is checked against it by `cargo
//! xtask tidy`. `--data-dir` is a global flag; `serve` also takes the
//! table's flags (see [`StoreFlags`]) and `--insecure-no-auth`,
//! `--log-format`.
//!
//! Units: a duration is an integer of seconds or a humantime string
//! (`"90s"`, `"15m"`, `"1h 30m"`); a size is an integer of bytes or a
//! `bytesize` string (`"64KiB"` = 65536, `"64KB"` = 64000, `"4GiB"`,
//! `"1.5MiB"`). The environment and the flags take the same forms.
//!
//! The keys of the server's `[auth]`, `[http]`, `[tls]` and `[limits]`
//! sections are entries of the table too (`BLOBPOOL_TLS_CERT`,
//! `BLOBPOOL_LIMITS_IDLE_TIMEOUT`); [`sections`] parses their variables,
//! `security.rs` builds the server's configuration from them
//! (docs/SERVER.md, Security).
//!
//! Relative paths in `sqlite://` and `file://` URLs and in `data_dir` are
//! relative to the working directory.
//!
//! The default store is `sqlite://DIR/kv.sqlite` + `file://DIR/large` with
//! DIR = `data_dir` (default `./blobpool-data`). Setting `kv` alone means
//! no large tier (kv-only: blobs above `threshold` are refused), on
//! purpose: a remote kv must not silently get a local-disk large tier.
//! [`Config::describe`] states the resulting shape in one line (logged by
//! `serve`). `data_dir` roots only the default kv (and large) tier, so it
//! is an error when `kv` is set too: it would have no effect.
//!
//! The URLs are the engine registry's (store-registry, ADR-027, table in
//! docs/ENGINES.md): [`registry`] checks them at load and opens them in
//! [`Config::open_store`]. Object-store URLs take the engine's settings in
//! their query (`s3://bucket/pool?part_size=16MiB`); an unknown one is an
//! error naming it.
//!
//! Every error is a [`ConfigError`] ([`crate::error`]) that names where the
//! bad value came from: `config file PATH:LINE:COL: key`, `environment
//! BLOBPOOL_…` or `flag --…`, and carries the setting's key.

use std::path::{Path, PathBuf};
use std::time::Duration;

#[cfg(test)]
use store_core::DEFAULT_THRESHOLD;
use store_core::{Mode, Store};
use store_types::{Error, Namespace, Sharing};
use toml::Spanned;

pub use crate::error::{ConfigError, Invalid, Origin};
use settings::{env_of, Derived, FileConfig, Values};
pub use settings::{Config, Setting, SETTINGS};

pub mod sections;
pub mod settings;

/// The command line's own variables (its flags' `env`).
pub const CLI_VARIABLES: [&str; 9] = [
    "BLOBPOOL_CONFIG",
    "BLOBPOOL_SERVER",
    "BLOBPOOL_TOKEN",
    "BLOBPOOL_CA_CERT",
    "BLOBPOOL_CLIENT_CERT",
    "BLOBPOOL_CLIENT_KEY",
    "BLOBPOOL_CONNECT_TIMEOUT",
    "BLOBPOOL_TIMEOUT",
    "BLOBPOOL_NAMESPACE",
];

/// Prefixes of the variables the test suites and benchmarks read (never
/// the binary): set in a developer's shell, they are not mistakes.
const DEVELOPMENT_PREFIXES: [&str; 5] = [
    "BLOBPOOL_TEST_",
    "BLOBPOOL_CRASH_",
    "BLOBPOOL_BENCH_",
    "BLOBPOOL_SQLITE_TEST_",
    "BLOBPOOL_COPY_SCALE",
];

/// Refuses a set `BLOBPOOL_*` variable that no setting reads (a typo such
/// as `BLOBPOOL_LIMIT_IDLE_TIMEOUT` would otherwise be ignored silently),
/// naming it and the nearest known one.
pub fn check_environment(names: impl IntoIterator<Item = String>) -> Result<(), ConfigError> {
    let known: Vec<String> = SETTINGS
        .iter()
        .map(Setting::env)
        .chain(CLI_VARIABLES.map(String::from))
        .collect();
    for name in names {
        if !name.starts_with("BLOBPOOL_")
            || known.contains(&name)
            || DEVELOPMENT_PREFIXES.iter().any(|p| name.starts_with(p))
        {
            continue;
        }
        let nearest = known
            .iter()
            .min_by_key(|k| strsim::levenshtein(k, &name))
            .cloned()
            .unwrap_or_default();
        return Err(Origin::Env(name.clone()).err(
            &name,
            format!(
                "not a Blobpool setting (did you mean {nearest}? every variable \
                 is listed in docs/SERVER.md, Configuration)"
            ),
        ));
    }
    Ok(())
}

/// Default config file, used when present and no `--config` is given.
pub const DEFAULT_CONFIG_FILE: &str = "blobpool.toml";
/// Default root of the default store (`data_dir`).
pub const DEFAULT_DATA_DIR: &str = "./blobpool-data";
/// Default listen address of `serve`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7070";
/// Default PostgreSQL schema.
pub const DEFAULT_SCHEMA: &str = store_registry::DEFAULT_SCHEMA;

/// A scalar value in the TOML file. Each key's parser types it (so that
/// `threshold = "64KiB"` and `threshold = 65536` both work) and reports
/// a wrong one with the key's line and column.
#[derive(Clone, Debug, PartialEq)]
enum Scalar {
    Str(String),
    Int(i64),
    Bool(bool),
}

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string, an integer or a boolean")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Scalar, E> {
                i64::try_from(v)
                    .map(Scalar::Int)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar::Bool(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Scalar {
    fn text(self) -> Result<String, Invalid> {
        match self {
            Scalar::Str(s) => Ok(s),
            other => Err(format!("expected a string, got {}", other.shown()).into()),
        }
    }

    fn boolean(self) -> Result<bool, Invalid> {
        match self {
            Scalar::Bool(b) => Ok(b),
            Scalar::Str(v) => match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(format!("{v:?}: expected true or false").into()),
            },
            other => Err(format!("expected true or false, got {}", other.shown()).into()),
        }
    }

    fn size(self) -> Result<u64, Invalid> {
        match self {
            Scalar::Int(n) => {
                u64::try_from(n).map_err(|_| Invalid(format!("{n}: a size cannot be negative")))
            }
            Scalar::Str(s) => parse_size(&s),
            other => Err(format!(
                "expected a size (bytes, or e.g. \"64KiB\"), got {}",
                other.shown()
            )
            .into()),
        }
    }

    fn duration(self) -> Result<Duration, Invalid> {
        match self {
            Scalar::Int(n) => u64::try_from(n)
                .map(Duration::from_secs)
                .map_err(|_| Invalid(format!("{n}: a duration cannot be negative"))),
            Scalar::Str(s) => sections::parse_duration(&s),
            other => Err(format!(
                "expected a duration (seconds, or e.g. \"15m\"), got {}",
                other.shown()
            )
            .into()),
        }
    }

    fn count(self) -> Result<usize, Invalid> {
        match self {
            Scalar::Int(n) => {
                usize::try_from(n).map_err(|_| Invalid(format!("{n}: must not be negative")))
            }
            Scalar::Str(s) => s
                .trim()
                .parse::<usize>()
                .map_err(|e| Invalid(format!("{s:?}: {e}"))),
            other => Err(format!("expected an integer, got {}", other.shown()).into()),
        }
    }

    fn shown(&self) -> String {
        match self {
            Scalar::Str(s) => format!("{s:?}"),
            Scalar::Int(n) => n.to_string(),
            Scalar::Bool(b) => b.to_string(),
        }
    }
}

/// Parses a size: plain bytes or a `bytesize` string (`"64KiB"`,
/// `"4 GiB"`, `"1.5MB"`; `KiB` = 1024, `KB` = 1000).
pub fn parse_size(s: &str) -> Result<u64, Invalid> {
    let t = s.trim();
    if let Ok(n) = t.parse::<u64>() {
        return Ok(n);
    }
    let n = t
        .parse::<bytesize::ByteSize>()
        .map_err(|_| {
            format!("{s:?} is not a size (bytes, or e.g. \"64KiB\", \"4GiB\", \"1.5MB\")")
        })?
        .as_u64();
    // bytesize saturates on overflow.
    if n == u64::MAX {
        return Err(format!("{s:?} is too large").into());
    }
    Ok(n)
}

/// A size for humans: exact binary units when they fit (`64 KiB`), else
/// bytes.
pub fn format_size(n: u64) -> String {
    for (unit, shift) in [
        ("EiB", 60),
        ("PiB", 50),
        ("TiB", 40),
        ("GiB", 30),
        ("MiB", 20),
        ("KiB", 10),
    ] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{} {unit}", n >> shift);
        }
    }
    format!("{n} bytes")
}

/// Default `umask`: nothing for group or others (files 0600, directories
/// 0700).
pub const DEFAULT_UMASK: u32 = 0o077;

/// `v`, unless it is zero (then `why`).
fn nonzero<T: Default + PartialEq>(v: T, why: &str) -> Result<T, Invalid> {
    if v == T::default() {
        return Err(why.into());
    }
    Ok(v)
}

/// `parse`, its value wrapped in `Some` (a setting whose default is
/// derived).
fn some<T>(
    parse: impl FnOnce(Scalar) -> Result<T, Invalid>,
) -> impl FnOnce(Scalar) -> Result<Option<T>, Invalid> {
    move |s| parse(s).map(Some)
}

/// `data_dir`: not empty.
fn parse_data_dir(s: Scalar) -> Result<PathBuf, Invalid> {
    let d = s.text()?;
    if d.trim().is_empty() {
        return Err("data_dir must not be empty".into());
    }
    Ok(PathBuf::from(d.trim()))
}

/// `node_name`: 1 to 200 characters, no control characters.
fn parse_node_name(s: Scalar) -> Result<String, Invalid> {
    let n = s.text()?;
    let n = n.trim();
    if n.is_empty() || n.len() > 200 || n.chars().any(|c| c.is_control()) {
        return Err("node_name must be 1 to 200 characters without control characters".into());
    }
    Ok(n.to_string())
}

/// `umask`: octal, at most 0777.
fn parse_umask(s: Scalar) -> Result<u32, Invalid> {
    let t = s.text()?;
    let t = t.trim();
    match u32::from_str_radix(t.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o777 && !t.is_empty() => Ok(m),
        _ => Err(
            format!("umask = {t:?}: expected an octal mode like \"0077\" (at most 0777)").into(),
        ),
    }
}

/// Creates `dir` (and missing parents) with mode 0700 if it does not exist;
/// an existing directory is left as it is.
pub fn create_private_dir(dir: &Path) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::from_io("create the data directory", e).with_path(dir))
}

/// The default `node_name`: `HOST:/absolute/data_dir`. Stable across
/// restarts of one node (so a restarted node replaces its own fleet policy
/// rows instead of leaving an old name's behind) and distinct between
/// nodes unless two share a host and a data directory — set `node_name`
/// explicitly then.
pub fn default_node_name(data_dir: &Path) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    let dir = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    format!("{host}:{}", dir.display())
}

/// Command-line overrides of config keys: `serve`'s store flags, and the
/// global `--data-dir` (set by `main`). Values are parsed like the
/// environment's, so errors name the flag.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct StoreFlags {
    /// Root of the default store (set from the global --data-dir).
    #[arg(skip)]
    pub data_dir: Option<String>,
    /// kv engine: sqlite://PATH, postgres://…[?schema=S] or mem://
    /// [config `kv`, env BLOBPOOL_KV].
    #[arg(long, value_name = "URL")]
    pub kv: Option<String>,
    /// Large engine: file://PATH, pglo://…, s3://BUCKET/PREFIX, gs://…,
    /// az://…, http(s)://…, object+file:///PATH, mem:// or none [config
    /// `large`].
    #[arg(long, value_name = "URL")]
    pub large: Option<String>,
    /// mem-only, kv-only or dual-tier [default: derived from the tiers].
    #[arg(long, value_name = "MODE")]
    pub mode: Option<String>,
    /// kv/large boundary (kv-only: the size limit), e.g. 64KiB or bytes.
    #[arg(long, value_name = "SIZE")]
    pub threshold: Option<String>,
    /// Fleet admission (ADR-012 §3); --fleet=false turns a configured
    /// fleet off.
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub fleet: Option<String>,
    /// Delete window, e.g. 1h or seconds.
    #[arg(long, value_name = "DURATION")]
    pub window: Option<String>,
    /// Largest accepted put, e.g. 4GiB or bytes.
    #[arg(long, value_name = "SIZE")]
    pub max_blob_size: Option<String>,
    /// Listen address [default: 127.0.0.1:7070, or `listen` in the config].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// The layers of the configuration: flags > environment > file.
struct Layers<'a> {
    /// The file's name in messages and its text (for line and column).
    path: String,
    text: String,
    env: &'a dyn Fn(&str) -> Option<String>,
    flags: &'a StoreFlags,
}

impl Layers<'_> {
    /// A key's value and origin: its flag, else `BLOBPOOL_KEY`, else the
    /// file's value.
    fn pick(
        &self,
        key: &str,
        flag: Option<&String>,
        file: &Option<Spanned<Scalar>>,
    ) -> Option<(Scalar, Origin)> {
        if let Some(v) = flag {
            return Some((
                Scalar::Str(v.clone()),
                Origin::Flag(format!("--{}", key.replace('_', "-"))),
            ));
        }
        let name = env_of(key);
        if let Some(v) = (self.env)(&name) {
            return Some((Scalar::Str(v), Origin::Env(name)));
        }
        file.as_ref().map(|s| {
            let (line, col) = line_col(&self.text, s.span().start);
            (
                s.get_ref().clone(),
                Origin::File(format!("{}:{line}:{col}: {key}", self.path)),
            )
        })
    }

    /// [`Self::pick`], typed by `parse`; a bad value's error names its
    /// origin.
    fn get<T>(
        &self,
        key: &str,
        flag: Option<&String>,
        file: &Option<Spanned<Scalar>>,
        parse: impl FnOnce(Scalar) -> Result<T, Invalid>,
    ) -> Result<Option<(T, Origin)>, ConfigError> {
        match self.pick(key, flag, file) {
            None => Ok(None),
            Some((v, origin)) => match parse(v) {
                Ok(t) => Ok(Some((t, origin))),
                Err(e) => Err(origin.err(key, e)),
            },
        }
    }

    /// The file's origin for a whole section (no line: serde's typed
    /// sections do not keep spans).
    fn section(&self, name: &str) -> Origin {
        Origin::File(format!("{}: [{name}]", self.path))
    }
}

/// The storage tiers as the configuration resolves them.
struct Tiers {
    kv: EngineSpec,
    large: Option<EngineSpec>,
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
    type Err = Invalid;

    fn from_str(s: &str) -> Result<Self, Invalid> {
        match s.trim() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("log format {other:?}: expected text or json").into()),
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

/// A checked engine choice: the engine a URL names in the registry
/// (store-registry, ADR-027), its URL and options.
pub use store_registry::EngineSpec;

/// The engines this binary can open: every engine crate of the default
/// build plus the S3, GCS, Azure and HTTP object-store backends.
pub fn registry() -> &'static store_registry::Registry {
    static REGISTRY: std::sync::OnceLock<store_registry::Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(store_registry::Registry::default)
}

/// The registry's message for a configuration error (its `Display` adds
/// a "configuration error:" prefix the origin already implies).
fn config_message(e: Error) -> Invalid {
    Invalid(match e {
        Error::Config(m) => m,
        other => other.to_string(),
    })
}

/// The registry options of a configuration: its `schema`,
/// `shared_media` and `fsync`.
fn engine_options(schema: &str, shared_media: bool, fsync: bool) -> store_registry::Options {
    store_registry::Options {
        schema: schema.to_string(),
        shared_media,
        fsync,
        ..store_registry::Options::default()
    }
}

/// Parses a kv engine URL (`sqlite://PATH`, `postgres://…[?schema=S]`,
/// `mem://`, … any kv engine of [`registry`]) with the configuration's
/// `options`.
pub fn parse_kv(url: &str, options: &store_registry::Options) -> Result<EngineSpec, Invalid> {
    registry()
        .resolve(url, store_types::Tier::Kv, options)
        .map_err(config_message)
}

/// Parses a large engine URL (`None` for `none` or an empty string).
pub fn parse_large(
    url: &str,
    options: &store_registry::Options,
) -> Result<Option<EngineSpec>, Invalid> {
    registry()
        .resolve_large(url, options)
        .map_err(config_message)
}

fn parse_mode(s: &str, threshold: u64) -> Result<Mode, Invalid> {
    match s.trim() {
        "mem-only" => Ok(Mode::MemOnly),
        "kv-only" => Ok(Mode::KvOnly { threshold }),
        "dual-tier" => Ok(Mode::DualTier { threshold }),
        other => {
            Err(format!("unknown mode {other:?}: expected mem-only, kv-only or dual-tier").into())
        }
    }
}

/// An explicit `mode` must fit the tiers: caught here, with origins, rather
/// than by the store builder at open.
fn check_mode_tiers(mode: Mode, v: &Values, has_large: bool) -> Result<(), ConfigError> {
    let origin = &v.mode.1;
    let name = match mode {
        Mode::MemOnly => "mem-only",
        Mode::KvOnly { .. } => "kv-only",
        Mode::DualTier { .. } => "dual-tier",
    };
    match (mode, has_large) {
        (Mode::DualTier { .. }, false) => {
            let why = match (&v.large, &v.kv) {
                ((Some(_), o), _) => format!("large is none ({o})"),
                ((None, _), (Some(_), o)) => format!(
                    "kv is set ({o}) and large is not, which leaves no large tier; \
                     set large (e.g. \"file://DIR/large\")"
                ),
                _ => "there is none".to_string(),
            };
            Err(origin.err(
                "mode",
                format!("mode dual-tier needs a large tier, but {why}"),
            ))
        }
        (Mode::MemOnly | Mode::KvOnly { .. }, true) => {
            let why = match &v.large {
                (Some(_), o) => format!("large is set ({o})"),
                (None, _) => "the default store has one (set large = \"none\")".to_string(),
            };
            Err(origin.err(
                "mode",
                format!("mode {name} has no large tier, but {why}; use dual-tier or drop large"),
            ))
        }
        _ => Ok(()),
    }
}

impl Config {
    /// Loads the configuration: `file` (or `./blobpool.toml` when present),
    /// then the environment through `env`.
    pub fn load(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Self::load_with(file, env, &StoreFlags::default())
    }

    /// [`Self::load`], then the command-line `flags` over both.
    pub fn load_with(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &StoreFlags,
    ) -> Result<Config, ConfigError> {
        let (fc, path, text) = match file {
            Some(p) => Self::read_file(p)?,
            None if Path::new(DEFAULT_CONFIG_FILE).is_file() => {
                Self::read_file(Path::new(DEFAULT_CONFIG_FILE))?
            }
            None => (FileConfig::default(), String::new(), String::new()),
        };
        Self::resolve(
            fc,
            &Layers {
                path,
                text,
                env,
                flags,
            },
        )
    }

    /// Parses a TOML text (no file, no environment), for tests and tools.
    #[cfg(test)]
    pub fn from_toml(text: &str) -> Result<Config, String> {
        Self::from_layers(text, &|_| None, &StoreFlags::default())
    }

    /// A TOML text (named `<toml>` in messages) under `env` and `flags`.
    #[cfg(test)]
    fn from_layers(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &StoreFlags,
    ) -> Result<Config, String> {
        let fc = Self::parse_file(text, "<toml>").map_err(|e| e.to_string())?;
        Self::resolve(
            fc,
            &Layers {
                path: "<toml>".into(),
                text: text.into(),
                env,
                flags,
            },
        )
        .map_err(|e| e.to_string())
    }

    /// Parses a config file's text; a syntax or type error reads `config
    /// file PATH:LINE:COL: message` on one line.
    fn parse_file(text: &str, path: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e: toml::de::Error| {
            let at = match e.span() {
                Some(span) => {
                    let (line, col) = line_col(text, span.start);
                    format!("{path}:{line}:{col}")
                }
                None => path.to_string(),
            };
            let msg = e.message().trim().replace('\n', "; ");
            Origin::File(at).err("", msg)
        })
    }

    fn read_file(p: &Path) -> Result<(FileConfig, String, String), ConfigError> {
        let path = p.display().to_string();
        let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Unreadable {
            path: path.clone(),
            source,
        })?;
        let fc = Self::parse_file(&text, &path)?;
        Ok((fc, path, text))
    }

    fn resolve(fc: FileConfig, l: &Layers) -> Result<Config, ConfigError> {
        let v = Values::layered(&fc, l)?;
        let tiers = Self::resolve_tiers(&v)?;
        let mode = Self::resolve_mode(&v, &tiers)?;
        Self::check_token_ttl(&v)?;
        let (gc, unreferenced_namespaces) = Self::resolve_gc(&fc, l, v.fleet.0)?;
        let root = &v.data_dir.0;
        let derived = Derived {
            kv: tiers.kv,
            large: tiers.large,
            mode,
            node_name: (v.node_name.0.clone()).unwrap_or_else(|| default_node_name(root)),
            unreferenced_namespaces,
            gc,
            sections: Self::resolve_sections(fc.sections(), l)?,
            uploads_dir: (v.uploads_dir.0.clone()).unwrap_or_else(|| root.join("uploads")),
            default_root: v.kv.0.is_none().then(|| root.clone()),
        };
        // mem-only: the store is memory, so a smaller default.
        let mem_only_default = mode == Mode::MemOnly && v.max_blob_size.1 == Origin::Default;
        let mut config = Config::assemble(v, derived);
        if mem_only_default {
            config.max_blob_size = DEFAULT_MEM_ONLY_MAX_BLOB_SIZE;
        }
        Ok(config)
    }

    /// The server's sections: the file's `[http]` checked (an error names
    /// the file's section), then the environment's variables over them
    /// (each checked, an error names the variable).
    fn resolve_sections(
        sections: settings::Sections,
        l: &Layers,
    ) -> Result<settings::Sections, ConfigError> {
        if let Some(h) = &sections.http {
            sections::check_http(h.allowed_hosts.as_deref(), &h.cors_origins)
                .map_err(|e| e.from_origin(&l.section("http")))?;
        }
        sections.with_env(l.env)
    }

    /// The storage tiers: `kv`, `large` (with `schema`, `shared_media`
    /// and `fsync`), else the embedded default rooted at `data_dir`.
    fn resolve_tiers(v: &Values) -> Result<Tiers, ConfigError> {
        let options = engine_options(&v.schema.0, v.shared_media.0, v.fsync.0);
        let root = &v.data_dir.0;
        // The embedded default roots at data_dir; it applies only to a kv
        // (and large) tier left unset. kv set and large unset: kv-only
        // (no large tier), stated by `describe`.
        let kv = match &v.kv {
            (Some(url), origin) => {
                if v.data_dir.1 != Origin::Default {
                    return Err(v.data_dir.1.err(
                        "data_dir",
                        format!(
                            "data_dir has no effect because kv is set ({origin}): data_dir is the \
                         root of the default SQLite kv and local-file large tier; drop one of \
                         them (for a large tier next to that kv, set large = \"file://DIR/large\")"
                        ),
                    ));
                }
                parse_kv(url, &options).map_err(|e| origin.err("kv", e))?
            }
            (None, _) => parse_kv(
                &format!("sqlite://{}", root.join("kv.sqlite").display()),
                &options,
            )
            .map_err(|e| Origin::Default.err("kv", e))?,
        };
        let large = match (&v.kv.0, &v.large) {
            (_, (Some(url), origin)) => {
                parse_large(url, &options).map_err(|e| origin.err("large", e))?
            }
            (None, (None, _)) => Some(
                parse_large(
                    &format!("file://{}", root.join("large").display()),
                    &options,
                )
                .map_err(|e| Origin::Default.err("large", e))?
                .expect("a file:// URL names a large tier"),
            ),
            (Some(_), (None, _)) => None,
        };
        Ok(Tiers { kv, large })
    }

    /// The dispatch mode: `mode` and `threshold`, checked against the
    /// tiers, else what the tiers imply.
    fn resolve_mode(v: &Values, tiers: &Tiers) -> Result<Mode, ConfigError> {
        let threshold = v.threshold.0;
        Ok(match &v.mode {
            (Some(m), origin) => {
                let mode = parse_mode(m, threshold).map_err(|e| origin.err("mode", e))?;
                check_mode_tiers(mode, v, tiers.large.is_some())?;
                mode
            }
            // A kv tier private to the process (mem://) and no large
            // tier: everything lives in memory.
            (None, _) => match (&tiers.kv, &tiers.large) {
                (kv, None) if kv.is_private() => Mode::MemOnly,
                (_, None) => Mode::KvOnly { threshold },
                (_, Some(_)) => Mode::DualTier { threshold },
            },
        })
    }

    /// In a fleet, `token_ttl` is at most `pin_ttl`.
    fn check_token_ttl(v: &Values) -> Result<(), ConfigError> {
        match (&v.token_ttl, &v.pin_ttl) {
            ((Some(t), origin), (pin_ttl, pin_origin)) if v.fleet.0 && t > pin_ttl => Err(origin
                .err(
                    "token_ttl",
                    format!(
                        "token_ttl = {} exceeds pin_ttl = {} ({pin_origin}): in fleet mode a pin \
                     token must not outlive the pin row it renews (ADR-018)",
                        humantime::format_duration(*t),
                        humantime::format_duration(*pin_ttl),
                    ),
                )),
            _ => Ok(()),
        }
    }

    /// `[gc]` (with `BLOBPOOL_GC_INTERVAL`) and the unreferenced
    /// namespaces (with `BLOBPOOL_GC_UNREFERENCED_NAMESPACES`); an error
    /// names the variable when it set the value.
    fn resolve_gc(
        fc: &FileConfig,
        l: &Layers,
        fleet: bool,
    ) -> Result<(crate::gc::GcSettings, Vec<Namespace>), ConfigError> {
        let origin = |key: &str| {
            let name = env_of(key);
            (l.env)(&name).map(|v| (v, Origin::Env(name)))
        };
        let (unreferenced, unreferenced_origin) = match origin("gc.unreferenced_namespaces") {
            Some((list, o)) => (
                list.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
                o,
            ),
            None => (
                fc.gc
                    .as_ref()
                    .and_then(|g| g.unreferenced_namespaces.clone())
                    .unwrap_or_default(),
                l.section("gc"),
            ),
        };
        let interval = origin("gc.interval");
        let interval_origin = interval.as_ref().map(|(_, o)| o.clone());
        let interval = interval.map(|(v, _)| v);
        let gc = crate::gc::resolve(fc.gc.clone(), unreferenced.clone(), interval, fleet).map_err(
            |e| match e.key() {
                Some(k) if k.starts_with("gc.interval") => {
                    e.from_origin(interval_origin.as_ref().unwrap_or(&l.section("gc")))
                }
                Some("gc.unreferenced_namespaces") => e.from_origin(&unreferenced_origin),
                _ => e.from_origin(&l.section("gc")),
            },
        )?;
        // gc::resolve checked each name.
        let unreferenced_namespaces = unreferenced
            .into_iter()
            .filter_map(|n| Namespace::new(n).ok())
            .collect();
        Ok((gc, unreferenced_namespaces))
    }

    /// The store's shape in one line, passwords redacted, e.g. `store: kv
    /// sqlite ./blobpool-data/kv.sqlite, large file ./blobpool-data/large,
    /// dual-tier above 64 KiB, not fleet` or `store: kv postgres
    /// postgres://u:***@db/pool (schema blobpool), no large tier: kv-only,
    /// blobs above 64 KiB are refused, not fleet`.
    pub fn describe(&self) -> String {
        let kv = format!("kv {}", self.kv.describe());
        let large = match &self.large {
            None => "no large tier".to_string(),
            Some(l) => format!("large {}", l.describe()),
        };
        let mode = match self.mode {
            Mode::MemOnly => "mem-only".to_string(),
            Mode::KvOnly { threshold } => format!(
                "kv-only, blobs above {} are refused",
                format_size(threshold)
            ),
            Mode::DualTier { threshold } => format!("dual-tier above {}", format_size(threshold)),
        };
        let sep = if self.large.is_none() { ": " } else { ", " };
        let fleet = if self.fleet {
            format!(
                "fleet (pin_ttl {})",
                humantime::format_duration(self.pin_ttl)
            )
        } else {
            "not fleet".to_string()
        };
        format!("store: {kv}, {large}{sep}{mode}, {fleet}")
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
            uploads: Some(store_ops::uploads::UploadConfig {
                idle_timeout: self.upload_idle_timeout,
                max_bytes: self.upload_max_bytes,
                max_bytes_per_owner: self.upload_max_bytes_per_identity,
                fsync: self.fsync,
                ..store_ops::uploads::UploadConfig::new(&self.uploads_dir)
            }),
            cache_namespaces: self
                .gc
                .policies
                .iter()
                .filter(|(_, p)| matches!(p, store_core::GcPolicy::Cache(_)))
                .map(|(ns, _)| ns.clone())
                .collect(),
            cache_paths: self.gc.cache_paths.iter().cloned().collect(),
            immutable_caches: self.gc.immutable.iter().cloned().collect(),
            ..Default::default()
        }
    }

    /// Opens the engines and builds the store for a one-off CLI command,
    /// applying the `[gc]` policies in this process. In a fleet a CLI
    /// command records no policy rows (ADR-045): only the node itself
    /// (`serve`, [`Config::open_node_store`]) speaks for `node_name`, so a
    /// command run with another configuration on the node's host can never
    /// replace or remove the node's rows.
    pub async fn open_store(&self) -> Result<Store, Error> {
        self.open_with(false, None).await
    }

    /// [`Config::open_store`] for `serve`: in a fleet it also records this
    /// node's configured policies in the shared database and removes its
    /// rows for namespaces the configuration no longer names.
    pub async fn open_node_store(&self) -> Result<Store, Error> {
        self.open_with(true, None).await
    }

    /// [`Config::open_node_store`] with both tiers wrapped in `metrics`
    /// (store-layers' per-engine, per-operation latency histograms and
    /// error counts, rendered by `/metrics`).
    pub async fn open_node_store_observed(
        &self,
        metrics: &store_layers::MetricsLayer,
    ) -> Result<Store, Error> {
        self.open_with(true, Some(metrics)).await
    }

    async fn open_with(
        &self,
        node: bool,
        metrics: Option<&store_layers::MetricsLayer>,
    ) -> Result<Store, Error> {
        if let Some(root) = &self.default_root {
            create_private_dir(root)?;
        }
        let mut kv = self.kv.open_kv().await?.engine;
        let mut large = match &self.large {
            Some(l) => Some(l.open_large().await?.engine),
            None => None,
        };
        let mut stack = store_layers::LayerStack::new();
        if let Some(m) = metrics {
            stack = stack.layer(m.clone());
        }
        // Engines across a network retry transient failures (ADR-064),
        // outside the metrics layer so each attempt is counted; an
        // embedded file or local disk has none worth a second layer.
        let retried = stack.clone().layer(store_layers::RetryLayer::default());
        let across_network =
            |s: Sharing| matches!(s, Sharing::DatabaseServer | Sharing::SharedService);
        kv = match across_network(kv.capabilities().sharing) {
            true => retried.kv(kv),
            false => stack.kv(kv),
        };
        large = large.map(|l| match across_network(l.capabilities().sharing) {
            true => retried.large(l),
            false => stack.large(l),
        });
        let mut b = Store::builder()
            .kv_shared(kv)
            .mode(self.mode)
            .fleet(self.fleet)
            .window(self.window)
            .pin_ttl(self.pin_ttl)
            .owner(self.node_name.clone());
        if let Some(l) = large {
            b = b.large_shared(l);
        }
        let store = b.build().await?;
        for line in self.gc.apply(&store, node).await? {
            tracing::info!(target: "blobpool::gc", "namespace policy: {line}");
        }
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use store_core::GcPolicy;

    /// The URL a tier resolved to.
    fn url(spec: &EngineSpec) -> &str {
        spec.url().as_str()
    }

    /// The large tier's URL, if any.
    fn large_url(c: &Config) -> Option<&str> {
        c.large.as_ref().map(url)
    }

    fn opts(schema: &str) -> store_registry::Options {
        engine_options(schema, false, true)
    }

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
        assert_eq!(url(&c.kv), "sqlite://./blobpool-data/kv.sqlite");
        assert_eq!(large_url(&c), Some("file://./blobpool-data/large"));
        assert_eq!(c.kv.engine(), "sqlite");
        assert_eq!(c.large.as_ref().unwrap().engine(), "local");
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
        let e = Config::from_toml("kv = \"mysql://u:s3cret@h/db\"")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cret") && e.contains("u:***@h"), "{e}");
        let e = Config::from_toml("large = \"ftp://u:s3cret@h/x\"")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cret"), "{e}");
    }

    #[test]
    fn object_store_urls_select_the_object_engine() {
        for (u, want) in [
            ("s3://bucket/pool", "object s3://bucket/pool"),
            ("object+file:///srv/pool", "object file:///srv/pool"),
            ("object+memory://", "object memory://"),
        ] {
            let spec = parse_large(u, &opts("s")).unwrap().unwrap();
            assert_eq!(
                (spec.engine(), spec.describe().as_str()),
                ("object", want),
                "{u}"
            );
        }
        assert!(parse_large("object+ftp://x", &opts("s")).is_err());
    }

    /// ADR-045: in a fleet only the node (`serve`) records and removes its
    /// policy rows; a CLI command with another configuration on the same
    /// host (same `node_name`) neither replaces nor removes them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_node_writes_its_fleet_policy_rows() {
        let schema = store_pg::testing::TestSchema::new();
        let sep = if schema.url.contains('?') { '&' } else { '?' };
        let cfg = |node: &str, policy: Option<&str>| {
            let mut text = format!(
                "kv = \"{}{sep}schema={}\"\nlarge = \"none\"\nfleet = true\nnode_name = \"{node}\"\n",
                schema.url, schema.name
            );
            if let Some(p) = policy {
                text.push_str(&format!("[gc.namespaces.docs]\npolicy = \"{p}\"\n"));
            }
            Config::from_toml(&text).unwrap()
        };
        let docs = Namespace::new("docs").unwrap();
        let policy = |s: Store| {
            let docs = docs.clone();
            async move { s.effective_gc_policy(&docs).await.unwrap() }
        };
        let n1 = cfg("n1", Some("keep")).open_node_store().await.unwrap();
        assert_eq!(policy(n1).await, GcPolicy::Keep);
        // A second node's refs: n1's keep wins.
        let n2 = cfg("n2", Some("refs")).open_node_store().await.unwrap();
        assert_eq!(policy(n2).await, GcPolicy::Keep);
        // One-off commands on n1's host with other settings change nothing.
        for p in [Some("refs"), None] {
            let s = cfg("n1", p).open_store().await.unwrap();
            assert_eq!(policy(s).await, GcPolicy::Keep);
        }
        // n1 restarted without the namespace removes its own row: n2's
        // refs is in force.
        let n1 = cfg("n1", None).open_node_store().await.unwrap();
        assert_eq!(n1.gc_policy(&docs), None);
        assert_eq!(policy(n1).await, GcPolicy::Refs);
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
        let r = store.put(&ns, &body[..]).await.unwrap();
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
            c.kv.describe(),
            "postgres postgres://u:***@db:5432/pool?sslmode=disable (schema tenant_a)"
        );
        assert_eq!(
            c.large.as_ref().unwrap().describe(),
            "pg-lo postgres://u:***@db:5432/pool (schema fallback)"
        );
        assert!(c.fleet);
        assert_eq!(c.pin_ttl, Duration::from_secs(60));
        assert_eq!(
            parse_large("postgres+lo://h/db?schema=s", &opts("x"))
                .unwrap()
                .unwrap()
                .describe(),
            "pg-lo postgres://h/db (schema s)"
        );
    }

    #[test]
    fn modes_are_derived_from_the_tiers() {
        let c = Config::from_toml("kv = \"mem://\"").unwrap();
        assert_eq!(
            (url(&c.kv), large_url(&c), c.mode),
            ("mem://", None, Mode::MemOnly)
        );
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
        let text = "kv = \"mem://\"\nwindow = 5\n[gc]\nunreferenced_namespaces = [\"a\"]";
        let env = env_of(&[
            ("BLOBPOOL_KV", "sqlite:///var/kv.db"),
            ("BLOBPOOL_LARGE", "file:///var/large"),
            ("BLOBPOOL_WINDOW", "0"),
            ("BLOBPOOL_FLEET", "false"),
            ("BLOBPOOL_GC_UNREFERENCED_NAMESPACES", "tmp, scratch"),
            ("BLOBPOOL_MODE", "dual-tier"),
            ("BLOBPOOL_THRESHOLD", "1024"),
        ]);
        let c = Config::from_layers(text, &env, &StoreFlags::default()).unwrap();
        assert_eq!(url(&c.kv), "sqlite:///var/kv.db");
        assert_eq!(large_url(&c), Some("file:///var/large"));
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
    fn umask_and_upload_byte_caps_parse() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(c.umask, 0o077);
        assert_eq!(
            (c.upload_max_bytes, c.upload_max_bytes_per_identity),
            (128 << 30, 32 << 30)
        );
        let c = Config::from_toml(
            "umask = \"0022\"\nupload_max_bytes = \"1GiB\"\nupload_max_bytes_per_identity = 1000",
        )
        .unwrap();
        assert_eq!(c.umask, 0o022);
        assert_eq!(c.ops_config().uploads.unwrap().max_bytes, 1 << 30);
        assert_eq!(c.upload_max_bytes_per_identity, 1000);
        for bad in [
            "umask = \"0999\"",
            "umask = \"1777\"",
            "umask = \"\"",
            "upload_max_bytes = 0",
        ] {
            assert!(Config::from_toml(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn node_name_is_stable_per_data_dir_and_can_be_set() {
        let a = Config::from_toml("data_dir = \"/srv/a\"").unwrap();
        let again = Config::from_toml("data_dir = \"/srv/a\"").unwrap();
        let b = Config::from_toml("data_dir = \"/srv/b\"").unwrap();
        assert_eq!(a.node_name, again.node_name, "stable across restarts");
        assert_ne!(a.node_name, b.node_name, "distinct per data dir");
        assert!(a.node_name.ends_with(":/srv/a"), "{}", a.node_name);
        let c = Config::from_toml("node_name = \" edge-1 \"").unwrap();
        assert_eq!(c.node_name, "edge-1");
        let env = env_of(&[("BLOBPOOL_NODE_NAME", "edge-2")]);
        let c = Config::from_layers("", &env, &StoreFlags::default()).unwrap();
        assert_eq!(c.node_name, "edge-2");
        for bad in ["node_name = \"\"", "node_name = \"a\\nb\""] {
            let e = Config::from_toml(bad).unwrap_err().to_string();
            assert!(e.contains("node_name"), "{e}");
        }
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
        let e = Config::from_toml("fleet = true\npin_ttl = 60\ntoken_ttl = 61")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("<toml>:3:13: token_ttl: token_ttl = 1m 1s exceeds pin_ttl = 1m (config file <toml>:2:11: pin_ttl)"),
            "{e}"
        );
        let env = env_of(&[("BLOBPOOL_FLEET", "true"), ("BLOBPOOL_TOKEN_TTL", "901")]);
        assert!(Config::from_layers("", &env, &StoreFlags::default()).is_err());
        let e = Config::from_toml("token_ttl = 0").unwrap_err().to_string();
        assert!(e.contains("token_ttl = 0"), "{e}");
        let e = Config::from_toml("max_tokens = 0").unwrap_err().to_string();
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
        assert!(Config::from_layers("", &env, &StoreFlags::default()).is_err());
    }
    fn flags() -> StoreFlags {
        StoreFlags::default()
    }

    #[test]
    fn durations_and_sizes_take_human_units_or_plain_numbers() {
        let c = Config::from_toml(
            "window = \"1h\"\npin_ttl = \"15m\"\ntoken_ttl = \"10m\"\n\
             threshold = \"64KiB\"\nmax_blob_size = \"4GiB\"",
        )
        .unwrap();
        assert_eq!(c.window, Duration::from_secs(3600));
        assert_eq!(c.pin_ttl, Duration::from_secs(900));
        assert_eq!(c.token_ttl, Some(Duration::from_secs(600)));
        assert_eq!(c.mode, Mode::DualTier { threshold: 65536 });
        assert_eq!(c.max_blob_size, 4 << 30);
        // Integers keep working: seconds and bytes.
        let c = Config::from_toml("window = 60\nthreshold = 1000\nmax_blob_size = 5").unwrap();
        assert_eq!(c.window, Duration::from_secs(60));
        assert_eq!(c.mode, Mode::DualTier { threshold: 1000 });
        assert_eq!(c.max_blob_size, 5);
        // The environment and the flags take the same forms.
        let env = env_of(&[
            ("BLOBPOOL_WINDOW", "1h 30m"),
            ("BLOBPOOL_PIN_TTL", "120"),
            ("BLOBPOOL_THRESHOLD", "1.5 KiB"),
            ("BLOBPOOL_MAX_BLOB_SIZE", "1MB"),
        ]);
        let c = Config::from_layers("", &env, &flags()).unwrap();
        assert_eq!(c.window, Duration::from_secs(5400));
        assert_eq!(c.pin_ttl, Duration::from_secs(120));
        assert_eq!(c.mode, Mode::DualTier { threshold: 1536 });
        assert_eq!(c.max_blob_size, 1_000_000);
        let f = StoreFlags {
            threshold: Some("128".into()),
            window: Some("2m".into()),
            max_blob_size: Some("2KiB".into()),
            ..flags()
        };
        let c = Config::from_layers("threshold = \"1MiB\"", &env, &f).unwrap();
        assert_eq!(c.mode, Mode::DualTier { threshold: 128 });
        assert_eq!(c.window, Duration::from_secs(120));
        assert_eq!(c.max_blob_size, 2048);
        assert_eq!(parse_size("64kb"), Ok(64_000));
        for bad in ["", "big", "-1", "5 parsecs", "99999999999EiB"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(format_size(65536), "64 KiB");
        assert_eq!(format_size(65537), "65537 bytes");
        assert_eq!(format_size(16 << 30), "16 GiB");
        assert_eq!(format_size(0), "0 bytes");
    }

    #[test]
    fn errors_name_the_file_line_and_column() {
        let text = "kv = \"mem://\"\n\n  window = \"soon\"\n";
        let e = Config::from_toml(text).unwrap_err().to_string();
        assert!(
            e.starts_with("config file <toml>:3:12: window: \"soon\""),
            "{e}"
        );
        let e = Config::from_toml("mode = \"fast\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config file <toml>:1:8: mode: unknown mode \"fast\""),
            "{e}"
        );
        let e = Config::from_toml("threshold = true")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config file <toml>:1:13: threshold: expected a size"),
            "{e}"
        );
        let e = Config::from_toml("max_blob_size = -1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("<toml>:1:17: max_blob_size"), "{e}");
        let e = Config::from_toml("fleet = 1").unwrap_err().to_string();
        assert!(
            e.contains("<toml>:1:9: fleet: expected true or false"),
            "{e}"
        );
        let e = Config::from_toml("kv = \"postgres://u:pw@h/db\"\nmode = \"dual-tier\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config file <toml>:2:8: mode: mode dual-tier needs a large tier")
                && e.contains("kv is set (config file <toml>:1:6: kv)"),
            "{e}"
        );
        // toml's own errors (syntax, unknown keys, non-scalars) on one line.
        for (text, at) in [
            ("typo_key = 1", "<toml>:1:1: unknown field `typo_key`"),
            ("kv = [1]", "<toml>:1:6: invalid type"),
            ("kv = ", "<toml>:1:"),
        ] {
            let e = Config::from_toml(text).unwrap_err().to_string();
            assert!(e.starts_with(&format!("config file {at}")), "{text:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn errors_name_the_environment_variable_or_the_flag() {
        let env = env_of(&[("BLOBPOOL_THRESHOLD", "lots")]);
        let e = Config::from_layers("threshold = 5", &env, &flags())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("environment BLOBPOOL_THRESHOLD: \"lots\""),
            "{e}"
        );
        let env = env_of(&[("BLOBPOOL_FLEET", "maybe")]);
        let e = Config::from_layers("", &env, &flags())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("environment BLOBPOOL_FLEET: \"maybe\""),
            "{e}"
        );
        let env = env_of(&[("BLOBPOOL_KV", "redis://u:secret@h")]);
        let e = Config::from_layers("", &env, &flags())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("environment BLOBPOOL_KV: unsupported kv URL"),
            "{e}"
        );
        assert!(!e.contains("secret"), "{e}");
        let env = env_of(&[("BLOBPOOL_GC_INTERVAL", "soon")]);
        let e = Config::from_layers("", &env, &flags())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("environment BLOBPOOL_GC_INTERVAL: gc.interval"),
            "{e}"
        );
        let e = Config::from_toml("[gc]\nunreferenced_namespaces = [\"../x\"]")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config file <toml>: [gc]: gc.unreferenced_namespaces"),
            "{e}"
        );
        let env = env_of(&[("BLOBPOOL_TOKEN_TTL", "0")]);
        let e = Config::from_layers("", &env, &flags())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("environment BLOBPOOL_TOKEN_TTL: token_ttl = 0"),
            "{e}"
        );
        // A flag wins over the environment, and its error names it.
        let env = env_of(&[("BLOBPOOL_MODE", "kv-only")]);
        let f = StoreFlags {
            mode: Some("turbo".into()),
            ..flags()
        };
        let e = Config::from_layers("", &env, &f).unwrap_err().to_string();
        assert!(e.starts_with("flag --mode: unknown mode \"turbo\""), "{e}");
        let f = StoreFlags {
            max_blob_size: Some("4 parsecs".into()),
            ..flags()
        };
        let e = Config::from_layers("", &env_of(&[]), &f)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("flag --max-blob-size: \"4 parsecs\""), "{e}");
        let f = StoreFlags {
            fleet: Some("false".into()),
            ..flags()
        };
        let env = env_of(&[("BLOBPOOL_FLEET", "true")]);
        assert!(!Config::from_layers("", &env, &f).unwrap().fleet);
    }

    #[test]
    fn data_dir_roots_the_default_store() {
        let c = Config::from_toml("data_dir = \"/srv/bp\"").unwrap();
        assert_eq!(url(&c.kv), "sqlite:///srv/bp/kv.sqlite");
        assert_eq!(large_url(&c), Some("file:///srv/bp/large"));
        // The environment and the flag, each over the one before.
        let env = env_of(&[("BLOBPOOL_DATA_DIR", "env-dir")]);
        let c = Config::from_layers("data_dir = \"file-dir\"", &env, &flags()).unwrap();
        assert_eq!(url(&c.kv), "sqlite://env-dir/kv.sqlite");
        let f = StoreFlags {
            data_dir: Some("flag-dir/".into()),
            ..flags()
        };
        let c = Config::from_layers("data_dir = \"file-dir\"", &env, &f).unwrap();
        assert_eq!(url(&c.kv), "sqlite://flag-dir/kv.sqlite");
        assert_eq!(large_url(&c), Some("file://flag-dir/large"));
        // Large set elsewhere: data_dir still roots the default kv.
        let c = Config::from_toml("data_dir = \"/srv/bp\"\nlarge = \"s3://bucket/pool\"").unwrap();
        assert_eq!(url(&c.kv), "sqlite:///srv/bp/kv.sqlite");
        assert_eq!(large_url(&c), Some("s3://bucket/pool"));
        // kv set: data_dir would have no effect, which is an error naming both.
        let env = env_of(&[("BLOBPOOL_KV", "mem://")]);
        let e = Config::from_layers("data_dir = \"/srv/bp\"", &env, &flags())
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("config file <toml>:1:12: data_dir: data_dir has no effect because kv is set (environment BLOBPOOL_KV)"),
            "{e}"
        );
        let e = Config::from_toml("data_dir = \" \"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("data_dir must not be empty"), "{e}");
    }

    #[test]
    fn describe_states_the_shape_in_one_line() {
        let c = Config::from_toml("").unwrap();
        assert_eq!(
            c.describe(),
            "store: kv sqlite ./blobpool-data/kv.sqlite, large file ./blobpool-data/large, \
             dual-tier above 64 KiB, not fleet"
        );
        let c = Config::from_toml("kv = \"postgres://u:s3cret@db/pool?password=s3cret\"").unwrap();
        let d = c.describe();
        assert_eq!(
            d,
            "store: kv postgres postgres://u:***@db/pool?password=*** (schema blobpool), \
             no large tier: kv-only, blobs above 64 KiB are refused, not fleet"
        );
        let c = Config::from_toml(
            "kv = \"postgres://db/pool?schema=t\"\nlarge = \"pglo://u:pw@db/pool\"\n\
             fleet = true\npin_ttl = \"5m\"\nthreshold = \"1MiB\"",
        )
        .unwrap();
        assert_eq!(
            c.describe(),
            "store: kv postgres postgres://db/pool (schema t), large pg-lo postgres://u:***@db/pool \
             (schema blobpool), dual-tier above 1 MiB, fleet (pin_ttl 5m)"
        );
        let c = Config::from_toml("kv = \"mem://\"").unwrap();
        assert_eq!(
            c.describe(),
            "store: kv mem (in memory, lost on exit), no large tier: mem-only, not fleet"
        );
        let c = Config::from_toml("large = \"s3://b/p\"\nshared_media = true").unwrap();
        assert!(
            c.describe().contains("large object s3://b/p, dual-tier"),
            "{}",
            c.describe()
        );
        assert!(!c.describe().contains('\n'));
    }

    #[test]
    fn engine_urls_and_settings_are_checked_at_load() {
        let e = Config::from_toml("large = \"s3://b/p?part_sise=1MiB\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "config file <toml>:1:9: large: \"s3://b/p\": unknown option \"part_sise\" \
                 for the object engine"
            ),
            "{e}"
        );
        let e = Config::from_toml("kv = \"file:///srv/x\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kv: \"file:///srv/x\" is a large engine (local), not a kv engine"),
            "{e}"
        );
        let c = Config::from_toml("large = \"gs://bucket/pool?part_size=16MiB\"").unwrap();
        assert_eq!(
            c.large.as_ref().unwrap().describe(),
            "object gs://bucket/pool"
        );
        let c = Config::from_toml("large = \"az://container/pool\"").unwrap();
        assert_eq!(c.large.as_ref().unwrap().engine(), "object");
    }

    #[test]
    fn an_explicit_mode_must_fit_the_tiers() {
        let e = Config::from_toml("mode = \"kv-only\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("mode kv-only has no large tier, but the default store has one"),
            "{e}"
        );
        let e = Config::from_toml("large = \"none\"\nmode = \"dual-tier\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("but large is none (config file <toml>:1:9: large)"),
            "{e}"
        );
        let c = Config::from_toml("large = \"none\"\nmode = \"kv-only\"").unwrap();
        assert_eq!(c.large, None);
    }

    /// Every `BLOBPOOL_*` variable the configuration reads is one
    /// `check_environment` knows (it would refuse it at startup otherwise),
    /// and every variable of the lists is read.
    #[test]
    fn every_variable_read_is_known_and_every_known_one_is_read() {
        let asked = std::cell::RefCell::new(Vec::<String>::new());
        let env = |k: &str| {
            asked.borrow_mut().push(k.to_string());
            None
        };
        Config::from_layers("", &env, &StoreFlags::default()).unwrap();
        let mut asked: Vec<String> = asked
            .into_inner()
            .into_iter()
            .filter(|k| k.starts_with("BLOBPOOL_"))
            .collect();
        asked.sort();
        asked.dedup();
        for name in &asked {
            check_environment([name.clone()]).unwrap();
        }
        let mut listed: Vec<String> = SETTINGS.iter().map(Setting::env).collect();
        listed.sort();
        assert_eq!(asked, listed);
    }

    /// Each default the table states (and docs/SERVER.md repeats, checked
    /// by tidy) parses to the setting's constant.
    #[test]
    fn stated_defaults_are_the_constants() {
        let checked: Vec<_> = settings::stated_defaults()
            .into_iter()
            .filter(|(_, _, constant)| constant != "Ok(None)")
            .collect();
        assert!(checked.len() > 15, "{checked:?}");
        for (key, parsed, constant) in checked {
            assert_eq!(parsed, constant, "{key}");
        }
    }

    /// A bad `BLOBPOOL_GC_UNREFERENCED_NAMESPACES` is the variable's error,
    /// not the file's `[gc]`'s.
    #[test]
    fn a_bad_unreferenced_namespace_names_its_variable() {
        let env = env_of(&[("BLOBPOOL_GC_UNREFERENCED_NAMESPACES", "%")]);
        let e = Config::from_layers("", &env, &flags()).unwrap_err();
        assert_eq!(
            e.split(": gc.").next(),
            Some("environment BLOBPOOL_GC_UNREFERENCED_NAMESPACES"),
            "{e}"
        );
        let e = Config::from_toml("[gc]\nunreferenced_namespaces = [\"%\"]").unwrap_err();
        assert!(
            e.starts_with("config file <toml>: [gc]: gc.unreferenced_namespaces"),
            "{e}"
        );
    }

    #[test]
    fn unknown_blobpool_variables_are_refused_by_name() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        check_environment(names(&[
            "PATH",
            "BLOBPOOL_KV",
            "BLOBPOOL_LIMITS_IDLE_TIMEOUT",
            "BLOBPOOL_TOKEN",
            "BLOBPOOL_TEST_S3_ENDPOINT",
            "BLOBPOOL_CRASH_SEEDS",
        ]))
        .unwrap();
        let e = check_environment(names(&["BLOBPOOL_LIMIT_IDLE_TIMEOUT"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("environment BLOBPOOL_LIMIT_IDLE_TIMEOUT: not a Blobpool setting"),
            "{e}"
        );
        assert!(
            e.contains("did you mean BLOBPOOL_LIMITS_IDLE_TIMEOUT"),
            "{e}"
        );
    }

    #[test]
    fn section_variables_override_the_file() {
        let hash = store_ops::auth::hash_key("bpk_env");
        let env = move |k: &str| -> Option<String> {
            match k {
                "BLOBPOOL_AUTH_KEYS" => Some(format!("ci={hash}=read,write:ci-*")),
                "BLOBPOOL_AUTH_ANONYMOUS" => Some("read:public".into()),
                "BLOBPOOL_HTTP_ALLOWED_HOSTS" => Some("a.example, b.example".into()),
                "BLOBPOOL_LIMITS_IDLE_TIMEOUT" => Some("7s".into()),
                "BLOBPOOL_LIMITS_MAX_CONNECTIONS" => Some("12".into()),
                "BLOBPOOL_TLS_CLIENT_AUTH" => Some("required".into()),
                _ => None,
            }
        };
        let text =
            "listen = \"0.0.0.0:7070\"\n[limits]\nidle_timeout = \"60s\"\nwrite_timeout = \"9s\"\n\
                    [tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\nclient_ca = \"/ca.pem\"\n";
        let c = Config::from_layers(text, &env, &StoreFlags::default()).unwrap();
        let http = c.sections.http_config(&c.listen, false).unwrap();
        assert!(http.auth.is_enabled(), "keys from the environment");
        assert_eq!(http.allowed_hosts, ["a.example", "b.example"]);
        assert_eq!(http.limits.idle_timeout, Duration::from_secs(7));
        assert_eq!(
            http.limits.write_timeout,
            Duration::from_secs(9),
            "the file's, kept"
        );
        assert_eq!(http.limits.max_connections, 12);
        let tls = http.tls.unwrap();
        assert_eq!(tls.client_auth, store_http::ClientAuth::Required);
        assert_eq!(tls.cert, PathBuf::from("/c.pem"));
        let bad = |k: &'static str, v: &'static str| {
            let env = move |name: &str| (name == k).then(|| v.to_string());
            Config::from_layers("", &env, &StoreFlags::default())
                .unwrap_err()
                .to_string()
        };
        assert!(
            bad("BLOBPOOL_AUTH_KEYS", "just-a-name").starts_with("environment BLOBPOOL_AUTH_KEYS")
        );
        assert!(bad("BLOBPOOL_LIMITS_MAX_CONNECTIONS", "many")
            .starts_with("environment BLOBPOOL_LIMITS_MAX_CONNECTIONS"));
        assert!(
            bad("BLOBPOOL_TLS_CLIENT_CA", "/ca.pem").starts_with("environment BLOBPOOL_TLS_CERT")
        );
    }

    /// The typed error of loading `text` under `env`.
    fn load_error(text: &str, env: &dyn Fn(&str) -> Option<String>) -> ConfigError {
        let fc = Config::parse_file(text, "<toml>").unwrap();
        Config::resolve(
            fc,
            &Layers {
                path: "<toml>".into(),
                text: text.into(),
                env,
                flags: &StoreFlags::default(),
            },
        )
        .unwrap_err()
    }

    /// Issue 39 item 3: an empty `allowed_hosts` would answer any `Host`
    /// (the DNS rebinding check off, silently): refused at load, from the
    /// file or the variable, naming the setting; `["*"]` is the explicit
    /// opt-out.
    #[test]
    fn an_empty_allowed_hosts_is_refused_and_star_answers_any_host() {
        let e = load_error("[http]\nallowed_hosts = []\n", &|_| None);
        assert_eq!(e.key(), Some("http.allowed_hosts"), "{e}");
        let m = e.to_string();
        assert!(
            m.starts_with("config file <toml>: [http]: http.allowed_hosts is empty")
                && m.contains("[\"*\"]"),
            "{m}"
        );
        for empty in ["", " , ", ","] {
            let env =
                move |k: &str| (k == "BLOBPOOL_HTTP_ALLOWED_HOSTS").then(|| empty.to_string());
            let e = load_error("", &env);
            assert_eq!(e.key(), Some("BLOBPOOL_HTTP_ALLOWED_HOSTS"), "{e}");
            let m = e.to_string();
            assert!(
                m.starts_with(
                    "environment BLOBPOOL_HTTP_ALLOWED_HOSTS: http.allowed_hosts is empty"
                ),
                "{empty:?}: {m}"
            );
        }
        // The opt-out, in either form, answers any Host.
        for (text, env) in [("[http]\nallowed_hosts = [\"*\"]\n", None), ("", Some("*"))] {
            let env = move |k: &str| {
                (k == "BLOBPOOL_HTTP_ALLOWED_HOSTS")
                    .then(|| env.map(str::to_string))
                    .flatten()
            };
            let c = Config::from_layers(text, &env, &StoreFlags::default()).unwrap();
            let http = c.sections.http_config("127.0.0.1:7070", false).unwrap();
            assert_eq!(http.allowed_hosts, ["*"], "{text:?}");
        }
        // Forms that could never match a Host are refused, saying what to
        // write.
        for (hosts, want) in [
            ("[\"*\", \"a.example\"]", "goes alone"),
            ("[\"https://a.example/\"]", "write \"a.example\""),
            ("[\"a.example:7070\"]", "write \"a.example\""),
            ("[\"[::1]\"]", "write \"::1\""),
            ("[\"*.example.com\"]", "no patterns"),
            ("[\"\"]", "empty entry"),
        ] {
            let e = load_error(&format!("[http]\nallowed_hosts = {hosts}\n"), &|_| None);
            assert_eq!(e.key(), Some("http.allowed_hosts"), "{hosts}: {e}");
            assert!(e.to_string().contains(want), "{hosts}: {e}");
        }
        for ok in [
            "[\"blobs.example.com\", \"LOCALHOST\"]",
            "[\"::1\", \"127.0.0.1\"]",
        ] {
            Config::from_toml(&format!("[http]\nallowed_hosts = {ok}\n")).unwrap();
        }
        // Unset keeps its default: the loopback names on a loopback listen.
        let c = Config::from_toml("").unwrap();
        let http = c.sections.http_config("127.0.0.1:7070", false).unwrap();
        assert_eq!(http.allowed_hosts, crate::security::LOOPBACK_HOSTS);
    }

    /// Issue 39 item 3: `cors_origins = ["*"]` used to pass the load and
    /// then panic in the CORS layer after "listening" was printed; every
    /// origin is now checked at load, the error naming the setting.
    #[tokio::test]
    async fn cors_origins_are_checked_at_load() {
        for (origin, want) in [
            ("*", "credentials"),
            ("null", "sandboxed"),
            ("https://ui.example.com/", "\"https://ui.example.com\""),
            ("https://UI.example.com", "\"https://ui.example.com\""),
            ("https://ui.example.com:443", "\"https://ui.example.com\""),
            ("https://ui.example.com/app", "no path"),
            ("ui.example.com", "not an origin"),
            ("ftp://ui.example.com", "only http and https"),
            ("http://ui.example.com:99999", "not a port"),
            ("http://user@ui.example.com", "no user name"),
            ("http://bücher.example", "xn--"),
        ] {
            let e = load_error(
                &format!("[http]\ncors_origins = [\"https://ok.example\", {origin:?}]\n"),
                &|_| None,
            );
            assert_eq!(e.key(), Some("http.cors_origins"), "{origin}: {e}");
            let m = e.to_string();
            assert!(
                m.starts_with("config file <toml>: [http]: http.cors_origins ") && m.contains(want),
                "{origin}: {m}"
            );
            let env =
                move |k: &str| (k == "BLOBPOOL_HTTP_CORS_ORIGINS").then(|| origin.to_string());
            let e = load_error("", &env);
            assert_eq!(e.key(), Some("BLOBPOOL_HTTP_CORS_ORIGINS"), "{origin}: {e}");
            assert!(
                e.to_string()
                    .starts_with("environment BLOBPOOL_HTTP_CORS_ORIGINS: http.cors_origins "),
                "{origin}: {e}"
            );
        }
        // The uploads directory in a temporary one: the default would be
        // ./blobpool-data/uploads in the crate's source directory.
        let dir = tempfile::tempdir().unwrap();
        let c = Config::from_toml(&format!(
            "kv = \"mem://\"\nuploads_dir = {:?}\n[http]\ncors_origins = [\"https://ui.example.com\", \
             \"http://localhost:3000\", \"http://[::1]:8080\", \"https://xn--bcher-kva.example\"]\n",
            dir.path().join("uploads")
        ))
        .unwrap();
        let http = c.sections.http_config("127.0.0.1:7070", false).unwrap();
        assert_eq!(http.cors_origins.len(), 4);
        // The server builds its CORS layer from them without panicking.
        let ops = store_ops::Ops::new(c.open_store().await.unwrap(), c.ops_config()).unwrap();
        let _ = store_http::router_with(ops, &http);
    }
}
