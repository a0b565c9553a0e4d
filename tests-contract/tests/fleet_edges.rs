//! Fleet GC at the edges (issue 11): `Store::pin` across nodes, deletes
//! fenced against the loss of the sweeper's session, a crashed sweeper's
//! fences finished by the next sweep, and liveness-table registrations
//! shared through the database. Real PostgreSQL; every large tier that a
//! fleet can use.

use std::sync::Arc;
use std::time::Duration;

use store_core::{GcAbortCause, Key, Store, SweepOptions, FENCE_GRACE};
use store_types::{Digest, KvEngine, LargeEngine};
use tests_contract::data::content;
use tests_contract::fleet::{FleetEnv, FleetLarge};
use tests_contract::hook::{hooked_large, DeleteHook};
use tests_contract::ns_named;
use tests_contract::THRESHOLD;

/// This file's namespace.
const NS: &str = "edges";

const TTL: Duration = Duration::from_secs(60);

async fn sweep(s: &Store) -> store_core::SweepReport {
    s.gc().sweep(SweepOptions::default()).await.expect("sweep")
}

fn big(seed: u64) -> Vec<u8> {
    content(seed, THRESHOLD as usize * 2 + 3)
}

/// A node whose large tier deletes through `hook`.
async fn hooked_node(env: &FleetEnv, owner: &str, hook: &Arc<DeleteHook>) -> Store {
    let kv: Arc<dyn KvEngine> = Arc::new(env.kv().await);
    let large = env.large_engine().await.expect("a large tier");
    let large: Arc<dyn LargeEngine> = hooked_large(large, hook.clone());
    let store = env
        .builder(owner, kv, Some(large))
        .build()
        .await
        .expect("build hooked node");
    store
        .gc()
        .register_liveness_source(ns_named(NS), env.refs())
        .await
        .unwrap();
    store
}

/// Terminates the backends holding this fleet's sweep lock or `key`'s
/// exclusive lock — the sweeper's sessions (its sweep lock, and — before
/// the fences — its locked batch), as `pg_terminate_backend`, an idle
/// timeout or a failover would. Only this test's lock ids: other tests run
/// beside it on the same database.
async fn kill_lock_holders(url: String, schema: String, key: Key) {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&url).await.expect("connect");
    let db: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&mut c)
        .await
        .expect("database name");
    let ids = vec![
        store_postgres::PgSweepLock::lock_key(&db, &schema),
        store_pg::plumbing::key_lock(&schema, &key),
    ];
    let _: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(l.pid) FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted
           AND l.objsubid = 1 AND l.pid <> pg_backend_pid()
           AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND ((l.classid::int8 << 32) | l.objid::int8) = ANY($1)",
    )
    .bind(ids)
    .fetch_all(&mut c)
    .await
    .expect("terminate lock holders");
}

/// Waits for the held delete, failing instead of hanging.
async fn entered(hook: &DeleteHook) {
    tokio::time::timeout(Duration::from_secs(60), hook.entered())
        .await
        .expect("the sweep reached its held delete");
}

