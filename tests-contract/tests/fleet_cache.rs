//! Cache namespaces in a fleet (issue 31, ADR-048), on real PostgreSQL:
//! the bound is the loosest of the nodes' `cache` rows, any node's sweep
//! trims least recently used keys first (reads through another node
//! count once that node has written them), keys recorded through one node
//! protect at another's sweep, `keep` on any node wins, and a reference
//! keeps protecting an entry whose key was evicted.

use std::sync::Arc;
use std::time::Duration;

use store_core::{CacheBounds, GcPolicy, Key, Namespace, Store, SweepOptions};
use store_types::{KvEngine, RefExpect, RefName};
use tests_contract::data::content;
use tests_contract::fleet::{FleetEnv, FleetLarge};

const WINDOW: Duration = Duration::ZERO;
const TTL: Duration = Duration::from_secs(30);

fn ns(s: &str) -> Namespace {
    Namespace::new(format!("fleet-cache-{s}")).unwrap()
}

fn key(s: &str) -> RefName {
    RefName::new(s).unwrap()
}

async fn node(env: &FleetEnv, owner: &str) -> Store {
    let kv: Arc<dyn KvEngine> = Arc::new(env.kv().await);
    env.builder(owner, kv, env.large_engine().await)
        .build()
        .await
        .expect("build fleet node")
}

fn bound(max_bytes: u64) -> GcPolicy {
    GcPolicy::Cache(CacheBounds {
        max_bytes: Some(max_bytes),
        max_age: None,
    })
}

/// Records `k` (100 bytes of `seed`) through `s`; the entry's key.
async fn cache_put(s: &Store, n: &Namespace, k: &str, seed: u64) -> Key {
    let d = s
        .cache()
        .unwrap()
        .put(n, &key(k), content(seed, 100).into())
        .await
        .expect("cache put");
    tokio::time::sleep(Duration::from_millis(150)).await;
    Key::new(n.clone(), d)
}

/// Two sweeps after every pin row expired (window zero: stage, delete);
/// a sweep with nothing to sweep ends early (`NoLivenessSources`).
async fn two_sweeps(env: &FleetEnv, s: &Store) {
    env.advance(TTL + Duration::from_secs(1)).await;
    for _ in 0..2 {
        let r = s.gc().sweep(SweepOptions::default()).await.expect("sweep");
        assert!(
            matches!(
                r.aborted,
                None | Some(store_core::GcAbortCause::NoLivenessSources)
            ),
            "{r:?}"
        );
    }
}

async fn present(s: &Store, k: &Key) -> bool {
    s.stat(k).await.unwrap().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loosest_bound_evicts_least_recently_used_across_nodes() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("lru");
    let (a, b) = (node(&env, "node-a").await, node(&env, "node-b").await);
    a.set_gc_policy(n.clone(), bound(250)).await.unwrap();
    b.set_gc_policy(n.clone(), bound(150)).await.unwrap();
    assert_eq!(
        a.cache_namespaces().await.unwrap()[&n].max_bytes,
        Some(250),
        "the loosest bound"
    );
    let k1 = cache_put(&a, &n, "k1", 1).await;
    let k2 = cache_put(&a, &n, "k2", 2).await;
    // k1 is read through node b (written by b's flush): k2 is now the
    // least recently used. Before k3 arrives: its put passes the loosest
    // bound and trims at once (ADR-069).
    let cb = b.cache().unwrap();
    assert_eq!(cb.lookup(&n, &key("k1")).await.unwrap(), Some(k1.digest));
    cb.flush_access().await.unwrap();
    let k3 = cache_put(&b, &n, "k3", 3).await;
    // Node b sweeps: keys recorded through a protect there too.
    two_sweeps(&env, &b).await;
    assert!(present(&a, &k1).await, "read recently");
    assert!(!present(&a, &k2).await, "least recently used: evicted");
    assert!(present(&a, &k3).await, "newest");
    let ca = a.cache().unwrap();
    assert_eq!(ca.lookup(&n, &key("k2")).await.unwrap(), None);
    let usage = ca.usage().await.unwrap();
    let u = usage.iter().find(|(m, _)| m == &n).unwrap().1;
    assert_eq!((u.keys, u.bytes), (2, 200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_on_any_node_wins_and_references_outlive_their_keys() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("keep");
    let (a, b) = (node(&env, "node-a").await, node(&env, "node-b").await);
    a.set_gc_policy(n.clone(), bound(100)).await.unwrap();
    b.set_gc_policy(n.clone(), GcPolicy::Keep).await.unwrap();
    let k1 = cache_put(&a, &n, "k1", 1).await;
    let k2 = cache_put(&a, &n, "k2", 2).await;
    two_sweeps(&env, &a).await;
    assert!(a.cache_namespaces().await.unwrap().is_empty());
    assert!(
        present(&a, &k1).await && present(&a, &k2).await,
        "keep wins"
    );
    // (Counted, not looked up: a lookup is a read and would reorder.)
    let usage = a.cache().unwrap().usage().await.unwrap();
    assert_eq!(usage.iter().find(|(m, _)| m == &n).unwrap().1.keys, 2);

    // b drops its keep: the bound applies. A reference (set through b)
    // keeps k1's entry although its key is the least recently used.
    b.set_gc_policy(n.clone(), bound(100)).await.unwrap();
    b.refs()
        .unwrap()
        .set(&n, &key("release/k1"), k1.digest, RefExpect::Absent)
        .await
        .unwrap();
    two_sweeps(&env, &a).await;
    let ca = a.cache().unwrap();
    assert_eq!(
        ca.lookup(&n, &key("k1")).await.unwrap(),
        None,
        "key evicted"
    );
    assert!(present(&a, &k1).await, "the reference protects the entry");
    assert!(present(&a, &k2).await, "within the bound");
}
