//! Named references and per-namespace GC policies (ADR-024).
//!
//! [`Refs`] is the library form of references: `(namespace, name) →
//! digest` rows in the kv engine's database ([`store_types::RefStore`]).
//! [`Refs::set`] runs ADR-012's embedder protocol in one call: it pins the
//! entry (refusing a missing one), makes sure the namespace's references
//! protect entries from GC, commits the reference, and only then lets the
//! pin go — so at no instant is the entry unprotected.
//!
//! A namespace's [`GcPolicy`] decides what GC may delete there:
//!
//! | policy | garbage is | registered source |
//! |---|---|---|
//! | `Refs` | unpinned entries no reference points at | the references (fleet: the refs table) |
//! | `Unreferenced` | every unpinned, unreferenced entry, from the first sweep on | the references if the engine holds any, else a source reporting nothing live |
//! | `Keep` | nothing: never swept | none |
//! | `MaxAge(d)` | unpinned, unreferenced entries older than `d` | references + age (non-fleet only) |
//!
//! A namespace without an explicit policy is `Keep` until a reference is
//! first set in it, and `Refs` from then on (the mark is durable in the
//! engine: [`store_types::RefStore::uses_refs`]). So upgrading a store
//! never makes old, unreferenced data garbage, and a namespace whose users
//! record references gets collected without configuration.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use store_gc::{LivenessSource, SourceId};
use store_types::{
    Digest, Error, Key, KvEngine, LargeEngine, LivenessTable, Namespace, RefEntry, RefExpect,
    RefName, RefStore, Result, Timestamp,
};

use crate::Store;

/// What GC may delete in a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GcPolicy {
    /// Entries no reference points at (and no pin holds) are garbage.
    Refs,
    /// Every unpinned entry no reference points at is garbage, from the
    /// first sweep on (`Refs` waits for the namespace's first reference
    /// only when it is the implicit default). References always protect:
    /// no policy deletes a referenced entry.
    Unreferenced,
    /// Nothing is ever swept.
    Keep,
    /// Unreferenced, unpinned entries older than this are garbage.
    MaxAge(Duration),
}

impl std::fmt::Display for GcPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GcPolicy::Refs => f.write_str("refs"),
            GcPolicy::Unreferenced => f.write_str("unreferenced"),
            GcPolicy::Keep => f.write_str("keep"),
            GcPolicy::MaxAge(d) => write!(f, "max_age {}s", d.as_secs()),
        }
    }
}

/// What this store registered for a namespace, to undo it.
#[derive(Clone)]
enum Registration {
    Source(SourceId),
    Table(LivenessTable),
}

/// The store's policy table (shared by its clones).
#[derive(Default)]
pub(crate) struct PolicyState {
    /// Policies set explicitly.
    explicit: HashMap<Namespace, GcPolicy>,
    /// The policy in force and what was registered for it.
    active: HashMap<Namespace, (GcPolicy, Vec<Registration>)>,
}

/// The liveness source of `Refs` namespaces (non-fleet).
struct RefsSource {
    refs: Arc<dyn RefStore>,
}

/// Groups `keys` by namespace (sources are registered per namespace, so
/// in practice one group) and asks `f` per group, keeping key order.
async fn by_namespace<'a, F, Fut>(keys: &'a [Key], mut f: F) -> Result<Vec<bool>>
where
    F: FnMut(&'a Namespace, Vec<Digest>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<bool>>>,
{
    let mut out = vec![false; keys.len()];
    let mut groups: Vec<(&Namespace, Vec<usize>)> = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        match groups.iter_mut().find(|(ns, _)| **ns == k.namespace) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((&k.namespace, vec![i])),
        }
    }
    for (ns, idx) in groups {
        let digests = idx.iter().map(|&i| keys[i].digest).collect();
        let answers = f(ns, digests).await?;
        if answers.len() != idx.len() {
            return Err(
                Error::backend(store_types::ErrorKind::InvalidData, "probe references")
                    .with_target(format!("of namespace {ns}"))
                    .with_source(format!(
                        "the reference store answered {} values for {} digests",
                        answers.len(),
                        idx.len()
                    )),
            );
        }
        for (i, a) in idx.into_iter().zip(answers) {
            out[i] = a;
        }
    }
    Ok(out)
}

