//! Identities and scopes (ADR-023).
//!
//! A request is made by an [`Identity`]: the holder of an API key
//! (`Authorization: Bearer <key>`), the holder of a client certificate the
//! server's CA signed (mutual TLS), or nobody in particular (the
//! *anonymous* identity). An identity holds [`Grant`]s: a [`Scope`] on the
//! namespaces matching a pattern.
//!
//! | scope | allows |
//! |---|---|
//! | `read` | get, head, existence probes (`blobs/have` without a token) |
//! | `write` | put; renewing and releasing the identity's *own* pin tokens |
//! | `delete` | direct deletes |
//! | `admin` | sweeps, metrics, releasing anyone's token (namespace ignored) |
//!
//! Keys are stored only as hashes (`blake3:<64 hex>`: BLAKE3 in key
//! derivation mode with a context of our own, so a key hash is never a
//! content digest). Keys are 256-bit random strings from
//! [`generate_key`], so a fast hash is enough: a password hash (argon2)
//! defends low-entropy secrets, which these are not. A presented key is
//! hashed and compared with every configured hash in constant time
//! ([`blake3::Hash`]'s equality); the loop does not stop at a match.
//!
//! [`Auth::open`] (the default) is the frictionless loopback server:
//! everyone is the anonymous identity with every scope.

use std::borrow::Cow;
use std::fmt;
use std::sync::{Arc, LazyLock};

use rand::RngCore;

/// The names a verified client certificate carries (the HTTP binding
/// reads them from the TLS handshake; [`Auth::authenticate`] matches them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientCert {
    /// The subject's common name.
    pub common_name: Option<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
}

/// The key-derivation context of API-key hashes. Never change it: every
/// configured hash depends on it.
const KEY_HASH_CONTEXT: &str = "blobpool 2026-12 api key hash v1";

/// Prefix of keys made by [`generate_key`] (a hint for secret scanners).
pub const KEY_PREFIX: &str = "bpk_";

/// The name of the identity of requests without credentials.
pub const ANONYMOUS: &str = "anonymous";

/// What an identity may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Get, head and existence probes.
    Read,
    /// Put, and renew or release one's own pin tokens.
    Write,
    /// Direct deletes.
    Delete,
    /// Sweeps, metrics, releasing any token.
    Admin,
}

impl Scope {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Delete => "delete",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A namespace pattern: a namespace, or a glob where `*` matches any run
/// of characters (`*` alone matches every namespace; `ci-*`, `*-tmp`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NsPattern(String);

impl NsPattern {
    /// Parses a pattern: 1–64 characters of `[a-z0-9._-]` and `*`.
    pub fn parse(s: &str) -> Result<NsPattern, AuthConfigError> {
        if s.is_empty() || s.len() > 64 {
            return Err(AuthConfigError::PatternLength(s.to_string()));
        }
        if let Some(c) = s.chars().find(|c| {
            !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-' | '*'))
        }) {
            return Err(AuthConfigError::PatternChar {
                pattern: s.to_string(),
                c,
            });
        }
        Ok(NsPattern(s.to_string()))
    }

    /// Whether `ns` matches.
    pub fn matches(&self, ns: &str) -> bool {
        glob(self.0.as_bytes(), ns.as_bytes())
    }

    /// The pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `*`-only glob matching, iterative with one backtrack point (linear in
/// practice, no recursion).
fn glob(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < pat.len() && pat[p] == b'*' {
            star = Some((p, i));
            p += 1;
        } else if p < pat.len() && pat[p] == s[i] {
            p += 1;
            i += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    pat[p..].iter().all(|&c| c == b'*')
}

/// A scope on the namespaces matching a pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The scope.
    pub scope: Scope,
    /// The namespaces it covers (`*` for `admin`).
    pub namespaces: NsPattern,
}

impl Grant {
    /// Parses `SCOPE` or `SCOPE:PATTERN` (`read`, `write:ci-*`,
    /// `delete:tmp`, `admin`). Without a pattern the grant covers every
    /// namespace; `admin` takes none.
    pub fn parse(s: &str) -> Result<Grant, AuthConfigError> {
        let (scope, pattern) = match s.split_once(':') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let scope = match scope.trim() {
            "read" => Scope::Read,
            "write" => Scope::Write,
            "delete" => Scope::Delete,
            "admin" => Scope::Admin,
            other => return Err(AuthConfigError::UnknownScope(other.to_string())),
        };
        if scope == Scope::Admin && pattern.is_some() {
            return Err(AuthConfigError::AdminWithPattern(s.to_string()));
        }
        Ok(Grant {
            scope,
            namespaces: NsPattern::parse(pattern.unwrap_or("*").trim())?,
        })
    }

