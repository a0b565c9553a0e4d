//! The iroh-blobs peer: its file-system store through the Rust API, no
//! networking.

use std::path::PathBuf;

use bytes::Bytes;
use iroh_blobs::store::fs::FsStore;
use iroh_blobs::Hash;

use crate::fixtures::{err, BenchResult};

/// One iroh-blobs `FsStore`, which [`IrohBlobs::renew`] replaces by an
/// empty one in a fresh directory.
pub struct IrohBlobs {
    root: PathBuf,
    generation: u64,
    store: FsStore,
}

impl IrohBlobs {
    /// Opens a store under `root` (created if needed).
    pub async fn open(root: impl Into<PathBuf>) -> BenchResult<Self> {
        let root = root.into();
        let store = FsStore::load(root.join("0")).await.map_err(err)?;
        Ok(IrohBlobs {
            root,
            generation: 0,
            store,
        })
    }

    fn dir(&self) -> PathBuf {
        self.root.join(self.generation.to_string())
    }

    /// Stores `bytes` as a raw blob with a persistent tag (what awaiting
    /// `add_bytes` does). Returns when the data and outboard are in place
    /// and the metadata update is queued, before its redb commit.
    pub async fn put(&self, bytes: Bytes) -> BenchResult<Hash> {
        let tag = self.store.add_bytes(bytes).await.map_err(err)?;
        Ok(tag.hash)
    }

    /// Waits until every earlier put's metadata is committed (`sync_db`).
    pub async fn sync(&self) -> BenchResult<()> {
        self.store.sync_db().await.map_err(err)
    }

    /// Reads the whole blob, verified against its outboard as it is read
    /// (`get_bytes`: a bao export of every chunk, validated).
    pub async fn get(&self, hash: Hash) -> BenchResult<Bytes> {
        self.store.blobs().get_bytes(hash).await.map_err(err)
    }

    /// Shuts the store down and replaces it by an empty one in a fresh
    /// directory, then removes the old directory (the puts' reset).
    pub async fn renew(&mut self) -> BenchResult<()> {
        let old = self.dir();
        self.store.shutdown().await.map_err(err)?;
        self.generation += 1;
        self.store = FsStore::load(self.dir()).await.map_err(err)?;
        std::fs::remove_dir_all(&old).map_err(err)
    }
}
