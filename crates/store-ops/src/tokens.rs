//! The pin-token registry (ADR-012 §2, lifetime rules in ADR-018).
//!
//! A token is an opaque handle minted by `blobs/put`: 128 random bits as 32
//! lowercase hex characters. It maps to (key, owner, guard), where the
//! guard is what keeps the entry protected — in non-fleet mode the
//! in-process [`store_core::Pin`] of the put's receipt. The mapping lives in
//! this process only (the minting node).
//!
//! Tokens end, so the map cannot grow without bound:
//! - **idle TTL**: a token not renewed for `ttl` expires; each successful
//!   renewal probe (`blobs/have` with the token) pushes its deadline to
//!   `now + ttl`;
//! - **cap**: minting beyond `max_entries` evicts the token closest to
//!   expiry (the least recently minted or renewed);
//! - **release**: the putter drops its token explicitly once its reference
//!   is recorded.
//!
//! Ending a token drops its guard, which releases the pin.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::RngCore;
use store_types::Key;

/// Default idle lifetime of a token: 15 minutes.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(15 * 60);

/// Default cap on live tokens per process.
pub const DEFAULT_MAX_TOKENS: usize = 100_000;

/// Counters of a [`TokenRegistry`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenStats {
    /// Tokens alive now.
    pub live: u64,
    /// Tokens minted so far.
    pub minted: u64,
    /// Successful renewals.
    pub renewed: u64,
    /// Tokens released explicitly.
    pub released: u64,
    /// Tokens that reached their idle deadline.
    pub expired: u64,
    /// Tokens evicted by the cap.
    pub evicted: u64,
}

struct Entry<G> {
    key: Key,
    owner: String,
    deadline: Instant,
    seq: u64,
    guard: G,
}

struct State<G> {
    by_token: HashMap<String, Entry<G>>,
    /// (deadline, seq) → token: expiry and eviction order.
    by_deadline: BTreeMap<(Instant, u64), String>,
    next_seq: u64,
    stats: TokenStats,
}

/// Opaque tokens → (key, owner, guard), with idle expiry, a cap and
/// explicit release. `G` is whatever keeps the key protected (the ops layer
/// uses [`store_core::Pin`]); it is dropped when the token ends, outside
/// the registry's lock.
pub struct TokenRegistry<G> {
    state: Mutex<State<G>>,
    ttl: Duration,
    max_entries: usize,
}

impl<G> fmt::Debug for TokenRegistry<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenRegistry")
            .field("ttl", &self.ttl)
            .field("max_entries", &self.max_entries)
            .field("stats", &self.stats())
            .finish()
    }
}

/// 128 random bits as 32 lowercase hex characters.
fn new_token() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill_bytes(&mut bytes);
    let mut s = String::with_capacity(32);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

