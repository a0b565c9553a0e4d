//! Engine-specific behaviour of `local`; the generic put/get semantics are
//! covered by the workspace contract suite.

use std::fs;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use store_types::EngineExt as _;
use store_types::{
    BlobReader, Digest, Engine, Error, Instance, Key, LargeEngine, Namespace, PublishOutcome,
    ReadOptions, Sharing, CHUNK_SIZE,
};
use tokio::io::AsyncReadExt;

use crate::{LocalEngine, LocalOptions};

fn ns(name: &str) -> Namespace {
    Namespace::new(name).unwrap()
}

/// Deterministic, non-repeating test content.
fn content(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

async fn open(root: &Path) -> LocalEngine {
    LocalEngine::open(root, LocalOptions::default())
        .await
        .unwrap()
}

/// Stages `data` in chunks of the given sizes (cycled) and publishes it.
async fn put_chunked(engine: &LocalEngine, ns_name: &str, data: &[u8], chunks: &[usize]) -> Key {
    let key = Key::new(ns(ns_name), Digest::of(data));
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    let mut rest = data;
    for size in chunks.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = (*size).min(rest.len());
        stage
            .write(Bytes::copy_from_slice(&rest[..n]))
            .await
            .unwrap();
        rest = &rest[n..];
    }
    assert_eq!(stage.publish(&key).await.unwrap(), PublishOutcome::Inserted);
    key
}

async fn put(engine: &LocalEngine, ns_name: &str, data: &[u8]) -> Key {
    put_chunked(engine, ns_name, data, &[CHUNK_SIZE]).await
}

async fn read_range(engine: &LocalEngine, key: &Key, range: Option<(u64, u64)>) -> Vec<u8> {
    let blob = match range {
        None => engine.read_whole(key).await,
        Some((s, e)) => engine.read_exact(key, s..e).await,
    };
    let blob = blob.unwrap().expect("entry present");
    let mut out = Vec::new();
    let blob_len = blob.len();
    blob.into_stream()
        .reader
        .read_to_end(&mut out)
        .await
        .unwrap();
    assert_eq!(
        out.len() as u64,
        blob_len,
        "reader yields its declared length"
    );
    out
}

/// Waits (bounded) for the stage directory to empty: dropped stages are
/// cleaned up on a blocking thread, asynchronously.
async fn wait_no_stage_files(engine: &LocalEngine) {
    for _ in 0..500 {
        if engine.stage_file_count().unwrap() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("stage files left: {}", engine.stage_file_count().unwrap());
}

#[tokio::test]
async fn layout_and_exact_bytes_over_many_chunk_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(3 * CHUNK_SIZE + 12_345, 7);
    let key = put_chunked(&engine, "docs", &data, &[1, 4096, CHUNK_SIZE + 3, 100_000]).await;

    let hex = key.digest.to_hex();
    let on_disk = dir.path().join("docs").join(&hex[..2]).join(&hex);
    assert_eq!(fs::read(&on_disk).unwrap(), data);
    assert_eq!(read_range(&engine, &key, None).await, data);
    assert_eq!(
        engine.meta(&key).await.unwrap().unwrap().size,
        data.len() as u64
    );
    assert_eq!(engine.stage_file_count().unwrap(), 0);

    let empty = put(&engine, "docs", b"").await;
    assert_eq!(read_range(&engine, &empty, None).await, b"");
}

#[tokio::test]
async fn staged_bytes_are_invisible_until_publish() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(1000, 1);
    let key = Key::new(ns("a"), Digest::of(&data));
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    stage.write(Bytes::from(data.clone())).await.unwrap();
    assert_eq!(engine.meta(&key).await.unwrap(), None);
    assert_eq!(
        engine
            .has_many(&key.namespace, &[key.digest])
            .await
            .unwrap(),
        [false]
    );
    assert!(engine.read_whole(&key).await.unwrap().is_none());
    assert!(engine.namespaces().await.unwrap().is_empty());
    assert_eq!(stage.publish(&key).await.unwrap(), PublishOutcome::Inserted);
    assert_eq!(
        engine
            .has_many(&key.namespace, &[key.digest])
            .await
            .unwrap(),
        [true]
    );
    assert_eq!(engine.namespaces().await.unwrap(), [ns("a")]);
}

#[tokio::test]
async fn orphan_stage_files_are_removed_at_open_but_live_stages_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let first = open(dir.path()).await;
    let data = content(2 * CHUNK_SIZE, 2);
    let key = Key::new(ns("a"), Digest::of(&data));
    let mut live = first.stage(&key.namespace).await.unwrap();
    live.write(Bytes::from(data.clone())).await.unwrap();

    // Leftovers of crashed puts: nobody holds their locks.
    let stage_dir = dir.path().join(".stage");
    for i in 0..3 {
        fs::write(stage_dir.join(format!("dead-{i}.stage")), b"partial").unwrap();
    }
    assert_eq!(first.stage_file_count().unwrap(), 4);

    let second = open(dir.path()).await;
    assert_eq!(
        second.stage_file_count().unwrap(),
        1,
        "only the live stage remains"
    );
    assert_eq!(live.publish(&key).await.unwrap(), PublishOutcome::Inserted);
    assert_eq!(read_range(&second, &key, None).await, data);
    assert_eq!(second.stage_file_count().unwrap(), 0);
}

#[tokio::test]
async fn maintenance_reaps_orphans_but_not_live_stages() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(CHUNK_SIZE, 4);
    let key = Key::new(ns("a"), Digest::of(&data));
    let mut live = engine.stage(&key.namespace).await.unwrap();
    live.write(Bytes::from(data.clone())).await.unwrap();
    // A put interrupted after the engine opened (its writer is gone).
    fs::write(dir.path().join(".stage").join("dead.stage"), b"partial").unwrap();
    assert_eq!(
        engine
            .maintain(store_types::Timestamp::now())
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        engine.stage_file_count().unwrap(),
        1,
        "the live stage stays"
    );
    assert_eq!(live.publish(&key).await.unwrap(), PublishOutcome::Inserted);
    assert_eq!(
        engine
            .maintain(store_types::Timestamp::now())
            .await
            .unwrap(),
        0
    );
}