    /// Parses a list of grants.
    pub fn parse_all<S: AsRef<str>>(list: &[S]) -> Result<Vec<Grant>, AuthConfigError> {
        list.iter().map(|s| Grant::parse(s.as_ref())).collect()
    }

    fn allows(&self, scope: Scope, ns: Option<&str>) -> bool {
        self.scope == scope
            && match ns {
                Some(ns) => self.namespaces.matches(ns),
                None => self.namespaces.as_str() == "*",
            }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.scope, self.namespaces.as_str()) {
            (_, "*") => write!(f, "{}", self.scope),
            (s, p) => write!(f, "{s}:{p}"),
        }
    }
}

/// How an identity proved itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Credential {
    /// No credentials (the anonymous identity).
    None,
    /// An API key.
    Key,
    /// A client certificate (mutual TLS).
    Certificate,
}

/// Who makes a request, and what it may do.
///
/// Cheap to clone (two reference counts): [`Auth`] builds each configured
/// identity once and every request clones it, so authenticating allocates
/// nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    name: Arc<str>,
    credential: Credential,
    grants: Arc<[Grant]>,
}

impl Identity {
    /// An identity with `grants`.
    pub fn new(name: impl Into<String>, credential: Credential, grants: Vec<Grant>) -> Self {
        Identity {
            name: name.into().into(),
            credential,
            grants: grants.into(),
        }
    }

    /// The identity of an open server: anonymous, every scope.
    pub fn open() -> Self {
        static OPEN: LazyLock<Identity> = LazyLock::new(|| {
            Identity::new(
                ANONYMOUS,
                Credential::None,
                [Scope::Read, Scope::Write, Scope::Delete, Scope::Admin]
                    .into_iter()
                    .map(|scope| Grant {
                        scope,
                        namespaces: NsPattern("*".into()),
                    })
                    .collect(),
            )
        });
        OPEN.clone()
    }

    /// The configured name (`anonymous` without credentials). Pin tokens
    /// belong to it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How it authenticated.
    pub fn credential(&self) -> Credential {
        self.credential
    }

    /// Whether it authenticated at all.
    pub fn is_anonymous(&self) -> bool {
        self.credential == Credential::None
    }

    /// Whether `scope` is granted on `ns` (`None`: a server-wide action,
    /// which only a grant of the scope on every namespace allows — or any
    /// grant, for `admin`).
    pub fn allows(&self, scope: Scope, ns: Option<&str>) -> bool {
        self.grants.iter().any(|g| g.allows(scope, ns))
    }

    /// The grants.
    pub fn grants(&self) -> &[Grant] {
        &self.grants
    }
}

/// A configured API key (only its hash).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// The identity's name.
    pub name: String,
    /// The key's hash.
    pub hash: blake3::Hash,
    /// What it may do.
    pub grants: Vec<Grant>,
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("grants", &self.grants)
            .finish_non_exhaustive()
    }
}

/// A configured client-certificate identity (mutual TLS): a verified
/// certificate whose subject common name or a DNS name equals `subject`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertIdentity {
    /// The identity's name.
    pub name: String,
    /// The certificate subject (CN or DNS SAN) it is recognised by.
    pub subject: String,
    /// What it may do.
    pub grants: Vec<Grant>,
}

/// Why a request could not be authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthError {
    /// A bearer key that matches no configured key.
    UnknownKey,
    /// A malformed `Authorization` header.
    Malformed(&'static str),
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthError::UnknownKey => f.write_str("the API key is not valid"),
            AuthError::Malformed(why) => write!(f, "malformed Authorization header: {why}"),
        }
    }
}

/// The server's identities: API keys, certificate identities and the
/// anonymous grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Auth {
    /// `false`: [`Auth::open`], everyone may do everything.
    enabled: bool,
    /// Each configured key or certificate with its identity, built once
    /// (see [`Identity`]).
    keys: Vec<(ApiKey, Identity)>,
    certs: Vec<(CertIdentity, Identity)>,
    /// The identity of callers without credentials.
    anonymous: Identity,
}

impl Default for Auth {
    fn default() -> Self {
        Auth::open()
    }
}

impl Auth {
    /// No authentication: every request is the anonymous identity with
    /// every scope (the loopback default).
    pub fn open() -> Auth {
        Auth {
            enabled: false,
            keys: Vec::new(),
            certs: Vec::new(),
            anonymous: Identity::new(ANONYMOUS, Credential::None, Vec::new()),
        }
    }

