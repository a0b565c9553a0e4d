//! Engine-specific behaviour of `object`; the generic put/get semantics are
//! covered by the workspace contract suite (over InMemory, the local file
//! system and S3).

mod direct;
mod fault;
mod faults;
#[cfg(feature = "s3")]
mod s3;

use std::sync::Arc;
use std::time::Duration;
use store_types::EngineExt as _;

use bytes::Bytes;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use store_types::{
    Digest, Engine, Error, Instance, Key, LargeEngine, Namespace, PublishOutcome, Sharing,
};
use tokio::io::AsyncReadExt;

use crate::{ObjectEngine, ObjectOptions};

pub(crate) fn ns(name: &str) -> Namespace {
    Namespace::new(name).unwrap()
}

/// Deterministic, non-repeating test content.
pub(crate) fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut i = 0u64;
    while out.len() < len {
        out.extend_from_slice(
            Digest::of(&[seed.to_le_bytes(), i.to_le_bytes()].concat()).as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out
}

/// Small sizes so multipart uploads have several parts.
pub(crate) fn small_options() -> ObjectOptions {
    ObjectOptions {
        multipart_threshold: 64 << 10,
        part_size: 32 << 10,
        upload_concurrency: 2,
        ..ObjectOptions::default()
    }
}

/// Stages `data` in `chunk`-sized writes and publishes it.
pub(crate) async fn put_with(
    engine: &ObjectEngine,
    ns_name: &str,
    data: &[u8],
    chunk: usize,
) -> store_types::Result<(Key, PublishOutcome)> {
    let key = Key::new(ns(ns_name), Digest::of(data));
    let mut stage = engine.stage(&key.namespace).await?;
    for c in data.chunks(chunk.max(1)) {
        if let Err(e) = stage.write(Bytes::copy_from_slice(c)).await {
            let _ = stage.abort().await;
            return Err(e);
        }
    }
    let outcome = stage.publish(&key).await?;
    Ok((key, outcome))
}

/// What the facade's put does when the caller supplies `expected`: stage
/// expecting it, stream `data` in `chunk`-sized writes, hash, abort
/// on a mismatch ([`Error::Verification`]), else publish under it.
pub(crate) async fn put_expecting(
    engine: &ObjectEngine,
    ns_name: &str,
    data: &[u8],
    chunk: usize,
    expected: Digest,
) -> store_types::Result<(Key, PublishOutcome)> {
    let ns = ns(ns_name);
    let mut stage = engine.stage_expecting(&ns, &expected).await?;
    for c in data.chunks(chunk.max(1)) {
        if let Err(e) = stage.write(Bytes::copy_from_slice(c)).await {
            let _ = stage.abort().await;
            return Err(e);
        }
    }
    let actual = Digest::of(data);
    if actual != expected {
        stage.abort().await?;
        return Err(Error::Verification { expected, actual });
    }
    let key = Key::new(ns, expected);
    let outcome = stage.publish(&key).await?;
    Ok((key, outcome))
}

pub(crate) async fn put(
    engine: &ObjectEngine,
    ns_name: &str,
    data: &[u8],
) -> (Key, PublishOutcome) {
    put_with(engine, ns_name, data, 7 << 10).await.unwrap()
}

pub(crate) async fn read(
    engine: &ObjectEngine,
    key: &Key,
    range: Option<(u64, u64)>,
) -> store_types::Result<Option<Vec<u8>>> {
    let blob = match range {
        None => engine.read_whole(key).await?,
        Some((s, e)) => engine.read_exact(key, s..e).await?,
    };
    let Some(blob) = blob else {
        return Ok(None);
    };
    let len = blob.len();
    let mut out = Vec::new();
    blob.into_stream().reader.read_to_end(&mut out).await?;
    assert_eq!(out.len() as u64, len, "reader yields its declared length");
    Ok(Some(out))
}

/// The two local backends every test runs on.
pub(crate) enum Backend {
    Mem(Arc<InMemory>),
    Fs(tempfile::TempDir),
}

impl Backend {
    pub(crate) fn all() -> Vec<Backend> {
        vec![
            Backend::Mem(Arc::new(InMemory::new())),
            Backend::Fs(tempfile::tempdir().unwrap()),
        ]
    }

    pub(crate) fn store(&self) -> Arc<dyn ObjectStore> {
        match self {
            Backend::Mem(m) => m.clone(),
            Backend::Fs(d) => {
                Arc::new(object_store::local::LocalFileSystem::new_with_prefix(d.path()).unwrap())
            }
        }
    }

    pub(crate) fn ordered(&self) -> bool {
        matches!(self, Backend::Mem(_))
    }

    pub(crate) async fn engine(&self, options: ObjectOptions) -> ObjectEngine {
        self.engine_over(self.store(), options).await
    }

    pub(crate) async fn engine_over(
        &self,
        store: Arc<dyn ObjectStore>,
        options: ObjectOptions,
    ) -> ObjectEngine {
        let options = ObjectOptions {
            prefix: Path::from("pool"),
            ordered_listing: Some(self.ordered()),
            ..options
        };
        ObjectEngine::new(store, options).await.unwrap()
    }
}

#[tokio::test]
async fn round_trips_small_and_multipart_bodies() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        assert_eq!(
            e.capabilities(),
            crate::Capabilities {
                conditional_put: true,
                copy_if_not_exists: true
            }
        );
        for (i, len) in [0usize, 1, 1000, 64 << 10, (64 << 10) + 1, 300_000]
            .into_iter()
            .enumerate()
        {
            let data = content(len, i as u64);
            let (key, outcome) = put(&e, "ns", &data).await;
            assert_eq!(outcome, PublishOutcome::Inserted, "len {len}");
            assert_eq!(e.meta(&key).await.unwrap().unwrap().size, len as u64);
            assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
            for (s, t) in [(0, 0), (0, len as u64), (len as u64 / 3, len as u64 / 2)] {
                let got = read(&e, &key, Some((s, t))).await.unwrap().unwrap();
                assert_eq!(
                    got,
                    &data[s as usize..t as usize],
                    "len {len} range {s}..{t}"
                );
            }
            let (_, again) = put(&e, "ns", &data).await;
            assert_eq!(again, PublishOutcome::AlreadyPresent, "len {len}");
            assert_eq!(e.stage_object_count().await.unwrap(), 0);
        }
        let absent = Key::new(ns("ns"), Digest::of(b"absent"));
        assert!(e.meta(&absent).await.unwrap().is_none());
        assert!(read(&e, &absent, None).await.unwrap().is_none());
        assert!(read(&e, &absent, Some((0, 0))).await.unwrap().is_none());
    }
}

