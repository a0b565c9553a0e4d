//! The values of the server's sections, `[auth]`, `[http]`, `[tls]` and
//! `[limits]` (docs/SERVER.md, Security; ADR-023): their keys are the
//! `server` entries of the settings table ([`super::settings`]), which
//! name the parser of each key's variable here. The checks a value needs
//! wherever it came from are here too; `crate::security` builds the
//! server's configuration from the sections.
//!
//! A variable replaces its key's value in the file; lists are comma
//! separated, identities `name=value=scope,scope` entries separated by `;`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, Invalid};
use store_ops::auth::{parse_key_hash, Grant};

/// One `[[auth.keys]]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub(crate) name: String,
    pub(crate) hash: String,
    #[serde(default)]
    pub(crate) scopes: Vec<String>,
}

/// One `[[auth.clients]]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClientEntry {
    pub(crate) name: String,
    pub(crate) subject: String,
    #[serde(default)]
    pub(crate) scopes: Vec<String>,
}

/// The `http.allowed_hosts` entry that answers any `Host` on purpose.
pub const ANY_HOST: &str = "*";

/// `[http]`'s `allowed_hosts` and `cors_origins` as [`check_allowed_hosts`]
/// and [`check_cors_origins`] accept them; the error names the setting.
pub fn check_http(hosts: Option<&[String]>, origins: &[String]) -> Result<(), ConfigError> {
    if let Some(hosts) = hosts {
        check_allowed_hosts(hosts).map_err(|e| ConfigError::setting("http.allowed_hosts", e))?;
    }
    check_cors_origins(origins).map_err(|e| ConfigError::setting("http.cors_origins", e))
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

/// A duration in the config: seconds, or a human string (`"30s"`,
/// `"2m"`, `"500ms"`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum DurationValue {
    /// Seconds.
    Secs(u64),
    /// A human string.
    Text(String),
}

impl DurationValue {
    /// The duration of the setting `key`: greater than zero.
    pub fn get(&self, key: &str) -> Result<Duration, Invalid> {
        let d = match self {
            DurationValue::Secs(s) => Duration::from_secs(*s),
            DurationValue::Text(t) => parse_duration(t).map_err(|e| format!("{key}: {e}"))?,
        };
        if d.is_zero() {
            return Err(format!("{key} must be greater than zero").into());
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

/// The identities of a variable: `name=value=scope,scope` entries
/// separated by `;`, as (name, value, scopes). An empty variable is
/// refused rather than read as "no identities": it replaces the file's,
/// and an unset shell variable (`-e BLOBPOOL_AUTH_KEYS=$KEYS`) must not
/// silently drop them.
fn identity_list(form: &str, v: &str) -> Result<Vec<(String, String, Vec<String>)>, Invalid> {
    let entries: Vec<&str> = v
        .split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if entries.is_empty() {
        return Err(format!("empty (expected {form};…); unset it to keep the file's").into());
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
                _ => Err(format!("{entry:?}: expected {form}").into()),
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

// The parsers of the variables, as the table names them: (key, value).

pub(super) fn anonymous(_: &str, v: String) -> Result<Vec<String>, Invalid> {
    let anonymous = list(&v);
    Grant::parse_all(&anonymous)?;
    Ok(anonymous)
}

pub(super) fn keys(_: &str, v: String) -> Result<Vec<KeyEntry>, Invalid> {
    identity_list("name=hash=scope,scope", &v)?
        .into_iter()
        .map(|(name, hash, scopes)| {
            // Checked here too, so that the error names the variable.
            parse_key_hash(&hash).map_err(|e| format!("{name:?}: {e}"))?;
            Grant::parse_all(&scopes).map_err(|e| format!("{name:?}: {e}"))?;
            Ok(KeyEntry { name, hash, scopes })
        })
        .collect()
}

pub(super) fn clients(_: &str, v: String) -> Result<Vec<ClientEntry>, Invalid> {
    identity_list("name=subject=scope,scope", &v)?
        .into_iter()
        .map(|(name, subject, scopes)| {
            Grant::parse_all(&scopes).map_err(|e| format!("{name:?}: {e}"))?;
            Ok(ClientEntry {
                name,
                subject,
                scopes,
            })
        })
        .collect()
}

pub(super) fn allowed_hosts(_: &str, v: String) -> Result<Option<Vec<String>>, Invalid> {
    let hosts = list(&v);
    check_allowed_hosts(&hosts).map_err(|e| match hosts.is_empty() {
        true => {
            format!("{e} (the variable's form: `*` or `name,name`; unset it to keep the file's)")
                .into()
        }
        false => e,
    })?;
    Ok(Some(hosts))
}

pub(super) fn cors_origins(_: &str, v: String) -> Result<Vec<String>, Invalid> {
    let origins = list(&v);
    check_cors_origins(&origins)?;
    Ok(origins)
}

pub(super) fn path(_: &str, v: String) -> Result<PathBuf, Invalid> {
    Ok(PathBuf::from(v))
}

pub(super) fn client_ca(_: &str, v: String) -> Result<Option<PathBuf>, Invalid> {
    Ok(Some(PathBuf::from(v)))
}

pub(super) fn client_auth(_: &str, a: String) -> Result<Option<String>, Invalid> {
    match matches!(a.trim(), "optional" | "required") {
        true => Ok(Some(a)),
        false => Err(format!("{a:?}: expected \"optional\" or \"required\"").into()),
    }
}

pub(super) fn duration(key: &str, v: String) -> Result<Option<DurationValue>, Invalid> {
    let d = DurationValue::Text(v);
    d.get(key)?;
    Ok(Some(d))
}

fn number(v: &str) -> Result<u64, Invalid> {
    v.trim()
        .parse::<u64>()
        .map_err(|e| Invalid(format!("{v:?}: {e}")))
}

pub(super) fn connections(key: &str, v: String) -> Result<Option<usize>, Invalid> {
    match number(&v)? {
        0 => Err(format!("{key} must be at least 1").into()),
        n => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

pub(super) fn streams(_: &str, v: String) -> Result<Option<u32>, Invalid> {
    u32::try_from(number(&v)?)
        .map(Some)
        .map_err(|e| Invalid(e.to_string()))
}
