//! Crash consistency of the local engine on its crash model (issue 14,
//! ADR-029 "Local files").
//!
//! Each scenario runs once to count its durability points, then once per
//! point `n` with the switch armed to crash there (and once more crashing
//! after it has finished): the root is rebuilt from the model's durable
//! image, the engine is opened again on it (its stage cleanup runs), and
//! the invariants are checked:
//!
//! - an acknowledged publish (`Inserted` or `AlreadyPresent`) is present,
//!   complete, and its bytes hash to its digest;
//! - a publish that had not returned is absent or complete, never partial;
//! - an acknowledged delete is durable; one that had not returned left the
//!   entry absent or intact;
//! - nothing is visible through `has`, `meta`, `read` or `scan` that is not
//!   one of these, and every listed entry verifies;
//! - no stage file is left after open, and `maintain` finds none;
//! - the reopened engine takes new puts.
//!
//! Seeded: the seed picks the blobs, their chunking, and how the model
//! restores unsynced tails. `cargo test` runs a few seeds;
//! `BLOBPOOL_CRASH_SEEDS=N` (set by `cargo xtask soak`) runs `N`.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use bytes::Bytes;
use store_local::crash::CrashModel;
use store_local::{LocalEngine, LocalOptions};
use store_types::crash::CrashSwitch;
use store_types::EngineExt as _;
use store_types::{Digest, Engine, Key, LargeEngine, Namespace, PublishOutcome, Timestamp};
use tokio::io::AsyncReadExt;

/// Seeds run by default (each covers every durability point).
const DEFAULT_SEEDS: u64 = 4;

fn seeds() -> u64 {
    std::env::var("BLOBPOOL_CRASH_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEEDS)
}

/// A scratch directory, on tmpfs where there is one: the model, not the
/// disk, decides what is durable, so real fsyncs only cost time.
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

fn ns(name: &str) -> Namespace {
    Namespace::new(name).unwrap()
}

/// A small reproducible generator for the scenarios' choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A blob: empty, tiny, one chunk, or several write batches.
    fn blob(&mut self) -> Vec<u8> {
        let len = match self.below(5) {
            0 => 0,
            1 => 1 + self.below(64),
            2 => 1_000 + self.below(60_000),
            3 => 200_000 + self.below(150_000),
            _ => 300 + self.below(3_000),
        } as usize;
        let salt = self.next();
        (0..len)
            .map(|i| ((i as u64).wrapping_mul(2_654_435_761) ^ salt).to_le_bytes()[2])
            .collect()
    }

    /// Chunk sizes for a put.
    fn chunks(&mut self) -> Vec<usize> {
        (0..3)
            .map(|_| match self.below(3) {
                0 => 1 + self.below(100) as usize,
                1 => 4_096 + self.below(60_000) as usize,
                _ => 256 * 1024,
            })
            .collect()
    }
}

/// What the reopened engine must show for a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Present, complete and verifying (acknowledged).
    Present,
    /// Absent, or present and complete (an operation did not return).
    Either,
    /// Absent (never stored, or an acknowledged delete).
    Absent,
    /// Planted damage under the entry's name that no acknowledged publish
    /// has replaced yet: not checked.
    Damaged,
}

/// The scenario's record of what it did and what was acknowledged.
struct World {
    switch: CrashSwitch,
    content: BTreeMap<Key, Vec<u8>>,
    expect: BTreeMap<Key, Expect>,
    /// Errors are allowed only once the switch has crashed.
    log: Vec<String>,
}

impl World {
    fn new(switch: CrashSwitch) -> Self {
        World {
            switch,
            content: BTreeMap::new(),
            expect: BTreeMap::new(),
            log: Vec::new(),
        }
    }

    fn key(&mut self, ns_name: &str, data: &[u8]) -> Key {
        let key = Key::new(ns(ns_name), Digest::of(data));
        self.content.insert(key.clone(), data.to_vec());
        self.expect.entry(key.clone()).or_insert(Expect::Absent);
        key
    }

    /// An operation failed: only a crash may make it.
    fn failed(&mut self, what: &str, e: store_types::Error) {
        assert!(
            self.switch.crashed(),
            "{what} failed without a crash: {e} (log: {:?})",
            self.log
        );
        self.log.push(format!("{what}: {e}"));
    }

