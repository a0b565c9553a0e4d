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
    Author, CacheBounds, Digest, Error, ErrorKind, FleetPolicy, Key, KvEngine, LargeEngine,
    Namespace, PolicyRow, RefEntry, RefExpect, RefName, RefStore, Replace, Result, Timestamp,
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
    /// A cache namespace (ADR-048): entries are live while a cache key
    /// points at them ([`crate::Cache`]); each sweep first removes the
    /// keys outside the bound (least recently accessed first), so their
    /// entries become garbage unless a reference or pin protects them.
    /// Puts through the server take no pin token here.
    Cache(CacheBounds),
}

impl std::fmt::Display for GcPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GcPolicy::Refs => f.write_str("refs"),
            GcPolicy::Unreferenced => f.write_str("unreferenced"),
            GcPolicy::Keep => f.write_str("keep"),
            GcPolicy::MaxAge(d) => write!(f, "max_age {}s", d.as_secs()),
            GcPolicy::Cache(b) => write!(f, "{b}"),
        }
    }
}

impl GcPolicy {
    /// The fleet form of the policy; `None` for `MaxAge`, which has none.
    fn fleet(self) -> Option<FleetPolicy> {
        match self {
            GcPolicy::Refs => Some(FleetPolicy::Refs),
            GcPolicy::Unreferenced => Some(FleetPolicy::Unreferenced),
            GcPolicy::Keep => Some(FleetPolicy::Keep),
            GcPolicy::MaxAge(_) => None,
            GcPolicy::Cache(b) => Some(FleetPolicy::Cache(b)),
        }
    }

    fn from_fleet(p: FleetPolicy) -> GcPolicy {
        match p {
            FleetPolicy::Refs => GcPolicy::Refs,
            FleetPolicy::Unreferenced => GcPolicy::Unreferenced,
            FleetPolicy::Keep => GcPolicy::Keep,
            FleetPolicy::Cache(b) => GcPolicy::Cache(b),
        }
    }
}

/// The store's policy table (shared by its clones).
#[derive(Default)]
pub(crate) struct PolicyState {
    /// Policies set explicitly through this store.
    explicit: HashMap<Namespace, GcPolicy>,
    /// Non-fleet: the policy in force and the in-process source registered
    /// for it (`None` for `Keep`).
    pub(crate) active: HashMap<Namespace, (GcPolicy, Option<SourceId>)>,
}

/// The marker source of `Refs` and `Unreferenced` namespaces (non-fleet):
/// it makes the namespace swept and names nothing live itself — the
/// collector consults the references in every swept namespace (ADR-045).
struct NothingElseLive;

#[async_trait]
impl LivenessSource for NothingElseLive {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>> {
        Ok(vec![false; keys.len()])
    }
}