#[async_trait]
impl LivenessSource for RefsSource {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>> {
        by_namespace(
            keys,
            |ns, d| async move { self.refs.referenced(ns, &d).await },
        )
        .await
    }
}

/// The liveness source of `Unreferenced` namespaces (non-fleet).
struct NothingReferenced;

#[async_trait]
impl LivenessSource for NothingReferenced {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>> {
        Ok(vec![false; keys.len()])
    }
}

/// The liveness source of `MaxAge` namespaces (non-fleet): referenced, or
/// younger than `max_age` by the store's clock.
struct AgeSource {
    refs: Option<Arc<dyn RefStore>>,
    kv: Arc<dyn KvEngine>,
    large: Option<Arc<dyn LargeEngine>>,
    clock: Arc<dyn store_gc::Clock>,
    max_age: Duration,
}

impl AgeSource {
    async fn young(&self, key: &Key, cutoff: Timestamp) -> Result<bool> {
        let mut meta = self.kv.meta(key).await?;
        if meta.is_none() {
            if let Some(l) = &self.large {
                meta = l.meta(key).await?;
            }
        }
        // An entry that vanished is not live; the sweep finds it gone.
        Ok(meta.is_some_and(|m| m.created_at > cutoff))
    }
}

#[async_trait]
impl LivenessSource for AgeSource {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>> {
        let now = self.clock.now();
        let cutoff = Timestamp(
            now.0
                .saturating_sub(self.max_age.as_millis().min(i64::MAX as u128) as i64),
        );
        let mut live = match &self.refs {
            Some(r) => {
                by_namespace(keys, |ns, d| async move { r.referenced(ns, &d).await }).await?
            }
            None => vec![false; keys.len()],
        };
        for (key, l) in keys.iter().zip(live.iter_mut()) {
            if !*l {
                *l = self.young(key, cutoff).await?;
            }
        }
        Ok(live)
    }
}

impl Store {
    /// The references of this store's kv engine, if it can hold them
    /// (`mem`, `sqlite`, `postgres`).
    pub fn refs(&self) -> Option<Refs> {
        self.inner.kv.refs().map(|backend| Refs {
            store: self.clone(),
            backend,
        })
    }

    /// Sets the GC policy of `ns`, replacing whatever this store registered
    /// for it before (registrations made by others — an embedder's own
    /// liveness sources, another node's tables — are left alone).
    ///
    /// Refused with [`Error::Config`]: `Refs`/`MaxAge` when the kv engine
    /// holds no references; in a fleet, `MaxAge` (age needs an in-process
    /// probe no other node could consult) and any policy but `Keep` when the
    /// engine's references are not a table the fleet shares.
    ///
    /// Cancel-safe: the old registrations are undone first and the new
    /// ones made after, and the policy table never forgets a registration
    /// that may exist (see `activate`); dropped half-way, the namespace is
    /// left with no source of this store's (never swept: the safe side)
    /// and the next call finishes the change.
    pub async fn set_gc_policy(&self, ns: Namespace, policy: GcPolicy) -> Result<()> {
        let _serial = self.inner.policy_lock.lock().await;
        self.activate(&ns, policy).await?;
        self.policies().explicit.insert(ns, policy);
        Ok(())
    }

    /// The explicit policy of `ns`, if one was set.
    pub fn gc_policy(&self, ns: &Namespace) -> Option<GcPolicy> {
        self.policies().explicit.get(ns).copied()
    }

    /// The policy in force in `ns`: explicit, or `Refs` once a reference
    /// was set there through this store or adopted with
    /// [`Store::adopt_ref_namespaces`], else `Keep`.
    pub fn effective_gc_policy(&self, ns: &Namespace) -> GcPolicy {
        let st = self.policies();
        st.explicit
            .get(ns)
            .copied()
            .or_else(|| st.active.get(ns).map(|(p, _)| *p))
            .unwrap_or(GcPolicy::Keep)
    }

