//! Garbage collection through `store_core::Store` against a model, as
//! redb fuzzes its tables against a `BTreeMap`.
//!
//! A dual-tier store over `store-mem` engines, each wrapped in a fault
//! layer (the input's seeded rules: transient or permanent failures,
//! before or after the operation applied) inside a retry layer, takes a
//! random sequence of puts (keeping their pins or not), pin drops,
//! references set and removed (namespace `fz`, policy `unreferenced`),
//! cache keys recorded and removed (namespace `cz`, policy `cache`,
//! unbounded), direct deletes, sweeps and clock moves. The model knows,
//! per namespace, which entries are certainly present, what protects each
//! (ADR-012: a pin, a reference, a cache key) and what the delete window
//! holds. Both directions of the promise are checked:
//!
//! - **never lost**: after every step, read from the engines beneath the
//!   faults, every certainly present entry that is protected is there
//!   with its bytes; a direct delete of one is refused;
//! - **swept when due** (the window protocol, deterministic in process):
//!   a sweep that returns `Ok` first executes the staged candidates whose
//!   window has passed — each unprotected one is gone afterwards — then
//!   stages every present, unprotected, unstaged entry with
//!   `visible_after = now + window`; the window then holds exactly the
//!   model's prediction, and when no fault fired during the sweep its
//!   `deleted` and `staged` counts are the model's. A direct delete of an
//!   unprotected entry with no fault leaves it gone and unstaged. At the
//!   end the clock moves a window on twice with a sweep each time: if
//!   both succeed, no unprotected entry is left.
//!
//! An operation that fails after it may have applied (a reference set, a
//! cache put) makes the model unsure of the entries it touched; those are
//! left out of the "swept when due" checks (never of "never lost": the
//! model only counts a protection it is sure of). After a failed sweep the
//! model takes the window's contents as they are.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use bytes::Bytes;
use store_core::{Clock as _, GcPolicy, ManualClock, Mode, Pin, Store, SweepOptions, SweepReport};
use store_layers::{FaultLayer, FaultPlan, LayerStack, Op, RetryLayer, RetryPolicy, Rule};
use store_mem::MemEngine;
use store_types::{
    CacheBounds, Digest, EngineExt as _, Error, Key, Namespace, RefExpect, RefName, Timestamp,
};

const ITEMS: usize = 6;
const NAMES: usize = 3;
const THRESHOLD: u64 = 64;
const WINDOW: Duration = Duration::from_secs(10);

/// The fuzzer's input: the fault rules and the steps.
#[derive(Arbitrary, Debug)]
pub struct Input {
    seed: u64,
    faults: Vec<FaultCase>,
    steps: Vec<Step>,
}

#[derive(Arbitrary, Debug)]
struct FaultCase {
    /// Index into the engine operations a fault may hit.
    op: u8,
    /// Probability in 256ths.
    chance: u8,
    transient: bool,
    /// After the operation applied (a lost answer) rather than before.
    after: bool,
}

#[derive(Arbitrary, Debug)]
enum Step {
    /// Put item `i` into the refs namespace, keeping its pin or not.
    Put { item: u8, keep_pin: bool },
    /// Drop one kept pin of item `i`.
    DropPin(u8),
    /// Point reference `name` at item `i`.
    SetRef { name: u8, item: u8 },
    /// Remove reference `name`.
    RemoveRef(u8),
    /// Put item `i` into the cache namespace under cache key `key`.
    CachePut { key: u8, item: u8 },
    /// Remove cache key `key`.
    CacheRemove(u8),
    /// Direct delete of item `i` in the refs namespace.
    Delete(u8),
    /// A sweep.
    Sweep,
    /// Move the clock on by this many seconds (modulo twice the window).
    Advance(u8),
}

const FAULT_OPS: [Op; 8] = [
    Op::Meta,
    Op::HasMany,
    Op::Read,
    Op::DeleteMany,
    Op::Scan,
    Op::Put,
    Op::Write,
    Op::Publish,
];

/// What a run exercised (the vacuity checks of the tests read it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Sweeps that returned `Ok`.
    pub sweeps_ok: u64,
    /// Entries those sweeps deleted (their reports' `deleted`).
    pub deleted: u64,
    /// Due, unprotected entries checked gone after a sweep.
    pub swept_checked: u64,
    /// Protected entries checked present after a step.
    pub kept_checked: u64,
    /// Whether the final two sweeps both succeeded (so every unprotected
    /// entry was checked gone).
    pub settled: bool,
}

