//! Crash consistency of the whole store (issue 14, ADR-029 "The facade"):
//! a `Store` (dual tier) with its kv tier on SQLite's crash model and its
//! large tier on the local engine's crash model, both reporting to one
//! [`CrashSwitch`], so a crash at durability point `n` stops both tiers at
//! the same instant, as a machine losing power would.
//!
//! Each scenario runs once to count its durability points, then once per
//! point `n` (and `n + 1`: no crash) from fresh files and the same seeded
//! data, crashed at `n`. The store is dropped, SQLite's files are restored
//! as a power loss leaves them (seeded), the local root as its model's
//! durable image (seeded tails), the switch is reset, and a new store is
//! built over the same files without the models. Scenarios:
//!
//! - **put**: small (kv) and large puts, new and deduplicated, one at a
//!   time and concurrently;
//! - **publish**: puts, each followed by a reference set through
//!   [`Store::refs`] (references live in SQLite);
//! - **sweep**: a `Refs` namespace holding referenced and unreferenced
//!   small and large entries (prepared once and copied for each life):
//!   a sweep (mark), a reference set on a staged entry, a deduplicated put
//!   of another staged entry (its receipt held), a new large put, the
//!   clock moved past the window, a sweep (execute: deletes and two
//!   rescues; the new entry is kept).
//!
//! After the reopen:
//!
//! - every acknowledged put reads back verified (unless the scenario's own
//!   sweep could delete it); an unacknowledged one is absent or complete;
//! - `get`, `has`, `has_many`, `stat`, `list` and `stats` agree on what
//!   exists, nothing else is listed, and `Store::verify` finds every entry
//!   sound;
//! - an acknowledged reference survives and points at its entry, which is
//!   present; a surviving unacknowledged reference points at the digest it
//!   was set to, whose entry is present (no reference dangles);
//! - no stage file is left after the open, nor after a sweep's maintenance;
//! - two sweeps after the reopen (the clock past the window before each)
//!   delete exactly the present unreferenced entries, keep every
//!   referenced one, and report counts that add up.
//!
//! A pin (a held receipt) protects through the life's sweep — checked when
//! that sweep completes — but not across a crash: pins are in-process
//! state and die with the process; what protects data across a crash is a
//! reference.
//!
//! Seeds: `BLOBPOOL_CRASH_SEEDS` (default 3); `cargo xtask soak` sets it
//! high.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use store_core::{
    Clock, GcPolicy, ManualClock, Mode, NamespaceCounts, RefExpect, RefName, Store, SweepOptions,
    Timestamp, VerifyOptions, MAX_LIST_LIMIT, OUTBOARD_KEPT_ABOVE,
};
use store_local::{LocalEngine, LocalOptions};
use store_sqlite::crash::Loss;
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::crash::CrashSwitch;
use store_types::{Digest, Key, Namespace, Tier};

/// Entries above this go to the local tier.
const THRESHOLD: u64 = 4 << 10;

/// The delete window.
const WINDOW: Duration = Duration::from_secs(60);

/// Past the window.
const PAST_WINDOW: Duration = Duration::from_secs(61);

/// The seeds to run: `BLOBPOOL_CRASH_SEED=S` runs only `S` (to replay a
/// failure), else `0..BLOBPOOL_CRASH_SEEDS` (default 3).
fn seeds() -> std::ops::Range<u64> {
    let var = |name| std::env::var(name).ok().and_then(|s| s.parse().ok());
    match var("BLOBPOOL_CRASH_SEED") {
        Some(s) => s..s + 1,
        None => 0..var("BLOBPOOL_CRASH_SEEDS").unwrap_or(3),
    }
}

fn ns() -> Namespace {
    Namespace::new("crash").unwrap()
}

fn ref_name(i: usize) -> RefName {
    RefName::new(format!("r{i}")).unwrap()
}

/// A scratch directory, on tmpfs where there is one (the models decide
/// what is durable, the medium need not).
fn scratch() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap()
}

/// Seeded content: small (kv) or large (local); one large blob in four is
/// over 1 MiB, so that its put publishes an outboard (TUNING.md §small-outboards) and the
/// crash models cover the outboard's stage, rename and sync too.
fn blob(rng: &mut StdRng, large: bool) -> Vec<u8> {
    let kept = OUTBOARD_KEPT_ABOVE as usize;
    let len = if large && rng.random_ratio(1, 4) {
        rng.random_range(kept + 1..kept + 40_000)
    } else if large {
        rng.random_range(THRESHOLD as usize + 1..80_000)
    } else {
        rng.random_range(1..=THRESHOLD as usize)
    };
    let mut b = vec![0u8; len];
    rng.fill(&mut b[..]);
    b
}

