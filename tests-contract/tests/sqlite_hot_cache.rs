//! The SQLite engine's hot-entry cache seen through the store (TUNING.md §sqlite-hot-cache):
//! `verify` and `quarantine` judge the stored bytes, not the cached copy;
//! a store's delete and sweep leave nothing cached behind.

use bytes::Bytes;
use store_core::{GcPolicy, Mode, Store, SweepOptions, VerifyOptions};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Key, Namespace};

async fn store(dir: &std::path::Path) -> (Store, SqliteEngine) {
    let engine = SqliteEngine::open(dir.join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let store = Store::builder()
        .kv(engine.clone())
        .mode(Mode::KvOnly { threshold: 1 << 20 })
        .window(std::time::Duration::ZERO)
        .build()
        .await
        .unwrap();
    (store, engine)
}

async fn put(store: &Store, data: &[u8]) -> Key {
    let ns = Namespace::new("hot").unwrap();
    let r = store
        .put_opts(
            &ns,
            data,
            store_core::PutOptions {
                len: Some(data.len() as u64),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    r.key().clone()
}

async fn get(store: &Store, k: &Key) -> Option<Bytes> {
    Some(store.get(k).await.unwrap()?.bytes().await.unwrap())
}

/// Flips a byte of the stored row through another connection: the cache
/// keeps the good copy it verified.
fn rot_behind(path: &std::path::Path, k: &Key) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    let n = conn
        .execute(
            "UPDATE entries SET content = zeroblob(length(content)) WHERE ns = ?1 AND digest = ?2",
            (k.namespace.as_str(), &k.digest.as_bytes()[..]),
        )
        .unwrap();
    assert_eq!(n, 1);
}

#[tokio::test]
async fn verify_reads_the_stored_bytes_not_the_cached_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (store, engine) = store(dir.path()).await;
    let data = vec![0x5a; 3000];
    let k = put(&store, &data).await;
    assert_eq!(get(&store, &k).await.as_deref(), Some(&data[..]));
    assert_eq!(engine.cache_usage().0, 1, "the get cached it");
    rot_behind(&dir.path().join("kv.sqlite"), &k);
    // The hot copy still serves (it was verified when it was read) ...
    assert_eq!(get(&store, &k).await.as_deref(), Some(&data[..]));
    // ... but verify reads the file and finds the rot.
    let summary = store.verify(&VerifyOptions::new()).await.unwrap();
    assert_eq!((summary.checked, summary.corrupt), (1, 1), "{summary:?}");
}

#[tokio::test]
async fn deletes_and_sweeps_through_the_store_leave_nothing_cached() {
    let dir = tempfile::tempdir().unwrap();
    let (store, engine) = store(dir.path()).await;
    let a = put(&store, b"deleted by delete").await;
    let b = put(&store, b"deleted by a sweep").await;
    for k in [&a, &b] {
        assert!(get(&store, k).await.is_some());
    }
    assert_eq!(engine.cache_usage().0, 2);
    store.delete(&a).await.unwrap();
    assert_eq!(get(&store, &a).await, None);
    assert!(!store.has(&a).await.unwrap());
    // Unpinned and unreferenced: with a zero window, two sweeps (stage,
    // then delete) take it.
    store
        .set_gc_policy(b.namespace.clone(), GcPolicy::Unreferenced)
        .await
        .unwrap();
    let mut deleted = 0;
    for _ in 0..2 {
        deleted += store
            .gc()
            .sweep(SweepOptions::default())
            .await
            .unwrap()
            .total
            .deleted;
    }
    assert_eq!(deleted, 1, "the sweep deleted b");
    assert_eq!(get(&store, &b).await, None);
    assert_eq!(store.stat(&b).await.unwrap(), None);
    assert_eq!(engine.cache_usage().0, 0);
}
