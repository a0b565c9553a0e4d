//! ADR-012 §5's postgres row: gc tables, window, pins and the sweep lock.

mod common;

use std::time::Duration;

use common::{key_of, ns, OpenEngine, TestSchema};
use store_pg::testing::{advance_db_clock, db_now, set_db_clock};
use store_postgres::PostgresEngine;
use store_types::{Digest, Engine, Key, StagedCandidate, Timestamp};

fn cand(key: &Key, size: u64, at: i64) -> StagedCandidate {
    StagedCandidate {
        key: key.clone(),
        size,
        visible_after: Timestamp(at),
    }
}

#[tokio::test]
async fn ensure_gc_schema_creates_pins_and_window() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let seam = e.capabilities().seam.unwrap();
    assert!(seam.schema.gc_tables().await.unwrap().is_empty());
    seam.schema.ensure_gc_schema().await.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    assert_eq!(
        seam.schema.gc_tables().await.unwrap(),
        [
            "gc_clock",
            "gc_deleting",
            "gc_liveness",
            "gc_pins",
            "gc_policies",
            "gc_window"
        ]
    );
}

/// Stops the schema's GC clock (the database's, which every pin and window
/// judgement uses) at `t` ms.
async fn clock(e: &PostgresEngine, s: &TestSchema, t: i64) {
    set_db_clock(e.pool(), &s.name, Timestamp(t)).await.unwrap();
}

#[tokio::test]
async fn window_clauses() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let seam = e.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let w = seam.window.unwrap();
    let (a, b, c) = (key_of("n1", b"a"), key_of("n1", b"b"), key_of("n2", b"c"));
    w.stage(&[cand(&a, 1, 100), cand(&b, 2, 200), cand(&a, 9, 50)])
        .await
        .unwrap();
    // Re-staging keeps the first row.
    w.stage(&[cand(&b, 7, 10), cand(&c, 3, 300)]).await.unwrap();
    assert_eq!(w.staged_count().await.unwrap(), 3);
    let probe = [a.digest, Digest::of(b"zz"), b.digest, c.digest];
    assert_eq!(
        w.staged_many(&ns("n1"), &probe).await.unwrap(),
        [true, false, true, false]
    );

    // Due by the database's clock; the `now` argument (a node's clock)
    // is not used.
    clock(&e, &s, 200).await;
    assert_eq!(w.now().await.unwrap(), Some(Timestamp(200)));
    let due = w.take_due(Timestamp(0), None, 10).await.unwrap();
    let mut expect = vec![cand(&a, 1, 100), cand(&b, 2, 200)];
    expect.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(due, expect);
    assert_eq!(
        w.take_due(Timestamp(i64::MAX), None, 10).await.unwrap(),
        due
    );
    clock(&e, &s, 1000).await;
    let all = w.take_due(Timestamp(1000), None, 10).await.unwrap();
    assert_eq!(all.len(), 3);
    assert!(
        all.windows(2).all(|p| p[0].key < p[1].key),
        "ordered by key"
    );
    let page = w
        .take_due(Timestamp(1000), Some(&all[0].key), 1)
        .await
        .unwrap();
    assert_eq!(page, vec![all[1].clone()]);
    assert!(w
        .take_due(Timestamp(1000), Some(&all[2].key), 10)
        .await
        .unwrap()
        .is_empty());
    // take_due does not remove.
    assert_eq!(w.staged_count().await.unwrap(), 3);

    w.unstage(&[a.clone(), key_of("n9", b"absent")])
        .await
        .unwrap();
    assert_eq!(w.staged_count().await.unwrap(), 2);
    assert_eq!(
        w.staged_many(&ns("n1"), &[a.digest]).await.unwrap(),
        [false]
    );
    w.unstage(&[]).await.unwrap();
    w.stage(&[]).await.unwrap();
}