fn key(data: &[u8]) -> Key {
    Key::new(ns(), Digest::of(data))
}

/// What a scenario did, for the checks after the reopen.
#[derive(Clone, Default)]
struct Record {
    /// Every content the scenario put (or found prepared), by digest.
    entries: BTreeMap<Digest, Vec<u8>>,
    /// Digests that must be present after the reopen: acknowledged puts
    /// the scenario's own sweep cannot have deleted.
    required: BTreeSet<Digest>,
    /// References the scenario set: name → (digest, acknowledged).
    refs: BTreeMap<usize, (Digest, bool)>,
    /// Operations acknowledged after the crash (they made nothing durable:
    /// a deduplicated put finding a synced entry needs no durability
    /// point). Counted to show the checks cover them.
    late_acks: u64,
}

impl Record {
    fn entry(&mut self, data: &[u8]) -> Digest {
        let d = Digest::of(data);
        self.entries.insert(d, data.to_vec());
        d
    }
}

/// Opens a store over `dir`: `kv.sqlite` and `large/`, through the crash
/// models when given. `Err` when a crash stopped the open.
async fn open(
    dir: &Path,
    clock: &ManualClock,
    models: Option<(
        &store_sqlite::crash::CrashModel,
        &store_local::crash::CrashModel,
    )>,
) -> store_types::Result<(Store, LocalEngine)> {
    let kv_options = SqliteOptions {
        vfs: models.map(|(s, _)| s.vfs_name().to_owned()),
        readers: 2,
        ..Default::default()
    };
    let kv = SqliteEngine::open(dir.join("kv.sqlite"), kv_options).await?;
    let large = dir.join("large");
    let local = match models {
        Some((_, l)) => {
            LocalEngine::open_with_crash_model(&large, LocalOptions::default(), l).await?
        }
        None => LocalEngine::open(&large, LocalOptions::default()).await?,
    };
    let store = Store::builder()
        .kv(kv)
        .large(local.clone())
        .mode(Mode::DualTier {
            threshold: THRESHOLD,
        })
        .window(WINDOW)
        .clock(Arc::new(clock.clone()) as Arc<dyn Clock>)
        .build()
        .await?;
    Ok((store, local))
}

/// A scenario: what it does with the store of one life (which may crash
/// at any point), and what it prepares in the files beforehand.
trait Scenario {
    /// For messages.
    fn name(&self) -> &'static str;
    /// Fills `dir` (never crashed) before the lives, which start from a
    /// copy; default: nothing.
    async fn prepare(&self, _seed: u64, _dir: &Path, _clock: &ManualClock, _rec: &mut Record) {}
    /// The crashed life: every failure must be explained by the crash.
    async fn run(
        &self,
        seed: u64,
        store: &Store,
        switch: &CrashSwitch,
        clock: &ManualClock,
        rec: &mut Record,
    );
}

/// Whether an operation's failure is explained by the crash.
fn failed(switch: &CrashSwitch, what: &str, e: &store_types::Error) {
    assert!(switch.crashed(), "{what} failed without a crash: {e}");
}

/// Puts `data`; records it, and requires it when acknowledged.
async fn put(store: &Store, switch: &CrashSwitch, rec: &mut Record, data: &[u8]) -> bool {
    let d = rec.entry(data);
    match store
        .put_opts(
            &ns(),
            data,
            store_core::PutOptions {
                len: Some(data.len() as u64),
                ..Default::default()
            },
        )
        .await
    {
        Ok(receipt) => {
            let tier = if data.len() as u64 > THRESHOLD {
                Tier::Large
            } else {
                Tier::Kv
            };
            assert_eq!(receipt.tier, tier);
            assert_eq!(receipt.digest, d);
            rec.required.insert(d);
            rec.late_acks += u64::from(switch.crashed());
            true
        }
        Err(e) => {
            failed(switch, "put", &e);
            false
        }
    }
}

/// Sets reference `i` to `digest`; records it with its acknowledgement.
async fn set_ref(store: &Store, switch: &CrashSwitch, rec: &mut Record, i: usize, d: Digest) {
    let refs = store.refs().expect("sqlite holds references");
    let acked = match refs.set(&ns(), &ref_name(i), d, RefExpect::Any).await {
        Ok(_) => {
            rec.late_acks += u64::from(switch.crashed());
            true
        }
        Err(e) => {
            failed(switch, "reference set", &e);
            false
        }
    };
    rec.refs.insert(i, (d, acked));
}

