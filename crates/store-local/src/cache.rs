//! The open-file cache (TUNING.md §local-small-reads): descriptors of recently read entry
//! files, so a repeated small read needs no `open(2)` — which may block on
//! a cold directory or inode — and can be served in the calling task when
//! its bytes are in the page cache (`reader.rs`, `RWF_NOWAIT`).
//!
//! # What it holds
//!
//! At most [`LocalOptions::open_files`](crate::LocalOptions::open_files)
//! descriptors, one per entry, inserted when a small read opened the file
//! on a blocking thread (never by a put), evicted by a CLOCK sweep (a
//! descriptor used since the hand last passed gets a second chance).
//! Evicted and invalidated descriptors are closed where they are removed —
//! on a blocking thread — or, when a read still holds one, by the last
//! holder, off the runtime ([`release`]).
//!
//! # Exact invalidation
//!
//! Entries are content-addressed and never change in place; they only go
//! away (a delete) or, when an unusable file held the name, get replaced
//! (a publish renaming over it). A cached descriptor keeps reading the
//! file it opened, so every such removal invalidates the key **after** the
//! name is gone and **before** the call returns, in every cache of the
//! same root in this process (a per-root registry, as for SQLite's hot
//! cache, TUNING.md §sqlite-hot-cache). Invalidation and insertion serialise on the cache's
//! lock:
//!
//! - an invalidation bumps the epoch and removes the keys;
//! - a read loads the epoch *before* it opens the file, and inserts the
//!   descriptor only if the epoch is unchanged.
//!
//! A read that opened the file before a delete unlinked it either inserts
//! before that delete's invalidation (which removes it) or sees the bumped
//! epoch and does not insert. So once a delete has returned, no cached
//! descriptor in the process answers for the key.
//!
//! Another process (or node) removing entries would not invalidate this
//! cache: a store holds its root exclusively (the instance lock), and a
//! root on shared media (`shared_media: true`) never caches descriptors.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use store_types::Key;

/// One cached descriptor.
pub(crate) struct OpenFile {
    pub(crate) file: File,
    /// Set by every hit; cleared by the CLOCK hand.
    used: AtomicBool,
}

/// One engine's cache (empty when `open_files` is 0), and its place in the
/// per-root list invalidations go through.
pub(crate) struct OpenFiles {
    capacity: usize,
    state: Mutex<State>,
    root: PathBuf,
}

#[derive(Default)]
struct State {
    /// Bumped by every invalidation.
    epoch: u64,
    files: HashMap<Key, Arc<OpenFile>>,
    /// The CLOCK ring: every key of `files` once, the hand at the front.
    ring: VecDeque<Key>,
}

/// Every live cache, by canonical root: an invalidation reaches them all.
static BY_ROOT: Mutex<Option<HashMap<PathBuf, Vec<Weak<OpenFiles>>>>> = Mutex::new(None);

impl OpenFiles {
    /// A cache of at most `capacity` descriptors (none when 0) for the
    /// engine on the canonical `root`, registered for that root's
    /// invalidations.
    pub(crate) fn register(root: &Path, capacity: usize) -> Arc<OpenFiles> {
        let cache = Arc::new(OpenFiles {
            capacity,
            state: Mutex::default(),
            root: root.to_path_buf(),
        });
        let mut all = lock(&BY_ROOT);
        let peers = all
            .get_or_insert_with(HashMap::new)
            .entry(root.to_path_buf())
            .or_default();
        peers.retain(|w| w.strong_count() > 0);
        peers.push(Arc::downgrade(&cache));
        cache
    }

    /// Whether this cache holds descriptors at all.
    pub(crate) fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// The cached descriptor of `key`'s entry, if any.
    pub(crate) fn get(&self, key: &Key) -> Option<Arc<OpenFile>> {
        if !self.enabled() {
            return None;
        }
        let f = lock(&self.state).files.get(key).cloned()?;
        f.used.store(true, Ordering::Relaxed);
        Some(f)
    }

    /// The current epoch: load it before opening a file that may be
    /// [`offer`](Self::offer)ed.
    pub(crate) fn epoch(&self) -> u64 {
        lock(&self.state).epoch
    }

    /// Caches `file` (just opened for `key`) unless an invalidation ran
    /// since `seen` (the [`epoch`](Self::epoch) loaded before the open) or
    /// the key is cached already. Returns the descriptor to read with (the
    /// cached one). Call on a blocking thread: it may close an evicted
    /// descriptor.
    pub(crate) fn offer(&self, key: &Key, file: File, seen: u64) -> Arc<OpenFile> {
        let fresh = Arc::new(OpenFile {
            file,
            used: AtomicBool::new(false),
        });
        if !self.enabled() {
            return fresh;
        }
        let mut evicted = Vec::new();
        let mut s = lock(&self.state);
        if s.epoch != seen {
            return fresh;
        }
        if let Some(cached) = s.files.get(key) {
            return cached.clone();
        }
        while s.files.len() >= self.capacity {
            let Some(k) = s.ring.pop_front() else {
                break;
            };
            let second_chance = s
                .files
                .get(&k)
                .is_some_and(|f| f.used.swap(false, Ordering::Relaxed));
            if second_chance {
                s.ring.push_back(k);
            } else if let Some(f) = s.files.remove(&k) {
                evicted.push(f);
            }
        }
        s.files.insert(key.clone(), fresh.clone());
        s.ring.push_back(key.clone());
        drop(s);
        drop(evicted); // Closed here, on the caller's blocking thread.
        fresh
    }

    /// Removes `keys` from every cache of this root in the process. Call
    /// after their names are gone (or replaced), before the call that
    /// removed them returns, on a blocking thread (it may close the
    /// descriptors, the last link of a deleted file).
    pub(crate) fn invalidate(&self, keys: &[Key]) {
        let peers: Vec<Arc<OpenFiles>> = lock(&BY_ROOT)
            .as_ref()
            .and_then(|all| all.get(&self.root))
            .map(|peers| peers.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for cache in peers {
            cache.invalidate_here(keys);
        }
    }

    fn invalidate_here(&self, keys: &[Key]) {
        let mut removed = Vec::new();
        let mut s = lock(&self.state);
        s.epoch += 1;
        for k in keys {
            if let Some(f) = s.files.remove(k) {
                removed.push(f);
                s.ring.retain(|r| r != k);
            }
        }
        drop(s);
        drop(removed);
    }

    /// Descriptors held now.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn len(&self) -> usize {
        lock(&self.state).files.len()
    }
}

impl Drop for OpenFiles {
    fn drop(&mut self) {
        if let Some(all) = lock(&BY_ROOT).as_mut() {
            if let Some(peers) = all.get_mut(&self.root) {
                peers.retain(|w| w.strong_count() > 0);
                if peers.is_empty() {
                    all.remove(&self.root);
                }
            }
        }
    }
}

/// Lets go of a descriptor a read used in async code: if the cache dropped
/// it meanwhile (evicted, or invalidated by a delete), this is the last
/// holder, and the close — for a deleted file, the freeing of its blocks —
/// runs on a blocking thread, never on the runtime's. Outside a runtime
/// (a reader dropped after its runtime ended) it closes in place: there
/// is no runtime thread to keep free, and no pool to hand it to.
pub(crate) fn release(file: Arc<OpenFile>) {
    if let Ok(last) = Arc::try_unwrap(file) {
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(move || drop(last))),
            Err(_) => drop(last),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