#[tokio::test]
async fn abort_and_drop_remove_the_stage_file() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(CHUNK_SIZE * 2, 3);
    let key = Key::new(ns("a"), Digest::of(&data));

    let mut stage = engine.stage(&key.namespace).await.unwrap();
    stage.write(Bytes::from(data.clone())).await.unwrap();
    assert_eq!(engine.stage_file_count().unwrap(), 1);
    stage.abort().await.unwrap();
    assert_eq!(
        engine.stage_file_count().unwrap(),
        0,
        "abort waits for removal"
    );

    // Dropped mid-way, with a batch possibly still being written.
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    for chunk in data.chunks(CHUNK_SIZE / 4) {
        stage.write(Bytes::copy_from_slice(chunk)).await.unwrap();
    }
    drop(stage);
    wait_no_stage_files(&engine).await;
    assert_eq!(engine.meta(&key).await.unwrap(), None);
    assert!(engine.namespaces().await.unwrap().is_empty());
    assert!(
        !dir.path().join("a").exists(),
        "nothing created for the namespace"
    );
}

#[tokio::test]
async fn concurrent_publishes_of_one_key_insert_once() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(CHUNK_SIZE + 1, 4);
    let key = Key::new(ns("a"), Digest::of(&data));
    let mut stages = Vec::new();
    for _ in 0..8 {
        let mut stage = engine.stage(&key.namespace).await.unwrap();
        stage.write(Bytes::from(data.clone())).await.unwrap();
        stages.push(stage);
    }
    let outcomes: Vec<_> = join_all(
        stages
            .into_iter()
            .map(|s| {
                let key = key.clone();
                tokio::spawn(async move { s.publish(&key).await.unwrap() })
            })
            .collect(),
    )
    .await;
    let inserted = outcomes
        .iter()
        .filter(|o| **o == PublishOutcome::Inserted)
        .count();
    assert_eq!(inserted, 1, "{outcomes:?}");
    let fan = dir.path().join("a").join(key.digest.prefix2());
    assert_eq!(fs::read_dir(&fan).unwrap().count(), 1, "one file");
    assert_eq!(engine.stage_file_count().unwrap(), 0);
    assert_eq!(read_range(&engine, &key, None).await, data);
}

/// Awaits spawned tasks in order.
async fn join_all<T>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn scan_pages_across_fan_out_dirs_and_skips_junk() {
    let dir = tempfile::tempdir().unwrap();
    let engine = LocalEngine::open(
        dir.path(),
        LocalOptions {
            fsync: false,
            ..LocalOptions::default()
        },
    )
    .await
    .unwrap();
    let mut digests = Vec::new();
    for i in 0..120u32 {
        let data = i.to_le_bytes();
        digests.push(put(&engine, "n", &data).await.digest);
    }
    digests.sort();
    let fans: std::collections::BTreeSet<_> = digests.iter().map(|d| d.as_bytes()[0]).collect();
    assert!(fans.len() > 50, "entries spread over many fan-out dirs");

    // Junk the scan must ignore.
    let ns_dir = dir.path().join("n");
    fs::write(ns_dir.join("README"), b"x").unwrap();
    fs::create_dir(ns_dir.join("zz")).unwrap();
    let misplaced = Digest::of(b"misplaced");
    let wrong_fan = format!("{:02x}", misplaced.as_bytes()[0].wrapping_add(1));
    fs::create_dir_all(ns_dir.join(&wrong_fan)).unwrap();
    fs::write(ns_dir.join(&wrong_fan).join(misplaced.to_hex()), b"x").unwrap();
    let fan0 = ns_dir.join(digests[0].prefix2());
    fs::write(fan0.join(digests[0].to_hex().to_uppercase()), b"x").unwrap();
    fs::write(fan0.join("tmp.partial"), b"x").unwrap();
    fs::create_dir_all(dir.path().join("Not-A-Namespace")).unwrap();

    for page_size in [1, 7, 64, 500] {
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = engine.scan(&ns("n"), after, page_size).await.unwrap();
            assert!(page.len() <= page_size);
            if page.is_empty() {
                break;
            }
            assert!(page.iter().all(|(_, size)| *size == 4));
            after = page.last().map(|(d, _)| *d);
            seen.extend(page.into_iter().map(|(d, _)| d));
        }
        assert_eq!(seen, digests, "page size {page_size}");
    }
    assert!(engine.scan(&ns("n"), None, 0).await.unwrap().is_empty());
    assert!(engine
        .scan(&ns("absent"), None, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(engine.namespaces().await.unwrap(), [ns("n")]);

    let freed = engine.delete_many(&ns("n"), &digests).await.unwrap();
    assert!(freed.iter().all(|f| *f == Some(4)));
    assert_eq!(
        engine.delete_many(&ns("n"), &digests[..1]).await.unwrap(),
        [None]
    );
    assert!(
        engine.namespaces().await.unwrap().is_empty(),
        "only junk is left"
    );
}

#[tokio::test]
async fn range_reads_return_exactly_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(2 * CHUNK_SIZE + 777, 5);
    let key = put(&engine, "a", &data).await;
    let size = data.len() as u64;
    let c = CHUNK_SIZE as u64;
    for (s, e) in [
        (0, 0),
        (0, 1),
        (5, 17),
        (c - 3, c + 3),
        (1, size),
        (0, size),
        (size, size),
        (c / 2, 2 * c + 100),
        // One chunk exactly is read in one blocking call; one byte more
        // streams.
        (0, c),
        (size - c, size),
        (7, c + 7),
        (7, c + 8),
        (size - c - 1, size),
    ] {
        let got = read_range(&engine, &key, Some((s, e))).await;
        assert_eq!(got, &data[s as usize..e as usize], "range {s}..{e}");
    }
    let absent = Key::new(ns("a"), Digest::of(b"absent"));
    assert!(engine.read_exact(&absent, 0..0).await.unwrap().is_none());
    assert!(matches!(
        engine.read_exact(&key, 0..size + 1).await,
        Err(Error::InvalidRange { .. })
    ));
    assert!(matches!(
        engine.read_exact(&key, size - 1..size + 1).await,
        Err(Error::InvalidRange { .. })
    ));
    assert!(engine.read_exact(&absent, 0..10).await.unwrap().is_none());
}

#[tokio::test]
async fn publish_into_another_namespace_is_refused_and_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let mut stage = engine.stage(&ns("a")).await.unwrap();
    stage.write(Bytes::from_static(b"x")).await.unwrap();
    let err = stage
        .publish(&Key::new(ns("b"), Digest::of(b"x")))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::KeyInvalid(_)), "{err}");
    wait_no_stage_files(&engine).await;
    assert!(engine.namespaces().await.unwrap().is_empty());
}

