//! Embedder-side GC hooks for tests: a mutable live set and a protect list.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use store_core::{LivenessSource, ProtectCallback};
use store_types::Key;
use tokio::sync::Notify;

/// A liveness source backed by a set the test edits.
#[derive(Clone, Default)]
pub struct LiveSet {
    keys: Arc<Mutex<HashSet<Key>>>,
    gate: Option<Arc<(Notify, Notify)>>,
    fail: Arc<AtomicBool>,
}

impl LiveSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// A set whose probes announce themselves on `.0` and then wait on `.1`
    /// (to hold a sweep in the middle).
    pub fn gated(gate: Arc<(Notify, Notify)>) -> Self {
        LiveSet {
            gate: Some(gate),
            ..Self::default()
        }
    }

    /// Marks `key` referenced or not.
    pub fn set(&self, key: &Key, live: bool) {
        let mut k = self.keys.lock().unwrap();
        if live {
            k.insert(key.clone());
        } else {
            k.remove(key);
        }
    }

    /// Whether `key` is referenced.
    pub fn contains(&self, key: &Key) -> bool {
        self.keys.lock().unwrap().contains(key)
    }

    /// Makes probes fail.
    pub fn fail(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }
}

#[async_trait]
impl LivenessSource for LiveSet {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>, store_types::Error> {
        if let Some(g) = &self.gate {
            g.0.notify_one();
            g.1.notified().await;
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(store_types::Error::backend(
                store_types::ErrorKind::ConnectionLost,
                "query reference database",
            )
            .with_source("reference database unavailable"));
        }
        let set = self.keys.lock().unwrap();
        Ok(keys.iter().map(|k| set.contains(k)).collect())
    }
}

/// A protect callback naming a set of keys, or failing.
#[derive(Clone, Default)]
pub struct Protector {
    keys: Arc<Mutex<HashSet<Key>>>,
    fail: Arc<AtomicBool>,
}

impl Protector {
    /// Names `key` as protected or not.
    pub fn set(&self, key: &Key, on: bool) {
        let mut k = self.keys.lock().unwrap();
        if on {
            k.insert(key.clone());
        } else {
            k.remove(key);
        }
    }

    /// Makes the callback fail.
    pub fn fail(&self, fail: bool) {
        self.fail.store(fail, Ordering::SeqCst);
    }
}

#[async_trait]
impl ProtectCallback for Protector {
    async fn protected_keys(&self) -> Result<Vec<Key>, store_types::Error> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(store_types::Error::backend(
                store_types::ErrorKind::Unavailable,
                "ask policy service",
            )
            .with_source("policy service unavailable"));
        }
        Ok(self.keys.lock().unwrap().iter().cloned().collect())
    }
}
