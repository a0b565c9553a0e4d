//! Per-namespace GC policies (ADR-024) with exact sweep counts, on every
//! kv engine that holds references in one process (mem, sqlite): `refs`,
//! `unreferenced`, `keep`, `max_age` (with an injected clock), and the
//! implicit default (`keep` until the first reference, `refs` after).

use std::sync::Arc;
use std::time::Duration;

use store_core::{
    GcPolicy, Key, ManualClock, Mode, Namespace, RefExpect, RefName, Store, SweepOptions,
    SweepReport, Timestamp,
};
use store_types::KvEngine;
use tests_contract::data::content;
use tests_contract::ns_named;

enum Kv {
    Mem,
    Sqlite,
    /// A non-fleet PostgreSQL kv engine in a schema of its own.
    Postgres,
}

struct Env {
    store: Store,
    clock: ManualClock,
    _dir: tempfile::TempDir,
    _pg: Option<tests_contract::pg::PgSchemas>,
}

async fn env(kv: Kv) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let mut pg = None;
    let engine: Arc<dyn KvEngine> = match kv {
        Kv::Postgres => {
            let schemas = tests_contract::pg::PgSchemas::create().await;
            let e = store_postgres::PostgresEngine::connect(&schemas.url, &schemas.kv_schema)
                .await
                .unwrap();
            pg = Some(schemas);
            Arc::new(e)
        }
        Kv::Mem => Arc::new(store_mem::MemEngine::new()),
        Kv::Sqlite => Arc::new(
            store_sqlite::SqliteEngine::open(
                dir.path().join("kv.sqlite"),
                store_sqlite::SqliteOptions::default(),
            )
            .await
            .unwrap(),
        ),
    };
    // Entries are stamped with the wall clock; the policy's age check reads
    // the store's clock, which starts there and is moved by the test.
    let clock = ManualClock::new(Timestamp::now());
    let store = Store::builder()
        .kv_shared(engine)
        .mode(Mode::KvOnly { threshold: 1 << 20 })
        .window(Duration::ZERO)
        .clock(Arc::new(clock.clone()))
        .build()
        .await
        .unwrap();
    Env {
        store,
        clock,
        _dir: dir,
        _pg: pg,
    }
}

/// Puts `n` unpinned entries into `ns` (receipts dropped).
async fn put_many(s: &Store, ns: &Namespace, seed: u64, n: usize) -> Vec<Key> {
    let mut keys = Vec::new();
    for i in 0..n {
        let r = s.put(ns, &content(seed + i as u64, 64)[..]).await.unwrap();
        keys.push(r.key().clone());
    }
    keys
}

/// Two sweeps (window 0: stage, then delete); the reports.
async fn two_sweeps(s: &Store) -> (SweepReport, SweepReport) {
    let a = s.gc().sweep(SweepOptions::default()).await.unwrap();
    let b = s.gc().sweep(SweepOptions::default()).await.unwrap();
    (a, b)
}

fn counts(r: &SweepReport, ns: &Namespace) -> (u64, u64, u64) {
    r.namespaces
        .get(ns)
        .map(|c| (c.staged, c.deleted, c.protected.live))
        .unwrap_or_default()
}

