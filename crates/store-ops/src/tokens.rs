//! The pin-token registry (ADR-012 §2, lifetime rules in ADR-018).
//!
//! A token is an opaque handle minted by `blobs/put`: 128 random bits as 32
//! lowercase hex characters. It maps to (key, owner, guard), where the
//! guard is what keeps the entry protected — in non-fleet mode the
//! in-process [`store_core::Pin`] of the put's receipt. The mapping lives in
//! this process only (the minting node).
//!
//! A token ends only in these ways, each dropping its guard (which releases
//! the pin):
//! - **release**: the putter drops its token explicitly once its reference
//!   is recorded;
//! - **idle TTL**, only when the registry has one (fleet mode, or an
//!   operator's explicit choice): a token not renewed for `ttl` expires;
//!   each successful renewal probe (`blobs/have` with the token) pushes its
//!   deadline to `now + ttl`. Without a TTL a token never expires (ADR-012
//!   §2: a non-fleet pin does not expire).
//!
//! The registry **never evicts**. Memory is bounded by caps checked
//! *before* a put stores anything: [`TokenRegistry::reserve`] takes a slot
//! (counted against `max_tokens` in total and, optionally, against
//! `max_per_owner` for the token's owner) or refuses with
//! [`TokenCapReached`]. A [`TokenSlot`] becomes a token with
//! [`TokenSlot::mint`]; dropped unminted (the put failed or was cancelled)
//! it frees its slot.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::RngCore;
use store_types::Key;

/// Default cap on live pin tokens (plus puts in flight) per process.
pub const DEFAULT_MAX_TOKENS: usize = 100_000;

/// Counters of a [`TokenRegistry`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenStats {
    /// Tokens alive now.
    pub live: u64,
    /// Slots reserved now by puts in flight (not yet tokens).
    pub reserved: u64,
    /// Tokens minted so far.
    pub minted: u64,
    /// Successful renewals.
    pub renewed: u64,
    /// Tokens released explicitly.
    pub released: u64,
    /// Tokens that reached their idle deadline (only with a TTL).
    pub expired: u64,
    /// Reservations refused because a cap was reached.
    pub refused: u64,
}

/// A refused [`TokenRegistry::reserve`]: a cap is reached. Nothing was
/// evicted; a slot frees when a token is released (or, with a TTL,
/// expires) or a put in flight fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenCapReached {
    /// Live tokens plus reservations reached `max_tokens`.
    Global {
        /// The cap.
        limit: usize,
    },
    /// The owner's live tokens plus reservations reached `max_per_owner`.
    Owner {
        /// The owner.
        owner: String,
        /// The cap.
        limit: usize,
    },
}

impl fmt::Display for TokenCapReached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenCapReached::Global { limit } => write!(
                f,
                "the server holds its maximum of {limit} pin tokens (live or being minted); \
                 nothing was stored. {HOW}, or the operator raises max_tokens"
            ),
            TokenCapReached::Owner { owner, limit } => write!(
                f,
                "owner {owner:?} holds its maximum of {limit} pin tokens (live or being minted); \
                 nothing was stored. {HOW}, or the operator raises max_tokens_per_identity"
            ),
        }
    }
}

/// What frees a slot: a token is not freed by waiting (ADR-018).
const HOW: &str = "A put's token pins its entry until released (waiting frees none unless \
     token_ttl is set): release each token once you need no pin, with DELETE /v1/tokens/TOKEN, \
     by naming it as \"token\" in the reference you set (PUT /v1/refs/NS/NAME), or with \
     blobpool put --release; then retry";

impl std::error::Error for TokenCapReached {}

struct Entry<G> {
    key: Key,
    owner: String,
    /// `None`: the registry has no TTL and the token never expires.
    deadline: Option<Instant>,
    seq: u64,
    guard: G,
}

struct State<G> {
    by_token: HashMap<String, Entry<G>>,
    /// (deadline, seq) → token: expiry order (tokens with a deadline only).
    by_deadline: BTreeMap<(Instant, u64), String>,
    /// Live tokens plus reserved slots, per owner (no zero counts).
    per_owner: HashMap<String, usize>,
    /// Slots reserved by puts in flight.
    reserved: usize,
    next_seq: u64,
    stats: TokenStats,
}

impl<G> State<G> {
    /// Forgets one token or slot of `owner`.
    fn owner_dec(&mut self, owner: &str) {
        if let Some(n) = self.per_owner.get_mut(owner) {
            *n -= 1;
            if *n == 0 {
                self.per_owner.remove(owner);
            }
        }
    }

