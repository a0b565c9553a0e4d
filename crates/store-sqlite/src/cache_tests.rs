//! The hot-entry cache (TUNING.md §sqlite-hot-cache): hits without the reader pool, exact
//! invalidation by deletes (also from another engine on the same file, and
//! racing reads), `read_stored` past the cache, the size limits.

use std::path::Path;

use bytes::Bytes;
use store_types::EngineExt as _;
use store_types::{BlobReader, Digest, Engine, Key, KvEngine, Namespace};

use crate::cache::{Hot, HotCache};
use crate::{SqliteEngine, SqliteOptions};

async fn open(path: &Path, cache_bytes: u64) -> SqliteEngine {
    let options = SqliteOptions {
        cache_bytes,
        ..SqliteOptions::default()
    };
    SqliteEngine::open(path, options).await.unwrap()
}

fn key(data: &[u8]) -> Key {
    Key::new(Namespace::new("hot").unwrap(), Digest::of(data))
}

async fn put(engine: &SqliteEngine, data: &[u8]) -> Key {
    let k = key(data);
    engine.put(&k, Bytes::copy_from_slice(data)).await.unwrap();
    k
}

async fn read(engine: &SqliteEngine, k: &Key) -> Option<Vec<u8>> {
    let r = engine.read_whole(k).await.unwrap()?;
    let BlobReader::Bytes { bytes, .. } = r else {
        panic!("sqlite reads are in memory: {r:?}")
    };
    Some(bytes.to_vec())
}

/// Runs `sql` on `k`'s row (`?1` its namespace, `?2` its digest) behind
/// the engine's back, on another connection: it must touch that row.
fn behind(path: &Path, sql: &str, k: &Key) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    let n = conn
        .execute(sql, (k.namespace.as_str(), &k.digest.as_bytes()[..]))
        .unwrap();
    assert_eq!(n, 1);
}

/// Deletes `k`'s row behind the engine's back: only a cache can still
/// answer for it afterwards.
fn delete_behind(path: &Path, k: &Key) {
    behind(path, "DELETE FROM entries WHERE ns = ?1 AND digest = ?2", k);
}

#[tokio::test]
async fn a_read_entry_is_answered_from_the_cache_and_put_does_not_fill_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let e = open(&path, 1 << 20).await;
    let k = put(&e, b"hot bytes").await;
    assert_eq!(e.cache_usage().0, 0, "a put caches nothing");
    let meta = e.meta(&k).await.unwrap().unwrap();
    assert_eq!(e.cache_usage().0, 0, "meta caches nothing");
    assert_eq!(read(&e, &k).await.as_deref(), Some(&b"hot bytes"[..]));
    assert_eq!(e.cache_usage().0, 1);
    delete_behind(&path, &k);
    // Only the cache knows the entry now.
    assert_eq!(read(&e, &k).await.as_deref(), Some(&b"hot bytes"[..]));
    assert_eq!(e.meta(&k).await.unwrap(), Some(meta), "meta from the cache");
    let other = key(b"never stored");
    assert_eq!(
        e.has_many(&k.namespace, &[k.digest, other.digest])
            .await
            .unwrap(),
        vec![true, false]
    );
    let r = e.read_exact(&k, 4..9).await.unwrap().unwrap();
    assert!(
        matches!(&r, BlobReader::Bytes { bytes, .. } if &bytes[..] == b"bytes"),
        "{r:?}"
    );
    // `read_stored` reads the file.
    assert!(e.read_stored(&k).await.unwrap().is_none());
}

#[tokio::test]
async fn with_the_cache_off_every_read_goes_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let e = open(&path, 0).await;
    let k = put(&e, b"cold").await;
    assert_eq!(read(&e, &k).await.as_deref(), Some(&b"cold"[..]));
    assert_eq!(e.cache_usage(), (0, 0));
    delete_behind(&path, &k);
    assert_eq!(read(&e, &k).await, None);
    assert_eq!(e.meta(&k).await.unwrap(), None);
}

#[tokio::test]
async fn a_delete_removes_the_key_from_every_cache_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let a = open(&path, 1 << 20).await;
    let b = open(&path, 1 << 20).await;
    let off = open(&path, 0).await;
    let k = put(&a, b"shared").await;
    assert!(read(&a, &k).await.is_some());
    assert!(read(&b, &k).await.is_some());
    // An engine without a cache of its own still invalidates the others.
    assert_eq!(
        off.delete_many(&k.namespace, &[k.digest]).await.unwrap(),
        vec![Some(6)]
    );
    for e in [&a, &b] {
        assert_eq!(read(e, &k).await, None);
        assert_eq!(e.meta(&k).await.unwrap(), None);
        assert_eq!(
            e.has_many(&k.namespace, &[k.digest]).await.unwrap(),
            vec![false]
        );
        assert_eq!(e.cache_usage().0, 0);
    }
}

#[tokio::test]
async fn entries_above_the_size_limit_are_not_cached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    // 1 MiB of cache takes entries of at most 64 KiB.
    let e = open(&path, 1 << 20).await;
    let big = vec![7u8; (64 << 10) + 1];
    let small = vec![8u8; 64 << 10];
    let kb = put(&e, &big).await;
    let ks = put(&e, &small).await;
    assert!(read(&e, &kb).await.is_some());
    assert!(read(&e, &ks).await.is_some());
    assert_eq!(e.cache_usage().0, 1);
    delete_behind(&path, &kb);
    delete_behind(&path, &ks);
    assert_eq!(read(&e, &kb).await, None);
    assert!(read(&e, &ks).await.is_some());
}

