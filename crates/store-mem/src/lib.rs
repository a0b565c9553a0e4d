//! In-memory kv and large engine for Blobpool.
//!
//! [`MemEngine`] keeps every entry in process memory. One type serves as a
//! kv engine ([`KvEngine`](store_types::KvEngine)) and as a large engine ([`LargeEngine`](store_types::LargeEngine)); two
//! instances built with [`MemEngine::new`] are independent, while clones of
//! one instance share its state.
//!
//! # Layout
//!
//! One `BTreeMap<Namespace, BTreeMap<Digest, Entry>>` behind a
//! [`std::sync::RwLock`]. The lock is never held across an `.await`, and
//! every critical section is a map lookup or insert (content is
//! reference-counted [`Bytes`], so reads clone a handle, not the data).
//! `scan` walks the per-namespace map in digest order; a namespace whose
//! last entry is deleted is removed, so `namespaces` lists only non-empty
//! ones.
//!
//! # Staged writes
//!
//! A stage ([`LargeEngine::stage`](store_types::LargeEngine::stage)) accumulates chunks privately; nothing
//! is visible until `publish`, which concatenates the chunks and inserts
//! the entry if the key is absent (one write-lock section, so concurrent
//! publishes of one key yield exactly one `Inserted`), together with its
//! outboard (ADR-032) when the facade handed one over. Dropping or
//! aborting a stage frees its chunks and leaves nothing behind.
//!
//! # References
//!
//! [`KvEngine::refs`](store_types::KvEngine::refs) answers with the
//! engine's [`RefStore`](store_types::RefStore): a map
//! `(namespace, name) → digest` behind its own mutex (compare-and-swap is
//! one critical section), shared by clones like the entries and lost with
//! them (see the `refs` module).
//!
//! # Durability
//!
//! None: the descriptor says `durable: false`, `Sharing::ProcessLocal`.
//! Everything is lost when the last clone is dropped. `mem` is not a GC
//! seam member (its `Capabilities::seam` is `None`).

mod cache_keys;
mod engine;
mod refs;
mod registration;
mod stage;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use bytes::Bytes;
use store_types::{Digest, Namespace, Timestamp};

use cache_keys::MemCache;
use refs::MemRefs;
pub use registration::REGISTRATION;
use stage::MemStage;

/// One stored entry.
#[derive(Clone)]
struct Entry {
    bytes: Bytes,
    created_at: Timestamp,
    /// The BLAKE3 outboard published with a large entry (ADR-032), or
    /// given to it later (`store_outboard`); kv entries keep none.
    outboard: Option<Bytes>,
}

/// Every entry, per namespace, in digest order.
type Tables = BTreeMap<Namespace, BTreeMap<Digest, Entry>>;

/// An in-memory engine usable as kv engine, large engine, or both.
///
/// Cloning is cheap and shares state; [`MemEngine::new`] creates a fresh,
/// independent store.
#[derive(Clone, Default)]
pub struct MemEngine {
    tables: Arc<RwLock<Tables>>,
    /// The named references (`KvEngine::refs`), shared by clones.
    refs: Arc<MemRefs>,
    /// The cache keys (`KvEngine::cache`), shared by clones.
    cache: Arc<MemCache>,
}

impl MemEngine {
    /// An empty engine, independent of every other instance.
    pub fn new() -> Self {
        Self::default()
    }

    /// The read half of the lock. A poisoned lock is recovered: every
    /// critical section leaves the maps consistent even if it panics.
    fn read_tables(&self) -> RwLockReadGuard<'_, Tables> {
        self.tables.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The write half of the lock (see [`MemEngine::read_tables`]).
    fn write_tables(&self) -> RwLockWriteGuard<'_, Tables> {
        self.tables.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Inserts `bytes` (with `outboard`) under `(ns, digest)` unless an
    /// entry is already there; returns whether it inserted. An existing
    /// entry without an outboard gets `outboard`. One critical section, so
    /// the entry and its outboard become visible together.
    fn insert_if_absent(
        &self,
        ns: &Namespace,
        digest: Digest,
        bytes: Bytes,
        outboard: Option<Bytes>,
    ) -> bool {
        let mut tables = self.write_tables();
        let table = tables.entry(ns.clone()).or_default();
        if let Some(existing) = table.get_mut(&digest) {
            if existing.outboard.is_none() {
                existing.outboard = outboard;
            }
            return false;
        }
        table.insert(
            digest,
            Entry {
                bytes,
                created_at: Timestamp::now(),
                outboard,
            },
        );
        true
    }

    /// Test helper: damages the stored content of `key` so that reads no
    /// longer hash to its digest. The byte in the middle of the content is
    /// bit-flipped; an empty entry gets one byte appended instead (there
    /// is no byte to flip), so it too stops matching its digest.
    ///
    /// Returns [`store_types::Error::Missing`] when `key` is absent.
    #[cfg(feature = "testing")]
    pub fn corrupt_one_byte(&self, key: &store_types::Key) -> Result<(), store_types::Error> {
        let mut tables = self.write_tables();
        let entry = tables
            .get_mut(&key.namespace)
            .and_then(|t| t.get_mut(&key.digest))
            .ok_or(store_types::Error::Missing)?;
        let mut data = entry.bytes.to_vec();
        if data.is_empty() {
            data.push(0);
        } else {
            let mid = data.len() / 2;
            data[mid] ^= 0xff;
        }
        entry.bytes = Bytes::from(data);
        Ok(())
    }

    /// Test helper: flips (`^ 0xff`) the stored byte at `offset` of `key`,
    /// size unchanged.
    ///
    /// Returns [`store_types::Error::Missing`] when `key` is absent and an
    /// [`store_types::ErrorKind::InvalidData`] error when `offset` is not
    /// inside the content.
    #[cfg(feature = "testing")]
    pub fn corrupt_byte_at(
        &self,
        key: &store_types::Key,
        offset: u64,
    ) -> Result<(), store_types::Error> {
        let mut tables = self.write_tables();
        let entry = tables
            .get_mut(&key.namespace)
            .and_then(|t| t.get_mut(&key.digest))
            .ok_or(store_types::Error::Missing)?;
        let mut data = entry.bytes.to_vec();
        let byte = usize::try_from(offset)
            .ok()
            .and_then(|i| data.get_mut(i))
            .ok_or_else(|| {
                store_types::Error::backend(
                    store_types::ErrorKind::InvalidData,
                    "corrupting a byte past the end",
                )
                .with_key(key)
            })?;
        *byte ^= 0xff;
        entry.bytes = Bytes::from(data);
        Ok(())
    }
}

impl fmt::Debug for MemEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tables = self.read_tables();
        let entries: usize = tables.values().map(BTreeMap::len).sum();
        f.debug_struct("MemEngine")
            .field("namespaces", &tables.len())
            .field("entries", &entries)
            .finish()
    }
}
