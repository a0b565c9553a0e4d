//! Row codecs: decoding digest, namespace and size columns, encoding
//! sizes and digest arrays, and index-aligned answers to batch calls.

use sqlx::postgres::PgRow;
use sqlx::Row;
use store_types::{Digest, Error, ErrorKind, Namespace, Result};

use crate::error::db_err;

/// Decodes a 32-byte `bytea` digest column.
pub fn digest_col(row: &PgRow, idx: usize) -> Result<Digest> {
    let raw: Vec<u8> = row.try_get(idx).map_err(db_err)?;
    let bytes: [u8; 32] = raw.try_into().map_err(|v: Vec<u8>| {
        Error::backend(ErrorKind::InvalidData, "postgres: decode stored digest")
            .with_source(format!("{} bytes, expected 32", v.len()))
    })?;
    Ok(Digest::from_bytes(bytes))
}

/// Decodes a namespace column.
pub fn namespace_col(row: &PgRow, idx: usize) -> Result<Namespace> {
    let raw: String = row.try_get(idx).map_err(db_err)?;
    Namespace::new(raw).map_err(|e| {
        Error::backend(ErrorKind::InvalidData, "postgres: decode stored namespace").with_source(e)
    })
}

/// Decodes a non-negative `bigint` size column.
pub fn size_col(row: &PgRow, idx: usize) -> Result<u64> {
    let raw: i64 = row.try_get(idx).map_err(db_err)?;
    u64::try_from(raw).map_err(|_| {
        Error::backend(ErrorKind::InvalidData, "postgres: decode stored size")
            .with_source(format!("{raw} is negative"))
    })
}

/// Converts a size or offset to `bigint`.
pub fn to_i64(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| {
        Error::backend(ErrorKind::InvalidData, "postgres: encode size")
            .with_source(format!("{v} does not fit a bigint"))
    })
}

/// Digests as `bytea[]` parameter values.
pub fn digest_params(digests: &[Digest]) -> Vec<&[u8]> {
    digests.iter().map(|d| &d.as_bytes()[..]).collect()
}

/// Turns the 1-based `WITH ORDINALITY` indexes a batched `EXISTS` query
/// returned into an index-aligned mask over `len` keys.
pub fn ordinal_mask(hits: Vec<i64>, len: usize) -> Vec<bool> {
    let mut out = vec![false; len];
    for i in hits {
        if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| out.get_mut(i)) {
            *slot = true;
        }
    }
    out
}

/// The index of the first occurrence of each digest, for answering
/// index-aligned batch calls from a set of matched digests.
pub fn aligned(digests: &[Digest], matched: &std::collections::HashSet<Digest>) -> Vec<bool> {
    digests.iter().map(|d| matched.contains(d)).collect()
}
