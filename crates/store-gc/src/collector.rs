//! The sweep and the direct-delete arbitration.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use store_types::{
    BoundLivenessTable, Digest, Engine, Error, Key, Namespace, PinClauses, ProtectReason, Result,
    StagedCandidate, SweepLockClause, Timestamp, WindowClauses,
};

use crate::pins::GateState;
use crate::{
    Clock, GcAbortCause, LivenessSource, PinRegistry, ProtectCallback, SourceId, SweepReport,
};

/// How a [`Collector`] is set up.
#[derive(Clone)]
pub struct GcConfig {
    /// Delete-window length: a staged candidate is deletable this long
    /// after it was staged.
    pub window: Duration,
    /// The time source.
    pub clock: Arc<dyn Clock>,
    /// The one window host of the instance (ADR-012 §5).
    pub window_host: Arc<dyn WindowClauses>,
    /// An extra sweep lock shared between instances (fleet), taken after
    /// the in-process one.
    pub shared_lock: Option<Arc<dyn SweepLockClause>>,
    /// Fleet mode: the GC host's pin clauses. Arbitration then happens in
    /// SQL (pin rows, liveness tables) under per-key locks.
    pub fleet_pins: Option<Arc<dyn PinClauses>>,
}

impl fmt::Debug for GcConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcConfig")
            .field("window", &self.window)
            .field("shared_lock", &self.shared_lock.is_some())
            .field("fleet", &self.fleet_pins.is_some())
            .finish()
    }
}

/// Per-sweep knobs.
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// Entries per scan page, liveness probe and window batch.
    pub batch: usize,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions { batch: 1000 }
    }
}

type Sources = BTreeMap<Namespace, Vec<(SourceId, Arc<dyn LivenessSource>)>>;
type Tables = Vec<(SourceId, BoundLivenessTable)>;

/// What a sweep reads once, at its start.
struct Snapshot {
    sources: Sources,
    tables: Vec<BoundLivenessTable>,
}

impl Snapshot {
    fn has_source(&self, ns: &Namespace) -> bool {
        self.sources.contains_key(ns) || self.tables.iter().any(|t| &t.namespace == ns)
    }

    fn is_empty(&self) -> bool {
        self.sources.is_empty() && self.tables.is_empty()
    }
}

/// Runs sweeps and arbitrates direct deletes over an instance's tiers.
///
/// Tiers are consulted in order (kv first, then large): the fall-through
/// rule of ADR-012 §6.1.
pub struct Collector {
    tiers: Vec<Arc<dyn Engine>>,
    pins: PinRegistry,
    sources: RwLock<Sources>,
    tables: RwLock<Tables>,
    protect: RwLock<Option<Arc<dyn ProtectCallback>>>,
    next_id: AtomicU64,
    sweep_lock: tokio::sync::Mutex<()>,
    cfg: GcConfig,
}

