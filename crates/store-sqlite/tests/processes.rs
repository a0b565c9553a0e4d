//! Several processes opening one fresh SQLite file at the same moment.
//!
//! The test binary re-executes itself: with `CHILD_ENV` set, the test below
//! acts as one child instead (wait for the "go" file, open, put, exit 0).
//! The parent starts the children, lets them all go at once, checks that
//! every child succeeded and that every child's entry is readable.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use store_sqlite::{SqliteEngine, SqliteOptions, SCHEMA_VERSION};
use store_types::EngineExt as _;
use store_types::{Digest, Engine, Key, KvEngine, Namespace, PublishOutcome};
use tokio::io::AsyncReadExt;

/// Selects the child role; its value is the child's number.
const CHILD_ENV: &str = "BLOBPOOL_SQLITE_TEST_CHILD";
/// The database file the children open.
const DB_ENV: &str = "BLOBPOOL_SQLITE_TEST_DB";
/// The directory holding the `ready-<n>` and `go` files.
const SYNC_ENV: &str = "BLOBPOOL_SQLITE_TEST_SYNC";

const CHILDREN: usize = 4;
const ROUNDS: usize = 3;
/// How long anyone waits for anything before failing the test.
const PATIENCE: Duration = Duration::from_secs(30);

fn key(data: &[u8]) -> Key {
    Key::new(Namespace::new("procs").unwrap(), Digest::of(data))
}

fn body(child: usize) -> String {
    format!("written by child {child}")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn wait_for(path: &Path, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !path.exists() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The child role: announce readiness, wait for the common start, open,
/// put one own entry and one shared entry, check the schema.
fn child(n: usize) {
    let db = PathBuf::from(std::env::var_os(DB_ENV).expect("DB_ENV"));
    let sync = PathBuf::from(std::env::var_os(SYNC_ENV).expect("SYNC_ENV"));
    std::fs::write(sync.join(format!("ready-{n}")), b"").unwrap();
    wait_for(&sync.join("go"), "the go file");
    runtime().block_on(async {
        let opts = SqliteOptions {
            readers: 1,
            ..SqliteOptions::default()
        };
        let engine = SqliteEngine::open(&db, opts)
            .await
            .unwrap_or_else(|e| panic!("child {n}: open failed: {e:?}"));
        let own = body(n);
        assert_eq!(
            engine
                .put(&key(own.as_bytes()), Bytes::from(own))
                .await
                .unwrap_or_else(|e| panic!("child {n}: put failed: {e:?}")),
            PublishOutcome::Inserted
        );
        engine
            .put(&key(b"shared"), Bytes::from_static(b"shared"))
            .await
            .unwrap_or_else(|e| panic!("child {n}: shared put failed: {e:?}"));
        assert_eq!(engine.schema_version().await.unwrap(), SCHEMA_VERSION);
    });
}

fn spawn_child(n: usize, db: &Path, sync: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "concurrent_processes_open_one_fresh_file",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, n.to_string())
        .env(DB_ENV, db)
        .env(SYNC_ENV, sync)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child` with a deadline (killing it when it passes).
fn finish(mut child: Child) -> Output {
    let deadline = Instant::now() + PATIENCE;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn concurrent_processes_open_one_fresh_file() {
    if let Some(n) = std::env::var_os(CHILD_ENV) {
        child(n.to_str().unwrap().parse().unwrap());
        return;
    }
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("db.sqlite");
        let sync = dir.path().join("sync");
        std::fs::create_dir(&sync).unwrap();
        let children: Vec<Child> = (0..CHILDREN).map(|n| spawn_child(n, &db, &sync)).collect();
        for n in 0..CHILDREN {
            wait_for(&sync.join(format!("ready-{n}")), "the children");
        }
        std::fs::write(sync.join("go"), b"").unwrap();
        for (n, c) in children.into_iter().enumerate() {
            let out = finish(c);
            assert!(
                out.status.success(),
                "round {round}: child {n} failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        runtime().block_on(async {
            let engine = SqliteEngine::open(&db, SqliteOptions::default())
                .await
                .unwrap();
            assert_eq!(engine.schema_version().await.unwrap(), SCHEMA_VERSION);
            for n in 0..CHILDREN {
                let want = body(n);
                let blob = engine
                    .read_whole(&key(want.as_bytes()))
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("round {round}: entry of child {n} missing"));
                let mut got = Vec::new();
                blob.into_stream()
                    .reader
                    .read_to_end(&mut got)
                    .await
                    .unwrap();
                assert_eq!(got, want.as_bytes(), "round {round}: child {n}");
            }
            assert!(engine.meta(&key(b"shared")).await.unwrap().is_some());
            let rows = engine
                .scan(&Namespace::new("procs").unwrap(), None, 100)
                .await
                .unwrap();
            assert_eq!(rows.len(), CHILDREN + 1);
        });
    }
}
