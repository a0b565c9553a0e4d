//! The server's network-facing configuration: `[auth]`, `[http]`, `[tls]`
//! and `[limits]` (docs/SERVER.md, Security; ADR-023).
//!
//! ```toml
//! insecure_no_auth = false          # serve without keys on a non-loopback address
//! log_format = "text"               # or "json"
//!
//! [auth]
//! anonymous = ["read:public-*"]     # what requests without credentials may do
//! [[auth.keys]]                     # `blobpool key new` prints these
//! name = "ci"
//! hash = "blake3:…"
//! scopes = ["read", "write:ci-*"]
//! [[auth.clients]]                  # mutual TLS identities (needs tls.client_ca)
//! name = "builder"
//! subject = "builder.internal"      # certificate CN or DNS name
//! scopes = ["write"]
//!
//! [http]
//! allowed_hosts = ["blobs.example.com"]  # default: loopback names on a loopback listen, any
//!                                   #   Host off loopback; [] is refused, ["*"] is any Host
//! cors_origins = []                 # no CORS unless listed: "https://ui.example.com", as a
//!                                   #   browser sends it ("*" and "null" are refused)
//!
//! [tls]
//! cert = "/etc/blobpool/cert.pem"
//! key = "/etc/blobpool/key.pem"
//! client_ca = "/etc/blobpool/clients.pem"   # mutual TLS
//! client_auth = "optional"          # or "required"
//!
//! [limits]
//! header_read_timeout = "10s"
//! idle_timeout = "60s"
//! body_read_timeout = "30s"
//! write_timeout = "60s"
//! max_connections = 4096
//! drain_timeout = "30s"
//! http2_max_streams = 100           # 0 turns HTTP/2 off
//! ```

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{ConfigError, Invalid, Origin};
use store_http::{ClientAuth, HttpConfig, ServerLimits, TlsSettings};
use store_ops::auth::{parse_key_hash, ApiKey, Auth, CertIdentity, Grant};

/// `[auth]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AuthSection {
    #[serde(default)]
    anonymous: Vec<String>,
    #[serde(default)]
    keys: Vec<KeyEntry>,
    #[serde(default)]
    clients: Vec<ClientEntry>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct KeyEntry {
    name: String,
    hash: String,
    #[serde(default)]
    scopes: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
struct ClientEntry {
    name: String,
    subject: String,
    #[serde(default)]
    scopes: Vec<String>,
}

/// `[http]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    allowed_hosts: Option<Vec<String>>,
    #[serde(default)]
    cors_origins: Vec<String>,
}

/// The `http.allowed_hosts` entry that answers any `Host` on purpose.
pub const ANY_HOST: &str = "*";

impl HttpSection {
    /// `allowed_hosts` and `cors_origins` as [`check_allowed_hosts`] and
    /// [`check_cors_origins`] accept them; the error names the setting.
    fn check(&self) -> Result<(), ConfigError> {
        if let Some(hosts) = &self.allowed_hosts {
            check_allowed_hosts(hosts)
                .map_err(|e| ConfigError::setting("http.allowed_hosts", e))?;
        }
        check_cors_origins(&self.cors_origins)
            .map_err(|e| ConfigError::setting("http.cors_origins", e))
    }
}

/// `http.allowed_hosts` as set (in the file or `BLOBPOOL_HTTP_ALLOWED_HOSTS`):
/// host names as clients write them in URLs (no scheme, port or path), or
/// `["*"]` alone for any `Host`. Empty is refused: the server would answer
/// any `Host` and so turn the DNS rebinding check off without saying so
/// (an unset shell variable passed with `-e` reads as empty).
pub fn check_allowed_hosts(hosts: &[String]) -> Result<(), Invalid> {
    if hosts.is_empty() {
        return Err(Invalid(
            "http.allowed_hosts is empty, which would answer any Host and turn off the DNS \
             rebinding check: list the names clients use (e.g. [\"blobs.example.com\"]), \
             remove the setting for the default (the loopback names on a loopback listen), or \
             set [\"*\"] to answer any Host on purpose"
                .into(),
        ));
    }
    let any = hosts.iter().any(|h| h.trim() == ANY_HOST);
    if any && hosts.len() > 1 {
        return Err(Invalid(format!(
            "http.allowed_hosts {hosts:?}: \"*\" answers any Host and goes alone (without it, \
             only the names listed)"
        )));
    }
    for h in hosts {
        let t = h.trim();
        let hint = |why: &str, write: &str| {
            Invalid(format!(
                "http.allowed_hosts {h:?}: {why}; write {write:?} (a host name as in the URL, \
                 which the Host check compares without the port)"
            ))
        };
        if t.is_empty() {
            return Err(Invalid(
                "http.allowed_hosts has an empty entry (a host name, or \"*\" alone)".into(),
            ));
        }
        if t == ANY_HOST {
            continue;
        }
        if let Some((_, rest)) = t.split_once("://") {
            let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
            let host = store_http_host(host);
            return Err(hint("a host name, not a URL", &host));
        }
        if t.contains('/') {
            return Err(hint(
                "a host name has no path",
                t.split('/').next().unwrap_or_default(),
            ));
        }
        if t.contains('*') {
            return Err(Invalid(format!(
                "http.allowed_hosts {h:?}: no patterns; list each name, or \"*\" alone for any \
                 Host"
            )));
        }
        if let Some(c) = t
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '@' | '?' | '#'))
        {
            return Err(Invalid(format!(
                "http.allowed_hosts {h:?}: {c:?} is not allowed in a host name"
            )));
        }
        let bare = store_http_host(t);
        if bare != t.to_ascii_lowercase() {
            return Err(hint(
                "the Host check compares the bare name (no port, brackets or trailing dot)",
                &bare,
            ));
        }
    }
    Ok(())
}

