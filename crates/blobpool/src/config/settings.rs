//! The settings table (ADR-059): each top-level key, `[gc]`'s scalar keys
//! and the keys of the server's sections, declared once — key (its
//! variable is `BLOBPOOL_` and the key in capitals), type, default (a named
//! constant of the crate that owns it), the default as docs/SERVER.md
//! states it, parser, whether `serve` takes it as a flag, one line of doc.
//! From it come [`SETTINGS`], the file's shape, the layered values (flag >
//! environment > file > default) and the plain fields of [`Config`].
//! `cargo xtask tidy` checks SERVER.md's settings table against this one;
//! unit tests check each stated default against its constant (a section
//! key's: against the default in force).
//!
//! `plain` settings are [`Config`] fields as layered; `raw` ones feed a
//! later step (the tiers, the mode, a default derived from `data_dir`);
//! `section` ones are read by their section's code (`gc.rs`). `server`
//! declares the keys of `[auth]`, `[http]`, `[tls]` and `[limits]`: each
//! its file type (the section's struct, [`Sections`]) and the parser of
//! its variable ([`super::sections`]); a `required` key is needed in the
//! variables when the file has no such section. `crate::security` builds
//! the server's configuration from them.

use std::path::PathBuf;
use std::time::Duration;

use toml::Spanned;

use super::sections::{self as s, ClientEntry, DurationValue, KeyEntry};
use super::{
    nonzero, parse_data_dir, parse_node_name, parse_umask, some, ConfigError, EngineSpec, Layers,
    LogFormat, Origin, Scalar, DEFAULT_DATA_DIR, DEFAULT_LISTEN, DEFAULT_MAX_TOKENS_PER_IDENTITY,
    DEFAULT_SCHEMA, DEFAULT_UMASK,
};
use store_core::{Mode, Namespace, DEFAULT_PIN_TTL, DEFAULT_THRESHOLD, DEFAULT_WINDOW};
use store_ops::uploads as up;

/// One setting as the table declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The file's key: `window`, or `gc.interval` for a key of `[gc]`.
    pub key: &'static str,
    /// The default as docs/SERVER.md states it.
    pub default: &'static str,
    /// What it is, in one line.
    pub doc: &'static str,
}

impl Setting {
    /// Its environment variable: `BLOBPOOL_` and the key in capitals.
    pub fn env(&self) -> String {
        env_of(self.key)
    }
}

/// The variable of `key`: `window` → `BLOBPOOL_WINDOW`, `gc.interval` →
/// `BLOBPOOL_GC_INTERVAL`.
pub(super) fn env_of(key: &str) -> String {
    format!("BLOBPOOL_{}", key.replace('.', "_").to_ascii_uppercase())
}

