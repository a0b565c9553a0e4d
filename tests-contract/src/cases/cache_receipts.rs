//! [`store_core::Cache`] at the facade (issue 39): a receipt protects only
//! the namespace of the entry it pins, so recording a key of another
//! namespace with it is refused with a typed error and writes nothing;
//! and a sweep reports what its cache trim evicted (ADR-069).

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
        cache.put(&n, &RefName::new(k).unwrap(), body).await.unwrap();
    }
    let one = RefName::new("t/one").unwrap();
    cache.put(&calm, &one, Bytes::from(vec![7; 100])).await.unwrap();
    let bound = |max: u64| {
        GcPolicy::Cache(CacheBounds {
            max_bytes: Some(max),
            max_age: None,
        })
    };
    h.store.set_gc_policy(n.clone(), bound(150)).await.unwrap();
    h.store.set_gc_policy(calm.clone(), bound(1000)).await.unwrap();
    let rep = h.store.gc().sweep(SweepOptions::default()).await.unwrap();
    let expected = [(n.clone(), CacheTrim { keys: 2, bytes: 200 })];
    assert_eq!(
        rep.cache_trims,
        expected.into_iter().collect(),
        "{}: the sweep's report of its trim",
        spec.name
    );
}
