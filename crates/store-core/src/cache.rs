//! Cache namespaces (issue 31, ADR-048): the library form of the cache
//! keys the server's build-cache routes use, the batched record of reads,
//! and the trim each sweep starts with.
//!
//! A cache namespace (`GcPolicy::Cache`) keeps an entry while a cache key
//! points at it. Keys carry the entry's size and its last access; a sweep
//! first removes the keys outside the namespace's bound (older than
//! `max_age` since their last access, then least recently accessed first
//! until the rest fits `max_bytes`), and deletes at once the entries of
//! the keys it removed that no key, reference or pin protects any more.
//! A record past `max_bytes` starts the same trim at write time, and an
//! entry larger than `max_bytes` is refused (ADR-069).
//!
//! # Keys remembered in memory
//!
//! A non-fleet store remembers looked-up keys ([`KEY_CACHE_ENTRIES`]), so a
//! hit costs no database read; every write through the store invalidates
//! (see `KeyCache`). A fleet reads the index on every lookup. A remembered
//! hit costs one clock read, one lock and two hash probes, and allocates
//! nothing (ADR-073).
//!
//! # Reads are recorded in batches
//!
//! A read never writes on its path: [`Cache::note_access`] notes the
//! digest in an in-memory map (one per store, shared by its clones) with
//! its read time rounded down to [`ACCESS_RESOLUTION`], keeping the latest
//! time per digest. A remembered key read again within the same step is
//! not noted twice (the key remembers the step it was noted in). The map
//! is written as one `touch` per namespace and noted time when it holds
//! [`ACCESS_FLUSH_KEYS`] digests or the last write is older than
//! [`ACCESS_FLUSH_EVERY`] on the store's clock (by a task the noting read
//! spawns, never awaited by it), and before every sweep's trim. So a
//! digest read many times in one period costs one row update (its last
//! read's time: an older one would be overwritten by it), and a crash
//! loses at most one period of recency (those entries look as old as their
//! previous access).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use store_types::{
    fleet_cache_namespaces, Author, CacheBounds, CacheEntry, CacheIndex, CachePage, CacheTrim,
    CacheUsage, Digest, Error, Namespace, RefExpect, RefName, Result, Timestamp,
};

use crate::{Blob, GcPolicy, PutReceipt, Store};

/// Digests noted since the last write that trigger the next one.
pub const ACCESS_FLUSH_KEYS: usize = 4096;
/// The longest a noted read waits for its write (while reads keep coming;
/// a sweep writes whatever is pending first).
pub const ACCESS_FLUSH_EVERY: Duration = Duration::from_secs(10);

/// The granularity of recorded read times: reads noted within one step
/// are written with the same time (one `touch` per step and namespace).
pub const ACCESS_RESOLUTION: Duration = Duration::from_millis(100);
/// A digest whose read time was taken for a write less than this long ago
/// is not noted again: a client asking about the same thousands of blobs
/// many times a second (REAPI `FindMissingBlobs`) costs one `touch` of
/// each per second, not one per call. Recorded times lag the last read by
/// at most this.
pub const ACCESS_REWRITE_AFTER: Duration = Duration::from_secs(1);

/// Noted reads: per namespace, per digest, the latest time it was read
/// (rounded down to [`ACCESS_RESOLUTION`]).
type Pending = HashMap<Namespace, HashMap<Digest, i64>>;

/// The keys a trim's first read asks for; each read after a batch that
/// went whole asks for twice as many, up to [`TRIM_PAGE_MAX`].
const TRIM_PAGE: usize = 256;
/// The most keys one read of a trim asks for.
const TRIM_PAGE_MAX: usize = 8192;

/// The LRU trim (ADR-048, ADR-062), written once over the primitives of
/// any [`CacheIndex`]: the order, tie-break and bounds live here.
#[async_trait::async_trait]
pub trait CacheTrimmer {
    /// Removes the keys of `ns` last accessed before `now - max_age`, then
    /// the least recently accessed (ties: the greater key first) until the
    /// rest sum to at most `max_bytes` (once a key goes, every older one
    /// does). The clock is the engine's ([`CachePage::now`]). Each batch is
    /// judged on one read and removed in one atomic step where unchanged
    /// since: a key recorded or touched meanwhile stays.
    async fn trim(&self, ns: &Namespace, bounds: CacheBounds, now: Timestamp) -> Result<CacheTrim>;
}