    /// Puts `data` in `chunks` (cycled), updating the expectations.
    async fn put(&mut self, engine: &LocalEngine, ns_name: &str, data: &[u8], chunks: &[usize]) {
        let key = self.key(ns_name, data);
        let before = self.expect[&key];
        if matches!(before, Expect::Absent) {
            self.expect.insert(key.clone(), Expect::Either);
        }
        match put_chunked(engine, &key, data, chunks).await {
            Ok(outcome) => {
                if before == Expect::Present {
                    assert_eq!(outcome, PublishOutcome::AlreadyPresent, "{key}");
                }
                self.log.push(format!("put {key}: {outcome:?}"));
                self.expect.insert(key, Expect::Present);
            }
            Err(e) => self.failed(&format!("put {key}"), e),
        }
    }

    /// Deletes `keys` of one namespace in one call.
    async fn delete(&mut self, engine: &LocalEngine, keys: &[Key]) {
        for k in keys {
            if self.expect[k] == Expect::Present {
                self.expect.insert(k.clone(), Expect::Either);
            }
        }
        let digests: Vec<_> = keys.iter().map(|k| k.digest).collect();
        match engine.delete_many(&keys[0].namespace, &digests).await {
            Ok(freed) => {
                self.log.push(format!("delete {keys:?}: {freed:?}"));
                for k in keys {
                    self.expect.insert(k.clone(), Expect::Absent);
                }
            }
            Err(e) => self.failed("delete", e),
        }
    }
}

async fn put_chunked(
    engine: &LocalEngine,
    key: &Key,
    data: &[u8],
    chunks: &[usize],
) -> store_types::Result<PublishOutcome> {
    let mut stage = engine.stage(&key.namespace).await?;
    let mut rest = data;
    for size in chunks.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let n = (*size).min(rest.len());
        stage.write(Bytes::copy_from_slice(&rest[..n])).await?;
        rest = &rest[n..];
    }
    // As the facade does for every large put (ADR-032).
    stage.set_outboard(outboard_of(data)).await?;
    stage.publish(key).await
}

/// The entry's outboard, as the facade computes it.
fn outboard_of(data: &[u8]) -> Bytes {
    store_types::outboard::compute(data).1
}

async fn read_all(engine: &LocalEngine, key: &Key) -> Option<Vec<u8>> {
    let blob = engine.read_whole(key).await.unwrap()?;
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
        "{key}: reader yields its length"
    );
    Some(out)
}

/// Checks the invariants of the module docs on the reopened `engine`.
async fn check(engine: &LocalEngine, world: &World, context: &str) {
    assert_eq!(
        engine.stage_file_count().unwrap(),
        0,
        "{context}: stage files"
    );
    assert_eq!(
        engine.maintain(Timestamp(0)).await.unwrap(),
        0,
        "{context}: maintain"
    );
    for (key, expect) in &world.expect {
        let data = &world.content[key];
        let has = engine
            .has_many(&key.namespace, &[key.digest])
            .await
            .unwrap()[0];
        let meta = engine.meta(key).await.unwrap();
        let read = read_all(engine, key).await;
        let complete = has
            && meta.as_ref().is_some_and(|m| m.size == data.len() as u64)
            && read
                .as_ref()
                .is_some_and(|r| r == data && Digest::of(r) == key.digest);
        // A visible entry has its outboard, exactly (a crash between the
        // outboard's publish and the entry's leaves no visible entry).
        let outboard = engine.read_outboard(key).await.unwrap();
        let complete = complete && outboard.as_deref() == Some(&outboard_of(data)[..]);
        let absent = !has && meta.is_none() && read.is_none();
        let ok = match expect {
            Expect::Present => complete,
            Expect::Either => complete || absent,
            Expect::Absent => absent,
            Expect::Damaged => true,
        };
        assert!(
            ok,
            "{context}: {key} expected {expect:?}, has {has}, meta {meta:?}, read {:?} of {} \
             bytes (log: {:?})",
            read.as_ref().map(Vec::len),
            data.len(),
            world.log
        );
    }
    for namespace in engine.namespaces().await.unwrap() {
        for (digest, size) in engine.scan(&namespace, None, usize::MAX).await.unwrap() {
            let key = Key::new(namespace.clone(), digest);
            let expect = world.expect.get(&key).copied();
            assert!(
                matches!(
                    expect,
                    Some(Expect::Present | Expect::Either | Expect::Damaged)
                ),
                "{context}: scan lists {key} ({size} bytes), expected {expect:?}"
            );
            if expect != Some(Expect::Damaged) {
                let read = read_all(engine, &key).await.expect("listed entry reads");
                assert_eq!(
                    engine.read_outboard(&key).await.unwrap().as_deref(),
                    Some(&outboard_of(&read)[..]),
                    "{context}: {key} is listed with its outboard"
                );
                assert_eq!(Digest::of(&read), digest, "{context}: {key} verifies");
                assert_eq!(read.len() as u64, size, "{context}: {key} listed size");
            }
        }
    }
    // The reopened engine takes new puts (also into restored directories).
    let fresh = format!("fresh after {context}").into_bytes();
    let key = Key::new(ns("a"), Digest::of(&fresh));
    put_chunked(engine, &key, &fresh, &[7]).await.unwrap();
    assert_eq!(read_all(engine, &key).await.unwrap(), fresh);
}

