//! Crash consistency of the SQLite engine on its crash model
//! (`store_sqlite::crash`, ADR-029 "## SQLite").
//!
//! Each scenario (a group-commit put batch, dedup puts, `delete_many`, the
//! GC window's mark / execute / unstage, reference writes, the schema
//! migration of a new and of a v1 file, and a run of puts long enough to
//! checkpoint) is run once to count its durability points, then again,
//! from the same seeded data, crashed at every point `n` — under
//! `synchronous=FULL` and `NORMAL`, with a process crash and with a seeded
//! power loss. After the crash the model restores what was durable, the
//! engine reopens (alternately through the default VFS and the model), and
//! the file must satisfy:
//!
//! - `PRAGMA integrity_check` is `ok`; the schema is current; the instance
//!   lock can be taken (the crashed holder does not block the reopen);
//! - every entry's content hashes to its digest and has its recorded size;
//! - nothing the scenario did not touch changed (no phantom or lost rows);
//! - each touched row (entry, reference, reference namespace, window row)
//!   holds a value reachable by applying, in order, a prefix of the
//!   scenario's operations on it; the prefix covers every acknowledged
//!   operation when the setting promises it: always under `FULL`, and
//!   under `NORMAL` after a process crash. Under `NORMAL` a power loss may
//!   lose acknowledged commits (the WAL is synced only at checkpoints), but
//!   never corrupts and never half-applies;
//! - an operation on several rows (`delete_many`, `stage`, `unstage`) is
//!   all or nothing;
//! - in the scenarios that acknowledge one operation at a time, lost
//!   commits are a suffix: an acknowledged operation is never lost while a
//!   later one survived (the WAL ends at its first bad frame);
//! - window rows keep the earliest `visible_after` and the staged size
//!   (`INSERT OR IGNORE`), and an unstaged or never-staged key has no row.
//!
//! `BLOBPOOL_CRASH_SEEDS=N` runs N seeds per scenario (default 2);
//! `cargo xtask soak` sets it high.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use store_sqlite::crash::{CrashModel, Loss};
use store_sqlite::{Durability, SqliteEngine, SqliteOptions, SCHEMA_VERSION};
use store_types::crash::CrashSwitch;
use store_types::{
    Author, Digest, Engine, Key, KvEngine, Namespace, RefExpect, RefName, StagedCandidate,
    Timestamp,
};

fn seeds() -> u64 {
    std::env::var("BLOBPOOL_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2)
}

fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

fn key(n: &str, data: &[u8]) -> Key {
    Key::new(ns(n), Digest::of(data))
}

/// Seeded content: sizes around the page size and overflow thresholds.
fn blob(rng: &mut StdRng) -> Vec<u8> {
    let len = [1, 100, 1500, 4000, 4097, 9000, 30_000][rng.random_range(0..7)];
    let mut b = vec![0u8; len];
    rng.fill(&mut b[..]);
    b
}

/// A row of the file, as the checker sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Item {
    Entry(String, [u8; 32]),
    Ref(String, String),
    RefNamespace(String),
    Window(String, [u8; 32]),
}

/// The present rows and their values (entry content, reference digest,
/// window `size ‖ visible_after`; reference namespaces have no value).
type Image = BTreeMap<Item, Vec<u8>>;

fn window_value(size: u64, visible_after: i64) -> Vec<u8> {
    let mut v = size.to_be_bytes().to_vec();
    v.extend_from_slice(&visible_after.to_be_bytes());
    v
}

/// One row change of an operation.
#[derive(Clone, Debug)]
enum Change {
    /// `INSERT .. ON CONFLICT DO NOTHING` / `INSERT OR IGNORE`.
    Insert(Vec<u8>),
    /// Upsert.
    Set(Vec<u8>),
    Remove,
}

impl Change {
    fn apply(&self, v: Option<&Vec<u8>>) -> Option<Vec<u8>> {
        match self {
            Change::Insert(new) => Some(v.cloned().unwrap_or_else(|| new.clone())),
            Change::Set(new) => Some(new.clone()),
            Change::Remove => None,
        }
    }
}

