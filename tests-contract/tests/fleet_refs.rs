//! Named references as a fleet liveness table (issue 13): references set
//! through one node's PostgreSQL kv engine protect entries from every
//! node's sweep, through the engine's own `ref_names` table registered per
//! namespace; deleting the reference makes the entry garbage for the next
//! sweep after the window. Real PostgreSQL; kv-only and both large tiers a
//! fleet can use on one machine.

use std::sync::Arc;
use std::time::Duration;

use store_core::{Key, Liveness, Namespace, Store, SweepOptions, SweepReport};
use store_types::{KvEngine, LivenessTable, RefExpect, RefName};
use tests_contract::data::content;
use tests_contract::fleet::{FleetEnv, FleetLarge};
use tests_contract::ns_named;
use tests_contract::THRESHOLD;

/// This file's namespace.
const NS: &str = "fleet-refs";

fn name(s: &str) -> RefName {
    RefName::new(s).unwrap()
}

const WINDOW: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(30);

async fn sweep(s: &Store) -> SweepReport {
    let r = s.gc().sweep(SweepOptions::default()).await.expect("sweep");
    assert_eq!(r.aborted, None, "{r:?}");
    r
}

/// A fleet node with no liveness source registered yet.
async fn bare_node(env: &FleetEnv, owner: &str) -> Store {
    let kv: Arc<dyn KvEngine> = Arc::new(env.kv().await);
    env.builder(owner, kv, env.large_engine().await)
        .build()
        .await
        .expect("build fleet node")
}

/// The engine's references as a liveness table, as the engine names it.
async fn refs_table(env: &FleetEnv) -> LivenessTable {
    env.kv()
        .await
        .refs()
        .expect("postgres holds references")
        .liveness_table()
        .expect("a liveness table the fleet shares")
}

async fn put(s: &Store, data: &[u8]) -> Key {
    s.put(&ns_named(NS), data).await.expect("put").key().clone()
}

async fn present(a: &Store, b: &Store, k: &Key) -> bool {
    let here = a.has(k).await.unwrap();
    assert_eq!(here, b.has(k).await.unwrap(), "nodes agree on {k}");
    here
}