#[tokio::test]
async fn large_reads_stream_through_the_read_ahead() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        let data = content(3 << 20, 99);
        let (key, _) = put_with(&e, "ns", &data, 256 << 10).await.unwrap();
        assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
        let (s, t) = (100_000u64, 2_900_000u64);
        assert_eq!(
            read(&e, &key, Some((s, t))).await.unwrap().unwrap(),
            &data[s as usize..t as usize]
        );
    }
}

#[tokio::test]
async fn publish_checks_the_namespace() {
    let b = Backend::Mem(Arc::new(InMemory::new()));
    let e = b.engine(small_options()).await;
    for len in [10, 200_000] {
        let data = content(len, 5);
        let mut stage = e.stage(&ns("a")).await.unwrap();
        stage.write(Bytes::from(data.clone())).await.unwrap();
        let wrong = Key::new(ns("b"), Digest::of(&data));
        assert!(matches!(
            stage.publish(&wrong).await,
            Err(Error::KeyInvalid(_))
        ));
        assert!(e.meta(&wrong).await.unwrap().is_none());
    }
    assert_eq!(e.stage_object_count().await.unwrap(), 0);
}

#[tokio::test]
async fn scan_and_namespaces_skip_junk_and_page_in_order() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        let mut want = Vec::new();
        for i in 0..40 {
            let data = content(100 + i, i as u64);
            let (key, _) = put(&e, "alpha", &data).await;
            want.push((key.digest, data.len() as u64));
        }
        want.sort();
        let (kb, _) = put(&e, "beta", &content(10, 1000)).await;
        // Junk the listings must skip.
        let store = e.store().clone();
        let wrong_fan = Digest::of(b"wrong fan");
        let bad_fan = format!("{:02x}", wrong_fan.as_bytes()[0] ^ 1);
        for junk in [
            format!("pool/alpha/zz/{}", Digest::of(b"j1").to_hex()),
            format!("pool/alpha/{bad_fan}/{}", wrong_fan.to_hex()),
            "pool/alpha/00/not-a-digest".to_string(),
            "pool/alpha/loose-file".to_string(),
            format!("pool/Not-A-Namespace/00/{}", Digest::of(b"j2").to_hex()),
        ] {
            store.put(&Path::from(junk), "junk".into()).await.unwrap();
        }
        let mut got = Vec::new();
        let mut after = None;
        loop {
            let page = e.scan(&ns("alpha"), after, 7).await.unwrap();
            assert!(page.len() <= 7);
            if page.is_empty() {
                break;
            }
            after = Some(page.last().unwrap().0);
            got.extend(page);
        }
        assert_eq!(got, want);
        assert_eq!(e.scan(&ns("alpha"), None, 0).await.unwrap(), vec![]);
        assert_eq!(e.scan(&ns("nothing"), None, 5).await.unwrap(), vec![]);
        let last = want.last().unwrap().0;
        assert_eq!(e.scan(&ns("alpha"), Some(last), 5).await.unwrap(), vec![]);
        assert_eq!(e.namespaces().await.unwrap(), vec![ns("alpha"), ns("beta")]);
        assert_eq!(
            e.delete_many(&ns("beta"), &[kb.digest]).await.unwrap(),
            vec![Some(10)]
        );
        assert_eq!(e.namespaces().await.unwrap(), vec![ns("alpha")]);
    }
}

