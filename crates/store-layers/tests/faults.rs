//! Fault injection through the facade: a `store-core` store over wrapped
//! `store-mem` (and `store-local`) engines. A faulted put fails cleanly —
//! nothing visible, no stage left; a seed reproduces its failure sequence;
//! a read faulted at an offset fails a verified get (never wrong bytes);
//! the metrics count what was done.

use std::io::ErrorKind;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use store_core::{Mode, Store};
use store_layers::{
    render_prometheus, FaultLayer, FaultPlan, LayerStack, MetricsLayer, Op, Rule, TraceLayer,
};
use store_local::{LocalEngine, LocalOptions};
use store_mem::MemEngine;
use store_types::EngineExt as _;
use store_types::{Digest, Engine, Error, Key, KvEngine, LargeEngine, Namespace, Tier};

const THRESHOLD: u64 = 4096;
/// A large-tier entry of several of the put pipeline's 256 KiB write
/// batches (so "the second write fails" happens within one put).
const BIG: usize = 600_000;

fn ns() -> Namespace {
    Namespace::new("faults").unwrap()
}

/// Deterministic content: `len` bytes from `seed`.
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Fixture {
    store: Store,
    local: Option<Arc<LocalEngine>>,
    large: Arc<dyn Engine>,
    metrics: MetricsLayer,
    faults: FaultLayer,
    _dir: tempfile::TempDir,
}

/// mem kv + (local or mem) large, dual-tier, both wrapped in the fault
/// layer of `plan`, metrics and tracing.
async fn open(plan: FaultPlan, local: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let faults = FaultLayer::new(plan);
    let metrics = MetricsLayer::new();
    let stack = LayerStack::new()
        .layer(faults.clone())
        .layer(metrics.clone())
        .layer(TraceLayer::new());
    let (local, large): (Option<Arc<LocalEngine>>, Arc<dyn LargeEngine>) = if local {
        let e = Arc::new(
            LocalEngine::open(dir.path().join("large"), LocalOptions::default())
                .await
                .unwrap(),
        );
        (Some(e.clone()), e)
    } else {
        (None, Arc::new(MemEngine::new()))
    };
    let large_plain: Arc<dyn Engine> = large.clone();
    let store = Store::builder()
        .kv_shared(stack.kv(Arc::new(MemEngine::new())))
        .large_shared(stack.large(large))
        .mode(Mode::DualTier {
            threshold: THRESHOLD,
        })
        .build()
        .await
        .unwrap();
    Fixture {
        store,
        local,
        large: large_plain,
        metrics,
        faults,
        _dir: dir,
    }
}

impl Fixture {
    async fn put(&self, data: &[u8]) -> Result<Key, Error> {
        self.store.put(&ns(), data).await.map(|r| r.key().clone())
    }

    async fn get(&self, key: &Key) -> Result<Bytes, Error> {
        match self.store.get(key).await? {
            Some(blob) => blob.bytes().await,
            None => Err(Error::Missing),
        }
    }

    /// Nothing of a failed put of `data` is visible or left staged.
    async fn assert_nothing_left(&self, data: &[u8]) {
        let key = Key::new(ns(), Digest::of(data));
        assert!(!self.store.has(&key).await.unwrap(), "no entry visible");
        assert_eq!(
            self.large.has_many(&ns(), &[key.digest]).await.unwrap(),
            vec![false],
            "the large engine does not hold it"
        );
        if let Some(local) = &self.local {
            assert_eq!(local.stage_file_count().unwrap(), 0, "no stage file left");
        }
        let snap = self.metrics.snapshot();
        if let Some(large) = snap.engines.iter().find(|e| e.tier == Some(Tier::Large)) {
            assert_eq!(large.stages_open, 0, "no stage left open");
        }
    }
}

/// Each put fault fails the put; nothing is visible, nothing staged; the
/// next put (the rule fired once) stores and verifies.
#[tokio::test]
async fn a_faulted_put_fails_cleanly() {
    let plans = [
        Rule::stages()
            .nth(1)
            .write_fails_at(10_000, ErrorKind::StorageFull),
        Rule::stages()
            .nth(1)
            .short_write_at(10_000, ErrorKind::WriteZero),
        Rule::stages()
            .nth(1)
            .short_write_at(1, ErrorKind::WriteZero),
        Rule::on_any(&[Op::Stage, Op::StageExpecting])
            .nth(1)
            .fail(ErrorKind::PermissionDenied),
        Rule::on_any(&[Op::Publish, Op::PublishPinned])
            .nth(1)
            .fail(ErrorKind::Other),
        Rule::on(Op::Write).nth(2).fail(ErrorKind::TimedOut),
    ];
    for local in [true, false] {
        for rule in plans.clone() {
            let what = format!("{rule:?} (local: {local})");
            let f = open(FaultPlan::new(1).rule(rule), local).await;
            let data = content(1, BIG);
            let err = f.put(&data).await.expect_err(&what);
            assert!(
                store_types::Report::new(&err)
                    .to_string()
                    .contains("injected fault"),
                "{what}: the injected error surfaces: {err}"
            );
            f.assert_nothing_left(&data).await;
            assert_eq!(f.faults.injections().len(), 1, "{what}");
            let key = f.put(&data).await.expect(&what);
            assert_eq!(&f.get(&key).await.unwrap()[..], &data[..], "{what}");
        }
    }
}

