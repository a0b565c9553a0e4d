use std::fmt;

use crate::{Digest, Error};

/// Longest valid namespace.
pub const NAMESPACE_MAX_LEN: usize = 64;

/// An independent key space: 1–64 chars of `[a-z0-9._-]`, starting with
/// `[a-z0-9]`. Anything else (including `..`-style path tricks, which cannot
/// start with `.`) is [`Error::KeyInvalid`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(String);

impl Namespace {
    /// Validates and wraps a namespace name.
    pub fn new(name: impl Into<String>) -> Result<Self, Error> {
        let name = name.into();
        let b = name.as_bytes();
        if b.is_empty() || b.len() > NAMESPACE_MAX_LEN {
            return Err(Error::KeyInvalid(format!(
                "namespace must be 1-{NAMESPACE_MAX_LEN} characters, got {}",
                b.len()
            )));
        }
        if !(b[0].is_ascii_lowercase() || b[0].is_ascii_digit()) {
            return Err(Error::KeyInvalid(
                "namespace must start with [a-z0-9]".to_string(),
            ));
        }
        if !b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        }) {
            return Err(Error::KeyInvalid(
                "namespace may contain only [a-z0-9._-]".to_string(),
            ));
        }
        Ok(Namespace(name))
    }

    /// The validated name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Namespace({})", self.0)
    }
}

impl std::str::FromStr for Namespace {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Namespace::new(s)
    }
}

impl serde::Serialize for Namespace {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Namespace {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Namespace::new(s).map_err(serde::de::Error::custom)
    }
}

/// The address of an entry: (namespace, digest).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Key {
    /// The key space.
    pub namespace: Namespace,
    /// The content digest.
    pub digest: Digest,
}

impl Key {
    /// Builds a key from validated parts.
    pub fn new(namespace: Namespace, digest: Digest) -> Self {
        Key { namespace, digest }
    }

    /// Parses both parts from text, validating each.
    pub fn parse(namespace: &str, digest: &str) -> Result<Self, Error> {
        Ok(Key::new(Namespace::new(namespace)?, Digest::parse(digest)?))
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.digest)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_rules() {
        for ok in ["a", "0", "a.b-c_d", &"x".repeat(64)] {
            Namespace::new(ok).unwrap();
        }
        for bad in [
            "",
            ".a",
            "-a",
            "_a",
            "A",
            "a/b",
            "../x",
            "a b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(
                matches!(Namespace::new(bad), Err(Error::KeyInvalid(_))),
                "{bad:?} must be rejected"
            );
        }
    }
}