/// A `Host` value's name as the server's Host check sees it: no port, no
/// brackets around an IPv6 address, no trailing dot, lowercase.
fn store_http_host(authority: &str) -> String {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else if a.parse::<std::net::Ipv6Addr>().is_ok() {
        a
    } else {
        match a.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => a,
        }
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// `http.cors_origins`: each an origin as a browser sends it
/// ([`store_http::check_cors_origin`]: `"*"` and `"null"` are refused,
/// and so is a form no browser sends, such as a trailing `/`).
pub fn check_cors_origins(origins: &[String]) -> Result<(), Invalid> {
    for o in origins {
        store_http::check_cors_origin(o)
            .map_err(|e| Invalid(format!("http.cors_origins {o:?}: {e}")))?;
    }
    Ok(())
}

/// `[tls]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    client_auth: Option<String>,
}

/// A duration in the config: seconds, or a human string (`"30s"`,
/// `"2m"`, `"500ms"`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
enum DurationValue {
    Secs(u64),
    Text(String),
}

impl DurationValue {
    fn get(&self, name: &str) -> Result<Duration, ConfigError> {
        let d = match self {
            DurationValue::Secs(s) => Duration::from_secs(*s),
            DurationValue::Text(t) => parse_duration(t).map_err(|e| {
                ConfigError::setting(format!("limits.{name}"), format!("limits.{name}: {e}"))
            })?,
        };
        if d.is_zero() {
            return Err(ConfigError::setting(
                format!("limits.{name}"),
                format!("limits.{name} must be greater than zero"),
            ));
        }
        Ok(d)
    }
}

/// Parses `"30s"`, `"2m"`, `"1h 30m"`, `"500ms"` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, Invalid> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|e| Invalid(format!("{s:?}: {e} (e.g. \"30s\", \"2m\")")))
}

/// `[limits]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    header_read_timeout: Option<DurationValue>,
    idle_timeout: Option<DurationValue>,
    body_read_timeout: Option<DurationValue>,
    write_timeout: Option<DurationValue>,
    max_connections: Option<usize>,
    drain_timeout: Option<DurationValue>,
    http2_max_streams: Option<u32>,
}

/// The sections as read from the file (the environment adds
/// `BLOBPOOL_INSECURE_NO_AUTH` and `BLOBPOOL_LOG_FORMAT` in config.rs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sections {
    /// `[auth]`.
    pub auth: Option<AuthSection>,
    /// `[http]`.
    pub http: Option<HttpSection>,
    /// `[tls]`.
    pub tls: Option<TlsSection>,
    /// `[limits]`.
    pub limits: Option<LimitsSection>,
}