/// An operation the scenario issued, its row changes, and whether the
/// engine acknowledged it.
#[derive(Clone, Debug)]
struct Done {
    what: String,
    changes: Vec<(Item, Change)>,
    acked: bool,
}

fn put_op(k: &Key, data: &[u8]) -> (String, Vec<(Item, Change)>) {
    let item = Item::Entry(k.namespace.as_str().into(), *k.digest.as_bytes());
    (
        format!("put {}/{}", k.namespace.as_str(), k.digest),
        vec![(item, Change::Insert(data.to_vec()))],
    )
}

async fn put(e: &SqliteEngine, k: Key, data: Vec<u8>) -> Done {
    let (what, changes) = put_op(&k, &data);
    let acked = e.put(&k, Bytes::from(data)).await.is_ok();
    Done {
        what,
        changes,
        acked,
    }
}

/// Puts all of `blobs` concurrently (one task each), so the writer
/// group-commits them.
async fn put_concurrently(e: &SqliteEngine, blobs: Vec<(Key, Vec<u8>)>) -> Vec<Done> {
    let tasks: Vec<_> = blobs
        .into_iter()
        .map(|(k, b)| {
            let e = e.clone();
            tokio::spawn(async move { put(&e, k, b).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

async fn delete_many(e: &SqliteEngine, n: &str, digests: Vec<Digest>) -> Done {
    let changes = digests
        .iter()
        .map(|d| (Item::Entry(n.into(), *d.as_bytes()), Change::Remove))
        .collect();
    let acked = e.delete_many(&ns(n), &digests).await.is_ok();
    Done {
        what: format!("delete_many {n} x{}", digests.len()),
        changes,
        acked,
    }
}

async fn stage(e: &SqliteEngine, cands: Vec<StagedCandidate>) -> Done {
    let changes = cands
        .iter()
        .map(|c| {
            (
                Item::Window(c.key.namespace.as_str().into(), *c.key.digest.as_bytes()),
                Change::Insert(window_value(c.size, c.visible_after.0)),
            )
        })
        .collect();
    let window = e.capabilities().seam.unwrap().window.unwrap();
    let acked = window.stage(&cands).await.is_ok();
    Done {
        what: format!("stage x{}", cands.len()),
        changes,
        acked,
    }
}

async fn unstage(e: &SqliteEngine, keys: Vec<Key>) -> Done {
    let changes = keys
        .iter()
        .map(|k| {
            (
                Item::Window(k.namespace.as_str().into(), *k.digest.as_bytes()),
                Change::Remove,
            )
        })
        .collect();
    let window = e.capabilities().seam.unwrap().window.unwrap();
    let acked = window.unstage(&keys).await.is_ok();
    Done {
        what: format!("unstage x{}", keys.len()),
        changes,
        acked,
    }
}

async fn ref_set(e: &SqliteEngine, n: &str, name: &str, d: Digest, expect: RefExpect) -> Done {
    let changes = vec![(
        Item::Ref(n.into(), name.into()),
        Change::Set(d.as_bytes().to_vec()),
    )];
    let refs = e.refs().unwrap();
    let acked = refs
        .set(&ns(n), &RefName::new(name).unwrap(), d, expect)
        .await
        .is_ok();
    Done {
        what: format!("ref set {n}/{name}"),
        changes,
        acked,
    }
}

/// The facade's mark after a committed set (ADR-045): its own transaction.
async fn ref_mark(e: &SqliteEngine, n: &str) -> Done {
    let changes = vec![(Item::RefNamespace(n.into()), Change::Insert(Vec::new()))];
    let acked = e.refs().unwrap().mark_uses_refs(&ns(n)).await.is_ok();
    Done {
        what: format!("ref mark {n}"),
        changes,
        acked,
    }
}

async fn ref_delete(e: &SqliteEngine, n: &str, name: &str) -> Done {
    let changes = vec![(Item::Ref(n.into(), name.into()), Change::Remove)];
    let refs = e.refs().unwrap();
    let acked = refs
        .delete(
            &ns(n),
            &RefName::new(name).unwrap(),
            RefExpect::Any,
            Author::LIBRARY,
        )
        .await
        .is_ok();
    Done {
        what: format!("ref delete {n}/{name}"),
        changes,
        acked,
    }
}

/// The crash scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scenario {
    GroupCommitPuts,
    DedupPut,
    DeleteMany,
    GcWindow,
    Refs,
    MigrateNew,
    MigrateV1,
    Checkpoint,
}

/// The v1 schema (as `tests/migration.rs` keeps it).
const V1_DDL: &str = "
CREATE TABLE schema_version (version INTEGER NOT NULL PRIMARY KEY, applied_at INTEGER NOT NULL);
CREATE TABLE entries (
    ns TEXT NOT NULL, digest BLOB NOT NULL CHECK (length(digest) = 32), size INTEGER NOT NULL,
    created_at INTEGER NOT NULL, content BLOB NOT NULL, PRIMARY KEY (ns, digest)
) WITHOUT ROWID;
INSERT INTO schema_version (version, applied_at) VALUES (1, 1700000000000);
";

/// Seeded data shared by a scenario's setup and run.
struct Data {
    blobs: Vec<Vec<u8>>,
}

impl Data {
    fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        Data {
            blobs: (0..32).map(|_| blob(&mut rng)).collect(),
        }
    }

    fn b(&self, i: usize) -> Vec<u8> {
        // Index-tagged so that two indexes never share a digest.
        let mut b = self.blobs[i % self.blobs.len()].clone();
        b.extend_from_slice(&(i as u32).to_be_bytes());
        b
    }

    fn k(&self, n: &str, i: usize) -> Key {
        key(n, &self.b(i))
    }
}

impl Scenario {
    /// Whether the run issues one operation at a time (no concurrent puts).
    fn sequential(self) -> bool {
        !matches!(self, Scenario::GroupCommitPuts | Scenario::DedupPut)
    }

    /// The state before the crashed run (made durable by a clean close).
    async fn setup(self, path: &Path, opts: &SqliteOptions, d: &Data) {
        if self == Scenario::MigrateV1 {
            let conn = rusqlite::Connection::open(path).unwrap();
            conn.execute_batch(V1_DDL).unwrap();
            for i in 0..6 {
                let k = d.k("v1", i);
                let b = d.b(i);
                conn.execute(
                    "INSERT INTO entries VALUES (?1, ?2, ?3, 1, ?4)",
                    (
                        k.namespace.as_str(),
                        &k.digest.as_bytes()[..],
                        b.len() as i64,
                        &b[..],
                    ),
                )
                .unwrap();
            }
            return;
        }
        if self == Scenario::MigrateNew {
            return;
        }
        let e = SqliteEngine::open(path, opts.clone()).await.unwrap();
        let must = |done: Done| assert!(done.acked, "setup: {}", done.what);
        match self {
            Scenario::GroupCommitPuts | Scenario::Checkpoint => {
                must(put(&e, d.k("a", 0), d.b(0)).await);
                must(put(&e, d.k("b", 1), d.b(1)).await);
            }
            Scenario::DedupPut | Scenario::DeleteMany => {
                for i in 0..5 {
                    must(put(&e, d.k("a", i), d.b(i)).await);
                }
            }
            Scenario::GcWindow => {
                e.capabilities()
                    .seam
                    .unwrap()
                    .schema
                    .ensure_gc_schema()
                    .await
                    .unwrap();
                for i in 0..4 {
                    must(put(&e, d.k("a", i), d.b(i)).await);
                }
                must(stage(&e, vec![cand(&d.k("a", 0), 1, 10)]).await);
            }
            Scenario::Refs => {
                must(put(&e, d.k("a", 0), d.b(0)).await);
                must(ref_set(&e, "a", "r1", d.k("a", 0).digest, RefExpect::Absent).await);
                must(ref_mark(&e, "a").await);
                must(ref_set(&e, "a", "r2", d.k("a", 0).digest, RefExpect::Absent).await);
            }
            Scenario::MigrateNew | Scenario::MigrateV1 => unreachable!(),
        }
    }

    /// The crashed run, after the engine opened.
    async fn run(self, e: &SqliteEngine, d: &Data) -> Vec<Done> {
        let mut done = Vec::new();
        match self {
            Scenario::GroupCommitPuts => {
                let batch = (2..10).map(|i| (d.k("a", i), d.b(i))).collect();
                done.extend(put_concurrently(e, batch).await);
                let batch = (10..14).map(|i| (d.k("c", i), d.b(i))).collect();
                done.extend(put_concurrently(e, batch).await);
            }
            Scenario::DedupPut => {
                // Present already, twice in one batch, and new twice.
                let batch = vec![
                    (d.k("a", 0), d.b(0)),
                    (d.k("a", 0), d.b(0)),
                    (d.k("a", 7), d.b(7)),
                    (d.k("a", 7), d.b(7)),
                    (d.k("z", 0), d.b(0)),
                ];
                done.extend(put_concurrently(e, batch).await);
                done.push(put(e, d.k("a", 7), d.b(7)).await);
            }
            Scenario::DeleteMany => {
                let ds = |is: &[usize]| is.iter().map(|&i| d.k("a", i).digest).collect();
                done.push(delete_many(e, "a", ds(&[0, 2, 20])).await);
                done.push(put(e, d.k("a", 8), d.b(8)).await);
                done.push(delete_many(e, "a", ds(&[3, 8])).await);
                done.push(delete_many(e, "a", ds(&[21])).await);
            }
            Scenario::GcWindow => {
                // Mark: stage new candidates and re-stage a staged one (the
                // earliest row must stay).
                done.push(
                    stage(
                        e,
                        vec![
                            cand(&d.k("a", 0), 1, 20),
                            cand(&d.k("a", 1), 2, 10),
                            cand(&d.k("a", 2), 3, 30),
                        ],
                    )
                    .await,
                );
                // Execute: take the due ones, delete them, unstage them.
                let window = e.capabilities().seam.unwrap().window.unwrap();
                let due = window
                    .take_due(Timestamp(15), None, 100)
                    .await
                    .unwrap_or_default();
                let keys: Vec<Key> = due.iter().map(|c| c.key.clone()).collect();
                if !keys.is_empty() {
                    let digests = keys.iter().map(|k| k.digest).collect();
                    done.push(delete_many(e, "a", digests).await);
                    done.push(unstage(e, keys).await);
                }
                done.push(put(e, d.k("a", 9), d.b(9)).await);
                done.push(unstage(e, vec![d.k("a", 2)]).await);
            }
            Scenario::Refs => {
                let da = d.k("a", 0).digest;
                done.push(put(e, d.k("a", 1), d.b(1)).await);
                let db = d.k("a", 1).digest;
                done.push(ref_set(e, "a", "r3", db, RefExpect::Absent).await);
                done.push(ref_set(e, "a", "r1", db, RefExpect::Digest(da)).await);
                done.push(ref_delete(e, "a", "r2").await);
                done.push(ref_set(e, "fresh", "r", da, RefExpect::Any).await);
                done.push(ref_mark(e, "fresh").await);
            }
            Scenario::MigrateNew | Scenario::MigrateV1 => {
                done.push(put(e, d.k("n", 0), d.b(0)).await);
            }
            Scenario::Checkpoint => {
                // ~4 MiB in sequential commits: past the 1000-page
                // auto-checkpoint, so the WAL is checkpointed (and, under
                // NORMAL, synced) mid-run.
                for i in 2..22 {
                    let mut b = d.b(i);
                    b.resize(215_000, i as u8);
                    done.push(put(e, key("a", &b), b).await);
                }
            }
        }
        done
    }
}

fn cand(k: &Key, size: u64, visible_after: i64) -> StagedCandidate {
    StagedCandidate {
        key: k.clone(),
        size,
        visible_after: Timestamp(visible_after),
    }
}

fn has_table(conn: &rusqlite::Connection, name: &str) -> bool {
    conn.query_row(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        == 1
}

/// Reads every row (default VFS), checking integrity and every entry's
/// digest and size.
fn image(path: &Path) -> Image {
    let conn = rusqlite::Connection::open(path).unwrap();
    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok", "integrity_check");
    let mut out = Image::new();
    if has_table(&conn, "entries") {
        let mut stmt = conn
            .prepare("SELECT ns, digest, size, content FROM entries")
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let (n, d, size, content): (String, Vec<u8>, i64, Vec<u8>) = (
                r.get(0).unwrap(),
                r.get(1).unwrap(),
                r.get(2).unwrap(),
                r.get(3).unwrap(),
            );
            let d: [u8; 32] = d.try_into().unwrap();
            assert_eq!(Digest::of(&content).as_bytes(), &d, "entry {n} verifies");
            assert_eq!(size as usize, content.len(), "entry {n} size");
            out.insert(Item::Entry(n, d), content);
        }
    }
    if has_table(&conn, "refs") {
        let mut stmt = conn
            .prepare("SELECT namespace, name, digest FROM refs")
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let (n, name, d): (String, String, Vec<u8>) =
                (r.get(0).unwrap(), r.get(1).unwrap(), r.get(2).unwrap());
            out.insert(Item::Ref(n, name), d);
        }
        let mut stmt = conn
            .prepare("SELECT namespace FROM ref_namespaces")
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            out.insert(Item::RefNamespace(r.get(0).unwrap()), Vec::new());
        }
    }
    if has_table(&conn, "gc_window") {
        let mut stmt = conn
            .prepare("SELECT ns, digest, size, visible_after FROM gc_window")
            .unwrap();
        let mut rows = stmt.query([]).unwrap();
        while let Some(r) = rows.next().unwrap() {
            let (n, d, size, va): (String, Vec<u8>, i64, i64) = (
                r.get(0).unwrap(),
                r.get(1).unwrap(),
                r.get(2).unwrap(),
                r.get(3).unwrap(),
            );
            let d: [u8; 32] = d.try_into().expect("window digests are 32 bytes");
            out.insert(Item::Window(n, d), window_value(size as u64, va));
        }
    }
    out
}

/// Checks `after` against `before` and the operations (see the module
/// docs); `promised`: every acknowledged operation must have survived;
/// `sequential`: the operations were acknowledged one after the other.
fn check(
    before: &Image,
    done: &[Done],
    after: &Image,
    promised: bool,
    sequential: bool,
) -> Result<(), String> {
    let mut items: BTreeSet<&Item> = before.keys().chain(after.keys()).collect();
    for op in done {
        items.extend(op.changes.iter().map(|(i, _)| i));
    }
    // Per operation, the prefix lengths its rows were found at (for the
    // all-or-nothing check): (op index, applied?) per unambiguous row.
    let mut applied: BTreeMap<usize, BTreeSet<bool>> = BTreeMap::new();
    for item in items {
        let ops: Vec<(usize, &Change)> = done
            .iter()
            .enumerate()
            .flat_map(|(i, op)| {
                op.changes
                    .iter()
                    .filter(move |(it, _)| it == item)
                    .map(move |(_, c)| (i, c))
            })
            .collect();
        let mut values = vec![before.get(item).cloned()];
        for (_, c) in &ops {
            let next = c.apply(values.last().unwrap().as_ref());
            values.push(next);
        }
        let must = if promised {
            ops.iter()
                .rposition(|(i, _)| done[*i].acked)
                .map_or(0, |p| p + 1)
        } else {
            0
        };
        let found = after.get(item).cloned();
        let Some(at) = (must..values.len()).find(|&p| values[p] == found) else {
            let what: Vec<_> = ops
                .iter()
                .map(|(i, _)| format!("{} (acked: {})", done[*i].what, done[*i].acked))
                .collect();
            return Err(format!(
                "{item:?}: found {}, expected one of the states after {must}..={} of [{}] \
                 (before: {})",
                describe(&found),
                ops.len(),
                what.join(", "),
                describe(&values[0]),
            ));
        };
        // A row touched by one operation whose change is visible tells
        // whether that operation took effect.
        if ops.len() == 1 && values[0] != values[1] {
            applied.entry(ops[0].0).or_default().insert(at == 1);
        }
    }
    let mut took_effect = BTreeMap::new();
    for (i, seen) in applied {
        if seen.len() > 1 {
            return Err(format!("{} was applied only in part", done[i].what));
        }
        took_effect.insert(i, seen.contains(&true));
    }
    if sequential {
        // Commits are lost only as a suffix (the WAL ends at the first bad
        // frame): an acknowledged operation never disappears while a later
        // one survived.
        let acked: Vec<(usize, bool)> = took_effect
            .iter()
            .filter(|(i, _)| done[**i].acked)
            .map(|(i, t)| (*i, *t))
            .collect();
        for w in acked.windows(2) {
            if let [(lost, false), (kept, true)] = w {
                return Err(format!(
                    "{} was lost but the later {} survived",
                    done[*lost].what, done[*kept].what
                ));
            }
        }
    }
    Ok(())
}

fn describe(v: &Option<Vec<u8>>) -> String {
    match v {
        None => "absent".into(),
        Some(b) => format!("{} bytes", b.len()),
    }
}

/// Runs `scenario` once, crashing at point `crash_at` (`None`: never);
/// returns the labels of the durability points the run reported.
async fn run_once(
    scenario: Scenario,
    durability: Durability,
    seed: u64,
    crash_at: Option<u64>,
    loss: Loss,
    second: Option<u64>,
) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sqlite");
    let switch = CrashSwitch::new();
    let model = CrashModel::new(switch.clone()).unwrap();
    let opts = SqliteOptions {
        durability,
        readers: 2,
        vfs: Some(model.vfs_name().into()),
        ..SqliteOptions::default()
    };
    let data = Data::new(seed);
    scenario.setup(&path, &opts, &data).await;
    // The setup's files are the durable start (a clean close synced them).
    model.restore(Loss::ProcessCrash).unwrap();
    let before = image(&path);

    switch.reset();
    if let Some(n) = crash_at {
        switch.arm(n);
    }
    let done = match SqliteEngine::open(&path, opts.clone()).await {
        Ok(e) => {
            let lock = e.lock_instance().await.unwrap();
            let done = scenario.run(&e, &data).await;
            // The clean close (checkpoint) is part of the run: it has
            // durability points too.
            drop(e);
            drop(lock);
            done
        }
        Err(_) => {
            assert!(switch.crashed(), "open failed without a crash");
            Vec::new()
        }
    };
    // The writer thread closes its connection after the last handle is
    // gone: wait for it, so the close's points are counted.
    model.wait_closed(Duration::from_secs(30)).unwrap();
    let points = switch.points();
    let trace = switch.trace();
    let report = model.restore(loss).unwrap();
    switch.reset();

    let context = format!(
        "{scenario:?} {durability:?} seed {seed} crash at {crash_at:?}/{points} ({trace:?}) \
         {loss:?}: restored {report}"
    );
    let mut done = done;
    let mut second_points = 0;
    if let Some(m) = second {
        // A second crash, during the first reopen: its recovery, a put and
        // its close (`m == 0`: none, to count the points). That put is one
        // more unacknowledged-or-not operation of the run.
        switch.arm(m);
        let through_model = SqliteOptions {
            vfs: Some(model.vfs_name().into()),
            ..opts.clone()
        };
        if let Ok(e) = SqliteEngine::open(&path, through_model).await {
            let b = b"during the reopen".to_vec();
            let mut op = put(&e, key("second", &b), b).await;
            // Whether acknowledged or not, the second power loss may lose
            // it under NORMAL; under FULL an acknowledged one must stay.
            op.acked &= durability == Durability::Full;
            done.push(op);
            drop(e);
        }
        model.wait_closed(Duration::from_secs(30)).unwrap();
        second_points = switch.points();
        model
            .restore(Loss::PowerLoss {
                seed: seed ^ m.rotate_left(17),
            })
            .unwrap_or_else(|err| panic!("{context}: second restore: {err}"));
        switch.reset();
    }
    let context = format!("{context}; second crash at {second:?}/{second_points}");
    let reopen = SqliteOptions {
        vfs: if crash_at.unwrap_or(0).is_multiple_of(2) {
            None
        } else {
            Some(model.vfs_name().into())
        },
        ..opts
    };
    let e = SqliteEngine::open(&path, reopen)
        .await
        .unwrap_or_else(|err| panic!("{context}: reopen failed: {err}"));
    assert_eq!(
        e.schema_version().await.unwrap(),
        SCHEMA_VERSION,
        "{context}"
    );
    let lock = e
        .lock_instance()
        .await
        .unwrap_or_else(|err| panic!("{context}: instance lock: {err}"));
    // The reopened engine writes.
    let probe = b"after the crash".to_vec();
    e.put(&key("probe", &probe), Bytes::from(probe.clone()))
        .await
        .unwrap_or_else(|err| panic!("{context}: put after reopen: {err}"));
    drop(e);
    drop(lock);
    model.wait_closed(Duration::from_secs(30)).unwrap();
    let mut after = image(&path);
    assert_eq!(
        after.remove(&Item::Entry("probe".into(), *Digest::of(&probe).as_bytes())),
        Some(probe),
        "{context}"
    );
    let promised = durability == Durability::Full || loss == Loss::ProcessCrash;
    if let Err(e) = check(&before, &done, &after, promised, scenario.sequential()) {
        panic!("{context}: {e}");
    }
    if crash_at.is_none() && second.is_none() {
        assert!(
            done.iter().all(|d| d.acked),
            "{context}: uncrashed run failed"
        );
    }
    Run {
        trace,
        second_points,
    }
}