/// A kv put fault fails the small put with nothing visible.
#[tokio::test]
async fn a_faulted_kv_put_fails_cleanly() {
    let f = open(
        FaultPlan::new(2).rule(Rule::on(Op::Put).nth(1).fail(ErrorKind::ConnectionReset)),
        false,
    )
    .await;
    let data = content(2, 100);
    f.put(&data).await.expect_err("faulted");
    assert!(!f
        .store
        .has(&Key::new(ns(), Digest::of(&data)))
        .await
        .unwrap());
    let key = f.put(&data).await.unwrap();
    assert_eq!(&f.get(&key).await.unwrap()[..], &data[..]);
}

/// What a run of puts and gets under a random plan did: per step, whether
/// the put and the get succeeded.
async fn run(seed: u64) -> (Vec<(bool, Option<bool>)>, Vec<store_layers::Injection>) {
    let plan = FaultPlan::new(seed)
        .rule(Rule::on(Op::Write).probability(0.05).fail(ErrorKind::Other))
        .rule(Rule::on(Op::Put).probability(0.3).fail(ErrorKind::TimedOut))
        .rule(
            Rule::reads()
                .probability(0.3)
                .read_fails_at(1000, ErrorKind::UnexpectedEof),
        )
        .rule(Rule::on(Op::Meta).jitter(Duration::from_millis(2)));
    let f = open(plan, false).await;
    let mut outcomes = Vec::new();
    for i in 0..24u64 {
        let len = if i % 2 == 0 { 2000 } else { 60_000 };
        let data = content(100 + i, len);
        match f.put(&data).await {
            Ok(key) => {
                let got = f.get(&key).await;
                if let Ok(bytes) = &got {
                    assert_eq!(&bytes[..], &data[..], "a get never returns wrong bytes");
                }
                outcomes.push((true, Some(got.is_ok())));
            }
            Err(_) => {
                f.assert_nothing_left(&data).await;
                outcomes.push((false, None));
            }
        }
    }
    (outcomes, f.faults.injections())
}

/// The same seed gives the same faults, and so the same failures.
#[tokio::test]
async fn a_seed_reproduces_its_failure_sequence() {
    let (a, ia) = run(7).await;
    let (b, ib) = run(7).await;
    assert_eq!(a, b, "same seed, same outcomes");
    assert_eq!(ia, ib, "same seed, same injections");
    assert!(a.iter().any(|(put, _)| !put), "some put failed: {a:?}");
    assert!(
        a.iter().any(|(_, get)| *get == Some(false)),
        "some get failed: {a:?}"
    );
    assert!(
        a.iter().any(|(_, get)| *get == Some(true)),
        "some get succeeded: {a:?}"
    );
    let (_, ic) = run(8).await;
    assert_ne!(ia, ic, "another seed, other injections");
}

/// A read failed or cut short at an offset fails the verified get, for
/// either tier; the next read (the rule fired once) returns the bytes.
#[tokio::test]
async fn a_read_fault_at_an_offset_fails_a_verified_get() {
    for (len, at, tier) in [
        (BIG, 50_000u64, Tier::Large),
        (3000, 1000, Tier::Kv),
        (BIG, 0, Tier::Large),
    ] {
        for rule in [
            Rule::reads()
                .tier(tier)
                .nth(1)
                .read_fails_at(at, ErrorKind::UnexpectedEof),
            Rule::reads().tier(tier).nth(1).read_truncated_at(at),
        ] {
            let what = format!("{rule:?} on {len} bytes");
            let f = open(FaultPlan::new(3).rule(rule), true).await;
            let data = content(3, len);
            let key = f.put(&data).await.unwrap();
            let err = match f.get(&key).await {
                Ok(_) => panic!(
                    "{what}: the get succeeded; injected: {:?}",
                    f.faults.injections()
                ),
                Err(e) => e,
            };
            assert!(
                matches!(err, Error::Io { .. } | Error::Verification { .. }),
                "{what}: {err:?}"
            );
            assert_eq!(&f.get(&key).await.unwrap()[..], &data[..], "{what}");
        }
    }
}

