//! Cache keys at the engine level (issue 31, ADR-048): the [`CacheIndex`]
//! a composite's kv engine answers `KvEngine::cache` with.
//!
//! Every kv engine of the suite holds cache keys; a composite whose kv
//! engine holds none fails these cases. Engines with a clock of their own
//! (PostgreSQL) use it instead of the `now` given, so the cases pass real
//! clock readings and sleep between accesses that must be ordered.

use std::sync::Arc;
use std::time::Duration;

use store_core::CacheTrimmer;
use store_types::{
    Author, CacheBounds, CacheIndex, CacheTrim, Digest, Error, Namespace, RefExpect, RefName,
    Replace, Timestamp,
};

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
    c.record(
        &n,
        &k,
        d(1),
        10,
        Timestamp::now(),
        RefExpect::Any,
        Author::LIBRARY,
    )
    .await
    .unwrap();
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(d(1)));
    assert_eq!(c.lookup(&other_ns(), &k).await.unwrap(), None);
    c.record(
        &n,
        &k,
        d(2),
        20,
        Timestamp::now(),
        RefExpect::Any,
        Author::LIBRARY,
    )
    .await
    .unwrap();
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(d(2)));
    assert!(
        !c.remove(&n, &k, Some(d(1))).await.unwrap(),
        "wrong expectation removes nothing"
    );
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(d(2)));
    assert!(c.remove(&n, &k, Some(d(2))).await.unwrap());
    assert_eq!(c.lookup(&n, &k).await.unwrap(), None);
    assert!(!c.remove(&n, &k, None).await.unwrap());
    c.record(
        &n,
        &k,
        d(3),
        1,
        Timestamp::now(),
        RefExpect::Any,
        Author::LIBRARY,
    )
    .await
    .unwrap();
    assert!(c.remove(&n, &k, None).await.unwrap());
}

/// `lookup_many` answers each key as `lookup` would, in the order asked:
/// absent keys, a key of another namespace, a key asked twice, a batch
/// larger than any one statement's parameters, and no keys at all.
pub async fn cache_lookup_many(spec: Spec) {
    let (_h, c) = open(spec).await;
    let n = ns();
    assert!(c.lookup_many(&n, &[]).await.unwrap().is_empty());
    let now = Timestamp::now();
    for i in (0..1200u64).step_by(2) {
        let k = key(&format!("cas/{i:04}"));
        (c.record(&n, &k, d(i), 1, now, RefExpect::Any, Author::LIBRARY)
            .await)
            .unwrap();
    }
    let elsewhere = key("cas/elsewhere");
    (c.record(
        &other_ns(),
        &elsewhere,
        d(7),
        1,
        now,
        RefExpect::Any,
        Author::LIBRARY,
    )
    .await)
        .unwrap();
    let mut asked: Vec<RefName> = (0..1200u64).map(|i| key(&format!("cas/{i:04}"))).collect();
    asked.extend([elsewhere.clone(), key("cas/0002"), key("cas/0003")]);
    let found = c.lookup_many(&n, &asked).await.unwrap();
    assert_eq!(found.len(), asked.len());
    for (i, got) in found.iter().take(1200).enumerate() {
        let want = (i % 2 == 0).then(|| d(i as u64));
        assert_eq!(*got, want, "{}: key {i}", spec.name);
    }
    assert_eq!(found[1200], None, "another namespace's key");
    assert_eq!(found[1201], Some(d(2)), "a key asked twice");
    assert_eq!(found[1202], None, "an absent key asked twice");
    let one = c.lookup_many(&other_ns(), &[elsewhere]).await.unwrap();
    assert_eq!(one, vec![Some(d(7))]);
}