#[tokio::test]
async fn pin_clauses() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let seam = e.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let p = seam.pins.unwrap();
    let ttl = Duration::from_millis(1000);
    let (a, b, c) = (key_of("n", b"a"), key_of("n", b"b"), key_of("n", b"c"));
    // Rows are written and judged by the database's clock; the `now`
    // arguments (a node's clock) are deliberately wrong and unused.
    let node = Timestamp(0);

    clock(&e, &s, 10_000).await;
    p.pin_commit(&a, "node1", node, ttl).await.unwrap(); // expires 11_000
    p.pin_commit(&b, "node1", node, ttl).await.unwrap();
    assert_eq!(
        p.pin_check(&[a.clone(), c.clone(), b.clone()], node)
            .await
            .unwrap(),
        [true, false, true]
    );
    assert!(p.pin_check(&[], node).await.unwrap().is_empty());

    // Renewal before expiry extends: live at 11_500 only thanks to it.
    clock(&e, &s, 10_900).await;
    assert!(p.pin_renew(&a, "node1", node, ttl).await.unwrap()); // 11_900
    clock(&e, &s, 11_500).await;
    assert_eq!(
        p.pin_check(&[a.clone(), b.clone()], node).await.unwrap(),
        [true, false]
    );
    // Another owner's renewal finds no row.
    clock(&e, &s, 10_900).await;
    assert!(!p.pin_renew(&a, "node2", node, ttl).await.unwrap());
    // An expired row is not revived.
    clock(&e, &s, 11_000).await;
    assert!(!p.pin_renew(&b, "node1", node, ttl).await.unwrap());
    clock(&e, &s, 11_001).await;
    assert_eq!(
        p.pin_check(std::slice::from_ref(&b), node).await.unwrap(),
        [false]
    );

    // A second owner keeps a key pinned while the first's row expires.
    clock(&e, &s, 11_000).await;
    p.pin_commit(&a, "node2", node, Duration::from_millis(5000))
        .await
        .unwrap();
    clock(&e, &s, 13_000).await;
    assert_eq!(
        p.pin_check(std::slice::from_ref(&a), node).await.unwrap(),
        [true]
    );

    // Reap: b (11_000) and a/node1 (11_900) are expired at 12_000.
    clock(&e, &s, 12_000).await;
    assert_eq!(p.reap_expired(node).await.unwrap(), 2);
    assert_eq!(p.reap_expired(Timestamp(i64::MAX)).await.unwrap(), 0);
    clock(&e, &s, 11_000).await;
    assert!(!p.pin_renew(&a, "node1", node, ttl).await.unwrap());
    // pin_commit may re-create a reaped row.
    clock(&e, &s, 20_000).await;
    p.pin_commit(&b, "node1", node, ttl).await.unwrap();
    clock(&e, &s, 20_500).await;
    assert_eq!(
        p.pin_check(std::slice::from_ref(&b), node).await.unwrap(),
        [true]
    );
}

