//! Engine-specific behaviour of `SqliteEngine`: files, migrations, the
//! descriptor, concurrency and the reader/writer split. The generic
//! engine semantics are covered by the workspace contract suite.

use std::sync::Arc;

use bytes::Bytes;
use store_sqlite::{Durability, SqliteEngine, SqliteOptions, SCHEMA_VERSION};
use store_types::EngineExt as _;
use store_types::{
    Digest, Engine, Error, Instance, Key, KvEngine, Namespace, PublishOutcome, Sharing,
};

fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

fn key(n: &str, data: &[u8]) -> Key {
    Key::new(ns(n), Digest::of(data))
}

async fn read_all(engine: &SqliteEngine, key: &Key) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let r = engine.read_whole(key).await.unwrap()?;
    let mut out = Vec::new();
    let r_len = r.len();
    r.into_stream().reader.read_to_end(&mut out).await.unwrap();
    assert_eq!(r_len, out.len() as u64);
    Some(out)
}

#[tokio::test]
async fn opening_twice_migrates_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let first = SqliteEngine::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    first
        .put(&key("a", b"x"), Bytes::from_static(b"x"))
        .await
        .unwrap();
    // A second engine on the same file while the first is live, then a reopen.
    let second = SqliteEngine::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    drop(first);
    drop(second);
    let third = SqliteEngine::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(third.schema_version().await.unwrap(), SCHEMA_VERSION);
    assert_eq!(read_all(&third, &key("a", b"x")).await.unwrap(), b"x");

    let raw = rusqlite::Connection::open(&path).unwrap();
    let rows: i64 = raw
        .query_row("SELECT count(*) FROM schema_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, SCHEMA_VERSION);
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
}

/// Several engines opening one fresh file at the same moment race the WAL
/// switch (which upgrades a read lock to a write lock, where SQLite does not
/// wait on the busy handler) and the migration. Every open must succeed.
/// Several rounds on fresh files, since one round hits the race only
/// sometimes. (`tests/processes.rs` does the same across processes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_opens_do_not_race_the_migration() {
    const OPENERS: usize = 8;
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let barrier = Arc::new(tokio::sync::Barrier::new(OPENERS));
        let opens: Vec<_> = (0..OPENERS)
            .map(|i| {
                let (path, barrier) = (path.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    let opts = SqliteOptions {
                        readers: 1,
                        ..SqliteOptions::default()
                    };
                    let engine = SqliteEngine::open(&path, opts).await?;
                    let body = format!("opener {i}");
                    engine
                        .put(&key("n", body.as_bytes()), Bytes::from(body))
                        .await?;
                    Ok::<_, Error>(engine)
                })
            })
            .collect();
        let mut engines = Vec::new();
        for (i, o) in opens.into_iter().enumerate() {
            let engine = o
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}, opener {i}: {e:?}"));
            assert_eq!(engine.schema_version().await.unwrap(), SCHEMA_VERSION);
            engines.push(engine);
        }
        for engine in &engines {
            for i in 0..OPENERS {
                let body = format!("opener {i}");
                let k = key("n", body.as_bytes());
                assert_eq!(read_all(engine, &k).await.unwrap(), body.as_bytes());
            }
        }
    }
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    drop(
        SqliteEngine::open(&path, SqliteOptions::default())
            .await
            .unwrap(),
    );
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "INSERT INTO schema_version (version, applied_at) VALUES (?1, 0)",
        [SCHEMA_VERSION + 1],
    )
    .unwrap();
    drop(raw);
    let err = SqliteEngine::open(&path, SqliteOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Config(ref m) if m.contains("newer")),
        "{err:?}"
    );
}

#[tokio::test]
async fn descriptor_names_the_canonical_file() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b/../c/db.sqlite");
    let engine = SqliteEngine::open(&nested, SqliteOptions::default())
        .await
        .unwrap();
    let canonical = std::fs::canonicalize(dir.path().join("a/c/db.sqlite")).unwrap();
    let d = engine.capabilities();
    assert_eq!(d.kind, "sqlite");
    assert_eq!(d.instance, Instance::Path(canonical.clone()));
    assert_eq!(d.sharing, Sharing::EmbeddedFile);
    assert!(d.durable);
    assert_eq!(engine.path(), canonical);
}