/// One namespace's entries as the model knows them (items `0..ITEMS`).
struct Space {
    ns: Namespace,
    /// Items certainly present (a put or a reference set succeeded, and
    /// nothing could have removed them since).
    certain: BTreeSet<usize>,
    /// Kept pins per item.
    pins: BTreeMap<usize, Vec<Pin>>,
    /// Reference (or cache key) → item, where the model is sure.
    names: BTreeMap<usize, usize>,
    /// Items whose protection the model lost track of.
    unsure: BTreeSet<usize>,
    /// The delete window's candidates of this namespace: item → visible after.
    staged: BTreeMap<usize, Timestamp>,
}

impl Space {
    fn new(ns: &str) -> Self {
        Space {
            ns: Namespace::new(ns).unwrap(),
            certain: BTreeSet::new(),
            pins: BTreeMap::new(),
            names: BTreeMap::new(),
            unsure: BTreeSet::new(),
            staged: BTreeMap::new(),
        }
    }

    fn protected(&self, i: usize) -> bool {
        self.pins.get(&i).is_some_and(|p| !p.is_empty()) || self.names.values().any(|&v| v == i)
    }

    /// Certainly unprotected: a sweep must treat it as garbage.
    fn garbage(&self, i: usize) -> bool {
        !self.protected(i) && !self.unsure.contains(&i)
    }

    fn key(&self, i: usize) -> Key {
        Key::new(self.ns.clone(), digest(i))
    }

    /// Name `k` may now point anywhere: what it named and `also` become unsure.
    fn lose(&mut self, k: usize, also: Option<usize>) {
        self.unsure.extend(self.names.remove(&k));
        self.unsure.extend(also);
    }

    /// A sweep or delete ran: what nothing protects is no longer certain.
    fn exposed(&mut self) {
        let keep: BTreeSet<usize> = (0..ITEMS).filter(|&i| self.protected(i)).collect();
        self.certain.retain(|i| keep.contains(i));
    }

    /// What an `Ok` sweep at `now` does to this namespace, given which items
    /// were present before it: the due garbage it deletes (returned), and
    /// the staging it leaves in `self.staged`. Unsure items are left out.
    fn predict(&mut self, now: Timestamp, present: &[bool]) -> Prediction {
        let mut p = Prediction::default();
        let due: Vec<usize> = self
            .staged
            .iter()
            .filter(|(_, va)| **va <= now)
            .map(|(&i, _)| i)
            .collect();
        for i in due {
            self.staged.remove(&i);
            if self.garbage(i) {
                p.gone.push(i);
                p.deleted += u64::from(present[i]);
            }
        }
        for (i, &there) in present.iter().enumerate() {
            let left = there && !p.gone.contains(&i);
            if left && self.garbage(i) && !self.staged.contains_key(&i) {
                self.staged.insert(i, now.plus(WINDOW));
                p.staged += 1;
            }
        }
        p
    }
}

#[derive(Default)]
struct Prediction {
    /// Items that must be absent after the sweep.
    gone: Vec<usize>,
    /// Of them, how many were present before (the report's `deleted`).
    deleted: u64,
    /// New candidates (the report's `staged`).
    staged: u64,
}