#[async_trait::async_trait]
impl<T: CacheIndex + ?Sized> CacheTrimmer for T {
    async fn trim(&self, ns: &Namespace, bounds: CacheBounds, now: Timestamp) -> Result<CacheTrim> {
        Ok(trim_evicting(self, ns, bounds, now, &mut Vec::new())
            .await?
            .0)
    }
}

/// [`CacheTrimmer::trim`], adding the digests of the keys it judged
/// outside the bound to `evicted` (a key changed meanwhile stays, its
/// digest listed all the same: deleting it is arbitrated) and answering,
/// beside what went, the namespace's bytes left after its last batch.
async fn trim_evicting<T: CacheIndex + ?Sized>(
    index: &T,
    ns: &Namespace,
    bounds: CacheBounds,
    now: Timestamp,
    evicted: &mut Vec<Digest>,
) -> Result<(CacheTrim, u64)> {
    let (mut trim, mut limit, mut left) = (CacheTrim::default(), TRIM_PAGE, 0);
    while bounds != CacheBounds::default() {
        let page = index.oldest(ns, limit, now).await?;
        let (read, bytes) = (page.entries.len(), page.bytes);
        let gone = outside(bounds, page);
        left = bytes;
        if gone.is_empty() {
            break;
        }
        let t = index.remove_unchanged(ns, &gone).await?;
        evicted.extend(gone.iter().map(|e| e.digest));
        (trim.keys, trim.bytes) = (trim.keys + t.keys, trim.bytes + t.bytes);
        left = bytes.saturating_sub(t.bytes);
        // A batch that changed whole under this trim (another node's
        // trim took it): that trim goes on.
        if gone.len() < read || t.keys == 0 {
            break;
        }
        limit = (limit * 2).min(TRIM_PAGE_MAX);
    }
    Ok((trim, left))
}

/// The keys of `page` outside `bounds`: walking from the least recently
/// accessed, each too old or leaving more than `max_bytes` behind it.
fn outside(bounds: CacheBounds, mut page: CachePage) -> Vec<CacheEntry> {
    let cutoff = bounds.max_age.map(|a| {
        let a = i64::try_from(a.as_millis()).unwrap_or(i64::MAX);
        page.now.0.saturating_sub(a)
    });
    page.entries
        .sort_unstable_by(|a, b| (a.accessed_at, &b.key).cmp(&(b.accessed_at, &a.key)));
    let mut rest = page.bytes;
    let n = page
        .entries
        .iter()
        .take_while(|e| {
            let out = cutoff.is_some_and(|c| e.accessed_at.0 < c)
                || bounds.max_bytes.is_some_and(|max| rest > max);
            rest = rest.saturating_sub(if out { e.size } else { 0 });
            out
        })
        .count();
    page.entries.truncate(n);
    page.entries
}

/// The deletes of evicted entries one trim runs at a time.
pub const EVICT_DELETES: usize = 16;

/// Keys remembered in memory per store (non-fleet), each ~100 bytes.
pub const KEY_CACHE_ENTRIES: usize = 65_536;

/// Non-fleet: `(namespace, key) → digest` remembered from the index, so a
/// hit skips the database. This process is the only writer of a
/// non-fleet store's keys (its instance lock), and every write through it
/// invalidates: `record`, `remove` and a missing entry drop the key, a trim
/// that removed keys clears the map. A fill races a write safely: each
/// write bumps `generation` under the lock, and a lookup fills only if no
/// write happened since it read the index. Full: cleared (cheap, rare).
/// A fleet reads the index every time (other nodes write it).
///
/// Keyed by namespace, then key, so a lookup borrows both (no owned key
/// built per probe). Each key also remembers the access step its last
/// noted read fell in: a read in the same step is not noted again.
#[derive(Default)]
pub(crate) struct KeyCache {
    state: Mutex<KeyCacheState>,
    /// The kv engine's cache index, asked for once ([`Store::cache`]).
    index: OnceLock<Option<Arc<dyn CacheIndex>>>,
}

#[derive(Default)]
struct KeyCacheState {
    keys: HashMap<Namespace, HashMap<Box<str>, Remembered>>,
    /// Keys remembered, over every namespace.
    len: usize,
    generation: u64,
}

/// A remembered key: its digest, and the access step (milliseconds, a
/// multiple of [`ACCESS_RESOLUTION`]) of its last noted read.
#[derive(Clone, Copy)]
struct Remembered {
    digest: Digest,
    noted: i64,
}

