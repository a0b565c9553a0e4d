//! The read path: locating an entry's large object and streaming it in
//! [`CHUNK_SIZE`] pieces with `lo_get` (or returning it whole when it was
//! fetched inline).

use std::ops::Range;

use bytes::Bytes;
use futures::stream::{self, Stream};
use sqlx::postgres::types::Oid;
use sqlx::postgres::PgPool;
use sqlx::Row;
use store_pg::plumbing::{db_err, size_col, to_i64};
use store_types::{BlobReader, Key, Result, CHUNK_SIZE};

use crate::PgLoEngine;

impl PgLoEngine {
    pub(crate) async fn locate(&self, key: &Key) -> Result<Option<(Oid, u64)>> {
        let row = sqlx::query(
            self.sql("SELECT oid, size FROM {schema}.lo_entries WHERE ns = $1 AND digest = $2"),
        )
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        row.map(|r| Ok((r.try_get(0).map_err(db_err)?, size_col(&r, 1)?)))
            .transpose()
    }

    /// A reader over `range` of the large object `oid`, fetched in
    /// [`CHUNK_SIZE`] pieces with `lo_get`. Each piece is read through the
    /// entry's row, so a reader whose entry was deleted mid-stream fails
    /// instead of reading a recycled OID.
    pub(crate) fn reader(&self, key: &Key, oid: Oid, range: Range<u64>) -> BlobReader {
        let len = range.end.saturating_sub(range.start);
        let stream = chunks(
            self.pool().clone(),
            self.sql(
                "SELECT lo_get(e.oid, $4, $5) FROM {schema}.lo_entries e
                 WHERE e.ns = $1 AND e.digest = $2 AND e.oid = $3",
            ),
            key.clone(),
            oid,
            range,
        );
        BlobReader::stream(len, tokio_util::io::StreamReader::new(Box::pin(stream)))
    }
}

fn chunks(
    pool: PgPool,
    query: sqlx::SqlStr,
    key: Key,
    oid: Oid,
    range: Range<u64>,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send {
    stream::try_unfold(range.start, move |pos| {
        let (pool, query, key) = (pool.clone(), query.clone(), key.clone());
        let end = range.end;
        async move {
            if pos >= end {
                return Ok(None);
            }
            let want = (end - pos).min(CHUNK_SIZE as u64) as i32;
            let got: Option<Vec<u8>> = sqlx::query_scalar(query)
                .bind(key.namespace.as_str())
                .bind(&key.digest.as_bytes()[..])
                .bind(oid)
                .bind(to_i64(pos)?)
                .bind(want)
                .fetch_optional(&pool)
                .await
                .map_err(db_err)?;
            match got {
                None => Err(std::io::Error::other(format!(
                    "{key} was deleted while being read"
                ))),
                Some(b) if b.is_empty() => Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("large object of {key} is shorter than its recorded size"),
                )),
                Some(b) => {
                    let next = pos + b.len() as u64;
                    Ok(Some((Bytes::from(b), next)))
                }
            }
        }
    })
}

/// A reader over `bytes`, fetched at once, of which `want` were asked for.
/// A large object shorter than its recorded size yields what it has and
/// then fails, like the streamed path.
pub(crate) fn inline_reader(key: &Key, want: u64, bytes: Vec<u8>) -> BlobReader {
    if bytes.len() as u64 == want {
        return BlobReader::from_bytes(Bytes::from(bytes));
    }
    let short = std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("large object of {key} is shorter than its recorded size"),
    );
    let parts: Vec<std::io::Result<Bytes>> = vec![Ok(Bytes::from(bytes)), Err(short)];
    BlobReader::stream(want, tokio_util::io::StreamReader::new(stream::iter(parts)))
}