/// Whether `listen` can only be reached from this host.
pub fn is_loopback(listen: &str) -> bool {
    if let Ok(addr) = listen.parse::<SocketAddr>() {
        return addr.ip().is_loopback();
    }
    let host = listen.rsplit_once(':').map_or(listen, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

/// The `Host` names a loopback server answers for by default (a DNS
/// rebinding page's host name is none of these).
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The API keys and certificate identities of `[auth]`, their hashes and
/// scopes parsed.
fn identities(auth: &AuthSection) -> Result<(Vec<ApiKey>, Vec<CertIdentity>), ConfigError> {
    let keys = auth
        .keys
        .iter()
        .map(|k| {
            Ok(ApiKey {
                name: k.name.clone(),
                hash: parse_key_hash(&k.hash).map_err(|e| {
                    ConfigError::setting("auth.keys", format!("auth.keys {:?}: {e}", k.name))
                })?,
                grants: Grant::parse_all(&k.scopes).map_err(|e| {
                    ConfigError::setting("auth.keys", format!("auth.keys {:?}: {e}", k.name))
                })?,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let certs = auth
        .clients
        .iter()
        .map(|c| {
            Ok(CertIdentity {
                name: c.name.clone(),
                subject: c.subject.clone(),
                grants: Grant::parse_all(&c.scopes).map_err(|e| {
                    ConfigError::setting("auth.clients", format!("auth.clients {:?}: {e}", c.name))
                })?,
            })
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    Ok((keys, certs))
}

impl Sections {
    /// Builds the HTTP configuration for a server listening on `listen`.
    ///
    /// Refuses, with the reason: bad scopes or key hashes; certificate
    /// identities without `tls.client_ca`; `client_auth` without
    /// `client_ca`; and — unless `insecure_no_auth` — a non-loopback
    /// `listen` with no identity configured.
    pub fn http_config(
        &self,
        listen: &str,
        insecure_no_auth: bool,
    ) -> Result<HttpConfig, ConfigError> {
        let auth_section = self.auth.clone().unwrap_or_default();
        let (keys, certs) = identities(&auth_section)?;
        let anonymous = Grant::parse_all(&auth_section.anonymous)
            .map_err(|e| ConfigError::setting("auth.anonymous", format!("auth.anonymous: {e}")))?;
        let tls = self.tls_settings()?;
        if !certs.is_empty() && tls.as_ref().is_none_or(|t| t.client_ca.is_none()) {
            return Err(ConfigError::setting(
                "auth.clients",
                "auth.clients (certificate identities) need [tls] with client_ca",
            ));
        }
        let auth = if keys.is_empty() && certs.is_empty() {
            if !anonymous.is_empty() {
                return Err(ConfigError::setting(
                    "auth.anonymous",
                    "auth.anonymous is set but no [[auth.keys]] or [[auth.clients]] exist: \
                     without identities the server is open to everyone anyway",
                ));
            }
            let mtls_required = tls
                .as_ref()
                .is_some_and(|t| t.client_ca.is_some() && t.client_auth == ClientAuth::Required);
            if !is_loopback(listen) && !insecure_no_auth && !mtls_required {
                return Err(ConfigError::setting(
                    "listen",
                    format!(
                    "refusing to serve on {listen} without authentication: anyone who can reach \
                     that address could read, write and delete blobs and run sweeps. Add API keys \
                     ([[auth.keys]], see `blobpool key new`) or client certificates, listen on \
                     127.0.0.1, or pass --insecure-no-auth (insecure_no_auth = true) if a proxy in \
                     front of the server authenticates"
                ),
                ));
            }
            Auth::open()
        } else {
            Auth::new(keys, certs, anonymous).map_err(|e| ConfigError::setting("auth", e))?
        };
        let http = self.http.clone().unwrap_or_default();
        http.check()?;
        let allowed_hosts = match http.allowed_hosts {
            Some(h) => h,
            None if is_loopback(listen) => LOOPBACK_HOSTS.iter().map(|s| s.to_string()).collect(),
            None => Vec::new(),
        };
        Ok(HttpConfig {
            auth,
            allowed_hosts,
            cors_origins: http.cors_origins,
            limits: self.limits()?,
            tls,
        })
    }

    /// `[tls]` as the server's settings: `client_auth` is optional or
    /// required, and needs `client_ca`.
    fn tls_settings(&self) -> Result<Option<TlsSettings>, ConfigError> {
        Ok(match &self.tls {
            None => None,
            Some(t) => {
                let client_auth = match t.client_auth.as_deref().map(str::trim) {
                    None | Some("optional") => ClientAuth::Optional,
                    Some("required") => ClientAuth::Required,
                    Some(other) => {
                        return Err(ConfigError::setting(
                            "tls.client_auth",
                            format!(
                            "tls.client_auth = {other:?}: expected \"optional\" or \"required\""
                        ),
                        ))
                    }
                };
                if t.client_ca.is_none() && t.client_auth.is_some() {
                    return Err(ConfigError::setting(
                        "tls.client_auth",
                        "tls.client_auth needs tls.client_ca (the CA that signs client certificates)",
                    ));
                }
                Some(TlsSettings {
                    cert: t.cert.clone(),
                    key: t.key.clone(),
                    client_ca: t.client_ca.clone(),
                    client_auth,
                })
            }
        })
    }

    fn limits(&self) -> Result<ServerLimits, ConfigError> {
        let mut l = ServerLimits::default();
        let Some(s) = &self.limits else {
            return Ok(l);
        };
        let set = |v: &Option<DurationValue>,
                   name: &str,
                   into: &mut Duration|
         -> Result<(), ConfigError> {
            if let Some(v) = v {
                *into = v.get(name)?;
            }
            Ok(())
        };
        set(
            &s.header_read_timeout,
            "header_read_timeout",
            &mut l.header_read_timeout,
        )?;
        set(&s.idle_timeout, "idle_timeout", &mut l.idle_timeout)?;
        set(
            &s.body_read_timeout,
            "body_read_timeout",
            &mut l.body_read_timeout,
        )?;
        set(&s.write_timeout, "write_timeout", &mut l.write_timeout)?;
        set(&s.drain_timeout, "drain_timeout", &mut l.drain_timeout)?;
        if let Some(n) = s.max_connections {
            if n == 0 {
                return Err(ConfigError::setting(
                    "limits.max_connections",
                    "limits.max_connections must be at least 1",
                ));
            }
            l.max_connections = n;
        }
        if let Some(n) = s.http2_max_streams {
            l.http2_max_streams = (n > 0).then_some(n);
        }
        Ok(l)
    }
}

/// The `BLOBPOOL_*` variables of the sections (each overrides its key of
/// the file; lists are comma separated):
///
/// | variable | key |
/// |---|---|
/// | `BLOBPOOL_AUTH_ANONYMOUS` | `auth.anonymous` |
/// | `BLOBPOOL_AUTH_KEYS` | `[[auth.keys]]`, as `name=hash=scope,scope;name=hash=…` |
/// | `BLOBPOOL_AUTH_CLIENTS` | `[[auth.clients]]`, as `name=subject=scope,scope;name=subject=…` |
/// | `BLOBPOOL_HTTP_ALLOWED_HOSTS`, `BLOBPOOL_HTTP_CORS_ORIGINS` | `http.*` |
/// | `BLOBPOOL_TLS_CERT`, `_KEY`, `_CLIENT_CA`, `_CLIENT_AUTH` | `tls.*` |
/// | `BLOBPOOL_LIMITS_<KEY>` | `limits.<key>` |
pub const SECTION_VARIABLES: [&str; 16] = [
    "BLOBPOOL_AUTH_ANONYMOUS",
    "BLOBPOOL_AUTH_KEYS",
    "BLOBPOOL_AUTH_CLIENTS",
    "BLOBPOOL_HTTP_ALLOWED_HOSTS",
    "BLOBPOOL_HTTP_CORS_ORIGINS",
    "BLOBPOOL_TLS_CERT",
    "BLOBPOOL_TLS_KEY",
    "BLOBPOOL_TLS_CLIENT_CA",
    "BLOBPOOL_TLS_CLIENT_AUTH",
    "BLOBPOOL_LIMITS_HEADER_READ_TIMEOUT",
    "BLOBPOOL_LIMITS_IDLE_TIMEOUT",
    "BLOBPOOL_LIMITS_BODY_READ_TIMEOUT",
    "BLOBPOOL_LIMITS_WRITE_TIMEOUT",
    "BLOBPOOL_LIMITS_MAX_CONNECTIONS",
    "BLOBPOOL_LIMITS_DRAIN_TIMEOUT",
    "BLOBPOOL_LIMITS_HTTP2_MAX_STREAMS",
];

/// The identities of `BLOBPOOL_AUTH_KEYS` / `BLOBPOOL_AUTH_CLIENTS`:
/// `name=value=scope,scope` entries separated by `;`, as (name, value,
/// scopes). An empty variable is refused rather than read as "no
/// identities": it replaces the file's, and an unset shell variable
/// (`-e BLOBPOOL_AUTH_KEYS=$KEYS`) must not silently drop them.
fn identity_list(
    var: &str,
    form: &str,
    v: &str,
) -> Result<Vec<(String, String, Vec<String>)>, ConfigError> {
    let entries: Vec<&str> = v
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if entries.is_empty() {
        return Err(env_err(
            var,
            format!("empty (expected {form};…); unset it to keep the file's"),
        ));
    }
    entries
        .into_iter()
        .map(|entry| {
            let mut parts = entry.splitn(3, '=');
            match (parts.next(), parts.next(), parts.next()) {
                (Some(name), Some(value), scopes)
                    if !name.trim().is_empty() && !value.trim().is_empty() =>
                {
                    Ok((
                        name.trim().to_string(),
                        value.trim().to_string(),
                        scopes.map(list).unwrap_or_default(),
                    ))
                }
                _ => Err(env_err(var, format!("{entry:?}: expected {form}"))),
            }
        })
        .collect()
}

fn list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl Sections {
    /// Checks the file's `[http]` values that no later step can read
    /// correctly (see [`check_allowed_hosts`], [`check_cors_origins`]); the
    /// error names the setting, its origin is the caller's to attach.
    pub fn check_file(&self) -> Result<(), ConfigError> {
        self.http.as_ref().map_or(Ok(()), HttpSection::check)
    }

    /// The sections with the `BLOBPOOL_*` variables of
    /// [`SECTION_VARIABLES`] applied over the file's values; an error names
    /// the variable (`environment BLOBPOOL_…: …`).
    pub fn with_env(
        mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Sections, ConfigError> {
        self.auth_env(env)?;
        if let Some(v) = env("BLOBPOOL_HTTP_ALLOWED_HOSTS") {
            let hosts = list(&v);
            check_allowed_hosts(&hosts).map_err(|e| {
                env_err(
                    "BLOBPOOL_HTTP_ALLOWED_HOSTS",
                    if hosts.is_empty() {
                        format!(
                            "{e} (the variable's form: `*` or `name,name`; unset it to keep \
                             the file's)"
                        )
                    } else {
                        e.to_string()
                    },
                )
            })?;
            self.http.get_or_insert_with(Default::default).allowed_hosts = Some(hosts);
        }
        if let Some(v) = env("BLOBPOOL_HTTP_CORS_ORIGINS") {
            let origins = list(&v);
            check_cors_origins(&origins).map_err(|e| env_err("BLOBPOOL_HTTP_CORS_ORIGINS", e))?;
            self.http.get_or_insert_with(Default::default).cors_origins = origins;
        }
        self.tls_env(env)?;
        self.limits_env(env)?;
        if self.limits == Some(LimitsSection::default()) {
            self.limits = None;
        }
        Ok(self)
    }

    /// `BLOBPOOL_AUTH_*` over `[auth]`.
    fn auth_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        if let Some(v) = env("BLOBPOOL_AUTH_ANONYMOUS") {
            let anonymous = list(&v);
            Grant::parse_all(&anonymous).map_err(|e| env_err("BLOBPOOL_AUTH_ANONYMOUS", e))?;
            self.auth.get_or_insert_with(Default::default).anonymous = anonymous;
        }
        if let Some(v) = env("BLOBPOOL_AUTH_KEYS") {
            let var = "BLOBPOOL_AUTH_KEYS";
            let keys = identity_list(var, "name=hash=scope,scope", &v)?
                .into_iter()
                .map(|(name, hash, scopes)| {
                    // Checked here too, so that the error names the variable.
                    parse_key_hash(&hash).map_err(|e| env_err(var, format!("{name:?}: {e}")))?;
                    Grant::parse_all(&scopes)
                        .map_err(|e| env_err(var, format!("{name:?}: {e}")))?;
                    Ok(KeyEntry { name, hash, scopes })
                })
                .collect::<Result<Vec<_>, ConfigError>>()?;
            self.auth.get_or_insert_with(Default::default).keys = keys;
        }
        if let Some(v) = env("BLOBPOOL_AUTH_CLIENTS") {
            let var = "BLOBPOOL_AUTH_CLIENTS";
            let clients = identity_list(var, "name=subject=scope,scope", &v)?
                .into_iter()
                .map(|(name, subject, scopes)| {
                    Grant::parse_all(&scopes)
                        .map_err(|e| env_err(var, format!("{name:?}: {e}")))?;
                    Ok(ClientEntry {
                        name,
                        subject,
                        scopes,
                    })
                })
                .collect::<Result<Vec<_>, ConfigError>>()?;
            self.auth.get_or_insert_with(Default::default).clients = clients;
        }
        Ok(())
    }

    /// `BLOBPOOL_TLS_*` over `[tls]`; without a `[tls]` in the file the
    /// certificate and key variables are both needed.
    fn tls_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let tls_var = |k: &str| env(&format!("BLOBPOOL_TLS_{k}"));
        let (cert, key) = (tls_var("CERT"), tls_var("KEY"));
        let (ca, auth) = (tls_var("CLIENT_CA"), tls_var("CLIENT_AUTH"));
        if cert.is_some() || key.is_some() || ca.is_some() || auth.is_some() {
            let mut t = match self.tls.take() {
                Some(t) => t,
                None => TlsSection {
                    cert: cert.clone().map(PathBuf::from).ok_or_else(|| {
                        env_err(
                            "BLOBPOOL_TLS_CERT",
                            "needed with the other BLOBPOOL_TLS_* (no [tls] in the file)",
                        )
                    })?,
                    key: key.clone().map(PathBuf::from).ok_or_else(|| {
                        env_err(
                            "BLOBPOOL_TLS_KEY",
                            "needed with the other BLOBPOOL_TLS_* (no [tls] in the file)",
                        )
                    })?,
                    client_ca: None,
                    client_auth: None,
                },
            };
            if let Some(c) = cert {
                t.cert = PathBuf::from(c);
            }
            if let Some(k) = key {
                t.key = PathBuf::from(k);
            }
            if let Some(c) = ca {
                t.client_ca = Some(PathBuf::from(c));
            }
            if let Some(a) = auth {
                if !matches!(a.trim(), "optional" | "required") {
                    return Err(env_err(
                        "BLOBPOOL_TLS_CLIENT_AUTH",
                        format!("{a:?}: expected \"optional\" or \"required\""),
                    ));
                }
                t.client_auth = Some(a);
            }
            self.tls = Some(t);
        }
        Ok(())
    }

    /// `BLOBPOOL_LIMITS_*` over `[limits]`.
    fn limits_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let duration = |name: &str| -> Result<Option<DurationValue>, ConfigError> {
            let var = format!("BLOBPOOL_LIMITS_{name}");
            env(&var)
                .map(|v| {
                    let d = DurationValue::Text(v);
                    d.get(&name.to_ascii_lowercase())
                        .map_err(|m| env_err(&var, m))
                        .map(|_| d)
                })
                .transpose()
        };
        let number = |name: &str| -> Result<Option<u64>, ConfigError> {
            let var = format!("BLOBPOOL_LIMITS_{name}");
            env(&var)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|e| env_err(&var, format!("{v:?}: {e}")))
                })
                .transpose()
        };
        let l = self.limits.get_or_insert_with(Default::default);
        for (name, slot) in [
            ("HEADER_READ_TIMEOUT", &mut l.header_read_timeout),
            ("IDLE_TIMEOUT", &mut l.idle_timeout),
            ("BODY_READ_TIMEOUT", &mut l.body_read_timeout),
            ("WRITE_TIMEOUT", &mut l.write_timeout),
            ("DRAIN_TIMEOUT", &mut l.drain_timeout),
        ] {
            if let Some(d) = duration(name)? {
                *slot = Some(d);
            }
        }
        if let Some(n) = number("MAX_CONNECTIONS")? {
            if n == 0 {
                return Err(env_err(
                    "BLOBPOOL_LIMITS_MAX_CONNECTIONS",
                    "limits.max_connections must be at least 1",
                ));
            }
            l.max_connections = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
        if let Some(n) = number("HTTP2_MAX_STREAMS")? {
            l.http2_max_streams = Some(
                u32::try_from(n)
                    .map_err(|e| env_err("BLOBPOOL_LIMITS_HTTP2_MAX_STREAMS", e.to_string()))?,
            );
        }
        Ok(())
    }
}

/// An error in the variable `name`.
fn env_err(name: &str, m: impl std::fmt::Display) -> ConfigError {
    Origin::Env(name.to_string()).err(name, m.to_string())
}

#[cfg(test)]
mod tests {
    // The one redaction, shared with the engine registry.
    use super::*;
    use store_types::registry::redact_url;

    fn sections(toml_text: &str) -> Sections {
        #[derive(Deserialize)]
        struct F {
            auth: Option<AuthSection>,
            http: Option<HttpSection>,
            tls: Option<TlsSection>,
            limits: Option<LimitsSection>,
        }
        let f: F = toml::from_str(toml_text).unwrap();
        Sections {
            auth: f.auth,
            http: f.http,
            tls: f.tls,
            limits: f.limits,
        }
    }

    #[test]
    fn loopback_addresses_are_recognised() {
        assert!(is_loopback("127.0.0.1:7070"));
        assert!(is_loopback("[::1]:7070"));
        assert!(is_loopback("localhost:7070"));
        assert!(!is_loopback("0.0.0.0:7070"));
        assert!(!is_loopback("[::]:7070"));
        assert!(!is_loopback("blobs.example.com:7070"));
    }

    #[test]
    fn an_open_server_off_loopback_is_refused_unless_insisted() {
        let s = Sections::default();
        let e = s
            .http_config("0.0.0.0:7070", false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("without authentication") && e.contains("--insecure-no-auth"),
            "{e}"
        );
        let c = s.http_config("0.0.0.0:7070", true).unwrap();
        assert!(!c.auth.is_enabled());
        assert!(c.allowed_hosts.is_empty());
        let c = s.http_config("127.0.0.1:7070", false).unwrap();
        assert!(!c.auth.is_enabled());
        assert_eq!(c.allowed_hosts, LOOPBACK_HOSTS);
    }

    #[test]
    fn keys_scopes_and_limits_parse() {
        let hash = store_ops::auth::hash_key("bpk_x");
        let s = sections(&format!(
            r#"
            [auth]
            anonymous = ["read:public-*"]
            [[auth.keys]]
            name = "ci"
            hash = "{hash}"
            scopes = ["read", "write:ci-*"]
            [http]
            allowed_hosts = ["blobs.example.com"]
            [limits]
            header_read_timeout = "5s"
            idle_timeout = 30
            max_connections = 10
            http2_max_streams = 0
            "#
        ));
        let c = s.http_config("0.0.0.0:7070", false).unwrap();
        assert!(c.auth.is_enabled());
        assert_eq!(c.auth.identities(), 1);
        assert_eq!(c.allowed_hosts, ["blobs.example.com"]);
        assert_eq!(c.limits.header_read_timeout, Duration::from_secs(5));
        assert_eq!(c.limits.idle_timeout, Duration::from_secs(30));
        assert_eq!(c.limits.max_connections, 10);
        assert_eq!(c.limits.http2_max_streams, None);
        let id = c.auth.authenticate(Some(b"Bearer bpk_x"), None).unwrap();
        assert_eq!(id.name(), "ci");
    }

    #[test]
    fn bad_sections_are_refused_with_reasons() {
        let bad = [
            (
                r#"[[auth.keys]]
                name = "a"
                hash = "nothex"
                scopes = []"#,
                "key hash",
            ),
            (
                r#"[[auth.keys]]
                name = "a"
                hash = "blake3:0000000000000000000000000000000000000000000000000000000000000000"
                scopes = ["pull"]"#,
                "scope",
            ),
            (
                r#"[[auth.clients]]
                name = "a"
                subject = "a.internal""#,
                "client_ca",
            ),
            ("[auth]\nanonymous = [\"read\"]", "no [[auth.keys]]"),
            ("[limits]\nidle_timeout = \"soon\"", "idle_timeout"),
            ("[limits]\nwrite_timeout = 0", "greater than zero"),
            (
                "[tls]\ncert = \"c\"\nkey = \"k\"\nclient_auth = \"required\"",
                "client_ca",
            ),
        ];
        for (text, want) in bad {
            let e = sections(text)
                .http_config("127.0.0.1:1", false)
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x?schema=a"),
            "postgres://app:***@db:5432/x?schema=a"
        );
        assert_eq!(
            redact_url("postgres://db/x?user=a&password=s3cret"),
            "postgres://db/x?user=a&password=***"
        );
        assert_eq!(redact_url("sqlite://./kv.sqlite"), "sqlite://./kv.sqlite");
        assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
    }

    /// The file's value of every key the section variables override, each
    /// different from the variable's value in the test below.
    const FILE: &str = r#"
[auth]
anonymous = ["read:file"]
[[auth.keys]]
name = "file-key"
hash = "HASH_FILE"
scopes = ["read"]
[[auth.clients]]
name = "file-client"
subject = "file.example"
scopes = ["read"]
[http]
allowed_hosts = ["file.example"]
cors_origins = ["https://file.example"]
[tls]
cert = "/file/cert.pem"
key = "/file/key.pem"
client_ca = "/file/ca.pem"
client_auth = "optional"
[limits]
header_read_timeout = "1s"
idle_timeout = "2s"
body_read_timeout = "3s"
write_timeout = "4s"
max_connections = 5
drain_timeout = "6s"
http2_max_streams = 7
"#;

    use std::path::Path;

    fn file_sections() -> Sections {
        sections(&FILE.replace("HASH_FILE", &store_ops::auth::hash_key("bpk_file")))
    }

    fn cert(subject: &str) -> store_http::ClientCert {
        store_http::ClientCert {
            common_name: Some(subject.into()),
            dns_names: vec![],
        }
    }

    fn identity(h: &HttpConfig, authorization: Option<&str>, cert: Option<&str>) -> Option<String> {
        let cert = cert.map(self::cert);
        h.auth
            .authenticate(authorization.map(str::as_bytes), cert.as_ref())
            .ok()
            .map(|i| i.name().to_string())
    }

    #[test]
    fn the_section_variables_are_exactly_the_ones_read() {
        let asked = std::cell::RefCell::new(Vec::<String>::new());
        let env = |k: &str| {
            asked.borrow_mut().push(k.to_string());
            None
        };
        let unchanged = file_sections().with_env(&env).unwrap();
        assert_eq!(
            unchanged,
            file_sections(),
            "no variable set: the file's values"
        );
        let mut asked = asked.into_inner();
        asked.sort();
        asked.dedup();
        let mut listed: Vec<String> = SECTION_VARIABLES.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(asked, listed);
    }

    /// Each variable of [`SECTION_VARIABLES`] overrides its key of the file
    /// and leaves the others.
    #[test]
    fn each_section_variable_overrides_its_key() {
        let env_key = store_ops::auth::hash_key("bpk_env");
        type Check = fn(&HttpConfig) -> bool;
        let cases: Vec<(&str, String, Check)> = vec![
            (
                "BLOBPOOL_AUTH_ANONYMOUS",
                "read:env, write:env".into(),
                |h| {
                    h.auth
                        .anonymous_grants()
                        .iter()
                        .map(|g| g.to_string())
                        .collect::<Vec<_>>()
                        == ["read:env", "write:env"]
                },
            ),
            (
                "BLOBPOOL_AUTH_KEYS",
                format!("env-key={env_key}=read,write"),
                |h| {
                    identity(h, Some("Bearer bpk_env"), None).as_deref() == Some("env-key")
                        && identity(h, Some("Bearer bpk_file"), None).is_none()
                },
            ),
            (
                "BLOBPOOL_AUTH_CLIENTS",
                "env-client=env.example=read".into(),
                |h| {
                    identity(h, None, Some("env.example")).as_deref() == Some("env-client")
                        && identity(h, None, Some("file.example")).as_deref() == Some("anonymous")
                },
            ),
            ("BLOBPOOL_HTTP_ALLOWED_HOSTS", "env.example".into(), |h| {
                h.allowed_hosts == ["env.example"]
            }),
            (
                "BLOBPOOL_HTTP_CORS_ORIGINS",
                "https://env.example".into(),
                |h| h.cors_origins == ["https://env.example"],
            ),
            ("BLOBPOOL_TLS_CERT", "/env/cert.pem".into(), |h| {
                h.tls.as_ref().unwrap().cert == Path::new("/env/cert.pem")
            }),
            ("BLOBPOOL_TLS_KEY", "/env/key.pem".into(), |h| {
                h.tls.as_ref().unwrap().key == Path::new("/env/key.pem")
            }),
            ("BLOBPOOL_TLS_CLIENT_CA", "/env/ca.pem".into(), |h| {
                h.tls.as_ref().unwrap().client_ca == Some(PathBuf::from("/env/ca.pem"))
            }),
            ("BLOBPOOL_TLS_CLIENT_AUTH", "required".into(), |h| {
                h.tls.as_ref().unwrap().client_auth == ClientAuth::Required
            }),
            ("BLOBPOOL_LIMITS_HEADER_READ_TIMEOUT", "11s".into(), |h| {
                h.limits.header_read_timeout == Duration::from_secs(11)
            }),
            ("BLOBPOOL_LIMITS_IDLE_TIMEOUT", "12".into(), |h| {
                h.limits.idle_timeout == Duration::from_secs(12)
            }),
            ("BLOBPOOL_LIMITS_BODY_READ_TIMEOUT", "13s".into(), |h| {
                h.limits.body_read_timeout == Duration::from_secs(13)
            }),
            ("BLOBPOOL_LIMITS_WRITE_TIMEOUT", "1m".into(), |h| {
                h.limits.write_timeout == Duration::from_secs(60)
            }),
            ("BLOBPOOL_LIMITS_MAX_CONNECTIONS", "15".into(), |h| {
                h.limits.max_connections == 15
            }),
            ("BLOBPOOL_LIMITS_DRAIN_TIMEOUT", "16s".into(), |h| {
                h.limits.drain_timeout == Duration::from_secs(16)
            }),
            ("BLOBPOOL_LIMITS_HTTP2_MAX_STREAMS", "0".into(), |h| {
                h.limits.http2_max_streams.is_none()
            }),
        ];
        let mut covered: Vec<&str> = cases.iter().map(|c| c.0).collect();
        covered.sort_unstable();
        let mut listed = SECTION_VARIABLES.to_vec();
        listed.sort_unstable();
        assert_eq!(covered, listed, "one case per variable");
        let config = |env: &dyn Fn(&str) -> Option<String>| {
            file_sections()
                .with_env(env)
                .unwrap()
                .http_config("127.0.0.1:7070", false)
                .unwrap()
        };
        let file = config(&|_| None);
        for (var, value, check) in &cases {
            assert!(!check(&file), "{var}: the file's value already passes");
            let h = config(&|k| (k == *var).then(|| value.clone()));
            assert!(check(&h), "{var}={value} did not apply");
            // The other keys keep the file's values.
            for (other, _, other_check) in &cases {
                if other != var {
                    assert!(!other_check(&h), "{var} changed {other}");
                }
            }
        }
    }

    #[test]
    fn bad_section_variables_are_refused_by_name() {
        let hash = store_ops::auth::hash_key("bpk_env");
        let cases: Vec<(&str, String)> = vec![
            ("BLOBPOOL_AUTH_ANONYMOUS", "read,frobnicate".into()),
            ("BLOBPOOL_AUTH_KEYS", "just-a-name".into()),
            ("BLOBPOOL_AUTH_KEYS", " ; ".into()),
            ("BLOBPOOL_AUTH_KEYS", "ci=not-a-hash=read".into()),
            ("BLOBPOOL_AUTH_KEYS", format!("ci={hash}=frobnicate")),
            ("BLOBPOOL_AUTH_KEYS", format!("={hash}=read")),
            ("BLOBPOOL_AUTH_CLIENTS", "".into()),
            ("BLOBPOOL_AUTH_CLIENTS", "builder".into()),
            ("BLOBPOOL_AUTH_CLIENTS", "builder==read".into()),
            (
                "BLOBPOOL_AUTH_CLIENTS",
                "builder=b.example=frobnicate".into(),
            ),
            ("BLOBPOOL_TLS_CLIENT_AUTH", "sometimes".into()),
            ("BLOBPOOL_LIMITS_HEADER_READ_TIMEOUT", "soon".into()),
            ("BLOBPOOL_LIMITS_IDLE_TIMEOUT", "0".into()),
            ("BLOBPOOL_LIMITS_BODY_READ_TIMEOUT", "-1s".into()),
            ("BLOBPOOL_LIMITS_WRITE_TIMEOUT", "".into()),
            ("BLOBPOOL_LIMITS_DRAIN_TIMEOUT", "30 parsecs".into()),
            ("BLOBPOOL_LIMITS_MAX_CONNECTIONS", "many".into()),
            ("BLOBPOOL_LIMITS_MAX_CONNECTIONS", "0".into()),
            ("BLOBPOOL_LIMITS_HTTP2_MAX_STREAMS", "5000000000".into()),
            ("BLOBPOOL_LIMITS_HTTP2_MAX_STREAMS", "-1".into()),
        ];
        for (var, value) in &cases {
            let e = file_sections()
                .with_env(&|k| (k == *var).then(|| value.clone()))
                .unwrap_err()
                .to_string();
            assert!(
                e.starts_with(&format!("environment {var}: ")),
                "{var}={value:?}: {e}"
            );
        }
        // Without [tls] in the file, a TLS variable needs the certificate
        // and the key: the error names the missing one.
        let e = Sections::default()
            .with_env(&|k| (k == "BLOBPOOL_TLS_KEY").then(|| "/k.pem".into()))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("environment BLOBPOOL_TLS_CERT: "), "{e}");
        let tls = Sections::default()
            .with_env(&|k| match k {
                "BLOBPOOL_TLS_CERT" => Some("/c.pem".into()),
                "BLOBPOOL_TLS_KEY" => Some("/k.pem".into()),
                _ => None,
            })
            .unwrap()
            .http_config("127.0.0.1:7070", false)
            .unwrap()
            .tls
            .unwrap();
        assert_eq!(tls.cert, PathBuf::from("/c.pem"));
        assert_eq!(tls.client_ca, None);
    }
}