#[tokio::test]
async fn memory_databases_are_refused() {
    for bad in [":memory:", ""] {
        let err = SqliteEngine::open(bad, SqliteOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{bad:?}: {err:?}");
    }
}

#[tokio::test]
async fn writes_survive_a_reopen_in_both_durabilities() {
    for durability in [Durability::Full, Durability::Normal] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let opts = SqliteOptions {
            durability,
            readers: 1,
            ..SqliteOptions::default()
        };
        let engine = SqliteEngine::open(&path, opts.clone()).await.unwrap();
        assert_eq!(engine.durability(), durability);
        let k = key("n", b"payload");
        engine
            .put(&k, Bytes::from_static(b"payload"))
            .await
            .unwrap();
        let meta = engine.meta(&k).await.unwrap().unwrap();
        drop(engine);
        let engine = SqliteEngine::open(&path, opts).await.unwrap();
        assert_eq!(engine.meta(&k).await.unwrap(), Some(meta));
        assert_eq!(meta.size, 7);
        assert_eq!(read_all(&engine, &k).await.unwrap(), b"payload");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_identical_puts_insert_once() {
    let dir = tempfile::tempdir().unwrap();
    let engine = SqliteEngine::open(dir.path().join("db.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let k = key("n", b"same");
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (engine, k, barrier) = (engine.clone(), k.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                engine.put(&k, Bytes::from_static(b"same")).await.unwrap()
            })
        })
        .collect();
    let mut inserted = 0;
    for t in tasks {
        if t.await.unwrap() == PublishOutcome::Inserted {
            inserted += 1;
        }
    }
    assert_eq!(inserted, 1);
    assert_eq!(engine.scan(&ns("n"), None, 10).await.unwrap().len(), 1);
    // 32 puts, and (almost always) far fewer commits; never more.
    let stats = engine.stats();
    assert_eq!(stats.writes_committed, 32);
    assert!(stats.commits <= 32, "{stats:?}");
}

#[tokio::test]
async fn ranges_empty_blobs_and_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    let engine = SqliteEngine::open(dir.path().join("db.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let k = key("b", b"0123456789");
    engine
        .put(&k, Bytes::from_static(b"0123456789"))
        .await
        .unwrap();
    let empty = key("a", b"");
    assert_eq!(
        engine.put(&empty, Bytes::new()).await.unwrap(),
        PublishOutcome::Inserted
    );
    assert_eq!(read_all(&engine, &empty).await.unwrap(), b"");
    for (range, want) in [
        (0..10, &b"0123456789"[..]),
        (3..7, b"3456"),
        (10..10, b""),
        (0..0, b""),
    ] {
        use tokio::io::AsyncReadExt;
        let r = engine.read_exact(&k, range.clone()).await.unwrap().unwrap();
        let mut got = Vec::new();
        let r_len = r.len();
        r.into_stream().reader.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, want, "{range:?}");
        assert_eq!(r_len, want.len() as u64);
    }
    assert!(engine
        .read_exact(&key("b", b"nope"), 0..0)
        .await
        .unwrap()
        .is_none());
    engine
        .put(&key("c.x", b"1"), Bytes::from_static(b"1"))
        .await
        .unwrap();
    engine
        .put(&key("c.x", b"2"), Bytes::from_static(b"2"))
        .await
        .unwrap();
    assert_eq!(
        engine.namespaces().await.unwrap(),
        vec![ns("a"), ns("b"), ns("c.x")]
    );
    assert_eq!(
        engine
            .delete_many(&ns("a"), &[Digest::of(b"")])
            .await
            .unwrap(),
        vec![Some(0)]
    );
    assert_eq!(engine.namespaces().await.unwrap(), vec![ns("b"), ns("c.x")]);
}

#[tokio::test]
async fn large_batches_chunk_and_paginate() {
    let dir = tempfile::tempdir().unwrap();
    let engine = SqliteEngine::open(dir.path().join("db.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let n = ns("n");
    let blobs: Vec<Vec<u8>> = (0..3000u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let puts: Vec<_> = blobs
        .iter()
        .map(|b| {
            let (engine, k, b) = (engine.clone(), key("n", b), Bytes::from(b.clone()));
            tokio::spawn(async move { engine.put(&k, b).await })
        })
        .collect();
    for p in puts {
        p.await.unwrap().unwrap();
    }
    // Present and absent digests interleaved, with duplicates, > one chunk.
    let mut probe: Vec<Digest> = Vec::new();
    let mut want = Vec::new();
    for (i, b) in blobs.iter().enumerate() {
        probe.push(Digest::of(b));
        want.push(true);
        if i % 3 == 0 {
            probe.push(Digest::of(&[b.as_slice(), b"absent"].concat()));
            want.push(false);
        }
    }
    probe.push(probe[0]);
    want.push(true);
    assert_eq!(engine.has_many(&n, &probe).await.unwrap(), want);
    assert!(engine.has_many(&n, &[]).await.unwrap().is_empty());

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = engine.scan(&n, after, 701).await.unwrap();
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().0);
        seen.extend(page);
    }
    let mut expected: Vec<(Digest, u64)> = blobs.iter().map(|b| (Digest::of(b), 4)).collect();
    expected.sort();
    assert_eq!(seen, expected);

    let mut del: Vec<Digest> = expected.iter().take(1500).map(|e| e.0).collect();
    del.push(del[0]);
    let freed = engine.delete_many(&n, &del).await.unwrap();
    assert_eq!(freed.iter().filter(|f| **f == Some(4)).count(), 1500);
    assert_eq!(freed.last(), Some(&None), "a duplicate frees nothing");
    assert_eq!(engine.scan(&n, None, 10_000).await.unwrap().len(), 1500);
}

#[cfg(feature = "testing")]
#[tokio::test]
async fn corrupt_one_byte_changes_the_content_only() {
    let dir = tempfile::tempdir().unwrap();
    let engine = SqliteEngine::open(dir.path().join("db.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let k = key("n", b"abcdef");
    engine.put(&k, Bytes::from_static(b"abcdef")).await.unwrap();
    engine.corrupt_one_byte(&k).await.unwrap();
    let got = read_all(&engine, &k).await.unwrap();
    assert_eq!(got.len(), 6);
    assert_eq!(got.iter().zip(b"abcdef").filter(|(a, b)| a != b).count(), 1);
    assert_eq!(engine.meta(&k).await.unwrap().unwrap().size, 6);

    let empty = key("n", b"");
    engine.put(&empty, Bytes::new()).await.unwrap();
    engine.corrupt_one_byte(&empty).await.unwrap();
    assert_eq!(read_all(&engine, &empty).await.unwrap(), vec![0]);
    assert_eq!(engine.meta(&empty).await.unwrap().unwrap().size, 0);

    assert_eq!(
        engine.corrupt_one_byte(&key("n", b"absent")).await,
        Err(Error::Missing)
    );
}
