//! ADR-012 §5's postgres row: gc tables, window, pins and the sweep lock.

mod common;

use std::time::Duration;

use common::{key_of, ns, OpenEngine, TestSchema};
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
    let seam = e.gc_seam().unwrap();
    assert!(seam.schema.gc_tables().await.unwrap().is_empty());
    seam.schema.ensure_gc_schema().await.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    assert_eq!(
        seam.schema.gc_tables().await.unwrap(),
        ["gc_pins", "gc_window"]
    );
}

#[tokio::test]
async fn window_clauses() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let seam = e.gc_seam().unwrap();
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

    let due = w.take_due(Timestamp(200), None, 10).await.unwrap();
    let mut expect = vec![cand(&a, 1, 100), cand(&b, 2, 200)];
    expect.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(due, expect);
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
    let seam = e.gc_seam().unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let p = seam.pins.unwrap();
    let ttl = Duration::from_millis(1000);
    let (a, b, c) = (key_of("n", b"a"), key_of("n", b"b"), key_of("n", b"c"));
    let t0 = Timestamp(10_000);

    p.pin_commit(&a, "node1", t0, ttl).await.unwrap(); // expires 11_000
    p.pin_commit(&b, "node1", t0, ttl).await.unwrap();
    assert_eq!(
        p.pin_check(&[a.clone(), c.clone(), b.clone()], t0)
            .await
            .unwrap(),
        [true, false, true]
    );
    assert!(p.pin_check(&[], t0).await.unwrap().is_empty());

    // Renewal before expiry extends: live at 11_500 only thanks to it.
    assert!(p
        .pin_renew(&a, "node1", Timestamp(10_900), ttl)
        .await
        .unwrap()); // 11_900
    assert_eq!(
        p.pin_check(&[a.clone(), b.clone()], Timestamp(11_500))
            .await
            .unwrap(),
        [true, false]
    );
    // Another owner's renewal finds no row.
    assert!(!p
        .pin_renew(&a, "node2", Timestamp(10_900), ttl)
        .await
        .unwrap());
    // An expired row is not revived.
    assert!(!p
        .pin_renew(&b, "node1", Timestamp(11_000), ttl)
        .await
        .unwrap());
    assert_eq!(
        p.pin_check(std::slice::from_ref(&b), Timestamp(11_001))
            .await
            .unwrap(),
        [false]
    );

    // A second owner keeps a key pinned while the first's row expires.
    p.pin_commit(&a, "node2", Timestamp(11_000), Duration::from_millis(5000))
        .await
        .unwrap();
    assert_eq!(
        p.pin_check(std::slice::from_ref(&a), Timestamp(13_000))
            .await
            .unwrap(),
        [true]
    );

    // Reap: b (11_000) and a/node1 (11_900) are expired at 12_000.
    assert_eq!(p.reap_expired(Timestamp(12_000)).await.unwrap(), 2);
    assert_eq!(p.reap_expired(Timestamp(12_000)).await.unwrap(), 0);
    assert!(!p
        .pin_renew(&a, "node1", Timestamp(11_000), ttl)
        .await
        .unwrap());
    // pin_commit may re-create a reaped row.
    p.pin_commit(&b, "node1", Timestamp(20_000), ttl)
        .await
        .unwrap();
    assert_eq!(
        p.pin_check(std::slice::from_ref(&b), Timestamp(20_500))
            .await
            .unwrap(),
        [true]
    );
}

#[tokio::test]
async fn sweep_lock_is_exclusive_across_engines_and_released_on_drop() {
    let s = TestSchema::new();
    let (e1, e2) = (s.engine().await, s.engine().await);
    let l1 = e1.gc_seam().unwrap().sweep_lock.unwrap();
    let l2 = e2.gc_seam().unwrap().sweep_lock.unwrap();

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
        .gc_seam()
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
    let lock = e.gc_seam().unwrap().sweep_lock.unwrap();
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