    /// Applies `Refs` to every namespace in which a reference was ever set
    /// and that has no explicit policy (call once at start, after the
    /// explicit policies). Returns the adopted namespaces.
    ///
    /// Cancel-safe as [`Store::set_gc_policy`].
    pub async fn adopt_ref_namespaces(&self) -> Result<Vec<Namespace>> {
        let Some(refs) = self.inner.kv.refs() else {
            return Ok(Vec::new());
        };
        let mut adopted = Vec::new();
        for ns in refs.ref_namespaces().await? {
            if self.ensure_refs_policy(&ns).await? {
                adopted.push(ns);
            }
        }
        Ok(adopted)
    }

    /// Makes `ns` a `Refs` namespace unless it has an explicit policy or
    /// one is active already; `true` if it did.
    async fn ensure_refs_policy(&self, ns: &Namespace) -> Result<bool> {
        {
            let st = self.policies();
            if st.explicit.contains_key(ns)
                || st.active.get(ns).is_some_and(|(p, _)| *p != GcPolicy::Keep)
            {
                return Ok(false);
            }
        }
        let _serial = self.inner.policy_lock.lock().await;
        {
            let st = self.policies();
            if st.explicit.contains_key(ns)
                || st.active.get(ns).is_some_and(|(p, _)| *p != GcPolicy::Keep)
            {
                return Ok(false);
            }
        }
        self.activate(ns, GcPolicy::Refs).await?;
        Ok(true)
    }

    fn policies(&self) -> std::sync::MutexGuard<'_, PolicyState> {
        self.inner
            .policies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Undoes this store's registrations for `ns`, then makes what
    /// `policy` needs. Callers hold `policy_lock`.
    ///
    /// Cancel-safe in the sense that matters: the policy table never
    /// forgets a registration that may exist. An old registration leaves
    /// the table only after it was undone; a new in-process source is
    /// recorded in the same poll as it is made; a fleet table is recorded
    /// before its (idempotent) registration statement, so a later policy
    /// change undoes it even if this call was dropped mid-statement.
    /// Dropped between the two halves, the namespace has no source of
    /// ours: it is not swept, the safe side.
    async fn activate(&self, ns: &Namespace, policy: GcPolicy) -> Result<()> {
        let refs = self.inner.kv.refs();
        let fleet = self.is_fleet();
        // Everything that can be refused is refused before anything changes.
        let table = match policy {
            GcPolicy::Refs | GcPolicy::Unreferenced if fleet => Some(
                refs.as_ref()
                    .and_then(|r| r.liveness_table())
                    .ok_or_else(|| {
                        Error::Config(format!(
                            "namespace {ns}: policy {policy} in a fleet needs references in the \
                         shared database (a PostgreSQL kv engine)"
                        ))
                    })?,
            ),
            GcPolicy::MaxAge(_) if fleet => {
                return Err(Error::Config(format!(
                    "namespace {ns}: max_age is not available in a fleet (the age check is an \
                     in-process probe other nodes could not consult)"
                )))
            }
            GcPolicy::Refs if refs.is_none() => return Err(no_refs(ns, policy)),
            _ => None,
        };
        // 1. Undo the old registrations, newest first.
        loop {
            let last = {
                let st = self.policies();
                st.active.get(ns).and_then(|(_, regs)| regs.last().cloned())
            };
            let Some(r) = last else { break };
            match &r {
                Registration::Source(id) => {
                    self.deregister_liveness_source(*id).await?;
                }
                Registration::Table(t) => {
                    self.deregister_liveness_table(ns, t).await?;
                }
            }
            if let Some((_, regs)) = self.policies().active.get_mut(ns) {
                regs.pop();
            }
        }
        self.policies()
            .active
            .insert(ns.clone(), (GcPolicy::Keep, Vec::new()));
        // 2. Make the new one.
        let source: Option<Arc<dyn LivenessSource>> = match (policy, table) {
            (GcPolicy::Keep, _) => None,
            (_, Some(table)) => {
                self.record(ns, Registration::Table(table.clone()));
                self.register_liveness_source(ns.clone(), table).await?;
                None
            }
            (GcPolicy::Refs, None) => Some(Arc::new(RefsSource {
                refs: refs.expect("checked above"),
            })),
            (GcPolicy::Unreferenced, None) => match refs {
                Some(refs) => Some(Arc::new(RefsSource { refs })),
                None => Some(Arc::new(NothingReferenced)),
            },
            (GcPolicy::MaxAge(max_age), None) => Some(Arc::new(AgeSource {
                refs,
                kv: self.inner.kv.clone(),
                large: self.inner.large.clone(),
                clock: self.inner.clock.clone(),
                max_age,
            })),
        };
        if let Some(source) = source {
            let id = self.register_liveness_source(ns.clone(), source).await?;
            self.record(ns, Registration::Source(id));
        }
        if let Some((p, _)) = self.policies().active.get_mut(ns) {
            *p = policy;
        }
        Ok(())
    }

