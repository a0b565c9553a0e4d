//! `blobpool copy`: SQLite + local files into SQLite + files, PostgreSQL +
//! pg-lo and S3 (moto), idempotent reruns, a failed entry retried by a
//! rerun, and a copy killed half-way then resumed. Every destination is
//! checked by reopening it here and reading each entry back verified.
//!
//! Needs PostgreSQL at `DATABASE_URL` (default
//! postgres://postgres@127.0.0.1:5432/test) and an S3-compatible server at
//! `BLOBPOOL_TEST_S3_ENDPOINT` (default http://127.0.0.1:5000, e.g.
//! `python3 -m moto.server -H 127.0.0.1 -p 5000`); the tests using them
//! fail, never skip, when they are unreachable.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::bytes_of;
use store_core::{Mode, Store};
use store_local::{LocalEngine, LocalOptions};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Digest, Key, Namespace};

const BIN: &str = env!("CARGO_BIN_EXE_blobpool");

/// A command with a clean environment: no inherited BLOBPOOL_* or AWS_*.
fn cmd() -> Command {
    let mut c = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("BLOBPOOL_") || k.starts_with("AWS_") {
            c.env_remove(k);
        }
    }
    c.stdin(Stdio::null());
    c
}

fn copy_cmd(from: &Path, to: &Path) -> Command {
    let mut c = cmd();
    c.arg("copy")
        .arg("--from")
        .arg(from)
        .arg("--to")
        .arg(to)
        .arg("--json");
    c
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// The JSON summary of a finished copy (checked against `status`).
fn summary(o: &Output, status: i32) -> serde_json::Value {
    assert_eq!(
        o.status.code(),
        Some(status),
        "stdout: {} stderr: {}",
        String::from_utf8_lossy(&o.stdout),
        stderr(o)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&o.stdout)))
}

fn counts(v: &serde_json::Value) -> (u64, u64, u64) {
    (
        v["copied"].as_u64().unwrap(),
        v["skipped"].as_u64().unwrap(),
        v["failed"].as_u64().unwrap(),
    )
}

/// One source entry.
#[derive(Clone)]
struct Entry {
    key: Key,
    data: Vec<u8>,
}

fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

/// Entries of the given sizes spread over `namespaces` (distinct content).
fn corpus(sizes: &[u64], namespaces: &[&str], seed: u64) -> Vec<Entry> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let data = bytes_of(len, seed * 1000 + i as u64 + 1);
            let n = ns(namespaces[i % namespaces.len()]);
            Entry {
                key: Key::new(n, Digest::of(&data)),
                data,
            }
        })
        .collect()
}

/// Mixed sizes: empty, kv-sized, around the thresholds, multi-chunk.
fn mixed(seed: u64) -> Vec<Entry> {
    corpus(
        &[
            0,
            1,
            100,
            1023,
            1024,
            1025,
            4096,
            4097,
            70_000,
            300_000,
            2 << 20,
            5,
        ],
        &["docs", "images", "default"],
        seed,
    )
}

fn total_bytes(entries: &[Entry]) -> u64 {
    entries.iter().map(|e| e.data.len() as u64).sum()
}

/// A SQLite + local-files store in `dir` with its config file
/// (`dir/blobpool.toml`).
struct SqliteLocal {
    dir: PathBuf,
    threshold: u64,
}

impl SqliteLocal {
    fn new(dir: &Path, threshold: u64) -> SqliteLocal {
        std::fs::create_dir_all(dir).unwrap();
        let me = SqliteLocal {
            dir: dir.to_path_buf(),
            threshold,
        };
        std::fs::write(
            me.config(),
            format!(
                "kv = \"sqlite://{}\"\nlarge = \"file://{}\"\nthreshold = {threshold}\nfsync = false\n",
                me.dir.join("kv.sqlite").display(),
                me.large_root().display()
            ),
        )
        .unwrap();
        me
    }

    fn config(&self) -> PathBuf {
        self.dir.join("blobpool.toml")
    }

    fn large_root(&self) -> PathBuf {
        self.dir.join("large")
    }

