//! Cache keys ([`CacheIndex`], ADR-048) held in process memory.
//!
//! One [`Mutex`] guards the keys of every namespace; every method is one
//! short critical section with no `.await` inside, so every method is
//! cancel-safe (a write ran whole or not at all). The access times are the
//! caller's clock readings (`now`): memory has no clock of its own.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use store_types::{
    ref_conflict, Author, CacheBounds, CacheIndex, CacheTrim, CacheUsage, Digest, Namespace,
    RefExpect, RefName, Result, Timestamp,
};

/// One key's row. `owner`: the name of the author that wrote the digest
/// (`None`: the embedding application; issue 39).
#[derive(Clone, Debug)]
struct Row {
    digest: Digest,
    size: u64,
    accessed_at: Timestamp,
    owner: Option<String>,
}

/// The cache keys of one [`MemEngine`](crate::MemEngine) (shared by its
/// clones): per namespace, key → row, in key byte order.
#[derive(Default)]
pub(crate) struct MemCache {
    keys: Mutex<BTreeMap<Namespace, BTreeMap<String, Row>>>,
}

impl MemCache {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Namespace, BTreeMap<String, Row>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl CacheIndex for MemCache {
    async fn record(
        &self,
        ns: &Namespace,
        key: &RefName,
        digest: Digest,
        size: u64,
        now: Timestamp,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>> {
        let mut t = self.lock();
        let previous = t.get(ns).and_then(|m| m.get(key.as_str()));
        let current = previous.map(|r| r.digest);
        if !expect.holds(current) {
            return Err(ref_conflict(key, current));
        }
        author.check(
            key,
            previous.map(|r| (r.digest, r.owner.as_deref())),
            Some(digest),
        )?;
        // The same digest keeps its owner; a new key or a replace is the
        // author's.
        let owner = match previous {
            Some(r) if r.digest == digest => r.owner.clone(),
            _ => author.name.map(str::to_owned),
        };
        let accessed_at = previous.map_or(now, |r| r.accessed_at.max(now));
        t.entry(ns.clone()).or_default().insert(
            key.as_str().to_string(),
            Row {
                digest,
                size,
                accessed_at,
                owner,
            },
        );
        Ok(current)
    }

    async fn lookup(&self, ns: &Namespace, key: &RefName) -> Result<Option<Digest>> {
        Ok(self
            .lock()
            .get(ns)
            .and_then(|m| m.get(key.as_str()))
            .map(|r| r.digest))
    }

    async fn remove(&self, ns: &Namespace, key: &RefName, expect: Option<Digest>) -> Result<bool> {
        let mut t = self.lock();
        let Some(m) = t.get_mut(ns) else {
            return Ok(false);
        };
        let hit = m
            .get(key.as_str())
            .is_some_and(|r| expect.is_none_or(|d| d == r.digest));
        if hit {
            m.remove(key.as_str());
            if m.is_empty() {
                t.remove(ns);
            }
        }
        Ok(hit)
    }

    async fn touch(&self, ns: &Namespace, digests: &[Digest], now: Timestamp) -> Result<u64> {
        let wanted: HashSet<&Digest> = digests.iter().collect();
        let mut t = self.lock();
        let mut changed = 0;
        for row in t.get_mut(ns).into_iter().flat_map(|m| m.values_mut()) {
            if wanted.contains(&row.digest) && row.accessed_at < now {
                row.accessed_at = now;
                changed += 1;
            }
        }
        Ok(changed)
    }

    async fn cached(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let t = self.lock();
        let present: HashSet<Digest> = t
            .get(ns)
            .into_iter()
            .flat_map(|m| m.values().map(|r| r.digest))
            .collect();
        Ok(digests.iter().map(|d| present.contains(d)).collect())
    }

    async fn trim(&self, ns: &Namespace, bounds: CacheBounds, now: Timestamp) -> Result<CacheTrim> {
        let mut t = self.lock();
        let Some(m) = t.get_mut(ns) else {
            return Ok(CacheTrim::default());
        };
        let cutoff = bounds.max_age.map(|a| {
            Timestamp(
                now.0
                    .saturating_sub(a.as_millis().min(i64::MAX as u128) as i64),
            )
        });
        // Newest first, ties by key: the order the bound keeps keys in.
        let mut order: Vec<(&String, &Row)> = m.iter().collect();
        order.sort_by(|a, b| b.1.accessed_at.cmp(&a.1.accessed_at).then(a.0.cmp(b.0)));
        // The byte bound cuts the order once: from the first key that does
        // not fit, every older key goes too (even one small enough to fit),
        // as the SQL engines' running sum does.
        let mut kept_bytes = 0u64;
        let mut full = false;
        let mut gone = Vec::new();
        for (key, row) in order {
            let too_old = cutoff.is_some_and(|c| row.accessed_at < c);
            full = full
                || (!too_old
                    && bounds
                        .max_bytes
                        .is_some_and(|max| kept_bytes.saturating_add(row.size) > max));
            if too_old || full {
                gone.push(key.clone());
            } else {
                kept_bytes += row.size;
            }
        }
        let mut trim = CacheTrim::default();
        for key in gone {
            if let Some(row) = m.remove(&key) {
                trim.keys += 1;
                trim.bytes += row.size;
            }
        }
        if m.is_empty() {
            t.remove(ns);
        }
        Ok(trim)
    }

    async fn usage(&self) -> Result<Vec<(Namespace, CacheUsage)>> {
        Ok(self
            .lock()
            .iter()
            .map(|(ns, m)| {
                let bytes = m.values().map(|r| r.size).sum();
                (
                    ns.clone(),
                    CacheUsage {
                        keys: m.len() as u64,
                        bytes,
                    },
                )
            })
            .collect())
    }
}
