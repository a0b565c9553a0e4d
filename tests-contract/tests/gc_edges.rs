//! GC edge cases that need a composite the contract suite does not build:
//! one entry held by both tiers (after a threshold change).

use std::sync::Arc;
use std::time::Duration;

use store_core::{Mode, Store, SweepOptions};
use store_mem::MemEngine;
use tests_contract::ns_named;
use tests_contract::support::LiveSet;

/// This file's namespace.
const NS: &str = "tiers";

async fn store(kv: &MemEngine, large: &MemEngine, threshold: u64) -> Store {
    Store::builder()
        .kv(kv.clone())
        .large(large.clone())
        .mode(Mode::DualTier { threshold })
        .window(Duration::ZERO)
        .build()
        .await
        .expect("build")
}

/// Issue 11, exact counts: after the threshold drops, a re-put of a small
/// blob lands in the large tier while its kv copy remains. A sweep
/// arbitrates the entry once (not once per tier), and a direct delete
/// removes both copies (before, it removed the kv copy, answered Ok, and
/// `has` stayed true).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_in_both_tiers_is_counted_once_and_deleted_whole() {
    let (kv, large) = (MemEngine::default(), MemEngine::default());
    let data = [7u8; 40];
    let old = store(&kv, &large, 64).await;
    let key = old
        .put(&ns_named(NS), &data[..])
        .await
        .unwrap()
        .key()
        .clone();
    drop(old);
    let s = store(&kv, &large, 16).await;
    let r = s.put(&ns_named(NS), &data[..]).await.unwrap();
    assert_eq!(
        r.tier,
        store_core::Tier::Large,
        "re-put under the new threshold"
    );
    drop(r);
    let live = LiveSet::new();
    live.set(&key, true);
    s.gc()
        .register_liveness_source(ns_named(NS), Arc::new(live.clone()))
        .await
        .unwrap();
    let rep = s.gc().sweep(SweepOptions::default()).await.unwrap();
    assert_eq!(rep.total.scanned, 1, "{rep:?}");
    assert_eq!(rep.total.protected.live, 1, "{rep:?}");
    live.set(&key, false);
    s.delete(&key).await.expect("delete");
    assert!(!s.has(&key).await.unwrap(), "both copies are gone");
}