/// Declares the table; see the module's documentation.
macro_rules! settings {
    (@flag $l:ident $key:ident) => { None };
    (@flag $l:ident $key:ident flag) => { $l.flags.$key.as_ref() };
    (@needed $sec:ident $key:ident) => {};
    (@needed $sec:ident $key:ident required) => {
        if $key.is_none() {
            let (var, sec) = (env_of(concat!(stringify!($sec), ".", stringify!($key))), stringify!($sec));
            let why = format!("needed with the other BLOBPOOL_{}_* (no [{sec}] in the file)", sec.to_ascii_uppercase());
            return Err(Origin::Env(var.clone()).err(&var, why));
        }
    };
    (
        plain { $( #[doc = $pdoc:literal] $pkey:ident: $pty:ty = $pdef:expr, $ptext:literal, $pparse:expr $(, $pflag:ident)?; )* }
        raw { $( #[doc = $rdoc:literal] $rkey:ident: $rty:ty = $rdef:expr, $rtext:literal, $rparse:expr $(, $rflag:ident)?; )* }
        section { $( #[doc = $sdoc:literal] $sec:ident . $skey:ident: $stext:literal; )* }
        server { $( #[doc = $cdoc:literal] $csec:ident: $Csec:ident {
            $( #[doc = $kdoc:literal] $(#[$kattr:meta])* $ckey:ident: $kty:ty, $ktext:literal, $kenv:expr $(, $kreq:ident)?; )*
        } )* }
        derived { $( $(#[$dattr:meta])* pub $dkey:ident: $dty:ty, )* }
    ) => {
        /// Every setting, in the table's order.
        pub const SETTINGS: &[Setting] = &[
            $( Setting { key: stringify!($rkey), default: $rtext, doc: $rdoc }, )*
            $( Setting { key: stringify!($pkey), default: $ptext, doc: $pdoc }, )*
            $( Setting { key: concat!(stringify!($sec), ".", stringify!($skey)), default: $stext, doc: $sdoc }, )*
            $( $( Setting { key: concat!(stringify!($csec), ".", stringify!($ckey)), default: $ktext, doc: $kdoc }, )* )*
        ];

        $(
            #[doc = $cdoc]
            #[derive(Clone, Debug, Default, serde::Deserialize, PartialEq, Eq)]
            #[serde(deny_unknown_fields)]
            pub struct $Csec { $( #[doc = $kdoc] $(#[$kattr])* pub(crate) $ckey: $kty, )* }
        )*

        /// The server's sections: the file's, with their variables over
        /// them ([`Sections::with_env`]).
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Sections { $( #[doc = $cdoc] pub $csec: Option<$Csec>, )* }

        impl Sections {
            /// The sections with each key's variable (`BLOBPOOL_AUTH_KEYS`
            /// for `auth.keys`) over the file's value, parsed and checked;
            /// an error names the variable (`environment BLOBPOOL_…: …`).
            pub fn with_env(mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<Sections, ConfigError> {
                $( {
                    $( let $ckey = env(&env_of(concat!(stringify!($csec), ".", stringify!($ckey)))); )*
                    if [$( $ckey.is_some() ),*].contains(&true) {
                        let mut section = match self.$csec.take() {
                            Some(section) => section,
                            None => {
                                $( settings!(@needed $csec $ckey $($kreq)?); )*
                                $Csec::default()
                            }
                        };
                        $( if let Some(v) = $ckey {
                            let key = concat!(stringify!($csec), ".", stringify!($ckey));
                            let var = env_of(key);
                            section.$ckey = ($kenv)(key, v).map_err(|e| Origin::Env(var.clone()).err(&var, e))?;
                        } )*
                        self.$csec = Some(section);
                    }
                } )*
                Ok(self)
            }
        }

        /// The TOML file's shape. Unknown keys are errors (typos must not
        /// pass silently).
        #[derive(Debug, Default, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        pub(super) struct FileConfig {
            $( $rkey: Option<Spanned<Scalar>>, )*
            $( $pkey: Option<Spanned<Scalar>>, )*
            pub(super) gc: Option<crate::gc::GcSection>,
            $( $csec: Option<$Csec>, )*
        }

        impl FileConfig {
            /// The server's sections as the file has them.
            pub(super) fn sections(&self) -> Sections {
                Sections { $( $csec: self.$csec.clone(), )* }
            }
        }

        /// Each setting's value and where it came from.
        pub(super) struct Values {
            $( pub(super) $rkey: ($rty, Origin), )*
            $( pub(super) $pkey: ($pty, Origin), )*
        }

        impl Values {
            /// Each setting from its flag, else its variable, else the
            /// file, else its default (`Origin::Default`).
            pub(super) fn layered(fc: &FileConfig, l: &Layers) -> Result<Values, ConfigError> {
                Ok(Values {
                    $( $rkey: l.get(stringify!($rkey), settings!(@flag l $rkey $($rflag)?), &fc.$rkey, $rparse)?
                        .unwrap_or_else(|| ($rdef, Origin::Default)), )*
                    $( $pkey: l.get(stringify!($pkey), settings!(@flag l $pkey $($pflag)?), &fc.$pkey, $pparse)?
                        .unwrap_or_else(|| ($pdef, Origin::Default)), )*
                })
            }
        }

        /// The resolved configuration.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub struct Config {
            $( #[doc = $pdoc] pub $pkey: $pty, )*
            $( $(#[$dattr])* pub $dkey: $dty, )*
        }

        /// The fields of [`Config`] that are not one plain setting each.
        pub(super) struct Derived {
            $( pub(super) $dkey: $dty, )*
        }

        impl Config {
            /// The plain settings' values and the derived fields.
            pub(super) fn assemble(v: Values, d: Derived) -> Config {
                Config { $( $pkey: v.$pkey.0, )* $( $dkey: d.$dkey, )* }
            }
        }

        /// Each stated default that names a value, parsed, beside its
        /// constant: (key, parsed, constant), both `Debug`-printed.
        #[cfg(test)]
        pub(super) fn stated_defaults() -> Vec<(&'static str, String, String)> {
            type Parsed<T> = Result<T, super::Invalid>;
            vec![
                $( (stringify!($rkey), format!("{:?}", ($rparse)(Scalar::Str($rtext.into()))), format!("{:?}", Parsed::<$rty>::Ok($rdef))), )*
                $( (stringify!($pkey), format!("{:?}", ($pparse)(Scalar::Str($ptext.into()))), format!("{:?}", Parsed::<$pty>::Ok($pdef))), )*
            ]
        }
    };
}

settings! {
    plain {
        /// Fleet admission (ADR-012 §3).
        fleet: bool = false, "false", Scalar::boolean, flag;
        /// Delete-window length.
        window: Duration = DEFAULT_WINDOW, "1h", Scalar::duration, flag;
        /// Fleet pin-row lifetime.
        pin_ttl: Duration = DEFAULT_PIN_TTL, "15m", Scalar::duration;
        /// `file://` large tier: shared-media declaration.
        shared_media: bool = false, "false", Scalar::boolean;
        /// `file://` large tier: fsync publishes.
        fsync: bool = true, "true", Scalar::boolean;
        /// `serve` listen address.
        listen: String = DEFAULT_LISTEN.to_string(), "127.0.0.1:7070", Scalar::text, flag;
        /// `serve`: largest accepted put (mem-only: 64 MiB unless set).
        max_blob_size: u64 = store_ops::DEFAULT_MAX_BLOB_SIZE, "16GiB", Scalar::size, flag;
        /// `serve`: pin-token idle lifetime, when set (ADR-018); at most `pin_ttl` in a fleet.
        token_ttl: Option<Duration> = None, "unset", |s: Scalar| nonzero(s.duration()?, "token_ttl = 0: the idle lifetime must be at least 1 second (leave token_ttl unset for no idle expiry outside a fleet)").map(Some);
        /// `serve`: cap on live pin tokens plus puts in flight (at least 1).
        max_tokens: usize = store_ops::DEFAULT_MAX_TOKENS, "100000", |s: Scalar| nonzero(s.count()?, "max_tokens = 0 would refuse every put; it must be at least 1");
        /// `serve`: the same cap per identity (at least 1).
        max_tokens_per_identity: usize = DEFAULT_MAX_TOKENS_PER_IDENTITY, "10000", |s: Scalar| nonzero(s.count()?, "max_tokens_per_identity = 0 would refuse every put; it must be at least 1");
        /// `serve`: allow a non-loopback listen address without any identity.
        insecure_no_auth: bool = false, "false", Scalar::boolean;
        /// `serve`: log format.
        log_format: LogFormat = LogFormat::Text, "text", |s: Scalar| s.text()?.parse::<LogFormat>();
        /// `serve`: idle lifetime of an upload session.
        upload_idle_timeout: Duration = up::DEFAULT_UPLOAD_IDLE_TIMEOUT, "1h", |s: Scalar| nonzero(s.duration()?, "upload_idle_timeout = 0 would reap every upload session at once; it must be positive");
        /// `serve`: bytes all open upload sessions may hold.
        upload_max_bytes: u64 = up::DEFAULT_MAX_UPLOAD_BYTES, "128GiB", |s: Scalar| nonzero(s.size()?, "upload_max_bytes = 0 would refuse every upload chunk; it must be positive");
        /// `serve`: bytes one identity's open upload sessions may hold.
        upload_max_bytes_per_identity: u64 = up::DEFAULT_MAX_UPLOAD_BYTES_PER_OWNER, "32GiB", |s: Scalar| nonzero(s.size()?, "upload_max_bytes_per_identity = 0 would refuse every upload chunk; it must be positive");
        /// `serve`: the process umask, set before anything is created.
        umask: u32 = DEFAULT_UMASK, "0077", parse_umask;
    }
    raw {
        /// Root of the default store (`kv.sqlite`, `large`); an error when `kv` is set.
        data_dir: PathBuf = PathBuf::from(DEFAULT_DATA_DIR), "./blobpool-data", parse_data_dir, flag;
        /// PostgreSQL schema when a URL has no `?schema=`.
        schema: String = DEFAULT_SCHEMA.to_string(), "blobpool", Scalar::text;
        /// The kv engine's URL (default: SQLite under `data_dir`).
        kv: Option<String> = None, "sqlite://DATA_DIR/kv.sqlite", some(Scalar::text), flag;
        /// The large engine's URL or `none` (default: files under `data_dir` when `kv` is unset).
        large: Option<String> = None, "file://DATA_DIR/large", some(Scalar::text), flag;
        /// kv/large boundary (kv-only: the size limit).
        threshold: u64 = DEFAULT_THRESHOLD, "64KiB", Scalar::size, flag;
        /// mem-only, kv-only or dual-tier (default: derived from the tiers).
        mode: Option<String> = None, "derived", some(Scalar::text), flag;
        /// This node's stable name (default: host name and absolute `data_dir`).
        node_name: Option<String> = None, "HOST:/absolute/data_dir", some(parse_node_name);
        /// This node's resumable-upload directory (default `DATA_DIR/uploads`).
        uploads_dir: Option<PathBuf> = None, "DATA_DIR/uploads", some(|s: Scalar| s.text().map(PathBuf::from));
    }
    section {
        /// Namespaces whose entries nothing references (comma separated in the environment).
        gc.unreferenced_namespaces: "[]";
        /// Scheduled sweeps (`crate::gc::DEFAULT_INTERVAL`), or "off".
        gc.interval: "15m";
    }
    server {
        /// `[auth]`: identities and what requests without credentials may do.
        auth: AuthSection {
            /// Scopes of requests without credentials (comma separated in the environment).
            #[serde(default)]
            anonymous: Vec<String>, "none", s::anonymous;
            /// API keys, `[[auth.keys]]` (environment: `name=hash=scope,scope;…`, replacing the file's).
            #[serde(default)]
            keys: Vec<KeyEntry>, "none", s::keys;
            /// Certificate identities, `[[auth.clients]]` (environment: `name=subject=scope,scope;…`).
            #[serde(default)]
            clients: Vec<ClientEntry>, "none", s::clients;
        }
        /// `[http]`: which `Host` and `Origin` values are answered.
        http: HttpSection {
            /// Host names clients use, or `["*"]` for any (default: loopback names on a loopback listen).
            allowed_hosts: Option<Vec<String>>, "derived", s::allowed_hosts;
            /// Browser origins answered with CORS headers.
            #[serde(default)]
            cors_origins: Vec<String>, "none", s::cors_origins;
        }
        /// `[tls]`: serve HTTPS, optionally with client certificates.
        tls: TlsSection {
            /// The certificate chain (PEM).
            cert: PathBuf, "none", s::path, required;
            /// Its private key (PEM).
            key: PathBuf, "none", s::path, required;
            /// The CA that signs client certificates (mutual TLS).
            client_ca: Option<PathBuf>, "none", s::client_ca;
            /// `optional` or `required` client certificates (needs `client_ca`).
            client_auth: Option<String>, "optional", s::client_auth;
        }
        /// `[limits]`: timeouts and caps of connections (`store_http::ServerLimits`).
        limits: LimitsSection {
            /// Time to send a request head.
            header_read_timeout: Option<DurationValue>, "10s", s::duration;
            /// Keep-alive idle time.
            idle_timeout: Option<DurationValue>, "60s", s::duration;
            /// Longest pause in a request body.
            body_read_timeout: Option<DurationValue>, "30s", s::duration;
            /// Longest pause in writing a response.
            write_timeout: Option<DurationValue>, "60s", s::duration;
            /// Open connections at most.
            max_connections: Option<usize>, "4096", s::connections;
            /// Time connections get to finish at shutdown.
            drain_timeout: Option<DurationValue>, "30s", s::duration;
            /// HTTP/2 streams per connection; 0 turns HTTP/2 off.
            http2_max_streams: Option<u32>, "100", s::streams;
        }
    }
    derived {
        /// The kv engine.
        pub kv: EngineSpec,
        /// The large engine, if any.
        pub large: Option<EngineSpec>,
        /// The dispatch mode.
        pub mode: Mode,
        /// This node's stable name: the owner of its fleet pin rows and GC
        /// policy rows (ADR-045). `node_name`, else [`super::default_node_name`].
        pub node_name: String,
        /// Namespaces registered with a liveness source that reports nothing
        /// live (ADR-017): their unpinned entries are garbage.
        pub unreferenced_namespaces: Vec<Namespace>,
        /// `[gc]`: policies, liveness tables, scheduled sweeps (ADR-024).
        pub gc: crate::gc::GcSettings,
        /// `serve`: `[auth]`, `[http]`, `[tls]`, `[limits]`.
        pub sections: Sections,
        /// `serve`: the node's resumable-upload directory (ADR-034); default
        /// `DIR/uploads` (DIR = `data_dir`).
        pub uploads_dir: PathBuf,
        /// The root of the embedded default store (`data_dir`), when the kv
        /// tier is that default: created 0700 if missing, whatever the umask.
        pub default_root: Option<PathBuf>,
    }
}