#[tokio::test]
async fn descriptor_reports_root_media_and_durability() {
    let dir = tempfile::tempdir().unwrap();
    let engine = LocalEngine::open(
        dir.path().join("nested/root"),
        LocalOptions {
            shared_media: true,
            fsync: false,
            ..LocalOptions::default()
        },
    )
    .await
    .unwrap();
    let d = engine.capabilities();
    assert_eq!(d.kind, "local");
    let canonical = dir.path().join("nested/root").canonicalize().unwrap();
    assert_eq!(d.instance, Instance::Path(canonical));
    assert_eq!(d.sharing, Sharing::DeclaredMedia { shared_media: true });
    assert!(!d.durable);
    assert!(engine.capabilities().seam.is_none());
    assert!(open(dir.path()).await.capabilities().durable);
}

#[tokio::test]
async fn corrupt_one_byte_changes_the_stored_content() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    for data in [content(1000, 6), Vec::new()] {
        let key = put(&engine, "a", &data).await;
        engine.corrupt_one_byte(&key).await.unwrap();
        let stored = read_range(&engine, &key, None).await;
        assert_ne!(Digest::of(&stored), key.digest);
    }
    let absent = Key::new(ns("a"), Digest::of(b"absent"));
    assert_eq!(engine.corrupt_one_byte(&absent).await, Err(Error::Missing));
}

#[tokio::test]
async fn a_failing_publish_reports_the_error_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(CHUNK_SIZE, 8);
    let key = Key::new(ns("a"), Digest::of(&data));
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    stage.write(Bytes::from(data)).await.unwrap();
    // Someone removes the stage file under the stage: linking it fails.
    for entry in fs::read_dir(dir.path().join(".stage")).unwrap() {
        fs::remove_file(entry.unwrap().path()).unwrap();
    }
    let err = stage.publish(&key).await.unwrap_err();
    assert!(matches!(err, Error::Io(_)), "{err}");
    assert_eq!(engine.meta(&key).await.unwrap(), None);
    assert_eq!(engine.stage_file_count().unwrap(), 0);
}

/// Reads `key` whole through the engine; the bytes and the digest the
/// read sent (`None` when the read carries none).
async fn read_with_digest(engine: &LocalEngine, key: &Key) -> (Vec<u8>, Option<Digest>) {
    let r = engine
        .read_whole(key)
        .await
        .unwrap()
        .expect("entry present");
    let mut out = Vec::new();
    let r = r.into_stream();
    let mut reader = r.reader;
    reader.read_to_end(&mut out).await.unwrap();
    assert_eq!(out.len() as u64, r.len);
    let digest = match r.digest {
        Some(rx) => Some(rx.await.expect("the read sends its digest")),
        None => None,
    };
    (out, digest)
}

/// Whole reads of more than one chunk carry the digest of the bytes they
/// yield: up to 1 MiB read and hashed in one blocking call and held in
/// memory, beyond that streamed, hashed as it goes.
#[tokio::test]
async fn whole_reads_of_more_than_a_chunk_send_the_digest_of_the_bytes_read() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    for len in [
        CHUNK_SIZE + 1,
        2 * CHUNK_SIZE,
        3 * CHUNK_SIZE + 12_345,
        4 * CHUNK_SIZE,
        4 * CHUNK_SIZE + 1,
        // More chunks than are ever in flight: buffers are recycled.
        9 * CHUNK_SIZE + 1,
    ] {
        let data = content(len, 3);
        let key = put(&engine, "a", &data).await;
        let r = engine.read_whole(&key).await.unwrap().unwrap();
        let at_once = len as u64 <= crate::reader::WHOLE_READ_MAX;
        assert_eq!(matches!(r, BlobReader::Bytes { .. }), at_once, "len {len}");
        if let BlobReader::Bytes { bytes, .. } = &r {
            assert_eq!(bytes[..], data[..], "len {len}");
        }
        let (got, digest) = read_with_digest(&engine, &key).await;
        assert_eq!(got, data, "len {len}");
        assert_eq!(digest, Some(Digest::of(&data)), "len {len}");
        assert_eq!(digest, Some(Digest::from(blake3::hash(&got))), "len {len}");
        // After damage the digest is that of the bytes on disk, not the key.
        engine.corrupt_one_byte(&key).await.unwrap();
        let (got, digest) = read_with_digest(&engine, &key).await;
        assert_ne!(got, data);
        assert_eq!(digest, Some(Digest::of(&got)), "len {len}");
        assert_ne!(digest, Some(key.digest));
        // The same after the descriptor was cached (the cached read path).
        let (again, digest) = read_with_digest(&engine, &key).await;
        assert_eq!((again, digest), (got.clone(), Some(Digest::of(&got))));
    }
    // A whole file of at most one chunk is read at once and hashed by the
    // facade; ranges are not verified, so carry no digest either.
    for len in [0, 1, CHUNK_SIZE] {
        let data = content(len, 4);
        let key = put(&engine, "a", &data).await;
        assert_eq!(read_with_digest(&engine, &key).await, (data, None));
    }
    let data = content(3 * CHUNK_SIZE, 5);
    let key = put(&engine, "a", &data).await;
    for range in [0..3 * CHUNK_SIZE as u64, 1..2 * CHUNK_SIZE as u64 + 1, 0..1] {
        let r = engine.read_exact(&key, range).await.unwrap().unwrap();
        assert!(!r.has_digest());
    }
}

/// A streamed read waits for its consumer's demand: one that keeps every
/// byte gets the whole span as one buffer, hashed, with no chunk hand-off;
/// one that streams gets chunks of at most `STREAM_CHUNK`; one dropped
/// unpolled reads nothing and sends no digest.
#[tokio::test]
async fn a_collecting_reader_gets_one_buffer_and_a_streaming_one_small_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(9 * CHUNK_SIZE + 7, 8);
    let key = put(&engine, "a", &data).await;
    let chunks_of = |r: BlobReader| match r {
        BlobReader::Chunks { chunks, digest, .. } => (chunks, digest.expect("whole reads hash")),
        other => panic!("streamed read expected, got {other:?}"),
    };
    for cached in [false, true] {
        let (chunks, digest) = chunks_of(engine.read_whole(&key).await.unwrap().unwrap());
        chunks.collect();
        let all = chunks.next_chunk().await.unwrap().expect("the bytes");
        assert_eq!(all[..], data[..], "cached descriptor: {cached}");
        assert!(chunks.next_chunk().await.unwrap().is_none());
        assert_eq!(digest.await.unwrap(), Digest::of(&data));

        let (chunks, digest) = chunks_of(engine.read_whole(&key).await.unwrap().unwrap());
        let mut got = Vec::new();
        while let Some(c) = chunks.next_chunk().await.unwrap() {
            assert!(c.len() <= crate::reader::STREAM_CHUNK, "{}", c.len());
            got.extend_from_slice(&c);
            // Asked for after streaming began: too late to change.
            chunks.collect();
        }
        assert_eq!(got, data);
        assert_eq!(digest.await.unwrap(), Digest::of(&data));
    }
    // What a facade's `into_bytes` does, over a corrupt file: the digest
    // is that of the bytes read.
    engine.corrupt_one_byte(&key).await.unwrap();
    let (chunks, digest) = chunks_of(engine.read_whole(&key).await.unwrap().unwrap());
    chunks.collect();
    let all = chunks.next_chunk().await.unwrap().unwrap();
    assert_ne!(all[..], data[..]);
    assert_eq!(digest.await.unwrap(), Digest::of(&all));
    let (chunks, digest) = chunks_of(engine.read_whole(&key).await.unwrap().unwrap());
    drop(chunks);
    let got = tokio::time::timeout(Duration::from_secs(10), digest)
        .await
        .expect("the read ends");
    assert!(got.is_err());
}

