//! Helpers for tests (feature `testing`).

use futures::TryStreamExt;
use object_store::{ObjectStoreExt, PutPayload};
use store_types::{Error, Key, Result};

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
        if v.is_empty() {
            v.push(0);
        } else {
            let mid = v.len() / 2;
            v[mid] ^= 0xff;
        }
        store
            .put(&path, PutPayload::from(v))
            .await
            .map_err(|e| backend_err("corrupting", &path, e))?;
        Ok(())
    }
}