    fn refresh_gauges(&mut self) {
        self.stats.live = self.by_token.len() as u64;
        self.stats.reserved = self.reserved as u64;
    }
}

/// Opaque tokens → (key, owner, guard), with caps checked before minting,
/// explicit release and an optional idle expiry. It never evicts. `G` is
/// whatever keeps the key protected (the ops layer uses
/// [`store_core::Pin`]); it is dropped when the token ends, outside the
/// registry's lock.
pub struct TokenRegistry<G> {
    state: Mutex<State<G>>,
    ttl: Option<Duration>,
    max_tokens: usize,
    max_per_owner: Option<usize>,
}

impl<G> fmt::Debug for TokenRegistry<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenRegistry")
            .field("ttl", &self.ttl)
            .field("max_tokens", &self.max_tokens)
            .field("max_per_owner", &self.max_per_owner)
            .field("stats", &self.stats())
            .finish()
    }
}

/// A reserved token slot: counted against the caps from
/// [`TokenRegistry::reserve`] until it is minted into a token
/// ([`TokenSlot::mint`]) or dropped (which frees it). Hold it across the
/// put it was reserved for; dropping it — the put failed, or its future was
/// cancelled — is the release.
#[must_use = "a slot is freed as soon as it is dropped"]
pub struct TokenSlot<'a, G> {
    registry: &'a TokenRegistry<G>,
    /// `None` once minted.
    owner: Option<String>,
}

impl<G> fmt::Debug for TokenSlot<'_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSlot")
            .field("owner", &self.owner)
            .finish()
    }
}

impl<G> TokenSlot<'_, G> {
    /// Turns the slot into a token for `key`, holding `guard` until the
    /// token ends. Never refused: the slot was counted when reserved.
    pub fn mint(mut self, key: Key, guard: G) -> String {
        let owner = self.owner.take().expect("a slot is minted at most once");
        self.registry
            .mint_reserved(key, owner, guard, Instant::now())
    }

    #[cfg(test)]
    fn mint_at(mut self, key: Key, guard: G, now: Instant) -> String {
        let owner = self.owner.take().expect("a slot is minted at most once");
        self.registry.mint_reserved(key, owner, guard, now)
    }
}

