//! `StoreBuilder::outboards_at_put` (ADR-032): on (the default), a large
//! put publishes the entry's outboard with it; off, it publishes none and
//! the first range read builds it lazily (and, over 1 MiB, hands it to the
//! engine), so ranges stay verified either way.

use store_core::{Mode, Store};
use store_mem::MemEngine;
use store_types::outboard::compute;
use store_types::{Engine, Namespace};

async fn store(large: MemEngine, at_put: bool) -> Store {
    Store::builder()
        .kv(MemEngine::new())
        .large(large)
        .mode(Mode::DualTier { threshold: 1024 })
        .outboards_at_put(at_put)
        .build()
        .await
        .unwrap()
}

#[tokio::test]
async fn outboards_at_put_on_and_off() {
    // Over 1 MiB: smaller entries keep no outboard either way (TUNING.md §small-outboards).
    let data: Vec<u8> = (0..1_200_000u32).map(|i| (i % 253) as u8).collect();
    let (_, want) = compute(&data);
    let ns = Namespace::new("o").unwrap();
    for at_put in [true, false] {
        let large = MemEngine::new();
        let s = store(large.clone(), at_put).await;
        let key = s.put(&ns, &data[..]).await.unwrap().key().clone();
        let kept = large.read_outboard(&key).await.unwrap();
        assert_eq!(kept.is_some(), at_put, "published with the entry: {at_put}");
        let range = s.read_range(&key, 70_000..70_100).await.unwrap();
        assert!(range.is_verified());
        assert_eq!(&range.bytes().await.unwrap()[..], &data[70_000..70_100]);
        // Off: the lazy path gave the entry its outboard.
        assert_eq!(large.read_outboard(&key).await.unwrap(), Some(want.clone()));
        // Corruption inside a covering group is caught either way.
        large.corrupt_byte_at(&key, 70_050).unwrap();
        let s = store(large.clone(), at_put).await;
        assert!(matches!(
            s.read_range(&key, 70_000..70_100)
                .await
                .unwrap()
                .bytes()
                .await,
            Err(store_core::Error::Verification { .. })
        ));
    }
}
