//! The sqlite GC seam: ADR-012 §5 applicability and the durable window.

use std::path::Path;

use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Digest, Engine, Key, Namespace, StagedCandidate, Timestamp};

fn cand(ns: &str, data: &[u8], size: u64, visible_after: i64) -> StagedCandidate {
    StagedCandidate {
        key: Key::new(Namespace::new(ns).unwrap(), Digest::of(data)),
        size,
        visible_after: Timestamp(visible_after),
    }
}

async fn open(path: &Path) -> SqliteEngine {
    SqliteEngine::open(path, SqliteOptions::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn seam_shape_matches_adr_012() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("db.sqlite")).await;
    let seam = engine.capabilities().seam.expect("sqlite is a seam member");
    assert!(seam.window.is_some());
    assert!(seam.pins.is_none());
    assert!(seam.sweep_lock.is_none());

    assert!(seam.schema.gc_tables().await.unwrap().is_empty());
    seam.schema.ensure_gc_schema().await.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    assert_eq!(seam.schema.gc_tables().await.unwrap(), vec!["gc_window"]);
}

#[tokio::test]
async fn window_ops_before_the_schema_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("db.sqlite")).await;
    let window = engine.capabilities().seam.unwrap().window.unwrap();
    assert!(window.stage(&[cand("n", b"a", 1, 0)]).await.is_err());
    assert!(window.staged_count().await.is_err());
    // The writer is still healthy afterwards.
    engine
        .capabilities()
        .seam
        .unwrap()
        .schema
        .ensure_gc_schema()
        .await
        .unwrap();
    window.stage(&[cand("n", b"a", 1, 0)]).await.unwrap();
    assert_eq!(window.staged_count().await.unwrap(), 1);
}

#[tokio::test]
async fn the_window_survives_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let engine = open(&path).await;
    let seam = engine.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let window = seam.window.unwrap();
    window
        .stage(&[cand("n", b"a", 3, 100), cand("n", b"b", 4, 200)])
        .await
        .unwrap();
    drop((window, seam.schema, engine));

    let engine = open(&path).await;
    let seam = engine.capabilities().seam.unwrap();
    assert_eq!(seam.schema.gc_tables().await.unwrap(), vec!["gc_window"]);
    let window = seam.window.unwrap();
    assert_eq!(window.staged_count().await.unwrap(), 2);
    let mut want = vec![cand("n", b"a", 3, 100), cand("n", b"b", 4, 200)];
    want.sort_by(|x, y| x.key.cmp(&y.key));
    assert_eq!(
        window.take_due(Timestamp(1000), None, 10).await.unwrap(),
        want
    );
}

#[tokio::test]
async fn stage_keeps_the_earliest_row_and_take_due_paginates_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("db.sqlite")).await;
    let seam = engine.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let window = seam.window.unwrap();

    // Two namespaces, one not yet due, one re-staged later with new values.
    let mut rows: Vec<StagedCandidate> = (0..50u32)
        .map(|i| {
            cand(
                if i % 2 == 0 { "a" } else { "b" },
                &i.to_le_bytes(),
                i as u64,
                10,
            )
        })
        .collect();
    rows.push(cand("a", b"late", 1, 10_000));
    window.stage(&rows).await.unwrap();
    window
        .stage(&[cand("a", &0u32.to_le_bytes(), 999, 1)])
        .await
        .unwrap();
    window.stage(&rows[..5]).await.unwrap();
    assert_eq!(window.staged_count().await.unwrap(), 51);

    let mut due: Vec<StagedCandidate> = rows[..50].to_vec();
    due.sort_by(|x, y| x.key.cmp(&y.key));
    let mut got = Vec::new();
    let mut after: Option<Key> = None;
    loop {
        let page = window
            .take_due(Timestamp(100), after.as_ref(), 7)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().key.clone());
        got.extend(page);
    }
    assert_eq!(
        got, due,
        "earliest rows, in key order, the late one excluded"
    );
    assert_eq!(
        window.take_due(Timestamp(100), None, 0).await.unwrap(),
        vec![]
    );

    let a = Namespace::new("a").unwrap();
    let probe = [
        Digest::of(&0u32.to_le_bytes()),
        Digest::of(b"late"),
        Digest::of(b"none"),
    ];
    assert_eq!(
        window.staged_many(&a, &probe).await.unwrap(),
        vec![true, true, false]
    );
    // Wrong namespace: not staged there.
    let b = Namespace::new("b").unwrap();
    assert_eq!(
        window.staged_many(&b, &probe).await.unwrap(),
        vec![false, false, false]
    );

    let keys: Vec<Key> = got.iter().map(|c| c.key.clone()).collect();
    window.unstage(&keys).await.unwrap();
    window.unstage(&keys).await.unwrap();
    assert_eq!(window.staged_count().await.unwrap(), 1);
    assert!(window
        .take_due(Timestamp(100), None, 10)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        window
            .take_due(Timestamp(10_000), None, 10)
            .await
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn window_writes_group_commit_with_puts() {
    use bytes::Bytes;
    use store_types::KvEngine;
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("db.sqlite")).await;
    let seam = engine.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let window = seam.window.unwrap();
    let before = engine.stats();
    let k = Key::new(Namespace::new("n").unwrap(), Digest::of(b"x"));
    let staged = [cand("n", b"y", 1, 0)];
    let (put, stage) = tokio::join!(
        engine.put(&k, Bytes::from_static(b"x")),
        window.stage(&staged)
    );
    put.unwrap();
    stage.unwrap();
    let after = engine.stats();
    assert_eq!(after.writes_committed - before.writes_committed, 2);
    assert!(after.commits - before.commits <= 2);
}
