//! REAPI digests and digest functions as the store-ops cache API takes
//! them.

use store_ops::cache::{CasDigest, DigestFunction};
use store_ops::OpsError;

use crate::proto::build::bazel::remote::execution::v2 as re;

/// The function a request's `digest_function` field names, if any
/// (`UNKNOWN`: `None`, the function comes from the digest itself); an
/// unsupported one is `invalid argument`.
pub(crate) fn requested(field: i32) -> Result<Option<DigestFunction>, OpsError> {
    use re::digest_function::Value;
    match Value::try_from(field) {
        Ok(Value::Unknown) => Ok(None),
        Ok(Value::Sha256) => Ok(Some(DigestFunction::Sha256)),
        Ok(Value::Blake3) => Ok(Some(DigestFunction::Blake3)),
        Ok(other) => Err(OpsError::bad_request(format!(
            "digest function {} is not supported: this server takes SHA256 and BLAKE3",
            other.as_str_name()
        ))),
        Err(_) => Err(OpsError::bad_request(format!(
            "digest function {field} is unknown: this server takes SHA256 and BLAKE3"
        ))),
    }
}

/// The function of a digest `hash` when the request names none: SHA-256
/// for 64 hex digits (REAPI infers the older functions from the length;
/// BLAKE3 requests must say so).
pub(crate) fn function_of(
    named: Option<DigestFunction>,
    hash: &str,
) -> Result<DigestFunction, OpsError> {
    match named {
        Some(f) => Ok(f),
        None if hash.len() == 64 => Ok(DigestFunction::Sha256),
        None => Err(OpsError::bad_request(format!(
            "digest {hash:?}: a SHA-256 digest has 64 hex characters (BLAKE3 digests need \
             digest_function = BLAKE3)"
        ))),
    }
}

/// A REAPI digest checked: 64 lowercase hex characters and a size of at
/// least 0; the hash and size.
pub(crate) fn checked(d: Option<&re::Digest>, what: &str) -> Result<(String, u64), OpsError> {
    let d = d.ok_or_else(|| OpsError::bad_request(format!("{what}: no digest")))?;
    let hex = d.hash.len() == 64
        && (d.hash.bytes()).all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex {
        return Err(OpsError::bad_request(format!(
            "{what}: digest hash {:?} is not 64 lowercase hex characters",
            d.hash
        )));
    }
    let size = u64::try_from(d.size_bytes).map_err(|_| {
        OpsError::bad_request(format!("{what}: digest size {} is negative", d.size_bytes))
    })?;
    Ok((d.hash.clone(), size))
}

/// A checked digest as the cache API asks about it.
pub(crate) fn cas_digest(
    named: Option<DigestFunction>,
    d: &re::Digest,
) -> Result<CasDigest, OpsError> {
    let (hash, size) = checked(Some(d), "blob")?;
    let function = function_of(named, &hash)?;
    Ok(CasDigest {
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
    fn the_function_is_the_requests_else_sha256_for_64_hex_digits() {
        let blake3 = re::digest_function::Value::Blake3 as i32;
        assert_eq!(requested(blake3).unwrap(), Some(DigestFunction::Blake3));
        assert_eq!(requested(0).unwrap(), None);
        let sha1 = re::digest_function::Value::Sha1 as i32;
        assert!(requested(sha1).unwrap_err().message.contains("SHA1"));
        assert!(requested(1234).is_err());
        assert_eq!(function_of(None, H).unwrap(), DigestFunction::Sha256);
        assert!(function_of(None, &H[..40]).is_err());
    }

    #[test]
    fn digests_are_64_lowercase_hex_and_a_size_of_at_least_0() {
        let d = |hash: &str, size| re::Digest {
            hash: hash.into(),
            size_bytes: size,
        };
        assert_eq!(checked(Some(&d(H, 3)), "x").unwrap(), (H.to_string(), 3));
        assert!(checked(Some(&d(&H.to_uppercase(), 3)), "x").is_err());
        assert!(checked(Some(&d(H, -1)), "x").is_err());
        assert!(checked(None, "x").is_err());
    }
}
