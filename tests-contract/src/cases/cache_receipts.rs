//! [`store_core::Cache`] at the facade (issue 39): a receipt protects only
//! the namespace of the entry it pins, so recording a key of another
//! namespace with it is refused with a typed error and writes nothing;
//! a sweep reports what its cache trim evicted, and the bound holds at
//! write time (ADR-069).

use bytes::Bytes;
use store_core::{CacheBounds, Error, GcPolicy, SweepOptions};
use store_types::{Author, CacheTrim, Namespace, RefExpect, RefName, Replace};

use crate::harness::{ns, Harness, Spec};

/// `Cache::record` refuses a receipt of another namespace
/// (`Error::ReceiptMismatch`), and the key stays absent; a receipt of the
/// right namespace records the key (and `record_by` answers the digest
/// it replaced).
pub async fn cache_record_refuses_a_receipt_of_another_namespace(spec: Spec) {
    let h = Harness::open(spec).await;
    let cache = h
        .store
        .cache()
        .unwrap_or_else(|| panic!("{}: the kv engine holds no cache keys", spec.name));
    let (n, other) = (
        ns(),
        Namespace::new("contract-receipt-other").expect("valid"),
    );
    let key = RefName::new("ab/cdef").expect("valid");
    let receipt = h
        .store
        .put_bytes(&other, Bytes::from_static(b"in the other namespace"))
        .await
        .unwrap();
    match cache.record(&n, &key, &receipt).await {
        Err(Error::ReceiptMismatch {
            namespace,
            receipt: pinned,
        }) => {
            assert_eq!(namespace, n.to_string());
            assert_eq!(&pinned, receipt.key());
        }
        r => panic!(
            "{}: a receipt of {other} recorded a key of {n}: {r:?}",
            spec.name
        ),
    }
    assert_eq!(cache.lookup(&n, &key).await.unwrap(), None);
    let author = Author {
        name: Some("a"),
        may: Replace::Own,
    };
    let mine = h
        .store
        .put_bytes(&n, Bytes::from_static(b"in this namespace"))
        .await
        .unwrap();
    assert_eq!(
        cache
            .record_by(&n, &key, &mine, RefExpect::Absent, author)
            .await
            .unwrap(),
        None
    );
    assert_eq!(cache.lookup(&n, &key).await.unwrap(), Some(mine.digest));
    let again = h
        .store
        .put_bytes(&n, Bytes::from_static(b"in this namespace"))
        .await
        .unwrap();
    assert_eq!(
        cache
            .record_by(&n, &key, &again, RefExpect::Any, author)
            .await
            .unwrap(),
        Some(mine.digest)
    );
}

/// A sweep reports what the cache trim it runs first evicted, per
/// namespace (ADR-069): three 100-byte keys under a 150-byte bound set
/// after they were written lose two, and the report says 2 keys, 200
/// bytes; a namespace the trim left alone is not listed.
pub async fn cache_sweep_reports_its_trim(spec: Spec) {
    let h = Harness::open(spec).await;
    let cache = h
        .store
        .cache()
        .unwrap_or_else(|| panic!("{}: the kv engine holds no cache keys", spec.name));
    let (n, calm) = (ns(), Namespace::new("contract-trim-calm").expect("valid"));
    for (i, k) in ["t/a", "t/b", "t/c"].into_iter().enumerate() {
        let body = Bytes::from(vec![i as u8; 100]);
        cache
            .put(&n, &RefName::new(k).unwrap(), body)
            .await
            .unwrap();
    }
    let one = RefName::new("t/one").unwrap();
    cache
        .put(&calm, &one, Bytes::from(vec![7; 100]))
        .await
        .unwrap();
    let bound = |max: u64| {
        GcPolicy::Cache(CacheBounds {
            max_bytes: Some(max),
            max_age: None,
        })
    };
    h.store.set_gc_policy(n.clone(), bound(150)).await.unwrap();
    h.store
        .set_gc_policy(calm.clone(), bound(1000))
        .await
        .unwrap();
    let rep = h.store.gc().sweep(SweepOptions::default()).await.unwrap();
    let expected = [(
        n.clone(),
        CacheTrim {
            keys: 2,
            bytes: 200,
        },
    )];
    assert_eq!(
        rep.cache_trims,
        expected.into_iter().collect(),
        "{}: the sweep's report of its trim",
        spec.name
    );
}

/// The bound holds at write time (ADR-069): under a 250-byte bound, five
/// 100-byte keys recorded one after another are trimmed by the write-time
/// trim — no sweep runs — until at most 250 bytes of keys are left, the
/// last key among them; a record larger than the bound is refused
/// (`Error::TooLarge`) and its key stays absent.
pub async fn cache_bound_holds_at_write_time(spec: Spec) {
    let h = Harness::open(spec).await;
    let cache = h
        .store
        .cache()
        .unwrap_or_else(|| panic!("{}: the kv engine holds no cache keys", spec.name));
    let n = ns();
    let bound = CacheBounds {
        max_bytes: Some(250),
        max_age: None,
    };
    h.store
        .set_gc_policy(n.clone(), GcPolicy::Cache(bound))
        .await
        .unwrap();
    let keys: Vec<RefName> = (0..5)
        .map(|i| RefName::new(format!("w/{i}")).unwrap())
        .collect();
    for (i, k) in keys.iter().enumerate() {
        // Apart by more than the access resolution, so the recency order
        // is the order written (ties go by key).
        h.advance(store_core::ACCESS_RESOLUTION * 2).await;
        cache
            .put(&n, k, Bytes::from(vec![i as u8; 100]))
            .await
            .unwrap();
    }
    // The trim runs in a task of its own: wait for it (a liveness bound,
    // not a timing assertion).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let bytes = loop {
        let usage = cache.usage().await.unwrap();
        let bytes = usage
            .iter()
            .find(|(m, _)| m == &n)
            .map_or(0, |(_, u)| u.bytes);
        if bytes <= 250 || std::time::Instant::now() > deadline {
            break bytes;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(
        bytes <= 250,
        "{}: {bytes} bytes of keys left under a 250-byte bound",
        spec.name
    );
    assert!(
        cache.lookup(&n, &keys[4]).await.unwrap().is_some(),
        "{}: the write-time trim removed the key just written",
        spec.name
    );
    let big = RefName::new("w/big").unwrap();
    match cache.put(&n, &big, Bytes::from(vec![9; 251])).await {
        Err(Error::TooLarge { .. }) => {}
        r => panic!(
            "{}: a 251-byte entry under a 250-byte bound: {r:?}",
            spec.name
        ),
    }
    assert_eq!(cache.lookup(&n, &big).await.unwrap(), None);
}
