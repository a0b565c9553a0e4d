//! The sweep and the direct-delete arbitration: the [`Collector`] and its
//! set-up here; each step in a file of its own — `arbitrate.rs` (who
//! protects a key), `mark.rs` (staging unprotected entries),
//! `execute.rs` (deleting due candidates, in process or in fleet batches),
//! `fences.rs` (deletion fences of dead sweepers), `delete.rs` (the direct
//! delete), `sweep.rs` (the sweep task and its phases), `support.rs`
//! (retries, checkpoints, joins).

mod arbitrate;
mod delete;
mod execute;
mod fences;
mod mark;
mod support;
mod sweep;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use store_types::{
    fleet_swept_namespaces, BatchClauses, BoundLivenessTable, CacheIndex, Digest, Engine, Error,
    ErrorKind, Key, LivenessTable, Namespace, PinClauses, ProtectReason, RefStore, Report, Result,
    StagedCandidate, SweepLockClause, Timestamp, WindowClauses, WindowDeletes,
};

use crate::pins::GateState;
use crate::{
    Clock, GcAbortCause, LivenessSource, PinRegistry, ProtectCallback, SourceId, SweepReport,
};
use support::*;

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
    /// The window host's deletes that unstage in the same transaction, set
    /// only when the host is also the first tier (the kv engine) of a
    /// store that is not a fleet (ADR-081): a non-fleet sweep then deletes
    /// that tier's copies through it.
    pub window_deletes: Option<Arc<dyn WindowDeletes>>,
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
            .field("window_deletes", &self.window_deletes.is_some())
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
}
