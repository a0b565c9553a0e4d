//! The `Host` check against DNS rebinding (ADR-067, ADR-074), shared by
//! every binding: a request that carries no credentials (an open
//! server's, an anonymous caller's) is answered only when the host it
//! names (the URI's authority, HTTP/2's `:authority`, else the `Host`
//! header) is an allowed one. A request that proves an identity (a valid
//! API key, a verified client certificate) is answered under any host: a
//! rebinding page cannot send the credentials of the server's origin.
//!
//! The HTTP gate and the gRPC services both decide through
//! [`HostCheck::admit`], so the policy and its refusal exist once.

use crate::auth::Identity;
use crate::{ErrorCode, OpsError};

/// The allowed host names, lowercase, without port. Empty (the default)
/// or the one entry `*` answers any host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostCheck {
    allowed: Vec<String>,
}

impl HostCheck {
    /// No check: every host is answered (the open loopback default of a
    /// binding's configuration).
    pub fn any() -> HostCheck {
        HostCheck::default()
    }

    /// The check for `hosts` as configured (`http.allowed_hosts`): each
    /// entry trimmed and lowercased; empty, or `*` among them, answers any
    /// host.
    pub fn new<S: AsRef<str>>(hosts: &[S]) -> HostCheck {
        HostCheck {
            allowed: (hosts.iter())
                .map(|h| h.as_ref().trim().to_ascii_lowercase())
                .collect(),
        }
    }

    /// The allowed names, normalised (lowercase, trimmed).
    pub fn allowed(&self) -> &[String] {
        &self.allowed
    }

    /// Whether every host is answered (no names, or `*`).
    pub fn is_any(&self) -> bool {
        self.allowed.is_empty() || self.allowed.iter().any(|h| h == "*")
    }

    /// Whether a request naming `authority` (a URI authority or `Host`
    /// value, with or without port; `None`: the request named none) may
    /// be answered without credentials: `host_not_allowed` otherwise,
    /// naming the host and the setting that lists the names.
    pub fn check(&self, authority: Option<&str>) -> Result<(), OpsError> {
        if self.is_any() {
            return Ok(());
        }
        let host = authority.map(host_part);
        let ok = host.is_some_and(|h| self.allowed.iter().any(|a| a.eq_ignore_ascii_case(h)));
        if ok {
            return Ok(());
        }
        Err(OpsError::new(
            ErrorCode::HostNotAllowed,
            format!(
                "this server answers requests without credentials only for the hosts in \
                 http.allowed_hosts, and {:?} is not one of them: send your API key, or \
                 have the operator add the name (BLOBPOOL_HTTP_ALLOWED_HOSTS)",
                host.unwrap_or("")
            ),
        ))
    }

    /// The ADR-067 rule: `identity` (the outcome of authenticating the
    /// request's credentials) is admitted when the host `check` of
    /// [`HostCheck::check`] passed, or when it proved an identity (not
    /// anonymous). A refused host wins over failed authentication
    /// (invalid credentials count as none); an allowed host leaves the
    /// authentication's outcome as it is.
    pub fn admit(
        check: Result<(), OpsError>,
        identity: Result<Identity, OpsError>,
    ) -> Result<Identity, OpsError> {
        match (check, identity) {
            (Err(refused), Err(_)) => Err(refused),
            (Err(refused), Ok(id)) if id.is_anonymous() => Err(refused),
            (_, id) => id,
        }
    }
}

/// The host part of a `Host` value or URI authority: no port, no
/// brackets around an IPv6 literal, no trailing dot (not lowercased: no
/// allocation).
pub fn host_part(authority: &str) -> &str {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        match a.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => a,
        }
    };
    host.trim_end_matches('.')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Credential, Identity};

    fn host_name(authority: &str) -> String {
        host_part(authority).to_ascii_lowercase()
    }

    #[test]
    fn host_names_drop_ports_and_brackets() {
        assert_eq!(host_name("Example.COM:8080"), "example.com");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("[::1]:7070"), "::1");
        assert_eq!(host_name("127.0.0.1:7070"), "127.0.0.1");
        assert_eq!(host_name("blobs.example.com."), "blobs.example.com");
    }

    #[test]
    fn only_listed_hosts_pass_and_any_means_any() {
        let c = HostCheck::new(&[" Blobs.Example.com ", "localhost"]);
        assert_eq!(c.allowed(), ["blobs.example.com", "localhost"]);
        assert!(c.check(Some("BLOBS.example.com:443")).is_ok());
        assert!(c.check(Some("localhost")).is_ok());
        for bad in [Some("evil.example"), Some(""), None] {
            let e = c.check(bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::HostNotAllowed);
            assert!(e.message.contains("BLOBPOOL_HTTP_ALLOWED_HOSTS"), "{e}");
        }
        for any in [HostCheck::any(), HostCheck::new(&["*"])] {
            assert!(any.is_any());
            assert!(any.check(None).is_ok());
            assert!(any.check(Some("evil.example")).is_ok());
        }
    }

    #[test]
    fn credentials_pass_any_host_and_their_absence_does_not() {
        let refused = || HostCheck::new(&["a.example"]).check(Some("evil.example"));
        let key = || Ok(Identity::new("ci", Credential::Key, vec![]));
        let anon = || Ok(Identity::new("anonymous", Credential::None, vec![]));
        let bad = || Err(OpsError::new(ErrorCode::Unauthorized, "bad key"));
        assert!(HostCheck::admit(refused(), key()).is_ok());
        let code = |r: Result<Identity, OpsError>| r.unwrap_err().code;
        assert_eq!(
            code(HostCheck::admit(refused(), anon())),
            ErrorCode::HostNotAllowed
        );
        assert_eq!(
            code(HostCheck::admit(refused(), bad())),
            ErrorCode::HostNotAllowed
        );
        assert_eq!(
            code(HostCheck::admit(Ok(()), bad())),
            ErrorCode::Unauthorized
        );
        assert!(HostCheck::admit(Ok(()), anon()).is_ok());
    }
}