/// Contents whose digests all fall in fan-out `fan`.
fn same_fan(fan: u8, n: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut i = 0u64;
    while out.len() < n {
        let c = content(64, seed.wrapping_mul(1_000_003) + i);
        if Digest::of(&c).as_bytes()[0] == fan {
            out.push(c);
        }
        i += 1;
    }
    out
}

#[tokio::test]
async fn has_many_by_heads_and_by_listing_agree() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        let group = same_fan(0x42, 30, 1);
        let mut digests = Vec::new();
        let mut want = Vec::new();
        for (i, c) in group.iter().enumerate() {
            if i % 3 != 0 {
                put(&e, "ns", c).await;
            }
            digests.push(Digest::of(c));
            want.push(i % 3 != 0);
        }
        for i in 0..10u64 {
            let c = content(50, 5000 + i);
            if i % 2 == 0 {
                put(&e, "ns", &c).await;
            }
            digests.push(Digest::of(&c));
            want.push(i % 2 == 0);
        }
        // Duplicates are answered at every index.
        digests.push(digests[1]);
        want.push(want[1]);
        digests.push(digests[0]);
        want.push(want[0]);
        for (min_group, budget_hint) in [(2, "listing"), (1000, "heads")] {
            let e2 = b
                .engine(ObjectOptions {
                    list_min_group: min_group,
                    ..small_options()
                })
                .await;
            assert_eq!(
                e2.has_many(&ns("ns"), &digests).await.unwrap(),
                want,
                "{budget_hint}"
            );
        }
        assert_eq!(
            e.has_many(&ns("other"), &digests[..3]).await.unwrap(),
            vec![false; 3]
        );
        assert_eq!(
            e.has_many(&ns("ns"), &[]).await.unwrap(),
            Vec::<bool>::new()
        );
    }
}