    /// Adds a registration to `ns`'s entry of the policy table.
    fn record(&self, ns: &Namespace, r: Registration) {
        self.policies()
            .active
            .entry(ns.clone())
            .or_insert((GcPolicy::Keep, Vec::new()))
            .1
            .push(r);
    }
}

fn no_refs(ns: &Namespace, policy: GcPolicy) -> Error {
    Error::Config(format!(
        "namespace {ns}: policy {policy} needs references, and this kv engine holds none"
    ))
}

/// Named references over a store (ADR-024): the library form the server's
/// `/v1/refs` routes use. Cheap to clone.
#[derive(Clone)]
pub struct Refs {
    store: Store,
    backend: Arc<dyn RefStore>,
}

impl std::fmt::Debug for Refs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refs").field("store", &self.store).finish()
    }
}

impl Refs {
    /// Points `name` in `ns` at `digest` if `expect` holds (compare and
    /// swap); returns the previous digest.
    ///
    /// The entry `(ns, digest)` must exist ([`Error::Missing`] otherwise).
    /// It is pinned for the duration of the call, the namespace's policy
    /// becomes `Refs` if it had none (so the reference protects), and the
    /// reference is committed before the pin is released: a sweep racing
    /// the call sees the pin or the reference, never neither. A caller
    /// holding its own pin (an HTTP pin token) releases it after this
    /// returns.
    ///
    /// A failed precondition is [`Error::RefConflict`] with the current
    /// digest; nothing changed.
    ///
    /// Cancel-safe: dropped before the commit, nothing changed (the
    /// namespace may have become a `Refs` namespace, which it would on the
    /// next successful call anyway); after, the reference is set. The pin
    /// is released either way.
    pub async fn set(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
    ) -> Result<Option<Digest>> {
        let key = Key::new(ns.clone(), digest);
        let pin = self.store.pin(&key).await?.ok_or(Error::Missing)?;
        self.store.ensure_refs_policy(ns).await?;
        let previous = self.backend.set(ns, name, digest, expect).await?;
        drop(pin);
        Ok(previous)
    }

    /// [`Refs::set`] with the usual compare-and-swap spelling: `old` is the
    /// digest the reference must hold now (`None`: it must not exist).
    pub async fn compare_and_set(
        &self,
        ns: &Namespace,
        name: &RefName,
        old: Option<Digest>,
        new: Digest,
    ) -> Result<()> {
        let expect = match old {
            Some(d) => RefExpect::Digest(d),
            None => RefExpect::Absent,
        };
        self.set(ns, name, new, expect).await.map(|_| ())
    }

    /// The digest `name` points at. Cancel-safe (a read).
    pub async fn get(&self, ns: &Namespace, name: &RefName) -> Result<Option<Digest>> {
        self.backend.get(ns, name).await
    }

    /// Removes `name` if `expect` holds; returns the digest it pointed at
    /// (`None`: no such reference). The entry becomes garbage once nothing
    /// else protects it, after the delete window. Cancel-safe: one
    /// transaction.
    pub async fn delete(
        &self,
        ns: &Namespace,
        name: &RefName,
        expect: RefExpect,
    ) -> Result<Option<Digest>> {
        self.backend.delete(ns, name, expect).await
    }

    /// Up to `limit` references of `ns` whose names start with `prefix`,
    /// after `after`, in name order. Cancel-safe (a read).
    pub async fn list(
        &self,
        ns: &Namespace,
        prefix: &str,
        after: Option<&RefName>,
        limit: usize,
    ) -> Result<Vec<RefEntry>> {
        self.backend.list(ns, prefix, after, limit).await
    }

    /// Whether any reference of `ns` points at each digest. Cancel-safe.
    pub async fn referenced(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        self.backend.referenced(ns, digests).await
    }
}