/// The protocol step by step: a read whose query found the row before a
/// delete committed, offering it after the delete's invalidation, must not
/// insert it; one offering before the invalidation is removed by it.
#[test]
fn an_offer_racing_an_invalidation_never_outlives_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = HotCache::register(&dir.path().join("f"), 1 << 20);
    let k = key(b"racing");
    let hot = || Hot::read(Bytes::from_static(b"racing"), 6, 1);
    // Epoch loaded, query found the row; the delete commits and
    // invalidates; then the offer.
    let seen = cache.epoch();
    cache.invalidate(std::slice::from_ref(&k));
    cache.offer(&k, hot(), seen);
    assert!(cache.get(&k).is_none());
    // Offer first, invalidation after: removed.
    let seen = cache.epoch();
    cache.offer(&k, hot(), seen);
    assert!(cache.get(&k).is_some());
    cache.invalidate(std::slice::from_ref(&k));
    assert!(cache.get(&k).is_none());
}

/// Readers hammer a key while it is deleted: once `delete_many` has
/// returned, no read answers for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_read_after_a_delete_returns_sees_the_deleted_entry() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir.path().join("db.sqlite"), 1 << 20).await;
    for round in 0..200u32 {
        let data = round.to_le_bytes();
        let k = put(&e, &data).await;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (e, k, stop) = (e.clone(), k.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = e.read_whole(&k).await.unwrap();
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        tokio::task::yield_now().await;
        e.delete_many(&k.namespace, &[k.digest]).await.unwrap();
        for _ in 0..20 {
            assert!(
                read(&e, &k).await.is_none(),
                "round {round}: deleted entry read"
            );
            assert_eq!(e.meta(&k).await.unwrap(), None, "round {round}");
            tokio::task::yield_now().await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in readers {
            r.await.unwrap();
        }
        // And nothing the readers offered late stayed behind.
        assert!(
            read(&e, &k).await.is_none(),
            "round {round}: late offer kept"
        );
    }
}

/// Changes the first byte of `k`'s stored content behind the engine's
/// back, the row otherwise as it was.
fn corrupt_behind(path: &Path, k: &Key) {
    let sql = "UPDATE entries SET content = CAST(
                   (CASE WHEN substr(content, 1, 1) = x'00' THEN x'01' ELSE x'00' END)
                   || substr(content, 2) AS BLOB)
               WHERE ns = ?1 AND digest = ?2";
    behind(path, sql, k);
}

/// A whole read hands the facade the digest computed when the bytes were
/// read from the file, from the file and from the cache alike, so a hit
/// is not hashed again (ADR-080); a span carries none (the facade checks
/// ranges against the outboard).
#[tokio::test]
async fn whole_reads_carry_the_digest_of_their_bytes_and_spans_none() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir.path().join("db.sqlite"), 1 << 20).await;
    let k = put(&e, b"hashed once").await;
    for round in ["from the file", "from the cache"] {
        let r = e.read_whole(&k).await.unwrap().unwrap();
        assert!(
            matches!(&r, BlobReader::Bytes { bytes, digest: Some(d) }
                if &bytes[..] == b"hashed once" && *d == k.digest),
            "{round}: {r:?}"
        );
        assert_eq!(e.cache_usage().0, 1, "{round}");
    }
    let r = e.read_exact(&k, 0..6).await.unwrap().unwrap();
    assert!(
        matches!(&r, BlobReader::Bytes { bytes, digest: None } if &bytes[..] == b"hashed"),
        "{r:?}"
    );
}

/// A row whose bytes no longer hash to its key's digest is never cached:
/// every read of it goes to the file and hands the facade the digest of
/// what the file holds, which fails verification there.
#[tokio::test]
async fn a_corrupt_row_is_never_cached() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let e = open(&path, 1 << 20).await;
    let k = put(&e, b"soon corrupt").await;
    corrupt_behind(&path, &k);
    for _ in 0..2 {
        let r = e.read_whole(&k).await.unwrap().unwrap();
        let BlobReader::Bytes {
            bytes,
            digest: Some(d),
        } = &r
        else {
            panic!("a whole read carries its digest: {r:?}")
        };
        assert_ne!(&bytes[..], b"soon corrupt");
        assert_eq!(*d, Digest::of(bytes), "the digest of the bytes handed on");
        assert_ne!(*d, k.digest);
        assert_eq!(e.cache_usage().0, 0, "not cached");
    }
}

/// A row the cache cannot take (above its entry limit, or the cache off)
/// is not hashed by the engine: the facade hashes it as it streams, on
/// several cores when it is large, as before ADR-080.
#[tokio::test]
async fn rows_the_cache_cannot_take_carry_no_digest() {
    let dir = tempfile::tempdir().unwrap();
    // 1 MiB of cache: entries up to 64 KiB.
    let e = open(&dir.path().join("on.sqlite"), 1 << 20).await;
    let big = vec![7u8; 100 * 1024];
    let k = put(&e, &big).await;
    let r = e.read_whole(&k).await.unwrap().unwrap();
    assert!(
        matches!(&r, BlobReader::Bytes { bytes, digest: None } if bytes.len() == big.len()),
        "{r:?}"
    );
    assert_eq!(e.cache_usage().0, 0);
    let off = open(&dir.path().join("off.sqlite"), 0).await;
    let k = put(&off, b"small, cache off").await;
    let r = off.read_whole(&k).await.unwrap().unwrap();
    assert!(
        matches!(&r, BlobReader::Bytes { digest: None, .. }),
        "{r:?}"
    );
}
