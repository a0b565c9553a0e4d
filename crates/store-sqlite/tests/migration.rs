//! Schema migration v1 → v2: a file written by the v1 schema (`entries`
//! as a `WITHOUT ROWID` table with the content inline) is rebuilt in place
//! as a rowid table with a unique `(ns, digest)` index, every row kept.

use bytes::Bytes;
use store_sqlite::{SqliteEngine, SqliteOptions, SCHEMA_VERSION};
use store_types::EngineExt as _;
use store_types::{Digest, Engine, Key, KvEngine, Namespace, PublishOutcome, Timestamp};
use tokio::io::AsyncReadExt;

/// The schema as version 1 of the engine created it (copied verbatim, so
/// this test keeps describing real v1 files whatever the engine becomes).
const V1_DDL: &str = "
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER NOT NULL PRIMARY KEY,
    applied_at INTEGER NOT NULL
);
CREATE TABLE entries (
    ns         TEXT    NOT NULL,
    digest     BLOB    NOT NULL CHECK (length(digest) = 32),
    size       INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    content    BLOB    NOT NULL,
    PRIMARY KEY (ns, digest)
) WITHOUT ROWID;
INSERT INTO schema_version (version, applied_at) VALUES (1, 1700000000000);
CREATE TABLE IF NOT EXISTS gc_window (
    ns            TEXT    NOT NULL,
    digest        BLOB    NOT NULL,
    size          INTEGER NOT NULL,
    visible_after INTEGER NOT NULL,
    PRIMARY KEY (ns, digest)
) WITHOUT ROWID;
";

fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

/// Distinct, deterministic content of `len` bytes.
fn body(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

struct Row {
    key: Key,
    created_at: i64,
    content: Vec<u8>,
}

/// Rows of several namespaces and sizes, from empty to overflowing many
/// pages (the layout v1 handled worst).
fn fixture() -> Vec<Row> {
    let sizes = [0usize, 1, 1024, 4096, 70_000, 300_000];
    let mut rows = Vec::new();
    for (n, name) in ["alpha", "beta", "gamma"].iter().enumerate() {
        for (i, &len) in sizes.iter().enumerate() {
            let seed = (n * 100 + i) as u32;
            let content = body(seed, len);
            rows.push(Row {
                key: Key::new(ns(name), Digest::of(&content)),
                created_at: 1_700_000_000_000 + i64::from(seed),
                content,
            });
        }
    }
    rows
}

fn write_v1(path: &std::path::Path, rows: &[Row]) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(V1_DDL).unwrap();
    let mut insert = conn
        .prepare(
            "INSERT INTO entries (ns, digest, size, created_at, content)
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )
        .unwrap();
    for r in rows {
        insert
            .execute((
                r.key.namespace.as_str(),
                &r.key.digest.as_bytes()[..],
                r.content.len() as i64,
                r.created_at,
                &r.content[..],
            ))
            .unwrap();
    }
    conn.execute(
        "INSERT INTO gc_window (ns, digest, size, visible_after) VALUES (?1, ?2, ?3, ?4)",
        (
            rows[0].key.namespace.as_str(),
            &rows[0].key.digest.as_bytes()[..],
            rows[0].content.len() as i64,
            42i64,
        ),
    )
    .unwrap();
}

async fn read_all(engine: &SqliteEngine, key: &Key) -> Vec<u8> {
    let r = engine.read_whole(key).await.unwrap().expect("present");
    let mut out = Vec::new();
    let r_len = r.len();
    r.into_stream().reader.read_to_end(&mut out).await.unwrap();
    assert_eq!(r_len, out.len() as u64);
    out
}

