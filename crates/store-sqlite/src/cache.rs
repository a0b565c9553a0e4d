//! The hot-entry cache (TUNING.md §sqlite-hot-cache): recently read entries' bytes, so a
//! repeated `read`, `meta` or `has_many` of a hot key is answered in the
//! calling task, without a hand-off to the blocking pool.
//!
//! # What it holds
//!
//! Entries of at most [`HotCache::max_entry`] bytes, inserted when a read
//! fetched them from the file (never by a put), weighed by their length,
//! evicted by `quick_cache`'s CLOCK-Pro policy within
//! [`SqliteOptions::cache_bytes`](crate::SqliteOptions::cache_bytes). The
//! bytes are the stored bytes as read, hashed once when they were read
//! ([`Hot::digest`]); only bytes that hash to their key's digest are
//! cached. A whole read hands that digest to the facade with the bytes
//! ([`store_types::BlobReader::hashed_bytes`]), which compares it with the
//! key's instead of hashing the same immutable bytes again on every hit
//! (ADR-080); a range is verified by the facade as before.
//!
//! # Exact invalidation
//!
//! Content-addressed entries never change; they only go away. Every
//! removal of a row of `entries` goes through the engine's writer thread
//! (`delete_many`, and the test hook `corrupt_one_byte`), which, **after**
//! the transaction's `COMMIT` (or its failure) and **before** answering the
//! waiter, calls [`HotCache::invalidate`] on every cache of the same file in
//! this process. Invalidation and insertion serialise on a small gate:
//!
//! - an invalidation bumps the cache's epoch (under the gate), then
//!   removes the keys (outside it, so a sweep's large invalidation never
//!   holds up a read's insertion);
//! - a read loads the epoch *before* its query and inserts what it found
//!   only if the epoch is unchanged, under the gate.
//!
//! A read whose snapshot still held a row that a delete then committed
//! away either inserts before that delete's invalidation (which removes
//! it) or sees the bumped epoch and does not insert. So once a delete has
//! returned, no cache of the file can answer for the deleted key.
//!
//! Another *process* deleting rows of the file would not invalidate this
//! one's cache: a store holds its database exclusively (the instance
//! lock), and an engine opened without a store should turn the cache off
//! (`cache_bytes: 0`) if another process may write the file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use quick_cache::sync::Cache;
use quick_cache::Weighter;
use store_types::{Digest, Key};

/// Bytes charged per cached entry beyond its content (key, bookkeeping).
const ENTRY_OVERHEAD: u64 = 128;

/// Largest entry the cache takes, whatever its capacity.
pub(crate) const MAX_CACHED_ENTRY: usize = 256 * 1024;

/// A cached entry: its stored bytes, their BLAKE3 digest, recorded size
/// and creation time (`meta` is answered from the last two, as from the
/// row).
#[derive(Clone)]
pub(crate) struct Hot {
    pub(crate) content: Bytes,
    /// The digest of `content`, computed once when it was read from the
    /// file ([`Hot::read`]); a whole read hands it to the facade, which
    /// then compares instead of hashing again (ADR-080).
    pub(crate) digest: Digest,
    pub(crate) size: i64,
    pub(crate) created_at: i64,
}

impl Hot {
    /// A row as read from the file, its content hashed.
    pub(crate) fn read(content: Bytes, size: i64, created_at: i64) -> Hot {
        Hot {
            digest: Digest::of(&content),
            content,
            size,
            created_at,
        }
    }
}

#[derive(Clone)]
struct ByLength;

impl Weighter<Key, Hot> for ByLength {
    fn weight(&self, key: &Key, hot: &Hot) -> u64 {
        hot.content.len() as u64 + key.namespace.as_str().len() as u64 + ENTRY_OVERHEAD
    }
}

/// One engine's cache (or its empty stand-in when the cache is off), and
/// its place in the per-file list invalidations go through.
pub(crate) struct HotCache {
    /// `None` when the engine was opened with `cache_bytes: 0`.
    entries: Option<Cache<Key, Hot, ByLength>>,
    /// Bumped by every invalidation (under `gate`).
    epoch: AtomicU64,
    /// Serialises "check the epoch, insert" against "bump, remove".
    gate: Mutex<()>,
    max_entry: usize,
    path: PathBuf,
}