fn item_bytes(i: usize) -> Bytes {
    // Even items stay in the kv tier, odd ones go to the large tier.
    let len = if i.is_multiple_of(2) {
        10 + i
    } else {
        THRESHOLD as usize + 50 * i
    };
    Bytes::from(
        (0..len)
            .map(|b| (b * 31 + i * 7) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn digest(i: usize) -> Digest {
    Digest::of(&item_bytes(i))
}

fn name(i: u8) -> RefName {
    RefName::new(format!("n{}", i as usize % NAMES)).unwrap()
}

fn plan(input: &Input) -> FaultPlan {
    let mut plan = FaultPlan::new(input.seed);
    for f in input.faults.iter().take(4) {
        let op = FAULT_OPS[f.op as usize % FAULT_OPS.len()];
        let kind = if f.transient {
            std::io::ErrorKind::ConnectionReset
        } else {
            std::io::ErrorKind::PermissionDenied
        };
        let rule = Rule::on(op).probability(f.chance as f64 / 256.0);
        plan = plan.rule(if f.after {
            rule.fail_after(kind)
        } else {
            rule.fail(kind)
        });
    }
    plan
}

/// The store, the engines beneath its layers, and the model.
struct Run {
    store: Store,
    clock: ManualClock,
    faults: FaultLayer,
    kv: MemEngine,
    large: MemEngine,
    /// `[refs namespace, cache namespace]`.
    spaces: [Space; 2],
    stats: Stats,
}

const REFS: usize = 0;
const CACHE: usize = 1;

async fn open(plan: FaultPlan) -> Run {
    let faults = FaultLayer::new(plan);
    let stack = LayerStack::new()
        .layer(faults.clone())
        .layer(RetryLayer::new(RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_micros(10),
            max_backoff: Duration::from_micros(40),
        }));
    let (kv, large) = (MemEngine::new(), MemEngine::new());
    let clock = ManualClock::new(Timestamp(1_000_000));
    let store = Store::builder()
        .kv_shared(stack.kv(Arc::new(kv.clone())))
        .large_shared(stack.large(Arc::new(large.clone())))
        .mode(Mode::DualTier {
            threshold: THRESHOLD,
        })
        .window(WINDOW)
        .clock(Arc::new(clock.clone()))
        .build()
        .await
        .expect("a store over store-mem opens");
    let spaces = [Space::new("fz"), Space::new("cz")];
    let policies = [
        GcPolicy::Unreferenced,
        GcPolicy::Cache(CacheBounds::default()),
    ];
    for (s, p) in spaces.iter().zip(policies) {
        store.set_gc_policy(s.ns.clone(), p).await.unwrap();
    }
    Run {
        store,
        clock,
        faults,
        kv,
        large,
        spaces,
        stats: Stats::default(),
    }
}

impl Run {
    /// The entry's bytes as the engines beneath the faults hold them.
    async fn stored(&self, key: &Key) -> Option<Bytes> {
        for e in [&self.kv, &self.large] {
            if let Some(r) = e.read_whole(key).await.expect("store-mem reads") {
                return Some(r.into_bytes(1 << 20).await.expect("store-mem reads"));
            }
        }
        None
    }

    async fn present(&self, s: usize) -> Vec<bool> {
        let mut out = Vec::with_capacity(ITEMS);
        for i in 0..ITEMS {
            out.push(self.stored(&self.spaces[s].key(i)).await.is_some());
        }
        out
    }

    /// Never lost: every certain, protected entry is there with its bytes.
    async fn check(&mut self, step: usize) {
        for s in &self.spaces {
            for &i in s.certain.iter().filter(|&&i| s.protected(i)) {
                let key = s.key(i);
                let got = self.stored(&key).await;
                assert_eq!(
                    got,
                    Some(item_bytes(i)),
                    "step {step}: protected {key} lost"
                );
                self.stats.kept_checked += 1;
            }
        }
    }

    /// The window's candidates of namespace `s`: item → visible after.
    async fn window(&self, s: usize) -> BTreeMap<usize, Timestamp> {
        let all = self
            .store
            .gc()
            .window()
            .take_due(Timestamp(i64::MAX), None, usize::MAX)
            .await
            .expect("the in-process window answers");
        let ns = &self.spaces[s].ns;
        all.into_iter()
            .filter(|c| &c.key.namespace == ns)
            .map(|c| {
                let i = (0..ITEMS).find(|&i| digest(i) == c.key.digest);
                (i.expect("only the model's items are put"), c.visible_after)
            })
            .collect()
    }

    async fn step(&mut self, n: usize, step: &Step) {
        match *step {
            Step::Put { item, keep_pin } => self.put(item, keep_pin).await,
            Step::DropPin(item) => {
                let i = item as usize % ITEMS;
                self.spaces[REFS].pins.get_mut(&i).and_then(Vec::pop);
            }
            Step::SetRef { name: j, item } => self.set_ref(j, item).await,
            Step::RemoveRef(j) => self.remove_ref(j).await,
            Step::CachePut { key, item } => self.cache_put(key, item).await,
            Step::CacheRemove(key) => self.cache_remove(key).await,
            Step::Delete(item) => self.delete(n, item as usize % ITEMS).await,
            Step::Sweep => {
                self.sweep(n).await;
            }
            Step::Advance(s) => {
                let secs = u64::from(s) % (2 * WINDOW.as_secs());
                self.clock.advance(Duration::from_secs(secs));
            }
        }
        self.check(n).await;
    }

    async fn put(&mut self, item: u8, keep_pin: bool) {
        let i = item as usize % ITEMS;
        let space = &mut self.spaces[REFS];
        if let Ok(r) = self.store.put_bytes(&space.ns, item_bytes(i)).await {
            space.certain.insert(i);
            if keep_pin {
                space.pins.entry(i).or_default().push(r.pin);
            }
        }
    }

    async fn set_ref(&mut self, j: u8, item: u8) {
        let refs = self.store.refs().expect("store-mem keeps references");
        let (i, k) = (item as usize % ITEMS, j as usize % NAMES);
        let space = &mut self.spaces[REFS];
        match refs
            .set(&space.ns, &name(j), digest(i), RefExpect::Any)
            .await
        {
            // The set pinned the entry and found it: present, named.
            Ok(_) => {
                space.names.insert(k, i);
                space.certain.insert(i);
            }
            // Not there: nothing was written.
            Err(Error::Missing) => {}
            Err(_) => space.lose(k, Some(i)),
        }
    }

    async fn remove_ref(&mut self, j: u8) {
        let refs = self.store.refs().expect("store-mem keeps references");
        let k = j as usize % NAMES;
        let space = &mut self.spaces[REFS];
        match refs.delete(&space.ns, &name(j), RefExpect::Any).await {
            Ok(_) => {
                space.names.remove(&k);
            }
            Err(_) => space.lose(k, None),
        }
    }

    async fn cache_put(&mut self, key: u8, item: u8) {
        let cache = self.store.cache().expect("store-mem keeps cache keys");
        let (i, k) = (item as usize % ITEMS, key as usize % NAMES);
        let space = &mut self.spaces[CACHE];
        match cache.put(&space.ns, &name(key), item_bytes(i)).await {
            Ok(_) => {
                space.certain.insert(i);
                space.names.insert(k, i);
            }
            // The key may or may not point at it now.
            Err(_) => space.lose(k, Some(i)),
        }
    }

    async fn cache_remove(&mut self, key: u8) {
        let cache = self.store.cache().expect("store-mem keeps cache keys");
        let k = key as usize % NAMES;
        let space = &mut self.spaces[CACHE];
        match cache.remove(&space.ns, &name(key), None).await {
            Ok(_) => {
                space.names.remove(&k);
            }
            Err(_) => space.lose(k, None),
        }
    }

    async fn delete(&mut self, n: usize, i: usize) {
        let key = self.spaces[REFS].key(i);
        let was = self.stored(&key).await.is_some();
        let fired = self.faults.injections().len();
        let r = self.store.delete(&key).await;
        let quiet = self.faults.injections().len() == fired;
        if r.is_ok() {
            assert_eq!(
                self.stored(&key).await,
                None,
                "step {n}: {key} deleted, still there"
            );
        }
        // A delete that decided (deleted, or found nothing) unstages the
        // key; one that failed midway may or may not have.
        let window = self.window(REFS).await;
        let space = &mut self.spaces[REFS];
        match &r {
            Ok(()) | Err(Error::Missing) => {
                space.staged.remove(&i);
            }
            Err(Error::GcRefuse { .. }) => {}
            Err(_) => space.staged = window,
        }
        if space.protected(i) && space.certain.contains(&i) {
            // Refused (or failed on a fault before it decided).
            let refused = matches!(r, Err(Error::GcRefuse { .. }));
            assert!(
                refused || (r.is_err() && !quiet),
                "step {n}: delete of protected {key}: {r:?}"
            );
        } else if space.garbage(i) && quiet {
            // Deterministic with no fault: deleted, or missing already.
            match r {
                Ok(()) => assert!(was, "step {n}: deleted absent {key}"),
                Err(Error::Missing) => assert!(!was, "step {n}: {key} there, Missing"),
                Err(e) => panic!("step {n}: delete of unprotected {key}: {e}"),
            }
        }
        if !space.protected(i) {
            space.certain.remove(&i);
        }
    }

    /// One sweep, checked against the model's prediction when it succeeds.
    async fn sweep(&mut self, n: usize) -> bool {
        let now = self.clock.now();
        let present = [self.present(REFS).await, self.present(CACHE).await];
        let fired = self.faults.injections().len();
        let r = self.store.gc().sweep(SweepOptions::default()).await;
        let quiet = self.faults.injections().len() == fired;
        if let Ok(report) = &r {
            self.swept(n, now, &present, report, quiet).await;
        }
        for s in [REFS, CACHE] {
            self.spaces[s].staged = self.window(s).await;
            self.spaces[s].exposed();
        }
        r.is_ok()
    }

    async fn swept(
        &mut self,
        n: usize,
        now: Timestamp,
        present: &[Vec<bool>; 2],
        report: &SweepReport,
        quiet: bool,
    ) {
        assert!(report.aborted.is_none(), "step {n}: {:?}", report.aborted);
        self.stats.sweeps_ok += 1;
        self.stats.deleted += report.total.deleted;
        let (mut deleted, mut staged) = (0, 0);
        for s in [REFS, CACHE] {
            let p = self.spaces[s].predict(now, &present[s]);
            for &i in &p.gone {
                let key = self.spaces[s].key(i);
                let got = self.stored(&key).await;
                assert_eq!(got, None, "step {n}: due, unprotected {key} not swept");
                self.stats.swept_checked += 1;
            }
            (deleted, staged) = (deleted + p.deleted, staged + p.staged);
            let window = self.window(s).await;
            let space = &self.spaces[s];
            for i in (0..ITEMS).filter(|i| !space.unsure.contains(i)) {
                let key = space.key(i);
                let (want, got) = (space.staged.get(&i), window.get(&i));
                assert_eq!(got, want, "step {n}: {key} staged");
            }
        }
        if quiet && self.spaces.iter().all(|s| s.unsure.is_empty()) {
            assert_eq!(report.total.deleted, deleted, "step {n}: deleted count");
            assert_eq!(report.total.staged, staged, "step {n}: staged count");
        }
    }

    /// Eventually swept: a window on, a sweep, a window on, a sweep; if
    /// both succeed, nothing certainly unprotected is left.
    async fn settle(&mut self, n: usize) {
        self.clock.advance(WINDOW);
        let first = self.sweep(n).await;
        self.clock.advance(WINDOW);
        if !(self.sweep(n + 1).await && first) {
            return;
        }
        for s in &self.spaces {
            for i in (0..ITEMS).filter(|&i| s.garbage(i)) {
                let key = s.key(i);
                assert_eq!(self.stored(&key).await, None, "end: unprotected {key} left");
            }
        }
        self.stats.settled = true;
    }
}

/// Runs `input`; panics when the store breaks a promise the model checks.
pub fn run(input: Input) -> Stats {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut r = open(plan(&input)).await;
        let steps = input.steps.iter().take(64);
        let n = steps.len();
        for (n, step) in steps.enumerate() {
            r.step(n, step).await;
        }
        r.settle(n).await;
        r.check(n + 2).await;
        r.stats
    })
}