/// A streamed read's chunks are read as its consumer polls (ADR-085), in
/// its task, inline or by a blocking call: either way a consumer holding
/// `LIVE_CHUNKS` chunks (a stalled HTTP client) gets no further one
/// until it lets go of one, and a range streams its bytes only.
#[tokio::test]
async fn a_streamed_read_waits_for_its_consumer_to_let_go_of_a_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(6 * CHUNK_SIZE + 3, 4);
    let key = put(&engine, "a", &data).await;
    for would_block in [false, true] {
        engine.force_inline_would_block(would_block);
        let r = engine.read_whole(&key).await.unwrap().unwrap();
        let BlobReader::Chunks { chunks, digest, .. } = r else {
            panic!("a streamed read")
        };
        let mut held = Vec::new();
        for _ in 0..crate::reader::LIVE_CHUNKS {
            held.push(chunks.next_chunk().await.unwrap().unwrap());
        }
        let next = tokio::time::timeout(Duration::from_millis(200), chunks.next_chunk()).await;
        assert!(next.is_err(), "a further chunk while the budget's are held");
        let mut got: Vec<u8> = held.iter().flat_map(|c| c.to_vec()).collect();
        held.clear();
        while let Some(c) = chunks.next_chunk().await.unwrap() {
            got.extend_from_slice(&c);
        }
        assert_eq!(got, data, "inline would block: {would_block}");
        assert_eq!(digest.unwrap().await.unwrap(), Digest::of(&data));

        let span = 5..4 * CHUNK_SIZE as u64 + 9;
        let r = engine
            .read_exact(&key, span.clone())
            .await
            .unwrap()
            .unwrap();
        assert!(!r.has_digest());
        let mut got = Vec::new();
        r.into_stream().reader.read_to_end(&mut got).await.unwrap();
        assert_eq!(got[..], data[span.start as usize..span.end as usize]);
    }
}

/// A streamed reader may outlive its runtime (a `Blob` dropped in sync
/// code): with no open-file cache it is its file's last holder, and
/// dropping it closes the file in place instead of panicking for want of
/// a runtime to close it on.
#[test]
fn a_streamed_reader_dropped_after_its_runtime_closes_its_file_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let chunks = rt.block_on(async {
        let options = LocalOptions {
            open_files: 0,
            ..LocalOptions::default()
        };
        let engine = LocalEngine::open(dir.path(), options).await.unwrap();
        let data = content(4 * CHUNK_SIZE, 3);
        let key = put(&engine, "a", &data).await;
        let BlobReader::Chunks { chunks, .. } = engine.read_whole(&key).await.unwrap().unwrap()
        else {
            panic!("a streamed read")
        };
        let first = chunks.next_chunk().await.unwrap().unwrap();
        assert_eq!(first[..], data[..first.len()]);
        chunks
    });
    drop(rt);
    drop(chunks);
}

#[tokio::test]
async fn a_reader_dropped_midway_ends_the_read_without_a_digest() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(8 * CHUNK_SIZE, 6);
    let key = put(&engine, "a", &data).await;
    let r = engine
        .read_whole(&key)
        .await
        .unwrap()
        .unwrap()
        .into_stream();
    let mut reader = r.reader;
    let mut first = vec![0u8; 1000];
    reader.read_exact(&mut first).await.unwrap();
    assert_eq!(first, data[..1000]);
    let digest = r.digest.unwrap();
    drop(reader);
    // The read's state went with the reader, unfinished: no digest.
    let got = tokio::time::timeout(Duration::from_secs(10), digest)
        .await
        .expect("the read ends");
    assert!(got.is_err());
}

#[tokio::test]
async fn the_instance_lock_excludes_a_second_holder_and_stays_out_of_listings() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path()).await;
    let b = open(dir.path()).await;
    let held = a.lock_instance().await.unwrap().expect("local locks");
    assert!(held.describe().contains(".blobpool.lock"), "{held:?}");
    match b.lock_instance().await {
        Err(Error::InstanceLocked { resource, holder }) => {
            assert!(resource.contains("local large tier"), "{resource}");
            assert!(
                holder.starts_with(&format!("pid {} ", std::process::id())),
                "{holder}"
            );
        }
        other => panic!("expected InstanceLocked, got {other:?}"),
    }
    // The same engine value cannot lock twice either: a lock is per store.
    assert!(matches!(
        a.lock_instance().await,
        Err(Error::InstanceLocked { .. })
    ));
    put(&a, "docs", &content(10, 1)).await;
    assert_eq!(a.namespaces().await.unwrap(), vec![ns("docs")]);
    assert_eq!(a.maintain(store_types::Timestamp::now()).await.unwrap(), 0);
    drop(held);
    let again = b.lock_instance().await.unwrap().expect("released on drop");
    drop(again);
    assert!(dir.path().join(".blobpool.lock").is_file(), "never deleted");
}

/// The stage directory of an engine rooted at `root`, with a stage file
/// `name` holding a few bytes, nobody holding its lock.
fn dead_stage(root: &Path, name: &str) -> std::path::PathBuf {
    let path = root.join(".stage").join(name);
    fs::write(&path, b"partial").unwrap();
    path
}

