//! The engine on a real S3-compatible server (moto) at
//! `BLOBPOOL_TEST_S3_ENDPOINT`. These tests fail, never skip, when the
//! server is missing.

use std::sync::Arc;
use std::time::Duration;

use object_store::path::Path;
use object_store::ObjectStore;
use store_types::{Engine, Instance, LargeEngine, PublishOutcome, Sharing};

use super::fault::{FaultStore, Op, Rule};
use super::{content, ns, put, put_expecting, put_with, read};
use crate::s3_testing::TestBucket;
use crate::{Capabilities, ObjectEngine, ObjectOptions};

/// The per-instance guarantee holds whatever the server: eight racing
/// publishes through one instance insert exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_racing_publishes_in_one_instance_insert_once() {
    let bucket = TestBucket::create().await;
    let e = bucket.engine("pool", s3_options()).await;
    for (round, len) in [1000usize, 300_000].into_iter().enumerate() {
        let data = Arc::new(content(len, 950 + round as u64));
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let e = e.clone();
                let data = data.clone();
                tokio::spawn(async move { put_with(&e, "race", &data, 64 << 10).await })
            })
            .collect();
        let mut inserted = 0;
        for t in tasks {
            inserted += usize::from(t.await.unwrap().unwrap().1 == PublishOutcome::Inserted);
        }
        assert_eq!(inserted, 1, "len {len}");
    }
    assert_eq!(e.stage_object_count().await.unwrap(), 0);
}

