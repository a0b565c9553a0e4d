//! The sweep and the direct-delete arbitration.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use store_types::{
    Digest, Engine, Error, Key, Namespace, ProtectReason, Result, StagedCandidate, SweepLockClause,
    WindowClauses,
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
}

impl fmt::Debug for GcConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GcConfig")
            .field("window", &self.window)
            .field("shared_lock", &self.shared_lock.is_some())
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

/// Runs sweeps and arbitrates direct deletes over an instance's tiers.
///
/// Tiers are consulted in order (kv first, then large): the fall-through
/// rule of ADR-012 §6.1.
pub struct Collector {
    tiers: Vec<Arc<dyn Engine>>,
    pins: PinRegistry,
    sources: RwLock<Sources>,
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

/// Protection found for a batch of keys of one namespace.
struct Arbitration {
    reasons: Vec<Option<ProtectReason>>,
}

impl Collector {
    /// A collector over `tiers` (kv first).
    pub fn new(tiers: Vec<Arc<dyn Engine>>, cfg: GcConfig) -> Self {
        Collector {
            tiers,
            pins: PinRegistry::new(),
            sources: RwLock::new(BTreeMap::new()),
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

    /// Removes a registration; `false` if it was not registered.
    pub fn deregister_liveness_source(&self, id: SourceId) -> bool {
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

    fn sources_snapshot(&self) -> Sources {
        self.sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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

    /// OR over every source of `ns`; `false` everywhere when it has none.
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

    /// Arbitrates keys of one namespace that are known unpinned.
    async fn arbitrate(
        &self,
        sources: &Sources,
        ns: &Namespace,
        keys: &[Key],
        pinned: &[bool],
        protected: &HashSet<Key>,
    ) -> Result<Arbitration> {
        let unpinned: Vec<Key> = keys
            .iter()
            .zip(pinned)
            .filter(|(_, p)| !**p)
            .map(|(k, _)| k.clone())
            .collect();
        let mut live = self.probe(sources, ns, &unpinned).await?.into_iter();
        let reasons = keys
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
            .collect();
        Ok(Arbitration { reasons })
    }

    /// Deletes `digests` of `ns` across the tiers in order; returns the freed
    /// size of each (`None` when no tier held it).
    async fn delete_through(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        let mut freed: Vec<Option<u64>> = vec![None; digests.len()];
        for tier in &self.tiers {
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
        Ok(freed)
    }

    /// A direct delete: refuses protected keys with [`Error::GcRefuse`],
    /// answers [`Error::Missing`] when no tier holds the key, and returns
    /// the freed size otherwise.
    pub async fn delete(&self, key: &Key) -> Result<u64> {
        let keys = [key.clone()];
        let gate = loop {
            let (gate, states) = self.pins.gate(&keys);
            match states[0] {
                GateState::Pinned => {
                    return Err(Error::GcRefuse {
                        key: key.clone(),
                        reason: ProtectReason::Pinned,
                    })
                }
                GateState::Gated => break gate,
                // Another delete of the same key is deciding; let it finish.
                GateState::Busy => tokio::time::sleep(Duration::from_millis(1)).await,
            }
        };
        let sources = self.sources_snapshot();
        let protected = self
            .protected_set()
            .await
            .map_err(|e| Error::Backend(format!("protect callback failed: {e}")))?;
        let arb = self
            .arbitrate(&sources, &key.namespace, &keys, &[false], &protected)
            .await?;
        if let Some(reason) = arb.reasons[0] {
            return Err(Error::GcRefuse {
                key: key.clone(),
                reason,
            });
        }
        let freed = self.delete_through(&key.namespace, &[key.digest]).await?;
        self.cfg.window_host.unstage(&keys).await?;
        drop(gate);
        freed[0].ok_or(Error::Missing)
    }

    /// One GC pass (ADR-012 §1, §5, §6.7): lock, abort checks, execute the
    /// due window, mark new garbage, report. `Err` only for operational
    /// failure; deliberate no-ops are `Ok` with `aborted` set.
    pub async fn sweep(&self, opts: &SweepOptions) -> Result<SweepReport> {
        let started = Instant::now();
        let batch = opts.batch.max(1);
        let Ok(_local) = self.sweep_lock.try_lock() else {
            return Ok(SweepReport::aborted(
                GcAbortCause::SweeperLock,
                started.elapsed(),
            ));
        };
        let _shared = match &self.cfg.shared_lock {
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
        let sources = self.sources_snapshot();
        if sources.is_empty() {
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
        self.execute_due(&sources, &protected, now, batch, &mut report)
            .await?;
        self.mark(&sources, &protected, now, batch, &mut report)
            .await?;
        report.finish(started.elapsed());
        Ok(report)
    }

    async fn execute_due(
        &self,
        sources: &Sources,
        protected: &HashSet<Key>,
        now: store_types::Timestamp,
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
            let (gate, states) = self.pins.gate(&keys);
            let mut done: Vec<Key> = Vec::with_capacity(keys.len());
            // Group gated keys by namespace (take_due orders by key, so
            // namespaces come in runs).
            let mut by_ns: BTreeMap<Namespace, Vec<Key>> = BTreeMap::new();
            for (k, st) in keys.iter().zip(&states) {
                match st {
                    GateState::Pinned => {
                        report.ns(&k.namespace).rescued += 1;
                        done.push(k.clone());
                    }
                    GateState::Busy => {}
                    GateState::Gated if !sources.contains_key(&k.namespace) => {
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
                let arb = self
                    .arbitrate(sources, &ns, &ks, &pinned, protected)
                    .await?;
                let mut doomed = Vec::new();
                for (k, r) in ks.iter().zip(&arb.reasons) {
                    if r.is_some() {
                        report.ns(&ns).rescued += 1;
                    } else {
                        doomed.push(k.digest);
                    }
                    done.push(k.clone());
                }
                let freed = self.delete_through(&ns, &doomed).await?;
                let counts = report.ns(&ns);
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
            window.unstage(&done).await?;
            drop(gate);
        }
        Ok(())
    }

    async fn mark(
        &self,
        sources: &Sources,
        protected: &HashSet<Key>,
        now: store_types::Timestamp,
        batch: usize,
        report: &mut SweepReport,
    ) -> Result<()> {
        let mut namespaces = BTreeSet::new();
        for tier in &self.tiers {
            namespaces.extend(tier.namespaces().await?);
        }
        let visible_after = now.plus(self.cfg.window);
        for ns in namespaces {
            if !sources.contains_key(&ns) {
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
                    let pinned = self.pins.pinned_many(&keys);
                    let arb = self
                        .arbitrate(sources, &ns, &keys, &pinned, protected)
                        .await?;
                    let mut candidates = Vec::new();
                    let counts = report.ns(&ns);
                    counts.scanned += keys.len() as u64;
                    for ((key, size), reason) in fresh.into_iter().zip(arb.reasons) {
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
