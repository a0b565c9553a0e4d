//! The sweep and the direct-delete arbitration.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use store_types::{
    fleet_swept_namespaces, BoundLivenessTable, CacheIndex, Digest, Engine, Error, ErrorKind, Key,
    LivenessTable, Namespace, PinClauses, ProtectReason, RefStore, Report, Result, StagedCandidate,
    SweepLockClause, Timestamp, WindowClauses,
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
    /// The kv engine's named references, if it holds any (ADR-024,
    /// ADR-045). They protect in **every** swept namespace, whatever made
    /// it swept (a policy, an embedder's source or table): non-fleet they
    /// are probed beside the sources, in a fleet their table is part of
    /// every arbitration. In a fleet the namespaces marked as using
    /// references are also swept (implicit `refs`) unless a node's policy
    /// row says `keep`.
    pub refs: Option<Arc<dyn RefStore>>,
    /// The kv engine's cache keys, if it holds any (ADR-048). Like the
    /// references they protect in every swept namespace (non-fleet probed,
    /// fleet bound into every arbitration); only a cache namespace's keys
    /// are ever removed by its bound, before a sweep marks.
    pub cache: Option<Arc<dyn CacheIndex>>,
}

impl fmt::Debug for GcConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcConfig")
            .field("window", &self.window)
            .field("shared_lock", &self.shared_lock.is_some())
            .field("fleet", &self.fleet_pins.is_some())
            .field("refs", &self.refs.is_some())
            .field("cache", &self.cache.is_some())
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
/// Fleet registrations made through this instance, by id (the rows
/// themselves live in the shared database).
type Tables = BTreeMap<SourceId, (Namespace, LivenessTable, String)>;

/// How old (by the database's clock) a deletion fence must be before a
/// sweep treats its sweeper as gone and finishes the delete itself. Long
/// enough for a live sweeper to finish one batch's media deletes.
pub const FENCE_GRACE: Duration = Duration::from_secs(300);

/// What makes namespaces swept and what protects their entries, as read at
/// one instant: at a sweep's start (to decide whether to run at all) and
/// again before every batch (so a policy changed, a source deregistered or
/// a table registered mid-sweep counts from the next batch on).
struct Snapshot {
    sources: Sources,
    /// Fleet: every table registered in the shared database.
    tables: Vec<BoundLivenessTable>,
    /// Fleet: the namespaces the policy rows sweep (ADR-045).
    policy_swept: BTreeSet<Namespace>,
}

impl Snapshot {
    fn has_source(&self, ns: &Namespace) -> bool {
        self.sources.contains_key(ns)
            || self.tables.iter().any(|t| &t.namespace == ns)
            || self.policy_swept.contains(ns)
    }

    fn is_empty(&self) -> bool {
        self.sources.is_empty() && self.tables.is_empty() && self.policy_swept.is_empty()
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
    /// A collector over `tiers` (kv first). Shared: sweeps and direct
    /// deletes run as tasks that own a handle (see [`Collector::sweep`]).
    pub fn new(tiers: Vec<Arc<dyn Engine>>, cfg: GcConfig) -> Arc<Self> {
        Arc::new(Collector {
            tiers,
            pins: PinRegistry::new(),
            sources: RwLock::new(BTreeMap::new()),
            tables: RwLock::new(BTreeMap::new()),
            protect: RwLock::new(None),
            next_id: AtomicU64::new(1),
            sweep_lock: tokio::sync::Mutex::new(()),
            cfg,
        })
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

    /// Registers a fleet liveness table for `ns` in the shared database
    /// (idempotent): from then on every node's sweep consults it.
    /// [`Error::Config`] on a non-fleet collector.
    pub async fn register_liveness_table(
        &self,
        ns: Namespace,
        table: LivenessTable,
        registrant: &str,
    ) -> Result<SourceId> {
        let Some(pins) = &self.cfg.fleet_pins else {
            return Err(Error::Config(
                "liveness tables are the fleet form; a non-fleet store takes in-process callbacks"
                    .into(),
            ));
        };
        pins.register_liveness_table(&ns, &table, registrant)
            .await?;
        let id = SourceId(self.next_id.fetch_add(1, Ordering::Relaxed));
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (ns, table, registrant.to_string()));
        Ok(id)
    }

    /// Removes fleet registrations of `table` for `ns` from the shared
    /// database: `registrant`'s, or with `None` everyone's; `false` if there
    /// was none.
    pub async fn deregister_liveness_table(
        &self,
        ns: &Namespace,
        table: &LivenessTable,
        registrant: Option<&str>,
    ) -> Result<bool> {
        let Some(pins) = &self.cfg.fleet_pins else {
            return Ok(false);
        };
        self.tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, (n, t, r)| {
                !(n == ns && t == table && registrant.is_none_or(|who| who == r))
            });
        pins.deregister_liveness_table(ns, table, registrant).await
    }

