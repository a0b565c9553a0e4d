//! Fault injection for the contract suite (feature `testing`).

use rusqlite::OptionalExtension;
use store_types::{Error, Key, Result};

use crate::error::SqlResultExt;
use crate::SqliteEngine;

impl SqliteEngine {
    /// Simulates bit rot in the stored content of `key`, leaving its `size`
    /// and `created_at` untouched, so `get` must detect it.
    ///
    /// A non-empty content gets its middle byte inverted (`^ 0xff`). An empty
    /// content has no byte to flip, so one `0x00` byte is appended instead:
    /// the stored content then disagrees with both the digest and the
    /// recorded size (0), which is corruption all the same.
    ///
    /// Runs through the writer thread like any write, and drops the entry
    /// from the hot-entry caches so the next read sees the stored bytes.
    ///
    /// # Errors
    ///
    /// [`Error::Missing`] if `key` is absent.
    pub async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
        let key = key.clone();
        let cache = self.inner.cache.clone();
        let gone = [key.clone()];
        let invalidate: crate::writer::AfterCommit = Box::new(move || cache.invalidate(&gone));
        self.inner
            .writer
            .submit_then(
                0,
                true,
                move |conn, _now| {
                    let params = (key.namespace.as_str(), &key.digest.as_bytes()[..]);
                    let content: Option<Vec<u8>> = conn
                        .prepare_cached("SELECT content FROM entries WHERE ns = ?1 AND digest = ?2")
                        .sql()?
                        .query_row(params, |r| r.get(0))
                        .optional()
                        .sql()?;
                    let mut content = content.ok_or(Error::Missing)?;
                    if content.is_empty() {
                        content.push(0);
                    } else {
                        let mid = content.len() / 2;
                        content[mid] ^= 0xff;
                    }
                    conn.prepare_cached(
                        "UPDATE entries SET content = ?3 WHERE ns = ?1 AND digest = ?2",
                    )
                    .sql()?
                    .execute((params.0, params.1, &content[..]))
                    .sql()?;
                    Ok(())
                },
                Some(invalidate),
            )
            .await
    }
}