/// Puts, new and deduplicated, small and large, sequential and concurrent.
struct Puts;

impl Scenario for Puts {
    fn name(&self) -> &'static str {
        "put"
    }

    async fn run(
        &self,
        seed: u64,
        store: &Store,
        switch: &CrashSwitch,
        _clock: &ManualClock,
        rec: &mut Record,
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let a = blob(&mut rng, false);
        let b = blob(&mut rng, true);
        for data in [&a, &b, &a, &b] {
            put(store, switch, rec, data).await;
        }
        // Concurrent: new and duplicate puts of both tiers at once.
        let c = blob(&mut rng, false);
        let d = blob(&mut rng, true);
        let e = blob(&mut rng, true);
        let batch = [&c, &d, &c, &e, &d, &a];
        let space = ns();
        let results = futures::future::join_all(batch.iter().map(|data| {
            let data: &[u8] = data;
            store.put_opts(
                &space,
                data,
                store_core::PutOptions {
                    len: Some(data.len() as u64),
                    ..Default::default()
                },
            )
        }))
        .await;
        for (data, r) in batch.iter().zip(results) {
            let dg = rec.entry(data);
            match r {
                Ok(receipt) => {
                    assert_eq!(receipt.digest, dg);
                    rec.required.insert(dg);
                }
                Err(e) => failed(switch, "concurrent put", &e),
            }
        }
    }
}

/// Puts each followed by a reference set (one entry left unreferenced).
struct Publish;

impl Scenario for Publish {
    fn name(&self) -> &'static str {
        "publish"
    }

    async fn run(
        &self,
        seed: u64,
        store: &Store,
        switch: &CrashSwitch,
        _clock: &ManualClock,
        rec: &mut Record,
    ) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        for i in 0..5 {
            let data = blob(&mut rng, i % 2 == 1);
            let acked = put(store, switch, rec, &data).await;
            if acked && i < 4 {
                set_ref(store, switch, rec, i, Digest::of(&data)).await;
            }
        }
    }
}

/// Mark, a reference set on a staged entry, execute.
struct Sweep;

/// The prepared entries of [`Sweep`]: (content, referenced) — small and
/// large, referenced and not; the last one is referenced during the life.
fn sweep_entries(seed: u64) -> Vec<(Vec<u8>, bool)> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eeb);
    (0..7)
        .map(|i| (blob(&mut rng, i % 2 == 1), i < 2))
        .collect()
}

