//! The server's network-facing configuration, built from `[auth]`,
//! `[http]`, `[tls]` and `[limits]` (docs/SERVER.md, Security; ADR-023):
//! their keys are entries of the settings table (`server`, in
//! `config/settings.rs`), their values parsed and checked in
//! `config/sections.rs`; the checks across keys are here.
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

use crate::config::sections::check_http;
pub use crate::config::sections::{parse_duration, ANY_HOST};
use crate::config::settings::{AuthSection, Sections};
use crate::error::ConfigError;
use store_http::{ClientAuth, HttpConfig, ServerLimits, TlsSettings};
use store_ops::auth::{parse_key_hash, ApiKey, Auth, CertIdentity, Grant};

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
        check_http(http.allowed_hosts.as_deref(), &http.cors_origins)?;
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
        for (v, key, into) in [
            (
                &s.header_read_timeout,
                "limits.header_read_timeout",
                &mut l.header_read_timeout,
            ),
            (&s.idle_timeout, "limits.idle_timeout", &mut l.idle_timeout),
            (
                &s.body_read_timeout,
                "limits.body_read_timeout",
                &mut l.body_read_timeout,
            ),
            (
                &s.write_timeout,
                "limits.write_timeout",
                &mut l.write_timeout,
            ),
            (
                &s.drain_timeout,
                "limits.drain_timeout",
                &mut l.drain_timeout,
            ),
        ] {
            if let Some(v) = v {
                *into = v.get(key).map_err(|e| ConfigError::setting(key, e))?;
            }
        }
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

#[cfg(test)]
mod tests {
    // The one redaction, shared with the engine registry.
    use super::*;
    use crate::config::settings::{HttpSection, LimitsSection, TlsSection, SETTINGS};
    use serde::Deserialize;
    use std::path::PathBuf;
    use std::time::Duration;

    /// The variables of the sections' keys, from the settings table.
    fn section_variables() -> Vec<String> {
        let server = ["auth.", "http.", "tls.", "limits."];
        SETTINGS
            .iter()
            .filter(|s| server.iter().any(|p| s.key.starts_with(p)))
            .map(|s| s.env())
            .collect()
    }
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
        let mut listed = section_variables();
        listed.sort();
        assert_eq!(asked, listed);
    }

    /// Each variable of the sections' keys overrides its key of the file
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
        let mut listed = section_variables();
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

    /// Each section key's stated default (the settings table's, which
    /// docs/SERVER.md repeats, checked by tidy), set in its variable,
    /// changes nothing: it is the default in force. "none" and "derived"
    /// name no value.
    #[test]
    fn stated_section_defaults_are_the_defaults() {
        let base = "[tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\nclient_ca = \"/ca.pem\"\n";
        let config = |env: &dyn Fn(&str) -> Option<String>| {
            let h = sections(base)
                .with_env(env)
                .unwrap()
                .http_config("127.0.0.1:7070", false)
                .unwrap();
            (h.limits, h.tls, h.allowed_hosts, h.cors_origins)
        };
        let default = config(&|_| None);
        assert_eq!(default.0, ServerLimits::default());
        let mut checked = 0;
        for s in SETTINGS
            .iter()
            .filter(|s| section_variables().contains(&s.env()))
        {
            if matches!(s.default, "none" | "derived") {
                continue;
            }
            let var = s.env();
            let set = config(&|k| (k == var).then(|| s.default.to_string()));
            assert_eq!(set, default, "{}: {:?}", s.key, s.default);
            checked += 1;
        }
        assert_eq!(checked, 8, "the limits and tls.client_auth");
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