/// What a lookup found among the remembered keys.
enum Recall {
    /// Remembered, and a read of it already noted in this step.
    Noted(Digest),
    /// Remembered; this read is to be noted (the key now says so).
    Hit(Digest),
    /// Not remembered: the generation a fill must still see.
    Miss(u64),
}

impl KeyCache {
    fn lock(&self) -> MutexGuard<'_, KeyCacheState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn recall(&self, ns: &Namespace, key: &RefName, step: i64) -> Recall {
        let mut st = self.lock();
        let generation = st.generation;
        match st.keys.get_mut(ns).and_then(|m| m.get_mut(key.as_str())) {
            Some(r) if r.noted == step => Recall::Noted(r.digest),
            Some(r) => {
                r.noted = step;
                Recall::Hit(r.digest)
            }
            None => Recall::Miss(generation),
        }
    }

    /// Remembers `key → d` (noted in `step`) unless a write happened since
    /// generation `seen`.
    fn fill(&self, ns: &Namespace, key: &RefName, d: Digest, seen: u64, step: i64) {
        let mut st = self.lock();
        if st.generation != seen {
            return;
        }
        if st.len >= KEY_CACHE_ENTRIES {
            st.keys.clear();
            st.len = 0;
        }
        let KeyCacheState { keys, len, .. } = &mut *st;
        let of_ns = match keys.get_mut(ns) {
            Some(m) => m,
            None => keys.entry(ns.clone()).or_default(),
        };
        let r = Remembered {
            digest: d,
            noted: step,
        };
        if of_ns.insert(key.as_str().into(), r).is_none() {
            *len += 1;
        }
    }

    fn invalidate(&self, ns: &Namespace, key: &RefName) {
        let mut st = self.lock();
        let KeyCacheState {
            keys,
            len,
            generation,
        } = &mut *st;
        if keys
            .get_mut(ns)
            .and_then(|m| m.remove(key.as_str()))
            .is_some()
        {
            *len -= 1;
        }
        *generation += 1;
    }

    fn clear(&self) {
        let mut st = self.lock();
        st.keys.clear();
        st.len = 0;
        st.generation += 1;
    }
}

/// Forgets one remembered key when dropped.
struct InvalidateOnDrop<'a>(&'a KeyCache, &'a Namespace, &'a RefName);

impl Drop for InvalidateOnDrop<'_> {
    fn drop(&mut self) {
        self.0.invalidate(self.1, self.2);
    }
}

impl Estimate {
    /// Whether the namespace is (or may be) past its bound, `max` until
    /// a trim read the bound in force.
    fn over(&self, max: u64) -> bool {
        self.bytes.is_none_or(|b| b > self.max.unwrap_or(max))
    }
}

/// Marks a namespace's write-time trim finished when dropped (done, failed,
/// or its task aborted).
struct TrimDone<'a>(&'a Cache, &'a Namespace);

impl Drop for TrimDone<'_> {
    fn drop(&mut self) {
        let mut st = self.0.store.inner.cache_access.bound();
        if let Some(e) = st.get_mut(self.1) {
            e.trimming = false;
        }
    }
}

/// Clears the remembered keys when dropped.
struct ClearOnDrop<'a>(&'a KeyCache);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.clear();
    }
}

/// The reads noted since the last write, and the write-time bound's
/// state of each namespace (one per store).
pub(crate) struct AccessLog {
    state: Mutex<AccessState>,
    bound: Mutex<HashMap<Namespace, Estimate>>,
}

/// A namespace's bytes as this store reckons them between trims.
#[derive(Default)]
struct Estimate {
    /// The bytes its last trim left plus every record through this store
    /// since (an overestimate: a replaced key counts twice); `None` until
    /// the first trim.
    bytes: Option<u64>,
    /// The `max_bytes` its last trim kept to (a fleet's loosest bound).
    max: Option<u64>,
    /// A write-time trim of the namespace is in flight.
    trimming: bool,
    /// The bytes recorded while it was: its read may have missed them.
    during: u64,
    /// What every trim through this store evicted, in total.
    evicted: CacheTrim,
}

struct AccessState {
    pending: Pending,
    /// Digests in `pending`.
    count: usize,
    /// The store's clock at the last write (`None`: none yet; the first
    /// noted read starts the period).
    last_flush: Option<i64>,
    flushing: bool,
    /// The time each digest's read was last taken for a write, within
    /// [`ACCESS_REWRITE_AFTER`] (cleared past [`KEY_CACHE_ENTRIES`]).
    written: HashMap<Namespace, HashMap<Digest, i64>>,
    written_len: usize,
}