impl fmt::Debug for Collector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Collector")
            .field("tiers", &self.tiers.len())
            .field("pins", &self.pins)
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl Collector {
    /// A collector over `tiers` (kv first).
    pub fn new(tiers: Vec<Arc<dyn Engine>>, cfg: GcConfig) -> Self {
        Collector {
            tiers,
            pins: PinRegistry::new(),
            sources: RwLock::new(BTreeMap::new()),
            tables: RwLock::new(Vec::new()),
            protect: RwLock::new(None),
            next_id: AtomicU64::new(1),
            sweep_lock: tokio::sync::Mutex::new(()),
            cfg,
        }
    }

    /// The in-process pin table.
    pub fn pins(&self) -> &PinRegistry {
        &self.pins
    }

    /// The instance's window host.
    pub fn window(&self) -> &Arc<dyn WindowClauses> {
        &self.cfg.window_host
    }

    /// The configured window length.
    pub fn window_length(&self) -> Duration {
        self.cfg.window
    }

    /// Registers a liveness source for `ns`.
    pub fn register_liveness_source(
        &self,
        ns: Namespace,
        source: Arc<dyn LivenessSource>,
    ) -> SourceId {
        let id = SourceId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.sources_mut().entry(ns).or_default().push((id, source));
        id
    }

    /// Registers a fleet liveness table (already validated and bound).
    pub fn register_liveness_table(&self, table: BoundLivenessTable) -> SourceId {
        let id = SourceId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push((id, table));
        id
    }

    /// Whether this collector arbitrates in SQL (fleet mode).
    pub fn is_fleet(&self) -> bool {
        self.cfg.fleet_pins.is_some()
    }

    /// Removes a registration; `false` if it was not registered.
    pub fn deregister_liveness_source(&self, id: SourceId) -> bool {
        {
            let mut tables = self.tables.write().unwrap_or_else(|p| p.into_inner());
            let before = tables.len();
            tables.retain(|(i, _)| *i != id);
            if tables.len() != before {
                return true;
            }
        }
        let mut sources = self.sources_mut();
        let mut found = false;
        sources.retain(|_, v| {
            let before = v.len();
            v.retain(|(i, _)| *i != id);
            found |= v.len() != before;
            !v.is_empty()
        });
        found
    }

    /// Installs (or with `None` removes) the protect callback.
    pub fn set_protect(&self, cb: Option<Arc<dyn ProtectCallback>>) {
        *self.protect.write().unwrap_or_else(|p| p.into_inner()) = cb;
    }

    fn sources_mut(&self) -> std::sync::RwLockWriteGuard<'_, Sources> {
        self.sources.write().unwrap_or_else(|p| p.into_inner())
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            sources: self
                .sources
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            tables: self
                .tables
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(_, t)| t.clone())
                .collect(),
        }
    }

    fn protect_cb(&self) -> Option<Arc<dyn ProtectCallback>> {
        self.protect
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks the protect callback, if any.
    async fn protected_set(&self) -> std::result::Result<HashSet<Key>, String> {
        match self.protect_cb() {
            Some(cb) => Ok(cb.protected_keys().await?.into_iter().collect()),
            None => Ok(HashSet::new()),
        }
    }

    /// OR over every in-process source of `ns`; `false` when it has none.
    async fn probe(&self, sources: &Sources, ns: &Namespace, keys: &[Key]) -> Result<Vec<bool>> {
        let mut live = vec![false; keys.len()];
        if keys.is_empty() {
            return Ok(live);
        }
        for (_, src) in sources.get(ns).into_iter().flatten() {
            let answer = src
                .probe(keys)
                .await
                .map_err(|e| Error::Backend(format!("liveness source of {ns} failed: {e}")))?;
            if answer.len() != keys.len() {
                return Err(Error::Backend(format!(
                    "liveness source of {ns} answered {} values for {} keys",
                    answer.len(),
                    keys.len()
                )));
            }
            for (l, a) in live.iter_mut().zip(answer) {
                *l |= a;
            }
        }
        Ok(live)
    }

    /// In-process arbitration of keys of one namespace (`pinned` known).
    async fn arbitrate_local(
        &self,
        snap: &Snapshot,
        ns: &Namespace,
        keys: &[Key],
        pinned: &[bool],
        protected: &HashSet<Key>,
    ) -> Result<Vec<Option<ProtectReason>>> {
        let unpinned: Vec<Key> = keys
            .iter()
            .zip(pinned)
            .filter(|(_, p)| !**p)
            .map(|(k, _)| k.clone())
            .collect();
        let mut live = self.probe(&snap.sources, ns, &unpinned).await?.into_iter();
        Ok(keys
            .iter()
            .zip(pinned)
            .map(|(k, p)| {
                if *p {
                    Some(ProtectReason::Pinned)
                } else if live.next().unwrap_or(false) {
                    Some(ProtectReason::Live)
                } else if protected.contains(k) {
                    Some(ProtectReason::ProtectCallback)
                } else {
                    None
                }
            })
            .collect())
    }

    /// Merges SQL arbitration with this node's pins and protect set.
    fn merge(
        &self,
        keys: &[Key],
        sql: Vec<Option<ProtectReason>>,
        protected: &HashSet<Key>,
    ) -> Vec<Option<ProtectReason>> {
        let local = self.pins.pinned_many(keys);
        keys.iter()
            .zip(sql)
            .zip(local)
            .map(|((k, r), p)| {
                if p {
                    Some(ProtectReason::Pinned)
                } else if r.is_some() {
                    r
                } else if protected.contains(k) {
                    Some(ProtectReason::ProtectCallback)
                } else {
                    None
                }
            })
            .collect()
    }

    /// Deletes `digests` of `ns` across `tiers` in order; returns the freed
    /// size of each (`None` when no tier held it).
    async fn delete_through(
        tiers: &[Arc<dyn Engine>],
        ns: &Namespace,
        digests: &[Digest],
        freed: &mut [Option<u64>],
    ) -> Result<()> {
        for tier in tiers {
            let pending: Vec<usize> = (0..digests.len()).filter(|i| freed[*i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let batch: Vec<Digest> = pending.iter().map(|i| digests[*i]).collect();
            let res = tier.delete_many(ns, &batch).await?;
            for (i, r) in pending.into_iter().zip(res) {
                freed[i] = r;
            }
        }
        Ok(())
    }

    /// A direct delete: refuses protected keys with [`Error::GcRefuse`],
    /// answers [`Error::Missing`] when no tier holds the key, and returns
    /// the freed size otherwise.
    pub async fn delete(&self, key: &Key) -> Result<u64> {
        let keys = [key.clone()];
        let snap = self.snapshot();
        let protected = self
            .protected_set()
            .await
            .map_err(|e| Error::Backend(format!("protect callback failed: {e}")))?;
        let refuse = |reason| Error::GcRefuse {
            key: key.clone(),
            reason,
        };
        let mut freed = [None];
        if let Some(pins) = &self.cfg.fleet_pins {
            let mut batch = pins.begin_batch(&keys).await?;
            let sql = batch
                .protected(&keys, &snap.tables, self.cfg.clock.now())
                .await?;
            if let Some(reason) = self.merge(&keys, sql, &protected)[0] {
                return Err(refuse(reason));
            }
            freed = [batch.delete_entries(&key.namespace, &[key.digest]).await?[0]];
            Self::delete_through(&self.tiers[1..], &key.namespace, &[key.digest], &mut freed)
                .await?;
            batch.unstage(&keys).await?;
            batch.commit().await?;
            return freed[0].ok_or(Error::Missing);
        }
        let gate = loop {
            let (gate, states) = self.pins.gate(&keys);
            match states[0] {
                GateState::Pinned => return Err(refuse(ProtectReason::Pinned)),
                GateState::Gated => break gate,
                // Another delete of the same key is deciding; let it finish.
                GateState::Busy => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        };
        let reasons = self
            .arbitrate_local(&snap, &key.namespace, &keys, &[false], &protected)
            .await?;
        if let Some(reason) = reasons[0] {
            return Err(refuse(reason));
        }
        Self::delete_through(&self.tiers, &key.namespace, &[key.digest], &mut freed).await?;
        self.cfg.window_host.unstage(&keys).await?;
        drop(gate);
        freed[0].ok_or(Error::Missing)
    }

    /// One GC pass (ADR-012 §1, §5, §6.7): lock, abort checks, execute the
    /// due window, mark new garbage, maintenance, report. `Err` only for
    /// operational failure; deliberate no-ops are `Ok` with `aborted` set.
    pub async fn sweep(&self, opts: &SweepOptions) -> Result<SweepReport> {
        let started = Instant::now();
        let batch = opts.batch.max(1);
        let Ok(_local) = self.sweep_lock.try_lock() else {
            return Ok(SweepReport::aborted(
                GcAbortCause::SweeperLock,
                started.elapsed(),
            ));
        };
        let shared = match &self.cfg.shared_lock {
            Some(lock) => match lock.try_lock().await? {
                Some(guard) => Some(guard),
                None => {
                    return Ok(SweepReport::aborted(
                        GcAbortCause::SweeperLock,
                        started.elapsed(),
                    ))
                }
            },
            None => None,
        };
        let result = self.sweep_locked(started, batch).await;
        // Release explicitly so the next sweeper (on any node) finds the
        // lock free as soon as this call returns.
        if let Some(guard) = shared {
            guard.release().await?;
        }
        result
    }

    async fn sweep_locked(&self, started: Instant, batch: usize) -> Result<SweepReport> {
        let snap = self.snapshot();
        if snap.is_empty() {
            return Ok(SweepReport::aborted(
                GcAbortCause::NoLivenessSources,
                started.elapsed(),
            ));
        }
        let Ok(protected) = self.protected_set().await else {
            return Ok(SweepReport::aborted(
                GcAbortCause::ProtectFailed,
                started.elapsed(),
            ));
        };
        let now = self.cfg.clock.now();
        let mut report = SweepReport::default();
        self.execute_due(&snap, &protected, now, batch, &mut report)
            .await?;
        self.mark(&snap, &protected, now, batch, &mut report)
            .await?;
        if let Some(pins) = &self.cfg.fleet_pins {
            report.reaped_pins = pins.reap_expired(now).await?;
        }
        for tier in &self.tiers {
            report.reaped_stages += tier.maintain(now).await?;
        }
        report.finish(started.elapsed());
        Ok(report)
    }

    async fn execute_due(
        &self,
        snap: &Snapshot,
        protected: &HashSet<Key>,
        now: Timestamp,
        batch: usize,
        report: &mut SweepReport,
    ) -> Result<()> {
        let window = &self.cfg.window_host;
        let mut after: Option<Key> = None;
        loop {
            let due = window.take_due(now, after.as_ref(), batch).await?;
            let Some(last) = due.last() else { break };
            after = Some(last.key.clone());
            let keys: Vec<Key> = due.iter().map(|c| c.key.clone()).collect();
            match &self.cfg.fleet_pins {
                Some(pins) => {
                    self.execute_fleet(pins.as_ref(), snap, protected, now, keys, report)
                        .await?
                }
                None => self.execute_local(snap, protected, keys, report).await?,
            }
        }
        Ok(())
    }

    /// Records the outcome of one namespace's doomed and rescued keys.
    fn tally(report: &mut SweepReport, ns: &Namespace, rescued: u64, freed: &[Option<u64>]) {
        let counts = report.ns(ns);
        counts.rescued += rescued;
        for f in freed {
            match f {
                Some(size) => {
                    counts.deleted += 1;
                    counts.bytes_freed += size;
                }
                None => counts.vanished += 1,
            }
        }
    }

    async fn execute_local(
        &self,
        snap: &Snapshot,
        protected: &HashSet<Key>,
        keys: Vec<Key>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let (gate, states) = self.pins.gate(&keys);
        let mut done: Vec<Key> = Vec::with_capacity(keys.len());
        // take_due orders by key, so namespaces come in runs.
        let mut by_ns: BTreeMap<Namespace, Vec<Key>> = BTreeMap::new();
        for (k, st) in keys.iter().zip(&states) {
            match st {
                GateState::Pinned => {
                    report.ns(&k.namespace).rescued += 1;
                    done.push(k.clone());
                }
                GateState::Busy => {}
                GateState::Gated if !snap.has_source(&k.namespace) => {
                    report.ns(&k.namespace).rescued += 1;
                    done.push(k.clone());
                }
                GateState::Gated => by_ns
                    .entry(k.namespace.clone())
                    .or_default()
                    .push(k.clone()),
            }
        }
        for (ns, ks) in by_ns {
            let pinned = vec![false; ks.len()];
            let reasons = self
                .arbitrate_local(snap, &ns, &ks, &pinned, protected)
                .await?;
            let doomed: Vec<Digest> = ks
                .iter()
                .zip(&reasons)
                .filter(|(_, r)| r.is_none())
                .map(|(k, _)| k.digest)
                .collect();
            let mut freed = vec![None; doomed.len()];
            Self::delete_through(&self.tiers, &ns, &doomed, &mut freed).await?;
            Self::tally(report, &ns, (ks.len() - doomed.len()) as u64, &freed);
            done.extend(ks);
        }
        window_unstage(self.cfg.window_host.as_ref(), &done).await?;
        drop(gate);
        Ok(())
    }

    /// The fleet execute step for one batch: lock every key on the GC host,
    /// re-arbitrate in SQL under the locks, delete (kv rows inside the
    /// locked transaction, large entries while it holds), unstage, commit.
    async fn execute_fleet(
        &self,
        pins: &dyn PinClauses,
        snap: &Snapshot,
        protected: &HashSet<Key>,
        now: Timestamp,
        keys: Vec<Key>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let mut tx = pins.begin_batch(&keys).await?;
        let sql = tx.protected(&keys, &snap.tables, now).await?;
        let reasons = self.merge(&keys, sql, protected);
        let mut by_ns: BTreeMap<Namespace, (u64, Vec<Digest>)> = BTreeMap::new();
        for (k, r) in keys.iter().zip(&reasons) {
            let slot = by_ns.entry(k.namespace.clone()).or_default();
            if r.is_some() || !snap.has_source(&k.namespace) {
                slot.0 += 1;
            } else {
                slot.1.push(k.digest);
            }
        }
        for (ns, (rescued, doomed)) in by_ns {
            let mut freed = tx.delete_entries(&ns, &doomed).await?;
            Self::delete_through(&self.tiers[1..], &ns, &doomed, &mut freed).await?;
            Self::tally(report, &ns, rescued, &freed);
        }
        tx.unstage(&keys).await?;
        tx.commit().await
    }

    async fn mark(
        &self,
        snap: &Snapshot,
        protected: &HashSet<Key>,
        now: Timestamp,
        batch: usize,
        report: &mut SweepReport,
    ) -> Result<()> {
        let mut namespaces = BTreeSet::new();
        for tier in &self.tiers {
            namespaces.extend(tier.namespaces().await?);
        }
        let visible_after = now.plus(self.cfg.window);
        for ns in namespaces {
            if !snap.has_source(&ns) {
                report.unswept_namespaces.push(ns);
                continue;
            }
            for tier in &self.tiers {
                let mut after = None;
                loop {
                    let page = tier.scan(&ns, after, batch).await?;
                    let Some(last) = page.last() else { break };
                    after = Some(last.0);
                    let digests: Vec<Digest> = page.iter().map(|(d, _)| *d).collect();
                    let staged = self.cfg.window_host.staged_many(&ns, &digests).await?;
                    let fresh: Vec<(Key, u64)> = page
                        .iter()
                        .zip(staged)
                        .filter(|(_, s)| !*s)
                        .map(|((d, size), _)| (Key::new(ns.clone(), *d), *size))
                        .collect();
                    if fresh.is_empty() {
                        continue;
                    }
                    let keys: Vec<Key> = fresh.iter().map(|(k, _)| k.clone()).collect();
                    let reasons = match &self.cfg.fleet_pins {
                        Some(pins) => {
                            let sql = pins.arbitrate(&keys, &snap.tables, now).await?;
                            self.merge(&keys, sql, protected)
                        }
                        None => {
                            let pinned = self.pins.pinned_many(&keys);
                            self.arbitrate_local(snap, &ns, &keys, &pinned, protected)
                                .await?
                        }
                    };
                    let mut candidates = Vec::new();
                    let counts = report.ns(&ns);
                    counts.scanned += keys.len() as u64;
                    for ((key, size), reason) in fresh.into_iter().zip(reasons) {
                        match reason {
                            Some(ProtectReason::Pinned) => counts.protected.pinned += 1,
                            Some(ProtectReason::Live) => counts.protected.live += 1,
                            Some(ProtectReason::ProtectCallback) => {
                                counts.protected.protect_callback += 1
                            }
                            None => candidates.push(StagedCandidate {
                                key,
                                size,
                                visible_after,
                            }),
                        }
                    }
                    counts.staged += candidates.len() as u64;
                    self.cfg.window_host.stage(&candidates).await?;
                }
            }
        }
        Ok(())
    }
}

async fn window_unstage(window: &dyn WindowClauses, keys: &[Key]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    window.unstage(keys).await
}
