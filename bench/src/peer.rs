//! The peers: other content-addressed stores on the local file system,
//! each called on its fastest path.
//!
//! - [`Cacache`]: the `cacache` 13 crate. It hashes with SHA-256, writes
//!   each entry to a temporary file and renames it into place — and never
//!   fsyncs. It has an async API (on tokio) and a blocking one; the table
//!   measures both and compares against the faster.
//! - `IrohBlobs` (feature `iroh`): iroh-blobs' file-system store
//!   (`FsStore`), BLAKE3 with bao outboards, metadata in redb. Entries up to
//!   16 KiB live inline in redb; larger ones are a data file and an
//!   outboard file written to a temporary name and renamed into place,
//!   never fsynced. The redb write transaction is committed (and fsynced,
//!   redb's default durability) in batches of up to 1000 operations or
//!   500 ms, *after* the put has returned.
//!
//! Blobpool's durable local puts against either are the harder test;
//! `LocalOptions { fsync: false }` is the like-for-like one.

use std::path::PathBuf;

pub use cacache::Integrity;

use crate::fixtures::{err, BenchResult};

#[cfg(feature = "iroh")]
mod iroh;
#[cfg(feature = "iroh")]
pub use iroh::IrohBlobs;

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

    /// [`Cacache::put`] through the blocking API (`write_hash_sync`), on
    /// the caller's thread.
    pub fn put_sync(&self, bytes: &[u8]) -> BenchResult<Integrity> {
        cacache::write_hash_sync(&self.dir, bytes).map_err(err)
    }

    /// [`Cacache::get`] through the blocking API (`read_hash_sync`), on the
    /// caller's thread.
    pub fn get_sync(&self, sri: &Integrity) -> BenchResult<Vec<u8>> {
        cacache::read_hash_sync(&self.dir, sri).map_err(err)
    }
}