impl Default for AccessLog {
    fn default() -> Self {
        AccessLog {
            state: Mutex::new(AccessState {
                pending: HashMap::new(),
                count: 0,
                last_flush: None,
                flushing: false,
                written: HashMap::new(),
                written_len: 0,
            }),
            bound: Mutex::default(),
        }
    }
}

impl AccessLog {
    fn lock(&self) -> MutexGuard<'_, AccessState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn bound(&self) -> MutexGuard<'_, HashMap<Namespace, Estimate>> {
        self.bound.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(st: &mut AccessState, now: i64) -> Pending {
        st.count = 0;
        st.last_flush = Some(now);
        let pending = std::mem::take(&mut st.pending);
        let fresh = now.saturating_sub(ACCESS_REWRITE_AFTER.as_millis() as i64);
        if st.written_len + pending.values().map(HashMap::len).sum::<usize>() > KEY_CACHE_ENTRIES {
            st.written.clear();
            st.written_len = 0;
        }
        for (ns, digests) in &pending {
            let of_ns = st.written.entry(ns.clone()).or_default();
            for (d, at) in digests.iter().filter(|(_, at)| **at > fresh) {
                if of_ns.insert(*d, *at).is_none() {
                    st.written_len += 1;
                }
            }
        }
        pending
    }

    /// Whether a read of `digest` in `ns` at `at` adds nothing: its time
    /// was taken for a write less than [`ACCESS_REWRITE_AFTER`] before.
    fn written_lately(st: &AccessState, ns: &Namespace, digest: &Digest, at: i64) -> bool {
        let after = ACCESS_REWRITE_AFTER.as_millis() as i64;
        (st.written.get(ns).and_then(|m| m.get(digest)))
            .is_some_and(|w| at < w.saturating_add(after))
    }
}

/// The cache keys of a store (ADR-048). Cheap to clone.
#[derive(Clone)]
pub struct Cache {
    store: Store,
    index: Arc<dyn CacheIndex>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("store", &self.store).finish()
    }
}

impl Store {
    /// The cache keys of this store's kv engine, if it can hold them
    /// (`mem`, `sqlite`, `postgres`).
    pub fn cache(&self) -> Option<Cache> {
        let index = self
            .inner
            .cache_keys
            .index
            .get_or_init(|| self.inner.kv.cache());
        index.as_ref().map(|index| Cache {
            store: self.clone(),
            index: index.clone(),
        })
    }

    /// The cache namespaces in force and their bounds: non-fleet the
    /// `Cache` policies set through this store; in a fleet every
    /// namespace with a `cache` row of any node, unless a node's row says
    /// `keep`, with the loosest of the nodes' bounds.
    ///
    /// Cancel-safe (reads only).
    pub async fn cache_namespaces(&self) -> Result<BTreeMap<Namespace, CacheBounds>> {
        match &self.inner.fleet {
            Some(f) => Ok(fleet_cache_namespaces(&f.pins.gc_policies().await?)),
            None => Ok(self
                .policies()
                .active
                .iter()
                .filter_map(|(ns, (p, _))| match p {
                    GcPolicy::Cache(b) => Some((ns.clone(), *b)),
                    _ => None,
                })
                .collect()),
        }
    }

    /// Writes the pending reads, then removes every cache namespace's keys
    /// outside its bound (the first step of a sweep) and deletes the
    /// entries nothing protects any more ([`Cache::trim_now`]). Returns what
    /// each namespace lost.
    ///
    /// Cancel-safe: each batch of a trim is one atomic step; dropped in
    /// between, the rest are trimmed by the next sweep.
    pub async fn trim_caches(&self) -> Result<Vec<(Namespace, CacheTrim)>> {
        let Some(cache) = self.cache() else {
            return Ok(Vec::new());
        };
        cache.flush_access().await?;
        let mut out = Vec::new();
        for (ns, bounds) in self.cache_namespaces().await? {
            out.push((ns.clone(), cache.trim_ns(&ns, bounds, "sweep").await?));
        }
        Ok(out)
    }
}

impl Cache {
    /// Points `key` in `ns` at the entry `receipt` names, accessed now. The
    /// receipt's pin keeps the entry from any sweep until the key is
    /// written; drop the receipt afterwards — the key protects the entry
    /// from then on (until its bound removes it). [`Cache::record_by`] by
    /// the embedding application, with no precondition.
    ///
    /// Cancel-safe: one atomic write; dropped, the key is written or not
    /// (an entry no key names is garbage for the next sweep).
    pub async fn record(&self, ns: &Namespace, key: &RefName, receipt: &PutReceipt) -> Result<()> {
        self.record_by(ns, key, receipt, RefExpect::Any, Author::LIBRARY)
            .await
            .map(|_| ())
    }