async fn policies(kv: Kv) {
    let e = env(kv).await;
    let s = &e.store;
    let refs = s.refs().expect("this kv engine holds references");
    let (r_ns, u_ns, k_ns, a_ns, d_ns) = (
        ns_named("r"),
        ns_named("u"),
        ns_named("k"),
        ns_named("a"),
        ns_named("d"),
    );
    s.set_gc_policy(r_ns.clone(), GcPolicy::Refs).await.unwrap();
    s.set_gc_policy(u_ns.clone(), GcPolicy::Unreferenced)
        .await
        .unwrap();
    s.set_gc_policy(k_ns.clone(), GcPolicy::Keep).await.unwrap();
    s.set_gc_policy(a_ns.clone(), GcPolicy::MaxAge(Duration::from_secs(3600)))
        .await
        .unwrap();
    let r = put_many(s, &r_ns, 100, 4).await;
    let u = put_many(s, &u_ns, 200, 3).await;
    let k = put_many(s, &k_ns, 300, 2).await;
    let a = put_many(s, &a_ns, 400, 3).await;
    let d = put_many(s, &d_ns, 500, 2).await;
    let name = |n: &str| RefName::new(n).unwrap();
    // One reference in each of r, u, a and k.
    for (n, key) in [
        (&r_ns, &r[0]),
        (&u_ns, &u[0]),
        (&a_ns, &a[0]),
        (&k_ns, &k[0]),
    ] {
        refs.set(n, &name("keep"), key.digest, RefExpect::Absent)
            .await
            .unwrap();
    }

    let (first, second) = two_sweeps(s).await;
    // refs: 3 unreferenced staged then deleted, 1 live.
    assert_eq!(counts(&first, &r_ns), (3, 0, 1), "{first:?}");
    assert_eq!(counts(&second, &r_ns).1, 3, "{second:?}");
    // unreferenced: references still protect; the rest goes.
    assert_eq!(counts(&first, &u_ns), (2, 0, 1), "{first:?}");
    assert_eq!(counts(&second, &u_ns).1, 2, "{second:?}");
    // keep: never swept, even with a reference set in it.
    assert!(first.unswept_namespaces.contains(&k_ns), "{first:?}");
    // max_age 1h: everything is young, nothing staged.
    assert_eq!(counts(&first, &a_ns), (0, 0, 3), "{first:?}");
    // d: no policy, no reference: the implicit keep.
    assert!(first.unswept_namespaces.contains(&d_ns), "{first:?}");
    assert_eq!(s.effective_gc_policy(&d_ns).await.unwrap(), GcPolicy::Keep);

    // Two hours later the unreferenced old entries in `a` are garbage.
    e.clock.advance(Duration::from_secs(2 * 3600));
    let (first, second) = two_sweeps(s).await;
    assert_eq!(counts(&first, &a_ns), (2, 0, 1), "{first:?}");
    assert_eq!(counts(&second, &a_ns).1, 2, "{second:?}");

    // The first reference in `d` makes it a refs namespace.
    refs.set(&d_ns, &name("one"), d[0].digest, RefExpect::Absent)
        .await
        .unwrap();
    assert_eq!(s.effective_gc_policy(&d_ns).await.unwrap(), GcPolicy::Refs);
    let (first, second) = two_sweeps(s).await;
    assert_eq!(counts(&first, &d_ns), (1, 0, 1), "{first:?}");
    assert_eq!(counts(&second, &d_ns).1, 1, "{second:?}");

    // What survived: exactly the referenced entries and `keep`'s.
    for key in [&r[0], &u[0], &a[0], &d[0], &k[0], &k[1]] {
        assert!(s.has(key).await.unwrap(), "{key} lost");
    }
    for key in r[1..].iter().chain(&u[1..]).chain(&a[1..]).chain(&d[1..]) {
        assert!(!s.has(key).await.unwrap(), "{key} kept");
    }

    // Deleting the last reference of `d` makes its entry garbage; the
    // namespace stays `refs` (the mark is sticky).
    refs.delete(&d_ns, &name("one"), RefExpect::Any)
        .await
        .unwrap();
    let (_, second) = two_sweeps(s).await;
    assert_eq!(counts(&second, &d_ns).1, 1, "{second:?}");
    assert!(!s.has(&d[0]).await.unwrap());
    assert_eq!(s.effective_gc_policy(&d_ns).await.unwrap(), GcPolicy::Refs);

    // Changing a policy undoes the old registrations: `u` set to keep is
    // no longer swept, and set back to unreferenced it is again.
    s.set_gc_policy(u_ns.clone(), GcPolicy::Keep).await.unwrap();
    let late = put_many(s, &u_ns, 600, 2).await;
    let (first, _) = two_sweeps(s).await;
    assert!(first.unswept_namespaces.contains(&u_ns), "{first:?}");
    for key in &late {
        assert!(s.has(key).await.unwrap(), "{key} swept under keep");
    }
    s.set_gc_policy(u_ns.clone(), GcPolicy::Unreferenced)
        .await
        .unwrap();
    let (first, second) = two_sweeps(s).await;
    assert_eq!(counts(&first, &u_ns), (2, 0, 1), "{first:?}");
    assert_eq!(counts(&second, &u_ns).1, 2, "{second:?}");
}

#[tokio::test]
async fn policies_on_mem() {
    policies(Kv::Mem).await;
}

#[tokio::test]
async fn policies_on_sqlite() {
    policies(Kv::Sqlite).await;
}

