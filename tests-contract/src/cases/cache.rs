//! Cache keys at the engine level (issue 31, ADR-048): the [`CacheIndex`]
//! a composite's kv engine answers `KvEngine::cache` with.
//!
//! Every kv engine of the suite holds cache keys; a composite whose kv
//! engine holds none fails these cases. Engines with a clock of their own
//! (PostgreSQL) use it instead of the `now` given, so the cases pass real
//! clock readings and sleep between accesses that must be ordered.

use std::sync::Arc;
use std::time::Duration;

use store_types::{CacheBounds, CacheIndex, CacheTrim, Digest, Namespace, RefName, Timestamp};

use crate::harness::{ns, Harness, Spec};

async fn open(spec: Spec) -> (Harness, Arc<dyn CacheIndex>) {
    let h = Harness::open(spec).await;
    let cache = h
        .kv_cache()
        .unwrap_or_else(|| panic!("{}: the kv engine holds no cache keys", spec.name));
    (h, cache)
}

fn key(s: &str) -> RefName {
    RefName::new(s).expect("valid key")
}

fn d(i: u64) -> Digest {
    Digest::of(&i.to_le_bytes())
}

fn other_ns() -> Namespace {
    Namespace::new("contract-cache-other").expect("valid")
}

/// A pause long enough that the next clock reading (any engine's) is later.
async fn tick() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

/// `record`, `lookup`, `remove` with and without an expected digest, and a
/// record replacing a key's digest.
pub async fn cache_record_lookup_remove(spec: Spec) {
    let (_h, c) = open(spec).await;
    let n = ns();
    let k = key("ac/0123");
    assert_eq!(c.lookup(&n, &k).await.unwrap(), None);
    c.record(&n, &k, d(1), 10, Timestamp::now()).await.unwrap();
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(d(1)));
    assert_eq!(c.lookup(&other_ns(), &k).await.unwrap(), None);
    c.record(&n, &k, d(2), 20, Timestamp::now()).await.unwrap();
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(d(2)));
    assert!(
        !c.remove(&n, &k, Some(d(1))).await.unwrap(),
        "wrong expectation removes nothing"
    );
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(d(2)));
    assert!(c.remove(&n, &k, Some(d(2))).await.unwrap());
    assert_eq!(c.lookup(&n, &k).await.unwrap(), None);
    assert!(!c.remove(&n, &k, None).await.unwrap());
    c.record(&n, &k, d(3), 1, Timestamp::now()).await.unwrap();
    assert!(c.remove(&n, &k, None).await.unwrap());
}

/// `cached` answers per digest, per namespace; `usage` sums per namespace.
pub async fn cache_cached_and_usage(spec: Spec) {
    let (_h, c) = open(spec).await;
    let n = ns();
    let now = Timestamp::now();
    c.record(&n, &key("a"), d(1), 100, now).await.unwrap();
    c.record(&n, &key("b"), d(1), 100, now).await.unwrap();
    c.record(&n, &key("c"), d(2), 5, now).await.unwrap();
    c.record(&other_ns(), &key("a"), d(3), 7, now)
        .await
        .unwrap();
    assert_eq!(
        c.cached(&n, &[d(1), d(3), d(2), d(4)]).await.unwrap(),
        [true, false, true, false]
    );
    assert_eq!(c.cached(&n, &[]).await.unwrap(), Vec::<bool>::new());
    let usage = c.usage().await.unwrap();
    let of = |ns: &Namespace| usage.iter().find(|(m, _)| m == ns).map(|(_, u)| *u);
    let u = of(&n).expect("usage of the namespace");
    assert_eq!((u.keys, u.bytes), (3, 205));
    let o = of(&other_ns()).expect("usage of the other namespace");
    assert_eq!((o.keys, o.bytes), (1, 7));
}