/// The GC clock: without the test hook it is the server's clock; the hook
/// moves or stops it, and every clause follows it.
#[tokio::test]
async fn gc_clock_is_the_database_clock() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let seam = e.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let (w, p) = (seam.window.unwrap(), seam.pins.unwrap());
    let hook_rows = || async {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM \"{}\".gc_clock",
            s.name
        )))
        .fetch_one(e.pool())
        .await
        .unwrap()
    };
    assert_eq!(hook_rows().await, 0, "the test hook is empty unless set");
    let server: i64 =
        sqlx::query_scalar("SELECT (extract(epoch from clock_timestamp()) * 1000)::int8")
            .fetch_one(e.pool())
            .await
            .unwrap();
    let ours = db_now(e.pool(), &s.name).await.unwrap().0;
    assert!((ours - server).abs() < 5_000, "{ours} vs {server}");
    assert!((w.now().await.unwrap().unwrap().0 - server).abs() < 5_000);

    // A running clock moved forward: an hour-long pin expires an hour on.
    let k = key_of("n", b"k");
    p.pin_commit(&k, "o", Timestamp(0), Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(
        p.pin_check(std::slice::from_ref(&k), Timestamp(i64::MAX))
            .await
            .unwrap(),
        [true]
    );
    advance_db_clock(e.pool(), &s.name, Duration::from_secs(3599))
        .await
        .unwrap();
    assert_eq!(
        p.pin_check(std::slice::from_ref(&k), Timestamp(i64::MAX))
            .await
            .unwrap(),
        [true]
    );
    advance_db_clock(e.pool(), &s.name, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(
        p.pin_check(std::slice::from_ref(&k), Timestamp(0))
            .await
            .unwrap(),
        [false]
    );
    let moved = db_now(e.pool(), &s.name).await.unwrap().0;
    assert!((moved - server - 3_601_000).abs() < 5_000, "{moved}");

    // A stopped clock stays put, and advances exactly.
    clock(&e, &s, 50_000).await;
    assert_eq!(db_now(e.pool(), &s.name).await.unwrap(), Timestamp(50_000));
    advance_db_clock(e.pool(), &s.name, Duration::from_millis(250))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(db_now(e.pool(), &s.name).await.unwrap(), Timestamp(50_250));
    assert_eq!(w.now().await.unwrap(), Some(Timestamp(50_250)));
    assert_eq!(hook_rows().await, 1, "one row at most");
}

/// A schema whose `gc_window` component predates the GC clock migrates in
/// place: staged rows are kept and judged by the new clock.
#[tokio::test]
async fn gc_window_v1_migrates_to_the_gc_clock() {
    use store_pg::plumbing::{migrate, schema_version, GC_WINDOW_COMPONENT, GC_WINDOW_STEPS};
    let s = TestSchema::new();
    let e = s.engine().await;
    migrate(
        e.pool(),
        &s.name,
        GC_WINDOW_COMPONENT,
        &GC_WINDOW_STEPS[..1],
    )
    .await
    .unwrap();
    let k = key_of("n", b"old");
    let w = e.capabilities().seam.unwrap().window.unwrap();
    w.stage(&[cand(&k, 1, 5_000)]).await.unwrap();
    e.capabilities()
        .seam
        .unwrap()
        .schema
        .ensure_gc_schema()
        .await
        .unwrap();
    assert_eq!(
        schema_version(e.pool(), &s.name, GC_WINDOW_COMPONENT)
            .await
            .unwrap(),
        GC_WINDOW_STEPS.len() as u32
    );
    clock(&e, &s, 4_999).await;
    assert!(w
        .take_due(Timestamp(i64::MAX), None, 10)
        .await
        .unwrap()
        .is_empty());
    clock(&e, &s, 5_000).await;
    assert_eq!(
        w.take_due(Timestamp(0), None, 10).await.unwrap(),
        [cand(&k, 1, 5_000)]
    );
}

#[tokio::test]
async fn sweep_lock_is_exclusive_across_engines_and_released_on_drop() {
    let s = TestSchema::new();
    let (e1, e2) = (s.engine().await, s.engine().await);
    let l1 = e1.capabilities().seam.unwrap().sweep_lock.unwrap();
    let l2 = e2.capabilities().seam.unwrap().sweep_lock.unwrap();

    let held = l1.try_lock().await.unwrap().expect("free lock");
    assert!(l2.try_lock().await.unwrap().is_none(), "held by engine 1");
    assert!(
        l1.try_lock().await.unwrap().is_none(),
        "not re-entrant across sessions"
    );

    // Another schema has its own lock.
    let other = TestSchema::new();
    let e3 = other.engine().await;
    let g3 = e3
        .capabilities()
        .seam
        .unwrap()
        .sweep_lock
        .unwrap()
        .try_lock()
        .await
        .unwrap();
    assert!(g3.is_some());

    drop(held);
    let mut got = None;
    for _ in 0..100 {
        got = l2.try_lock().await.unwrap();
        if got.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(got.is_some(), "released after drop");
    assert!(l1.try_lock().await.unwrap().is_none());
    drop(got);
}

#[tokio::test]
async fn sweep_lock_released_when_the_guard_drops_outside_a_runtime() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let lock = e.capabilities().seam.unwrap().sweep_lock.unwrap();
    let held = lock.try_lock().await.unwrap().unwrap();
    // Dropped on a thread with no runtime: the session closes instead.
    std::thread::spawn(move || drop(held)).join().unwrap();
    let mut ok = false;
    for _ in 0..250 {
        if lock.try_lock().await.unwrap().is_some() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "session end releases the lock");
}
