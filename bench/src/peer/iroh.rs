//! The iroh-blobs peer: its file-system store through the Rust API, no
//! networking.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use iroh_blobs::store::fs::options::Options;
use iroh_blobs::store::fs::FsStore;
use iroh_blobs::store::GcConfig;
use iroh_blobs::Hash;

use crate::fixtures::{err, BenchResult};

/// One iroh-blobs `FsStore`.
pub struct IrohBlobs {
    store: FsStore,
}

impl IrohBlobs {
    /// Opens a store under `root` (created if needed).
    pub async fn open(root: impl Into<PathBuf>) -> BenchResult<Self> {
        let root = root.into();
        let store = FsStore::load(root.join("0")).await.map_err(err)?;
        Ok(IrohBlobs { store })
    }

    /// Opens a store under `root` whose own garbage collector runs every
    /// `interval` (iroh-blobs' `GcConfig`): blobs no tag protects are
    /// deleted by it, which is how the put rows empty the store between
    /// timed batches without replacing it.
    pub async fn open_collected(root: impl Into<PathBuf>, interval: Duration) -> BenchResult<Self> {
        let root = root.into();
        let dir = root.join("0");
        std::fs::create_dir_all(&dir).map_err(err)?;
        let mut options = Options::new(&dir);
        options.gc = Some(GcConfig {
            interval,
            add_protected: None,
        });
        let store = FsStore::load_with_opts(dir.join("blobs.db"), options)
            .await
            .map_err(err)?;
        Ok(IrohBlobs { store })
    }

    /// Its fastest put path for many blobs: one batch, each blob added
    /// under a temporary tag (no tag row written), the metadata committed
    /// once at the end (`sync_db`). The tags are released on return, so
    /// the store's collector (see [`IrohBlobs::open_collected`]) may then
    /// delete the blobs.
    pub async fn put_batch(&self, bodies: impl Iterator<Item = Bytes>) -> BenchResult<Vec<Hash>> {
        let batch = self.store.blobs().batch().await.map_err(err)?;
        let mut tags = Vec::new();
        for body in bodies {
            tags.push(batch.add_bytes(body).temp_tag().await.map_err(err)?);
        }
        self.store.sync_db().await.map_err(err)?;
        Ok(tags.iter().map(|t| t.hash()).collect())
    }

    /// Waits (up to `limit`) until the collector has deleted every blob of
    /// `hashes`; whether it did.
    pub async fn wait_collected(&self, hashes: &[Hash], limit: Duration) -> BenchResult<bool> {
        let deadline = std::time::Instant::now() + limit;
        let mut rest: Vec<Hash> = hashes.to_vec();
        while std::time::Instant::now() < deadline {
            let mut still = Vec::new();
            for h in rest {
                if self.store.blobs().has(h).await.map_err(err)? {
                    still.push(h);
                }
            }
            if still.is_empty() {
                return Ok(true);
            }
            rest = still;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(false)
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
}
