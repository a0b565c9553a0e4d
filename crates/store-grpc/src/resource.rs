//! ByteStream resource names (REAPI v2):
//!
//! ```text
//! read:  {instance}/blobs/{hash}/{size}
//!        {instance}/blobs/blake3/{hash}/{size}
//! write: {instance}/uploads/{uuid}/blobs/[blake3/]{hash}/{size}[/{metadata}]
//! ```
//!
//! `{instance}` may be empty (no leading segment). 64 hex digits without a
//! function segment are SHA-256; a request's `digest_function` cannot be
//! given over ByteStream, so BLAKE3 is named in the path. Compressed
//! blobs (`compressed-blobs/…`) are refused: no compressor is advertised.

use store_ops::cache::DigestFunction;
use store_ops::OpsError;

/// A parsed resource name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Resource {
    /// The instance name (possibly empty).
    pub(crate) instance: String,
    /// The upload's client-chosen id (writes only).
    pub(crate) upload: Option<String>,
    /// The blob's digest function.
    pub(crate) function: DigestFunction,
    /// 64 lowercase hex characters.
    pub(crate) hash: String,
    /// The blob's size.
    pub(crate) size: u64,
}

fn bad(name: &str, why: &str) -> OpsError {
    OpsError::bad_request(format!("resource name {name:?}: {why}"))
}

/// The `[blake3/]{hash}/{size}` part after `blobs/`.
fn blob(name: &str, rest: &[&str]) -> Result<(DigestFunction, String, u64), OpsError> {
    let (function, rest) = match rest.first() {
        Some(&"blake3") => (DigestFunction::Blake3, &rest[1..]),
        Some(&"sha256") => (DigestFunction::Sha256, &rest[1..]),
        _ => (DigestFunction::Sha256, rest),
    };
    let (hash, size) = match rest {
        [hash, size, ..] => (*hash, *size),
        _ => return Err(bad(name, "expected …/blobs/[blake3/]{hash}/{size}")),
    };
    let hex = hash.len() == 64
        && (hash.bytes()).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex {
        return Err(bad(name, "the hash is not 64 lowercase hex characters"));
    }
    let size = (size.parse::<u64>()).map_err(|_| bad(name, "the size is not a number"))?;
    Ok((function, hash.to_string(), size))
}

/// Where `marker` (`blobs` or `uploads`) first stands; the instance name
/// is what precedes it. A compressed-blobs name is refused.
fn split<'a>(name: &'a str, marker: &str) -> Result<(String, Vec<&'a str>), OpsError> {
    let parts: Vec<&str> = name.split('/').collect();
    if parts.contains(&"compressed-blobs") {
        return Err(bad(
            name,
            "compressed blobs are not supported (the server advertises no compressor)",
        ));
    }
    let at = (parts.iter().position(|p| *p == marker))
        .ok_or_else(|| bad(name, &format!("expected a {marker}/ segment")))?;
    Ok((parts[..at].join("/"), parts[at + 1..].to_vec()))
}

/// A `Read` resource name.
pub(crate) fn read(name: &str) -> Result<Resource, OpsError> {
    let (instance, rest) = split(name, "blobs")?;
    let (function, hash, size) = blob(name, &rest)?;
    Ok(Resource {
        instance,
        upload: None,
        function,
        hash,
        size,
    })
}

/// A `Write` (or `QueryWriteStatus`) resource name.
pub(crate) fn write(name: &str) -> Result<Resource, OpsError> {
    let (instance, rest) = split(name, "uploads")?;
    let (uuid, rest) = match rest.as_slice() {
        [uuid, "blobs", rest @ ..] if !uuid.is_empty() => (*uuid, rest),
        _ => return Err(bad(name, "expected …/uploads/{uuid}/blobs/…")),
    };
    let (function, hash, size) = blob(name, rest)?;
    Ok(Resource {
        instance,
        upload: Some(uuid.to_string()),
        function,
        hash,
        size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn names_parse_with_and_without_an_instance_and_a_function() {
        let r = read(&format!("cc/blobs/{H}/12")).unwrap();
        assert_eq!(
            (r.instance.as_str(), r.function, r.size),
            ("cc", DigestFunction::Sha256, 12)
        );
        let r = read(&format!("blobs/blake3/{H}/0")).unwrap();
        assert_eq!(
            (r.instance.as_str(), r.function),
            ("", DigestFunction::Blake3)
        );
        let w = write(&format!("cc/uploads/u-1/blobs/blake3/{H}/5/meta")).unwrap();
        assert_eq!(w.upload.as_deref(), Some("u-1"));
        assert_eq!((w.function, w.size), (DigestFunction::Blake3, 5));
        assert_eq!(
            write(&format!("uploads/u/blobs/{H}/5")).unwrap().instance,
            ""
        );
    }

    #[test]
    fn malformed_names_are_refused_saying_why() {
        let e = read(&format!("cc/blobs/{}/1", &H[..63])).unwrap_err();
        assert!(e.message.contains("64 lowercase hex"), "{}", e.message);
        assert!(read(&format!("cc/blobs/{H}/x"))
            .unwrap_err()
            .message
            .contains("size"));
        assert!(read("cc/nothing").is_err());
        assert!(write(&format!("cc/uploads/blobs/{H}/1")).is_err());
        let e = read(&format!("cc/compressed-blobs/zstd/{H}/1")).unwrap_err();
        assert!(e.message.contains("compress"), "{}", e.message);
    }
}
