//! The forwarding base forwards everything: a recording engine that
//! overrides every method (the default-bodied ones too, with answers no
//! default gives) is wrapped, every method is called through the wrapper,
//! and each must reach the engine and come back unchanged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use store_layers::{
    EngineLayer, FaultLayer, FaultPlan, LayerStack, Layered, MetricsLayer, TraceLayer,
};
use store_types::EngineExt as _;
use store_types::{
    BlobReader, Capabilities, Digest, Engine, EntryMeta, Error, Instance, InstanceLock,
    JointStagedWrite, Key, KvEngine, LargeEngine, Namespace, PinIntent, PublishOutcome,
    RangeRequest, ReadOptions, RefStore, Result, Sharing, SizedRead, Stage, StagedWrite, Timestamp,
};
use tokio::io::AsyncReadExt;

type Log = Arc<Mutex<Vec<&'static str>>>;

/// An engine that records each method called and answers with values no
/// trait default would give.
struct Recorder {
    log: Log,
}

impl Recorder {
    fn note(&self, m: &'static str) {
        self.log.lock().unwrap().push(m);
    }
}

struct RecStage {
    log: Log,
}

impl RecStage {
    fn note(&self, m: &'static str) {
        self.log.lock().unwrap().push(m);
    }
}

fn meta() -> EntryMeta {
    EntryMeta {
        size: 7,
        created_at: Timestamp(42),
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl Engine for Recorder {
    fn capabilities(&self) -> Capabilities {
        self.note("capabilities");
        Capabilities {
            kind: "recorder",
            instance: Instance::Other("recorder://".into()),
            sharing: Sharing::ProcessLocal,
            durable: false,
            seam: None,
        }
    }
    async fn meta(&self, _key: &Key) -> Result<Option<EntryMeta>> {
        self.note("meta");
        Ok(Some(meta()))
    }
    async fn has_many(&self, _ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        self.note("has_many");
        Ok(vec![true; digests.len()])
    }
    /// Notes which read it was; a ranged one answers a size and span no
    /// engine holding "content" would give.
    async fn read(&self, _key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>> {
        let all = b"content";
        let Some(request) = &options.range else {
            self.note(if options.from_storage {
                "read_stored"
            } else {
                "read_whole"
            });
            let bytes = Bytes::from_static(all);
            return Ok(Some(SizedRead::whole(BlobReader::from_bytes(bytes))));
        };
        self.note("read_range");
        let span = request.range.clone();
        Ok(Some(SizedRead {
            size: 99,
            span: span.clone(),
            reader: BlobReader::from_bytes(Bytes::copy_from_slice(
                &all[span.start as usize..span.end as usize],
            )),
        }))
    }
    async fn delete_many(&self, _ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        self.note("delete_many");
        Ok(vec![Some(7); digests.len()])
    }
    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        self.note("namespaces");
        Ok(vec![ns()])
    }
    async fn scan(
        &self,
        _ns: &Namespace,
        _after: Option<Digest>,
        _limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        self.note("scan");
        Ok(vec![(Digest::of(b"content"), 7)])
    }
    async fn maintain(&self, _now: Timestamp) -> Result<u64> {
        self.note("maintain");
        Ok(3)
    }
    async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
        self.note("lock_instance");
        Err(Error::InstanceLocked {
            resource: "the recorder".into(),
            holder: "a test".into(),
        })
    }
    async fn read_outboard(&self, _key: &Key) -> Result<Option<Bytes>> {
        self.note("read_outboard");
        Ok(Some(Bytes::from_static(b"outboard")))
    }
    async fn store_outboard(&self, _key: &Key, outboard: Bytes) -> Result<()> {
        assert_eq!(&outboard[..], b"kept");
        self.note("store_outboard");
        Ok(())
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl KvEngine for Recorder {
    async fn put(&self, _key: &Key, _bytes: Bytes) -> Result<PublishOutcome> {
        self.note("put");
        Ok(PublishOutcome::AlreadyPresent)
    }
    fn refs(&self) -> Option<Arc<dyn RefStore>> {
        self.note("refs");
        None
    }
    fn cache(&self) -> Option<Arc<dyn store_types::CacheIndex>> {
        self.note("cache");
        None
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl LargeEngine for Recorder {
    async fn stage(&self, _ns: &Namespace) -> Result<Stage> {
        self.note("stage");
        Ok(Stage::Joint(Box::new(RecStage {
            log: self.log.clone(),
        })))
    }
    async fn stage_expecting(&self, _ns: &Namespace, _digest: &Digest) -> Result<Stage> {
        self.note("stage_expecting");
        Ok(Stage::Joint(Box::new(RecStage {
            log: self.log.clone(),
        })))
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl StagedWrite for RecStage {
    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        assert_eq!(&outboard[..], b"published");
        self.note("set_outboard");
        Ok(())
    }
    async fn write(&mut self, _chunk: Bytes) -> Result<()> {
        self.note("write");
        Ok(())
    }
    async fn publish(self: Box<Self>, _key: &Key) -> Result<PublishOutcome> {
        self.note("publish");
        Ok(PublishOutcome::Inserted)
    }
    async fn abort(self: Box<Self>) -> Result<()> {
        self.note("abort");
        Ok(())
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl JointStagedWrite for RecStage {
    async fn publish_pinned(
        self: Box<Self>,
        _key: &Key,
        _pin: &PinIntent,
    ) -> Result<PublishOutcome> {
        self.note("publish_pinned");
        Ok(PublishOutcome::AlreadyPresent)
    }
}

fn ns() -> Namespace {
    Namespace::new("fwd").unwrap()
}

fn key() -> Key {
    Key::new(ns(), Digest::of(b"content"))
}

/// Calls every method of the three engine traits and of a stage through
/// `kv` and `large`, checking each answer is the recorder's.
async fn call_everything(kv: &dyn KvEngine, large: &dyn LargeEngine) {
    let k = key();
    let d = [k.digest];
    assert_eq!(kv.capabilities().kind, "recorder");
    assert_eq!(kv.meta(&k).await.unwrap(), Some(meta()));
    assert_eq!(kv.has_many(&ns(), &d).await.unwrap(), vec![true]);
    let mut buf = Vec::new();
    let r = kv.read_whole(&k).await.unwrap().unwrap();
    assert_eq!(r.len(), 7);
    {
        let mut rd = r.into_stream().reader;
        rd.read_to_end(&mut buf).await.unwrap()
    };
    assert_eq!(buf, b"content");
    buf.clear();
    let r = kv.read_stored(&k).await.unwrap().unwrap();
    {
        let mut rd = r.into_stream().reader;
        rd.read_to_end(&mut buf).await.unwrap()
    };
    assert_eq!(buf, b"content");
    buf.clear();
    let r = kv.read_exact(&k, 1..4).await.unwrap().unwrap();
    {
        let mut rd = r.into_stream().reader;
        rd.read_to_end(&mut buf).await.unwrap()
    };
    assert_eq!(buf, b"ont");
    buf.clear();
    let r = kv
        .read(&k, &ReadOptions::range(RangeRequest::new(2..5, 0)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((r.size, r.span.clone()), (99, 2..5));
    {
        let mut rd = r.reader.into_stream().reader;
        rd.read_to_end(&mut buf).await.unwrap()
    };
    assert_eq!(buf, b"nte");
    assert_eq!(kv.delete_many(&ns(), &d).await.unwrap(), vec![Some(7)]);
    assert_eq!(kv.namespaces().await.unwrap(), vec![ns()]);
    assert_eq!(kv.scan(&ns(), None, 10).await.unwrap(), vec![(k.digest, 7)]);
    assert!(kv.capabilities().seam.is_none());
    assert_eq!(kv.maintain(Timestamp(1)).await.unwrap(), 3);
    assert!(matches!(
        kv.lock_instance().await,
        Err(Error::InstanceLocked { .. })
    ));
    assert_eq!(
        kv.put(&k, Bytes::from_static(b"content")).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
    assert!(kv.refs().is_none());
    assert!(kv.cache().is_none());
    assert_eq!(
        large.read_outboard(&k).await.unwrap().as_deref(),
        Some(&b"outboard"[..])
    );
    large
        .store_outboard(&k, Bytes::from_static(b"kept"))
        .await
        .unwrap();

    let mut s = large.stage(&ns()).await.unwrap();
    assert!(matches!(s, Stage::Joint(_)), "the stage stays joint: {s:?}");
    s.write(Bytes::from_static(b"con")).await.unwrap();
    s.set_outboard(Bytes::from_static(b"published"))
        .await
        .unwrap();
    assert_eq!(s.publish(&k).await.unwrap(), PublishOutcome::Inserted);
    let s = large.stage_expecting(&ns(), &k.digest).await.unwrap();
    s.abort().await.unwrap();
    let Stage::Joint(s) = large.stage(&ns()).await.unwrap() else {
        panic!("a joint stage through the layers")
    };
    let pin = PinIntent {
        owner: "test".into(),
        now: Timestamp(1),
        ttl: Duration::from_secs(1),
        host: Instance::Process,
    };
    assert_eq!(
        s.publish_pinned(&k, &pin).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
}

const EVERY_METHOD: &[&str] = &[
    "capabilities",
    "meta",
    "has_many",
    "read_whole",
    "read_stored",
    "read_range",
    "delete_many",
    "namespaces",
    "scan",
    "maintain",
    "lock_instance",
    "put",
    "refs",
    "cache",
    "stage",
    "write",
    "publish",
    "stage_expecting",
    "abort",
    "publish_pinned",
    "read_outboard",
    "store_outboard",
    "set_outboard",
];

fn assert_all_reached(log: &Log) {
    let log = log.lock().unwrap();
    for m in EVERY_METHOD {
        assert!(log.contains(m), "{m} never reached the engine: {log:?}");
    }
}

/// A layer that changes nothing (the trait's default `around`).
struct Nothing;
impl EngineLayer for Nothing {}

#[tokio::test]
async fn one_layer_forwards_every_method() {
    let log = Log::default();
    let rec = Arc::new(Recorder { log: log.clone() });
    let kv = Layered::new(rec.clone() as Arc<dyn KvEngine>, Nothing);
    let large = Layered::new(rec as Arc<dyn LargeEngine>, Nothing);
    call_everything(&kv, &large).await;
    assert_all_reached(&log);
}

#[tokio::test]
async fn the_shipped_stack_forwards_every_method() {
    let log = Log::default();
    let rec = Arc::new(Recorder { log: log.clone() });
    let metrics = MetricsLayer::new();
    let stack = LayerStack::new()
        .layer(FaultLayer::new(FaultPlan::none()))
        .layer(metrics.clone())
        .layer(TraceLayer::new());
    let kv = stack.kv(rec.clone());
    let large = stack.large(rec);
    call_everything(&*kv, &*large).await;
    assert_all_reached(&log);
    // The layers saw the operations they forwarded.
    let snap = metrics.snapshot();
    let kv = snap
        .engine("recorder", Some(store_types::Tier::Kv))
        .expect("kv counted");
    assert_eq!(kv.op(store_layers::Op::Put).calls, 1);
    assert_eq!(
        kv.op(store_layers::Op::LockInstance)
            .errors_of("instance_locked"),
        1
    );
    assert_eq!(
        kv.bytes_read, 20,
        "7 bytes read whole, 7 stored, 3 exact (of 3), 3 ranged"
    );
    assert_eq!(kv.op(store_layers::Op::Read).calls, 4);
    let large = snap
        .engine("recorder", Some(store_types::Tier::Large))
        .expect("large counted");
    assert_eq!(large.op(store_layers::Op::Write).calls, 1);
    assert_eq!(large.bytes_written, 3);
    assert_eq!(large.stages_open, 0);
}

#[tokio::test]
async fn nested_wrappers_forward_every_method() {
    let log = Log::default();
    let rec = Arc::new(Recorder { log: log.clone() });
    let inner = Arc::new(Layered::new(rec as Arc<dyn LargeEngine>, Nothing));
    let outer = Layered::new(inner, TraceLayer::new());
    let kv = Layered::new(
        Arc::new(Recorder { log: log.clone() }) as Arc<dyn KvEngine>,
        Nothing,
    );
    call_everything(&kv, &outer).await;
    assert_all_reached(&log);
}

/// ADR-081: the seam's window deletes of a wrapped engine run through the
/// layer as `delete_many` calls — a fault plan that fails `DeleteMany`
/// fails them before they reach the engine (the entry and its window row
/// stay), and without it they delete and unstage.
#[tokio::test]
async fn window_deletes_run_through_the_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sqlite");
    let sqlite = store_sqlite::SqliteEngine::open(&path, store_sqlite::SqliteOptions::default())
        .await
        .unwrap();
    let seam = sqlite.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let window = seam.window.unwrap();
    let key = Key::new(ns(), Digest::of(b"garbage"));
    sqlite
        .put(&key, Bytes::from_static(b"garbage"))
        .await
        .unwrap();
    let staged = store_types::StagedCandidate {
        key: key.clone(),
        size: 7,
        visible_after: Timestamp(0),
    };
    window.stage(&[staged]).await.unwrap();
    let sqlite = Arc::new(sqlite);
    let deletes = |plan| {
        let wrapped = Layered::new(sqlite.clone(), FaultLayer::new(plan));
        let seam = wrapped.capabilities().seam.unwrap();
        seam.window_deletes.expect("the wrapper keeps the family")
    };
    let digests = [key.digest];
    let failing = FaultPlan::new(1).rule(
        store_layers::Rule::on(store_layers::Op::DeleteMany).fail(std::io::ErrorKind::TimedOut),
    );
    let d = deletes(failing);
    assert!(d.delete_unstaging(&ns(), &digests).await.is_err());
    assert_eq!(sqlite.has_many(&ns(), &digests).await.unwrap(), [true]);
    assert_eq!(window.staged_many(&ns(), &digests).await.unwrap(), [true]);
    let d = deletes(FaultPlan::none());
    assert_eq!(
        d.delete_unstaging(&ns(), &digests).await.unwrap(),
        [Some(7)]
    );
    assert_eq!(sqlite.has_many(&ns(), &digests).await.unwrap(), [false]);
    assert_eq!(window.staged_many(&ns(), &digests).await.unwrap(), [false]);
}