/// Issue 11 §2: `Store::pin` on one node protects the entry from every
/// node's sweeps while the guard (and its pin row) lives.
async fn pin_protects_across_nodes(large: FleetLarge) {
    let env = FleetEnv::new(large, Duration::ZERO, TTL).await;
    let a = env.node("a", &ns_named(NS)).await;
    let b = env.node("b", &ns_named(NS)).await;
    let data = match large {
        FleetLarge::None => content(7, 100),
        _ => big(7),
    };
    let r = a.put(&ns_named(NS), &data[..]).await.unwrap();
    let key = r.key().clone();
    drop(r);
    let guard = a.gc().pin(&key).await.unwrap().expect("present");
    assert!(a.gc().renew_pin(&key).await.unwrap(), "the pin row renews");
    for _ in 0..3 {
        sweep(&b).await;
    }
    assert!(b.has(&key).await.unwrap(), "pinned on node a: kept");
    drop(guard);
    env.advance(TTL + Duration::from_secs(1)).await;
    sweep(&b).await;
    sweep(&b).await;
    assert!(
        !b.has(&key).await.unwrap(),
        "collectable once the row expired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_protects_across_nodes_kv_only() {
    pin_protects_across_nodes(FleetLarge::None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_protects_across_nodes_shared_local() {
    pin_protects_across_nodes(FleetLarge::SharedLocal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_protects_across_nodes_pglo() {
    pin_protects_across_nodes(FleetLarge::PgLo).await;
}

/// Issue 11 §3: the sweeper's PostgreSQL session dies while its large-tier
/// delete is in flight; another node's put of the same bytes must not
/// dedup onto the entry being deleted — it waits on the fence and writes
/// the entry afresh, and the entry survives.
async fn session_loss_mid_delete(large: FleetLarge) {
    let env = FleetEnv::new(large, Duration::ZERO, TTL).await;
    let hook = DeleteHook::new();
    let a = hooked_node(&env, "a", &hook).await;
    let b = env.node("b", &ns_named(NS)).await;
    let data = big(11);
    let r = b.put(&ns_named(NS), &data[..]).await.unwrap();
    let key = Key::new(ns_named(NS), Digest::of(&data));
    drop(r);
    env.advance(TTL + Duration::from_secs(1)).await; // the put's pin row expires
    assert_eq!(sweep(&a).await.total.staged, 1);
    let (url, schema) = (env.pg.url.clone(), env.pg.kv_schema.clone());
    let k = key.clone();
    hook.on_enter(move || kill_lock_holders(url.clone(), schema.clone(), k.clone()));
    hook.arm();
    let sweeper = {
        let a = a.clone();
        tokio::spawn(async move { a.gc().sweep(SweepOptions::default()).await })
    };
    entered(&hook).await;
    let putter = {
        let b = b.clone();
        let data = data.clone();
        tokio::spawn(async move { b.put(&ns_named(NS), &data[..]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !putter.is_finished(),
        "the put waits while the key's delete is in flight"
    );
    hook.release();
    let receipt = putter.await.unwrap().expect("put");
    assert!(
        !receipt.deduplicated,
        "never a dedup onto an entry that is being deleted"
    );
    // The sweep lost its lock session: it stops at the next batch boundary
    // and says what it had done.
    match sweeper.await.unwrap() {
        Err(store_core::Error::SweepIncomplete { deleted, cause, .. }) => {
            assert_eq!(deleted, 1);
            let chain = store_types::Report::new(&*cause).to_string();
            assert!(chain.contains("sweep lock was lost"), "{chain}");
            assert_eq!(cause.kind(), store_types::ErrorKind::ConnectionLost);
        }
        other => panic!("expected SweepIncomplete after losing the lock, got {other:?}"),
    }
    for node in [&a, &b] {
        let blob = node
            .get(&key)
            .await
            .unwrap()
            .expect("the re-put entry survives");
        assert_eq!(&blob.bytes().await.unwrap()[..], &data[..]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_loss_mid_delete_shared_local() {
    session_loss_mid_delete(FleetLarge::SharedLocal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_loss_mid_delete_pglo() {
    session_loss_mid_delete(FleetLarge::PgLo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_loss_mid_delete_object() {
    session_loss_mid_delete(FleetLarge::Object).await;
}

/// Issue 11 §3: a sweeper that fenced its keys and died before deleting
/// leaves fences; puts of those keys wait, and the next sweep after the
/// grace (by the database's clock) finishes the delete and clears them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_sweepers_fences_are_finished_by_the_next_sweep() {
    let env = FleetEnv::new(FleetLarge::SharedLocal, Duration::ZERO, TTL).await;
    let hook = DeleteHook::new();
    let a = hooked_node(&env, "a", &hook).await;
    let b = env.node("b", &ns_named(NS)).await;
    let data = big(12);
    let key = Key::new(ns_named(NS), Digest::of(&data));
    drop(b.put(&ns_named(NS), &data[..]).await.unwrap());
    env.advance(TTL + Duration::from_secs(1)).await;
    assert_eq!(sweep(&a).await.total.staged, 1);
    hook.fail_deletes(true);
    assert!(
        a.gc().sweep(SweepOptions::default()).await.is_err(),
        "the sweeper 'died'"
    );
    let putter = {
        let b = b.clone();
        let data = data.clone();
        tokio::spawn(async move { b.put(&ns_named(NS), &data[..]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!putter.is_finished(), "the fence holds puts of the key");
    let early = sweep(&b).await;
    assert_eq!(
        early.resumed_deletes, 0,
        "a fresh fence belongs to a live sweeper"
    );
    env.advance_db_clock(FENCE_GRACE + Duration::from_secs(1))
        .await;
    let rep = sweep(&b).await;
    assert_eq!(rep.resumed_deletes, 1, "{rep:?}");
    let receipt = putter.await.unwrap().expect("put after the fence cleared");
    assert!(!receipt.deduplicated);
    let blob = a.get(&key).await.unwrap().expect("present");
    assert_eq!(&blob.bytes().await.unwrap()[..], &data[..]);
}

/// ADR-012 §6.6: a liveness table registered through one node lives in the
/// shared database; another node that registered nothing sweeps the
/// namespace and honours it, and deregistration from any node ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_registrations_are_shared_by_the_fleet() {
    let env = FleetEnv::new(FleetLarge::SharedLocal, Duration::ZERO, TTL).await;
    let a = env.node("a", &ns_named(NS)).await; // registers the refs table
    let kv: Arc<dyn KvEngine> = Arc::new(env.kv().await);
    let b = env
        .builder("b", kv, env.large_engine().await)
        .build()
        .await
        .unwrap(); // registers nothing
    let kept = b.put(&ns_named(NS), &b"referenced"[..]).await.unwrap();
    let gone = b.put(&ns_named(NS), &b"garbage"[..]).await.unwrap();
    let (kept, gone) = {
        let keys = (kept.key().clone(), gone.key().clone());
        drop((kept, gone)); // the receipts' pins
        keys
    };
    env.set_ref(&kept, true).await;
    env.advance(TTL + Duration::from_secs(1)).await;
    let first = sweep(&b).await;
    assert_eq!(first.aborted, None, "b sees a's registration");
    sweep(&b).await;
    assert!(
        b.has(&kept).await.unwrap(),
        "the reference written via a's table holds"
    );
    assert!(!b.has(&gone).await.unwrap(), "b swept the namespace");
    // Idempotent: registering again through b adds nothing.
    b.gc()
        .register_liveness_source(ns_named(NS), env.refs())
        .await
        .unwrap();
    assert!(b
        .gc()
        .deregister_liveness_table(&ns_named(NS), &env.refs())
        .await
        .unwrap());
    assert!(!a
        .gc()
        .deregister_liveness_table(&ns_named(NS), &env.refs())
        .await
        .unwrap());
    let after = sweep(&a).await;
    assert_eq!(after.aborted, Some(GcAbortCause::NoLivenessSources));
    assert!(a.has(&kept).await.unwrap());
}

/// ADR-021: a fence belongs to its fencer. A direct delete of a key whose
/// sweep delete is in flight waits instead of fencing (and later clearing)
/// the key itself — otherwise a put could pass the cleared fence and
/// publish a file the sweep then unlinks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_delete_never_clears_the_first_ones_fence() {
    let env = FleetEnv::new(FleetLarge::SharedLocal, Duration::ZERO, TTL).await;
    let hook = DeleteHook::new();
    let a = hooked_node(&env, "a", &hook).await;
    let b = env.node("b", &ns_named(NS)).await;
    let c = env.node("c", &ns_named(NS)).await;
    let data = big(13);
    let key = Key::new(ns_named(NS), Digest::of(&data));
    drop(c.put(&ns_named(NS), &data[..]).await.unwrap());
    env.advance(TTL + Duration::from_secs(1)).await;
    assert_eq!(sweep(&a).await.total.staged, 1);
    hook.arm();
    let sweeper = {
        let a = a.clone();
        tokio::spawn(async move { a.gc().sweep(SweepOptions::default()).await })
    };
    entered(&hook).await;
    let deleter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.delete(&key).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !deleter.is_finished(),
        "the second delete waits for the first"
    );
    let putter = {
        let (c, data) = (c.clone(), data.clone());
        tokio::spawn(async move { c.put(&ns_named(NS), &data[..]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !putter.is_finished(),
        "the sweep's fence still holds the put"
    );
    hook.release();
    sweeper.await.unwrap().expect("sweep");
    let receipt = putter.await.unwrap().expect("put");
    assert!(!receipt.deduplicated);
    match deleter.await.unwrap() {
        Err(store_core::Error::Missing) | Err(store_core::Error::GcRefuse { .. }) => {}
        other => panic!("unexpected direct-delete outcome {other:?}"),
    }
    // Whatever the order of the delete and the put after the fence
    // cleared, a put that returned a receipt holds a pin: its entry is
    // there.
    let blob = c
        .get(&key)
        .await
        .unwrap()
        .expect("the put's entry survives");
    assert_eq!(&blob.bytes().await.unwrap()[..], &data[..]);
}