/// `cached` answers per digest, per namespace; `usage` sums per namespace.
pub async fn cache_cached_and_usage(spec: Spec) {
    let (_h, c) = open(spec).await;
    let n = ns();
    let now = Timestamp::now();
    c.record(
        &n,
        &key("a"),
        d(1),
        100,
        now,
        RefExpect::Any,
        Author::LIBRARY,
    )
    .await
    .unwrap();
    c.record(
        &n,
        &key("b"),
        d(1),
        100,
        now,
        RefExpect::Any,
        Author::LIBRARY,
    )
    .await
    .unwrap();
    c.record(&n, &key("c"), d(2), 5, now, RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    c.record(
        &other_ns(),
        &key("a"),
        d(3),
        7,
        now,
        RefExpect::Any,
        Author::LIBRARY,
    )
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
        c.record(
            &n,
            &key(k),
            d(i as u64),
            10,
            Timestamp::now(),
            RefExpect::Any,
            Author::LIBRARY,
        )
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
    c.record(
        &other_ns(),
        &key("k1"),
        d(0),
        10,
        Timestamp::now(),
        RefExpect::Any,
        Author::LIBRARY,
    )
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
    c.record(
        &n,
        &key("old"),
        d(1),
        1,
        Timestamp::now(),
        RefExpect::Any,
        Author::LIBRARY,
    )
    .await
    .unwrap();
    c.record(
        &n,
        &key("read"),
        d(2),
        1,
        Timestamp::now(),
        RefExpect::Any,
        Author::LIBRARY,
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    c.touch(&n, &[d(2)], Timestamp::now()).await.unwrap();
    c.record(
        &n,
        &key("new"),
        d(3),
        1,
        Timestamp::now(),
        RefExpect::Any,
        Author::LIBRARY,
    )
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
        c.record(
            &n,
            &key(k),
            d(i as u64),
            *size,
            Timestamp::now(),
            RefExpect::Any,
            Author::LIBRARY,
        )
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

/// A writer that may replace only its own keys (`Replace::Own`, the
/// `write` scope).
fn writer(name: &'static str) -> Author<'static> {
    Author {
        name: Some(name),
        may: Replace::Own,
    }
}

#[track_caller]
fn assert_conflict<T: std::fmt::Debug>(
    r: store_types::Result<T>,
    k: &RefName,
    current: Option<Digest>,
) {
    match r {
        Err(Error::RefConflict { name, current: c }) => {
            assert_eq!(name, k.as_str());
            assert_eq!(c, current, "the conflict reports the key's digest");
        }
        other => panic!("expected RefConflict on {k}, got {other:?}"),
    }
}

#[track_caller]
fn assert_not_owner<T: std::fmt::Debug>(
    r: store_types::Result<T>,
    k: &RefName,
    current: Digest,
    write_once: bool,
) {
    match r {
        Err(Error::NotOwner {
            name,
            current: c,
            write_once: w,
        }) => {
            assert_eq!(name, k.as_str());
            assert_eq!(c, current, "the refusal reports the key's digest");
            assert_eq!(w, write_once);
        }
        other => panic!("expected NotOwner on {k}, got {other:?}"),
    }
}

/// `record`'s precondition (issue 39): `Absent` creates only
/// (If-None-Match: *), `Digest` requires the key to hold it (If-Match),
/// `Any` none; a failed one changes nothing; `record` answers the digest
/// the key held.
pub async fn cache_record_preconditions(spec: Spec) {
    let (_h, c) = open(spec).await;
    let (n, k) = (ns(), key("ac/pre"));
    let lib = Author::LIBRARY;
    let now = Timestamp::now;
    assert_conflict(
        c.record(&n, &k, d(1), 1, now(), RefExpect::Digest(d(1)), lib)
            .await,
        &k,
        None,
    );
    assert_eq!(c.lookup(&n, &k).await.unwrap(), None);
    assert_eq!(
        c.record(&n, &k, d(1), 1, now(), RefExpect::Absent, lib)
            .await
            .unwrap(),
        None
    );
    assert_conflict(
        c.record(&n, &k, d(2), 1, now(), RefExpect::Absent, lib)
            .await,
        &k,
        Some(d(1)),
    );
    assert_conflict(
        c.record(&n, &k, d(1), 1, now(), RefExpect::Absent, lib)
            .await,
        &k,
        Some(d(1)),
    );
    assert_conflict(
        c.record(&n, &k, d(2), 1, now(), RefExpect::Digest(d(3)), lib)
            .await,
        &k,
        Some(d(1)),
    );
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(d(1)));
    assert_eq!(c.cached(&n, &[d(2)]).await.unwrap(), [false]);
    assert_eq!(
        c.record(&n, &k, d(2), 7, now(), RefExpect::Digest(d(1)), lib)
            .await
            .unwrap(),
        Some(d(1))
    );
    assert_eq!(
        c.record(&n, &k, d(3), 9, now(), RefExpect::Any, lib)
            .await
            .unwrap(),
        Some(d(2))
    );
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(d(3)));
    let usage = c.usage().await.unwrap();
    let u = usage.iter().find(|(m, _)| *m == n).expect("usage").1;
    assert_eq!((u.keys, u.bytes), (1, 9), "a replace takes the new size");
}

/// Owners (issue 39): a write-only author adds keys but replaces only its
/// own; recording the digest a key holds is allowed to anyone, keeps the
/// owner and still moves the access time forward; `Replace::Any`
/// replaces anything; `Replace::Nothing` never replaces.
pub async fn cache_record_owners(spec: Spec) {
    let (_h, c) = open(spec).await;
    let n = ns();
    let (a, b) = (writer("a"), writer("b"));
    let (k1, k2) = (key("ac/one"), key("ac/two"));
    assert_eq!(
        c.record(&n, &k1, d(1), 10, Timestamp::now(), RefExpect::Any, a)
            .await
            .unwrap(),
        None
    );
    tick().await;
    c.record(&n, &k2, d(2), 10, Timestamp::now(), RefExpect::Any, a)
        .await
        .unwrap();
    tick().await;
    // b cannot replace a's key; nothing changes.
    assert_not_owner(
        c.record(&n, &k1, d(3), 10, Timestamp::now(), RefExpect::Any, b)
            .await,
        &k1,
        d(1),
        false,
    );
    assert_not_owner(
        c.record(
            &n,
            &k1,
            d(3),
            10,
            Timestamp::now(),
            RefExpect::Digest(d(1)),
            b,
        )
        .await,
        &k1,
        d(1),
        false,
    );
    assert_eq!(c.lookup(&n, &k1).await.unwrap(), Some(d(1)));
    assert_eq!(c.cached(&n, &[d(3)]).await.unwrap(), [false]);
    // The precondition comes first.
    assert_conflict(
        c.record(&n, &k1, d(3), 10, Timestamp::now(), RefExpect::Absent, b)
            .await,
        &k1,
        Some(d(1)),
    );
    // b records the digest k1 holds: allowed, and k1 is now the most
    // recently accessed key (a byte bound of one key keeps it, not k2).
    assert_eq!(
        c.record(&n, &k1, d(1), 10, Timestamp::now(), RefExpect::Any, b)
            .await
            .unwrap(),
        Some(d(1))
    );
    tick().await;
    let one_key = CacheBounds {
        max_bytes: Some(10),
        max_age: None,
    };
    let t = c.trim(&n, one_key, Timestamp::now()).await.unwrap();
    assert_eq!(t, CacheTrim { keys: 1, bytes: 10 });
    assert_eq!(c.lookup(&n, &k2).await.unwrap(), None);
    assert_eq!(c.lookup(&n, &k1).await.unwrap(), Some(d(1)));
    // k1 is still a's: b still cannot replace it, a can.
    assert_not_owner(
        c.record(&n, &k1, d(4), 10, Timestamp::now(), RefExpect::Any, b)
            .await,
        &k1,
        d(1),
        false,
    );
    assert_eq!(
        c.record(&n, &k1, d(4), 10, Timestamp::now(), RefExpect::Any, a)
            .await
            .unwrap(),
        Some(d(1))
    );
    assert_eq!(c.lookup(&n, &k1).await.unwrap(), Some(d(4)));
    // Replace::Any replaces anyone's key.
    let admin = Author {
        name: Some("admin"),
        may: Replace::Any,
    };
    assert_eq!(
        c.record(&n, &k1, d(5), 10, Timestamp::now(), RefExpect::Any, admin)
            .await
            .unwrap(),
        Some(d(4))
    );
    assert_not_owner(
        c.record(&n, &k1, d(6), 10, Timestamp::now(), RefExpect::Any, a)
            .await,
        &k1,
        d(5),
        false,
    );
    // Write-once: create and re-record the same digest, never replace.
    let once = Author {
        name: Some("a"),
        may: Replace::Nothing,
    };
    let k3 = key("cas/once");
    assert_eq!(
        c.record(&n, &k3, d(7), 1, Timestamp::now(), RefExpect::Any, once)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        c.record(&n, &k3, d(7), 1, Timestamp::now(), RefExpect::Any, once)
            .await
            .unwrap(),
        Some(d(7))
    );
    assert_not_owner(
        c.record(&n, &k3, d(8), 1, Timestamp::now(), RefExpect::Any, once)
            .await,
        &k3,
        d(7),
        true,
    );
    assert_eq!(c.lookup(&n, &k3).await.unwrap(), Some(d(7)));
    // The library replaces anything.
    assert_eq!(
        c.record(
            &n,
            &k3,
            d(8),
            1,
            Timestamp::now(),
            RefExpect::Digest(d(7)),
            Author::LIBRARY
        )
        .await
        .unwrap(),
        Some(d(7))
    );
}
