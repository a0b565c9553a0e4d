//! Engine-specific behaviour of the sqlite references (schema v3) and
//! their owners (schema v5, also of the cache keys); the generic semantics
//! are covered by the contract suite (`cases/refs.rs`, `cases/cache.rs`).

use std::path::Path;

use store_sqlite::{SqliteEngine, SqliteOptions, SCHEMA_VERSION};
use store_types::{
    Author, Digest, Error, KvEngine, Namespace, RefExpect, RefName, RefStore, Replace, Timestamp,
};

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
    assert_eq!(SCHEMA_VERSION, 5);
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
        r.delete(
            &ns("b"),
            &name("gone"),
            RefExpect::Digest(y),
            Author::LIBRARY,
        )
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
        .delete(&ns("a"), &name("n"), RefExpect::Digest(y), Author::LIBRARY)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RefConflict { .. }), "{err:?}");
    // A refused author is an answer too (issue 39).
    let b = Author {
        name: Some("b"),
        may: Replace::Own,
    };
    let err = r
        .set_checked(&ns("a"), &name("n"), y, RefExpect::Any, b, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NotOwner { current, .. } if current == x),
        "{err:?}"
    );
    let err = r
        .delete(&ns("a"), &name("n"), RefExpect::Any, b)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotOwner { .. }), "{err:?}");
    let after = engine.stats();
    assert_eq!(after.writes_failed, before.writes_failed);
    assert_eq!(after.writes_committed - before.writes_committed, 4);
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

/// The schema as version 4 of the engine left a file (copied verbatim, so
/// this test keeps describing real v4 files whatever the engine becomes):
/// references and cache keys without owners.
const V4_DDL: &str = "
CREATE TABLE schema_version (
    version    INTEGER NOT NULL PRIMARY KEY,
    applied_at INTEGER NOT NULL
);
CREATE TABLE entries (
    id         INTEGER PRIMARY KEY,
    ns         TEXT    NOT NULL,
    digest     BLOB    NOT NULL CHECK (length(digest) = 32),
    size       INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content    BLOB    NOT NULL,
    CONSTRAINT entries_key UNIQUE (ns, digest)
);
CREATE TABLE refs (
    namespace  TEXT    NOT NULL,
    name       TEXT    NOT NULL,
    digest     BLOB    NOT NULL CHECK (length(digest) = 32),
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
) WITHOUT ROWID;
CREATE INDEX refs_by_digest ON refs (namespace, digest);
CREATE TABLE ref_namespaces (
    namespace TEXT    PRIMARY KEY,
    since     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE cache_keys (
    namespace   TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    digest      BLOB    NOT NULL CHECK (length(digest) = 32),
    size        INTEGER NOT NULL,
    accessed_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, key)
) WITHOUT ROWID;
CREATE INDEX cache_keys_by_digest ON cache_keys (namespace, digest);
CREATE INDEX cache_keys_by_access ON cache_keys (namespace, accessed_at);
INSERT INTO schema_version (version, applied_at)
    VALUES (1, 1700000000000), (2, 1700000000000), (3, 1700000000000), (4, 1700000000000);
";

/// A v4 file's references and cache keys survive the v5 migration and
/// become the library's: a writer that may replace only its own rows
/// cannot replace or remove them, a write-once writer can re-set the same
/// digest, `Replace::Any` replaces.
#[tokio::test]
async fn a_v4_file_gains_owners_and_its_rows_are_the_librarys() {
    assert_eq!(SCHEMA_VERSION, 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db.sqlite");
    let (x, y) = (Digest::of(b"x"), Digest::of(b"y"));
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch(V4_DDL).unwrap();
        raw.execute(
            "INSERT INTO refs (namespace, name, digest, updated_at) VALUES ('a', 'old', ?1, 5)",
            [&x.as_bytes()[..]],
        )
        .unwrap();
        raw.execute(
            "INSERT INTO cache_keys (namespace, key, digest, size, accessed_at)
             VALUES ('c', 'k', ?1, 3, 7)",
            [&x.as_bytes()[..]],
        )
        .unwrap();
    }

    let engine = open(&path).await;
    assert_eq!(engine.schema_version().await.unwrap(), SCHEMA_VERSION);
    let r = refs(&engine);
    let c = engine.cache().expect("sqlite holds cache keys");
    assert_eq!(r.get(&ns("a"), &name("old")).await.unwrap(), Some(x));
    assert_eq!(c.lookup(&ns("c"), &name("k")).await.unwrap(), Some(x));

    let a = Author {
        name: Some("a"),
        may: Replace::Own,
    };
    let once = Author {
        name: Some("a"),
        may: Replace::Nothing,
    };
    let any = Author {
        name: Some("admin"),
        may: Replace::Any,
    };
    let not_owner = |e: Error| matches!(e, Error::NotOwner { current, .. } if current == x);
    // Library-owned: `Own` neither replaces nor removes.
    let e = r
        .set_checked(&ns("a"), &name("old"), y, RefExpect::Any, a, None)
        .await
        .unwrap_err();
    assert!(not_owner(e));
    let e = r
        .delete(&ns("a"), &name("old"), RefExpect::Any, a)
        .await
        .unwrap_err();
    assert!(not_owner(e));
    let e = c
        .record(&ns("c"), &name("k"), y, 1, Timestamp(10), RefExpect::Any, a)
        .await
        .unwrap_err();
    assert!(not_owner(e));
    // The same digest is allowed and keeps the row the library's.
    assert_eq!(
        r.set_checked(&ns("a"), &name("old"), x, RefExpect::Any, once, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(
        c.record(
            &ns("c"),
            &name("k"),
            x,
            3,
            Timestamp(10),
            RefExpect::Any,
            once
        )
        .await
        .unwrap(),
        Some(x)
    );
    let raw = rusqlite::Connection::open(&path).unwrap();
    let owners = |raw: &rusqlite::Connection| -> (Option<String>, Option<String>) {
        let r = raw
            .query_row("SELECT owner FROM refs WHERE name = 'old'", [], |row| {
                row.get(0)
            })
            .unwrap();
        let c = raw
            .query_row("SELECT owner FROM cache_keys WHERE key = 'k'", [], |row| {
                row.get(0)
            })
            .unwrap();
        (r, c)
    };
    assert_eq!(owners(&raw), (None, None));
    assert!(c
        .record(&ns("c"), &name("k"), y, 1, Timestamp(10), RefExpect::Any, a)
        .await
        .is_err());
    // `Any` replaces, and the replaced rows are its own from then on.
    assert_eq!(
        r.set_checked(&ns("a"), &name("old"), y, RefExpect::Any, any, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(
        c.record(
            &ns("c"),
            &name("k"),
            y,
            1,
            Timestamp(11),
            RefExpect::Any,
            any
        )
        .await
        .unwrap(),
        Some(x)
    );
    assert_eq!(
        owners(&raw),
        (Some("admin".to_owned()), Some("admin".to_owned()))
    );
    assert_eq!(r.get(&ns("a"), &name("old")).await.unwrap(), Some(y));
    assert_eq!(c.lookup(&ns("c"), &name("k")).await.unwrap(), Some(y));
}
