//! The README's library example: a dual-tier store (SQLite + local files),
//! a put, a verified get, a liveness source and a sweep.
use std::sync::Arc;

use store_core::{LivenessSource, Mode, Store, SweepOptions};
use store_local::{LocalEngine, LocalOptions};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Key, Namespace};

struct NothingReferenced;
#[async_trait::async_trait]
impl LivenessSource for NothingReferenced {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>, store_types::Error> {
        Ok(vec![false; keys.len()])
    }
}

#[tokio::main]
async fn main() -> Result<(), store_types::Error> {
    let dir = tempfile::tempdir().map_err(store_types::Error::from)?;
    let store = Store::builder()
        .kv(SqliteEngine::open(dir.path().join("kv.sqlite"), SqliteOptions::default()).await?)
        .large(LocalEngine::open(dir.path().join("large"), LocalOptions::default()).await?)
        .mode(Mode::DualTier {
            threshold: 64 * 1024,
        })
        .build()
        .await?;
    let ns = Namespace::new("docs")?;
    let receipt = store.put(&ns, &b"hello, pool"[..]).await?;
    let key = receipt.key().clone();
    let blob = store.get(&key).await?.expect("just stored");
    assert_eq!(&blob.bytes().await?[..], b"hello, pool");
    // Ranges are verified too: by 16 KiB chunk group against the entry's
    // BLAKE3 outboard (bao-tree's encoding, ADR-032), before any byte is yielded.
    let part = store.read_range(&key, 7..11).await?.bytes().await?;
    assert_eq!(&part[..], b"pool");
    drop(receipt); // unpinned and unreferenced: garbage from now on
    store
        .gc()
        .register_liveness_source(ns, Arc::new(NothingReferenced))
        .await?;
    let report = store.gc().sweep(SweepOptions::default()).await?;
    println!("{key}: staged {} for deletion", report.total.staged);
    Ok(())
}