impl<G> Drop for TokenSlot<'_, G> {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            let mut st = self.registry.lock();
            st.reserved -= 1;
            st.owner_dec(&owner);
            st.refresh_gauges();
        }
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
    /// A registry holding at most `max_tokens` tokens and reserved slots in
    /// total (at least 1), and at most `max_per_owner` per owner when set
    /// (at least 1). With `ttl`, a token lives `ttl` after its last
    /// renewal; without, it lives until released.
    pub fn new(ttl: Option<Duration>, max_tokens: usize, max_per_owner: Option<usize>) -> Self {
        TokenRegistry {
            state: Mutex::new(State {
                by_token: HashMap::new(),
                by_deadline: BTreeMap::new(),
                per_owner: HashMap::new(),
                reserved: 0,
                next_seq: 0,
                stats: TokenStats::default(),
            }),
            ttl,
            max_tokens: max_tokens.max(1),
            max_per_owner: max_per_owner.map(|n| n.max(1)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<G>> {
        // Critical sections are a few map operations and never panic midway.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The idle lifetime; `None` when tokens never expire.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The cap on live tokens plus reserved slots.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The per-owner cap, if any.
    pub fn max_per_owner(&self) -> Option<usize> {
        self.max_per_owner
    }

    /// Reserves a slot for a token of `owner`, or refuses when the global
    /// or the owner's cap is reached (expired tokens are ended first; no
    /// live token is ever evicted). Reserve *before* storing anything, and
    /// keep the slot until the token is minted.
    pub fn reserve(&self, owner: &str) -> Result<TokenSlot<'_, G>, TokenCapReached> {
        self.reserve_at(owner, Instant::now())
    }

    fn reserve_at(&self, owner: &str, now: Instant) -> Result<TokenSlot<'_, G>, TokenCapReached> {
        let mut dropped = Vec::new();
        let result = {
            let mut st = self.lock();
            Self::reap_locked(&mut st, now, &mut dropped);
            let owned = st.per_owner.get(owner).copied().unwrap_or(0);
            if st.by_token.len() + st.reserved >= self.max_tokens {
                st.stats.refused += 1;
                Err(TokenCapReached::Global {
                    limit: self.max_tokens,
                })
            } else if let Some(limit) = self.max_per_owner.filter(|&m| owned >= m) {
                st.stats.refused += 1;
                Err(TokenCapReached::Owner {
                    owner: owner.to_string(),
                    limit,
                })
            } else {
                st.reserved += 1;
                *st.per_owner.entry(owner.to_string()).or_insert(0) += 1;
                st.refresh_gauges();
                Ok(())
            }
        };
        drop(dropped);
        result.map(|()| TokenSlot {
            registry: self,
            owner: Some(owner.to_string()),
        })
    }

    fn mint_reserved(&self, key: Key, owner: String, guard: G, now: Instant) -> String {
        let token = new_token();
        let mut dropped = Vec::new();
        {
            let mut st = self.lock();
            Self::reap_locked(&mut st, now, &mut dropped);
            // The slot becomes the token: the per-owner count is unchanged.
            st.reserved -= 1;
            let seq = st.next_seq;
            st.next_seq += 1;
            let deadline = self.ttl.map(|ttl| now + ttl);
            if let Some(d) = deadline {
                st.by_deadline.insert((d, seq), token.clone());
            }
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
            st.refresh_gauges();
        }
        drop(dropped);
        token
    }

    /// The renewal probe: if `token` is alive and maps to `key`, returns
    /// `true` and, with a TTL, extends its deadline to `now + ttl`. An
    /// unknown, expired or foreign token, or one for another key, returns
    /// `false` and changes nothing.
    pub fn renew(&self, token: &str, key: &Key) -> bool {
        self.renew_at(token, key, Instant::now())
    }

    fn renew_at(&self, token: &str, key: &Key, now: Instant) -> bool {
        let mut dropped = Vec::new();
        let renewed = {
            let mut st = self.lock();
            Self::reap_locked(&mut st, now, &mut dropped);
            let new_deadline = self.ttl.map(|ttl| now + ttl);
            match st.by_token.get_mut(token) {
                Some(e) if e.key == *key => {
                    let old = e.deadline.map(|d| (d, e.seq));
                    e.deadline = new_deadline;
                    let seq = e.seq;
                    if let Some(old) = old {
                        st.by_deadline.remove(&old);
                    }
                    if let Some(d) = new_deadline {
                        st.by_deadline.insert((d, seq), token.to_string());
                    }
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
        self.lookup_at(token, Instant::now())
    }

    fn lookup_at(&self, token: &str, now: Instant) -> Option<(Key, String)> {
        let st = self.lock();
        st.by_token
            .get(token)
            .filter(|e| e.deadline.is_none_or(|d| d > now))
            .map(|e| (e.key.clone(), e.owner.clone()))
    }

    /// Ends `token` now, dropping its guard and freeing its slot. `false`
    /// if it was not alive.
    pub fn release(&self, token: &str) -> bool {
        let now = Instant::now();
        let mut dropped = Vec::new();
        let released = {
            let mut st = self.lock();
            Self::reap_locked(&mut st, now, &mut dropped);
            match st.by_token.remove(token) {
                Some(e) => {
                    if let Some(d) = e.deadline {
                        st.by_deadline.remove(&(d, e.seq));
                    }
                    st.owner_dec(&e.owner);
                    st.stats.released += 1;
                    st.refresh_gauges();
                    dropped.push(e.guard);
                    true
                }
                None => false,
            }
        };
        drop(dropped);
        released
    }

    /// Ends every token past its deadline; returns how many (always 0
    /// without a TTL). Called by every registry operation and periodically
    /// by the server when there is a TTL.
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
                st.owner_dec(&e.owner);
                st.stats.expired += 1;
                dropped.push(e.guard);
            }
        }
        st.refresh_gauges();
    }

    /// Number of live tokens (expired ones not yet reaped included;
    /// reserved slots excluded).
    pub fn len(&self) -> usize {
        self.lock().by_token.len()
    }

    /// Whether no token is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of slots reserved by puts in flight.
    pub fn reserved(&self) -> usize {
        self.lock().reserved
    }

    /// Live tokens plus reserved slots of `owner` (what its cap counts).
    pub fn owner_count(&self, owner: &str) -> usize {
        self.lock().per_owner.get(owner).copied().unwrap_or(0)
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

    fn registry(
        ttl_ms: Option<u64>,
        max: usize,
        per_owner: Option<usize>,
    ) -> (TokenRegistry<Guard>, Arc<AtomicUsize>) {
        (
            TokenRegistry::new(ttl_ms.map(Duration::from_millis), max, per_owner),
            Arc::new(AtomicUsize::new(0)),
        )
    }

    /// Reserves and mints at `now`, panicking on refusal.
    fn mint(
        r: &TokenRegistry<Guard>,
        k: Key,
        owner: &str,
        drops: &Arc<AtomicUsize>,
        now: Instant,
    ) -> String {
        r.reserve_at(owner, now)
            .expect("below the cap")
            .mint_at(k, Guard(drops.clone()), now)
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
        let (r, drops) = registry(Some(1000), 10, None);
        let t0 = Instant::now();
        let tok = mint(&r, key(1), "o", &drops, t0);
        // Renewed at 0.9 s: alive until 1.9 s.
        assert!(r.renew_at(&tok, &key(1), t0 + Duration::from_millis(900)));
        assert_eq!(r.reap_at(t0 + Duration::from_millis(1500)), 0);
        assert!(r.renew_at(&tok, &key(1), t0 + Duration::from_millis(1800)));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        // Not renewed for a whole TTL: gone, guard dropped, slot freed.
        assert!(!r.renew_at(&tok, &key(1), t0 + Duration::from_millis(2900)));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(r.stats().expired, 1);
        assert!(r.is_empty());
        assert_eq!(r.owner_count("o"), 0);
    }

    #[test]
    fn foreign_tokens_and_other_keys_are_refused_without_effect() {
        let (r, drops) = registry(Some(1000), 10, None);
        let t0 = Instant::now();
        let tok = mint(&r, key(1), "o", &drops, t0);
        assert!(!r.renew_at(&tok, &key(2), t0));
        assert!(!r.renew_at("00000000000000000000000000000000", &key(1), t0));
        assert!(!r.renew_at("", &key(1), t0));
        assert_eq!(r.stats().renewed, 0);
        assert_eq!(r.lookup_at(&tok, t0), Some((key(1), "o".to_string())));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn release_drops_the_guard_once() {
        let (r, drops) = registry(None, 10, None);
        let tok = r.reserve("o").unwrap().mint(key(1), Guard(drops.clone()));
        assert!(r.release(&tok));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(!r.release(&tok));
        assert!(!r.renew(&tok, &key(1)));
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(r.stats().released, 1);
    }

    #[test]
    fn at_the_cap_minting_is_refused_and_no_token_disappears() {
        let (r, drops) = registry(Some(1000), 3, None);
        let t0 = Instant::now();
        let minted: Vec<String> = (0..3u8)
            .map(|i| {
                let at = t0 + Duration::from_millis(u64::from(i) * 10);
                mint(&r, key(i), "o", &drops, at)
            })
            .collect();
        // Full: refused, repeatedly, whatever the deadlines.
        for i in 0..5u64 {
            let at = t0 + Duration::from_millis(100 + i);
            assert_eq!(
                r.reserve_at("o", at).unwrap_err(),
                TokenCapReached::Global { limit: 3 }
            );
        }
        // Every token is still alive and renewable; no guard was dropped.
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        assert_eq!(r.len(), 3);
        let later = t0 + Duration::from_millis(200);
        for (i, tok) in minted.iter().enumerate() {
            assert!(r.lookup_at(tok, later).is_some(), "token {i}");
            assert!(r.renew_at(tok, &key(i as u8), later), "token {i}");
        }
        let st = r.stats();
        assert_eq!((st.live, st.reserved, st.refused), (3, 0, 5));
        assert_eq!((st.expired, st.released), (0, 0));
        // The refusal's message says nothing was stored.
        let msg = TokenCapReached::Global { limit: 3 }.to_string();
        assert!(msg.contains("nothing was stored"), "{msg}");
    }

    #[test]
    fn reserved_slots_count_against_the_cap_and_dropping_one_frees_it() {
        let (r, drops) = registry(None, 2, None);
        let a = r.reserve("o").unwrap();
        let b = r.reserve("o").unwrap();
        assert_eq!((r.reserved(), r.len()), (2, 0));
        assert!(matches!(
            r.reserve("o"),
            Err(TokenCapReached::Global { limit: 2 })
        ));
        // A put that failed (or was cancelled) drops its slot.
        drop(a);
        assert_eq!((r.reserved(), r.owner_count("o")), (1, 1));
        let c = r.reserve("o").unwrap();
        let t1 = b.mint(key(1), Guard(drops.clone()));
        let t2 = c.mint(key(2), Guard(drops.clone()));
        assert_eq!((r.reserved(), r.len(), r.owner_count("o")), (0, 2, 2));
        assert!(r.reserve("o").is_err());
        assert_ne!(t1, t2);
        assert_eq!(r.stats().minted, 2);
    }

    #[test]
    fn release_frees_a_slot() {
        let (r, drops) = registry(None, 2, None);
        let t1 = r.reserve("o").unwrap().mint(key(1), Guard(drops.clone()));
        let t2 = r.reserve("o").unwrap().mint(key(2), Guard(drops.clone()));
        assert!(r.reserve("o").is_err());
        assert!(r.release(&t1));
        let t3 = r.reserve("o").unwrap().mint(key(3), Guard(drops.clone()));
        assert!(r.reserve("o").is_err());
        // Only the released token's guard went.
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(r.lookup(&t2).is_some() && r.lookup(&t3).is_some());
        assert!(r.lookup(&t1).is_none());
    }

    #[test]
    fn the_per_owner_cap_refuses_one_owner_without_touching_another() {
        let (r, drops) = registry(None, 10, Some(2));
        let t0 = Instant::now();
        let a1 = mint(&r, key(1), "alice", &drops, t0);
        let _a2 = mint(&r, key(2), "alice", &drops, t0);
        // Alice is at her cap; the registry is not.
        assert_eq!(
            r.reserve_at("alice", t0).unwrap_err(),
            TokenCapReached::Owner {
                owner: "alice".into(),
                limit: 2
            }
        );
        // Bob is unaffected, and can fill his own share.
        let b1 = mint(&r, key(3), "bob", &drops, t0);
        let bob_slot = r.reserve_at("bob", t0).unwrap();
        assert!(r.reserve_at("bob", t0).is_err());
        assert_eq!((r.owner_count("alice"), r.owner_count("bob")), (2, 2));
        // Bob's dropped slot frees his share, not Alice's.
        drop(bob_slot);
        assert!(r.reserve_at("alice", t0).is_err());
        let _b2 = mint(&r, key(4), "bob", &drops, t0);
        // Alice releases one: she may mint again; nothing was dropped but hers.
        assert!(r.release(&a1));
        let _a3 = mint(&r, key(5), "alice", &drops, t0);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert!(r.lookup(&b1).is_some());
        assert_eq!(r.len(), 4);
        assert_eq!(r.stats().refused, 3);
        let msg = TokenCapReached::Owner {
            owner: "alice".into(),
            limit: 2,
        }
        .to_string();
        assert!(msg.contains("alice") && msg.contains('2'), "{msg}");
        // A plain client learns what frees a slot and how (issue 43 item 3).
        assert!(msg.contains("max_tokens_per_identity"), "{msg}");
        let global = TokenCapReached::Global { limit: 3 }.to_string();
        assert!(global.contains("raises max_tokens"), "{global}");
        for m in [msg, global] {
            for how in [
                "DELETE /v1/tokens/TOKEN",
                "PUT /v1/refs/",
                "--release",
                "token_ttl",
            ] {
                assert!(m.contains(how), "{m}");
            }
        }
    }

    #[test]
    fn the_global_cap_binds_across_owners() {
        let (r, drops) = registry(None, 3, Some(2));
        let t0 = Instant::now();
        mint(&r, key(1), "alice", &drops, t0);
        mint(&r, key(2), "alice", &drops, t0);
        mint(&r, key(3), "bob", &drops, t0);
        // Bob is below his share but the registry is full.
        assert_eq!(
            r.reserve_at("bob", t0).unwrap_err(),
            TokenCapReached::Global { limit: 3 }
        );
        assert_eq!(drops.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn tokens_without_a_ttl_never_expire() {
        let (r, drops) = registry(None, 10, None);
        assert_eq!(r.ttl(), None);
        let t0 = Instant::now();
        let tok = mint(&r, key(1), "o", &drops, t0);
        // A year of silence later: still alive, still renewable.
        let year = t0 + Duration::from_secs(365 * 24 * 3600);
        assert_eq!(r.reap_at(year), 0);
        assert_eq!(r.lookup_at(&tok, year), Some((key(1), "o".to_string())));
        assert!(r.renew_at(&tok, &key(1), year));
        // Other operations far in the future do not end it either.
        let _other = mint(&r, key(2), "o", &drops, year);
        assert!(r.renew_at(&tok, &key(1), year + Duration::from_secs(3600)));
        assert_eq!(drops.load(Ordering::SeqCst), 0);
        assert_eq!(r.stats().expired, 0);
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn an_expired_token_frees_its_slot() {
        let (r, drops) = registry(Some(1000), 1, Some(1));
        let t0 = Instant::now();
        let tok = mint(&r, key(1), "o", &drops, t0);
        assert!(r.reserve_at("o", t0 + Duration::from_millis(500)).is_err());
        // Past its deadline the token ends on its own; that is expiry (it
        // was not renewed for a whole TTL), not eviction.
        let later = t0 + Duration::from_millis(1001);
        let _tok2 = mint(&r, key(2), "o", &drops, later);
        assert!(r.lookup_at(&tok, later).is_none());
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(r.stats().expired, 1);
    }
}