/// A crash scenario: a setup on a plain engine (durable before the model
/// starts) and a run on the engine watched by the model.
trait Scenario {
    /// The engine's root under the test's directory `dir`, and whether the
    /// model watches `dir` (the root's creation is then part of the image)
    /// rather than the root.
    fn root(&self, dir: &Path) -> (std::path::PathBuf, bool) {
        (dir.join("root"), false)
    }
    /// Prepares `root` before the model attaches.
    async fn setup(&self, root: &Path, world: &mut World, rng: &mut Rng);
    /// The operations whose every durability point is crashed at.
    async fn run(&self, engine: &LocalEngine, world: &mut World, rng: &mut Rng);
}

/// One life up to the crash (or the end), then the restore, reopen and
/// check. Returns the durability points seen.
async fn life<S: Scenario>(scenario: &S, seed: u64, crash_at: Option<u64>) -> u64 {
    let dir = scratch();
    let (root, watch_dir) = scenario.root(dir.path());
    let switch = CrashSwitch::new();
    let mut world = World::new(switch.clone());
    let mut rng = Rng(seed);
    scenario.setup(&root, &mut world, &mut rng).await;
    let mut model = CrashModel::with_seed(switch.clone(), seed ^ crash_at.unwrap_or(0));
    if watch_dir {
        model = model.watching(dir.path());
    }
    if let Some(n) = crash_at {
        switch.arm(n);
    }
    match LocalEngine::open_with_crash_model(&root, LocalOptions::default(), &model).await {
        Ok(engine) => scenario.run(&engine, &mut world, &mut rng).await,
        Err(e) => world.failed("open", e),
    }
    let points = switch.points();
    let trace = switch.trace();
    if crash_at.is_none() {
        assert!(!switch.crashed());
    }
    let (_, report) = model.crash_and_restore().unwrap();
    switch.reset();
    let context = format!(
        "seed {seed}, crash at {crash_at:?} of {points} ({:?}), restored {report:?}",
        crash_at.and_then(|n| trace.get(n as usize - 1))
    );
    let engine = LocalEngine::open(&root, LocalOptions::default())
        .await
        .unwrap();
    check(&engine, &world, &context).await;
    points
}

/// Runs `scenario` for every seed and every durability point.
async fn crash_everywhere<S: Scenario>(scenario: S) {
    for seed in 0..seeds() {
        let points = life(&scenario, seed, None).await;
        assert!(points > 0, "seed {seed}: no durability point");
        for n in 1..=points {
            life(&scenario, seed, Some(n)).await;
        }
    }
}

/// A crash, then a crash during the recovery: the open that sweeps the
/// first crash's leftovers (stage files, stage names of published
/// entries) and the next put are crashed at each of their points, and
/// what the second restore leaves must still hold the first life's
/// acknowledged puts.
#[tokio::test]
async fn recovery_survives_a_crash_at_every_point_of_its_own() {
    // Each seed costs points² lives: a quarter of the seeds.
    for seed in 0..seeds().div_ceil(4) {
        let first_points = life(&Puts, seed, None).await;
        for first in 1..=first_points {
            let points = two_lives(seed, first, None).await;
            for second in 1..=points {
                two_lives(seed, first, Some(second)).await;
            }
        }
    }
}

