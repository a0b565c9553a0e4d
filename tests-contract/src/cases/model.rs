//! A proptest state machine over the GC protocol: random interleavings of
//! put, pin drop, liveness change, direct delete, sweep and clock advance,
//! checked against a model after every step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use store_core::{Error, Key, Mode, Pin, SweepOptions};
use store_types::Digest;

use crate::data::content;
use crate::harness::{ns, Harness, Opts, Spec, THRESHOLD};
use crate::support::LiveSet;

const ITEMS: usize = 5;
const WINDOW_SECS: u64 = 10;

/// One operation of the state machine.
#[derive(Clone, Debug)]
pub enum Op {
    /// Put item i (keeping the pin).
    Put(usize),
    /// Drop one pin of item i.
    DropPin(usize),
    /// Set item i referenced or not.
    Live(usize, bool),
    /// Direct delete of item i.
    Delete(usize),
    /// Sweep.
    Sweep,
    /// Advance the clock.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..ITEMS).prop_map(Op::Put),
        3 => (0..ITEMS).prop_map(Op::DropPin),
        2 => (0..ITEMS, any::<bool>()).prop_map(|(i, b)| Op::Live(i, b)),
        1 => (0..ITEMS).prop_map(Op::Delete),
        3 => Just(Op::Sweep),
        2 => (1..(2 * WINDOW_SECS)).prop_map(Op::Advance),
    ]
}

#[derive(Default, Clone, Copy)]
struct Item {
    exists: bool,
    pins: usize,
    live: bool,
    /// `visible_after` (seconds) when staged.
    staged: Option<u64>,
}

impl Item {
    fn protected(&self) -> bool {
        self.pins > 0 || self.live
    }
}

/// Runs the state machine on `spec` (a plain `#[test]`: it owns its runtime).
pub fn gc_model(spec: Spec) {
    let cases = if spec.uses_postgres() { 8 } else { 24 };
    let mut runner = TestRunner::new(Config {
        cases,
        // Failures are saved beside the crate and replayed first on every
        // run; the file is committed (it starts with no case).
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/proptest-regressions/gc_model.txt"
            )),
        )),
        ..Config::default()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runner
        .run(&proptest::collection::vec(op(), 1..40), |ops| {
            rt.block_on(run(spec, ops));
            Ok(())
        })
        .unwrap();
}

async fn run(spec: Spec, ops: Vec<Op>) {
    let h = Harness::open_with(
        spec,
        Opts {
            window: Duration::from_secs(WINDOW_SECS),
        },
    )
    .await;
    let live = LiveSet::new();
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(live.clone()))
        .await
        .unwrap();
    let big = match h.spec.mode() {
        Mode::KvOnly { .. } => THRESHOLD as usize,
        _ => THRESHOLD as usize + 100,
    };
    let data: Vec<Vec<u8>> = (0..ITEMS)
        .map(|i| content(900 + i as u64, if i % 2 == 0 { 77 + i } else { big }))
        .collect();
    let keys: Vec<Key> = data.iter().map(|d| Key::new(ns(), Digest::of(d))).collect();
    let mut model = [Item::default(); ITEMS];
    let mut pins: HashMap<usize, Vec<Pin>> = HashMap::new();
    let mut now = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Put(i) => {
                let r = h.store.put(&ns(), &data[i][..]).await.unwrap();
                assert_eq!(r.deduplicated, model[i].exists, "step {step} {op:?}");
                pins.entry(i).or_default().push(r.pin);
                model[i].exists = true;
                model[i].pins += 1;
            }
            Op::DropPin(i) => {
                if let Some(p) = pins.get_mut(&i).and_then(|v| v.pop()) {
                    drop(p);
                    model[i].pins -= 1;
                }
            }
            Op::Live(i, on) => {
                live.set(&keys[i], on);
                model[i].live = on;
            }
            Op::Delete(i) => {
                let res = h.store.delete(&keys[i]).await;
                let m = &mut model[i];
                if m.protected() {
                    assert!(
                        matches!(res, Err(Error::GcRefuse { .. })),
                        "step {step}: {res:?}"
                    );
                } else if m.exists {
                    res.unwrap();
                    m.exists = false;
                    m.staged = None;
                } else {
                    assert!(matches!(res, Err(Error::Missing)), "step {step}: {res:?}");
                }
            }
            Op::Advance(s) => {
                now += s;
                h.advance(Duration::from_secs(s)).await;
            }
            Op::Sweep => {
                let rep = h.store.gc().sweep(SweepOptions::default()).await.unwrap();
                let mut deleted = 0;
                for m in model.iter_mut() {
                    if let Some(va) = m.staged {
                        if va <= now {
                            m.staged = None;
                            if !m.protected() && m.exists {
                                m.exists = false;
                                deleted += 1;
                            }
                        }
                    }
                }
                let mut staged = 0;
                for m in model.iter_mut() {
                    if m.exists && m.staged.is_none() && !m.protected() {
                        m.staged = Some(now + WINDOW_SECS);
                        staged += 1;
                    }
                }
                assert_eq!(
                    (rep.total.deleted, rep.total.staged),
                    (deleted, staged),
                    "step {step}"
                );
            }
        }
        for (i, m) in model.iter().enumerate() {
            let has = h.store.has(&keys[i]).await.unwrap();
            if m.protected() && m.exists {
                assert!(has, "step {step} {op:?}: protected item {i} was deleted");
            }
            assert_eq!(has, m.exists, "step {step} {op:?}: item {i}");
        }
    }
}
