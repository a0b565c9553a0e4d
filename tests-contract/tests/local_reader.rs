//! Verification through the facade over the local engine, whose
//! read-ahead thread hashes what it yields (the `digest` of a `BlobReader`):
//! files changed behind the engine's back must still fail the read.

use std::fs;
use std::path::PathBuf;

use bytes::Bytes;
use store_local::{LocalEngine, LocalOptions};
use store_types::{Error, Key, CHUNK_SIZE};
use tests_contract::data::content;
use tests_contract::ns_named;
use tokio::io::AsyncReadExt;

async fn open(root: &std::path::Path) -> LocalEngine {
    LocalEngine::open(root, LocalOptions::default())
        .await
        .unwrap()
}

/// `<root>/<ns>/<2 hex>/<digest>` (the engine's documented layout).
fn content_path(engine: &LocalEngine, key: &Key) -> PathBuf {
    engine
        .root()
        .join(key.namespace.as_str())
        .join(key.digest.prefix2())
        .join(key.digest.to_hex())
}

/// A store whose every non-empty entry lives in `engine`.
async fn facade(engine: &LocalEngine) -> store_core::Store {
    store_core::Store::builder()
        .kv(store_mem::MemEngine::new())
        .large(engine.clone())
        .mode(store_core::Mode::DualTier { threshold: 0 })
        .build()
        .await
        .unwrap()
}

/// What a verified get of `key` through `store` returns.
async fn facade_get(store: &store_core::Store, key: &Key) -> store_types::Result<Bytes> {
    let blob = store.get(key).await.unwrap().expect("entry present");
    assert!(blob.is_verified());
    blob.bytes().await
}

#[tokio::test]
async fn files_changed_behind_the_engine_fail_verification_through_the_facade() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let store = facade(&engine).await;
    let c = CHUNK_SIZE as u64;
    let len = 3 * CHUNK_SIZE + 777;
    // (name, new file length): cut and grown copies of the stored bytes.
    let damage: [(&str, u64); 6] = [
        ("truncated by one byte", len as u64 - 1),
        ("truncated to a chunk boundary", 2 * c),
        ("truncated to one chunk plus one", c + 1),
        ("truncated to one chunk", c),
        ("extended by one byte", len as u64 + 1),
        ("extended by a chunk", len as u64 + c),
    ];
    for (i, (what, new_len)) in damage.into_iter().enumerate() {
        let data = content(10 + i as u64, len);
        let receipt = store.put(&ns_named("a"), &data[..]).await.unwrap();
        let key = receipt.key().clone();
        assert_eq!(facade_get(&store, &key).await.unwrap(), data, "{what}");
        let path = content_path(&engine, &key);
        let file = fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(new_len).unwrap(); // Grown files read zeros at the end.
        drop(file);
        let err = facade_get(&store, &key).await.unwrap_err();
        assert!(
            matches!(err, Error::Verification { expected, .. } if expected == key.digest),
            "{what}: {err:?}"
        );
        // A range read, with no outboard cached or kept (at most 1 MiB,
        // TUNING.md §small-outboards), computes one from the damaged file: refused too.
        let err = match store.read_range(&key, 0..10).await {
            Ok(blob) => blob.bytes().await.unwrap_err(),
            Err(e) => e,
        };
        assert!(
            matches!(err, Error::Verification { expected, .. } if expected == key.digest),
            "{what}: range: {err:?}"
        );
    }
    // A flipped byte in a streamed entry.
    let data = content(20, len);
    let key = store
        .put(&ns_named("a"), &data[..])
        .await
        .unwrap()
        .key()
        .clone();
    engine.corrupt_one_byte(&key).await.unwrap();
    let err = facade_get(&store, &key).await.unwrap_err();
    assert!(
        matches!(err, Error::Verification { expected, .. } if expected == key.digest),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_file_truncated_during_a_read_fails_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let store = facade(&engine).await;
    let data = content(30, 16 * CHUNK_SIZE);
    let key = store
        .put(&ns_named("a"), &data[..])
        .await
        .unwrap()
        .key()
        .clone();
    let mut blob = store.get(&key).await.unwrap().unwrap();
    let mut first = vec![0u8; 100];
    blob.read_exact(&mut first).await.unwrap();
    // The task has opened the file and read at most a few chunks ahead.
    let file = fs::OpenOptions::new()
        .write(true)
        .open(content_path(&engine, &key))
        .unwrap();
    file.set_len(8 * CHUNK_SIZE as u64).unwrap();
    drop(file);
    let mut rest = Vec::new();
    let err = Error::from(blob.read_to_end(&mut rest).await.unwrap_err());
    // The task finds the file shorter than it was at open: an I/O error,
    // before any verdict on the content.
    assert!(matches!(err, Error::Io(_)), "{err:?}");
    assert_eq!(err.kind(), store_types::ErrorKind::InvalidData, "{err:?}");
    let chain = store_types::Report::new(&err).to_string();
    assert!(chain.contains("shorter"), "{chain}");
}