/// The `Puts` scenario crashed at `first`; then a recovery life (open and
/// one put) crashed at `second`, if given; then the checks. Returns the
/// recovery life's durability points.
async fn two_lives(seed: u64, first: u64, second: Option<u64>) -> u64 {
    let dir = scratch();
    let (root, _) = Puts.root(dir.path());
    let switch = CrashSwitch::new();
    let mut world = World::new(switch.clone());
    let mut rng = Rng(seed);
    Puts.setup(&root, &mut world, &mut rng).await;
    let model = CrashModel::with_seed(switch.clone(), seed);
    switch.arm(first);
    match LocalEngine::open_with_crash_model(&root, LocalOptions::default(), &model).await {
        Ok(engine) => Puts.run(&engine, &mut world, &mut rng).await,
        Err(e) => world.failed("open", e),
    }
    model.crash_and_restore().unwrap();
    switch.reset();
    let model = CrashModel::with_seed(switch.clone(), seed ^ 0xface);
    if let Some(n) = second {
        switch.arm(n);
    }
    match LocalEngine::open_with_crash_model(&root, LocalOptions::default(), &model).await {
        Ok(engine) => {
            let (data, chunks) = (rng.blob(), rng.chunks());
            world.put(&engine, "a", &data, &chunks).await;
        }
        Err(e) => world.failed("recovery open", e),
    }
    let points = switch.points();
    let (_, report) = model.crash_and_restore().unwrap();
    switch.reset();
    let engine = LocalEngine::open(&root, LocalOptions::default())
        .await
        .unwrap();
    let context = format!(
        "seed {seed}, crash at {first}, then at {second:?} of {points}, restored {report:?}"
    );
    check(&engine, &world, &context).await;
    points
}

/// Opens a plain engine on `root` for a scenario's setup.
async fn plain(root: &Path) -> LocalEngine {
    LocalEngine::open(root, LocalOptions::default())
        .await
        .unwrap()
}

/// Puts into new and existing namespaces and fan-out directories.
struct Puts;

impl Scenario for Puts {
    async fn setup(&self, root: &Path, _: &mut World, _: &mut Rng) {
        fs::create_dir_all(root).unwrap();
    }

    async fn run(&self, engine: &LocalEngine, world: &mut World, rng: &mut Rng) {
        for _ in 0..4 {
            let (data, chunks) = (rng.blob(), rng.chunks());
            let ns_name = ["a", "b"][rng.below(2) as usize];
            world.put(engine, ns_name, &data, &chunks).await;
        }
    }
}

#[tokio::test]
async fn puts_survive_a_crash_at_every_durability_point() {
    crash_everywhere(Puts).await;
}

/// Puts into a root the open creates, with parents it creates too: their
/// names must be made durable as well (finding 1 of ADR-029).
struct PutsIntoNewRoot;

impl Scenario for PutsIntoNewRoot {
    fn root(&self, dir: &Path) -> (std::path::PathBuf, bool) {
        (dir.join("x").join("y").join("root"), true)
    }

    async fn setup(&self, _: &Path, _: &mut World, _: &mut Rng) {}

    async fn run(&self, engine: &LocalEngine, world: &mut World, rng: &mut Rng) {
        Puts.run(engine, world, rng).await;
    }
}

#[tokio::test]
async fn a_new_root_and_its_new_parents_survive_a_crash_at_every_durability_point() {
    crash_everywhere(PutsIntoNewRoot).await;
}

/// Publishes of keys already present (durable from before, and just put),
/// and a publish over a truncated file under the entry's name.
struct Dedup;

impl Scenario for Dedup {
    async fn setup(&self, root: &Path, world: &mut World, rng: &mut Rng) {
        let engine = plain(root).await;
        let old = rng.blob();
        world.put(&engine, "a", &old, &[4096]).await;
        // A damaged file under an entry's name (a torn copy from outside).
        let mut damaged = rng.blob();
        damaged.extend_from_slice(b"at least two bytes");
        let key = world.key("a", &damaged);
        let path = root
            .join("a")
            .join(key.digest.prefix2())
            .join(key.digest.to_hex());
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, &damaged[..damaged.len() / 2]).unwrap();
        world.expect.insert(key, Expect::Damaged);
    }

    async fn run(&self, engine: &LocalEngine, world: &mut World, rng: &mut Rng) {
        let keys: Vec<_> = world
            .content
            .iter()
            .map(|(k, d)| (k.clone(), d.clone()))
            .collect();
        for (key, data) in &keys {
            world
                .put(engine, key.namespace.as_str(), data, &[1000])
                .await;
        }
        let new = rng.blob();
        world.put(engine, "b", &new, &rng.chunks()).await;
        world.put(engine, "b", &new, &rng.chunks()).await;
    }
}