/// The liveness source of `MaxAge` namespaces (non-fleet): younger than
/// `max_age` by the store's clock (references are consulted by the
/// collector).
struct AgeSource {
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
        let mut live = vec![false; keys.len()];
        for (key, l) in keys.iter().zip(live.iter_mut()) {
            *l = self.young(key, cutoff).await?;
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

    /// Sets this store's GC policy for `ns` (ADR-024, ADR-045).
    ///
    /// - Non-fleet: the policy's in-process source is registered **before**
    ///   the old one is removed, so the namespace is never briefly without
    ///   the protection either policy gives.
    /// - Fleet: the policy is a row of this node (its [`Store::owner`]) in
    ///   the shared database, replaced in one statement; other nodes' rows
    ///   are never touched. Every node's sweep reads every row: `Keep` on
    ///   any node wins for the whole fleet.
    ///
    /// References protect under every policy; `Keep` only means the policy
    /// layer never makes the namespace swept (an embedder's own liveness
    /// source or table still can, and references then still protect).
    ///
    /// Refused with [`Error::Config`]: `Refs` when the kv engine holds no
    /// references, `Cache` when it holds no cache keys; in a fleet, `MaxAge`
    /// (age needs an in-process probe no other node could consult).
    ///
    /// Cancel-safe: non-fleet the change happens without an await between
    /// its steps; fleet it is one statement, applied or not.
    pub async fn set_gc_policy(&self, ns: Namespace, policy: GcPolicy) -> Result<()> {
        let _serial = self.inner.policy_lock.lock().await;
        if self.inner.kv.refs().is_none() && policy == GcPolicy::Refs {
            return Err(no_refs(&ns, policy));
        }
        if self.inner.kv.cache().is_none() && matches!(policy, GcPolicy::Cache(_)) {
            return Err(Error::Config(format!(
                "namespace {ns}: policy {policy} needs cache keys, and this kv engine holds none"
            )));
        }
        match &self.inner.fleet {
            Some(f) => {
                let Some(fp) = policy.fleet() else {
                    return Err(Error::Config(format!(
                        "namespace {ns}: max_age is not available in a fleet (the age check is an \
                         in-process probe other nodes could not consult)"
                    )));
                };
                f.pins
                    .set_gc_policy(&ns, &self.inner.owner, Some(fp))
                    .await?;
            }
            None => self.activate(&ns, policy).await?,
        }
        self.policies().explicit.insert(ns, policy);
        Ok(())
    }

    /// Fleet: removes this node's policy rows for every namespace not in
    /// `keep` (a restarted node whose configuration dropped a namespace
    /// leaves no row of its old policy behind). Returns the namespaces
    /// whose row was removed. Non-fleet: nothing to do (policies live in
    /// this process).
    ///
    /// Cancel-safe: one statement per namespace; each row is removed or not.
    pub async fn retain_gc_policies(&self, keep: &[Namespace]) -> Result<Vec<Namespace>> {
        let Some(f) = &self.inner.fleet else {
            return Ok(Vec::new());
        };
        let _serial = self.inner.policy_lock.lock().await;
        let mut removed = Vec::new();
        for row in f.pins.gc_policies().await? {
            if row.owner == self.inner.owner && !keep.contains(&row.namespace) {
                f.pins
                    .set_gc_policy(&row.namespace, &self.inner.owner, None)
                    .await?;
                self.policies().explicit.remove(&row.namespace);
                removed.push(row.namespace);
            }
        }
        Ok(removed)
    }

    /// The explicit policy of `ns` set through this store, if any.
    pub fn gc_policy(&self, ns: &Namespace) -> Option<GcPolicy> {
        self.policies().explicit.get(ns).copied()
    }

    /// The policy in force in `ns`.
    ///
    /// - Non-fleet: explicit, or `Refs` once a reference was set there
    ///   through this store or adopted with
    ///   [`Store::adopt_ref_namespaces`], else `Keep`.
    /// - Fleet (read from the shared database): `Keep` if any node's row
    ///   says so; else this node's row, else another node's; else `Refs`
    ///   if the namespace is marked as using references; else `Keep`.
    ///
    /// Cancel-safe (reads only).
    pub async fn effective_gc_policy(&self, ns: &Namespace) -> Result<GcPolicy> {
        let Some(f) = &self.inner.fleet else {
            let st = self.policies();
            return Ok(st
                .explicit
                .get(ns)
                .copied()
                .or_else(|| st.active.get(ns).map(|(p, _)| *p))
                .unwrap_or(GcPolicy::Keep));
        };
        let rows: Vec<PolicyRow> = f
            .pins
            .gc_policies()
            .await?
            .into_iter()
            .filter(|r| &r.namespace == ns)
            .collect();
        if rows.iter().any(|r| r.policy == FleetPolicy::Keep) {
            return Ok(GcPolicy::Keep);
        }
        if let Some(r) = rows
            .iter()
            .find(|r| r.owner == self.inner.owner)
            .or(rows.first())
        {
            return Ok(GcPolicy::from_fleet(r.policy));
        }
        let marked = match self.inner.kv.refs() {
            Some(r) => r.uses_refs(ns).await?,
            None => false,
        };
        Ok(if marked {
            GcPolicy::Refs
        } else {
            GcPolicy::Keep
        })
    }

    /// Non-fleet: applies `Refs` to every namespace marked as using
    /// references that has no explicit policy (call once at start, after
    /// the explicit policies). Returns the adopted namespaces. Fleet: the
    /// marks in the shared database are the implicit policy already
    /// (ADR-045); nothing to adopt, returns nothing.
    ///
    /// Cancel-safe as [`Store::set_gc_policy`].
    pub async fn adopt_ref_namespaces(&self) -> Result<Vec<Namespace>> {
        let Some(refs) = self.inner.kv.refs() else {
            return Ok(Vec::new());
        };
        if self.is_fleet() {
            return Ok(Vec::new());
        }
        let mut adopted = Vec::new();
        for ns in refs.ref_namespaces().await? {
            if self.adopt_refs_policy(&ns).await? {
                adopted.push(ns);
            }
        }
        Ok(adopted)
    }

    /// Marks `ns` as using references and, non-fleet, makes it a `Refs`
    /// namespace unless it has an explicit policy or a sweeping one is
    /// active already. `true` if the policy in force changed from `Keep`
    /// to `Refs` (the caller audits that).
    async fn mark_and_adopt(&self, refs: &dyn RefStore, ns: &Namespace) -> Result<bool> {
        let newly = refs.mark_uses_refs(ns).await?;
        match &self.inner.fleet {
            // The mark is the implicit policy; it changes what is swept
            // only where no node has a row for the namespace.
            Some(f) => Ok(newly
                && !f
                    .pins
                    .gc_policies()
                    .await?
                    .iter()
                    .any(|r| &r.namespace == ns)),
            None => self.adopt_refs_policy(ns).await,
        }
    }

    /// Non-fleet: makes `ns` a `Refs` namespace unless it has an explicit
    /// policy or a sweeping one is active already; `true` if it did.
    async fn adopt_refs_policy(&self, ns: &Namespace) -> Result<bool> {
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

    pub(crate) fn policies(&self) -> std::sync::MutexGuard<'_, PolicyState> {
        self.inner
            .policies
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Non-fleet: registers what `policy` needs for `ns`, then removes what
    /// the old policy registered (the new protection is in place before the
    /// old one goes). Callers hold `policy_lock`.
    ///
    /// The in-process registration and its record in the policy table
    /// happen in one poll, and so does the removal of the old one (an
    /// in-process deregistration does not wait on anything), so a dropped
    /// call leaves the table and the collector in agreement.
    async fn activate(&self, ns: &Namespace, policy: GcPolicy) -> Result<()> {
        let source: Option<Arc<dyn LivenessSource>> = match policy {
            GcPolicy::Keep => None,
            // A cache namespace's entries are protected by their keys,
            // which the collector consults in every namespace.
            GcPolicy::Refs | GcPolicy::Unreferenced | GcPolicy::Cache(_) => {
                Some(Arc::new(NothingElseLive))
            }
            GcPolicy::MaxAge(max_age) => Some(Arc::new(AgeSource {
                kv: self.inner.kv.clone(),
                large: self.inner.large.clone(),
                clock: self.inner.clock.clone(),
                max_age,
            })),
        };
        let new = source.map(|s| self.inner.gc.register_liveness_source(ns.clone(), s));
        let old = self
            .policies()
            .active
            .insert(ns.clone(), (policy, new))
            .and_then(|(_, id)| id);
        if let Some(id) = old {
            self.inner.gc.deregister_liveness_source(id).await?;
        }
        Ok(())
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

/// How [`Refs::set_with`] treats the namespace's GC policy, and who
/// writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetRefOptions {
    /// Whether a committed set may make a `keep`-by-default namespace a
    /// `refs` namespace (mark it as using references, ADR-024 §4). That
    /// switch makes every unreferenced entry of the namespace garbage, so
    /// the server grants it only to callers who may delete there
    /// (ADR-045); the library's [`Refs::set`] always may.
    pub adopt_policy: bool,
    /// The writer's name, stored as the owner of a reference it creates
    /// (issue 39, ADR-052); `None`: the embedding application.
    pub owner: Option<String>,
    /// What the writer may replace: [`Replace::Any`] for the library and
    /// callers who may delete in the namespace; [`Replace::Own`] for
    /// callers who may only add (a `write` key).
    pub may: Replace,
}

impl Default for SetRefOptions {
    fn default() -> Self {
        SetRefOptions {
            adopt_policy: true,
            owner: None,
            may: Replace::Any,
        }
    }
}

impl SetRefOptions {
    /// The [`Author`] these options describe.
    pub fn author(&self) -> Author<'_> {
        Author {
            name: self.owner.as_deref(),
            may: self.may,
        }
    }
}

/// What [`Refs::set_with`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SetRefOutcome {
    /// The digest the reference held before (`None`: it was created).
    pub previous: Option<Digest>,
    /// Whether the set switched the namespace's policy in force from
    /// `keep` to `refs` (its first reference, with `adopt_policy`).
    pub adopted: bool,
}

impl Refs {
    /// Points `name` in `ns` at `digest` if `expect` holds (compare and
    /// swap); returns the previous digest. [`Refs::set_with`] with the
    /// default options (a first reference makes the namespace `refs`).
    ///
    /// Cancel-safe as [`Refs::set_with`].
    pub async fn set(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
    ) -> Result<Option<Digest>> {
        self.set_with(ns, name, digest, expect, SetRefOptions::default())
            .await
            .map(|o| o.previous)
    }