#[tokio::test]
async fn delete_many_reports_sizes_and_is_idempotent() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        let (k1, _) = put(&e, "ns", &content(10, 1)).await;
        let (k2, _) = put(&e, "ns", &content(100_000, 2)).await;
        let absent = Digest::of(b"nope");
        let ds = [k1.digest, absent, k2.digest];
        assert_eq!(
            e.delete_many(&ns("ns"), &ds).await.unwrap(),
            vec![Some(10), None, Some(100_000)]
        );
        assert_eq!(
            e.delete_many(&ns("ns"), &ds).await.unwrap(),
            vec![None, None, None]
        );
        assert!(read(&e, &k2, None).await.unwrap().is_none());
        // Re-put after delete works.
        assert_eq!(
            put(&e, "ns", &content(100_000, 2)).await.1,
            PublishOutcome::Inserted
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_publishes_from_two_instances_leave_one_entry() {
    for b in Backend::all() {
        let engines = [
            b.engine(small_options()).await,
            b.engine(small_options()).await,
        ];
        for (round, len) in [100usize, 200_000, 100, 200_000].into_iter().enumerate() {
            let data = Arc::new(content(len, 700 + round as u64));
            let tasks: Vec<_> = (0..8)
                .map(|i| {
                    let e = engines[i % 2].clone();
                    let data = data.clone();
                    tokio::spawn(async move { put_with(&e, "race", &data, 16 << 10).await })
                })
                .collect();
            let mut inserted = 0;
            let mut key = None;
            for t in tasks {
                let (k, outcome) = t.await.unwrap().unwrap();
                inserted += usize::from(outcome == PublishOutcome::Inserted);
                key = Some(k);
            }
            assert_eq!(inserted, 1, "len {len}: exactly one publish inserts");
            let key = key.unwrap();
            assert_eq!(read(&engines[1], &key, None).await.unwrap().unwrap(), *data);
            assert_eq!(engines[0].stage_object_count().await.unwrap(), 0);
        }
    }
}

#[tokio::test]
async fn aborted_and_dropped_stages_leave_nothing() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        let data = content(300_000, 77);
        let key = Key::new(ns("ns"), Digest::of(&data));
        let mut stage = e.stage(&key.namespace).await.unwrap();
        stage.write(Bytes::from(data.clone())).await.unwrap();
        stage.abort().await.unwrap();
        let mut stage = e.stage(&key.namespace).await.unwrap();
        stage.write(Bytes::from(data.clone())).await.unwrap();
        drop(stage);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(e.meta(&key).await.unwrap().is_none());
        assert_eq!(e.stage_object_count().await.unwrap(), 0);
        assert!(e.namespaces().await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn stale_stage_objects_are_reaped_at_open_and_on_demand() {
    for b in Backend::all() {
        let e = b.engine(small_options()).await;
        let store = e.store().clone();
        for i in 0..3 {
            store
                .put(&Path::from(format!("pool/.stage/orphan-{i}")), "x".into())
                .await
                .unwrap();
        }
        assert_eq!(e.stage_object_count().await.unwrap(), 3);
        // Younger than the grace period: kept (they could be live).
        assert_eq!(
            e.reap_stale_stages(Duration::from_secs(3600))
                .await
                .unwrap(),
            0
        );
        let reopened = b.engine(small_options()).await;
        assert_eq!(reopened.stage_object_count().await.unwrap(), 3);
        assert_eq!(e.reap_stale_stages(Duration::ZERO).await.unwrap(), 3);
        assert_eq!(e.stage_object_count().await.unwrap(), 0);
        store
            .put(&Path::from("pool/.stage/orphan-x"), "x".into())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let reaping = b
            .engine(ObjectOptions {
                staging_grace: Duration::from_millis(10),
                ..small_options()
            })
            .await;
        assert_eq!(
            reaping.stage_object_count().await.unwrap(),
            0,
            "reaped at open"
        );
    }
}

#[tokio::test]
async fn urls_select_backends_and_descriptors() {
    let m = ObjectEngine::from_url("memory://", ObjectOptions::default())
        .await
        .unwrap();
    let d = Engine::capabilities(&m);
    assert_eq!(
        (d.kind, d.instance, d.sharing, d.durable),
        ("object", Instance::Process, Sharing::ProcessLocal, false)
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("objects");
    let url = format!("file://{}", root.display());
    let f = ObjectEngine::from_url(&url, small_options()).await.unwrap();
    let d = Engine::capabilities(&f);
    assert_eq!(d.instance, Instance::Path(root.canonicalize().unwrap()));
    assert_eq!(
        d.sharing,
        Sharing::DeclaredMedia {
            shared_media: false
        }
    );
    assert!(d.durable);
    let (key, _) = put(&f, "ns", &content(200_000, 3)).await;
    assert!(root
        .join("ns")
        .join(key.digest.prefix2())
        .join(key.digest.to_hex())
        .is_file());
    // The same directory through a second URL engine sees the entry.
    let shared = ObjectEngine::from_url(
        &url,
        ObjectOptions {
            sharing: Some(Sharing::DeclaredMedia { shared_media: true }),
            ..small_options()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        Engine::capabilities(&shared).sharing,
        Sharing::DeclaredMedia { shared_media: true }
    );
    assert!(shared.meta(&key).await.unwrap().is_some());
    let n = ObjectEngine::new(
        Arc::new(InMemory::new()),
        ObjectOptions {
            instance_label: "gs://bucket/p".into(),
            ..ObjectOptions::default()
        },
    )
    .await
    .unwrap();
    let d = Engine::capabilities(&n);
    assert_eq!(d.instance, Instance::Other("gs://bucket/p".into()));
    assert_eq!(d.sharing, Sharing::SharedService);
    assert!(Engine::capabilities(&n).seam.is_none());
    for bad in ["nope", "ftp://x/y", "file://relative/dir"] {
        assert!(
            matches!(
                ObjectEngine::from_url(bad, ObjectOptions::default()).await,
                Err(Error::Config(_))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        ObjectEngine::from_url_with("memory://", ObjectOptions::default(), [("aws_region", "x")])
            .await,
        Err(Error::Config(_))
    ));
    #[cfg(not(feature = "s3"))]
    assert!(matches!(
        ObjectEngine::from_url("s3://bucket/prefix", ObjectOptions::default()).await,
        Err(Error::Config(m)) if m.contains("s3")
    ));
}