/// The libFuzzer entry point.
pub fn check(input: Input) {
    run(input);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(faults: Vec<FaultCase>, steps: Vec<Step>) -> Input {
        Input {
            seed: 7,
            faults,
            steps,
        }
    }

    /// An unpinned put is staged by one sweep and deleted by the next a
    /// window later; a pinned, a referenced and a cache-keyed one are kept.
    #[test]
    fn garbage_goes_and_protected_entries_stay() {
        use Step::*;
        let stats = run(input(
            vec![],
            vec![
                Put {
                    item: 0,
                    keep_pin: false,
                },
                Put {
                    item: 1,
                    keep_pin: true,
                },
                Put {
                    item: 2,
                    keep_pin: false,
                },
                SetRef { name: 0, item: 2 },
                Put {
                    item: 3,
                    keep_pin: false,
                },
                CachePut { key: 0, item: 4 },
                CachePut { key: 1, item: 5 },
                CacheRemove(1),
                Sweep,
                Advance(WINDOW.as_secs() as u8),
                Sweep,
            ],
        ));
        // Items 0 and 3 (refs) and 5 (cache) were garbage.
        assert_eq!(stats.sweeps_ok, 4);
        assert_eq!(stats.deleted, 3);
        assert_eq!(stats.swept_checked, 3);
        assert!(stats.kept_checked > 0);
        assert!(stats.settled);
    }

    /// Faults that fire on every call of the sweep's scan: no sweep
    /// succeeds, nothing is checked gone, nothing protected is lost.
    #[test]
    fn failing_sweeps_delete_nothing() {
        use Step::*;
        let scan = FAULT_OPS.iter().position(|o| *o == Op::Scan).unwrap() as u8;
        let stats = run(input(
            vec![FaultCase {
                op: scan,
                chance: 255,
                transient: false,
                after: false,
            }],
            vec![
                Put {
                    item: 0,
                    keep_pin: false,
                },
                Sweep,
                Advance(15),
                Sweep,
            ],
        ));
        assert_eq!(stats.deleted, 0);
        assert!(!stats.settled);
    }

    /// Every committed seed decodes and runs; together they make sweeps
    /// delete (so the fuzz run starts from inputs that reach the checks).
    #[test]
    fn committed_seeds_reach_deletions() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/gc");
        let mut total = Stats::default();
        for entry in std::fs::read_dir(dir).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            let u = arbitrary::Unstructured::new(&bytes);
            let s = run(Input::arbitrary_take_rest(u).unwrap());
            total.deleted += s.deleted;
            total.swept_checked += s.swept_checked;
        }
        assert!(total.deleted > 0 && total.swept_checked > 0, "{total:?}");
    }
}
