//! The engine-state seam applicability table (ADR-012 §5) as tests: each
//! engine of a composite × each clause family. Applicable cells test
//! behaviour; non-applicable cells assert absence.

use std::sync::Arc;
use std::time::Duration;

use store_types::{
    Digest, Engine, GcSeam, Key, Namespace, StagedCandidate, Timestamp, WindowClauses,
    WindowDeletes,
};

use crate::harness::{Harness, Spec};

/// One row of the table: which families an engine kind has, and the
/// tables its `ensure_gc_schema` creates.
struct Row {
    window: bool,
    pins: bool,
    lock: bool,
    /// Deletes that unstage in the same transaction (ADR-081).
    deletes: bool,
    tables: &'static [&'static str],
}

/// `member`: whether the engine says it is a seam member. An engine that
/// is not needs no row (a new non-SQL engine passes as it is); a member
/// without one fails, so a new SQL engine's clauses get checked.
fn row(kind: &str, member: bool) -> Option<Row> {
    match kind {
        "postgres" => Some(Row {
            window: true,
            pins: true,
            lock: true,
            deletes: false,
            tables: &[
                "gc_clock",
                "gc_deleting",
                "gc_liveness",
                "gc_pins",
                "gc_policies",
                "gc_window",
            ],
        }),
        "sqlite" => Some(Row {
            window: true,
            pins: false,
            lock: false,
            deletes: true,
            tables: &["gc_window"],
        }),
        "pg-lo" => Some(Row {
            window: true,
            pins: false,
            lock: false,
            deletes: false,
            tables: &["gc_clock", "gc_window"],
        }),
        "mem" | "local" | "object" => None,
        _ if !member => None,
        other => panic!("engine kind {other} has no row in the applicability table"),
    }
}

fn engines(h: &Harness) -> Vec<Arc<dyn Engine>> {
    std::iter::once(h.kv_engine())
        .chain(h.large_engine())
        .collect()
}

/// The one-window-host rule: a built instance has exactly one window
/// table when any engine is SQL-backed, none otherwise.
pub async fn one_window_host(spec: Spec) {
    let h = Harness::open(spec).await;
    let mut window_tables = 0;
    for e in engines(&h) {
        if let Some(seam) = e.capabilities().seam {
            window_tables += seam
                .schema
                .gc_tables()
                .await
                .unwrap()
                .iter()
                .filter(|t| *t == "gc_window")
                .count();
        }
    }
    assert_eq!(window_tables, usize::from(h.durable_window()));
}

/// Each engine's capability answer matches its row, and `ensure_gc_schema`
/// creates exactly the row's tables (idempotently).
pub async fn seam_applicability(spec: Spec) {
    let h = Harness::open(spec).await;
    for e in engines(&h) {
        let kind = e.capabilities().kind;
        let seam = e.capabilities().seam;
        let Some(want) = row(kind, seam.is_some()) else {
            assert!(seam.is_none(), "{kind} is not a seam member");
            continue;
        };
        let seam: GcSeam = seam.unwrap_or_else(|| panic!("{kind} must be a seam member"));
        assert_eq!(seam.window.is_some(), want.window, "{kind} window clauses");
        assert_eq!(seam.pins.is_some(), want.pins, "{kind} pin clauses");
        assert_eq!(
            seam.sweep_lock.is_some(),
            want.lock,
            "{kind} sweep-lock clause"
        );
        for _ in 0..2 {
            seam.schema.ensure_gc_schema().await.unwrap();
            assert_eq!(
                seam.schema.gc_tables().await.unwrap(),
                want.tables,
                "{kind} tables"
            );
        }
        if let Some(w) = &seam.window {
            window_clauses(w.as_ref()).await;
        }
        assert_eq!(
            seam.window_deletes.is_some(),
            want.deletes,
            "{kind} window deletes"
        );
        if let (Some(w), Some(d)) = (&seam.window, &seam.window_deletes) {
            window_deletes(&h, w.as_ref(), d.as_ref()).await;
        }
        if let Some(p) = &seam.pins {
            pin_clauses(&h, p.as_ref()).await;
        }
        if let Some(l) = &seam.sweep_lock {
            let held = l.try_lock().await.unwrap().expect("free lock");
            assert!(
                l.try_lock().await.unwrap().is_none(),
                "{kind} lock is exclusive"
            );
            drop(held);
            let mut again = None;
            for _ in 0..100 {
                again = l.try_lock().await.unwrap();
                if again.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(again.is_some(), "{kind} lock is released on drop");
        }
    }
}

async fn window_clauses(w: &dyn WindowClauses) {
    let ns = Namespace::new("seam-window").unwrap();
    let keys: Vec<Key> = (0..5u8)
        .map(|i| Key::new(ns.clone(), Digest::of(&[i])))
        .collect();
    let base = w.staged_count().await.unwrap();
    // A host with a clock of its own (PostgreSQL) judges `take_due` by it,
    // which may run on while the case does: rows an hour apart are due or
    // not alike by either clock.
    let hour = 3_600_000;
    let t = w.now().await.unwrap().unwrap_or(Timestamp(10_000_000));
    let cands: Vec<StagedCandidate> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| StagedCandidate {
            key: k.clone(),
            size: i as u64,
            visible_after: Timestamp(t.0 + (i as i64 - 1) * hour),
        })
        .collect();
    w.stage(&cands[..3]).await.unwrap();
    // Re-staging keeps the earliest row.
    let mut later = cands[0].clone();
    later.visible_after = Timestamp(t.0 + 10 * hour);
    w.stage(&[later]).await.unwrap();
    assert_eq!(w.staged_count().await.unwrap(), base + 3);
    let digests: Vec<Digest> = keys.iter().map(|k| k.digest).collect();
    assert_eq!(
        w.staged_many(&ns, &digests).await.unwrap(),
        vec![true, true, true, false, false]
    );
    let due = w.take_due(Timestamp(t.0 + 1), None, 100).await.unwrap();
    let mut want: Vec<StagedCandidate> = cands[..2].to_vec();
    want.sort_by(|a, b| a.key.cmp(&b.key));
    let due: Vec<StagedCandidate> = due.into_iter().filter(|c| c.key.namespace == ns).collect();
    assert_eq!(due, want, "due rows, ordered by key");
    let first = w.take_due(Timestamp(t.0 + 1), None, 1).await.unwrap();
    let rest = w
        .take_due(Timestamp(t.0 + 1), Some(&first[0].key), 100)
        .await
        .unwrap();
    assert!(rest.iter().all(|c| c.key > first[0].key));
    w.unstage(&keys).await.unwrap();
    assert_eq!(w.staged_count().await.unwrap(), base);
}

