//! The no-wait read path (ADR-055): cached point reads run on the calling
//! thread; a read whose pages are not in memory falls back to the blocking
//! pool and still answers.

use std::os::fd::AsRawFd;
use std::path::Path;

use bytes::Bytes;
use store_types::EngineExt as _;
use store_types::{BlobReader, Digest, Key, KvEngine, Namespace};

use crate::{ReadPath, SqliteEngine, SqliteOptions};

async fn open(path: &Path) -> SqliteEngine {
    let options = SqliteOptions {
        cache_bytes: 0,
        ..SqliteOptions::default()
    };
    SqliteEngine::open(path, options).await.unwrap()
}

async fn put_all(engine: &SqliteEngine, n: usize, len: usize) -> Vec<(Key, Vec<u8>)> {
    let ns = Namespace::new("nowait").unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        let data: Vec<u8> = (0..len).map(|j| (i * 31 + j * 7) as u8).collect();
        let k = Key::new(ns.clone(), Digest::of(&data));
        engine.put(&k, Bytes::copy_from_slice(&data)).await.unwrap();
        out.push((k, data));
    }
    out
}

async fn read(engine: &SqliteEngine, k: &Key) -> Vec<u8> {
    let r = engine.read_whole(k).await.unwrap().expect("stored");
    let BlobReader::Bytes { bytes, .. } = r else {
        panic!("sqlite reads are in memory: {r:?}")
    };
    bytes.to_vec()
}

/// Checkpoints the WAL into the file, syncs it and asks the kernel to drop
/// its cached pages.
fn evict(path: &Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    let file = std::fs::File::open(path).unwrap();
    file.sync_all().unwrap();
    // SAFETY: a valid descriptor; advice only.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0);
}

#[tokio::test]
async fn cached_point_reads_run_on_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let e = open(&dir.path().join("db.sqlite")).await;
    let entries = put_all(&e, 50, 1024).await;
    let before = e.read_path();
    for (k, data) in &entries {
        assert_eq!(&read(&e, k).await, data);
    }
    let after = e.read_path();
    assert_eq!(
        after.inline - before.inline,
        entries.len() as u64,
        "pages just written are in memory: {before:?} -> {after:?}"
    );
    assert_eq!(after.fell_back, before.fell_back);
    // A missing key is answered inline too.
    let ns = Namespace::new("nowait").unwrap();
    assert!(e
        .read_whole(&Key::new(ns, Digest::of(b"absent")))
        .await
        .unwrap()
        .is_none());
    assert_eq!(e.read_path().inline, after.inline + 1);
}

#[tokio::test]
async fn a_read_of_pages_not_in_memory_falls_back_to_the_pool_and_still_answers() {
    falls_back_and_still_answers().await;
}

/// On a multi-thread runtime the fallback waits in place (`block_in_place`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_of_pages_not_in_memory_falls_back_in_place_and_still_answers() {
    falls_back_and_still_answers().await;
}

async fn falls_back_and_still_answers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let entries = put_all(&open(&path).await, 64, 64 * 1024).await;
    evict(&path);
    let e = open(&path).await;
    let (k, data) = &entries[37];
    assert_eq!(&read(&e, k).await, data, "the fallback answers");
    let first = e.read_path();
    assert!(
        first.fell_back >= 1 && first.pooled >= 1,
        "an evicted entry is not read on the calling thread: {first:?}"
    );
    // The pool's read brought the pages in: the same read is now inline,
    // on a connection that failed an attempt before.
    for _ in 0..4 {
        assert_eq!(&read(&e, k).await, data);
    }
    let again = e.read_path();
    assert!(again.inline > first.inline, "{first:?} -> {again:?}");
    // Every entry still reads back right, whichever path it took.
    for (k, data) in &entries {
        assert_eq!(&read(&e, k).await, data);
    }
    let ReadPath {
        inline, fell_back, ..
    } = e.read_path();
    assert!(inline + fell_back >= 1 + 4 + entries.len() as u64);
}
