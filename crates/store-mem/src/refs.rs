//! Named references ([`RefStore`]) held in process memory.
//!
//! One [`Mutex`] guards the references, a reverse count per
//! `(namespace, digest)` (so `referenced` is a lookup per digest rather than
//! a walk over the namespace's references) and the set of namespaces that
//! ever had a reference. Every method is one short critical section with no
//! `.await` inside, so every method is cancel-safe: a `set` or `delete`
//! either ran whole or not at all.
//!
//! References are keyed by `(namespace, name as String)`: `String` orders
//! by bytes, which is the order `list` promises, and lets `list` start a
//! range at an arbitrary prefix (a prefix need not be a valid name, e.g.
//! `builds/`).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use store_types::{
    ref_conflict, Author, Digest, Error, Namespace, RefEntry, RefExpect, RefName, RefStore, Result,
};

/// One reference: its digest and its owner, the name of the author that
/// wrote that digest (`None`: the embedding application; issue 39). A set
/// of the digest the row holds keeps the owner.
#[derive(Clone, Debug)]
struct Row {
    digest: Digest,
    owner: Option<String>,
}

/// The state behind the lock.
#[derive(Default)]
struct RefTables {
    /// `(namespace, name) → row`, in (namespace, name byte) order.
    refs: BTreeMap<(Namespace, String), Row>,
    /// Per namespace, how many references point at a digest (no zero
    /// counts, no empty maps are kept).
    by_digest: BTreeMap<Namespace, BTreeMap<Digest, usize>>,
    /// Namespaces in which a reference was ever set (never shrinks).
    namespaces: BTreeSet<Namespace>,
}

impl RefTables {
    fn link(&mut self, ns: &Namespace, digest: Digest) {
        if !self.by_digest.contains_key(ns) {
            self.by_digest.insert(ns.clone(), BTreeMap::new());
        }
        if let Some(counts) = self.by_digest.get_mut(ns) {
            *counts.entry(digest).or_insert(0) += 1;
        }
    }

    fn unlink(&mut self, ns: &Namespace, digest: Digest) {
        let Some(counts) = self.by_digest.get_mut(ns) else {
            return;
        };
        if let Some(n) = counts.get_mut(&digest) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&digest);
            }
        }
        if counts.is_empty() {
            self.by_digest.remove(ns);
        }
    }
}

/// The references of one [`MemEngine`](crate::MemEngine) (shared by its
/// clones).
#[derive(Default)]
pub(crate) struct MemRefs {
    tables: Mutex<RefTables>,
}

impl MemRefs {
    /// The lock; a poisoned lock is recovered (every critical section
    /// leaves the maps consistent before anything can panic).
    fn lock(&self) -> MutexGuard<'_, RefTables> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn stored_name(name: &str) -> Result<RefName> {
    RefName::new(name).map_err(|e| {
        Error::backend(
            store_types::ErrorKind::InvalidData,
            "mem: decode stored reference name",
        )
        .with_source(e)
    })
}

#[async_trait]
impl RefStore for MemRefs {
    async fn set_checked(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
        author: Author<'_>,
        // A process-local engine never hosts a fleet (see the contract).
        _pin: Option<store_types::PinProof<'_>>,
    ) -> Result<Option<Digest>> {
        let mut t = self.lock();
        let key = (ns.clone(), name.as_str().to_owned());
        let row = t.refs.get(&key);
        let current = row.map(|r| r.digest);
        if !expect.holds(current) {
            return Err(ref_conflict(name, current));
        }
        author.check(
            name,
            row.map(|r| (r.digest, r.owner.as_deref())),
            Some(digest),
        )?;
        match current {
            // The same digest: nothing changes, the owner stays.
            Some(old) if old == digest => {}
            // A new row, or a replace the author may make: the row is the
            // author's from now on (it wrote what the row holds).
            _ => {
                t.refs.insert(
                    key,
                    Row {
                        digest,
                        owner: author.name.map(str::to_owned),
                    },
                );
                if let Some(old) = current {
                    t.unlink(ns, old);
                }
                t.link(ns, digest);
            }
        }
        Ok(current)
    }

    async fn get(&self, ns: &Namespace, name: &RefName) -> Result<Option<Digest>> {
        Ok(self
            .lock()
            .refs
            .get(&(ns.clone(), name.as_str().to_owned()))
            .map(|r| r.digest))
    }

    async fn delete(
        &self,
        ns: &Namespace,
        name: &RefName,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>> {
        let mut t = self.lock();
        let key = (ns.clone(), name.as_str().to_owned());
        let row = t.refs.get(&key);
        let current = row.map(|r| r.digest);
        if !expect.holds(current) {
            return Err(ref_conflict(name, current));
        }
        author.check(name, row.map(|r| (r.digest, r.owner.as_deref())), None)?;
        if let Some(old) = current {
            t.refs.remove(&key);
            t.unlink(ns, old);
        }
        Ok(current)
    }

    async fn list(
        &self,
        ns: &Namespace,
        prefix: &str,
        after: Option<&RefName>,
        limit: usize,
    ) -> Result<Vec<RefEntry>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Start at whichever lower bound is higher: the prefix itself
        // (inclusive) or the name after which the page starts (exclusive).
        let lower = match after {
            Some(a) if a.as_str() >= prefix => Bound::Excluded((ns.clone(), a.as_str().to_owned())),
            _ => Bound::Included((ns.clone(), prefix.to_owned())),
        };
        let t = self.lock();
        t.refs
            .range((lower, Bound::Unbounded))
            .take_while(|((n, name), _)| n == ns && name.starts_with(prefix))
            .take(limit)
            .map(|((_, name), row)| {
                Ok(RefEntry {
                    name: stored_name(name)?,
                    digest: row.digest,
                })
            })
            .collect()
    }

    async fn referenced(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let t = self.lock();
        let counts = t.by_digest.get(ns);
        Ok(digests
            .iter()
            .map(|d| counts.is_some_and(|c| c.contains_key(d)))
            .collect())
    }

    async fn ref_namespaces(&self) -> Result<Vec<Namespace>> {
        Ok(self.lock().namespaces.iter().cloned().collect())
    }

    async fn uses_refs(&self, ns: &Namespace) -> Result<bool> {
        Ok(self.lock().namespaces.contains(ns))
    }

    async fn mark_uses_refs(&self, ns: &Namespace) -> Result<bool> {
        Ok(self.lock().namespaces.insert(ns.clone()))
    }
}