    /// Authentication with `keys`, `certs` and the `anonymous` grants.
    /// Refuses duplicate names, duplicate key hashes, an empty name, the
    /// reserved name `anonymous`, and a configuration with no key and no
    /// certificate identity (use [`Auth::open`] for that).
    pub fn new(
        keys: Vec<ApiKey>,
        certs: Vec<CertIdentity>,
        anonymous: Vec<Grant>,
    ) -> Result<Auth, AuthConfigError> {
        if keys.is_empty() && certs.is_empty() {
            return Err(AuthConfigError::NoIdentities);
        }
        let mut names: Vec<&str> = Vec::new();
        for name in keys
            .iter()
            .map(|k| k.name.as_str())
            .chain(certs.iter().map(|c| c.name.as_str()))
        {
            if name.trim().is_empty() {
                return Err(AuthConfigError::EmptyName);
            }
            if name == ANONYMOUS {
                return Err(AuthConfigError::ReservedName);
            }
            if names.contains(&name) {
                return Err(AuthConfigError::DuplicateName(name.to_string()));
            }
            names.push(name);
        }
        for (i, k) in keys.iter().enumerate() {
            if keys[..i].iter().any(|o| o.hash == k.hash) {
                return Err(AuthConfigError::DuplicateHash(k.name.clone()));
            }
        }
        Ok(Auth {
            enabled: true,
            keys: (keys.into_iter())
                .map(|k| {
                    let id = Identity::new(k.name.clone(), Credential::Key, k.grants.clone());
                    (k, id)
                })
                .collect(),
            certs: (certs.into_iter())
                .map(|c| {
                    let id =
                        Identity::new(c.name.clone(), Credential::Certificate, c.grants.clone());
                    (c, id)
                })
                .collect(),
            anonymous: Identity::new(ANONYMOUS, Credential::None, anonymous),
        })
    }

    /// Whether requests are authenticated at all.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Number of configured identities (keys + certificate identities).
    pub fn identities(&self) -> usize {
        self.keys.len() + self.certs.len()
    }

    /// The anonymous grants.
    pub fn anonymous_grants(&self) -> &[Grant] {
        self.anonymous.grants()
    }

    /// Who makes a request with this `Authorization` header value and
    /// verified client certificate.
    ///
    /// - An open server: [`Identity::open`] for everyone.
    /// - A key, as `Bearer <key>` or as the password of `Basic
    ///   base64(user:key)` (any user name): its identity, or
    ///   [`AuthError::UnknownKey`] (a wrong key is never downgraded to
    ///   anonymous).
    /// - Else a client certificate matching a certificate identity: that
    ///   identity; an unmatched certificate counts as no credential.
    /// - Else the anonymous identity with the anonymous grants.
    pub fn authenticate(
        &self,
        authorization: Option<&[u8]>,
        cert: Option<&ClientCert>,
    ) -> Result<Identity, AuthError> {
        if !self.enabled {
            return Ok(Identity::open());
        }
        if let Some(h) = authorization {
            let h = std::str::from_utf8(h)
                .map_err(|_| AuthError::Malformed("not UTF-8"))?
                .trim();
            let (scheme, value) = h
                .split_once(' ')
                .ok_or(AuthError::Malformed("expected `Bearer <key>` or `Basic …`"))?;
            let key = if scheme.eq_ignore_ascii_case("bearer") {
                Cow::Borrowed(value.trim())
            } else if scheme.eq_ignore_ascii_case("basic") {
                Cow::Owned(basic_password(value)?)
            } else {
                return Err(AuthError::Malformed(
                    "only the Bearer and Basic schemes are supported",
                ));
            };
            let hash = key_hash(&key);
            // Compare with every key (constant-time equality), no early exit.
            let mut found: Option<&Identity> = None;
            for (k, id) in &self.keys {
                if k.hash == hash {
                    found = Some(id);
                }
            }
            return found.cloned().ok_or(AuthError::UnknownKey);
        }
        if let Some(cert) = cert {
            let names = cert.common_name.iter().chain(cert.dns_names.iter());
            let matched = (self.certs.iter()).find(|(c, _)| names.clone().any(|n| *n == c.subject));
            if let Some((_, id)) = matched {
                return Ok(id.clone());
            }
        }
        Ok(self.anonymous.clone())
    }
}