    /// Where the local engine keeps a large entry.
    fn large_file(&self, key: &Key) -> PathBuf {
        let hex = key.digest.to_hex();
        self.large_root()
            .join(key.namespace.as_str())
            .join(&hex[..2])
            .join(&hex)
    }

    /// Large-tier files (named by a digest) under the root.
    fn large_files(&self) -> usize {
        fn walk(p: &Path, n: &mut usize) {
            let Ok(rd) = std::fs::read_dir(p) else { return };
            for e in rd.flatten() {
                let path = e.path();
                if path.is_dir() {
                    walk(&path, n);
                } else if Digest::parse(&e.file_name().to_string_lossy()).is_ok() {
                    *n += 1;
                }
            }
        }
        let mut n = 0;
        walk(&self.large_root(), &mut n);
        n
    }

    /// Opens the store in this process (drop it before running the binary
    /// on it: the instance lock).
    async fn open(&self) -> Store {
        let kv = SqliteEngine::open(self.dir.join("kv.sqlite"), SqliteOptions::default())
            .await
            .unwrap();
        let large = LocalEngine::open(
            self.large_root(),
            LocalOptions {
                shared_media: false,
                fsync: false,
                ..LocalOptions::default()
            },
        )
        .await
        .unwrap();
        Store::builder()
            .kv(kv)
            .large(large)
            .mode(Mode::DualTier {
                threshold: self.threshold,
            })
            .build()
            .await
            .unwrap()
    }

    async fn fill(&self, entries: &[Entry]) {
        let store = self.open().await;
        fill(&store, entries).await;
    }
}