#[test]
fn only_would_block_means_held_and_other_lock_errors_keep_the_stage() {
    use crate::fsio::{classify_lock_probe, StageProbe};
    use std::fs::TryLockError;
    use std::io::{Error as IoError, ErrorKind};

    let dir = tempfile::tempdir().unwrap();
    let file = || fs::File::create(dir.path().join("probe.stage")).unwrap();
    assert!(matches!(
        classify_lock_probe(file(), Ok(())),
        StageProbe::Orphan(_)
    ));
    assert!(matches!(
        classify_lock_probe(file(), Err(TryLockError::WouldBlock)),
        StageProbe::Held
    ));
    assert!(matches!(
        classify_lock_probe(
            file(),
            Err(TryLockError::Error(IoError::from(ErrorKind::WouldBlock)))
        ),
        StageProbe::Held
    ));
    let mut unknown = vec![
        IoError::from(ErrorKind::Unsupported),
        IoError::from(ErrorKind::InvalidInput),
        IoError::from(ErrorKind::PermissionDenied),
        IoError::other("lock manager unreachable"),
    ];
    #[cfg(target_os = "linux")]
    unknown.extend(
        // ENOLCK, EBADF (an NFS lock on a read-only descriptor), EINVAL, EIO.
        [37, 9, 22, 5].map(IoError::from_raw_os_error),
    );
    for e in unknown {
        let shown = e.to_string();
        assert!(
            matches!(
                classify_lock_probe(file(), Err(TryLockError::Error(e))),
                StageProbe::Unknown(_)
            ),
            "{shown} must not mean orphan"
        );
    }
}

#[test]
fn the_stage_probe_opens_read_write_and_holds_the_lock() {
    use crate::fsio::{probe_stage, StageProbe};
    use std::io::Write;

    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join(".stage")).unwrap();
    let path = dead_stage(dir.path(), "dead.stage");
    // A zero-length write checks the descriptor's access mode only
    // (EBADF on a read-only one) and changes nothing.
    assert!(
        (&fs::File::open(&path).unwrap()).write(&[]).is_err(),
        "control: a read-only descriptor fails the check"
    );
    let StageProbe::Orphan(probe) = probe_stage(&path) else {
        panic!("an unheld stage is an orphan");
    };
    assert!(
        (&probe).write(&[]).is_ok(),
        "the probe's descriptor is writable (NFS locks need it)"
    );
    // While the probe holds the lock, a second probe sees it held.
    assert!(matches!(probe_stage(&path), StageProbe::Held));
    drop(probe);
    assert_eq!(fs::read(&path).unwrap(), b"partial", "nothing written");
    fs::remove_file(&path).unwrap();
    assert!(matches!(probe_stage(&path), StageProbe::Absent));
}

#[tokio::test]
async fn a_stage_locked_through_another_open_file_is_kept_and_an_unheld_one_removed() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let held = dead_stage(dir.path(), "held.stage");
    let dead = dead_stage(dir.path(), "dead.stage");
    // A live put elsewhere: its own open file description holds the lock.
    let holder = fs::File::options()
        .read(true)
        .write(true)
        .open(&held)
        .unwrap();
    holder.try_lock().unwrap();

    assert_eq!(
        crate::fsio::remove_orphan_stages(
            &crate::seam::Seam::default(),
            &dir.path().join(".stage")
        )
        .unwrap(),
        1
    );
    assert!(held.exists(), "the held stage is kept");
    assert!(!dead.exists(), "the unheld stage is removed");
    // Also through maintenance and a fresh open.
    let dead = dead_stage(dir.path(), "dead-2.stage");
    assert_eq!(
        engine
            .maintain(store_types::Timestamp::now())
            .await
            .unwrap(),
        1
    );
    assert!(held.exists() && !dead.exists());
    let _second = open(dir.path()).await;
    assert!(held.exists());
    drop(holder);
    // Another test of this process may fork (a child process) at this
    // moment: until the child execs, it shares `holder`'s open file
    // description and with it the lock. Wait (bounded) until the lock is
    // free, then the stage must be removed.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while fs::File::options()
        .read(true)
        .write(true)
        .open(&held)
        .unwrap()
        .try_lock()
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the lock was never released"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        engine
            .maintain(store_types::Timestamp::now())
            .await
            .unwrap(),
        1,
        "released, it is an orphan"
    );
    assert_eq!(engine.stage_file_count().unwrap(), 0);
}

/// Stages `data` for `key` and publishes it, returning the outcome.
async fn publish(
    engine: &LocalEngine,
    key: &Key,
    data: &[u8],
) -> store_types::Result<PublishOutcome> {
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    stage.write(Bytes::copy_from_slice(data)).await.unwrap();
    stage.publish(key).await
}

/// The content path of `key` under `root`, its fan-out directory created.
fn content_path(root: &Path, key: &Key) -> std::path::PathBuf {
    let fan = root.join(key.namespace.as_str()).join(key.digest.prefix2());
    fs::create_dir_all(&fan).unwrap();
    fan.join(key.digest.to_hex())
}

#[tokio::test]
async fn a_truncated_file_under_the_entry_name_is_replaced_not_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    for fsync in [true, false] {
        let engine = LocalEngine::open(
            dir.path(),
            LocalOptions {
                fsync,
                ..LocalOptions::default()
            },
        )
        .await
        .unwrap();
        let data = content(2 * CHUNK_SIZE + 5, fsync as u8);
        let key = Key::new(ns("a"), Digest::of(&data));
        // A stale or partial name: right path, wrong size.
        let path = content_path(dir.path(), &key);
        fs::write(&path, &data[..1000]).unwrap();
        assert_eq!(
            publish(&engine, &key, &data).await.unwrap(),
            PublishOutcome::Inserted
        );
        assert_eq!(fs::read(&path).unwrap(), data);
        assert_eq!(read_range(&engine, &key, None).await, data);
        assert_eq!(engine.stage_file_count().unwrap(), 0);
        // The repaired entry deduplicates.
        assert_eq!(
            publish(&engine, &key, &data).await.unwrap(),
            PublishOutcome::AlreadyPresent
        );
        assert_eq!(engine.stage_file_count().unwrap(), 0);
    }
}

#[tokio::test]
async fn a_dangling_symlink_under_the_entry_name_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(CHUNK_SIZE + 1, 9);
    let key = Key::new(ns("a"), Digest::of(&data));
    let path = content_path(dir.path(), &key);
    std::os::unix::fs::symlink(dir.path().join("gone"), &path).unwrap();
    assert_eq!(
        publish(&engine, &key, &data).await.unwrap(),
        PublishOutcome::Inserted
    );
    assert!(fs::symlink_metadata(&path).unwrap().is_file());
    assert_eq!(read_range(&engine, &key, None).await, data);
    assert_eq!(engine.stage_file_count().unwrap(), 0);
}

