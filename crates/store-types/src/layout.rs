//! The on-media layout helpers the path-based engines share.
//!
//! The file and object-store engines lay content out as
//! `<ns>/<2 hex>/<digest hex>`: a fan-out level named by the digest's first
//! byte, so that no directory (or listing prefix) holds more than 1/256 of a
//! namespace. [`fan_out`] names that level for a digest, [`fan_name`] for a
//! byte, and [`parse_fan`] reads a name back while scanning, rejecting
//! anything that is not exactly two lowercase hex digits (stray files, stage
//! directories). [`random_salt`] is the per-instance value the engines mix
//! into stage names so that several processes sharing one root never
//! collide.

use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::Digest;

/// The fan-out directory (or prefix segment) of `digest`: its first byte as
/// two lowercase hex digits, the same as [`Digest::prefix2`].
pub fn fan_out(digest: &Digest) -> String {
    fan_name(digest.as_bytes()[0])
}

/// The fan-out name of the byte `fan`: two lowercase hex digits.
pub fn fan_name(fan: u8) -> String {
    format!("{fan:02x}")
}

/// Parses a fan-out name: exactly two lowercase hex digits, else `None`.
pub fn parse_fan(name: &str) -> Option<u8> {
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    match name.as_bytes() {
        [hi, lo] => Some((nib(*hi)? << 4) | nib(*lo)?),
        _ => None,
    }
}

/// A per-instance random value for stage names, so that processes on
/// several nodes sharing one root (or a recycled pid) do not collide.
///
/// It mixes the process's randomly keyed hasher with the wall clock in
/// nanoseconds and the pid; two calls (in one process or in two) differ
/// with overwhelming probability.
pub fn random_salt() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fan_out_is_the_digest_prefix_and_parses_back() {
        for data in [&b""[..], b"a", b"hello", b"\xff\x00"] {
            let d = Digest::of(data);
            let fan = fan_out(&d);
            assert_eq!(fan, d.prefix2());
            assert_eq!(parse_fan(&fan), Some(d.as_bytes()[0]));
        }
    }

    #[test]
    fn every_byte_round_trips_through_its_name() {
        for b in 0..=u8::MAX {
            let name = fan_name(b);
            assert_eq!(name.len(), 2);
            assert_eq!(parse_fan(&name), Some(b), "{name}");
        }
    }

    #[test]
    fn parse_fan_rejects_everything_else() {
        for bad in [
            "", "0", "000", "0A", "Ff", "g0", "0g", " 0", "-1", ".s", "é",
        ] {
            assert_eq!(parse_fan(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn random_salts_differ() {
        let salts: std::collections::HashSet<u64> = (0..64).map(|_| random_salt()).collect();
        assert_eq!(salts.len(), 64);
    }
}