    /// Whether this collector arbitrates in SQL (fleet mode).
    pub fn is_fleet(&self) -> bool {
        self.cfg.fleet_pins.is_some()
    }

    /// Removes a registration made through this instance (a callback, or a
    /// fleet table — whose shared row is deleted); `false` if unknown.
    pub async fn deregister_liveness_source(&self, id: SourceId) -> Result<bool> {
        let table = self
            .tables
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        if let Some((ns, table, registrant)) = table {
            return self
                .deregister_liveness_table(&ns, &table, Some(&registrant))
                .await;
        }
        let mut sources = self.sources_mut();
        let mut found = false;
        sources.retain(|_, v| {
            let before = v.len();
            v.retain(|(i, _)| *i != id);
            found |= v.len() != before;
            !v.is_empty()
        });
        Ok(found)
    }

    /// Installs (or with `None` removes) the protect callback.
    pub fn set_protect(&self, cb: Option<Arc<dyn ProtectCallback>>) {
        *self.protect.write().unwrap_or_else(|p| p.into_inner()) = cb;
    }

    fn sources_mut(&self) -> std::sync::RwLockWriteGuard<'_, Sources> {
        self.sources.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The sources a sweep or delete consults: in-process callbacks, and
    /// (fleet) every table registered in the shared database by any node
    /// and the namespaces the fleet's policy rows sweep.
    async fn snapshot(&self) -> Result<Snapshot> {
        let (tables, policy_swept) = match &self.cfg.fleet_pins {
            Some(pins) => {
                let tables = pins.liveness_tables().await?;
                let rows = pins.gc_policies().await?;
                let marked = match &self.cfg.refs {
                    Some(r) => r.ref_namespaces().await?,
                    None => Vec::new(),
                };
                (tables, fleet_swept_namespaces(&rows, &marked))
            }
            None => (Vec::new(), BTreeSet::new()),
        };
        Ok(Snapshot {
            sources: self
                .sources
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            tables,
            policy_swept,
        })
    }

    /// Fleet: `tables` plus the references table and the cache-key table
    /// bound to every namespace of `keys`, so references and cache keys
    /// protect whatever made the namespace swept.
    fn with_refs_table(
        &self,
        tables: &[BoundLivenessTable],
        keys: &[Key],
    ) -> Vec<BoundLivenessTable> {
        let mut out = tables.to_vec();
        let own = [
            self.cfg.refs.as_ref().and_then(|r| r.liveness_table()),
            self.cfg.cache.as_ref().and_then(|c| c.liveness_table()),
        ];
        for table in own.into_iter().flatten() {
            let namespaces: BTreeSet<&Namespace> = keys.iter().map(|k| &k.namespace).collect();
            for ns in namespaces {
                out.push(BoundLivenessTable {
                    namespace: ns.clone(),
                    table: table.clone(),
                    digest_is_text: false,
                });
            }
        }
        out
    }

    /// The time GC decisions are made at: the window host's clock when it
    /// has one (a SQL host: the database's clock, the one clock of a fleet),
    /// else this process's clock.
    async fn now(&self) -> Result<Timestamp> {
        Ok(match self.cfg.window_host.now().await? {
            Some(t) => t,
            None => self.cfg.clock.now(),
        })
    }