/// The password of a `Basic` credential (`base64(user:password)`), which
/// is the API key; the user name is ignored (build tools such as ccache,
/// Gradle and Bazel send keys this way).
fn basic_password(value: &str) -> Result<String, AuthError> {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|_| AuthError::Malformed("Basic credentials are not base64"))?;
    let text = String::from_utf8(raw)
        .map_err(|_| AuthError::Malformed("Basic credentials are not UTF-8"))?;
    let (_, password) = text
        .split_once(':')
        .ok_or(AuthError::Malformed("Basic credentials need `user:key`"))?;
    Ok(password.to_string())
}

fn key_hash(key: &str) -> blake3::Hash {
    blake3::Hash::from_bytes(blake3::derive_key(KEY_HASH_CONTEXT, key.as_bytes()))
}

/// The config form of a key's hash: `blake3:<64 hex>`.
pub fn hash_key(key: &str) -> String {
    format!("blake3:{}", key_hash(key).to_hex())
}

/// Parses the config form of a key hash ([`hash_key`]'s output).
pub fn parse_key_hash(s: &str) -> Result<blake3::Hash, AuthConfigError> {
    let hex = s
        .trim()
        .strip_prefix("blake3:")
        .ok_or(AuthConfigError::NotAKeyHash)?;
    blake3::Hash::from_hex(hex).map_err(AuthConfigError::KeyHash)
}

/// Why an authentication setting was refused (the messages name the
/// setting's value; the caller adds where it came from).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthConfigError {
    /// A namespace pattern of 0 or more than 64 characters.
    #[error("namespace pattern {0:?}: 1 to 64 characters expected")]
    PatternLength(String),
    /// A namespace pattern with a character namespaces cannot have.
    #[error(
        "namespace pattern {pattern:?}: {c:?} is not allowed (namespaces are [a-z0-9._-], `*` matches any run)"
    )]
    PatternChar {
        /// The pattern.
        pattern: String,
        /// The character.
        c: char,
    },
    /// A scope that is not read, write, delete or admin.
    #[error(
        "scope {0:?}: expected read, write, delete or admin, optionally followed by :NAMESPACE_PATTERN"
    )]
    UnknownScope(String),
    /// `admin:PATTERN`.
    #[error("scope {0:?}: admin applies to the whole server and takes no namespace pattern")]
    AdminWithPattern(String),
    /// No key and no certificate identity.
    #[error("auth: no [[auth.keys]] and no [[auth.clients]]: nobody could authenticate")]
    NoIdentities,
    /// An identity named by white space only.
    #[error("auth: an identity has an empty name")]
    EmptyName,
    /// An identity named `anonymous`.
    #[error("auth: the name \"anonymous\" is reserved")]
    ReservedName,
    /// Two identities of one name.
    #[error("auth: two identities are named {0:?}")]
    DuplicateName(String),
    /// Two keys of one hash.
    #[error("auth: keys {0:?} and another identity have the same hash (one key, two names)")]
    DuplicateHash(String),
    /// Not `blake3:<64 hex>`.
    #[error("a key hash is `blake3:<64 hex>` (from `blobpool key new` or `blobpool key hash`)")]
    NotAKeyHash,
    /// `blake3:` followed by something else than 64 hex digits.
    #[error("key hash: {0}")]
    KeyHash(blake3::HexError),
}