    /// [`Cache::record`] if `expect` holds ([`Error::RefConflict`] with the
    /// key's digest otherwise) and `author` may change the key (a key
    /// another writer set is replaced only by [`Replace::Any`](store_types::Replace::Any);
    /// [`Error::NotOwner`] otherwise, ADR-052).
    /// Returns the digest the key held before. A receipt of an entry in
    /// another namespace is refused ([`Error::ReceiptMismatch`]): its pin
    /// would protect nothing the key names.
    ///
    /// Cancel-safe as [`Cache::record`].
    pub async fn record_by(
        &self,
        ns: &Namespace,
        key: &RefName,
        receipt: &PutReceipt,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>> {
        if &receipt.key().namespace != ns {
            return Err(Error::ReceiptMismatch {
                namespace: ns.to_string(),
                receipt: receipt.key().clone(),
            });
        }
        let max = self.bound(ns).and_then(|b| b.max_bytes);
        if let Some(limit) = max.filter(|m| receipt.size > *m) {
            // It would evict every other key and still not fit.
            return Err(Error::TooLarge {
                limit,
                got: receipt.size,
            });
        }
        // A lookup filling in between sees the generation move and does
        // not fill. Invalidated before and when this step ends (done, failed or
        // dropped after the write may have committed).
        self.store.inner.cache_keys.invalidate(ns, key);
        let _after = InvalidateOnDrop(&self.store.inner.cache_keys, ns, key);
        let now = self.store.inner.clock.now();
        let d = receipt.digest;
        let before = (self.index)
            .record(ns, key, d, receipt.size, now, expect, author)
            .await?;
        if let Some(max) = max {
            self.recorded(ns, receipt.size, max);
        }
        Ok(before)
    }

    /// The bound of `ns` set through this store (its `Cache` policy): a
    /// record larger than its `max_bytes` is refused, and records past it
    /// start a trim. (A fleet's sweeps keep to the loosest of the nodes'
    /// bounds, which a write-time trim reads too.)
    pub fn bound(&self, ns: &Namespace) -> Option<CacheBounds> {
        match self.store.gc_policy(ns) {
            Some(GcPolicy::Cache(b)) => Some(b),
            _ => None,
        }
    }

    /// Counts `size` bytes recorded in `ns`; past `max` (or, until the
    /// namespace's first trim, at once) starts [`Cache::trim_now`] in a
    /// task of its own unless one is in flight (ADR-069).
    fn recorded(&self, ns: &Namespace, size: u64, max: u64) {
        {
            let mut st = self.store.inner.cache_access.bound();
            let e = st.entry(ns.clone()).or_default();
            e.bytes = e.bytes.map(|b| b.saturating_add(size));
            if e.trimming {
                e.during += size;
            }
            if !e.over(max) || e.trimming || tokio::runtime::Handle::try_current().is_err() {
                return;
            }
            e.trimming = true;
        }
        let (this, ns) = (self.clone(), ns.clone());
        tokio::spawn(async move {
            let _done = TrimDone(&this, &ns);
            // Again while the puts during a trim leave the estimate over.
            loop {
                if let Err(e) = this.trim_now(&ns).await {
                    tracing::warn!(
                        target: "store_core::cache",
                        namespace = %ns,
                        "write-time cache trim failed (the next put or sweep trims): {}",
                        store_types::Report::new(&e)
                    );
                    break;
                }
                let st = this.store.inner.cache_access.bound();
                if !st.get(&ns).is_some_and(|e| e.over(max)) {
                    break;
                }
            }
        });
    }

    /// Writes the pending reads, then trims `ns` to its bound in force
    /// ([`Store::cache_namespaces`]) as a sweep does. Cancel-safe as
    /// [`Store::trim_caches`].
    pub async fn trim_now(&self, ns: &Namespace) -> Result<CacheTrim> {
        self.flush_access().await?;
        match self.store.cache_namespaces().await?.get(ns) {
            Some(bounds) => self.trim_ns(ns, *bounds, "write").await,
            None => {
                // No bound in force (a fleet node keeps the namespace):
                // not over until a sweep's trim reads one, so the task
                // ends instead of asking again without pause.
                let mut st = self.store.inner.cache_access.bound();
                let e = st.entry(ns.clone()).or_default();
                (e.bytes, e.max) = (Some(0), Some(u64::MAX));
                Ok(CacheTrim::default())
            }
        }
    }

    /// Removes the keys of `ns` outside `bounds`, then deletes their
    /// entries that no key, reference, pin or protect callback holds (a
    /// direct delete, arbitrated as any: ADR-069), so they leave the media
    /// now, not one delete window after the next sweep; one that cannot go
    /// now is the sweep's. Logs and counts what went.
    async fn trim_ns(&self, ns: &Namespace, bounds: CacheBounds, why: &str) -> Result<CacheTrim> {
        let mut evicted = Vec::new();
        // Whatever the outcome — done, failed, or this future dropped
        // mid-trim (which may still commit) — remembered keys may be
        // gone: forget them all when the step ends.
        let (t, left) = {
            let _forget = ClearOnDrop(&self.store.inner.cache_keys);
            let now = self.store.inner.clock.now();
            trim_evicting(&*self.index, ns, bounds, now, &mut evicted).await?
        };
        {
            let mut st = self.store.inner.cache_access.bound();
            let e = st.entry(ns.clone()).or_default();
            // No byte bound in force: never over (not this node's `max`).
            (e.bytes, e.max) = (
                Some(left + e.during),
                Some(bounds.max_bytes.unwrap_or(u64::MAX)),
            );
            e.during = 0;
            (e.evicted.keys, e.evicted.bytes) =
                (e.evicted.keys + t.keys, e.evicted.bytes + t.bytes);
        }
        if t.keys > 0 {
            let (deleted, freed) = self.delete_evicted(ns, evicted).await;
            tracing::info!(
                target: "store_core::gc",
                namespace = %ns,
                keys = t.keys,
                bytes = t.bytes,
                deleted,
                freed,
                "cache trim ({bounds}, {why})"
            );
        }
        Ok(t)
    }

    /// Deletes each entry of `digests` in `ns` nothing protects, up to
    /// [`EVICT_DELETES`] at a time; the entries deleted and the bytes freed.
    async fn delete_evicted(&self, ns: &Namespace, digests: Vec<Digest>) -> (u64, u64) {
        use futures::StreamExt;
        let digests: HashSet<Digest> = digests.into_iter().collect();
        let gc = &self.store.inner.gc;
        let deletes = futures::stream::iter(digests)
            .map(|d| async move { (d, gc.delete(&crate::Key::new(ns.clone(), d)).await) })
            .buffer_unordered(EVICT_DELETES);
        let freed = deletes.filter_map(|(d, r)| async move {
            match r {
                Ok(n) => Some(n),
                // Protected again, or gone already.
                Err(Error::GcRefuse { .. } | Error::Missing) => None,
                Err(e) => {
                    tracing::warn!(
                        target: "store_core::cache",
                        namespace = %ns,
                        digest = %d,
                        "deleting an evicted cache entry failed (a sweep deletes it): {}",
                        store_types::Report::new(&e)
                    );
                    None
                }
            }
        });
        let freed: Vec<u64> = freed.collect().await;
        (freed.len() as u64, freed.iter().sum())
    }

    /// What the trims through this store evicted since it opened (keys
    /// and their bytes), by namespace.
    pub fn evicted(&self) -> Vec<(Namespace, CacheTrim)> {
        let st = self.store.inner.cache_access.bound();
        st.iter().map(|(ns, e)| (ns.clone(), e.evicted)).collect()
    }

    /// Stores `bytes` in `ns` and points `key` at them (the library's
    /// whole cache put). Cancel-safe as [`Store::put_bytes`] then
    /// [`Cache::record`].
    pub async fn put(&self, ns: &Namespace, key: &RefName, bytes: Bytes) -> Result<Digest> {
        let receipt = self.store.put_bytes(ns, bytes).await?;
        self.record(ns, key, &receipt).await?;
        Ok(receipt.digest)
    }

    /// The digest `key` points at, noting the read (see the module docs).
    /// Cancel-safe (a read).
    pub async fn lookup(&self, ns: &Namespace, key: &RefName) -> Result<Option<Digest>> {
        // The one clock read of a lookup: the step its read is noted in.
        let step = self.access_step();
        let seen = if self.store.is_fleet() {
            None
        } else {
            match self.store.inner.cache_keys.recall(ns, key, step) {
                Recall::Noted(d) => return Ok(Some(d)),
                Recall::Hit(d) => {
                    self.note_at(ns, d, step);
                    return Ok(Some(d));
                }
                Recall::Miss(seen) => Some(seen),
            }
        };
        let d = self.index.lookup(ns, key).await?;
        if let Some(d) = d {
            if let Some(seen) = seen {
                self.store.inner.cache_keys.fill(ns, key, d, seen, step);
            }
            self.note_at(ns, d, step);
        }
        Ok(d)
    }

    /// For each of `keys`, the digest it points at, noting the reads:
    /// [`Cache::lookup`] of many keys, those not remembered asked of the
    /// index in one round trip. Cancel-safe (a read).
    pub async fn lookup_many(
        &self,
        ns: &Namespace,
        keys: &[RefName],
    ) -> Result<Vec<Option<Digest>>> {
        let step = self.access_step();
        let fleet = self.store.is_fleet();
        let mut out = vec![None; keys.len()];
        // The keys to ask the index about: their index and the generation
        // a fill must still see (`None` in a fleet: nothing is remembered).
        let mut ask: Vec<(usize, Option<u64>)> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            if fleet {
                ask.push((i, None));
                continue;
            }
            match self.store.inner.cache_keys.recall(ns, key, step) {
                Recall::Noted(d) => out[i] = Some(d),
                Recall::Hit(d) => {
                    self.note_at(ns, d, step);
                    out[i] = Some(d);
                }
                Recall::Miss(seen) => ask.push((i, Some(seen))),
            }
        }
        if ask.is_empty() {
            return Ok(out);
        }
        let asked: Vec<RefName> = ask.iter().map(|(i, _)| keys[*i].clone()).collect();
        let found = self.index.lookup_many(ns, &asked).await?;
        for ((i, seen), d) in ask.into_iter().zip(found) {
            let Some(d) = d else { continue };
            if let Some(seen) = seen {
                self.store
                    .inner
                    .cache_keys
                    .fill(ns, &keys[i], d, seen, step);
            }
            self.note_at(ns, d, step);
            out[i] = Some(d);
        }
        Ok(out)
    }

