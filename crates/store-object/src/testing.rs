//! Helpers for tests (feature `testing`).

use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use store_types::{Error, ErrorKind, Key, Result};

use crate::error::backend_err;
use crate::ObjectEngine;

#[cfg(feature = "s3")]
pub mod s3;

impl ObjectEngine {
    /// Number of objects under the stage prefix: stage objects of puts
    /// between upload completion and publish, plus any leftovers not yet
    /// reaped. (Multipart uploads in progress are not objects.)
    pub async fn stage_object_count(&self) -> Result<usize> {
        let dir = self.inner.stage_dir();
        let n = self
            .inner
            .store
            .list(Some(&dir))
            .try_fold(0usize, |n, _| futures::future::ready(Ok(n + 1)))
            .await
            .map_err(|e| backend_err("listing", &dir, e))?;
        Ok(n)
    }

    /// Damages the stored object of `key` so that reads no longer hash to
    /// its digest: the byte in the middle is bit-flipped (an empty object
    /// gets one byte instead), and the object overwritten.
    ///
    /// Returns [`Error::Missing`] when `key` is absent.
    pub async fn corrupt_one_byte(&self, key: &Key) -> Result<()> {
        self.damage(key, |v| {
            if v.is_empty() {
                v.push(0);
            } else {
                let mid = v.len() / 2;
                v[mid] ^= 0xff;
            }
            Ok(())
        })
        .await
    }

    /// Flips (`^ 0xff`) the byte at `offset` of `key`'s stored object,
    /// size unchanged, and overwrites the object.
    ///
    /// Returns [`Error::Missing`] when `key` is absent and an
    /// [`ErrorKind::InvalidData`] error when `offset` is not inside it.
    pub async fn corrupt_byte_at(&self, key: &Key, offset: u64) -> Result<()> {
        self.damage(key, |v| {
            let byte = usize::try_from(offset)
                .ok()
                .and_then(|i| v.get_mut(i))
                .ok_or_else(|| {
                    Error::backend(ErrorKind::InvalidData, "corrupting a byte past the end")
                        .with_key(key)
                })?;
            *byte ^= 0xff;
            Ok(())
        })
        .await
    }

    /// Reads `key`'s object, applies `f`, writes it back.
    async fn damage(&self, key: &Key, f: impl FnOnce(&mut Vec<u8>) -> Result<()>) -> Result<()> {
        let path = self.inner.content_path(key);
        let store = &self.inner.store;
        let bytes = match store.get(&path).await {
            Ok(g) => g
                .bytes()
                .await
                .map_err(|e| backend_err("reading", &path, e))?,
            Err(object_store::Error::NotFound { .. }) => return Err(Error::Missing),
            Err(e) => return Err(backend_err("reading", &path, e)),
        };
        let mut v = bytes.to_vec();
        f(&mut v)?;
        store
            .put(&path, PutPayload::from(v))
            .await
            .map_err(|e| backend_err("corrupting", &path, e))?;
        Ok(())
    }
}
