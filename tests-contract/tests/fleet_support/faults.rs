//! Fault injection through the engine seams (redb-style wrapper engines)
//! and the fleet GC model.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use store_core::{Error, Key, Namespace, SweepOptions};
use store_local::LocalEngine;
use store_postgres::PostgresEngine;
use store_types::{
    BatchClauses, BoundLivenessTable, Capabilities, Digest, Engine, EntryMeta, FleetBatch,
    Instance, KvEngine, LargeEngine, LivenessClauses, LivenessTable, PinClauses, PinIntent,
    PinRows, PolicyClauses, ProtectReason, PublishOutcome, ReadOptions, Result, SizedRead, Stage,
    StagedWrite, Timestamp,
};
use tests_contract::data::content;
use tests_contract::fleet::{FleetEnv, FleetLarge};
use tests_contract::ns_named;
use tests_contract::THRESHOLD;

/// This file's namespace (the `fleet-sweeper` binary uses it too).
const NS: &str = "fleet";

/// A `local` engine whose publish "crashes" before the rename.
struct CrashBeforeRename(LocalEngine);

struct CrashStage(Box<dyn StagedWrite>);

#[async_trait]
impl StagedWrite for CrashStage {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.0.write(chunk).await
    }
    async fn publish(self: Box<Self>, _key: &Key) -> Result<PublishOutcome> {
        self.0.abort().await?;
        Err(Error::io(store_types::ErrorKind::Other, "injected publish")
            .with_source("injected crash before the publishing rename"))
    }
    async fn abort(self: Box<Self>) -> Result<()> {
        self.0.abort().await
    }
}

macro_rules! delegate_engine {
    ($ty:ty, $inner:ident => $seam:expr) => {
        #[async_trait]
        impl Engine for $ty {
            fn capabilities(&self) -> Capabilities {
                let $inner = &self.0;
                Capabilities {
                    seam: $seam,
                    ..self.0.capabilities()
                }
            }
            async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
                self.0.meta(key).await
            }
            async fn has_many(&self, ns: &Namespace, d: &[Digest]) -> Result<Vec<bool>> {
                self.0.has_many(ns, d).await
            }
            async fn read(&self, key: &Key, o: &ReadOptions) -> Result<Option<SizedRead>> {
                self.0.read(key, o).await
            }
            async fn delete_many(&self, ns: &Namespace, d: &[Digest]) -> Result<Vec<Option<u64>>> {
                self.0.delete_many(ns, d).await
            }
            async fn namespaces(&self) -> Result<Vec<Namespace>> {
                self.0.namespaces().await
            }
            async fn scan(
                &self,
                ns: &Namespace,
                after: Option<Digest>,
                limit: usize,
            ) -> Result<Vec<(Digest, u64)>> {
                self.0.scan(ns, after, limit).await
            }
        }
    };
}

delegate_engine!(CrashBeforeRename, inner => inner.capabilities().seam);

#[async_trait]
impl LargeEngine for CrashBeforeRename {
    async fn stage(&self, ns: &Namespace) -> Result<Stage> {
        Ok(Stage::Plain(Box::new(CrashStage(
            self.0.stage(ns).await?.into_plain(),
        ))))
    }
}

/// A postgres kv engine whose pin-first step fails (a crash after the
/// stage was written, before the pin row committed).
struct FailPinFirst(PostgresEngine);

struct FailingPins(Arc<dyn PinClauses>);

#[async_trait]
impl PinRows for FailingPins {
    async fn pin_commit(&self, k: &Key, o: &str, n: Timestamp, t: Duration) -> Result<()> {
        self.0.pin_commit(k, o, n, t).await
    }
    async fn pin_renew(&self, k: &Key, o: &str, n: Timestamp, t: Duration) -> Result<bool> {
        self.0.pin_renew(k, o, n, t).await
    }
    async fn pin_check(&self, keys: &[Key], now: Timestamp) -> Result<Vec<bool>> {
        self.0.pin_check(keys, now).await
    }
    async fn reap_expired(&self, now: Timestamp) -> Result<u64> {
        self.0.reap_expired(now).await
    }
    fn pin_host(&self) -> Instance {
        self.0.pin_host()
    }
    async fn put_pinned(&self, k: &Key, b: Bytes, p: &PinIntent) -> Result<PublishOutcome> {
        self.0.put_pinned(k, b, p).await
    }
    async fn pin_first(&self, _k: &Key, _p: &PinIntent) -> Result<store_types::PinGeneration> {
        Err(
            Error::backend(store_types::ErrorKind::Other, "injected pin")
                .with_source("injected crash before the pin row committed"),
        )
    }
}

#[async_trait]
impl LivenessClauses for FailingPins {
    async fn bind_liveness_table(
        &self,
        ns: &Namespace,
        t: &LivenessTable,
    ) -> Result<BoundLivenessTable> {
        self.0.bind_liveness_table(ns, t).await
    }
    async fn register_liveness_table(
        &self,
        ns: &Namespace,
        t: &LivenessTable,
        r: &str,
    ) -> Result<BoundLivenessTable> {
        self.0.register_liveness_table(ns, t, r).await
    }
    async fn deregister_liveness_table(
        &self,
        ns: &Namespace,
        t: &LivenessTable,
        r: Option<&str>,
    ) -> Result<bool> {
        self.0.deregister_liveness_table(ns, t, r).await
    }
    async fn liveness_tables(&self) -> Result<Vec<BoundLivenessTable>> {
        self.0.liveness_tables().await
    }
}

