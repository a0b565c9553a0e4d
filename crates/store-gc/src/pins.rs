//! In-process pins and the delete gate.
//!
//! A [`Pin`] protects a key while it lives. The sweep and direct deletes
//! never "check, then delete" unguarded: they first take a [`DeleteGate`]
//! over the keys that are unpinned at that moment. While a key is gated, a
//! new pin on it waits until the gate is released — by then the entry is
//! either gone (and the putter writes it afresh) or rescued. That makes
//! protection-check-then-delete atomic with respect to pinning, and since
//! an embedder records its reference *before* dropping its pin, a liveness
//! probe taken under the gate always sees a reference whose pin the gate
//! did not.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use store_types::Key;
use tokio::sync::Notify;

#[derive(Default)]
struct Table {
    counts: HashMap<Key, usize>,
    gated: HashSet<Key>,
}

#[derive(Default)]
struct Shared {
    table: Mutex<Table>,
    released: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A panic while holding this lock cannot leave the table half
        // updated (every critical section is a few map operations), so a
        // poisoned lock is still consistent.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The in-process pin table of one store instance.
#[derive(Clone, Default)]
pub struct PinRegistry {
    shared: Arc<Shared>,
}

impl fmt::Debug for PinRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = self.shared.lock();
        f.debug_struct("PinRegistry")
            .field("pinned_keys", &t.counts.len())
            .field("gated_keys", &t.gated.len())
            .finish()
    }
}

impl PinRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Pins `key`, waiting while a delete gate holds it.
    pub async fn pin(&self, key: Key) -> Pin {
        loop {
            let notified = self.shared.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut t = self.shared.lock();
                if !t.gated.contains(&key) {
                    *t.counts.entry(key.clone()).or_insert(0) += 1;
                    return Pin {
                        shared: Arc::clone(&self.shared),
                        key,
                    };
                }
            }
            notified.await;
        }
    }

    /// Number of live pins on `key`.
    pub fn count(&self, key: &Key) -> usize {
        self.shared.lock().counts.get(key).copied().unwrap_or(0)
    }

    /// Number of distinct pinned keys.
    pub fn pinned_keys(&self) -> usize {
        self.shared.lock().counts.len()
    }

    /// Whether each key is pinned now, index-aligned (no gate taken).
    pub fn pinned_many(&self, keys: &[Key]) -> Vec<bool> {
        let t = self.shared.lock();
        keys.iter().map(|k| t.counts.contains_key(k)).collect()
    }

    /// Gates every unpinned key of `keys`; returns the gate and, index-
    /// aligned, whether each key was pinned (and so not gated). Keys already
    /// gated by another gate count as not gated here (`pinned` false,
    /// `gated` false) and must be skipped by the caller.
    pub fn gate(&self, keys: &[Key]) -> (DeleteGate, Vec<GateState>) {
        let mut t = self.shared.lock();
        let mut held = Vec::new();
        let states = keys
            .iter()
            .map(|k| {
                if t.counts.contains_key(k) {
                    GateState::Pinned
                } else if t.gated.contains(k) || held.contains(k) {
                    GateState::Busy
                } else {
                    t.gated.insert(k.clone());
                    held.push(k.clone());
                    GateState::Gated
                }
            })
            .collect();
        (
            DeleteGate {
                shared: Arc::clone(&self.shared),
                keys: held,
            },
            states,
        )
    }
}

/// The outcome of gating one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateState {
    /// The key is pinned: protected, not gated.
    Pinned,
    /// Another delete holds the key's gate: leave it alone.
    Busy,
    /// Gated: no new pin can be taken until the gate is released.
    Gated,
}

/// Keys held against new pins while a delete decides and executes.
/// Released on drop.
pub struct DeleteGate {
    shared: Arc<Shared>,
    keys: Vec<Key>,
}

impl DeleteGate {
    /// The gated keys.
    pub fn keys(&self) -> &[Key] {
        &self.keys
    }
}

impl Drop for DeleteGate {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        {
            let mut t = self.shared.lock();
            for k in &self.keys {
                t.gated.remove(k);
            }
        }
        self.shared.released.notify_waiters();
    }
}

/// Protection of one entry while its putter has not yet recorded a
/// reference to it. Dropping the pin releases it.
pub struct Pin {
    shared: Arc<Shared>,
    key: Key,
}

impl Pin {
    /// The pinned key.
    pub fn key(&self) -> &Key {
        &self.key
    }
}

impl fmt::Debug for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pin({})", self.key)
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut t = self.shared.lock();
        if let Some(c) = t.counts.get_mut(&self.key) {
            *c -= 1;
            if *c == 0 {
                t.counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use store_types::{Digest, Namespace};

    fn key(n: u8) -> Key {
        Key::new(Namespace::new("t").unwrap(), Digest::of(&[n]))
    }

    #[tokio::test]
    async fn pins_count_and_release() {
        let r = PinRegistry::new();
        let a = r.pin(key(1)).await;
        let b = r.pin(key(1)).await;
        assert_eq!(r.count(&key(1)), 2);
        drop(a);
        assert_eq!(r.count(&key(1)), 1);
        drop(b);
        assert_eq!(r.count(&key(1)), 0);
        assert_eq!(r.pinned_keys(), 0);
    }

    #[tokio::test]
    async fn gate_skips_pinned_and_busy_keys() {
        let r = PinRegistry::new();
        let _p = r.pin(key(1)).await;
        let (g1, s1) = r.gate(&[key(1), key(2), key(2)]);
        assert_eq!(
            s1,
            vec![GateState::Pinned, GateState::Gated, GateState::Busy]
        );
        let (_g2, s2) = r.gate(&[key(2)]);
        assert_eq!(s2, vec![GateState::Busy]);
        assert_eq!(g1.keys(), &[key(2)]);
    }

    #[tokio::test]
    async fn pin_waits_for_gate_release() {
        let r = PinRegistry::new();
        let (gate, _) = r.gate(&[key(3)]);
        let r2 = r.clone();
        let waiter = tokio::spawn(async move { r2.pin(key(3)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "pin must wait while gated");
        assert_eq!(r.count(&key(3)), 0);
        drop(gate);
        let pin = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("pin proceeds after release")
            .unwrap();
        assert_eq!(r.count(pin.key()), 1);
    }
}