/// A fresh API key: [`KEY_PREFIX`] plus 256 random bits as hex.
pub fn generate_key() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let mut s = String::with_capacity(KEY_PREFIX.len() + 64);
    s.push_str(KEY_PREFIX);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, secret: &str, grants: &[&str]) -> ApiKey {
        ApiKey {
            name: name.into(),
            hash: parse_key_hash(&hash_key(secret)).unwrap(),
            grants: Grant::parse_all(grants).unwrap(),
        }
    }

    #[test]
    fn globs_match_namespaces() {
        let m = |p: &str, s: &str| NsPattern::parse(p).unwrap().matches(s);
        assert!(m("*", "anything"));
        assert!(m("ci-*", "ci-main"));
        assert!(m("ci-*", "ci-"));
        assert!(!m("ci-*", "cd-main"));
        assert!(m("*-tmp", "a-tmp"));
        assert!(m("a*b*c", "axxbyyc"));
        assert!(!m("a*b*c", "axxbyy"));
        assert!(m("docs", "docs"));
        assert!(!m("docs", "docs2"));
        assert!(NsPattern::parse("Docs").is_err());
        assert!(NsPattern::parse("").is_err());
    }

    #[test]
    fn grants_parse_and_print() {
        assert_eq!(Grant::parse("read").unwrap().to_string(), "read");
        assert_eq!(
            Grant::parse("write:ci-*").unwrap().to_string(),
            "write:ci-*"
        );
        assert!(Grant::parse("admin:x").is_err());
        assert!(Grant::parse("pull").is_err());
        assert!(Grant::parse("read:A").is_err());
    }

    #[test]
    fn keys_authenticate_in_constant_time_and_wrong_keys_fail() {
        let auth = Auth::new(
            vec![
                key("ci", "bpk_one", &["read", "write:ci-*"]),
                key("ops", "bpk_two", &["admin", "delete"]),
            ],
            vec![],
            Grant::parse_all(&["read:public"]).unwrap(),
        )
        .unwrap();
        let ci = auth.authenticate(Some(b"Bearer bpk_one"), None).unwrap();
        assert_eq!(ci.name(), "ci");
        assert!(ci.allows(Scope::Write, Some("ci-main")));
        assert!(!ci.allows(Scope::Write, Some("prod")));
        assert!(ci.allows(Scope::Read, Some("prod")));
        assert!(!ci.allows(Scope::Admin, None));
        let ops = auth.authenticate(Some(b"bearer  bpk_two "), None).unwrap();
        assert!(ops.allows(Scope::Admin, None));
        assert_eq!(
            auth.authenticate(Some(b"Bearer bpk_three"), None),
            Err(AuthError::UnknownKey)
        );
        // Basic: the password is the key, the user name is ignored.
        use base64::Engine as _;
        let basic = |s: &str| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(s)
            )
        };
        let via_basic = auth
            .authenticate(Some(basic("anyone:bpk_one").as_bytes()), None)
            .unwrap();
        assert_eq!(via_basic.name(), "ci");
        assert_eq!(
            auth.authenticate(Some(basic("ci:bpk_wrong").as_bytes()), None),
            Err(AuthError::UnknownKey)
        );
        assert!(matches!(
            auth.authenticate(Some(basic("no-colon").as_bytes()), None),
            Err(AuthError::Malformed(_))
        ));
        assert!(matches!(
            auth.authenticate(Some(b"Basic !!notbase64"), None),
            Err(AuthError::Malformed(_))
        ));
        assert!(matches!(
            auth.authenticate(Some(b"Digest abc"), None),
            Err(AuthError::Malformed(_))
        ));
        let anon = auth.authenticate(None, None).unwrap();
        assert!(anon.is_anonymous());
        assert!(anon.allows(Scope::Read, Some("public")));
        assert!(!anon.allows(Scope::Read, Some("private")));
    }

    #[test]
    fn certificates_map_to_identities() {
        let auth = Auth::new(
            vec![],
            vec![CertIdentity {
                name: "builder".into(),
                subject: "builder.internal".into(),
                grants: Grant::parse_all(&["write"]).unwrap(),
            }],
            vec![],
        )
        .unwrap();
        let cert = ClientCert {
            common_name: Some("x".into()),
            dns_names: vec!["builder.internal".into()],
        };
        let id = auth.authenticate(None, Some(&cert)).unwrap();
        assert_eq!(
            (id.name(), id.credential()),
            ("builder", Credential::Certificate)
        );
        let other = ClientCert {
            common_name: Some("stranger".into()),
            dns_names: vec![],
        };
        assert!(auth
            .authenticate(None, Some(&other))
            .unwrap()
            .is_anonymous());
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert!(Auth::new(vec![], vec![], vec![]).is_err());
        assert!(Auth::new(
            vec![key("a", "k1", &[]), key("a", "k2", &[])],
            vec![],
            vec![]
        )
        .is_err());
        assert!(Auth::new(
            vec![key("a", "k1", &[]), key("b", "k1", &[])],
            vec![],
            vec![]
        )
        .is_err());
        assert!(Auth::new(vec![key(ANONYMOUS, "k1", &[])], vec![], vec![]).is_err());
        assert!(parse_key_hash("deadbeef").is_err());
        let k = generate_key();
        assert!(k.starts_with(KEY_PREFIX) && k.len() == KEY_PREFIX.len() + 64);
        assert_ne!(k, generate_key());
        assert_eq!(parse_key_hash(&hash_key(&k)).unwrap(), key_hash(&k));
    }

    #[test]
    fn the_open_server_allows_everything() {
        let id = Auth::open().authenticate(Some(b"garbage"), None).unwrap();
        assert!(id.allows(Scope::Admin, None) && id.allows(Scope::Delete, Some("x")));
    }
}