#[async_trait]
impl BatchClauses for FailingPins {
    async fn arbitrate(
        &self,
        keys: &[Key],
        t: &[BoundLivenessTable],
        now: Timestamp,
    ) -> Result<Vec<Option<ProtectReason>>> {
        self.0.arbitrate(keys, t, now).await
    }
    async fn begin_batch(&self, keys: &[Key]) -> Result<Box<dyn FleetBatch>> {
        self.0.begin_batch(keys).await
    }
    async fn unfence(&self, keys: &[Key]) -> Result<()> {
        self.0.unfence(keys).await
    }
    async fn stale_fences(&self, grace: Duration, limit: usize) -> Result<Vec<Key>> {
        self.0.stale_fences(grace, limit).await
    }
}

#[async_trait]
impl PolicyClauses for FailingPins {
    async fn set_gc_policy(
        &self,
        ns: &Namespace,
        owner: &str,
        policy: Option<store_types::FleetPolicy>,
    ) -> Result<()> {
        self.0.set_gc_policy(ns, owner, policy).await
    }
    async fn gc_policies(&self) -> Result<Vec<store_types::PolicyRow>> {
        self.0.gc_policies().await
    }
}

delegate_engine!(FailPinFirst, inner => inner.capabilities().seam.map(|mut s| {
    s.pins = s.pins.map(|p| Arc::new(FailingPins(p)) as Arc<dyn PinClauses>);
    s
}));

#[async_trait]
impl KvEngine for FailPinFirst {
    async fn put(&self, key: &Key, bytes: Bytes) -> Result<PublishOutcome> {
        self.0.put(key, bytes).await
    }
}

pub async fn crash_between_pin_and_rename() {
    let ttl = Duration::from_secs(60);
    let env = FleetEnv::new(FleetLarge::SharedLocal, Duration::ZERO, ttl).await;
    let local = match env.large_engine().await {
        Some(_) => LocalEngine::open(
            env.dir.path(),
            store_local::LocalOptions {
                shared_media: true,
                fsync: true,
                ..store_local::LocalOptions::default()
            },
        )
        .await
        .unwrap(),
        None => unreachable!(),
    };
    let probe = local.clone();
    let crashing = env
        .builder(
            "a",
            Arc::new(env.kv().await),
            Some(Arc::new(CrashBeforeRename(local))),
        )
        .build()
        .await
        .unwrap();
    let healthy = env.node("b", &ns_named(NS)).await;
    let data = content(90, THRESHOLD as usize * 2);
    let key = Key::new(ns_named(NS), Digest::of(&data));
    let res = crashing.put(&ns_named(NS), &data[..]).await;
    assert!(matches!(res, Err(Error::Io(_))), "{res:?}");
    assert!(!healthy.has(&key).await.unwrap(), "nothing visible");
    assert_eq!(probe.stage_file_count().unwrap(), 0, "no stage file left");
    assert_eq!(
        env.pin_rows(&key).await,
        1,
        "the orphan pin row of the crash"
    );
    // Sweeps before expiry see no entry; after the TTL the row is reaped.
    assert_eq!(
        healthy
            .gc()
            .sweep(SweepOptions::default())
            .await
            .unwrap()
            .reaped_pins,
        0
    );
    env.advance(ttl + Duration::from_secs(1)).await;
    let r = healthy.gc().sweep(SweepOptions::default()).await.unwrap();
    assert_eq!(r.reaped_pins, 1);
    assert_eq!(env.pin_rows(&key).await, 0);
    // A healthy put of the same bytes works afterwards.
    assert!(
        !healthy
            .put(&ns_named(NS), &data[..])
            .await
            .unwrap()
            .deduplicated
    );
}

pub async fn crash_between_stage_and_pin() {
    let env = FleetEnv::new(
        FleetLarge::SharedLocal,
        Duration::ZERO,
        Duration::from_secs(60),
    )
    .await;
    let large = LocalEngine::open(
        env.dir.path(),
        store_local::LocalOptions {
            shared_media: true,
            fsync: true,
            ..store_local::LocalOptions::default()
        },
    )
    .await
    .unwrap();
    let probe = large.clone();
    let failing = env
        .builder(
            "a",
            Arc::new(FailPinFirst(env.kv().await)),
            Some(Arc::new(large)),
        )
        .build()
        .await
        .unwrap();
    let data = content(91, THRESHOLD as usize * 2);
    let key = Key::new(ns_named(NS), Digest::of(&data));
    let res = failing.put(&ns_named(NS), &data[..]).await;
    assert!(matches!(res, Err(Error::Backend(_))), "{res:?}");
    assert!(!failing.has(&key).await.unwrap());
    assert_eq!(env.pin_rows(&key).await, 0);
    assert_eq!(probe.stage_file_count().unwrap(), 0);
}