/// Every live cache, by database file: an invalidation reaches them all.
static BY_FILE: Mutex<Option<HashMap<PathBuf, Vec<Weak<HotCache>>>>> = Mutex::new(None);

impl HotCache {
    /// A cache of `capacity` bytes (none when 0) for the engine on the
    /// canonical database path `path`, registered for that file's
    /// invalidations.
    pub(crate) fn register(path: &Path, capacity: u64) -> Arc<HotCache> {
        let entries = (capacity > 0).then(|| {
            let estimated = (capacity / (4 * 1024)).clamp(16, 1 << 20) as usize;
            Cache::with_weighter(estimated, capacity, ByLength)
        });
        let max_entry = (capacity / 16).min(MAX_CACHED_ENTRY as u64) as usize;
        let cache = Arc::new(HotCache {
            entries,
            epoch: AtomicU64::new(0),
            gate: Mutex::new(()),
            max_entry,
            path: path.to_path_buf(),
        });
        let mut all = lock(&BY_FILE);
        let all = all.get_or_insert_with(HashMap::new);
        let peers = all.entry(path.to_path_buf()).or_default();
        peers.retain(|w| w.strong_count() > 0);
        peers.push(Arc::downgrade(&cache));
        cache
    }

    /// Whether an entry of `len` bytes would be cached (the cache is on
    /// and the entry within its size limit).
    pub(crate) fn takes(&self, len: usize) -> bool {
        self.entries.is_some() && len <= self.max_entry
    }

    /// The cached entry of `key`, if any.
    pub(crate) fn get(&self, key: &Key) -> Option<Hot> {
        self.entries.as_ref()?.get(key)
    }

    /// The current epoch: load it before a query whose answer may be
    /// [`offer`](Self::offer)ed.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Inserts what a query found, unless an invalidation ran since `seen`
    /// (the [`epoch`](Self::epoch) loaded before the query), the entry is
    /// too large to cache, or its bytes do not hash to the key's digest (a
    /// corrupt row is read from the file again every time, and fails
    /// verification every time).
    pub(crate) fn offer(&self, key: &Key, hot: Hot, seen: u64) {
        let Some(entries) = &self.entries else {
            return;
        };
        if !self.takes(hot.content.len()) || hot.digest != key.digest {
            return;
        }
        let _gate = lock(&self.gate);
        if self.epoch.load(Ordering::SeqCst) == seen {
            entries.insert(key.clone(), hot);
        }
    }

    /// Removes `keys` from every cache of this file in the process. Call
    /// after the transaction that removed (or may have removed) their rows
    /// has committed or failed, before the write is answered.
    pub(crate) fn invalidate(&self, keys: &[Key]) {
        let peers: Vec<Arc<HotCache>> = lock(&BY_FILE)
            .as_ref()
            .and_then(|all| all.get(&self.path))
            .map(|peers| peers.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for cache in peers {
            cache.invalidate_here(keys);
        }
    }

    /// Bumps the epoch under the gate, then removes the keys outside it:
    /// an offer that checked the epoch before the bump inserted before it
    /// (and is removed here); one that checks after it sees the bump; and a
    /// read that loads the bumped epoch began its query after the delete's
    /// commit, so it cannot find a deleted row to offer. So reads' offers
    /// never wait while a sweep's delete removes its keys (ADR-058).
    fn invalidate_here(&self, keys: &[Key]) {
        {
            let _gate = lock(&self.gate);
            self.epoch.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(entries) = &self.entries {
            for k in keys {
                entries.remove(k);
            }
        }
    }

    /// Entries and bytes (as weighed) held now.
    pub(crate) fn usage(&self) -> (usize, u64) {
        self.entries
            .as_ref()
            .map_or((0, 0), |e| (e.len(), e.weight()))
    }
}

impl Drop for HotCache {
    fn drop(&mut self) {
        if let Some(all) = lock(&BY_FILE).as_mut() {
            if let Some(peers) = all.get_mut(&self.path) {
                peers.retain(|w| w.strong_count() > 0);
                if peers.is_empty() {
                    all.remove(&self.path);
                }
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
