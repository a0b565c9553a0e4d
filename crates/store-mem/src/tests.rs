//! Engine-specific behaviour of `mem`; the generic put/get semantics are
//! covered by the workspace contract suite.

use bytes::Bytes;
use store_types::EngineExt as _;
use store_types::{Digest, Engine, Key, KvEngine, LargeEngine, Namespace, PublishOutcome};
use tokio::io::AsyncReadExt;

use crate::MemEngine;

fn ns(name: &str) -> Namespace {
    Namespace::new(name).unwrap()
}

fn key_of(ns_name: &str, data: &[u8]) -> Key {
    Key::new(ns(ns_name), Digest::of(data))
}

async fn read_all(engine: &MemEngine, key: &Key) -> Option<Vec<u8>> {
    let blob = engine.read_whole(key).await.unwrap()?;
    let mut out = Vec::new();
    let blob_len = blob.len();
    blob.into_stream()
        .reader
        .read_to_end(&mut out)
        .await
        .unwrap();
    assert_eq!(out.len() as u64, blob_len);
    Some(out)
}

#[tokio::test]
async fn staged_bytes_are_invisible_until_publish() {
    let engine = MemEngine::new();
    let key = key_of("a", b"hello world");
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    stage.write(Bytes::from_static(b"hello ")).await.unwrap();
    stage.write(Bytes::new()).await.unwrap();
    stage.write(Bytes::from_static(b"world")).await.unwrap();

    assert_eq!(engine.meta(&key).await.unwrap(), None);
    assert_eq!(
        engine
            .has_many(&key.namespace, &[key.digest])
            .await
            .unwrap(),
        [false]
    );
    assert!(engine.namespaces().await.unwrap().is_empty());
    assert!(engine
        .scan(&key.namespace, None, 10)
        .await
        .unwrap()
        .is_empty());

    assert_eq!(stage.publish(&key).await.unwrap(), PublishOutcome::Inserted);
    assert_eq!(read_all(&engine, &key).await.unwrap(), b"hello world");
    assert_eq!(engine.meta(&key).await.unwrap().unwrap().size, 11);
}

#[tokio::test]
async fn aborted_and_dropped_stages_leave_nothing() {
    let engine = MemEngine::new();
    let key = key_of("a", b"x");
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    stage.write(Bytes::from_static(b"x")).await.unwrap();
    stage.abort().await.unwrap();
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    stage.write(Bytes::from_static(b"x")).await.unwrap();
    drop(stage);
    assert_eq!(engine.meta(&key).await.unwrap(), None);
    assert!(engine.namespaces().await.unwrap().is_empty());
}

#[tokio::test]
async fn second_publish_of_a_key_is_already_present() {
    let engine = MemEngine::new();
    let key = key_of("a", b"same");
    let mut one = engine.stage(&key.namespace).await.unwrap();
    let mut two = engine.stage(&key.namespace).await.unwrap();
    one.write(Bytes::from_static(b"same")).await.unwrap();
    two.write(Bytes::from_static(b"same")).await.unwrap();
    assert_eq!(one.publish(&key).await.unwrap(), PublishOutcome::Inserted);
    assert_eq!(
        two.publish(&key).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
    assert_eq!(
        engine.put(&key, Bytes::from_static(b"same")).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
}

#[tokio::test]
async fn publish_into_another_namespace_is_refused() {
    let engine = MemEngine::new();
    let mut stage = engine.stage(&ns("a")).await.unwrap();
    stage.write(Bytes::from_static(b"x")).await.unwrap();
    let err = stage.publish(&key_of("b", b"x")).await.unwrap_err();
    assert!(matches!(err, store_types::Error::KeyInvalid(_)), "{err}");
    assert!(engine.namespaces().await.unwrap().is_empty());
}

#[tokio::test]
async fn instances_are_independent_and_clones_share() {
    let one = MemEngine::new();
    let two = MemEngine::new();
    let key = key_of("a", b"1");
    one.put(&key, Bytes::from_static(b"1")).await.unwrap();
    assert!(one.clone().meta(&key).await.unwrap().is_some());
    assert!(two.meta(&key).await.unwrap().is_none());
}

#[tokio::test]
async fn scan_pages_in_digest_order_and_empty_namespaces_vanish() {
    let engine = MemEngine::new();
    let mut digests = Vec::new();
    for i in 0..25u32 {
        let data = i.to_le_bytes();
        let key = key_of("n", &data);
        engine
            .put(&key, Bytes::copy_from_slice(&data))
            .await
            .unwrap();
        digests.push(key.digest);
    }
    digests.sort();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = engine.scan(&ns("n"), after, 7).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.iter().all(|(_, size)| *size == 4));
        after = page.last().map(|(d, _)| *d);
        seen.extend(page.into_iter().map(|(d, _)| d));
    }
    assert_eq!(seen, digests);
    assert_eq!(engine.namespaces().await.unwrap(), [ns("n")]);

    let freed = engine.delete_many(&ns("n"), &digests).await.unwrap();
    assert!(freed.iter().all(|f| *f == Some(4)));
    assert!(engine.namespaces().await.unwrap().is_empty());
    let again = engine.delete_many(&ns("n"), &digests[..2]).await.unwrap();
    assert_eq!(again, [None, None]);
}