#[tokio::test]
async fn a_symlink_to_a_complete_copy_deduplicates() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(1000, 10);
    let key = Key::new(ns("a"), Digest::of(&data));
    let copy = dir.path().join("copy");
    fs::write(&copy, &data).unwrap();
    std::os::unix::fs::symlink(&copy, content_path(dir.path(), &key)).unwrap();
    assert_eq!(
        publish(&engine, &key, &data).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
    assert_eq!(engine.stage_file_count().unwrap(), 0);
}

#[tokio::test]
async fn a_directory_under_the_entry_name_fails_the_publish_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(CHUNK_SIZE, 11);
    let key = Key::new(ns("a"), Digest::of(&data));
    let path = content_path(dir.path(), &key);
    fs::create_dir(&path).unwrap();
    fs::write(path.join("junk"), b"x").unwrap();
    let err = publish(&engine, &key, &data).await.unwrap_err();
    assert!(
        matches!(&err, Error::Io(f) if f.operation().contains("unusable")
            && f.path() == Some(path.as_path())
            && std::error::Error::source(f).is_some()),
        "{err}"
    );
    assert!(path.is_dir(), "left as it was");
    assert_eq!(engine.meta(&key).await.unwrap(), None);
    assert_eq!(engine.stage_file_count().unwrap(), 0);
}

/// A stage file the probe cannot open read-write is kept (a read-only
/// probe could lock it and would remove it). A running executable cannot
/// be opened for writing (`ETXTBSY`), even by root, so a copy of `sleep`
/// running from the stage directory stands in for it.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_stage_the_probe_cannot_open_read_write_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let Some(sleep) = ["/bin/sleep", "/usr/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
    else {
        eprintln!("skipped: no sleep binary");
        return;
    };
    let path = dir.path().join(".stage").join("busy.stage");
    fs::copy(sleep, &path).unwrap();
    let mut child = match std::process::Command::new(&path).arg("60").spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("skipped: cannot run from the temporary directory: {e}");
            return;
        }
    };
    const ETXTBSY: i32 = 26;
    let busy = fs::File::options()
        .write(true)
        .open(&path)
        .err()
        .and_then(|e| e.raw_os_error());
    if busy == Some(ETXTBSY) {
        assert!(fs::File::open(&path).is_ok(), "readable all the same");
        let removed = engine.maintain(store_types::Timestamp::now()).await;
        let reopened = LocalEngine::open(dir.path(), LocalOptions::default()).await;
        let kept = path.exists();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(removed.unwrap(), 0);
        reopened.unwrap();
        assert!(kept, "an unprobeable stage is kept");
    } else {
        child.kill().unwrap();
        child.wait().unwrap();
        eprintln!("skipped: this kernel lets a running executable be opened for writing");
    }
}

#[tokio::test]
async fn a_media_failure_reports_its_kind_path_and_source() {
    // A file where the namespace directory belongs: creating the fan-out
    // directory under it fails with ENOTDIR, deterministically (even as
    // root, unlike a permission error).
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(64, 12);
    let key = Key::new(ns("blocked"), Digest::of(&data));
    fs::write(dir.path().join("blocked"), b"not a directory").unwrap();
    let err = publish(&engine, &key, &data).await.unwrap_err();
    assert_eq!(err.kind(), store_types::ErrorKind::NotADirectory, "{err:?}");
    assert!(!err.is_transient());
    let Error::Io(failure) = &err else {
        panic!("a media failure is Error::Io: {err:?}")
    };
    let fan = dir
        .path()
        .canonicalize()
        .unwrap()
        .join("blocked")
        .join(key.digest.prefix2());
    assert_eq!(failure.path(), Some(fan.as_path()), "{err}");
    let source = std::error::Error::source(&err).expect("the io error is the source");
    let io = source
        .downcast_ref::<std::io::Error>()
        .expect("an io::Error");
    assert_eq!(io.kind(), std::io::ErrorKind::NotADirectory);
    let shown = err.to_string();
    assert!(
        shown.ends_with(": not a directory") && !shown.contains('\n'),
        "{shown}"
    );
    let report = format!("{:#}", store_types::Report::new(&err));
    assert!(report.contains("\ncaused by: "), "{report}");
    assert_eq!(engine.stage_file_count().unwrap(), 0);
}

/// The outboard handed to a stage is published beside the entry, listed
/// nowhere, read back exactly, and deleted with the entry; an entry
/// without one gets one from `store_outboard` (and only one).
#[tokio::test]
async fn outboards_are_published_with_the_entry_and_deleted_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(3 * 16_384 + 7, 9);
    let (digest, outboard) = store_types::outboard::compute(&data);
    let key = Key::new(ns("a"), digest);
    let mut stage = engine.stage(&key.namespace).await.unwrap();
    stage.write(Bytes::from(data.clone())).await.unwrap();
    stage.set_outboard(outboard.clone()).await.unwrap();
    assert_eq!(stage.publish(&key).await.unwrap(), PublishOutcome::Inserted);
    let path = engine.inner.content_path(&key);
    let ob_path = crate::outboard_path(&path);
    assert_eq!(fs::read(&ob_path).unwrap(), &outboard[..]);
    assert_eq!(
        engine.read_outboard(&key).await.unwrap(),
        Some(outboard.clone())
    );
    // Listings skip the outboard's name.
    let listed = engine.scan(&key.namespace, None, 10).await.unwrap();
    assert_eq!(listed, vec![(digest, data.len() as u64)]);
    assert_eq!(
        engine.delete_many(&key.namespace, &[digest]).await.unwrap(),
        vec![Some(data.len() as u64)]
    );
    assert!(!ob_path.exists(), "the outboard goes with its entry");
    assert_eq!(engine.read_outboard(&key).await.unwrap(), None);

    // An entry stored without an outboard (before outboards) gets one.
    let key = put(&engine, "a", &data).await;
    assert_eq!(engine.read_outboard(&key).await.unwrap(), None);
    engine.store_outboard(&key, outboard.clone()).await.unwrap();
    assert_eq!(
        engine.read_outboard(&key).await.unwrap(),
        Some(outboard.clone())
    );
    // For an absent entry, storing an outboard is a no-op.
    let absent = Key::new(ns("a"), Digest::of(b"absent"));
    engine
        .store_outboard(&absent, outboard.clone())
        .await
        .unwrap();
    assert_eq!(engine.read_outboard(&absent).await.unwrap(), None);
    wait_no_stage_files(&engine).await;
}

