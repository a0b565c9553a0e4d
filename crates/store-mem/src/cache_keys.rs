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
    ref_conflict, Author, CacheEntry, CacheIndex, CachePage, CacheTrim, CacheUsage, Digest,
    Namespace, RefExpect, RefName, Result, Timestamp,
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

    async fn lookup_many(&self, ns: &Namespace, keys: &[RefName]) -> Result<Vec<Option<Digest>>> {
        let t = self.lock();
        let m = t.get(ns);
        Ok(keys
            .iter()
            .map(|k| m.and_then(|m| m.get(k.as_str())).map(|r| r.digest))
            .collect())
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

    async fn oldest(&self, ns: &Namespace, limit: usize, now: Timestamp) -> Result<CachePage> {
        let t = self.lock();
        let rows = t.get(ns).into_iter().flatten();
        let mut times: Vec<Timestamp> = rows.clone().map(|(_, r)| r.accessed_at).collect();
        let edge = match limit.max(1) {
            n if times.len() > n => *times.select_nth_unstable(n - 1).1,
            _ => Timestamp(i64::MAX),
        };
        let entries = rows.clone().filter(|(_, r)| r.accessed_at <= edge);
        Ok(CachePage {
            now,
            bytes: rows.map(|(_, r)| r.size).sum(),
            entries: entries
                .map(|(k, r)| {
                    Ok(CacheEntry {
                        key: RefName::new(k.as_str())?,
                        digest: r.digest,
                        size: r.size,
                        accessed_at: r.accessed_at,
                    })
                })
                .collect::<Result<_>>()?,
        })
    }

    async fn remove_unchanged(&self, ns: &Namespace, entries: &[CacheEntry]) -> Result<CacheTrim> {
        let mut t = self.lock();
        let Some(m) = t.get_mut(ns) else {
            return Ok(CacheTrim::default());
        };
        let mut trim = CacheTrim::default();
        for e in entries {
            let r = m.get(e.key.as_str());
            if r.is_some_and(|r| {
                (r.digest, r.size, r.accessed_at) == (e.digest, e.size, e.accessed_at)
            }) {
                m.remove(e.key.as_str());
                trim.keys += 1;
                trim.bytes += e.size;
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
