//! GC edge cases that need a composite the contract suite does not build:
//! one entry held by both tiers (after a threshold change); a SQLite kv
//! tier whose sweep deletes unstage in the same transaction (ADR-081).

use std::sync::Arc;
use std::time::Duration;

use store_core::{Mode, Store, SweepOptions};
use store_mem::MemEngine;
use store_types::Engine;
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

/// ADR-081: with SQLite as kv engine and window host, a non-fleet sweep
/// deletes each kv chunk and unstages it in one bulk transaction, and
/// unstages the large tier's keys after deleting them. 200 small and 3
/// large garbage entries take eight bulk transactions (seven chunks of at
/// most 32 deletes that unstage, ADR-087, and one unstage of the large
/// keys), not fifteen; the
/// live entries of both tiers stay, and the window ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_kv_sweep_unstages_in_its_delete_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let kv = store_sqlite::SqliteEngine::open(
        dir.path().join("kv.sqlite"),
        store_sqlite::SqliteOptions::default(),
    )
    .await
    .unwrap();
    let large = MemEngine::default();
    let s = Store::builder()
        .kv(kv.clone())
        .large(large.clone())
        .mode(Mode::DualTier { threshold: 64 })
        .window(Duration::ZERO)
        .build()
        .await
        .expect("build");
    let ns = ns_named(NS);
    let live = LiveSet::new();
    s.gc()
        .register_liveness_source(ns.clone(), Arc::new(live.clone()))
        .await
        .unwrap();
    let mut keep = Vec::new();
    for i in 0..205u32 {
        let len = if i < 201 { 16 } else { 100 };
        let body = i.to_le_bytes().repeat(len / 4);
        let key = s.put(&ns, &body[..]).await.unwrap().key().clone();
        if i == 0 || i == 204 {
            live.set(&key, true);
            keep.push(key);
        }
    }
    let window = kv.capabilities().seam.unwrap().window.unwrap();
    let mark = s.gc().sweep(SweepOptions::default()).await.unwrap();
    assert_eq!(mark.total.staged, 203, "{mark:?}");
    assert_eq!(window.staged_count().await.unwrap(), 203);
    let before = kv.waits().bulk_jobs;
    let exec = s.gc().sweep(SweepOptions::default()).await.unwrap();
    assert_eq!(exec.total.deleted, 203, "{exec:?}");
    assert_eq!(kv.waits().bulk_jobs - before, 8, "bulk transactions");
    assert_eq!(window.staged_count().await.unwrap(), 0, "window empty");
    for key in &keep {
        assert!(s.has(key).await.unwrap(), "live entry kept");
    }
    let left = large.scan(&ns, None, 100).await.unwrap();
    assert_eq!(left.len(), 1, "one live large entry left");
}