pub async fn fault_inside_joint_transaction() {
    let env = FleetEnv::new(FleetLarge::PgLo, Duration::ZERO, Duration::from_secs(60)).await;
    let node = env.node("a", &ns_named(NS)).await;
    env.fail_pin_inserts(true).await;
    for len in [100usize, THRESHOLD as usize * 3] {
        let data = content(92 + len as u64, len);
        let key = Key::new(ns_named(NS), Digest::of(&data));
        let res = node.put(&ns_named(NS), &data[..]).await;
        assert!(matches!(res, Err(Error::Backend(_))), "len {len}: {res:?}");
        assert!(
            !node.has(&key).await.unwrap(),
            "len {len}: entry rolled back with the pin"
        );
        assert_eq!(env.pin_rows(&key).await, 0);
    }
    env.fail_pin_inserts(false).await;
    let data = content(99, THRESHOLD as usize * 3);
    let r = node.put(&ns_named(NS), &data[..]).await.unwrap();
    assert!(!r.deduplicated);
    assert_eq!(env.pin_rows(r.key()).await, 1);
}

/// One step of the fleet model.
#[derive(Clone, Debug)]
enum Op {
    Put(usize, bool),
    Ref(usize, bool),
    Sweep(bool),
    Advance(u64),
}

const ITEMS: usize = 4;
const WINDOW: u64 = 10;
const TTL: u64 = 25;

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..ITEMS, any::<bool>()).prop_map(|(i, n)| Op::Put(i, n)),
        2 => (0..ITEMS, any::<bool>()).prop_map(|(i, b)| Op::Ref(i, b)),
        3 => any::<bool>().prop_map(Op::Sweep),
        3 => (1..30u64).prop_map(Op::Advance),
    ]
}

/// The GC model of the single-node suite, on a two-instance fleet: puts
/// on either node, references in the shared table, sweeps on either node,
/// clock advances; after every step each node's view equals the model.
pub fn run_fleet_model() {
    let mut runner = TestRunner::new(Config {
        cases: 6,
        // Failures are saved beside the crate and replayed first on every
        // run; the file is committed (it starts with no case).
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/proptest-regressions/fleet_model.txt"
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
        .run(&proptest::collection::vec(op(), 1..30), |ops| {
            rt.block_on(run_case(ops));
            Ok(())
        })
        .unwrap();
}

async fn run_case(ops: Vec<Op>) {
    let env = FleetEnv::new(
        FleetLarge::SharedLocal,
        Duration::from_secs(WINDOW),
        Duration::from_secs(TTL),
    )
    .await;
    let nodes = [
        env.node("a", &ns_named(NS)).await,
        env.node("b", &ns_named(NS)).await,
    ];
    let data: Vec<Vec<u8>> = (0..ITEMS)
        .map(|i| {
            content(
                300 + i as u64,
                if i % 2 == 0 {
                    50
                } else {
                    THRESHOLD as usize + 9
                },
            )
        })
        .collect();
    let keys: Vec<Key> = data
        .iter()
        .map(|d| Key::new(ns_named(NS), Digest::of(d)))
        .collect();
    #[derive(Default, Clone, Copy)]
    struct Item {
        exists: bool,
        pinned_until: u64,
        referenced: bool,
        staged: Option<u64>,
    }
    let mut m = [Item::default(); ITEMS];
    let mut now = 0u64;
    for (step, op) in ops.iter().enumerate() {
        match *op {
            Op::Put(i, n) => {
                let r = nodes[usize::from(n)]
                    .put(&ns_named(NS), &data[i][..])
                    .await
                    .unwrap();
                assert_eq!(r.deduplicated, m[i].exists, "step {step} {op:?}");
                m[i].exists = true;
                m[i].pinned_until = now + TTL;
            }
            Op::Ref(i, on) => {
                if m[i].referenced != on {
                    env.set_ref(&keys[i], on).await;
                }
                m[i].referenced = on;
            }
            Op::Advance(s) => {
                now += s;
                env.advance(Duration::from_secs(s)).await;
            }
            Op::Sweep(n) => {
                let rep = nodes[usize::from(n)]
                    .gc()
                    .sweep(SweepOptions::default())
                    .await
                    .unwrap();
                assert_eq!(rep.aborted, None);
                let protected = |it: &Item| it.pinned_until > now || it.referenced;
                let (mut deleted, mut staged) = (0, 0);
                for it in m.iter_mut() {
                    if let Some(va) = it.staged {
                        if va <= now {
                            it.staged = None;
                            if it.exists && !protected(it) {
                                it.exists = false;
                                deleted += 1;
                            }
                        }
                    }
                }
                for it in m.iter_mut() {
                    if it.exists && it.staged.is_none() && !protected(it) {
                        it.staged = Some(now + WINDOW);
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
        for (i, it) in m.iter().enumerate() {
            for node in &nodes {
                assert_eq!(
                    node.has(&keys[i]).await.unwrap(),
                    it.exists,
                    "step {step} {op:?} item {i}"
                );
            }
        }
    }
}