#[tokio::test]
async fn a_reopened_store_adopts_namespaces_that_use_references() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sqlite");
    let open = || async {
        let kv = store_sqlite::SqliteEngine::open(&path, store_sqlite::SqliteOptions::default())
            .await
            .unwrap();
        Store::builder()
            .kv(kv)
            .mode(Mode::KvOnly { threshold: 1 << 20 })
            .window(Duration::ZERO)
            .build()
            .await
            .unwrap()
    };
    let n = ns_named("docs");
    {
        let s = open().await;
        let kept = put_many(&s, &n, 1, 1).await;
        s.refs()
            .unwrap()
            .set(
                &n,
                &RefName::new("k").unwrap(),
                kept[0].digest,
                RefExpect::Any,
            )
            .await
            .unwrap();
    }
    let s = open().await;
    // Without adoption the namespace is unswept…
    assert_eq!(s.effective_gc_policy(&n).await.unwrap(), GcPolicy::Keep);
    assert_eq!(s.adopt_ref_namespaces().await.unwrap(), vec![n.clone()]);
    assert_eq!(s.effective_gc_policy(&n).await.unwrap(), GcPolicy::Refs);
    let garbage = put_many(&s, &n, 50, 2).await;
    let (first, second) = two_sweeps(&s).await;
    assert_eq!(counts(&first, &n), (2, 0, 1), "{first:?}");
    assert_eq!(counts(&second, &n).1, 2, "{second:?}");
    for g in &garbage {
        assert!(!s.has(g).await.unwrap());
    }
}

/// An embedder's source that names nothing live: it makes its namespace
/// swept whatever the policy says.
struct NothingLive;

#[async_trait::async_trait]
impl store_core::LivenessSource for NothingLive {
    async fn probe(&self, keys: &[Key]) -> store_core::Result<Vec<bool>> {
        Ok(vec![false; keys.len()])
    }
}

/// Issue 30 item 1: a reference protects under every policy — `keep` plus
/// an embedder's liveness source sweeps the namespace (the source asked
/// for that), and the referenced entry must survive while the reference
/// points at it. Before the fix only the policy's own source consulted
/// references, so the sweep deleted it.
async fn a_reference_protects_under_keep_with_a_source(kv: Kv) {
    let e = env(kv).await;
    let s = &e.store;
    let n = ns_named("keep-plus-source");
    s.set_gc_policy(n.clone(), GcPolicy::Keep).await.unwrap();
    s.gc()
        .register_liveness_source(
            n.clone(),
            Arc::new(NothingLive) as Arc<dyn store_core::LivenessSource>,
        )
        .await
        .unwrap();
    let keys = put_many(s, &n, 700, 2).await;
    s.refs()
        .unwrap()
        .set(
            &n,
            &RefName::new("held").unwrap(),
            keys[0].digest,
            RefExpect::Absent,
        )
        .await
        .unwrap();
    let (first, second) = two_sweeps(s).await;
    assert_eq!(counts(&first, &n), (1, 0, 1), "{first:?}");
    assert_eq!(counts(&second, &n).1, 1, "{second:?}");
    assert!(s.has(&keys[0]).await.unwrap(), "referenced entry deleted");
    assert!(!s.has(&keys[1]).await.unwrap(), "garbage kept");
    // A direct delete is refused too while the reference holds.
    assert!(matches!(
        s.delete(&keys[0]).await,
        Err(store_core::Error::GcRefuse { .. })
    ));
}

#[tokio::test]
async fn a_reference_protects_under_keep_with_a_source_on_mem() {
    a_reference_protects_under_keep_with_a_source(Kv::Mem).await;
}