/// `delete_unstaging` (ADR-081) over more than one chunk: every entry it
/// deleted is gone and unstaged, every digest the engine did not hold keeps
/// its row, and rows it was not asked about stay.
async fn window_deletes(h: &Harness, w: &dyn WindowClauses, d: &dyn WindowDeletes) {
    let ns = Namespace::new("seam-deletes").unwrap();
    // Only a kv engine has these clauses (its entries are the ones deleted).
    let kv = h.kv();
    let e = h.kv_engine();
    // 150 stored (more than one 128-row chunk), 10 never stored, 5 stored
    // and staged but not deleted.
    let bodies: Vec<Vec<u8>> = (0..165u32)
        .map(|i| i.to_le_bytes().repeat(i as usize + 1))
        .collect();
    let digests: Vec<Digest> = bodies.iter().map(|b| Digest::of(b)).collect();
    for (i, b) in bodies.iter().enumerate() {
        if !(150..160).contains(&i) {
            kv.put(&Key::new(ns.clone(), digests[i]), b.clone().into())
                .await
                .unwrap();
        }
    }
    let staged: Vec<StagedCandidate> = digests
        .iter()
        .map(|dg| StagedCandidate {
            key: Key::new(ns.clone(), *dg),
            size: 0,
            visible_after: Timestamp(0),
        })
        .collect();
    w.stage(&staged).await.unwrap();
    let freed = d.delete_unstaging(&ns, &digests[..160]).await.unwrap();
    let want: Vec<Option<u64>> = (0..160)
        .map(|i| (i < 150).then(|| bodies[i].len() as u64))
        .collect();
    assert_eq!(freed, want, "freed sizes, None where never stored");
    let present = e.has_many(&ns, &digests).await.unwrap();
    let still: Vec<bool> = (0..165).map(|i| i >= 160).collect();
    assert_eq!(present, still, "deleted entries are gone, the rest stay");
    let rows = w.staged_many(&ns, &digests).await.unwrap();
    let rows_want: Vec<bool> = (0..165).map(|i| i >= 150).collect();
    assert_eq!(rows, rows_want, "deleted entries unstaged, the rest staged");
    let keys: Vec<Key> = staged.into_iter().map(|c| c.key).collect();
    w.unstage(&keys).await.unwrap();
    e.delete_many(&ns, &digests[160..]).await.unwrap();
}

/// Pin rows expire by the host's clock (PostgreSQL's, which the harness
/// moves with its injected clock), whatever `now` a node passes.
async fn pin_clauses(h: &Harness, p: &dyn store_types::PinClauses) {
    use store_core::Clock;
    let key = Key::new(Namespace::new("seam-pins").unwrap(), Digest::of(b"pinned"));
    let other = Key::new(Namespace::new("seam-pins").unwrap(), Digest::of(b"free"));
    let now = || h.clock.now();
    let ttl = Duration::from_secs(10);
    p.pin_commit(&key, "node-a", now(), ttl).await.unwrap();
    assert_eq!(
        p.pin_check(&[key.clone(), other.clone()], now())
            .await
            .unwrap(),
        vec![true, false]
    );
    // Renewal before expiry extends the row.
    h.advance(Duration::from_secs(9)).await;
    assert!(p.pin_renew(&key, "node-a", now(), ttl).await.unwrap());
    h.advance(Duration::from_secs(6)).await;
    assert_eq!(
        p.pin_check(std::slice::from_ref(&key), now())
            .await
            .unwrap(),
        vec![true]
    );
    // A foreign owner has no row to renew.
    assert!(!p.pin_renew(&key, "node-b", now(), ttl).await.unwrap());
    // After expiry: not protected, not revived, reaped.
    h.advance(Duration::from_secs(15)).await;
    assert_eq!(
        p.pin_check(std::slice::from_ref(&key), now())
            .await
            .unwrap(),
        vec![false]
    );
    assert!(!p.pin_renew(&key, "node-a", now(), ttl).await.unwrap());
    assert_eq!(
        p.pin_check(std::slice::from_ref(&key), now())
            .await
            .unwrap(),
        vec![false]
    );
    assert_eq!(p.reap_expired(now()).await.unwrap(), 1);
    assert_eq!(p.reap_expired(now()).await.unwrap(), 0);
}