    /// Points `name` in `ns` at `digest` if `expect` holds (compare and
    /// swap).
    ///
    /// The entry `(ns, digest)` must exist ([`Error::Missing`] otherwise).
    /// It is pinned until the reference's write is acknowledged or known
    /// not to commit, so a sweep racing the call sees the pin or the
    /// reference, never neither. In a fleet the write also re-checks, in
    /// its own transaction and under the key's lock, that the entry is not
    /// being deleted and that this node's pin on it has not expired (a set
    /// delayed past the pin TTL fails instead of naming a deleted entry).
    /// Only **after** the reference is committed, and only with
    /// `opts.adopt_policy`, is the namespace marked as using references
    /// (the implicit `refs` policy); a failed or refused set changes no
    /// policy. A caller holding its own pin (an HTTP pin token) releases it
    /// after this returns.
    ///
    /// A failed precondition is [`Error::RefConflict`] with the current
    /// digest; a replace `opts` does not allow (another writer's reference,
    /// ADR-052) is [`Error::NotOwner`]; either way nothing changed.
    ///
    /// Cancel-safe: the pin, the write and the policy step run in a task of
    /// their own, so dropping this future only stops waiting — the
    /// reference commits or not exactly as if it had been awaited, and the
    /// pin is held until the write's outcome is known.
    pub async fn set_with(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
        opts: SetRefOptions,
    ) -> Result<SetRefOutcome> {
        let this = self.clone();
        let (ns, name) = (ns.clone(), name.clone());
        let task = tokio::spawn(async move {
            let key = Key::new(ns.clone(), digest);
            // Fleet: the guard must see *this* pin's row generation still
            // in place (ADR-054), not merely some unexpired row of the node.
            let (pin, generation) = this.store.pin_proved(&key).await?.ok_or(Error::Missing)?;
            let proof = generation.map(|generation| store_types::PinProof {
                owner: this.store.owner(),
                generation,
            });
            let previous = this
                .backend
                .set_checked(&ns, &name, digest, expect, opts.author(), proof)
                .await;
            drop(pin);
            let previous = previous?;
            let adopted = if opts.adopt_policy {
                this.store
                    .mark_and_adopt(this.backend.as_ref(), &ns)
                    .await?
            } else {
                false
            };
            if adopted {
                // The audit log's shape (identity, action, target,
                // outcome); the library knows no caller, so the identity
                // is this store's owner name.
                tracing::info!(
                    target: "blobpool::audit",
                    identity = %this.store.owner(),
                    action = "gc_policy",
                    target = %ns,
                    outcome = "keep -> refs (the namespace's first reference)",
                    "audit"
                );
            }
            Ok(SetRefOutcome { previous, adopted })
        });
        match task.await {
            Ok(r) => r,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::backend(ErrorKind::Interrupted, "set reference").with_source(e)),
        }
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
        self.delete_by(ns, name, expect, Author::LIBRARY).await
    }

    /// [`Refs::delete`] by `author`: a reference another writer set is
    /// removed only if `author` may replace anything ([`Replace::Any`]);
    /// else [`Error::NotOwner`] and nothing changed (ADR-052).
    /// Cancel-safe: one transaction.
    pub async fn delete_by(
        &self,
        ns: &Namespace,
        name: &RefName,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>> {
        self.backend.delete(ns, name, expect, author).await
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
