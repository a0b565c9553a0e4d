//! The cache index (issue 31, ADR-048): the keys of cache namespaces,
//! `(namespace, key) → digest` rows with the entry's size and the time it
//! was last accessed, in the kv engine's database.
//!
//! A cache namespace's entries are live while a key of the namespace
//! points at them (or a reference, or a pin: those protect everywhere).
//! Keys are **weak**: unlike references, the size/age bound removes them
//! (least recently accessed first: the trim store-core writes once over
//! [`CacheIndex::oldest`] and [`CacheIndex::remove_unchanged`], ADR-062),
//! and an entry no key, reference or pin holds any more is garbage for
//! the next sweep.
//!
//! The kv engines that hold references (`mem`, `sqlite`, `postgres`) hold
//! cache keys too and answer [`KvEngine::cache`](crate::KvEngine::cache).

use std::time::Duration;

use async_trait::async_trait;

use crate::{Author, Digest, LivenessTable, Namespace, RefExpect, RefName, Result, Timestamp};

/// The bound of a cache namespace. `None` fields are unbounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CacheBounds {
    /// Keys are removed, least recently accessed first, until the sizes of
    /// the remaining keys sum to at most this many bytes.
    pub max_bytes: Option<u64>,
    /// Keys not accessed for longer than this are removed.
    pub max_age: Option<Duration>,
}

impl CacheBounds {
    /// The bound that keeps whatever either keeps: the larger of each
    /// limit, unbounded if either is (how a fleet combines its nodes'
    /// bounds, ADR-048).
    pub fn loosest(self, other: CacheBounds) -> CacheBounds {
        fn max<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            }
        }
        CacheBounds {
            max_bytes: max(self.max_bytes, other.max_bytes),
            max_age: max(self.max_age, other.max_age),
        }
    }
}

impl std::fmt::Display for CacheBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cache")?;
        if let Some(b) = self.max_bytes {
            write!(f, " max_bytes {b}")?;
        }
        if let Some(a) = self.max_age {
            write!(f, " max_age {}s", a.as_secs())?;
        }
        Ok(())
    }
}

/// What a namespace's keys hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheUsage {
    /// Keys.
    pub keys: u64,
    /// The sum of the keys' sizes (an entry two keys point at counts
    /// twice).
    pub bytes: u64,
}

/// What a trim (or one [`CacheIndex::remove_unchanged`]) removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CacheTrim {
    /// Keys removed.
    pub keys: u64,
    /// The sum of their sizes.
    pub bytes: u64,
}

/// One key as [`CacheIndex::oldest`] read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheEntry {
    /// The key.
    pub key: RefName,
    /// The digest it points at.
    pub digest: Digest,
    /// The entry's size.
    pub size: u64,
    /// Its last access.
    pub accessed_at: Timestamp,
}

/// The least recently accessed keys of a namespace, read in one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachePage {
    /// The engine's clock at the read: the `now` given, or the engine's own.
    pub now: Timestamp,
    /// The sum of the sizes of all the namespace's keys.
    pub bytes: u64,
    /// Every key last accessed no later than the `limit`-th least recently
    /// accessed one (so all keys sharing the page's latest access time),
    /// in no particular order.
    pub entries: Vec<CacheEntry>,
}

/// The cache keys held in a kv engine's database.
///
/// # Contract
///
/// - **One clock.** `now` is the caller's clock reading; an engine with a
///   clock of its own (PostgreSQL: the database's, the one clock of a
///   fleet) uses its own instead, for every method alike, so access times
///   and the age bound are compared on one clock.
/// - `record` writes the key, its digest, size and access time in one
///   atomic step (replacing the key's previous digest and size; the
///   access time becomes `now` or stays the row's, whichever is later, so
///   access times only move forward); a committed `record`
///   is visible to `cached` (and to the fleet liveness table) before it
///   returns.
/// - `record` checks `expect` (a failed precondition is
///   [`Error::RefConflict`](crate::Error::RefConflict) with the key's
///   digest) and then [`Author::check`] against the key's digest and the
///   owner stored with it (issue 39, ADR-052: a refusal is
///   [`Error::NotOwner`](crate::Error::NotOwner)), in the same atomic step
///   as the write; a refused record changes nothing. A new key stores the
///   author's name as its owner; a record of the digest the key holds
///   keeps the owner (and moves the access time).
/// - `touch` only moves access times forward and never creates a key.
/// - `oldest` reads its page and `now` in one consistent step;
///   `remove_unchanged` removes, in one atomic step, each key still as
///   read (digest, size and access time), so a key recorded or touched
///   since its read stays. The order, tie-break and bounds of the trim are
///   the caller's (store-core, ADR-062).
/// - Every method is cancel-safe: dropped before it returns, a write
///   either committed whole or not at all.
#[async_trait]
pub trait CacheIndex: Send + Sync + 'static {
    /// Points `key` at `digest` (an entry of `size` bytes), accessed now,
    /// if `expect` holds and `author` may change the key (see the
    /// contract); returns the digest the key held before.
    #[allow(clippy::too_many_arguments)]
    async fn record(
        &self,
        ns: &Namespace,
        key: &RefName,
        digest: Digest,
        size: u64,
        now: Timestamp,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>>;

    /// The digest `key` points at.
    async fn lookup(&self, ns: &Namespace, key: &RefName) -> Result<Option<Digest>>;

    /// For each of `keys`, the digest it points at: [`CacheIndex::lookup`]
    /// of many keys in one round trip (REAPI `FindMissingBlobs` asks about
    /// thousands of names at once).
    async fn lookup_many(&self, ns: &Namespace, keys: &[RefName]) -> Result<Vec<Option<Digest>>>;

    /// Removes `key` if it points at `expect` (any digest when `None`);
    /// `true` if a row was removed.
    async fn remove(&self, ns: &Namespace, key: &RefName, expect: Option<Digest>) -> Result<bool>;

    /// Moves the access time of every key of `ns` pointing at one of
    /// `digests` to `now`, where it is earlier. Returns the keys changed.
    async fn touch(&self, ns: &Namespace, digests: &[Digest], now: Timestamp) -> Result<u64>;

    /// For each digest, whether a key of `ns` points at it.
    async fn cached(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>>;

    /// The keys of `ns` last accessed no later than its `limit`-th least
    /// recently accessed key (`limit` ≥ 1), with the namespace's bytes and
    /// the engine's `now` (see [`CachePage`]).
    async fn oldest(&self, ns: &Namespace, limit: usize, now: Timestamp) -> Result<CachePage>;

    /// Removes each of `entries` (keys of `ns`) that still holds the
    /// digest, size and access time it was read with; returns what went.
    async fn remove_unchanged(&self, ns: &Namespace, entries: &[CacheEntry]) -> Result<CacheTrim>;

    /// What the keys of each namespace holding any hold, by namespace.
    async fn usage(&self) -> Result<Vec<(Namespace, CacheUsage)>>;

    /// The keys as a fleet liveness table (namespace and digest columns),
    /// for engines whose database a fleet shares.
    fn liveness_table(&self) -> Option<LivenessTable> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loosest_keeps_what_either_keeps() {
        let a = CacheBounds {
            max_bytes: Some(10),
            max_age: None,
        };
        let b = CacheBounds {
            max_bytes: Some(20),
            max_age: Some(Duration::from_secs(5)),
        };
        assert_eq!(
            a.loosest(b),
            CacheBounds {
                max_bytes: Some(20),
                max_age: None
            }
        );
        assert_eq!(b.loosest(b), b);
        assert_eq!(b.to_string(), "cache max_bytes 20 max_age 5s");
    }
}