/// The counts match the operations done, and render as Prometheus text.
#[tokio::test]
async fn metrics_count_the_operations_done() {
    let faults =
        FaultLayer::new(FaultPlan::new(4).rule(Rule::on(Op::Meta).nth(2).fail(ErrorKind::Other)));
    let metrics = MetricsLayer::new();
    let stack = LayerStack::new().layer(faults).layer(metrics.clone());
    let kv: Arc<dyn KvEngine> = stack.kv(Arc::new(MemEngine::new()));
    let mut keys = Vec::new();
    for i in 0..3u64 {
        let data = content(i, 10 + i as usize);
        let key = Key::new(ns(), Digest::of(&data));
        kv.put(&key, Bytes::from(data)).await.unwrap();
        keys.push(key);
    }
    assert!(kv.meta(&keys[0]).await.unwrap().is_some());
    assert!(
        kv.meta(&keys[1]).await.is_err(),
        "the second meta is faulted"
    );
    let digests: Vec<Digest> = keys.iter().map(|k| k.digest).collect();
    assert_eq!(kv.has_many(&ns(), &digests).await.unwrap(), vec![true; 3]);
    let r = kv.read_whole(&keys[2]).await.unwrap().unwrap();
    let mut rd = r.into_stream().reader;
    let mut buf = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut rd, &mut buf)
        .await
        .unwrap();

    let snap = metrics.snapshot();
    let e = snap.engine("mem", Some(Tier::Kv)).expect("mem kv counted");
    assert_eq!(e.op(Op::Put).calls, 3);
    assert_eq!(e.op(Op::Put).error_total(), 0);
    assert_eq!(e.op(Op::Meta).calls, 2);
    assert_eq!(e.op(Op::Meta).errors_of("io"), 1);
    assert_eq!(e.op(Op::HasMany).calls, 1);
    assert_eq!(e.op(Op::Read).calls, 1);
    assert_eq!(e.op(Op::Scan).calls, 0);
    assert_eq!(e.bytes_read, 12);
    for op in &e.ops {
        assert_eq!(
            op.latency_buckets.iter().sum::<u64>(),
            op.calls,
            "every call in one bucket: {op:?}"
        );
    }
    let text = render_prometheus(&snap);
    for line in [
        "blobpool_engine_op_duration_seconds_count{engine=\"mem\",tier=\"kv\",op=\"put\"} 3",
        "blobpool_engine_op_duration_seconds_bucket{engine=\"mem\",tier=\"kv\",op=\"put\",le=\"+Inf\"} 3",
        "blobpool_engine_op_errors_total{engine=\"mem\",tier=\"kv\",op=\"meta\",error=\"io\"} 1",
        "blobpool_engine_read_bytes_total{engine=\"mem\",tier=\"kv\"} 12",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }

    // Through the facade: one big put streams its bytes into one stage.
    let f = open(FaultPlan::none(), true).await;
    let data = content(5, BIG);
    let key = f.put(&data).await.unwrap();
    assert_eq!(&f.get(&key).await.unwrap()[..], &data[..]);
    let snap = f.metrics.snapshot();
    let large = snap
        .engine("local", Some(Tier::Large))
        .expect("local counted");
    assert_eq!(large.bytes_written, BIG as u64);
    assert_eq!(
        large.op(Op::Stage).calls + large.op(Op::StageExpecting).calls,
        1
    );
    assert_eq!(
        large.op(Op::Publish).calls + large.op(Op::PublishPinned).calls,
        1
    );
    assert_eq!(large.stages_open, 0);
    assert_eq!(large.bytes_read, BIG as u64);
    let kv = snap.engine("mem", Some(Tier::Kv)).expect("mem counted");
    assert_eq!(
        kv.op(Op::Put).calls,
        0,
        "a big blob never reaches the kv tier"
    );
}

/// A lost acknowledgement: the kv put takes effect, the caller sees the
/// error; a retry finds the entry (dedup) and it verifies.
#[tokio::test]
async fn a_lost_acknowledgement_never_leaves_a_wrong_entry() {
    let f = open(
        FaultPlan::new(6).rule(
            Rule::on(Op::Put)
                .nth(1)
                .fail_after(ErrorKind::ConnectionAborted),
        ),
        false,
    )
    .await;
    let data = content(6, 200);
    let err = f.put(&data).await.expect_err("the acknowledgement is lost");
    assert!(
        store_types::Report::new(&err)
            .to_string()
            .contains("after the engine answered"),
        "{err}"
    );
    let key = f.put(&data).await.unwrap();
    assert_eq!(&f.get(&key).await.unwrap()[..], &data[..]);
}

/// A fixed delay holds the call for at least that long, and only the
/// operation it names.
#[tokio::test]
async fn a_delay_holds_the_call() {
    let faults = FaultLayer::new(
        FaultPlan::new(7).rule(Rule::on(Op::Meta).delay(Duration::from_millis(200))),
    );
    let kv = LayerStack::new()
        .layer(faults.clone())
        .kv(Arc::new(MemEngine::new()));
    let key = Key::new(ns(), Digest::of(b"x"));
    let start = std::time::Instant::now();
    assert_eq!(kv.meta(&key).await.unwrap(), None);
    assert!(start.elapsed() >= Duration::from_millis(200));
    assert!(!kv.has_many(&ns(), &[key.digest]).await.unwrap()[0]);
    let injected: Vec<Op> = faults.injections().iter().map(|i| i.op).collect();
    assert_eq!(
        injected,
        vec![Op::Meta],
        "only the named operation is delayed"
    );
}
