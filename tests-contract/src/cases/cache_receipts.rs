//! [`store_core::Cache`] at the facade (issue 39): a receipt protects only
//! the namespace of the entry it pins, so recording a key of another
//! namespace with it is refused with a typed error and writes nothing.

use bytes::Bytes;
use store_core::Error;
use store_types::{Author, Namespace, RefExpect, RefName, Replace};

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