/// S3 needs parts of at least 5 MiB; a low threshold exercises staging.
fn s3_options() -> ObjectOptions {
    ObjectOptions {
        multipart_threshold: 64 << 10,
        part_size: 5 << 20,
        upload_concurrency: 2,
        ..ObjectOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_round_trip_with_native_conditional_writes() {
    let bucket = TestBucket::create().await;
    let e = bucket.engine("pool/a", s3_options()).await;
    assert_eq!(
        e.capabilities(),
        Capabilities {
            conditional_put: true,
            copy_if_not_exists: true
        },
        "moto honours If-None-Match on PUT and on CompleteMultipartUpload"
    );
    let d = Engine::capabilities(&e);
    assert_eq!(
        d.instance,
        Instance::Other(format!("s3://{}/pool/a", bucket.name))
    );
    assert_eq!(d.sharing, Sharing::SharedService);
    assert!(d.durable);
    for (i, len) in [0usize, 1000, 200_000, (11 << 20) + 5]
        .into_iter()
        .enumerate()
    {
        let data = content(len, 100 + i as u64);
        let (key, outcome) = put_with(&e, "ns", &data, 256 << 10).await.unwrap();
        assert_eq!(outcome, PublishOutcome::Inserted, "len {len}");
        assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
        let (s, t) = (len as u64 / 3, len as u64 / 2);
        assert_eq!(
            read(&e, &key, Some((s, t))).await.unwrap().unwrap(),
            &data[s as usize..t as usize]
        );
        assert_eq!(
            put_with(&e, "ns", &data, 256 << 10).await.unwrap().1,
            PublishOutcome::AlreadyPresent
        );
    }
    assert_eq!(e.stage_object_count().await.unwrap(), 0);
    assert_eq!(e.namespaces().await.unwrap(), vec![ns("ns")]);
    assert_eq!(e.scan(&ns("ns"), None, 100).await.unwrap().len(), 4);
    // Another prefix of the same bucket is another store.
    let other = bucket.engine("pool/b", s3_options()).await;
    assert!(other.namespaces().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_racing_publishes_from_two_clients_leave_one_entry() {
    let bucket = TestBucket::create().await;
    let engines = [
        bucket.engine("pool", s3_options()).await,
        bucket.engine("pool", s3_options()).await,
    ];
    for (round, len) in [1000usize, 300_000, 1000, 300_000].into_iter().enumerate() {
        let data = Arc::new(content(len, 900 + round as u64));
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let e = engines[i % 2].clone();
                let data = data.clone();
                tokio::spawn(async move { put_with(&e, "race", &data, 64 << 10).await })
            })
            .collect();
        let mut inserted = 0;
        let mut key = None;
        for t in tasks {
            let (k, outcome) = t.await.unwrap().unwrap();
            inserted += usize::from(outcome == PublishOutcome::Inserted);
            key = Some(k);
        }
        // Each instance serialises its own publishes of a key, so at most
        // one `Inserted` per instance. Across instances the server's
        // conditional check decides: S3's is atomic (exactly one), moto's
        // is check-then-write (CompleteMultipartUpload with If-None-Match
        // lets two through now and then). Either way: every put succeeds
        // and there is one entry with the right bytes.
        assert!((1..=2).contains(&inserted), "len {len}: {inserted}");
        assert_eq!(
            read(&engines[0], &key.unwrap(), None)
                .await
                .unwrap()
                .unwrap(),
            *data
        );
    }
    assert_eq!(engines[1].stage_object_count().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_failed_publish_leaves_nothing_visible_and_leftovers_are_reaped() {
    let bucket = TestBucket::create().await;
    let f = FaultStore::new(bucket.store());
    let options = ObjectOptions {
        prefix: Path::from("pool"),
        instance_label: bucket.url("pool"),
        ..s3_options()
    };
    let e = ObjectEngine::new(Arc::new(f.clone()) as Arc<dyn ObjectStore>, options.clone())
        .await
        .unwrap();
    let data = content(300_000, 7);
    f.arm(Rule::fail(Op::Copy, 1));
    f.arm(Rule::fail(Op::Delete, 1));
    assert!(put_with(&e, "ns", &data, 64 << 10).await.is_err());
    f.disarm();
    let key = store_types::Key::new(ns("ns"), store_types::Digest::of(&data));
    assert!(read(&e, &key, None).await.unwrap().is_none());
    assert_eq!(e.stage_object_count().await.unwrap(), 1);
    // A part upload failing mid-stream: nothing visible, nothing staged.
    let big = content(12 << 20, 8);
    f.arm(Rule::fail(Op::Part, 2));
    assert!(put_with(&e, "ns", &big, 256 << 10).await.is_err());
    f.disarm();
    let big_key = store_types::Key::new(ns("ns"), store_types::Digest::of(&big));
    assert!(e.meta(&big_key).await.unwrap().is_none());
    assert_eq!(e.stage_object_count().await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(1100)).await; // S3 times are whole seconds
    let reopened = ObjectEngine::new(
        bucket.store(),
        ObjectOptions {
            staging_grace: Duration::from_millis(10),
            ..options
        },
    )
    .await
    .unwrap();
    assert_eq!(reopened.stage_object_count().await.unwrap(), 0);
    assert_eq!(
        put(&reopened, "ns", &data).await.1,
        PublishOutcome::Inserted
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_has_many_listing_matches_heads() {
    let bucket = TestBucket::create().await;
    let e = bucket.engine("pool", s3_options()).await;
    let group = super::same_fan(0x17, 24, 3);
    let mut digests = Vec::new();
    let mut want = Vec::new();
    for (i, c) in group.iter().enumerate() {
        if i % 2 == 0 {
            put(&e, "ns", c).await;
        }
        digests.push(store_types::Digest::of(c));
        want.push(i % 2 == 0);
    }
    for min_group in [2, 1000] {
        let e2 = bucket
            .engine(
                "pool",
                ObjectOptions {
                    list_min_group: min_group,
                    ..s3_options()
                },
            )
            .await;
        assert_eq!(e2.has_many(&ns("ns"), &digests).await.unwrap(), want);
    }
}

/// Every object under the bucket.
async fn objects(bucket: &TestBucket) -> Vec<String> {
    use futures::TryStreamExt;
    bucket
        .store()
        .list(None)
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_direct_puts_round_trip_and_deduplicate() {
    let bucket = TestBucket::create().await;
    let e = bucket.engine("pool", s3_options()).await;
    for (i, len) in [1000usize, 300_000, (11 << 20) + 5].into_iter().enumerate() {
        let data = content(len, 1100 + i as u64);
        let d = store_types::Digest::of(&data);
        let (key, outcome) = put_expecting(&e, "ns", &data, 256 << 10, d).await.unwrap();
        assert_eq!(outcome, PublishOutcome::Inserted, "len {len}");
        assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
        let (s, t) = (len as u64 / 3, len as u64 / 2);
        assert_eq!(
            read(&e, &key, Some((s, t))).await.unwrap().unwrap(),
            &data[s as usize..t as usize]
        );
        // Onto the existing entry, direct or staged: AlreadyPresent, and
        // the direct upload is aborted, not completed.
        assert_eq!(
            put_expecting(&e, "ns", &data, 256 << 10, d)
                .await
                .unwrap()
                .1,
            PublishOutcome::AlreadyPresent,
            "len {len}"
        );
        assert_eq!(
            put_with(&e, "ns", &data, 256 << 10).await.unwrap().1,
            PublishOutcome::AlreadyPresent,
            "len {len}"
        );
    }
    // And a direct put onto an entry a staged put made.
    let data = content(400_000, 1199);
    put(&e, "ns", &data).await;
    assert_eq!(
        put_expecting(&e, "ns", &data, 256 << 10, store_types::Digest::of(&data))
            .await
            .unwrap()
            .1,
        PublishOutcome::AlreadyPresent
    );
    assert_eq!(e.stage_object_count().await.unwrap(), 0);
    assert_eq!(objects(&bucket).await.len(), 4, "only the entries");
    assert_eq!(bucket.incomplete_uploads().await, Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_mismatch_aborts_the_direct_upload_and_leaves_nothing() {
    let bucket = TestBucket::create().await;
    let e = bucket.engine("pool", s3_options()).await;
    for len in [1000usize, 300_000, (11 << 20) + 5] {
        let data = content(len, 1200 + len as u64);
        let wrong = store_types::Digest::of(b"not the content");
        let r = put_expecting(&e, "ns", &data, 256 << 10, wrong).await;
        assert!(
            matches!(r, Err(store_types::Error::Verification { expected, .. }) if expected == wrong),
            "len {len}: {r:?}"
        );
        for d in [wrong, store_types::Digest::of(&data)] {
            let key = store_types::Key::new(ns("ns"), d);
            assert!(read(&e, &key, None).await.unwrap().is_none(), "len {len}");
        }
        assert_eq!(objects(&bucket).await, Vec::<String>::new(), "len {len}");
        assert_eq!(
            bucket.incomplete_uploads().await,
            Vec::<String>::new(),
            "len {len}: the upload was aborted"
        );
    }
    assert_eq!(e.stage_object_count().await.unwrap(), 0);
}

/// While an 11 MiB direct upload is in flight (parts on the server, not
/// completed), GETs, HEADs and listings see nothing; after publish, the
/// whole entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn s3_readers_never_see_a_direct_upload_in_flight() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let bucket = TestBucket::create().await;
    let e = bucket.engine("pool", s3_options()).await;
    let data = Arc::new(content((11 << 20) + 5, 1300));
    let key = store_types::Key::new(ns("ns"), store_types::Digest::of(&data));
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (e, data, key, stop) = (e.clone(), data.clone(), key.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut absent, mut whole) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                match e.meta(&key).await.unwrap() {
                    None => absent += 1,
                    Some(m) => {
                        assert_eq!(m.size, data.len() as u64, "a partial object was visible");
                        whole += 1;
                    }
                }
                let listed = e.scan(&key.namespace, None, 10).await.unwrap();
                assert!(
                    listed.is_empty() || listed == vec![(key.digest, data.len() as u64)],
                    "{listed:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (absent, whole)
        })
    };
    let mut stage = e
        .stage_expecting(&key.namespace, &key.digest)
        .await
        .unwrap();
    for c in data.chunks(1 << 20) {
        stage.write(bytes::Bytes::copy_from_slice(c)).await.unwrap();
    }
    // Two 5 MiB parts are (being) uploaded; wait until the server has the
    // upload, then look.
    let mut waited = 0;
    while bucket.incomplete_uploads().await.is_empty() {
        waited += 1;
        assert!(waited < 100, "the upload never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        bucket.incomplete_uploads().await,
        vec![e.content_path(&key).to_string()],
        "uploading straight to the final name"
    );
    assert!(read(&e, &key, None).await.unwrap().is_none());
    assert!(e.meta(&key).await.unwrap().is_none());
    assert_eq!(objects(&bucket).await, Vec::<String>::new());
    assert_eq!(stage.publish(&key).await.unwrap(), PublishOutcome::Inserted);
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, Ordering::Relaxed);
    let (absent, whole) = poller.await.unwrap();
    assert!(
        absent > 0 && whole > 0,
        "polled {absent} absent, {whole} whole"
    );
    assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), *data);
    assert_eq!(bucket.incomplete_uploads().await, Vec::<String>::new());
    assert_eq!(e.stage_object_count().await.unwrap(), 0);
}