#[tokio::test]
async fn deduplicated_and_replacing_publishes_survive_a_crash_at_every_durability_point() {
    crash_everywhere(Dedup).await;
}

/// Puts of multi-group entries, whose outboards are several groups' worth
/// of hashes: at every crash point — in particular between the outboard's
/// publish and the entry's — the check finds the entry absent, or present
/// with exactly its outboard (never present without it).
struct Outboards;

impl Scenario for Outboards {
    async fn setup(&self, _: &Path, _: &mut World, _: &mut Rng) {}

    async fn run(&self, engine: &LocalEngine, world: &mut World, rng: &mut Rng) {
        for len in [3 * 16_384 + 1, 200_000] {
            let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            world.put(engine, "o", &data, &rng.chunks()).await;
        }
    }
}

#[tokio::test]
async fn a_crash_between_outboard_and_entry_publish_leaves_no_visible_entry() {
    crash_everywhere(Outboards).await;
}

/// Deletes of durable entries, of a just-put one, and of absent keys.
struct Deletes;

impl Scenario for Deletes {
    async fn setup(&self, root: &Path, world: &mut World, rng: &mut Rng) {
        let engine = plain(root).await;
        for (i, ns_name) in ["a", "a", "a", "b"].into_iter().enumerate() {
            let (mut data, chunks) = (rng.blob(), rng.chunks());
            data.push(i as u8); // Distinct keys.
            world.put(&engine, ns_name, &data, &chunks).await;
        }
    }

    async fn run(&self, engine: &LocalEngine, world: &mut World, rng: &mut Rng) {
        let a: Vec<_> = world
            .expect
            .keys()
            .filter(|k| k.namespace.as_str() == "a")
            .cloned()
            .collect();
        let b: Vec<_> = world
            .expect
            .keys()
            .filter(|k| k.namespace.as_str() == "b")
            .cloned()
            .collect();
        let never = world.key("a", b"never stored");
        world
            .delete(engine, &[a[0].clone(), a[1].clone(), never])
            .await;
        let new = rng.blob();
        world.put(engine, "b", &new, &rng.chunks()).await;
        let new_key = Key::new(ns("b"), Digest::of(&new));
        world.delete(engine, &[b[0].clone()]).await;
        world.delete(engine, &[new_key]).await;
        // Put back a deleted entry.
        let back = world.content[&a[0]].clone();
        world.put(engine, "a", &back, &[333]).await;
    }
}

#[tokio::test]
async fn deletes_survive_a_crash_at_every_durability_point() {
    crash_everywhere(Deletes).await;
}

/// Orphan stages from an earlier crash (removed at open) and from puts
/// dying while the engine runs (removed by `maintain`), next to a live
/// stage that must be kept and then published.
struct Maintain;

fn plant_orphan(root: &Path, name: &str) {
    fs::write(root.join(".stage").join(name), b"half a put").unwrap();
}

impl Scenario for Maintain {
    async fn setup(&self, root: &Path, world: &mut World, rng: &mut Rng) {
        let engine = plain(root).await;
        let data = rng.blob();
        world.put(&engine, "a", &data, &[512]).await;
        drop(engine);
        plant_orphan(root, "1-0000000000000000-0.stage");
        plant_orphan(root, "1-0000000000000000-1.stage.link");
    }

    async fn run(&self, engine: &LocalEngine, world: &mut World, rng: &mut Rng) {
        let mut live_data = rng.blob();
        live_data.extend_from_slice(b"live"); // Not the setup's key.
        let live_key = world.key("a", &live_data);
        world.expect.insert(live_key.clone(), Expect::Either);
        let mut live = match engine.stage(&live_key.namespace).await {
            Ok(s) => s,
            Err(e) => return world.failed("stage", e),
        };
        if let Err(e) = live.write(Bytes::from(live_data.clone())).await {
            return world.failed("write", e);
        }
        plant_orphan(engine.root(), "2-0000000000000000-0.stage");
        plant_orphan(engine.root(), "2-0000000000000000-1.stage");
        match engine.maintain(Timestamp(0)).await {
            Ok(removed) => assert!(world.switch.crashed() || removed == 2, "{removed}"),
            Err(e) => world.failed("maintain", e),
        }
        if let Err(e) = live.set_outboard(outboard_of(&live_data)).await {
            return world.failed("set outboard", e);
        }
        match live.publish(&live_key).await {
            Ok(_) => {
                world.expect.insert(live_key, Expect::Present);
            }
            Err(e) => world.failed("publish live stage", e),
        }
        let (data, chunks) = (rng.blob(), rng.chunks());
        world.put(engine, "b", &data, &chunks).await;
    }
}