async fn fill(store: &Store, entries: &[Entry]) {
    for e in entries {
        let r = store
            .put_opts(
                &e.key.namespace,
                &e.data[..],
                store_core::PutOptions {
                    len: Some(e.data.len() as u64),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(r.digest, e.key.digest);
    }
}

/// Every entry is in `store`, byte for byte, through a verified read.
async fn verify(store: &Store, entries: &[Entry]) {
    for e in entries {
        let blob = store
            .get(&e.key)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{} missing in the destination", e.key));
        let got = blob.bytes().await.unwrap();
        assert!(got[..] == e.data[..], "{}: content differs", e.key);
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn run(mut c: Command) -> Output {
    blocking(move || c.output().expect("the binary runs")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_files_copy_into_sqlite_and_files_idempotently() {
    let tmp = tempfile::tempdir().unwrap();
    let src = SqliteLocal::new(&tmp.path().join("src"), 1024);
    // Another threshold: entries change tiers on the way.
    let dst = SqliteLocal::new(&tmp.path().join("dst"), 4096);
    let entries = mixed(1);
    src.fill(&entries).await;

    let v = summary(&run(copy_cmd(&src.config(), &dst.config())).await, 0);
    assert_eq!(counts(&v), (entries.len() as u64, 0, 0), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(total_bytes(&entries)));
    assert_eq!(v["namespaces"].as_u64(), Some(3));
    assert!(v.get("aborted").is_none(), "{v}");

    // Idempotent: a rerun copies nothing.
    let v = summary(&run(copy_cmd(&src.config(), &dst.config())).await, 0);
    assert_eq!(counts(&v), (0, entries.len() as u64, 0), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(0));

    // --namespace: only new entries of `docs` and `extra`.
    let more = corpus(&[10, 5000, 200_000], &["docs", "extra", "other"], 2);
    src.fill(&more).await;
    let mut c = copy_cmd(&src.config(), &dst.config());
    c.args(["-n", "docs", "--namespace", "extra", "--jobs", "2"]);
    let v = summary(&run(c).await, 0);
    let docs_before = entries
        .iter()
        .filter(|e| e.key.namespace.as_str() == "docs")
        .count() as u64;
    assert_eq!(counts(&v), (2, docs_before, 0), "{v}");

    // --digests on stdin: the `other` one by NAMESPACE DIGEST, a bare
    // digest of docs (present: skipped), an unknown one (fails).
    let unknown = Digest::of(b"not in the source");
    let list = format!(
        "# entries\nother {}\n{}\n\n{unknown}\n",
        more[2].key.digest, entries[0].key.digest
    );
    assert_eq!(entries[0].key.namespace.as_str(), "docs");
    let mut c = copy_cmd(&src.config(), &dst.config());
    c.args(["--digests", "-", "-n", "docs"])
        .stdin(Stdio::piped());
    let o = blocking(move || {
        use std::io::Write;
        let mut child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(list.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    })
    .await;
    let v = summary(&o, 1);
    assert_eq!(counts(&v), (1, 1, 1), "{v}");
    assert_eq!(v["failures"][0]["digest"], unknown.to_hex().as_str());
    assert_eq!(v["failures"][0]["code"], "missing");
    let err = stderr(&o);
    assert!(err.contains(&format!("docs/{unknown}")), "{err}");
    assert!(
        err.contains("blobpool: copy_incomplete: 1 of 3 entries failed"),
        "{err}"
    );

    let dst_store = dst.open().await;
    verify(&dst_store, &entries).await;
    verify(&dst_store, &more).await;
    drop(dst_store);

    // A store onto itself is a usage error; a bad file a config error.
    let o = run(copy_cmd(&src.config(), &src.config())).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("the same kv store"), "{}", stderr(&o));
    let o = run(copy_cmd(&tmp.path().join("nope.toml"), &dst.config())).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).starts_with("blobpool: config: --from"),
        "{}",
        stderr(&o)
    );
    // Text output.
    let mut c = cmd();
    c.arg("copy")
        .arg("--from")
        .arg(src.config())
        .arg("--to")
        .arg(dst.config());
    let o = run(c).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let want = format!(
        "copied 0, skipped {}, failed 0, bytes 0 ",
        entries.len() + more.len()
    );
    assert!(text.starts_with(&want), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_instance_on_the_source_is_reported_as_locked() {
    let tmp = tempfile::tempdir().unwrap();
    let src = SqliteLocal::new(&tmp.path().join("src"), 1024);
    let dst = SqliteLocal::new(&tmp.path().join("dst"), 1024);
    let held = src.open().await;
    let o = run(copy_cmd(&src.config(), &dst.config())).await;
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.starts_with("blobpool: locked: source store"), "{err}");
    assert!(err.contains("fleet configuration"), "{err}");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_entry_is_reported_and_a_rerun_copies_only_it() {
    let tmp = tempfile::tempdir().unwrap();
    let src = SqliteLocal::new(&tmp.path().join("src"), 1024);
    let dst = SqliteLocal::new(&tmp.path().join("dst"), 1024);
    let entries = mixed(3);
    src.fill(&entries).await;
    // Corrupt one large entry in the source (same length, one byte off):
    // its verified read fails at the end, so the destination stores
    // nothing for it.
    let bad = entries
        .iter()
        .find(|e| e.data.len() == 300_000)
        .unwrap()
        .clone();
    let path = src.large_file(&bad.key);
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&path, perms).unwrap();
    let mut corrupt = bad.data.clone();
    corrupt[150_000] ^= 0x55;
    std::fs::write(&path, &corrupt).unwrap();

    let o = run(copy_cmd(&src.config(), &dst.config())).await;
    let v = summary(&o, 1);
    let n = entries.len() as u64;
    assert_eq!(counts(&v), (n - 1, 0, 1), "{v}");
    assert_eq!(v["failures"][0]["digest"], bad.key.digest.to_hex().as_str());
    assert_eq!(v["bytes"].as_u64(), Some(total_bytes(&entries) - 300_000));
    let err = stderr(&o);
    assert!(err.contains(&bad.key.to_string()), "{err}");
    assert_eq!(
        dst.large_files(),
        entries.iter().filter(|e| e.data.len() > 1024).count() - 1
    );

    // Repaired, the rerun copies just that one.
    std::fs::write(&path, &bad.data).unwrap();
    let v = summary(&run(copy_cmd(&src.config(), &dst.config())).await, 0);
    assert_eq!(counts(&v), (1, n - 1, 0), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(300_000));
    verify(&dst.open().await, &entries).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_copy_resumes_where_it_stopped() {
    let tmp = tempfile::tempdir().unwrap();
    let src = SqliteLocal::new(&tmp.path().join("src"), 1024);
    let dst = SqliteLocal::new(&tmp.path().join("dst"), 1024);
    let sizes = vec![20_000u64; 300];
    let entries = corpus(&sizes, &["a", "b"], 4);
    src.fill(&entries).await;

    // Kill the first run (SIGKILL: nothing is cleaned up) once 20 entries
    // are in the destination.
    let mut c = copy_cmd(&src.config(), &dst.config());
    c.args(["--jobs", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let dst_dir = dst.dir.clone();
    let killed_at = blocking(move || {
        let dst = SqliteLocal {
            dir: dst_dir,
            threshold: 1024,
        };
        let mut child = c.spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while dst.large_files() < 20 && Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = child.kill();
        child.wait().unwrap();
        dst.large_files()
    })
    .await;
    assert!(killed_at >= 20, "{killed_at}");

    let v = summary(&run(copy_cmd(&src.config(), &dst.config())).await, 0);
    eprintln!("killed with {killed_at} entries in the destination; the rerun: {v}");
    let (copied, skipped, failed) = counts(&v);
    assert_eq!(failed, 0, "{v}");
    assert_eq!(copied + skipped, 300, "{v}");
    assert!(
        skipped >= killed_at as u64,
        "{v} (killed with {killed_at} there)"
    );
    let v = summary(&run(copy_cmd(&src.config(), &dst.config())).await, 0);
    assert_eq!(counts(&v), (0, 300, 0), "{v}");
    assert_eq!(dst.large_files(), 300);
    verify(&dst.open().await, &entries).await;
}

/// `DATABASE_URL` with `scheme` instead of postgres:// and `schema=`
/// added to the query.
fn pg_url(base: &str, scheme: &str, schema: &str) -> String {
    let rest = base
        .strip_prefix("postgresql://")
        .or_else(|| base.strip_prefix("postgres://"))
        .expect("DATABASE_URL is a postgres:// URL");
    let sep = if rest.contains('?') { '&' } else { '?' };
    format!("{scheme}{rest}{sep}schema={schema}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_files_copy_into_postgres_and_pglo() {
    let schema = store_pg::testing::TestSchema::new();
    let tmp = tempfile::tempdir().unwrap();
    let src = SqliteLocal::new(&tmp.path().join("src"), 1024);
    let entries = mixed(5);
    src.fill(&entries).await;
    let dst_cfg = tmp.path().join("pg.toml");
    std::fs::write(
        &dst_cfg,
        format!(
            "kv = \"{}\"\nlarge = \"{}\"\nthreshold = 4096\n",
            pg_url(&schema.url, "postgres://", &schema.name),
            pg_url(&schema.url, "pglo://", &schema.name)
        ),
    )
    .unwrap();

    {
        let store = src.open().await;
        set_ref(&store, "docs", "latest", entries[0].key.digest).await;
        set_ref(&store, "images", "a/b", entries[1].key.digest).await;
    }

    let mut c = copy_cmd(&src.config(), &dst_cfg);
    c.args(["--jobs", "3"]);
    let v = summary(&run(c).await, 0);
    assert_eq!(counts(&v), (entries.len() as u64, 0, 0), "{v}");
    assert_eq!(refs_of(&v), (2, 0, 0), "{v}");
    assert_eq!(v["bytes"].as_u64(), Some(total_bytes(&entries)));
    let v = summary(&run(copy_cmd(&src.config(), &dst_cfg)).await, 0);
    assert_eq!(counts(&v), (0, entries.len() as u64, 0), "{v}");
    assert_eq!(refs_of(&v), (0, 2, 0), "{v}");

    {
        let kv = store_postgres::PostgresEngine::connect(&schema.url, &schema.name)
            .await
            .unwrap();
        let large = store_pglo::PgLoEngine::connect(&schema.url, &schema.name)
            .await
            .unwrap();
        let store = Store::builder()
            .kv(kv)
            .large(large)
            .mode(Mode::DualTier { threshold: 4096 })
            .build()
            .await
            .unwrap();
        verify(&store, &entries).await;
        let spaces = ["default", "docs", "images"];
        let src_store = src.open().await;
        assert_eq!(
            all_refs(&store, &spaces).await,
            all_refs(&src_store, &spaces).await
        );
        drop(src_store);
        // The tiers follow the destination's threshold.
        for e in &entries {
            let stat = store.stat(&e.key).await.unwrap().unwrap();
            let want = if e.data.len() > 4096 {
                store_types::Tier::Large
            } else {
                store_types::Tier::Kv
            };
            assert_eq!(stat.tier, want, "{}", e.key);
        }
    }
    // And back out of PostgreSQL into a fresh SQLite + files store.
    let back = SqliteLocal::new(&tmp.path().join("back"), 1024);
    let v = summary(&run(copy_cmd(&dst_cfg, &back.config())).await, 0);
    assert_eq!(counts(&v), (entries.len() as u64, 0, 0), "{v}");
    assert_eq!(refs_of(&v), (2, 0, 0), "{v}");
    verify(&back.open().await, &entries).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_and_files_copy_into_s3_and_back() {
    let bucket = store_object::s3_testing::TestBucket::create().await;
    let tmp = tempfile::tempdir().unwrap();
    let src = SqliteLocal::new(&tmp.path().join("src"), 1024);
    let entries = mixed(6);
    src.fill(&entries).await;
    let dst_cfg = tmp.path().join("s3.toml");
    std::fs::write(
        &dst_cfg,
        format!(
            "kv = \"sqlite://{}\"\nlarge = \"{}\"\nthreshold = 1024\n",
            tmp.path().join("s3-kv.sqlite").display(),
            bucket.url("pool")
        ),
    )
    .unwrap();
    let s3 = |mut c: Command| {
        c.env("AWS_ENDPOINT_URL", &bucket.endpoint)
            .env("AWS_ALLOW_HTTP", "true")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1");
        c
    };

    let v = summary(&run(s3(copy_cmd(&src.config(), &dst_cfg))).await, 0);
    assert_eq!(counts(&v), (entries.len() as u64, 0, 0), "{v}");
    let v = summary(&run(s3(copy_cmd(&src.config(), &dst_cfg))).await, 0);
    assert_eq!(counts(&v), (0, entries.len() as u64, 0), "{v}");
    {
        let kv = SqliteEngine::open(tmp.path().join("s3-kv.sqlite"), SqliteOptions::default())
            .await
            .unwrap();
        let large = bucket
            .engine("pool", store_object::ObjectOptions::default())
            .await;
        let store = Store::builder()
            .kv(kv)
            .large(large)
            .mode(Mode::DualTier { threshold: 1024 })
            .build()
            .await
            .unwrap();
        verify(&store, &entries).await;
    }
    // S3 as the source (its listing), into a fresh store.
    let back = SqliteLocal::new(&tmp.path().join("back"), 1024);
    let v = summary(&run(s3(copy_cmd(&dst_cfg, &back.config()))).await, 0);
    assert_eq!(counts(&v), (entries.len() as u64, 0, 0), "{v}");
    verify(&back.open().await, &entries).await;
}

fn refs_of(v: &serde_json::Value) -> (u64, u64, u64) {
    (
        v["refs_copied"].as_u64().unwrap(),
        v["refs_skipped"].as_u64().unwrap(),
        v["refs_failed"].as_u64().unwrap(),
    )
}

/// Every (namespace, name, digest) reference of `store` in `namespaces`.
async fn all_refs(store: &Store, namespaces: &[&str]) -> Vec<(String, String, Digest)> {
    let refs = store.refs().expect("the kv engine holds references");
    let mut out = Vec::new();
    for n in namespaces {
        for r in refs.list(&ns(n), "", None, 1000).await.unwrap() {
            out.push((n.to_string(), r.name.to_string(), r.digest));
        }
    }
    out
}

async fn set_ref(store: &Store, namespace: &str, name: &str, digest: Digest) {
    store
        .refs()
        .unwrap()
        .set(
            &ns(namespace),
            &store_types::RefName::new(name).unwrap(),
            digest,
            store_types::RefExpect::Any,
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_are_copied_after_their_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let src = SqliteLocal::new(&tmp.path().join("src"), 1024);
    let dst = SqliteLocal::new(&tmp.path().join("dst"), 1024);
    let entries = mixed(7);
    {
        let store = src.open().await;
        fill(&store, &entries).await;
        for (i, e) in entries.iter().enumerate().take(6) {
            set_ref(
                &store,
                e.key.namespace.as_str(),
                &format!("r/{i}"),
                e.key.digest,
            )
            .await;
        }
    }
    let spaces = ["default", "docs", "images"];

    // --no-refs: entries only.
    let mut c = copy_cmd(&src.config(), &dst.config());
    c.arg("--no-refs");
    let v = summary(&run(c).await, 0);
    assert_eq!(counts(&v), (entries.len() as u64, 0, 0), "{v}");
    assert_eq!(refs_of(&v), (0, 0, 0), "{v}");

    let v = summary(&run(copy_cmd(&src.config(), &dst.config())).await, 0);
    assert_eq!(counts(&v), (0, entries.len() as u64, 0), "{v}");
    assert_eq!(refs_of(&v), (6, 0, 0), "{v}");
    {
        let (s, d) = (src.open().await, dst.open().await);
        assert_eq!(all_refs(&d, &spaces).await, all_refs(&s, &spaces).await);
        // The destination moves one reference: a conflict for the source's.
        set_ref(
            &d,
            entries[0].key.namespace.as_str(),
            "r/0",
            entries[3].key.digest,
        )
        .await;
        drop(s);
    }
    let v = summary(&run(copy_cmd(&src.config(), &dst.config())).await, 1);
    assert_eq!(refs_of(&v), (0, 5, 1), "{v}");
    assert_eq!(v["failures"][0]["ref"], "r/0");
    assert_eq!(v["failures"][0]["code"], "ref_conflict");
    // --overwrite-refs: the source's wins.
    let mut c = copy_cmd(&src.config(), &dst.config());
    c.arg("--overwrite-refs");
    let v = summary(&run(c).await, 0);
    assert_eq!(refs_of(&v), (1, 5, 0), "{v}");
    let (s, d) = (src.open().await, dst.open().await);
    assert_eq!(all_refs(&d, &spaces).await, all_refs(&s, &spaces).await);
    verify(&d, &entries).await;
}

/// Many small entries, then a few large ones, SQLite + files into SQLite +
/// files and into PostgreSQL + pg-lo: every entry is copied, and the
/// throughput is printed (`--nocapture`; set `BLOBPOOL_COPY_SCALE=10` for
/// the sizes the closing notes quote: 5,000 × 4 KiB and 32 × 8 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_throughput() {
    let scale: u64 = std::env::var("BLOBPOOL_COPY_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let tmp = tempfile::tempdir().unwrap();
    let small = corpus(&vec![4096u64; 500 * scale as usize], &["small"], 8);
    let large = corpus(&vec![(8u64 << 20) / 8; 4 * scale as usize], &["large"], 9);
    let src = SqliteLocal::new(&tmp.path().join("src"), 65536);
    src.fill(&small).await;
    src.fill(&large).await;
    let schema = store_pg::testing::TestSchema::new();
    let pg = tmp.path().join("pg.toml");
    std::fs::write(
        &pg,
        format!(
            "kv = \"{}\"\nlarge = \"{}\"\n",
            pg_url(&schema.url, "postgres://", &schema.name),
            pg_url(&schema.url, "pglo://", &schema.name)
        ),
    )
    .unwrap();
    let files = SqliteLocal::new(&tmp.path().join("dst"), 65536);
    for (what, dst) in [("sqlite+files", files.config()), ("postgres+pg-lo", pg)] {
        for ns in ["small", "large"] {
            let mut c = copy_cmd(&src.config(), &dst);
            c.args(["-n", ns]);
            let v = summary(&run(c).await, 0);
            let secs = v["seconds"].as_f64().unwrap();
            let copied = v["copied"].as_u64().unwrap();
            let want = if ns == "small" {
                small.len()
            } else {
                large.len()
            } as u64;
            assert_eq!(copied, want, "{what} {ns}: {v}");
            let n = copied as f64;
            let mb = v["bytes"].as_u64().unwrap() as f64 / 1e6;
            eprintln!(
                "{what} {ns}: {n} entries, {mb:.1} MB in {secs:.2}s: {:.0} entries/s, {:.1} MB/s",
                n / secs,
                mb / secs
            );
        }
    }
}