#[tokio::test]
async fn a_reference_protects_under_keep_with_a_source_on_sqlite() {
    a_reference_protects_under_keep_with_a_source(Kv::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_protects_under_keep_with_a_source_on_postgres() {
    a_reference_protects_under_keep_with_a_source(Kv::Postgres).await;
}

/// A source that, probed for the first time, registers a second source
/// naming every key live (the embedder changing its mind mid-sweep).
struct RegistersOnFirstProbe {
    store: std::sync::Mutex<Option<Store>>,
    ns: Namespace,
}

struct EverythingLive;

#[async_trait::async_trait]
impl store_core::LivenessSource for EverythingLive {
    async fn probe(&self, keys: &[Key]) -> store_core::Result<Vec<bool>> {
        Ok(vec![true; keys.len()])
    }
}

#[async_trait::async_trait]
impl store_core::LivenessSource for RegistersOnFirstProbe {
    async fn probe(&self, keys: &[Key]) -> store_core::Result<Vec<bool>> {
        let store = self.store.lock().unwrap().take();
        if let Some(s) = store {
            s.gc()
                .register_liveness_source(
                    self.ns.clone(),
                    Arc::new(EverythingLive) as Arc<dyn store_core::LivenessSource>,
                )
                .await
                .unwrap();
        }
        Ok(vec![false; keys.len()])
    }
}

/// Issue 30 item 8: a non-fleet sweep re-reads its liveness sources per
/// batch, as fleet sweeps re-read their tables: a source registered while
/// the execute phase runs protects every later batch. Before the fix the
/// sweep used the sources of its start and deleted all three entries.
async fn sources_are_reread_per_batch(kv: Kv) {
    let e = env(kv).await;
    let s = &e.store;
    let n = ns_named("reread");
    s.gc()
        .register_liveness_source(
            n.clone(),
            Arc::new(NothingLive) as Arc<dyn store_core::LivenessSource>,
        )
        .await
        .unwrap();
    let keys = put_many(s, &n, 800, 3).await;
    let one = SweepOptions { batch: 1 };
    let staged = s.gc().sweep(one.clone()).await.unwrap();
    assert_eq!(counts(&staged, &n).0, 3, "{staged:?}");
    s.gc()
        .register_liveness_source(
            n.clone(),
            Arc::new(RegistersOnFirstProbe {
                store: std::sync::Mutex::new(Some(s.clone())),
                ns: n.clone(),
            }) as Arc<dyn store_core::LivenessSource>,
        )
        .await
        .unwrap();
    let r = s.gc().sweep(one).await.unwrap();
    let c = &r.namespaces[&n];
    assert_eq!((c.deleted, c.rescued), (1, 2), "{r:?}");
    let left = futures::future::join_all(keys.iter().map(|k| s.has(k))).await;
    assert_eq!(left.iter().filter(|h| *h.as_ref().unwrap()).count(), 2);
}

#[tokio::test]
async fn sources_are_reread_per_batch_on_mem() {
    sources_are_reread_per_batch(Kv::Mem).await;
}

#[tokio::test]
async fn sources_are_reread_per_batch_on_sqlite() {
    sources_are_reread_per_batch(Kv::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_are_reread_per_batch_on_postgres() {
    sources_are_reread_per_batch(Kv::Postgres).await;
}

/// Issue 30 item 5: a `Refs::set` dropped while SQLite's writer is held up
/// keeps its pin until the queued write's outcome is known (the write
/// commits after the caller gave up; a sweep in between must still see the
/// pin). Before the fix the pin went with the dropped future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_set_keeps_its_pin_until_the_write_is_known_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sqlite");
    let engine = store_sqlite::SqliteEngine::open(&path, store_sqlite::SqliteOptions::default())
        .await
        .unwrap();
    let s = Store::builder()
        .kv(engine)
        .mode(Mode::KvOnly { threshold: 1 << 20 })
        .window(Duration::ZERO)
        .build()
        .await
        .unwrap();
    let n = ns_named("cancelled-set");
    s.set_gc_policy(n.clone(), GcPolicy::Unreferenced)
        .await
        .unwrap();
    let key = put_many(&s, &n, 900, 1).await.remove(0);
    // Another connection takes SQLite's write lock: the engine's writer
    // waits on it (busy timeout 10 s) with the set queued.
    let blocker = rusqlite::Connection::open(&path).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    let refs = s.refs().unwrap();
    let late = RefName::new("late").unwrap();
    let set = refs.set(&n, &late, key.digest, RefExpect::Any);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), set)
            .await
            .is_err(),
        "the set must be waiting on the writer"
    );
    // The caller gave up; the write is still queued: the pin must hold.
    assert_eq!(
        s.gc().pin_count(&key),
        1,
        "pin released before the write's outcome"
    );
    blocker.execute_batch("COMMIT").unwrap();
    drop(blocker);
    // The write commits after all; then the pin goes.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while s.gc().pin_count(&key) > 0 {
        assert!(std::time::Instant::now() < deadline, "pin never released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        refs.get(&n, &RefName::new("late").unwrap()).await.unwrap(),
        Some(key.digest)
    );
    let (_, second) = two_sweeps(&s).await;
    assert_eq!(counts(&second, &n).1, 0, "{second:?}");
    assert!(s.has(&key).await.unwrap(), "referenced entry lost");
}
