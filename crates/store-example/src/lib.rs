//! A toy engine for Blobpool: the worked example of docs/ENGINES.md,
//! "Adding an engine".
//!
//! [`ExampleEngine`] keeps every entry of one store in a single ordered map
//! `Key → (bytes, created_at)` behind a mutex, serves as a kv engine and as
//! a large engine, and is registered under `example://` (see
//! [`REGISTRATION`]). It is written against `store-types` alone — like
//! every engine — and passes the whole contract suite
//! (`tests-contract/tests/contract.rs`, module `example_example`).
//!
//! It is real but small: nothing is durable (the descriptor says so, and
//! the facade keeps the delete window in process for it), every open of
//! `example://` is a fresh, private store, and it holds no named
//! references. Use `store-mem` for an in-memory store in production; this
//! crate exists to show, and to keep proving in CI, what an engine crate
//! has to provide.
//!
//! # Layout
//!
//! `BTreeMap<Key, Entry>`: keys order by namespace, then digest, so a
//! namespace's entries are one contiguous range and `scan` is a range
//! walk. The mutex is never held across an `.await`.
//!
//! # Staged writes
//!
//! A stage appends chunks to a private buffer; `publish` inserts it under
//! the key in one critical section if the key is absent (exactly one
//! `Inserted` among concurrent publishes). Dropping or aborting a stage
//! frees the buffer: nothing was ever visible.

mod engine;
mod registration;
mod stage;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use store_types::{Key, Timestamp};

pub use registration::REGISTRATION;

/// One stored entry.
#[derive(Clone)]
struct Entry {
    bytes: Bytes,
    created_at: Timestamp,
}

/// The toy engine. Clones share the store; [`ExampleEngine::new`] makes a
/// fresh one.
#[derive(Clone, Default)]
pub struct ExampleEngine {
    entries: Arc<Mutex<BTreeMap<Key, Entry>>>,
}

impl ExampleEngine {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The map. A poisoned lock is recovered: every critical section
    /// leaves the map consistent.
    fn entries(&self) -> MutexGuard<'_, BTreeMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Inserts `bytes` under `key` unless present; whether it inserted.
    fn insert_if_absent(&self, key: &Key, bytes: Bytes) -> bool {
        let mut entries = self.entries();
        if entries.contains_key(key) {
            return false;
        }
        entries.insert(
            key.clone(),
            Entry {
                bytes,
                created_at: Timestamp::now(),
            },
        );
        true
    }
}

impl fmt::Debug for ExampleEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExampleEngine")
            .field("entries", &self.entries().len())
            .finish()
    }
}