#[tokio::test]
async fn read_range_slices_the_content() {
    let engine = MemEngine::new();
    let key = key_of("a", b"0123456789");
    engine
        .put(&key, Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    let blob = engine.read_exact(&key, 2..5).await.unwrap().unwrap();
    let mut out = Vec::new();
    let blob_len = blob.len();
    blob.into_stream()
        .reader
        .read_to_end(&mut out)
        .await
        .unwrap();
    assert_eq!((blob_len, out.as_slice()), (3, &b"234"[..]));
    assert!(engine
        .read_exact(&key_of("a", b"none"), 0..0)
        .await
        .unwrap()
        .is_none());
}

#[cfg(feature = "testing")]
#[tokio::test]
async fn corrupt_one_byte_changes_the_content() {
    let engine = MemEngine::new();
    for data in [&b"abc"[..], &b""[..]] {
        let key = key_of("a", data);
        engine
            .put(&key, Bytes::copy_from_slice(data))
            .await
            .unwrap();
        engine.corrupt_one_byte(&key).unwrap();
        let stored = read_all(&engine, &key).await.unwrap();
        assert_ne!(Digest::of(&stored), key.digest);
    }
    assert_eq!(
        engine.corrupt_one_byte(&key_of("a", b"absent")),
        Err(store_types::Error::Missing)
    );
}

#[tokio::test]
async fn references_are_shared_by_clones_only() {
    use store_types::{RefExpect, RefName};
    let engine = MemEngine::new();
    let clone = engine.clone();
    let other = MemEngine::new();
    let name = RefName::new("builds/app").unwrap();
    let d = Digest::of(b"x");
    let refs = engine.refs().expect("mem holds references");
    assert_eq!(
        refs.set(&ns("a"), &name, d, RefExpect::Absent)
            .await
            .unwrap(),
        None
    );
    // A set marks nothing by itself (ADR-045): the facade marks after it.
    assert!(refs.ref_namespaces().await.unwrap().is_empty());
    assert!(refs.mark_uses_refs(&ns("a")).await.unwrap());
    assert!(!refs.mark_uses_refs(&ns("a")).await.unwrap());
    let seen = clone.refs().unwrap();
    assert_eq!(seen.get(&ns("a"), &name).await.unwrap(), Some(d));
    assert_eq!(seen.ref_namespaces().await.unwrap(), vec![ns("a")]);
    let apart = other.refs().unwrap();
    assert_eq!(apart.get(&ns("a"), &name).await.unwrap(), None);
    assert!(apart.ref_namespaces().await.unwrap().is_empty());
}

#[tokio::test]
async fn reverse_counts_follow_moves_and_deletes() {
    use store_types::{Author, RefExpect, RefName};
    let refs = MemEngine::new().refs().unwrap();
    let (x, y) = (Digest::of(b"x"), Digest::of(b"y"));
    let (one, two) = (RefName::new("one").unwrap(), RefName::new("two").unwrap());
    refs.set(&ns("a"), &one, x, RefExpect::Any).await.unwrap();
    refs.set(&ns("a"), &two, x, RefExpect::Any).await.unwrap();
    assert_eq!(
        refs.referenced(&ns("a"), &[x, y]).await.unwrap(),
        [true, false]
    );
    // Re-pointing one of two references keeps x referenced.
    refs.set(&ns("a"), &one, y, RefExpect::Digest(x))
        .await
        .unwrap();
    assert_eq!(
        refs.referenced(&ns("a"), &[x, y]).await.unwrap(),
        [true, true]
    );
    // Setting a reference to what it already holds changes no count.
    refs.set(&ns("a"), &one, y, RefExpect::Any).await.unwrap();
    refs.delete(&ns("a"), &two, RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    assert_eq!(
        refs.referenced(&ns("a"), &[x, y]).await.unwrap(),
        [false, true]
    );
    refs.delete(&ns("a"), &one, RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    assert_eq!(
        refs.referenced(&ns("a"), &[x, y]).await.unwrap(),
        [false, false]
    );
    assert!(
        !refs.uses_refs(&ns("a")).await.unwrap(),
        "only the facade marks"
    );
    assert_eq!(refs.referenced(&ns("b"), &[x]).await.unwrap(), [false]);
}
