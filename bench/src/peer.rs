//! The peer: [`cacache`] 13, a content-addressed cache on the local file
//! system. It hashes with SHA-256, writes each entry to a temporary file and
//! renames it into place — and never fsyncs. Blobpool's durable local puts
//! against it are the harder test; `LocalOptions { fsync: false }` is the
//! like-for-like one.

use std::path::PathBuf;

pub use cacache::Integrity;

use crate::fixtures::{err, BenchResult};

/// One cacache directory.
pub struct Cacache {
    dir: PathBuf,
}

impl Cacache {
    /// Uses (and creates on first write) `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Cacache { dir: dir.into() }
    }

    /// The cache directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// Stores `bytes` by content (`write_hash`: no index entry, like a
    /// Blobpool put that returns the digest).
    pub async fn put(&self, bytes: &[u8]) -> BenchResult<Integrity> {
        cacache::write_hash(&self.dir, bytes).await.map_err(err)
    }

    /// Reads the content back, verified against its integrity
    /// (`read_hash`).
    pub async fn get(&self, sri: &Integrity) -> BenchResult<Vec<u8>> {
        cacache::read_hash(&self.dir, sri).await.map_err(err)
    }
}
