//! Engine-specific behaviour of the sqlite references (schema v3); the
//! generic semantics are covered by the contract suite (`cases/refs.rs`).

use std::path::Path;

use store_sqlite::{SqliteEngine, SqliteOptions, SCHEMA_VERSION};
use store_types::{Digest, Error, KvEngine, Namespace, RefExpect, RefName, RefStore};

fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

fn name(s: &str) -> RefName {
    RefName::new(s).unwrap()
}

async fn open(path: &Path) -> SqliteEngine {
    SqliteEngine::open(path, SqliteOptions::default())
        .await
        .unwrap()
}

fn refs(engine: &SqliteEngine) -> std::sync::Arc<dyn RefStore> {
    engine.refs().expect("sqlite holds references")
}

#[tokio::test]
async fn a_v2_file_gains_the_reference_tables() {
    assert_eq!(SCHEMA_VERSION, 4);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    drop(open(&path).await);
    // Take the file back to v2: what a file of the previous release holds.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch(
        "DROP TABLE refs; DROP TABLE ref_namespaces; DROP TABLE cache_keys; \
         DELETE FROM schema_version WHERE version >= 3;",
    )
    .unwrap();
    drop(raw);

    let engine = open(&path).await;
    assert_eq!(engine.schema_version().await.unwrap(), SCHEMA_VERSION);
    let r = refs(&engine);
    let d = Digest::of(b"x");
    assert_eq!(
        r.set(&ns("a"), &name("v1"), d, RefExpect::Absent)
            .await
            .unwrap(),
        None
    );
    drop((r, engine));

    let raw = rusqlite::Connection::open(&path).unwrap();
    let (digest, updated): (Vec<u8>, i64) = raw
        .query_row(
            "SELECT digest, updated_at FROM refs WHERE namespace = 'a' AND name = 'v1'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    // Stored like entries.digest: the 32 raw bytes.
    assert_eq!(digest, d.as_bytes());
    assert!(updated > 0);
    let index: i64 = raw
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = 'refs_by_digest'",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(index, 1);
}

#[tokio::test]
async fn references_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let (x, y) = (Digest::of(b"x"), Digest::of(b"y"));
    {
        let engine = open(&path).await;
        let r = refs(&engine);
        r.set(&ns("a"), &name("keep"), x, RefExpect::Any)
            .await
            .unwrap();
        r.set(&ns("b"), &name("gone"), y, RefExpect::Any)
            .await
            .unwrap();
        r.delete(&ns("b"), &name("gone"), RefExpect::Digest(y))
            .await
            .unwrap();
        // The facade marks namespaces after a committed set (ADR-045).
        assert!(r.ref_namespaces().await.unwrap().is_empty());
        for n in ["a", "b"] {
            assert!(r.mark_uses_refs(&ns(n)).await.unwrap());
        }
    }
    let engine = open(&path).await;
    let r = refs(&engine);
    assert_eq!(r.get(&ns("a"), &name("keep")).await.unwrap(), Some(x));
    assert_eq!(r.get(&ns("b"), &name("gone")).await.unwrap(), None);
    assert_eq!(r.ref_namespaces().await.unwrap(), vec![ns("a"), ns("b")]);
    assert!(r.uses_refs(&ns("b")).await.unwrap());
    assert!(!r.uses_refs(&ns("c")).await.unwrap());
}

#[tokio::test]
async fn a_failed_precondition_is_not_a_failed_write() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("db.sqlite")).await;
    let r = refs(&engine);
    let (x, y) = (Digest::of(b"x"), Digest::of(b"y"));
    r.set(&ns("a"), &name("n"), x, RefExpect::Absent)
        .await
        .unwrap();
    let before = engine.stats();
    let err = r
        .set(&ns("a"), &name("n"), y, RefExpect::Absent)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::RefConflict { ref current, .. } if *current == Some(x)),
        "{err:?}"
    );
    let err = r
        .delete(&ns("a"), &name("n"), RefExpect::Digest(y))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RefConflict { .. }), "{err:?}");
    let after = engine.stats();
    assert_eq!(after.writes_failed, before.writes_failed);
    assert_eq!(after.writes_committed - before.writes_committed, 2);
    assert_eq!(r.get(&ns("a"), &name("n")).await.unwrap(), Some(x));
}

#[tokio::test]
async fn prefixes_are_not_patterns() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(&dir.path().join("db.sqlite")).await;
    let r = refs(&engine);
    let d = Digest::of(b"x");
    for n in ["a_b", "aXb", "a.b", "A_b", "a"] {
        r.set(&ns("a"), &name(n), d, RefExpect::Any).await.unwrap();
    }
    let names = |prefix: &'static str| {
        let r = r.clone();
        async move {
            r.list(&ns("a"), prefix, None, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|e| e.name.to_string())
                .collect::<Vec<_>>()
        }
    };
    // LIKE 'a_%' would match all of a_b, aXb, a.b and (ASCII case folded)
    // A_b; `%` would match everything.
    assert_eq!(names("a_").await, ["a_b"]);
    assert_eq!(names("a%").await, Vec::<String>::new());
    assert_eq!(names("%").await, Vec::<String>::new());
    assert_eq!(names("ä").await, Vec::<String>::new());
    assert_eq!(names("a").await, ["a", "a.b", "aXb", "a_b"]);
    assert_eq!(names("").await, ["A_b", "a", "a.b", "aXb", "a_b"]);
}
