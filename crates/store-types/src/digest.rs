use std::fmt;
use std::str::FromStr;

use crate::Error;

/// Length of the canonical hex form of a [`Digest`].
pub const DIGEST_HEX_LEN: usize = 64;

/// A BLAKE3-256 content digest.
///
/// The canonical text form is exactly 64 lowercase hex characters; parsing
/// rejects everything else (upper case, prefixes, whitespace, other lengths)
/// with [`Error::KeyInvalid`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// Wraps raw digest bytes.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Digest(bytes)
    }

    /// The raw 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Hashes `data` in one call.
    pub fn of(data: &[u8]) -> Self {
        Digest(*blake3::hash(data).as_bytes())
    }

    /// Canonical 64-char lowercase hex.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(DIGEST_HEX_LEN);
        for b in self.0 {
            s.push(char::from_digit((b >> 4) as u32, 16).expect("nibble"));
            s.push(char::from_digit((b & 0xf) as u32, 16).expect("nibble"));
        }
        s
    }

    /// The first two hex characters, used for directory fan-out.
    pub fn prefix2(&self) -> String {
        self.to_hex()[..2].to_string()
    }

    /// Parses the canonical form; anything else is [`Error::KeyInvalid`].
    pub fn parse(s: &str) -> Result<Self, Error> {
        let bytes = s.as_bytes();
        if bytes.len() != DIGEST_HEX_LEN {
            return Err(Error::KeyInvalid(format!(
                "digest must be {DIGEST_HEX_LEN} lowercase hex characters, got {} characters",
                bytes.len()
            )));
        }
        let mut out = [0u8; 32];
        for (i, pair) in bytes.chunks_exact(2).enumerate() {
            let hi = nibble(pair[0]);
            let lo = nibble(pair[1]);
            match (hi, lo) {
                (Some(h), Some(l)) => out[i] = (h << 4) | l,
                _ => {
                    return Err(Error::KeyInvalid(
                        "digest must be lowercase hex [0-9a-f] only".to_string(),
                    ))
                }
            }
        }
        Ok(Digest(out))
    }
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

impl From<blake3::Hash> for Digest {
    fn from(h: blake3::Hash) -> Self {
        Digest(*h.as_bytes())
    }
}

impl FromStr for Digest {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Digest::parse(s)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.to_hex())
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_canonical_hex() {
        let d = Digest::of(b"hello");
        assert_eq!(d.to_hex(), blake3::hash(b"hello").to_hex().as_str());
        assert_eq!(Digest::parse(&d.to_hex()).unwrap(), d);
        assert_eq!(d.prefix2(), d.to_hex()[..2]);
    }

    #[test]
    fn rejects_non_canonical_forms() {
        let good = Digest::of(b"x").to_hex();
        for bad in [
            String::new(),
            good[..63].to_string(),
            format!("{good}0"),
            good.to_uppercase(),
            format!(" {}", &good[1..]),
            format!("g{}", &good[1..]),
            format!("0x{}", &good[2..]),
        ] {
            assert!(
                matches!(Digest::parse(&bad), Err(Error::KeyInvalid(_))),
                "{bad:?} must be rejected"
            );
        }
    }
}