/// What [`run_once`] counted.
struct Run {
    /// The labels of the crashed run's durability points.
    trace: Vec<&'static str>,
    /// The points of the second life (with a second crash).
    second_points: u64,
}

/// Counts the points of `scenario`, then crashes at each of them, for
/// every seed and both kinds of loss.
async fn crash_at_every_point(scenario: Scenario, durability: Durability) {
    let mut total = 0;
    for seed in 0..seeds() {
        let trace = run_once(scenario, durability, seed, None, Loss::ProcessCrash, None)
            .await
            .trace;
        let points = trace.len() as u64;
        if seed == 0 {
            eprintln!("{scenario:?} {durability:?}: {points} points {trace:?}");
        }
        // Concurrent puts may batch differently from run to run; one more
        // point covers a run that reports more.
        for n in 1..=points + 1 {
            for loss in [
                Loss::ProcessCrash,
                Loss::PowerLoss {
                    seed: seed.wrapping_mul(1_000_003).wrapping_add(n),
                },
            ] {
                run_once(scenario, durability, seed, Some(n), loss, None).await;
                total += 1;
            }
        }
    }
    eprintln!("{scenario:?} {durability:?}: {total} crashes checked");
    assert!(total > 0);
}

/// A crash during the recovery of a crash: for every point `n` of the
/// scenario and every point `m` of the first reopen (recovery, a put, the
/// close), power is lost twice; nothing the first crash kept may go.
async fn crash_twice(scenario: Scenario, durability: Durability) {
    let seed = 0;
    let first = run_once(scenario, durability, seed, None, Loss::ProcessCrash, None).await;
    let mut total = 0;
    for n in 1..=first.trace.len() as u64 {
        let loss = Loss::PowerLoss { seed: n };
        let count = run_once(scenario, durability, seed, Some(n), loss, Some(0)).await;
        for m in 1..=count.second_points + 1 {
            run_once(scenario, durability, seed, Some(n), loss, Some(m)).await;
            total += 1;
        }
    }
    eprintln!("{scenario:?} {durability:?}: {total} double crashes checked");
    assert!(total > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_recovery_full() {
    crash_twice(Scenario::GcWindow, Durability::Full).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_recovery_normal() {
    crash_twice(Scenario::Checkpoint, Durability::Normal).await;
}

macro_rules! crash_tests {
    ($($name:ident: $scenario:ident, $durability:ident;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            crash_at_every_point(Scenario::$scenario, Durability::$durability).await;
        }
    )*};
}

crash_tests! {
    group_commit_puts_full: GroupCommitPuts, Full;
    group_commit_puts_normal: GroupCommitPuts, Normal;
    dedup_put_full: DedupPut, Full;
    dedup_put_normal: DedupPut, Normal;
    delete_many_full: DeleteMany, Full;
    delete_many_normal: DeleteMany, Normal;
    gc_window_full: GcWindow, Full;
    gc_window_normal: GcWindow, Normal;
    refs_full: Refs, Full;
    refs_normal: Refs, Normal;
    migrate_new_file_full: MigrateNew, Full;
    migrate_new_file_normal: MigrateNew, Normal;
    migrate_v1_file_full: MigrateV1, Full;
    migrate_v1_file_normal: MigrateV1, Normal;
    checkpoint_full: Checkpoint, Full;
    checkpoint_normal: Checkpoint, Normal;
}

/// The model itself: an acknowledged FULL put survives a power loss; an
/// unsynced NORMAL one can be lost — so the model does drop unsynced
/// writes (a model that kept everything would pass every test above).
#[tokio::test]
async fn the_model_loses_unsynced_commits_and_keeps_synced_ones() {
    let mut lost_some = false;
    for (durability, seed) in [(Durability::Full, 1), (Durability::Normal, 1)] {
        for power in 0..8 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("kv.sqlite");
            let model = CrashModel::new(CrashSwitch::new()).unwrap();
            let opts = SqliteOptions {
                durability,
                readers: 1,
                vfs: Some(model.vfs_name().into()),
                ..SqliteOptions::default()
            };
            let e = SqliteEngine::open(&path, opts.clone()).await.unwrap();
            let data = Data::new(seed);
            assert!(put(&e, data.k("a", 0), data.b(0)).await.acked);
            // Crash before the clean close could checkpoint.
            model.switch().crash_now();
            drop(e);
            model.restore(Loss::PowerLoss { seed: power }).unwrap();
            let after = image(&path);
            let present =
                after.contains_key(&Item::Entry("a".into(), *data.k("a", 0).digest.as_bytes()));
            match durability {
                Durability::Full => assert!(present, "a FULL commit is synced"),
                Durability::Normal => lost_some |= !present,
            }
        }
    }
    assert!(
        lost_some,
        "power loss never dropped an unsynced NORMAL commit"
    );
}

/// Regression (found by the crash model, `gc_window_full` at point 3): a
/// COMMIT whose WAL fsync fails leaves its frames in the WAL, invisible to
/// the process but replayed by the next open. A later write that changed
/// nothing (here a delete of the put's key) used to be acknowledged, and
/// the restart then contradicted it. The writer now refuses every write
/// after a commit failed with an I/O error, until the engine is reopened.
#[tokio::test]
async fn after_a_commit_fails_with_an_io_error_no_write_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.sqlite");
    let switch = CrashSwitch::new();
    let model = CrashModel::new(switch.clone()).unwrap();
    let opts = SqliteOptions {
        readers: 1,
        vfs: Some(model.vfs_name().into()),
        ..SqliteOptions::default()
    };
    let e = SqliteEngine::open(&path, opts.clone()).await.unwrap();
    let (a, b) = (b"a".to_vec(), b"b".to_vec());
    e.put(&key("n", &a), Bytes::from(a.clone())).await.unwrap();
    // The next commit's WAL sync fails.
    switch.arm(switch.points() + 1);
    assert!(e.put(&key("n", &b), Bytes::from(b.clone())).await.is_err());
    assert!(switch.crashed());
    // `b` is invisible here, so this delete would change nothing...
    assert_eq!(e.meta(&key("n", &b)).await.unwrap(), None);
    let deleted = e.delete_many(&ns("n"), &[key("n", &b).digest]).await;
    assert!(
        deleted.is_err(),
        "acknowledged after a failed commit: {deleted:?}"
    );
    // ... and every later write is refused; reads keep working.
    assert!(e.put(&key("n", &a), Bytes::from(a.clone())).await.is_err());
    assert!(e.meta(&key("n", &a)).await.unwrap().is_some());
    drop(e);
    model.restore(Loss::ProcessCrash).unwrap();
    switch.reset();
    // ... because the restart replays the failed commit: `b` is there.
    let e = SqliteEngine::open(&path, opts).await.unwrap();
    assert!(e.meta(&key("n", &b)).await.unwrap().is_some());
    e.put(&key("n", &b"c"[..]), Bytes::from_static(b"c"))
        .await
        .unwrap();
}