/// An outboard left without its entry (a crash between the two names) is
/// removed by maintenance once older than the grace period, never before
/// (it may be a live publish's, about to link its entry); one with its
/// entry is never removed.
#[tokio::test]
async fn orphan_outboards_are_reaped_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(40_000, 3);
    let (digest, outboard) = store_types::outboard::compute(&data);
    let kept = Key::new(ns("a"), digest);
    let mut stage = engine.stage(&kept.namespace).await.unwrap();
    stage.write(Bytes::from(data.clone())).await.unwrap();
    stage.set_outboard(outboard.clone()).await.unwrap();
    stage.publish(&kept).await.unwrap();
    let orphan = Key::new(ns("a"), Digest::of(b"gone"));
    let orphan_path = crate::outboard_path(&engine.inner.content_path(&orphan));
    fs::create_dir_all(orphan_path.parent().unwrap()).unwrap();
    fs::write(&orphan_path, b"an orphan outboard").unwrap();
    let junk = orphan_path.with_file_name("not-a-digest.obao");
    fs::write(&junk, b"junk").unwrap();
    let now = store_types::Timestamp::now();
    assert_eq!(
        engine.maintain(now).await.unwrap(),
        0,
        "young orphans are kept"
    );
    assert!(orphan_path.exists());
    let later = now.plus(crate::ORPHAN_OUTBOARD_GRACE + Duration::from_secs(60));
    assert_eq!(engine.maintain(later).await.unwrap(), 1);
    assert!(!orphan_path.exists());
    assert!(junk.exists(), "junk is never touched");
    assert_eq!(engine.read_outboard(&kept).await.unwrap(), Some(outboard));
}

/// Reads `range` of `key` as the facade does (a ranged `read`), with
/// groups widened as the facade asks (whole up to 64 KiB).
async fn read_sized(engine: &LocalEngine, key: &Key, range: std::ops::Range<u64>) -> Vec<u8> {
    let req = store_types::RangeRequest::new(range, 64 * 1024);
    let read = engine
        .read(key, &ReadOptions::range(req.clone()))
        .await
        .unwrap()
        .expect("entry present");
    assert_eq!(read.span, req.span(read.size).unwrap());
    let mut out = Vec::new();
    let mut rd = read.reader.into_stream().reader;
    rd.read_to_end(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn cached_small_reads_run_inline_and_fall_back_when_they_would_block() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    assert!(
        engine.inline_reads_on() || !cfg!(target_os = "linux"),
        "a temporary directory is on local media"
    );
    let data = content(100 * 1024, 3);
    let key = put(&engine, "a", &data).await;
    // The first read opens the file (inline: its dentry and bytes are
    // cached since the put) and caches the descriptor.
    assert_eq!(
        read_range(&engine, &key, Some((100, 4196))).await,
        &data[100..4196]
    );
    assert_eq!(engine.open_file_count(), 1);
    assert_eq!(engine.inline_read_counts(), (0, 0));
    // Now: inline (the bytes were just read, so they are in the page cache).
    assert_eq!(read_range(&engine, &key, Some((5, 9))).await, &data[5..9]);
    assert_eq!(read_range(&engine, &key, None).await, data);
    assert_eq!(
        read_sized(&engine, &key, 70_000..70_010).await,
        &data[65_536..81_920]
    );
    if !cfg!(target_os = "linux") {
        return;
    }
    assert_eq!(engine.inline_read_counts(), (3, 0));
    // Would block: the same descriptor is read on the blocking pool.
    engine.force_inline_would_block(true);
    assert_eq!(
        read_range(&engine, &key, Some((7, 7000))).await,
        &data[7..7000]
    );
    assert_eq!(read_range(&engine, &key, None).await, data);
    assert_eq!(read_sized(&engine, &key, 0..10).await, &data[..16 * 1024]);
    assert_eq!(engine.inline_read_counts(), (3, 3));
    assert_eq!(engine.open_file_count(), 1);
    engine.force_inline_would_block(false);
    // A range past the end is refused inline as it is on the pool.
    let request = store_types::RangeRequest::new(0..300_000, 0);
    let err = engine
        .read(&key, &ReadOptions::range(request))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidRange { size, .. } if size == data.len() as u64),
        "{err:?}"
    );
}

#[tokio::test]
async fn uncached_small_reads_open_inline_and_fall_back_when_they_would_block() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let (a, b, c) = (content(1000, 1), content(3000, 2), content(300 * 1024, 3));
    let (ka, kb, kc) = (
        put(&engine, "a", &a).await,
        put(&engine, "a", &b).await,
        put(&engine, "a", &c).await,
    );
    if !cfg!(target_os = "linux") {
        return;
    }
    // Not cached yet, page-cached since the put: opened and read inline.
    assert_eq!(read_range(&engine, &ka, None).await, a);
    assert_eq!(engine.inline_open_count(), 1);
    assert_eq!(engine.open_file_count(), 1);
    // A whole entry longer than one chunk never goes inline.
    assert_eq!(read_range(&engine, &kc, None).await, c);
    assert_eq!(engine.inline_open_count(), 1);
    // Would block: the blocking path reads it, and caches the descriptor.
    engine.force_inline_would_block(true);
    assert_eq!(read_range(&engine, &kb, Some((10, 20))).await, &b[10..20]);
    assert_eq!(engine.inline_open_count(), 1);
    engine.force_inline_would_block(false);
    // A deleted entry is absent, whichever path looks.
    let absent = Key::new(ns("a"), Digest::of(b"never stored"));
    let opts = ReadOptions::whole();
    assert!(engine.read(&absent, &opts).await.unwrap().is_none());
    engine
        .delete_many(&ka.namespace, &[ka.digest])
        .await
        .unwrap();
    assert!(engine.read(&ka, &opts).await.unwrap().is_none());
}

#[tokio::test]
async fn a_delete_drops_cached_descriptors_in_every_engine_on_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let other = open(dir.path()).await;
    let data = content(3000, 4);
    let key = put(&engine, "a", &data).await;
    for e in [&engine, &other] {
        assert_eq!(read_range(e, &key, None).await, data);
        assert_eq!(read_range(e, &key, Some((1, 2))).await, &data[1..2]);
        assert_eq!(e.open_file_count(), 1);
    }
    let freed = engine
        .delete_many(&key.namespace, &[key.digest])
        .await
        .unwrap();
    assert_eq!(freed, vec![Some(3000)]);
    for e in [&engine, &other] {
        assert_eq!(e.open_file_count(), 0);
        assert!(e.read_whole(&key).await.unwrap().is_none());
        assert!(e.read_exact(&key, 0..1).await.unwrap().is_none());
        let req = store_types::RangeRequest::new(0..1, 0);
        let ranged = e.read(&key, &ReadOptions::range(req)).await.unwrap();
        assert!(ranged.is_none());
    }
}