impl<G> TokenRegistry<G> {
    /// A registry whose tokens live `ttl` after their last renewal, holding
    /// at most `max_entries` (at least 1) tokens.
    pub fn new(ttl: Duration, max_entries: usize) -> Self {
        TokenRegistry {
            state: Mutex::new(State {
                by_token: HashMap::new(),
                by_deadline: BTreeMap::new(),
                next_seq: 0,
                stats: TokenStats::default(),
            }),
            ttl,
            max_entries: max_entries.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<G>> {
        // Critical sections are a few map operations and never panic midway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The idle lifetime.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The cap on live tokens.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Mints a token for `key`, holding `guard` until the token ends.
    pub fn mint(&self, key: Key, owner: impl Into<String>, guard: G) -> String {
        self.mint_at(key, owner.into(), guard, Instant::now())
    }

    fn mint_at(&self, key: Key, owner: String, guard: G, now: Instant) -> String {
        let token = new_token();
        let mut dropped = Vec::new();
        {
            let mut st = self.lock();
            Self::reap_locked(&mut st, now, &mut dropped);
            while st.by_token.len() >= self.max_entries {
                let Some((_, victim)) = st.by_deadline.pop_first() else {
                    break;
                };
                if let Some(e) = st.by_token.remove(&victim) {
                    st.stats.evicted += 1;
                    dropped.push(e.guard);
                }
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            let deadline = now + self.ttl;
            st.by_deadline.insert((deadline, seq), token.clone());
            st.by_token.insert(
                token.clone(),
                Entry {
                    key,
                    owner,
                    deadline,
                    seq,
                    guard,
                },
            );
            st.stats.minted += 1;
            st.stats.live = st.by_token.len() as u64;
        }
        drop(dropped);
        token
    }

    /// The renewal probe: if `token` is alive and maps to `key`, extends
    /// its deadline to `now + ttl` and returns `true`. An unknown, expired
    /// or foreign token, or one for another key, returns `false` and
    /// changes nothing.
    pub fn renew(&self, token: &str, key: &Key) -> bool {
        self.renew_at(token, key, Instant::now())
    }

    fn renew_at(&self, token: &str, key: &Key, now: Instant) -> bool {
        let mut dropped = Vec::new();
        let renewed = {
            let mut st = self.lock();
            Self::reap_locked(&mut st, now, &mut dropped);
            let new_deadline = now + self.ttl;
            match st.by_token.get_mut(token) {
                Some(e) if e.key == *key => {
                    let old = (e.deadline, e.seq);
                    e.deadline = new_deadline;
                    let seq = e.seq;
                    st.by_deadline.remove(&old);
                    st.by_deadline
                        .insert((new_deadline, seq), token.to_string());
                    st.stats.renewed += 1;
                    true
                }
                _ => false,
            }
        };
        drop(dropped);
        renewed
    }

    /// The key and owner `token` maps to, if it is alive (no renewal).
    pub fn lookup(&self, token: &str) -> Option<(Key, String)> {
        let now = Instant::now();
        let st = self.lock();
        st.by_token
            .get(token)
            .filter(|e| e.deadline > now)
            .map(|e| (e.key.clone(), e.owner.clone()))
    }

    /// Ends `token` now, dropping its guard. `false` if it was not alive.
    pub fn release(&self, token: &str) -> bool {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let released = {
            let mut st = self.lock();
            Self::reap_locked(&mut st, now, &mut dropped);
            match st.by_token.remove(token) {
                Some(e) => {
                    st.by_deadline.remove(&(e.deadline, e.seq));
                    st.stats.released += 1;
                    st.stats.live = st.by_token.len() as u64;
                    dropped.push(e.guard);
                    true
                }
                None => false,
            }
        };
        drop(dropped);
        released
    }

    /// Ends every token past its deadline; returns how many. Called by every
    /// registry operation and periodically by the server.
    pub fn reap(&self) -> usize {
        self.reap_at(Instant::now())
    }

    fn reap_at(&self, now: Instant) -> usize {
        let mut dropped = Vec::new();
        {
            let mut st = self.lock();
            Self::reap_locked(&mut st, now, &mut dropped);
        }
        let n = dropped.len();
        drop(dropped);
        n
    }

    fn reap_locked(st: &mut State<G>, now: Instant, dropped: &mut Vec<G>) {
        while let Some(entry) = st.by_deadline.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let token = entry.remove();
            if let Some(e) = st.by_token.remove(&token) {
                st.stats.expired += 1;
                dropped.push(e.guard);
            }
        }
        st.stats.live = st.by_token.len() as u64;
    }

    /// Number of live tokens (expired ones not yet reaped included).
    pub fn len(&self) -> usize {
        self.lock().by_token.len()
    }

    /// Whether no token is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters.
    pub fn stats(&self) -> TokenStats {
        self.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use store_types::{Digest, Namespace};

    fn key(n: u8) -> Key {
        Key::new(Namespace::new("t").unwrap(), Digest::of(&[n]))
    }

    /// Counts its own drops.
    struct Guard(Arc<AtomicUsize>);
    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn registry(ttl_ms: u64, max: usize) -> (TokenRegistry<Guard>, Arc<AtomicUsize>) {
        (
            TokenRegistry::new(Duration::from_millis(ttl_ms), max),
            Arc::new(AtomicUsize::new(0)),
        )
    }

    #[test]
    fn tokens_are_128_bit_hex_and_distinct() {
        let a = new_token();
        let b = new_token();
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn renewal_extends_the_idle_deadline() {
        let (r, drops) = registry(1000, 10);
        let t0 = Instant::now();
        let tok = r.mint_at(key(1), "o".into(), Guard(drops.clone()), t0);
        // Renewed at 0.9 s: alive until 1.9 s.
        assert!(r.renew_at(&tok, &key(1), t0 + Duration::from_millis(900)));
        assert_eq!(r.reap_at(t0 + Duration::from_millis(1500)), 0);
        assert!(r.renew_at(&tok, &key(1), t0 + Duration::from_millis(1800)));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        // Not renewed for a whole TTL: gone, guard dropped.
        assert!(!r.renew_at(&tok, &key(1), t0 + Duration::from_millis(2900)));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(r.stats().expired, 1);
        assert!(r.is_empty());
    }

    #[test]
    fn foreign_tokens_and_other_keys_are_refused_without_effect() {
        let (r, drops) = registry(1000, 10);
        let t0 = Instant::now();
        let tok = r.mint_at(key(1), "o".into(), Guard(drops.clone()), t0);
        assert!(!r.renew_at(&tok, &key(2), t0));
        assert!(!r.renew_at("00000000000000000000000000000000", &key(1), t0));
        assert!(!r.renew_at("", &key(1), t0));
        assert_eq!(r.stats().renewed, 0);
        assert_eq!(r.lookup(&tok), Some((key(1), "o".to_string())));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn release_drops_the_guard_once() {
        let (r, drops) = registry(60_000, 10);
        let tok = r.mint(key(1), "o", Guard(drops.clone()));
        assert!(r.release(&tok));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(!r.release(&tok));
        assert!(!r.renew(&tok, &key(1)));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(r.stats().released, 1);
    }

    #[test]
    fn the_cap_evicts_the_token_closest_to_expiry() {
        let (r, drops) = registry(1000, 2);
        let t0 = Instant::now();
        let a = r.mint_at(key(1), "o".into(), Guard(drops.clone()), t0);
        let b = r.mint_at(
            key(2),
            "o".into(),
            Guard(drops.clone()),
            t0 + Duration::from_millis(10),
        );
        // Renewing `a` makes `b` the oldest.
        assert!(r.renew_at(&a, &key(1), t0 + Duration::from_millis(20)));
        let c = r.mint_at(
            key(3),
            "o".into(),
            Guard(drops.clone()),
            t0 + Duration::from_millis(30),
        );
        assert_eq!(r.len(), 2);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(r.lookup(&b).is_none());
        assert!(r.lookup(&a).is_some() && r.lookup(&c).is_some());
        assert_eq!(r.stats().evicted, 1);
        assert_eq!(r.stats().live, 2);
    }
}
