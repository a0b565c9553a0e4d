//! Cache-key reads through a store on SQLite (ADR-073): a remembered key
//! asks the database nothing until a write through the store forgets it,
//! and the reads noted between two writes are written once per digest, at
//! the latest read's time, in one job per noted time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use store_core::{ManualClock, Store};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Namespace, RefName, Timestamp};

fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

fn key(s: &str) -> RefName {
    RefName::new(s).unwrap()
}

async fn open(dir: &Path) -> (SqliteEngine, Store, ManualClock) {
    let engine = SqliteEngine::open(dir.join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let clock = ManualClock::new(Timestamp(1_000_000));
    let store = Store::builder()
        .kv(engine.clone())
        .clock(Arc::new(clock.clone()))
        .build()
        .await
        .unwrap();
    (engine, store, clock)
}

/// Queries the engine's readers ran (inline or where they may wait).
fn queries(e: &SqliteEngine) -> u64 {
    let p = e.read_path();
    p.inline + p.pooled
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_key_asks_the_database_nothing_until_a_write_forgets_it() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, store, _clock) = open(dir.path()).await;
    let cache = store.cache().expect("sqlite holds cache keys");
    let (n, k) = (ns("cc"), key("k"));
    let one = cache.put(&n, &k, Bytes::from_static(b"one")).await.unwrap();
    // The record forgot the key: this lookup asks, and remembers.
    assert_eq!(cache.lookup(&n, &k).await.unwrap(), Some(one));
    let before = queries(&engine);
    for _ in 0..100 {
        assert_eq!(cache.lookup(&n, &k).await.unwrap(), Some(one));
    }
    assert_eq!(queries(&engine), before, "a remembered key is not queried");
    // A record through the store: the next lookup asks, and sees it.
    let two = cache.put(&n, &k, Bytes::from_static(b"two")).await.unwrap();
    assert_eq!(cache.lookup(&n, &k).await.unwrap(), Some(two));
    assert!(queries(&engine) > before);
    // A removal: gone at once.
    assert!(cache.remove(&n, &k, None).await.unwrap());
    assert_eq!(cache.lookup(&n, &k).await.unwrap(), None);
    assert_eq!(cache.get(&n, &k).await.unwrap().map(|(d, _)| d), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_many_asks_the_database_once_for_the_keys_not_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, store, _clock) = open(dir.path()).await;
    let cache = store.cache().expect("sqlite holds cache keys");
    let n = ns("cc");
    let keys: Vec<RefName> = (0..300).map(|i| key(&format!("cas/{i}"))).collect();
    let mut want = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let d = (i % 3 != 0).then(|| Bytes::from(format!("body {i}")));
        want.push(match d {
            Some(b) => Some(cache.put(&n, k, b).await.unwrap()),
            None => None,
        });
    }
    let before = queries(&engine);
    assert_eq!(cache.lookup_many(&n, &keys).await.unwrap(), want);
    assert_eq!(
        queries(&engine),
        before + 1,
        "one query for the whole batch"
    );
    // The present keys are remembered now; only the absent ones are asked.
    assert_eq!(cache.lookup_many(&n, &keys).await.unwrap(), want);
    assert_eq!(queries(&engine), before + 2);
    let present: Vec<RefName> = (keys.iter().zip(&want))
        .filter(|(_, w)| w.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    assert_eq!(cache.lookup_many(&n, &present).await.unwrap().len(), 200);
    assert_eq!(
        queries(&engine),
        before + 2,
        "remembered keys are not queried"
    );
    // A write through the store forgets the key: the batch sees it.
    let replaced = cache
        .put(&n, &keys[1], Bytes::from_static(b"new"))
        .await
        .unwrap();
    let got = cache.lookup_many(&n, &keys[..3]).await.unwrap();
    assert_eq!(got, vec![None, Some(replaced), want[2]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reads_of_a_period_are_written_once_per_digest_at_the_latest_read() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, store, clock) = open(dir.path()).await;
    let cache = store.cache().expect("sqlite holds cache keys");
    // Within ACCESS_FLUSH_EVERY of the reads below, so no read starts a
    // background write of its own (which would race the count).
    clock.set(Timestamp(1_999_000));
    let n = ns("cc");
    let one = cache
        .put(&n, &key("k1"), Bytes::from_static(b"one"))
        .await
        .unwrap();
    let same = cache
        .put(&n, &key("k3"), Bytes::from_static(b"one"))
        .await
        .unwrap();
    assert_eq!(one, same);
    cache
        .put(&n, &key("k2"), Bytes::from_static(b"two"))
        .await
        .unwrap();
    cache.flush_access().await.unwrap();
    // k1 read in three steps (100 ms each), k3 (the same digest) and k2
    // in the last.
    clock.set(Timestamp(2_000_000));
    cache.lookup(&n, &key("k1")).await.unwrap();
    clock.advance(Duration::from_millis(150));
    cache.lookup(&n, &key("k1")).await.unwrap();
    clock.advance(Duration::from_millis(330));
    for k in ["k1", "k1", "k3", "k2"] {
        cache.lookup(&n, &key(k)).await.unwrap();
    }
    let writes = engine.stats().writes_committed;
    cache.flush_access().await.unwrap();
    // Both digests were last read in the same step: one touch job, not
    // one per step each was read in.
    assert_eq!(engine.stats().writes_committed - writes, 1);
    let db = rusqlite::Connection::open(dir.path().join("kv.sqlite")).unwrap();
    let mut stmt = db
        .prepare("SELECT key, accessed_at FROM cache_keys ORDER BY key")
        .unwrap();
    let rows: Vec<(String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let at = 2_000_400; // 2_000_480 rounded down to the step
    assert_eq!(
        rows,
        [("k1".into(), at), ("k2".into(), at), ("k3".into(), at)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_within_a_second_of_its_write_is_not_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, store, clock) = open(dir.path()).await;
    let cache = store.cache().expect("sqlite holds cache keys");
    clock.set(Timestamp(1_999_000));
    let n = ns("cc");
    let d = (cache.put(&n, &key("k"), Bytes::from_static(b"one")).await).unwrap();
    cache.flush_access().await.unwrap();
    let flush = || async {
        let before = engine.stats().writes_committed;
        cache.flush_access().await.unwrap();
        engine.stats().writes_committed - before
    };
    clock.set(Timestamp(2_000_000));
    cache.note_access(&n, d);
    assert_eq!(flush().await, 1, "the first read is written");
    // Within ACCESS_REWRITE_AFTER of that write: noted as already written.
    clock.advance(store_core::ACCESS_REWRITE_AFTER / 2);
    cache.note_access(&n, d);
    assert_eq!(flush().await, 0, "a read just written is not written again");
    clock.advance(store_core::ACCESS_REWRITE_AFTER);
    cache.note_access(&n, d);
    assert_eq!(flush().await, 1, "past it, the read is written");
}