#[tokio::test]
async fn a_read_that_opened_before_a_delete_does_not_cache_its_descriptor() {
    // The race of cache.rs step by step: the epoch is loaded, the file
    // opened, then a delete unlinks it and invalidates, then the read
    // offers its descriptor.
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(100, 5);
    let key = put(&engine, "a", &data).await;
    let files = &engine.inner.open_files;
    let seen = files.epoch();
    let file = fs::File::open(engine.inner.content_path(&key)).unwrap();
    engine
        .delete_many(&key.namespace, &[key.digest])
        .await
        .unwrap();
    drop(files.offer(&key, file, seen));
    assert_eq!(engine.open_file_count(), 0);
    assert!(engine.read_whole(&key).await.unwrap().is_none());
    // Control: without a delete in between, the offer is taken.
    let key = put(&engine, "a", &data).await;
    let seen = files.epoch();
    let file = fs::File::open(engine.inner.content_path(&key)).unwrap();
    drop(files.offer(&key, file, seen));
    assert_eq!(engine.open_file_count(), 1);
}

#[tokio::test]
async fn the_open_file_cache_keeps_at_most_its_bound_and_can_be_off() {
    let dir = tempfile::tempdir().unwrap();
    let small = LocalOptions {
        open_files: 4,
        ..LocalOptions::default()
    };
    let engine = LocalEngine::open(dir.path(), small).await.unwrap();
    let mut keys = Vec::new();
    for i in 0..10u8 {
        let data = content(1000 + i as usize, i);
        keys.push((put(&engine, "a", &data).await, data));
    }
    for _ in 0..3 {
        for (key, data) in &keys {
            assert_eq!(&read_range(&engine, key, None).await, data);
            assert!(engine.open_file_count() <= 4);
        }
    }
    assert_eq!(engine.open_file_count(), 4);
    for options in [
        LocalOptions {
            open_files: 0,
            ..LocalOptions::default()
        },
        LocalOptions {
            shared_media: true,
            ..LocalOptions::default()
        },
    ] {
        let root = tempfile::tempdir().unwrap();
        let off = LocalEngine::open(root.path(), options).await.unwrap();
        let data = content(10, 1);
        let key = put(&off, "a", &data).await;
        for _ in 0..2 {
            assert_eq!(read_range(&off, &key, None).await, data);
        }
        assert_eq!(off.open_file_count(), 0, "{options:?}");
        assert!(!off.inline_reads_on(), "{options:?}");
        assert_eq!(off.inline_read_counts(), (0, 0), "{options:?}");
    }
}

#[tokio::test]
async fn replacing_an_unusable_file_drops_its_cached_descriptor() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(5000, 6);
    let key = Key::new(ns("a"), Digest::of(&data));
    let path = content_path(dir.path(), &key);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, &data[..1000]).unwrap();
    // A read of the truncated file caches its descriptor.
    assert_eq!(read_range(&engine, &key, None).await, &data[..1000]);
    assert_eq!(engine.open_file_count(), 1);
    assert_eq!(
        publish(&engine, &key, &data).await.unwrap(),
        PublishOutcome::Inserted
    );
    assert_eq!(read_range(&engine, &key, None).await, data);
}

#[test]
fn the_registry_takes_open_files_and_refuses_a_bad_value() {
    use store_types::registry::{EngineUrl, Options};
    let f = crate::REGISTRATION;
    let url = EngineUrl::parse("file:///srv/large").unwrap();
    assert!(f.accepts_param(&url, "open_files"));
    assert!(!f.accepts_param(&url, "open_file"));
    let ok = Options::default().param("open_files", "16");
    f.check(&url, store_types::Tier::Large, &ok).unwrap();
    let bad = Options::default().param("open_files", "many");
    let err = f.check(&url, store_types::Tier::Large, &bad).unwrap_err();
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("open_files")),
        "{err:?}"
    );
}

#[test]
fn a_whole_read_of_a_file_shorter_than_its_size_fails() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f");
    let data = content(3 * CHUNK_SIZE, 9);
    fs::File::create(&path).unwrap().write_all(&data).unwrap();
    let file = fs::File::open(&path).unwrap();
    let got = crate::reader::pread_exact(&file, 5, data.len() - 5).unwrap();
    assert_eq!(got[..], data[5..]);
    let err = crate::reader::pread_exact(&file, 5, data.len()).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(err.to_string().contains("shorter"), "{err}");
}

/// A streamed whole read hands its chunks out as owned `Bytes`
/// (`BlobReader::Chunks`, TUNING.md §response-chunks) whose buffers go back to the read
/// when dropped — on another thread too — so a long read reuses its one
/// live buffer (`LIVE_CHUNKS`) instead of allocating one per chunk.
#[tokio::test]
async fn taken_chunks_give_their_buffers_back_when_dropped() {
    use std::collections::HashSet;
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path()).await;
    let data = content(16 * CHUNK_SIZE, 9);
    let key = put(&engine, "a", &data).await;
    let r = engine.read_whole(&key).await.unwrap().unwrap();
    let BlobReader::Chunks { chunks, .. } = &r else {
        panic!("a streamed read offers its chunks: {r:?}")
    };
    let chunks = chunks.clone();
    let mut got = Vec::new();
    let mut buffers = HashSet::new();
    let mut n = 0;
    // Memory a dropped chunk freed goes to these, so a read that did not
    // take its buffer back could not get the same address again from the
    // allocator and pass as recycling.
    let mut hogs = Vec::new();
    while let Some(chunk) = chunks.next_chunk().await.unwrap() {
        got.extend_from_slice(&chunk);
        buffers.insert(chunk.as_ptr() as usize);
        n += 1;
        if n % 2 == 0 {
            std::thread::spawn(move || drop(chunk)).join().unwrap();
        } else {
            drop(chunk);
        }
        hogs.push(vec![1u8; crate::reader::STREAM_CHUNK]);
    }
    assert_eq!(got, data);
    // A chunk is read only once the one held here is dropped (its buffer
    // back before its permit), so the read never needs more buffers than
    // its budget of live chunks.
    let most = crate::reader::LIVE_CHUNKS;
    assert!(
        buffers.len() <= most,
        "{} buffers for {n} chunks (at most {most} expected)",
        buffers.len()
    );
    // The byte view of the same read is at its end too.
    let mut rest = Vec::new();
    let mut reader = r.into_stream().reader;
    reader.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}