    fn protect_cb(&self) -> Option<Arc<dyn ProtectCallback>> {
        self.protect
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks the protect callback, if any.
    async fn protected_set(&self) -> Result<HashSet<Key>> {
        match self.protect_cb() {
            Some(cb) => Ok(cb.protected_keys().await?.into_iter().collect()),
            None => Ok(HashSet::new()),
        }
    }

    /// OR over every in-process source of `ns`, the references and the
    /// cache keys;
    /// `false` when nothing names a key.
    async fn probe(&self, sources: &Sources, ns: &Namespace, keys: &[Key]) -> Result<Vec<bool>> {
        let mut live = vec![false; keys.len()];
        if keys.is_empty() {
            return Ok(live);
        }
        if let Some(refs) = &self.cfg.refs {
            let digests: Vec<Digest> = keys.iter().map(|k| k.digest).collect();
            let answer = refs.referenced(ns, &digests).await;
            or_into(&mut live, answer, "probe references", ns)?;
        }
        if let Some(cache) = &self.cfg.cache {
            let digests: Vec<Digest> = keys.iter().map(|k| k.digest).collect();
            let answer = cache.cached(ns, &digests).await;
            or_into(&mut live, answer, "probe cache keys", ns)?;
        }
        for (_, src) in sources.get(ns).into_iter().flatten() {
            let answer = src.probe(keys).await;
            or_into(&mut live, answer, "probe liveness source", ns)?;
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

    /// Deletes `digests` of `ns` across `tiers` in order, each from the
    /// first tier that holds it; records the freed size of each (`None`
    /// when no tier held it) into `freed`, leaving entries already `Some`.
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

    /// Deletes one key from **every** tier (a copy may sit in both after a
    /// threshold change): the summed freed size, `None` when no tier held
    /// it.
    async fn delete_everywhere(tiers: &[Arc<dyn Engine>], key: &Key) -> Result<Option<u64>> {
        let mut freed = None;
        for tier in tiers {
            if let Some(size) = tier.delete_many(&key.namespace, &[key.digest]).await?[0] {
                freed = Some(freed.unwrap_or(0) + size);
            }
        }
        Ok(freed)
    }

    /// Whether each key (all of one namespace or not) exists in any tier.
    async fn exists(&self, keys: &[Key]) -> Result<Vec<bool>> {
        let mut out = vec![false; keys.len()];
        let mut by_ns: BTreeMap<&Namespace, Vec<usize>> = BTreeMap::new();
        for (i, k) in keys.iter().enumerate() {
            by_ns.entry(&k.namespace).or_default().push(i);
        }
        for (ns, idx) in by_ns {
            for tier in &self.tiers {
                let ask: Vec<usize> = idx.iter().copied().filter(|i| !out[*i]).collect();
                if ask.is_empty() {
                    break;
                }
                let digests: Vec<Digest> = ask.iter().map(|i| keys[*i].digest).collect();
                for (i, present) in ask.into_iter().zip(tier.has_many(ns, &digests).await?) {
                    out[i] = present;
                }
            }
        }
        Ok(out)
    }

    /// A direct delete: refuses protected keys with [`Error::GcRefuse`],
    /// answers [`Error::Missing`] when no tier holds the key, and returns
    /// the freed size otherwise (every tier's copy is removed).
    ///
    /// Cancel-safe: the arbitration and the delete run in a task of their
    /// own that holds the protection (delete gate, or fleet batch and
    /// fence) until every media delete has finished; dropping this future
    /// only stops waiting for the answer.
    pub async fn delete(self: &Arc<Self>, key: &Key) -> Result<u64> {
        let this = Arc::clone(self);
        let key = key.clone();
        join(tokio::spawn(async move { this.delete_owned(key).await })).await
    }

    async fn delete_owned(&self, key: Key) -> Result<u64> {
        let keys = [key.clone()];
        let snap = self.snapshot().await?;
        let protected = self
            .protected_set()
            .await
            .map_err(|e| Error::backend(e.kind(), "ask protect callback").with_source(e))?;
        let refuse = |reason| Error::GcRefuse {
            key: key.clone(),
            reason,
        };
        if let Some(pins) = &self.cfg.fleet_pins {
            let started = Instant::now();
            let mut attempt = 0u32;
            loop {
                // Read the clock before the batch: its transaction holds a
                // connection of the same pool.
                let now = self.now().await?;
                let mut batch = pins.begin_batch(&keys).await?;
                if batch.fenced(&keys).await?[0] {
                    // Another delete of this key is in flight: let it
                    // finish (its fence is its own to clear), then decide.
                    drop(batch);
                    if started.elapsed() >= BUSY_WAIT {
                        return Err(Error::backend(ErrorKind::TimedOut, "wait for deletion fence")
                            .with_key(&key)
                            .with_source(format!(
                                "the key is being deleted by another delete (fence held for more than {}s); retry",
                                BUSY_WAIT.as_secs()
                            )));
                    }
                    tokio::time::sleep(backoff(attempt)).await;
                    attempt += 1;
                    continue;
                }
                let tables = self.with_refs_table(&snap.tables, &keys);
                let sql = batch.protected(&keys, &tables, now).await?;
                if let Some(reason) = self.merge(&keys, sql, &protected)[0] {
                    return Err(refuse(reason));
                }
                let mut freed = batch.delete_entries(&key.namespace, &[key.digest]).await?[0];
                batch.fence(&keys).await?;
                batch.unstage(&keys).await?;
                batch.commit().await?;
                // The fence now protects the delete in flight (ADR-021).
                let large = retried(|| Self::delete_everywhere(&self.tiers[1..], &key)).await?;
                if let Some(size) = large {
                    freed = Some(freed.unwrap_or(0) + size);
                }
                retried(|| pins.unfence(&keys)).await?;
                return freed.ok_or(Error::Missing);
            }
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
        let freed = Self::delete_everywhere(&self.tiers, &key).await?;
        self.cfg.window_host.unstage(&keys).await?;
        drop(gate);
        freed.ok_or(Error::Missing)
    }

    /// One GC pass (ADR-012 §1, §5, §6.7): lock, abort checks, execute the
    /// due window, mark new garbage, maintenance, report. `Err` only for
    /// operational failure; deliberate no-ops are `Ok` with `aborted` set.
    ///
    /// Cancel-safe: the pass runs in a task of its own. Dropping this
    /// future (a client disconnecting, a `timeout`, a `select!`) asks the
    /// task to stop at the next batch boundary; a batch in progress keeps
    /// its protection (gate, or locked batch and fences) until every media
    /// delete of that batch has finished, then the task releases the sweep
    /// locks and ends.
    pub async fn sweep(self: &Arc<Self>, opts: &SweepOptions) -> Result<SweepReport> {
        let stop = Arc::new(AtomicBool::new(false));
        let _stop_on_drop = StopOnDrop(Arc::clone(&stop));
        let this = Arc::clone(self);
        let opts = opts.clone();
        join(tokio::spawn(
            async move { this.sweep_owned(&opts, &stop).await },
        ))
        .await
    }

    async fn sweep_owned(&self, opts: &SweepOptions, stop: &AtomicBool) -> Result<SweepReport> {
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
        let mut cp = Checkpoint { stop, lock: shared };
        let result = self.sweep_locked(started, batch, &mut cp).await;
        // Release explicitly so the next sweeper (on any node) finds the
        // lock free as soon as this call returns. A failed release (its
        // session died, which frees the lock anyway) never replaces the
        // pass's own outcome.
        if let Some(guard) = cp.lock {
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %Report::new(&e), "releasing the fleet sweep lock failed (the lock ends with its session)");
            }
        }
        match &result {
            Ok(r) => tracing::info!(
                deleted = r.total.deleted,
                bytes_freed = r.total.bytes_freed,
                staged = r.total.staged,
                rescued = r.total.rescued,
                vanished = r.total.vanished,
                resumed_deletes = r.resumed_deletes,
                aborted = ?r.aborted,
                ms = r.duration.as_millis() as u64,
                "sweep finished"
            ),
            Err(e) => tracing::warn!(error = %Report::new(e), "sweep failed"),
        }
        result
    }

    async fn sweep_locked(
        &self,
        started: Instant,
        batch: usize,
        cp: &mut Checkpoint<'_>,
    ) -> Result<SweepReport> {
        let snap = self.snapshot().await?;
        if snap.is_empty() {
            return Ok(SweepReport::aborted(
                GcAbortCause::NoLivenessSources,
                started.elapsed(),
            ));
        }
        let protected = match self.protected_set().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %Report::new(&e), "the protect callback failed; the sweep deletes nothing");
                let mut report =
                    SweepReport::aborted(GcAbortCause::ProtectFailed, started.elapsed());
                report.protect_error = Some(e);
                return Ok(report);
            }
        };
        let mut report = SweepReport::default();
        match self.sweep_phases(&protected, batch, cp, &mut report).await {
            Ok(()) => {
                report.finish(started.elapsed());
                Ok(report)
            }
            Err(cause) => {
                report.finish(started.elapsed());
                Err(incomplete(cause, &report))
            }
        }
    }

    async fn sweep_phases(
        &self,
        protected: &HashSet<Key>,
        batch: usize,
        cp: &mut Checkpoint<'_>,
        report: &mut SweepReport,
    ) -> Result<()> {
        if let Some(pins) = &self.cfg.fleet_pins {
            // A fence that cannot be finished (an undeletable object, a
            // media error) must not stop every sweep of the fleet: it stays
            // and is retried by the next sweep.
            if let Err(e) = self
                .finish_stale_fences(pins.as_ref(), batch, cp, report)
                .await
            {
                tracing::warn!(error = %Report::new(&e), "finishing a crashed sweeper's deletes failed; its fences stay for the next sweep");
            }
        }
        let now = self.now().await?;
        self.execute_due(protected, now, batch, cp, report).await?;
        let now = self.now().await?;
        self.mark(protected, batch, cp, report).await?;
        if let Some(pins) = &self.cfg.fleet_pins {
            report.reaped_pins = pins.reap_expired(now).await?;
        }
        for tier in &self.tiers {
            report.reaped_stages += tier.maintain(now).await?;
        }
        Ok(())
    }

    /// Finishes the deletes of sweepers that fenced keys and never cleared
    /// the fences (ADR-021): deletes the large-tier copies again
    /// (idempotent) and clears the fences.
    async fn finish_stale_fences(
        &self,
        pins: &dyn PinClauses,
        batch: usize,
        cp: &mut Checkpoint<'_>,
        report: &mut SweepReport,
    ) -> Result<()> {
        loop {
            cp.check().await?;
            let stale = pins.stale_fences(FENCE_GRACE, batch).await?;
            if stale.is_empty() {
                return Ok(());
            }
            let mut by_ns: BTreeMap<Namespace, Vec<Digest>> = BTreeMap::new();
            for k in &stale {
                by_ns.entry(k.namespace.clone()).or_default().push(k.digest);
            }
            for (ns, digests) in by_ns {
                let mut freed = vec![None; digests.len()];
                Self::delete_through(&self.tiers[1..], &ns, &digests, &mut freed).await?;
                report.resumed_deletes += freed.iter().filter(|f| f.is_some()).count() as u64;
            }
            pins.unfence(&stale).await?;
            if stale.len() < batch {
                return Ok(());
            }
        }
    }

    async fn execute_due(
        &self,
        protected: &HashSet<Key>,
        now: Timestamp,
        batch: usize,
        cp: &mut Checkpoint<'_>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let window = &self.cfg.window_host;
        let mut after: Option<Key> = None;
        loop {
            cp.check().await?;
            let due = window.take_due(now, after.as_ref(), batch).await?;
            let Some(last) = due.last() else { break };
            after = Some(last.key.clone());
            let keys: Vec<Key> = due.iter().map(|c| c.key.clone()).collect();
            // Re-read per batch: a source deregistered, a policy changed or
            // a table registered since the sweep began counts now.
            let snap = self.snapshot().await?;
            match &self.cfg.fleet_pins {
                Some(pins) => {
                    self.execute_fleet(pins.as_ref(), &snap, protected, now, keys, report)
                        .await?
                }
                None => self.execute_local(&snap, protected, keys, report).await?,
            }
        }
        Ok(())
    }

    /// Records the outcome of one namespace's doomed and rescued keys:
    /// a rescued key whose entry is gone counts as vanished.
    fn tally(report: &mut SweepReport, ns: &Namespace, rescued: &[bool], freed: &[Option<u64>]) {
        let counts = report.ns(ns);
        for present in rescued {
            if *present {
                counts.rescued += 1;
            } else {
                counts.vanished += 1;
            }
        }
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

    /// The non-fleet execute step for one batch of due keys. Keys another
    /// delete holds (a direct delete deciding) are retried once it is done,
    /// so every due key is counted and unstaged exactly once.
    async fn execute_local(
        &self,
        snap: &Snapshot,
        protected: &HashSet<Key>,
        keys: Vec<Key>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let mut pending = keys;
        while !pending.is_empty() {
            let (gate, states) = self.pins.gate(&pending);
            let mut done: Vec<Key> = Vec::with_capacity(pending.len());
            let mut busy: Vec<Key> = Vec::new();
            let mut rescued: Vec<Key> = Vec::new();
            // take_due orders by key, so namespaces come in runs.
            let mut by_ns: BTreeMap<Namespace, Vec<Key>> = BTreeMap::new();
            for (k, st) in pending.iter().zip(&states) {
                match st {
                    GateState::Pinned => rescued.push(k.clone()),
                    GateState::Busy => busy.push(k.clone()),
                    GateState::Gated if !snap.has_source(&k.namespace) => rescued.push(k.clone()),
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
                let mut doomed: Vec<Digest> = Vec::new();
                for (k, r) in ks.into_iter().zip(&reasons) {
                    match r {
                        Some(_) => rescued.push(k),
                        None => {
                            doomed.push(k.digest);
                            done.push(k);
                        }
                    }
                }
                let mut freed = vec![None; doomed.len()];
                Self::delete_through(&self.tiers, &ns, &doomed, &mut freed).await?;
                Self::tally(report, &ns, &[], &freed);
            }
            self.tally_rescued(report, &rescued).await?;
            done.extend(rescued);
            window_unstage(self.cfg.window_host.as_ref(), &done).await?;
            drop(gate);
            if !busy.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            pending = busy;
        }
        Ok(())
    }

    /// Counts rescued keys, as vanished when their entry is already gone.
    async fn tally_rescued(&self, report: &mut SweepReport, rescued: &[Key]) -> Result<()> {
        if rescued.is_empty() {
            return Ok(());
        }
        let present = self.exists(rescued).await?;
        for (k, p) in rescued.iter().zip(present) {
            Self::tally(report, &k.namespace, &[p], &[]);
        }
        Ok(())
    }

    /// The fleet execute step for one batch: lock every key on the GC host,
    /// re-arbitrate in SQL under the locks, delete the kv rows and write a
    /// deletion fence for every doomed key inside the locked transaction,
    /// unstage, commit; then delete the large-tier copies — protected by
    /// the fences, not by the session's locks, so losing the session
    /// cannot expose a delete in flight — and clear the fences (ADR-021).
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
        // A key another delete has fenced is left alone — not deleted, not
        // fenced again, not unstaged: its fencer clears the fence when its
        // delete is done, and a later sweep finds the key gone (vanished).
        let fenced = tx.fenced(&keys).await?;
        let keys: Vec<Key> = keys
            .into_iter()
            .zip(fenced)
            .filter(|(_, f)| !*f)
            .map(|(k, _)| k)
            .collect();
        let tables = self.with_refs_table(&snap.tables, &keys);
        let sql = tx.protected(&keys, &tables, now).await?;
        let reasons = self.merge(&keys, sql, protected);
        let mut by_ns: BTreeMap<Namespace, Vec<Digest>> = BTreeMap::new();
        let mut rescued: Vec<Key> = Vec::new();
        for (k, r) in keys.iter().zip(&reasons) {
            if r.is_some() || !snap.has_source(&k.namespace) {
                rescued.push(k.clone());
            } else {
                by_ns.entry(k.namespace.clone()).or_default().push(k.digest);
            }
        }
        let mut freed_by_ns = Vec::with_capacity(by_ns.len());
        // Only keys whose kv delete freed nothing can have a large copy to
        // delete (fall-through order): fence just those.
        let mut fence_keys: Vec<Key> = Vec::new();
        for (ns, doomed) in by_ns {
            let freed = tx.delete_entries(&ns, &doomed).await?;
            for (d, f) in doomed.iter().zip(&freed) {
                if f.is_none() {
                    fence_keys.push(Key::new(ns.clone(), *d));
                }
            }
            freed_by_ns.push((ns, doomed, freed));
        }
        tx.fence(&fence_keys).await?;
        tx.unstage(&keys).await?;
        tx.commit().await?;
        // Committed: the kv deletes count now, whatever happens next.
        for (ns, _, freed) in &freed_by_ns {
            let kv_freed: Vec<Option<u64>> =
                freed.iter().copied().filter(Option::is_some).collect();
            Self::tally(report, ns, &[], &kv_freed);
        }
        for (ns, doomed, freed) in &freed_by_ns {
            let pending: Vec<Digest> = doomed
                .iter()
                .zip(freed)
                .filter(|(_, f)| f.is_none())
                .map(|(d, _)| *d)
                .collect();
            if pending.is_empty() {
                continue;
            }
            let pending = &pending;
            let large = retried(|| async move {
                let mut out = vec![None; pending.len()];
                Self::delete_through(&self.tiers[1..], ns, pending, &mut out).await?;
                Ok(out)
            })
            .await?;
            Self::tally(report, ns, &[], &large);
        }
        retried(|| pins.unfence(&fence_keys)).await?;
        self.tally_rescued(report, &rescued).await
    }

    async fn mark(
        &self,
        protected: &HashSet<Key>,
        batch: usize,
        cp: &mut Checkpoint<'_>,
        report: &mut SweepReport,
    ) -> Result<()> {
        let mut namespaces = BTreeSet::new();
        for tier in &self.tiers {
            namespaces.extend(tier.namespaces().await?);
        }
        for ns in namespaces {
            if !self.snapshot().await?.has_source(&ns) {
                report.unswept_namespaces.push(ns);
                continue;
            }
            for (t, tier) in self.tiers.iter().enumerate() {
                let mut after = None;
                loop {
                    cp.check().await?;
                    // The window starts when the candidate is staged, not
                    // when the sweep began.
                    let now = self.now().await?;
                    let visible_after = now.plus(self.cfg.window);
                    let page = tier.scan(&ns, after, batch).await?;
                    let Some(last) = page.last() else { break };
                    after = Some(last.0);
                    let digests: Vec<Digest> = page.iter().map(|(d, _)| *d).collect();
                    let mut skip = self.cfg.window_host.staged_many(&ns, &digests).await?;
                    // A copy also held by an earlier tier (after a threshold
                    // change) was arbitrated with that tier: count it once.
                    for earlier in &self.tiers[..t] {
                        let held = earlier.has_many(&ns, &digests).await?;
                        for (s, h) in skip.iter_mut().zip(held) {
                            *s |= h;
                        }
                    }
                    let fresh: Vec<(Key, u64)> = page
                        .iter()
                        .zip(skip)
                        .filter(|(_, s)| !*s)
                        .map(|((d, size), _)| (Key::new(ns.clone(), *d), *size))
                        .collect();
                    if fresh.is_empty() {
                        continue;
                    }
                    let keys: Vec<Key> = fresh.iter().map(|(k, _)| k.clone()).collect();
                    // Re-read per page, as the execute phase does per batch.
                    let snap = self.snapshot().await?;
                    if !snap.has_source(&ns) {
                        break;
                    }
                    let reasons = match &self.cfg.fleet_pins {
                        Some(pins) => {
                            let tables = self.with_refs_table(&snap.tables, &keys);
                            let sql = pins.arbitrate(&keys, &tables, now).await?;
                            self.merge(&keys, sql, protected)
                        }
                        None => {
                            let pinned = self.pins.pinned_many(&keys);
                            self.arbitrate_local(&snap, &ns, &keys, &pinned, protected)
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

/// ORs one liveness answer for `live.len()` keys of `ns` into `live`; a
/// failed or misaligned answer is an error naming `op`.
fn or_into(
    live: &mut [bool],
    answer: Result<Vec<bool>>,
    op: &'static str,
    ns: &Namespace,
) -> Result<()> {
    let answer = answer.map_err(|e| {
        Error::backend(e.kind(), op)
            .with_target(format!("of namespace {ns}"))
            .with_source(e)
    })?;
    if answer.len() != live.len() {
        return Err(Error::backend(ErrorKind::InvalidData, op)
            .with_target(format!("of namespace {ns}"))
            .with_source(format!(
                "it answered {} values for {} keys",
                answer.len(),
                live.len()
            )));
    }
    for (l, a) in live.iter_mut().zip(answer) {
        *l |= a;
    }
    Ok(())
}

async fn window_unstage(window: &dyn WindowClauses, keys: &[Key]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    window.unstage(keys).await
}

/// The error of a sweep that failed: `cause` as is when nothing was
/// committed before it, else [`Error::SweepIncomplete`] with the counts of
/// what was.
fn incomplete(cause: Error, report: &SweepReport) -> Error {
    let t = &report.total;
    let did = t.deleted + t.rescued + t.vanished + t.staged + report.resumed_deletes;
    if did == 0 {
        return cause;
    }
    Error::SweepIncomplete {
        cause: Box::new(cause),
        deleted: t.deleted,
        bytes_freed: t.bytes_freed,
        rescued: t.rescued,
        vanished: t.vanished,
        staged: t.staged,
    }
}

/// How long a fleet direct delete waits for another delete of its key.
const BUSY_WAIT: Duration = Duration::from_secs(30);

/// 2 ms doubling to 200 ms.
fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((2u64 << attempt.min(7)).min(200))
}

/// Runs `op` up to three times (50 ms, then 500 ms apart): the steps after a
/// fleet batch's commit, which hold their keys' fences, retry transient
/// failures ([`Error::is_transient`]) before they give up and leave the
/// fences to the next sweep; any other failure gives up at once.
async fn retried<T, F, Fut>(mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut last = None;
    for pause in [
        Duration::from_millis(50),
        Duration::from_millis(500),
        Duration::ZERO,
    ] {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => {
                tracing::warn!(error = %Report::new(&e), "a fenced delete step failed; retrying");
                last = Some(e);
                tokio::time::sleep(pause).await;
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// Sets the stop flag of a sweep task when the caller's future is dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What a sweep checks at every batch boundary: that its caller is still
/// waiting, and (fleet) that it still holds the sweep lock.
struct Checkpoint<'a> {
    stop: &'a AtomicBool,
    lock: Option<Box<dyn store_types::SweepLockGuard>>,
}

impl Checkpoint<'_> {
    /// Stops the sweep (with an error) at a batch boundary once its caller
    /// has gone or its fleet sweep lock was lost.
    async fn check(&mut self) -> Result<()> {
        if self.stop.load(Ordering::SeqCst) {
            return Err(Error::backend(ErrorKind::Interrupted, "sweep")
                .with_source("stopped at a batch boundary: its caller went away"));
        }
        if let Some(lock) = self.lock.as_mut() {
            if !lock.held().await? {
                return Err(Error::backend(ErrorKind::ConnectionLost, "sweep").with_source(
                    "stopped at a batch boundary: the fleet sweep lock was lost (its session ended)",
                ));
            }
        }
        Ok(())
    }
}

/// Awaits a GC task: its result, its panic re-raised, or an error when the
/// runtime is shutting down.
async fn join<T>(task: tokio::task::JoinHandle<Result<T>>) -> Result<T> {
    match task.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::backend(ErrorKind::Interrupted, "run GC task").with_source(e)),
    }
}