#[tokio::test]
async fn a_v1_file_is_migrated_in_place_with_its_data() {
    assert_eq!(SCHEMA_VERSION, 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.sqlite");
    let rows = fixture();
    write_v1(&path, &rows);

    let engine = SqliteEngine::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(engine.schema_version().await.unwrap(), SCHEMA_VERSION);
    // v4: the cache-key table exists and works on a migrated file (v5:
    // with its owner).
    let cache = store_types::KvEngine::cache(&engine).expect("sqlite holds cache keys");
    let k = store_types::RefName::new("ac/0").unwrap();
    cache
        .record(
            &ns("alpha"),
            &k,
            Digest::of(b"x"),
            1,
            Timestamp(1),
            store_types::RefExpect::Absent,
            store_types::Author::LIBRARY,
        )
        .await
        .unwrap();
    assert_eq!(
        cache.lookup(&ns("alpha"), &k).await.unwrap(),
        Some(Digest::of(b"x"))
    );

    // Every row, byte for byte, with its recorded size and creation time.
    for r in &rows {
        let meta = engine.meta(&r.key).await.unwrap().expect("row kept");
        assert_eq!(meta.size, r.content.len() as u64);
        assert_eq!(meta.created_at, Timestamp(r.created_at));
        assert_eq!(read_all(&engine, &r.key).await, r.content);
        let len = r.content.len() as u64;
        let range = (len / 3)..(len - len / 4);
        let part = engine
            .read_exact(&r.key, range.clone())
            .await
            .unwrap()
            .expect("present");
        let mut got = Vec::new();
        part.into_stream()
            .reader
            .read_to_end(&mut got)
            .await
            .unwrap();
        assert_eq!(got, r.content[range.start as usize..range.end as usize]);
    }

    // Namespaces, presence and digest-ordered scans as before.
    assert_eq!(
        engine.namespaces().await.unwrap(),
        vec![ns("alpha"), ns("beta"), ns("gamma")]
    );
    for name in ["alpha", "beta", "gamma"] {
        let mut want: Vec<(Digest, u64)> = rows
            .iter()
            .filter(|r| r.key.namespace.as_str() == name)
            .map(|r| (r.key.digest, r.content.len() as u64))
            .collect();
        want.sort();
        let first = engine.scan(&ns(name), None, 4).await.unwrap();
        let rest = engine.scan(&ns(name), Some(first[3].0), 100).await.unwrap();
        assert_eq!([first, rest].concat(), want);
        let mut ask: Vec<Digest> = want.iter().map(|w| w.0).collect();
        ask.push(Digest::of(b"absent"));
        let mut expect = vec![true; want.len()];
        expect.push(false);
        assert_eq!(engine.has_many(&ns(name), &ask).await.unwrap(), expect);
    }

    // The unique key still deduplicates; new rows go in beside the old.
    let old = &rows[3];
    assert_eq!(
        engine
            .put(&old.key, Bytes::from(old.content.clone()))
            .await
            .unwrap(),
        PublishOutcome::AlreadyPresent
    );
    let fresh = body(9999, 2048);
    let fresh_key = Key::new(ns("alpha"), Digest::of(&fresh));
    assert_eq!(
        engine
            .put(&fresh_key, Bytes::from(fresh.clone()))
            .await
            .unwrap(),
        PublishOutcome::Inserted
    );
    assert_eq!(read_all(&engine, &fresh_key).await, fresh);
    assert_eq!(
        engine
            .delete_many(&ns("beta"), &[rows[6].key.digest])
            .await
            .unwrap(),
        vec![Some(0)]
    );

    // The window table is untouched.
    let window = engine.capabilities().seam.unwrap().window.unwrap();
    assert_eq!(window.staged_count().await.unwrap(), 1);
    assert_eq!(
        window
            .staged_many(&rows[0].key.namespace, &[rows[0].key.digest])
            .await
            .unwrap(),
        vec![true]
    );
    drop(engine);

    // The file now holds the v2 layout, and only it.
    let raw = rusqlite::Connection::open(&path).unwrap();
    let ddl: String = raw
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'entries'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(!ddl.contains("WITHOUT ROWID"), "{ddl}");
    assert!(ddl.contains("id         INTEGER PRIMARY KEY"), "{ddl}");
    let tables: Vec<String> = raw
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(
        tables,
        [
            "cache_keys",
            "entries",
            "gc_window",
            "ref_namespaces",
            "refs",
            "schema_version"
        ]
    );
    let versions: Vec<i64> = raw
        .prepare("SELECT version FROM schema_version ORDER BY version")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(versions, [1, 2, 3, 4, 5]);
    let count: i64 = raw
        .query_row("SELECT count(*) FROM entries", [], |r| r.get(0))
        .unwrap();
    assert_eq!(count, rows.len() as i64); // one put, one delete
    let check: String = raw
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(raw);

    // Reopening finds nothing more to do.
    let again = SqliteEngine::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(again.schema_version().await.unwrap(), SCHEMA_VERSION);
    assert_eq!(read_all(&again, &fresh_key).await, fresh);
}

#[tokio::test]
async fn an_empty_v1_file_is_migrated_too() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.sqlite");
    write_v1(&path, &fixture()[..1]);
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("DELETE FROM entries; DELETE FROM gc_window;")
        .unwrap();
    drop(raw);
    let engine = SqliteEngine::open(&path, SqliteOptions::default())
        .await
        .unwrap();
    assert_eq!(engine.schema_version().await.unwrap(), SCHEMA_VERSION);
    assert!(engine.namespaces().await.unwrap().is_empty());
    let data = b"after".to_vec();
    let key = Key::new(ns("a"), Digest::of(&data));
    assert_eq!(
        engine.put(&key, Bytes::from(data.clone())).await.unwrap(),
        PublishOutcome::Inserted
    );
    assert_eq!(read_all(&engine, &key).await, data);
}