#[tokio::test]
async fn orphan_stages_are_cleaned_whatever_the_crash_point() {
    crash_everywhere(Maintain).await;
}

/// The model is not vacuous: with `fsync: false` nothing is made durable,
/// so an acknowledged put does not survive the crash (the documented
/// trade of that setting), and its stage leaves nothing behind.
#[tokio::test]
async fn without_fsync_an_acknowledged_put_is_lost() {
    let dir = scratch();
    let root = dir.path().join("root");
    fs::create_dir_all(&root).unwrap();
    let switch = CrashSwitch::new();
    let model = CrashModel::new(switch.clone());
    let options = LocalOptions {
        fsync: false,
        ..LocalOptions::default()
    };
    let engine = LocalEngine::open_with_crash_model(&root, options, &model)
        .await
        .unwrap();
    let data = b"acknowledged but never fsynced".to_vec();
    let key = Key::new(ns("a"), Digest::of(&data));
    assert_eq!(
        put_chunked(&engine, &key, &data, &[5]).await.unwrap(),
        PublishOutcome::Inserted
    );
    assert_eq!(switch.points(), 0);
    drop(engine);
    let (root, report) = model.crash_and_restore().unwrap();
    assert!(report.names_dropped > 0, "{report:?}");
    switch.reset();
    let engine = LocalEngine::open(&root, LocalOptions::default())
        .await
        .unwrap();
    assert!(engine.meta(&key).await.unwrap().is_none());
    assert_eq!(engine.stage_file_count().unwrap(), 0);
}

/// After a crash every call of the dead engine fails and changes nothing.
#[tokio::test]
async fn the_dead_engine_fails_and_changes_nothing() {
    let dir = scratch();
    let switch = CrashSwitch::new();
    let model = CrashModel::new(switch.clone());
    let engine = LocalEngine::open_with_crash_model(dir.path(), LocalOptions::default(), &model)
        .await
        .unwrap();
    let data = b"durable".to_vec();
    let key = Key::new(ns("a"), Digest::of(&data));
    put_chunked(&engine, &key, &data, &[3]).await.unwrap();
    switch.crash_now();
    let err = put_chunked(&engine, &Key::new(ns("a"), Digest::of(b"x")), b"x", &[1])
        .await
        .unwrap_err();
    assert!(
        store_types::Report::new(&err).to_string().contains("crash"),
        "{err}"
    );
    assert!(engine
        .delete_many(&key.namespace, &[key.digest])
        .await
        .is_err());
    assert!(
        engine.meta(&key).await.unwrap().is_some(),
        "reads still work"
    );
    drop(engine);
    model.crash_and_restore().unwrap();
    switch.reset();
    let engine = LocalEngine::open(dir.path(), LocalOptions::default())
        .await
        .unwrap();
    assert_eq!(read_all(&engine, &key).await.unwrap(), data);
}

/// Another process on this machine has unlinked an entry but not yet
/// fsynced its directory; a delete that then finds the entry gone and
/// returns must still leave it durably gone (finding 2 of ADR-029), as an
/// `AlreadyPresent` publish makes the name it found durable.
#[tokio::test]
async fn a_delete_that_finds_the_entry_just_unlinked_is_durable() {
    let dir = scratch();
    let switch = CrashSwitch::new();
    let model = CrashModel::new(switch.clone());
    let engine = LocalEngine::open_with_crash_model(dir.path(), LocalOptions::default(), &model)
        .await
        .unwrap();
    let data = b"deleted twice".to_vec();
    let key = Key::new(ns("a"), Digest::of(&data));
    put_chunked(&engine, &key, &data, &[4]).await.unwrap();
    let path = engine
        .root()
        .join("a")
        .join(key.digest.prefix2())
        .join(key.digest.to_hex());
    fs::remove_file(&path).unwrap(); // The other process's unlink.
    assert_eq!(
        engine
            .delete_many(&key.namespace, &[key.digest])
            .await
            .unwrap(),
        vec![None]
    );
    drop(engine);
    model.crash_and_restore().unwrap();
    switch.reset();
    let engine = LocalEngine::open(dir.path(), LocalOptions::default())
        .await
        .unwrap();
    assert!(
        engine.meta(&key).await.unwrap().is_none(),
        "the acknowledged delete was undone"
    );
}