/// `touch` moves access times forward only and never creates keys; the
/// byte bound removes the least recently accessed keys first.
pub async fn cache_trim_bytes_least_recent_first(spec: Spec) {
    let (_h, c) = open(spec).await;
    let n = ns();
    for (i, k) in ["k1", "k2", "k3"].iter().enumerate() {
        c.record(&n, &key(k), d(i as u64), 10, Timestamp::now())
            .await
            .unwrap();
        tick().await;
    }
    // k1 is read again: now k2 is the least recently accessed.
    assert_eq!(
        c.touch(&n, &[d(0), d(9)], Timestamp::now()).await.unwrap(),
        1
    );
    assert_eq!(
        c.lookup(&n, &key("k9")).await.unwrap(),
        None,
        "touch creates nothing"
    );
    let unbounded = c
        .trim(&n, CacheBounds::default(), Timestamp::now())
        .await
        .unwrap();
    assert_eq!(unbounded, CacheTrim::default());
    let bound = CacheBounds {
        max_bytes: Some(25),
        max_age: None,
    };
    let t = c.trim(&n, bound, Timestamp::now()).await.unwrap();
    assert_eq!(t, CacheTrim { keys: 1, bytes: 10 });
    assert_eq!(
        c.lookup(&n, &key("k2")).await.unwrap(),
        None,
        "least recent goes"
    );
    assert!(
        c.lookup(&n, &key("k1")).await.unwrap().is_some(),
        "touched stays"
    );
    assert!(
        c.lookup(&n, &key("k3")).await.unwrap().is_some(),
        "newest stays"
    );
    assert_eq!(c.cached(&n, &[d(1)]).await.unwrap(), [false]);
    // Within the bound: nothing more goes.
    let again = c.trim(&n, bound, Timestamp::now()).await.unwrap();
    assert_eq!(again, CacheTrim::default());
    // A bound of zero bytes empties the namespace, not the others.
    c.record(&other_ns(), &key("k1"), d(0), 10, Timestamp::now())
        .await
        .unwrap();
    let zero = CacheBounds {
        max_bytes: Some(0),
        max_age: None,
    };
    let all = c.trim(&n, zero, Timestamp::now()).await.unwrap();
    assert_eq!(all, CacheTrim { keys: 2, bytes: 20 });
    assert_eq!(c.lookup(&other_ns(), &key("k1")).await.unwrap(), Some(d(0)));
}

/// The age bound counts from the last access, not from the record.
pub async fn cache_trim_age_counts_from_last_access(spec: Spec) {
    let (_h, c) = open(spec).await;
    let n = ns();
    c.record(&n, &key("old"), d(1), 1, Timestamp::now())
        .await
        .unwrap();
    c.record(&n, &key("read"), d(2), 1, Timestamp::now())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    c.touch(&n, &[d(2)], Timestamp::now()).await.unwrap();
    c.record(&n, &key("new"), d(3), 1, Timestamp::now())
        .await
        .unwrap();
    let bound = CacheBounds {
        max_bytes: None,
        max_age: Some(Duration::from_millis(300)),
    };
    let t = c.trim(&n, bound, Timestamp::now()).await.unwrap();
    assert_eq!(t, CacheTrim { keys: 1, bytes: 1 });
    assert_eq!(c.lookup(&n, &key("old")).await.unwrap(), None);
    assert_eq!(c.lookup(&n, &key("read")).await.unwrap(), Some(d(2)));
    assert_eq!(c.lookup(&n, &key("new")).await.unwrap(), Some(d(3)));
}

/// The byte bound removes keys strictly from the least recently accessed
/// end: once a key does not fit, no older key is kept, even one small
/// enough to fit in what is left (the bound never keeps a key accessed
/// before one it removed).
pub async fn cache_trim_bytes_keeps_no_key_older_than_a_removed_one(spec: Spec) {
    let (_h, c) = open(spec).await;
    let n = ns();
    // Oldest first: a small key, a large one, then the newest.
    for (i, (k, size)) in [("old", 5), ("mid", 20), ("new", 10)].iter().enumerate() {
        c.record(&n, &key(k), d(i as u64), *size, Timestamp::now())
            .await
            .unwrap();
        tick().await;
    }
    let bound = CacheBounds {
        max_bytes: Some(25),
        max_age: None,
    };
    let t = c.trim(&n, bound, Timestamp::now()).await.unwrap();
    assert_eq!(
        t,
        CacheTrim { keys: 2, bytes: 25 },
        "the large key does not fit, and the small key is older than it"
    );
    assert_eq!(c.lookup(&n, &key("new")).await.unwrap(), Some(d(2)));
    assert_eq!(c.lookup(&n, &key("mid")).await.unwrap(), None);
    assert_eq!(c.lookup(&n, &key("old")).await.unwrap(), None);
}