    /// The key's entry (a [`Blob`] to read or stream), or `None` when the
    /// key or its entry is gone (a key whose entry a sweep deleted is
    /// removed here). Notes the read. Cancel-safe (a read, and an atomic
    /// conditional removal).
    pub async fn get(&self, ns: &Namespace, key: &RefName) -> Result<Option<(Digest, Blob)>> {
        let Some(d) = self.lookup(ns, key).await? else {
            return Ok(None);
        };
        match self.store.get(&crate::Key::new(ns.clone(), d)).await? {
            Some(blob) => Ok(Some((d, blob))),
            None => {
                self.forget_missing(ns, key, d).await?;
                Ok(None)
            }
        }
    }

    /// Removes `key` when it still points at `digest`, whose entry the
    /// caller found missing (deleted by a sweep after its key was trimmed
    /// and recorded again, or removed by an operator).
    /// Cancel-safe: one atomic conditional removal.
    pub async fn forget_missing(
        &self,
        ns: &Namespace,
        key: &RefName,
        digest: Digest,
    ) -> Result<()> {
        // Invalidated before and when this step ends (done, failed or
        // dropped after the write may have committed).
        self.store.inner.cache_keys.invalidate(ns, key);
        let _after = InvalidateOnDrop(&self.store.inner.cache_keys, ns, key);
        self.index.remove(ns, key, Some(digest)).await.map(|_| ())
    }

