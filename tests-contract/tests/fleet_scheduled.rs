//! Scheduled sweeps in a fleet (issue 13 item 4): two nodes, each with its
//! own scheduler (`Ops::spawn_sweep_scheduler`), on one namespace whose
//! policy is `refs` (the engine's references registered as a fleet
//! liveness table by `Store::set_gc_policy`). Garbage goes by itself,
//! exactly once (the deletes of both nodes add up to the garbage; the
//! sweep lock keeps one sweep running), and the referenced entry stays.
//! Real PostgreSQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use store_core::{GcPolicy, RefExpect, RefName, Store};
use store_ops::{Ops, OpsConfig};
use store_types::KvEngine;
use tests_contract::data::content;
use tests_contract::fleet::{FleetEnv, FleetLarge};
use tests_contract::ns_named;

const TTL: Duration = Duration::from_secs(30);
const GARBAGE: usize = 12;

/// This file's namespace.
const NS: &str = "scheduled";

async fn node(env: &FleetEnv, owner: &str) -> Store {
    let kv: Arc<dyn KvEngine> = Arc::new(env.kv().await);
    let s = env
        .builder(owner, kv, env.large_engine().await)
        .build()
        .await
        .expect("build fleet node");
    s.set_gc_policy(ns_named(NS), GcPolicy::Refs)
        .await
        .expect("refs policy in a fleet");
    s
}

fn counter(ops: &Ops, name: &str) -> u64 {
    let text = ops.render_metrics();
    text.lines()
        .find_map(|l| l.strip_prefix(name).map(str::trim))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_fleet_schedulers_collect_garbage_once_and_keep_references() {
    let env = FleetEnv::new(FleetLarge::None, Duration::ZERO, TTL).await;
    let (a, b) = (node(&env, "a").await, node(&env, "b").await);
    let kept = a.put(&ns_named(NS), &content(1, 100)[..]).await.unwrap();
    a.refs()
        .expect("postgres holds references")
        .set(
            &ns_named(NS),
            &RefName::new("keep/me").unwrap(),
            kept.digest,
            RefExpect::Absent,
        )
        .await
        .unwrap();
    let kept = kept.key().clone();
    let mut garbage = Vec::new();
    for i in 0..GARBAGE {
        let node = if i % 2 == 0 { &a } else { &b };
        let r = node
            .put(&ns_named(NS), &content(100 + i as u64, 100)[..])
            .await
            .unwrap();
        garbage.push(r.key().clone());
    }
    // Every pin row expires by the database's clock.
    env.advance(TTL + Duration::from_secs(1)).await;

    let ops_a = Ops::new(a.clone(), OpsConfig::default()).unwrap();
    let ops_b = Ops::new(b.clone(), OpsConfig::default()).unwrap();
    let every = Duration::from_millis(150);
    let sa = ops_a.spawn_sweep_scheduler(every);
    let sb = ops_b.spawn_sweep_scheduler(every);

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut left = 0;
        for k in &garbage {
            if a.has(k).await.unwrap() {
                left += 1;
            }
        }
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} garbage entries left after 60 s of scheduled sweeps"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let both schedulers run a few more rounds over the settled state.
    tokio::time::sleep(every * 4).await;
    sa.abort();
    sb.abort();
    assert!(
        a.has(&kept).await.unwrap(),
        "the referenced entry was swept"
    );
    assert!(b.has(&kept).await.unwrap());
    let deleted = counter(&ops_a, "blobpool_sweep_deleted_total")
        + counter(&ops_b, "blobpool_sweep_deleted_total");
    assert_eq!(deleted, GARBAGE as u64, "each garbage entry deleted once");
    assert!(counter(&ops_a, "blobpool_sweeps_total") > 0);
    assert!(counter(&ops_b, "blobpool_sweeps_total") > 0);
}