impl Scenario for Sweep {
    fn name(&self) -> &'static str {
        "sweep"
    }

    async fn prepare(&self, seed: u64, dir: &Path, clock: &ManualClock, rec: &mut Record) {
        // Through the models (never crashed) only to know when SQLite has
        // closed its files: the copies must not race the close.
        let switch = CrashSwitch::new();
        let sqlite_model = store_sqlite::crash::CrashModel::new(switch.clone()).unwrap();
        let local_model = store_local::crash::CrashModel::new(switch.clone());
        let (store, local) = open(dir, clock, Some((&sqlite_model, &local_model)))
            .await
            .unwrap();
        for (i, (data, referenced)) in sweep_entries(seed).iter().enumerate() {
            assert!(put(&store, &switch, rec, data).await);
            if *referenced {
                set_ref(&store, &switch, rec, i, Digest::of(data)).await;
            } else {
                // The life's sweep may delete it.
                rec.required.remove(&Digest::of(data));
            }
        }
        drop((store, local));
        tokio::task::spawn_blocking(move || sqlite_model.wait_closed(Duration::from_secs(30)))
            .await
            .unwrap()
            .unwrap();
    }

    async fn run(
        &self,
        seed: u64,
        store: &Store,
        switch: &CrashSwitch,
        clock: &ManualClock,
        rec: &mut Record,
    ) {
        if let Err(e) = store.set_gc_policy(ns(), GcPolicy::Refs).await {
            return failed(switch, "set_gc_policy", &e);
        }
        let entries = sweep_entries(seed);
        let n = entries.len();
        match store.gc().sweep(SweepOptions { batch: 3 }).await {
            Ok(r) => {
                assert_eq!(r.total.staged, (n - 2) as u64, "{r:?}");
                assert_eq!(r.total.protected.live, 2, "{r:?}");
            }
            Err(e) => return failed(switch, "mark sweep", &e),
        }
        // A reference to a staged entry: the execute must rescue it.
        let late = Digest::of(&entries[n - 1].0);
        set_ref(store, switch, rec, n - 1, late).await;
        let late_acked = rec.refs[&(n - 1)].1;
        if late_acked {
            rec.required.insert(late);
        }
        // A deduplicated put of a staged large entry, its receipt (and so
        // its pin) held through the execute: rescued too. After a crash the
        // pin is gone with the process and the entry is garbage again.
        let pinned = &entries[3].0;
        let receipt = match store
            .put_opts(
                &ns(),
                &pinned[..],
                store_core::PutOptions {
                    len: Some(pinned.len() as u64),
                    ..Default::default()
                },
            )
            .await
        {
            Ok(receipt) => {
                assert!(receipt.deduplicated);
                Some(receipt)
            }
            Err(e) => {
                failed(switch, "deduplicated put", &e);
                None
            }
        };
        // A new large entry put between mark and execute: the execute
        // must not touch it (the mark after it stages it).
        let fresh = blob(&mut StdRng::seed_from_u64(seed ^ 0xf7e5), true);
        let fresh_acked = put(store, switch, rec, &fresh).await;
        clock.advance(PAST_WINDOW);
        match store.gc().sweep(SweepOptions { batch: 3 }).await {
            Ok(r) => {
                let rescued = u64::from(late_acked) + u64::from(receipt.is_some());
                assert_eq!(r.total.deleted, (n - 2) as u64 - rescued, "{r:?}");
                assert_eq!(r.total.rescued, rescued, "{r:?}");
                assert_eq!(r.total.staged, u64::from(fresh_acked), "{r:?}");
                if receipt.is_some() {
                    // Not deleted by this sweep, and no later one runs.
                    rec.required.insert(Digest::of(pinned));
                }
            }
            Err(e) => failed(switch, "execute sweep", &e),
        }
        drop(receipt);
    }
}

/// Copies the tree `from` into `to` (which exists).
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The clock every life starts from.
fn start() -> Timestamp {
    Timestamp(1_800_000_000_000)
}

/// Files prepared for a scenario (no crash model), and what preparing
/// them recorded; copied for each life.
struct Template {
    dir: tempfile::TempDir,
    rec: Record,
}

async fn template<S: Scenario>(scenario: &S, seed: u64) -> Template {
    let dir = scratch();
    let mut rec = Record::default();
    let clock = ManualClock::new(start());
    scenario.prepare(seed, dir.path(), &clock, &mut rec).await;
    Template { dir, rec }
}

/// One life of `scenario`: the prepared files, the run crashed at
/// `crash_at`, the restore, the reopen and the checks.
async fn life<S: Scenario>(scenario: &S, t: &Template, seed: u64, crash_at: Option<u64>) -> Life {
    let dir = scratch();
    copy_tree(t.dir.path(), dir.path());
    let mut rec = t.rec.clone();
    let clock = ManualClock::new(start());
    let switch = CrashSwitch::new();
    let sqlite_model = store_sqlite::crash::CrashModel::new(switch.clone()).unwrap();
    let local_model = store_local::crash::CrashModel::with_seed(
        switch.clone(),
        seed.wrapping_mul(1000) + crash_at.unwrap_or(0),
    );
    if let Some(n) = crash_at {
        switch.arm(n);
    }
    match open(dir.path(), &clock, Some((&sqlite_model, &local_model))).await {
        Ok((store, local)) => {
            scenario.run(seed, &store, &switch, &clock, &mut rec).await;
            drop((store, local));
        }
        Err(e) => assert!(switch.crashed(), "open failed without a crash: {e}"),
    }
    let points = switch.points();
    let trace = switch.trace();
    // Odd points (and the runs without a crash): the machine loses power;
    // even points: the process dies and the OS keeps what it wrote.
    let loss = match crash_at {
        Some(n) if n % 2 == 0 => Loss::ProcessCrash,
        _ => Loss::PowerLoss {
            seed: seed.wrapping_mul(7919) ^ crash_at.unwrap_or(0),
        },
    };
    let sqlite_report = tokio::task::spawn_blocking(move || {
        let report = sqlite_model.restore(loss).unwrap();
        drop(sqlite_model);
        report
    })
    .await
    .unwrap();
    switch.crash_now();
    if loss != Loss::ProcessCrash {
        // Rebuilds the root from the durable image; an engine whose open
        // never attached the model left nothing to undo.
        if let Err(e) = local_model.crash_and_restore() {
            assert!(e.to_string().contains("no engine attached"), "{e}");
        }
    }
    // (After a process crash the root stays as the dead engine left it:
    // its seam refused every call from the crash on.)
    drop(local_model);
    switch.reset();
    if std::env::var_os("BLOBPOOL_CRASH_TRACE").is_some() {
        eprintln!("{} {crash_at:?}: {trace:?}", scenario.name());
    }

    let context = format!(
        "{} seed {seed}, crash at {crash_at:?} of {points} ({loss:?}; last points: {:?}); \
         sqlite: {sqlite_report}",
        scenario.name(),
        &trace[trace.len().saturating_sub(4)..]
    );
    let stage_dir = dir.path().join("large/.stage");
    let stages = std::fs::read_dir(&stage_dir).map_or(0, |d| d.count());
    check(&dir, &clock, &rec, &context).await;
    Life {
        points,
        stages,
        late_acks: rec.late_acks,
    }
}