    /// Removes `key` (if it points at `expect`, when given); `true` if it
    /// was there. Its entry is garbage for the next sweep unless another
    /// key, a reference or a pin protects it. Cancel-safe: one atomic write.
    pub async fn remove(
        &self,
        ns: &Namespace,
        key: &RefName,
        expect: Option<Digest>,
    ) -> Result<bool> {
        // Invalidated before and when this step ends (done, failed or
        // dropped after the write may have committed).
        self.store.inner.cache_keys.invalidate(ns, key);
        let _after = InvalidateOnDrop(&self.store.inner.cache_keys, ns, key);
        self.index.remove(ns, key, expect).await
    }

    /// Notes a read of `digest` in `ns` for the bound's recency; never
    /// waits on a write (see the module docs).
    pub fn note_access(&self, ns: &Namespace, digest: Digest) {
        self.note_at(ns, digest, self.access_step());
    }

    /// Now on the store's clock, rounded down to [`ACCESS_RESOLUTION`].
    fn access_step(&self) -> i64 {
        let step = ACCESS_RESOLUTION.as_millis() as i64;
        self.store.inner.clock.now().0.div_euclid(step) * step
    }

    /// Notes a read of `digest` in `ns` at `at` (an access step); starts
    /// the write of the noted reads when due.
    fn note_at(&self, ns: &Namespace, digest: Digest, at: i64) {
        let log = &self.store.inner.cache_access;
        let batch = {
            let mut st = log.lock();
            if AccessLog::written_lately(&st, ns, &digest, at) {
                return;
            }
            let AccessState {
                pending,
                count,
                last_flush,
                flushing,
                ..
            } = &mut *st;
            let of_ns = match pending.get_mut(ns) {
                Some(m) => m,
                None => pending.entry(ns.clone()).or_default(),
            };
            match of_ns.entry(digest) {
                Entry::Occupied(mut e) => {
                    let t = e.get_mut();
                    *t = (*t).max(at);
                }
                Entry::Vacant(e) => {
                    e.insert(at);
                    *count += 1;
                }
            }
            let since = *last_flush.get_or_insert(at);
            let every = ACCESS_FLUSH_EVERY.as_millis() as i64;
            let due = *count >= ACCESS_FLUSH_KEYS || at.saturating_sub(since) >= every;
            if !due || *flushing || tokio::runtime::Handle::try_current().is_err() {
                return;
            }
            *flushing = true;
            AccessLog::take(&mut st, at)
        };
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.write_access(batch).await {
                tracing::warn!(
                    target: "store_core::cache",
                    "recording cache reads failed (their keys keep their older access time): {}",
                    store_types::Report::new(&e)
                );
            }
            this.store.inner.cache_access.lock().flushing = false;
        });
    }

    /// Writes every pending read now. Cancel-safe: a batch dropped
    /// mid-write loses only recency (the reads it held look older).
    pub async fn flush_access(&self) -> Result<()> {
        let now = self.store.inner.clock.now().0;
        let batch = AccessLog::take(&mut self.store.inner.cache_access.lock(), now);
        self.write_access(batch).await
    }

    /// One `touch` per namespace and noted time, oldest first (an engine
    /// with its own clock stamps them all with its now: their order within
    /// one write is then lost, never their order against later writes).
    async fn write_access(&self, batch: Pending) -> Result<()> {
        for (ns, digests) in batch {
            let mut by_time: BTreeMap<i64, Vec<Digest>> = BTreeMap::new();
            for (d, at) in digests {
                by_time.entry(at).or_default().push(d);
            }
            for (at, digests) in by_time {
                for chunk in digests.chunks(1000) {
                    self.index
                        .touch(&ns, chunk, store_types::Timestamp(at))
                        .await?;
                }
            }
        }
        Ok(())
    }

    /// What the keys hold, per namespace. Cancel-safe (a read).
    pub async fn usage(&self) -> Result<Vec<(Namespace, CacheUsage)>> {
        self.index.usage().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, size: u64, at: i64) -> CacheEntry {
        CacheEntry {
            key: RefName::new(key).unwrap(),
            digest: Digest::of(key.as_bytes()),
            size,
            accessed_at: Timestamp(at),
        }
    }

    fn keys(v: Vec<CacheEntry>) -> Vec<String> {
        v.into_iter().map(|e| e.key.to_string()).collect()
    }

    #[test]
    fn the_bound_removes_the_oldest_and_of_ties_the_greater_key_first() {
        let page = |entries| CachePage {
            now: Timestamp(1_000),
            bytes: 40,
            entries,
        };
        let entries = vec![
            entry("a", 10, 5),
            entry("c", 10, 7),
            entry("b", 10, 5),
            entry("d", 10, 9),
        ];
        let bytes = |max| CacheBounds {
            max_bytes: Some(max),
            max_age: None,
        };
        assert_eq!(
            keys(outside(bytes(40), page(entries.clone()))),
            Vec::<String>::new()
        );
        assert_eq!(keys(outside(bytes(30), page(entries.clone()))), ["b"]);
        assert_eq!(
            keys(outside(bytes(15), page(entries.clone()))),
            ["b", "a", "c"]
        );
        // The age cut counts on the page's clock; what it removes leaves the
        // byte bound's count.
        let age = CacheBounds {
            max_bytes: Some(20),
            max_age: Some(Duration::from_millis(994)),
        };
        assert_eq!(keys(outside(age, page(entries))), ["b", "a"]);
    }
}