async fn references_protect_across_nodes(large: FleetLarge) {
    let at = format!("{large:?}");
    let env = FleetEnv::new(large, WINDOW, TTL).await;
    let (a, b) = (bare_node(&env, "a").await, bare_node(&env, "b").await);
    let table = refs_table(&env).await;
    assert_eq!(table.schema, env.pg.kv_schema);
    assert_eq!(table.namespace_column.as_deref(), Some("namespace"));
    for n in [&a, &b] {
        n.gc()
            .register_liveness_source(ns_named(NS), Liveness::Table(table.clone()))
            .await
            .expect("register the references table");
    }
    // Small (kv) and, with a large tier, large entries.
    let sizes = if large == FleetLarge::None {
        vec![100]
    } else {
        vec![100, THRESHOLD as usize * 2 + 5]
    };
    for (i, size) in sizes.into_iter().enumerate() {
        let seed = 1000 + 10 * i as u64;
        let kept = put(&a, &content(seed, size)).await;
        let loose = put(&a, &content(seed + 1, size)).await;
        let ref_name = name(&format!("builds/{i}/app.tar"));
        // Node A records the reference (through the facade: pinned while
        // it is written).
        let refs = a.refs().expect("the facade's references");
        assert_eq!(
            refs.set(&ns_named(NS), &ref_name, kept.digest, RefExpect::Absent)
                .await
                .unwrap(),
            None
        );
        env.advance(TTL + Duration::from_secs(1)).await; // every pin row expired

        // Node B's sweep: the referenced entry is live, the other staged …
        let r = sweep(&b).await;
        let c = &r.namespaces[&ns_named(NS)];
        assert_eq!((c.staged, c.deleted), (1, 0), "{at}: {r:?}");
        assert_eq!(c.protected.live, 1, "{at}: {r:?}");
        env.advance(WINDOW).await;
        // … and deleted after the window; the referenced one survives.
        let r = sweep(&b).await;
        assert_eq!(r.namespaces[&ns_named(NS)].deleted, 1, "{at}: {r:?}");
        assert!(present(&a, &b, &kept).await, "{at}: referenced entry lost");
        assert!(!present(&a, &b, &loose).await, "{at}: garbage kept");

        // A deletes the reference: B's next sweep stages the entry …
        assert_eq!(
            refs.delete(&ns_named(NS), &ref_name, RefExpect::Digest(kept.digest))
                .await
                .unwrap(),
            Some(kept.digest)
        );
        let r = sweep(&b).await;
        assert_eq!(r.namespaces[&ns_named(NS)].staged, 1, "{at}: {r:?}");
        // … but a reference committed again before the delete executes
        // rescues it: the locked batch re-reads the table.
        let again = b.refs().expect("the facade's references on B");
        again
            .set(&ns_named(NS), &ref_name, kept.digest, RefExpect::Absent)
            .await
            .unwrap();
        env.advance(WINDOW.max(TTL) + Duration::from_secs(1)).await;
        let r = sweep(&b).await;
        let c = &r.namespaces[&ns_named(NS)];
        assert_eq!((c.deleted, c.rescued), (0, 1), "{at}: {r:?}");
        assert!(
            present(&a, &b, &kept).await,
            "{at}: re-referenced entry lost"
        );

        // Deleted for good: gone one window after the next sweep.
        refs.delete(&ns_named(NS), &ref_name, RefExpect::Any)
            .await
            .unwrap();
        assert_eq!(sweep(&b).await.namespaces[&ns_named(NS)].staged, 1, "{at}");
        assert!(
            present(&a, &b, &kept).await,
            "{at}: deleted inside the window"
        );
        env.advance(WINDOW).await;
        let r = sweep(&b).await;
        assert_eq!(r.namespaces[&ns_named(NS)].deleted, 1, "{at}: {r:?}");
        assert!(
            !present(&a, &b, &kept).await,
            "{at}: unreferenced entry kept"
        );
        assert_eq!(
            refs.referenced(&ns_named(NS), &[kept.digest])
                .await
                .unwrap(),
            [false]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_protect_across_nodes_kv_only() {
    references_protect_across_nodes(FleetLarge::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_protect_across_nodes_shared_local() {
    references_protect_across_nodes(FleetLarge::SharedLocal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_protect_across_nodes_pg_lo() {
    references_protect_across_nodes(FleetLarge::PgLo).await;
}

/// One node's registration is every node's: B registers nothing itself,
/// yet its sweep honours the references A set, for A's namespace only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_registration_serves_the_fleet_per_namespace() {
    let env = FleetEnv::new(FleetLarge::None, Duration::ZERO, TTL).await;
    let (a, b) = (bare_node(&env, "a").await, bare_node(&env, "b").await);
    let other = Namespace::new("fleet-refs-other").unwrap();
    a.gc()
        .register_liveness_source(ns_named(NS), Liveness::Table(refs_table(&env).await))
        .await
        .unwrap();
    // `other` is swept on the references table too, registered by B
    // (so both namespaces are swept).
    b.gc()
        .register_liveness_source(other.clone(), Liveness::Table(refs_table(&env).await))
        .await
        .unwrap();
    let data = content(7, 64);
    let here = put(&a, &data).await;
    let there = a.put(&other, &data[..]).await.unwrap().key().clone();
    assert_eq!(here.digest, there.digest);
    // A reference in `ns_named(NS)` protects `ns_named(NS)`'s entry, not `other`'s.
    env.kv()
        .await
        .refs()
        .unwrap()
        .set(&ns_named(NS), &name("keep"), here.digest, RefExpect::Any)
        .await
        .unwrap();
    env.advance(TTL + Duration::from_secs(1)).await;
    // Window zero: staged and deleted by consecutive sweeps.
    sweep(&b).await;
    sweep(&b).await;
    assert!(present(&a, &b, &here).await, "referenced entry lost");
    assert!(
        !present(&a, &b, &there).await,
        "other namespace's entry kept"
    );
}