/// What one life saw, for the run's summary.
struct Life {
    /// Durability points reported.
    points: u64,
    /// Stage files left on disk by the crash (the reopen removes them).
    stages: usize,
    /// Operations acknowledged after the crash.
    late_acks: u64,
}

/// The checks after the reopen (see the module docs).
async fn check(dir: &tempfile::TempDir, clock: &ManualClock, rec: &Record, context: &str) {
    let (store, local) = open(dir.path(), clock, None)
        .await
        .unwrap_or_else(|e| panic!("{context}: reopen failed: {e}"));
    assert_eq!(
        local.stage_file_count().unwrap(),
        0,
        "{context}: stage files"
    );

    // Each known entry: whole and verified, or absent everywhere.
    let mut present = BTreeSet::new();
    for (d, data) in &rec.entries {
        let key = key(data);
        let stat = store.stat(&key).await.unwrap();
        let has = store.has(&key).await.unwrap();
        match store.get(&key).await.unwrap() {
            Some(blob) => {
                let got = blob
                    .bytes()
                    .await
                    .unwrap_or_else(|e| panic!("{context}: {d} does not verify: {e}"));
                assert!(got == data[..], "{context}: {d} differs");
                // A range read checks the outboard a crash left beside an
                // entry over 1 MiB (loaded and validated up to the digest),
                // or computes one.
                let n = data.len() as u64;
                let range = n / 2..(n / 2 + 100).min(n);
                let part = store
                    .read_range(&key, range.clone())
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap_or_else(|e| panic!("{context}: {d} {range:?}: {e}"));
                assert!(part == data[range.start as usize..range.end as usize]);
                assert_eq!(
                    stat.map(|s| s.size),
                    Some(data.len() as u64),
                    "{context}: {d}"
                );
                assert!(has, "{context}: {d} readable but not `has`");
                present.insert(*d);
            }
            None => {
                assert!(
                    !rec.required.contains(d),
                    "{context}: acknowledged entry {d} ({} bytes) is gone",
                    data.len()
                );
                assert!(stat.is_none() && !has, "{context}: {d} half visible");
            }
        }
    }
    // The listing shows exactly the present entries, with their sizes.
    let mut listed = BTreeMap::new();
    let mut after = None;
    loop {
        let page = store.list(&ns(), after, MAX_LIST_LIMIT).await.unwrap();
        for e in &page.entries {
            listed.insert(e.digest, e.size);
        }
        match page.next {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(
        listed.keys().copied().collect::<BTreeSet<_>>(),
        present,
        "{context}: list disagrees with get"
    );
    for (d, size) in &listed {
        assert_eq!(*size, rec.entries[d].len() as u64, "{context}: listed size");
    }
    let digests: Vec<Digest> = rec.entries.keys().copied().collect();
    let many = store.has_many(&ns(), &digests).await.unwrap();
    for (d, has) in digests.iter().zip(many) {
        assert_eq!(has, present.contains(d), "{context}: has_many {d}");
    }
    // Per tier: the entries and bytes the statistics count are the present
    // ones (a small entry in the kv tier, a large one in the local tier).
    let stats = store.stats(Some(&ns())).await.unwrap();
    for tier in [Tier::Kv, Tier::Large] {
        let mine = present
            .iter()
            .map(|d| rec.entries[d].len() as u64)
            .filter(|len| (*len > THRESHOLD) == (tier == Tier::Large));
        let counted = stats
            .iter()
            .filter(|s| s.tier == tier)
            .fold((0, 0), |(n, b), s| (n + s.entries, b + s.bytes));
        let expect = mine.fold((0, 0), |(n, b), len| (n + 1, b + len));
        assert_eq!(counted, expect, "{context}: {tier:?} stats {stats:?}");
    }
    let v = store.verify(&VerifyOptions::new()).await.unwrap();
    assert_eq!(
        (v.checked, v.ok, v.corrupt, v.missing, v.failed),
        (present.len() as u64, present.len() as u64, 0, 0, 0),
        "{context}: verify {v:?}"
    );

    // References: acknowledged ones survive; none dangles.
    let refs = store.refs().unwrap();
    let mut referenced = BTreeSet::new();
    for (i, (d, acked)) in &rec.refs {
        match refs.get(&ns(), &ref_name(*i)).await.unwrap() {
            Some(got) => {
                assert_eq!(got, *d, "{context}: reference r{i}");
                assert!(present.contains(d), "{context}: r{i} dangles");
                referenced.insert(*d);
            }
            None => assert!(!acked, "{context}: acknowledged reference r{i} is gone"),
        }
    }
    let all = refs.list(&ns(), "", None, 1000).await.unwrap();
    assert_eq!(all.len(), referenced.len(), "{context}: unknown references");

    // Two sweeps: exactly the present unreferenced entries go.
    store.set_gc_policy(ns(), GcPolicy::Refs).await.unwrap();
    let unreferenced: Vec<Digest> = present.difference(&referenced).copied().collect();
    clock.advance(PAST_WINDOW);
    let first = store.gc().sweep(SweepOptions { batch: 3 }).await.unwrap();
    assert_eq!(
        local.stage_file_count().unwrap(),
        0,
        "{context}: stage files"
    );
    clock.advance(PAST_WINDOW);
    let second = store.gc().sweep(SweepOptions { batch: 3 }).await.unwrap();
    let (a, b) = (first.total, second.total);
    let known = rec.entries.len() as u64;
    let r = referenced.len() as u64;
    let u = unreferenced.len() as u64;
    let counts = |c: &NamespaceCounts| (c.scanned, c.protected.live, c.staged);
    let msg = format!("{context}: sweeps after the reopen: {a:?} then {b:?}");
    assert!(first.aborted.is_none() && second.aborted.is_none(), "{msg}");
    // The first deletes what a crashed sweep left due, rescues what a
    // reference now protects, forgets what is already gone, and stages
    // the rest of the garbage; the second deletes that.
    assert_eq!(a.deleted + a.staged, u, "{msg}");
    assert!(
        a.rescued <= r && a.vanished <= known - present.len() as u64,
        "{msg}"
    );
    assert_eq!(counts(&a), (r + a.staged, r, a.staged), "{msg}");
    assert_eq!(counts(&b), (r, r, 0), "{msg}");
    assert_eq!(
        (b.deleted, b.rescued, b.vanished),
        (a.staged, 0, 0),
        "{msg}"
    );
    let freed: u64 = unreferenced
        .iter()
        .map(|d| rec.entries[d].len() as u64)
        .sum();
    assert_eq!(a.bytes_freed + b.bytes_freed, freed, "{msg}");
    for d in &present {
        let has = store.has(&key(&rec.entries[d])).await.unwrap();
        assert_eq!(has, referenced.contains(d), "{msg}: {d}");
    }
    assert_eq!(
        local.stage_file_count().unwrap(),
        0,
        "{context}: stage files"
    );
}

/// Every durability point of `scenario`, for each seed.
async fn every_point<S: Scenario>(scenario: S) {
    for seed in seeds() {
        let t = template(&scenario, seed).await;
        let points = life(&scenario, &t, seed, None).await.points;
        assert!(points > 0, "{}: no durability point", scenario.name());
        let (mut stages, mut late_acks) = (0, 0);
        for n in 1..=points + 1 {
            let l = life(&scenario, &t, seed, Some(n)).await;
            stages += usize::from(l.stages > 0);
            late_acks += l.late_acks;
        }
        eprintln!(
            "{} seed {seed}: {points} durability points; {stages} crashes left stage files; \
             {late_acks} operations acknowledged after a crash",
            scenario.name()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_survive_a_machine_crash_at_every_durability_point() {
    every_point(Puts).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_references_survive_a_machine_crash_at_every_durability_point() {
    every_point(Publish).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeps_keep_protected_entries_through_a_machine_crash_at_every_durability_point() {
    every_point(Sweep).await;
}
