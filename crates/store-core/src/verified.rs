//! Verified range reads (ADR-032): every byte a range read yields has been
//! checked against the key's digest first.
//!
//! - Entries of at most [`WHOLE_VERIFY_MAX`] bytes (every kv entry at the
//!   default threshold) are read whole through the verified whole-entry path
//!   and sliced: cheap at that size, and no outboard is needed.
//! - Larger entries are verified 16 KiB chunk group by group against their
//!   outboard: the reader fetches the groups covering the range, hashes each
//!   and compares it with the group's chaining value from the outboard, and
//!   releases a group's bytes only after it passed. The outboard comes from
//!   the engine ([`Engine::read_outboard`]), checked up to the digest before
//!   use and cached ([`OutboardCache`]); an entry without one (stored before
//!   outboards, or on an engine that keeps none) gets it computed from one
//!   verified whole read, handed to the engine to keep
//!   ([`Engine::store_outboard`]; over [`OUTBOARD_KEPT_ABOVE`] only) and
//!   cached.
//! - Entries of at most [`OUTBOARD_KEPT_ABOVE`] bytes keep no outboard
//!   (TUNING.md §small-outboards): theirs is computed from one verified whole read when it is
//!   not cached, and only cached.
//!
//! # How a verified range read flows
//!
//! ```text
//! read_range(key, a..b)
//!  ├─ engine.read(key, ReadOptions::range(RangeRequest{a..b, whole up to
//!  │  WHOLE_VERIFY_MAX})) per tier (kv, then large; ADR-050): the size and
//!  │  a read of the planned span in one call — InvalidRange if outside the
//!  │  entry; two-step engines (ReadOptions::read_with): meta, then the
//!  │  whole or the span
//!  ├─ size ≤ WHOLE_VERIFY_MAX: the whole read verified → slice
//!  └─ larger: outboard = cache ∨ engine.read_outboard (validated up to the
//!     digest) ∨ lazily:
//!       ≤ OUTBOARD_KEPT_ABOVE: raw read of the whole entry →
//!                outboard::compute on rayon (its root must be the digest)
//!                → cache only
//!       larger:  verified whole read → OutboardBuilder → store_outboard
//!                → cache
//!     → over the span's read (the covering 16 KiB groups)
//!     → GroupVerifier: per group, hash + compare with its chaining value,
//!       release the group's bytes only after it passed (Error::Verification)
//! ```
//!
//! The names: [`Store::read_range`](crate::Store::read_range),
//! [`ReadOptions::range`](store_types::ReadOptions::range),
//! [`ReadOptions::read_with`](store_types::ReadOptions::read_with),
//! [`Engine::read_outboard`], [`Engine::store_outboard`],
//! [`WHOLE_VERIFY_MAX`], [`OUTBOARD_KEPT_ABOVE`], [`OutboardCache`],
//! [`GroupVerifier`].

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use store_types::outboard::{covering_groups, GroupHashes, OutboardBuilder, GROUP_SIZE};
use store_types::{BlobReader, Engine, EngineExt, Error, Key, Result};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

use crate::blob::Blob;

/// Entries up to this size are range-read by verifying the whole entry.
pub const WHOLE_VERIFY_MAX: u64 = 64 * 1024;

/// Large-tier entries larger than this keep their outboard with them: a put
/// publishes it with the entry, and a range read loads it. Up to this size
/// none is kept (TUNING.md §small-outboards): a range read that finds no validated outboard in
/// the cache computes it from one read of the whole entry (at most 1 MiB;
/// one hash, whose root must be the digest) and caches it. This saves
/// each such put a second file, object or row — on the local engine a
/// second inode, rename and, durable, fdatasync.
pub const OUTBOARD_KEPT_ABOVE: u64 = 1 << 20;

/// Default byte budget of the validated-outboard cache (64 MiB: the
/// outboards and group hashes of ≈ 11 GiB of entries).
pub const DEFAULT_OUTBOARD_CACHE_BYTES: usize = 64 << 20;

/// Validated outboards by key, bounded by bytes, oldest insertion evicted
/// first. Entries are immutable, so a cached outboard is never stale: a key
/// that is deleted and put again has the same content and the same outboard.
pub(crate) struct OutboardCache {
    budget: usize,
    state: Mutex<CacheState>,
}

#[derive(Default)]
struct CacheState {
    map: HashMap<Key, Arc<GroupHashes>>,
    order: VecDeque<Key>,
    weight: usize,
}

impl OutboardCache {
    pub(crate) fn new(budget: usize) -> Self {
        OutboardCache {
            budget,
            state: Mutex::default(),
        }
    }

    fn get(&self, key: &Key) -> Option<Arc<GroupHashes>> {
        self.state
            .lock()
            .expect("outboard cache poisoned")
            .map
            .get(key)
            .cloned()
    }

    fn insert(&self, key: Key, hashes: Arc<GroupHashes>) {
        let w = hashes.weight();
        if w > self.budget {
            return;
        }
        let mut s = self.state.lock().expect("outboard cache poisoned");
        if s.map.contains_key(&key) {
            return;
        }
        while s.weight + w > self.budget {
            let Some(old) = s.order.pop_front() else {
                break;
            };
            if let Some(h) = s.map.remove(&old) {
                s.weight -= h.weight();
            }
        }
        s.weight += w;
        s.order.push_back(key.clone());
        s.map.insert(key, hashes);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.state
            .lock()
            .expect("outboard cache poisoned")
            .map
            .len()
    }
}

/// The validated outboard of `key` (an entry of `size` bytes on `engine`):
/// cached, else the engine's (checked), else computed from a verified whole
/// read — and handed to the engine to keep for entries over
/// [`OUTBOARD_KEPT_ABOVE`] (TUNING.md §small-outboards); only cached up to it.
pub(crate) async fn group_hashes(
    cache: &OutboardCache,
    engine: &dyn Engine,
    tier: store_types::Tier,
    key: &Key,
    size: u64,
) -> Result<Arc<GroupHashes>> {
    if let Some(h) = cache.get(key) {
        if h.size() == size {
            return Ok(h);
        }
    }
    // Kv entries, and large entries of at most 1 MiB, keep no outboard
    // (ADR-032, TUNING.md §small-outboards): theirs is computed each time it is not cached,
    // from a read that is cheap at their size.
    let keeps = tier == store_types::Tier::Large && size > OUTBOARD_KEPT_ABOVE;
    let kept = match keeps {
        true => engine.read_outboard(key).await?,
        false => None,
    };
    let hashes = match kept {
        Some(ob) => GroupHashes::from_outboard(key.digest, size, ob)?,
        None if !keeps => compute_from_entry(engine, key, size).await?,
        None => {
            let hashes = compute_from_entry(engine, key, size).await?;
            engine
                .store_outboard(key, hashes.outboard().clone())
                .await?;
            hashes
        }
    };
    let hashes = Arc::new(hashes);
    cache.insert(key.clone(), hashes.clone());
    Ok(hashes)
}

/// Reads the whole entry (verified against the digest) and builds its
/// outboard on the way.
async fn compute_from_entry(engine: &dyn Engine, key: &Key, size: u64) -> Result<GroupHashes> {
    if size <= OUTBOARD_KEPT_ABOVE {
        return compute_in_memory(engine, key, size).await;
    }
    let Some(r) = engine.read_whole(key).await? else {
        return Err(Error::Missing);
    };
    let mut blob = Blob::verified(r, store_types::Tier::Large, key.digest);
    let mut builder = OutboardBuilder::new();
    let mut buf = vec![0u8; store_types::CHUNK_SIZE];
    loop {
        let n = blob.read(&mut buf).await.map_err(Error::from)?;
        if n == 0 {
            break;
        }
        builder.update(&buf[..n]);
    }
    let (digest, outboard) = builder.finalize();
    // The verified read already failed on a mismatch; this guards the
    // builder against a reader that changed under it.
    if digest != key.digest {
        return Err(Error::Verification {
            expected: key.digest,
            actual: digest,
        });
    }
    GroupHashes::from_outboard(key.digest, size, outboard)
}

/// [`compute_from_entry`] for an entry of at most [`OUTBOARD_KEPT_ABOVE`]
/// bytes (TUNING.md §small-outboards): its raw bytes in one engine read (a range read over all
/// of it, which engines do not hash), then one hash — on rayon's pool, off
/// the runtime's workers — that builds the outboard; the outboard's root
/// equal to the key's digest is the verification. A whole verified read
/// followed by the builder hashed every byte twice.
async fn compute_in_memory(engine: &dyn Engine, key: &Key, size: u64) -> Result<GroupHashes> {
    let request = store_types::RangeRequest::new(0..size, 0);
    let Some(read) = engine
        .read(key, &store_types::ReadOptions::range(request))
        .await?
    else {
        return Err(Error::Missing);
    };
    // One byte past the recorded size tells a longer entry apart.
    let bytes = read
        .reader
        .into_bytes(size + 1)
        .await
        .map_err(Error::from)?;
    let (len, (digest, outboard)) =
        crate::blob::on_pool(move || (bytes.len() as u64, store_types::outboard::compute(&bytes)))
            .await?;
    if digest != key.digest || len != size {
        return Err(Error::Verification {
            expected: key.digest,
            actual: digest,
        });
    }
    GroupHashes::from_outboard(key.digest, size, outboard)
}

/// A range read of a large entry that yields only verified bytes.
pub(crate) struct GroupVerifier {
    inner: Pin<Box<dyn AsyncRead + Send>>,
    hashes: Arc<GroupHashes>,
    /// The group being read or drained.
    group: u64,
    /// Its bytes (up to one group).
    buf: Vec<u8>,
    /// Whether `buf` holds a whole, verified group.
    verified: bool,
    /// Next byte of `buf` to yield.
    pos: usize,
    /// End of the yieldable part of `buf`.
    end: usize,
    /// Bytes of the requested range not yet yielded.
    remaining: u64,
    /// Bytes to skip at the front of the first group.
    skip: usize,
    failed: bool,
}

impl GroupVerifier {
    /// The verified read of `range` from `reader`, which yields the bytes
    /// of the groups covering it.
    pub(crate) fn over(
        reader: Pin<Box<dyn AsyncRead + Send>>,
        hashes: Arc<GroupHashes>,
        range: std::ops::Range<u64>,
    ) -> BlobReader {
        let cover = covering_groups(&range, hashes.size());
        let len = range.end - range.start;
        let v = GroupVerifier {
            inner: reader,
            hashes,
            group: cover.start / GROUP_SIZE as u64,
            buf: Vec::with_capacity(GROUP_SIZE),
            verified: false,
            pos: 0,
            end: 0,
            remaining: len,
            skip: (range.start - cover.start) as usize,
            failed: false,
        };
        BlobReader::stream(len, v)
    }

    fn group_len(&self) -> usize {
        let start = self.group * GROUP_SIZE as u64;
        self.hashes
            .size()
            .saturating_sub(start)
            .min(GROUP_SIZE as u64) as usize
    }
}

impl AsyncRead for GroupVerifier {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.failed {
                return Poll::Ready(Err(io::Error::other("verified range read already failed")));
            }
            if this.verified && this.pos < this.end {
                let n = (this.end - this.pos).min(out.remaining());
                out.put_slice(&this.buf[this.pos..this.pos + n]);
                this.pos += n;
                this.remaining -= n as u64;
                return Poll::Ready(Ok(()));
            }
            if this.remaining == 0 || out.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            if this.verified {
                // Drained: move on to the next group.
                this.group += 1;
                this.buf.clear();
                this.verified = false;
            }
            // Fill the group from the engine.
            let want = this.group_len();
            while this.buf.len() < want {
                let have = this.buf.len();
                this.buf.resize(want, 0);
                let mut rb = ReadBuf::new(&mut this.buf[have..]);
                let res = this.inner.as_mut().poll_read(cx, &mut rb);
                let got = rb.filled().len();
                this.buf.truncate(have + got);
                match res {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => {
                        this.failed = true;
                        return Poll::Ready(Err(e));
                    }
                    Poll::Ready(Ok(())) if got == 0 => break, // EOF: short group
                    Poll::Ready(Ok(())) => {}
                }
            }
            if let Err(e) = this.hashes.verify_group(this.group, &this.buf) {
                this.failed = true;
                return Poll::Ready(Err(e.into()));
            }
            this.verified = true;
            this.pos = std::mem::take(&mut this.skip);
            this.end = (this.pos as u64 + this.remaining).min(this.buf.len() as u64) as usize;
        }
    }
}

/// A verified range of a small entry: `whole` (a read of the whole entry)
/// verified, then sliced.
pub(crate) async fn small_range(
    whole: BlobReader,
    key: &Key,
    range: std::ops::Range<u64>,
) -> Result<BlobReader> {
    let whole: Bytes = Blob::verified(whole, store_types::Tier::Kv, key.digest)
        .bytes()
        .await?;
    let (s, e) = (range.start as usize, range.end as usize);
    if e > whole.len() {
        return Err(Error::Verification {
            expected: key.digest,
            actual: store_types::Digest::of(&whole),
        });
    }
    Ok(BlobReader::from_bytes(whole.slice(s..e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use store_types::outboard::compute;
    use store_types::{Digest, Namespace};

    const G: usize = GROUP_SIZE;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8 ^ (i / 4096) as u8).collect()
    }

    /// Reads `range` of `stored` (whose good content is `good`) through the
    /// verifier, as the engine would serve it: the covering groups.
    async fn read(good: &[u8], stored: &[u8], range: std::ops::Range<u64>) -> Result<Vec<u8>> {
        let (digest, ob) = compute(good);
        let hashes = Arc::new(GroupHashes::from_outboard(digest, good.len() as u64, ob)?);
        let cover = covering_groups(&range, good.len() as u64);
        let served = Bytes::copy_from_slice(&stored[cover.start as usize..cover.end as usize]);
        let r = GroupVerifier::over(
            Box::pin(std::io::Cursor::new(served)),
            hashes,
            range.clone(),
        );
        assert_eq!(r.len(), range.end - range.start);
        let mut out = Vec::new();
        let mut reader = r.into_stream().reader;
        // Small reads: a group is yielded over many calls.
        let mut buf = vec![0u8; 1000];
        loop {
            let n = reader.read(&mut buf).await.map_err(Error::from)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[tokio::test]
    async fn ranges_yield_exactly_the_requested_bytes() {
        let d = data(10 * G + 123);
        let n = d.len() as u64;
        let g = G as u64;
        for r in [
            0..1,
            0..4096,
            g - 10..g + 10,
            3 * g..3 * g,
            5 * g + 7..8 * g + 1,
            10 * g..n,
            n - 1..n,
            n..n,
            0..n,
        ] {
            let got = read(&d, &d, r.clone()).await.expect("clean read");
            assert_eq!(got, &d[r.start as usize..r.end as usize], "{r:?}");
        }
    }

    #[tokio::test]
    async fn a_flip_fails_the_read_only_inside_the_covering_groups() {
        let d = data(12 * G);
        let g = G as u64;
        let range = 4 * g + 100..6 * g + 50; // groups 4, 5 and 6
        for flip in [
            0,
            4 * g - 1,
            4 * g,
            4 * g + 99,
            5 * g,
            6 * g + 51,
            7 * g - 1,
            7 * g,
            12 * g - 1,
        ] {
            let mut bad = d.clone();
            bad[flip as usize] ^= 0x10;
            let res = read(&d, &bad, range.clone()).await;
            let inside = (4 * g..7 * g).contains(&flip);
            match res {
                Ok(got) => {
                    assert!(!inside, "flip at {flip} inside the covering groups passed");
                    assert_eq!(got, &d[range.start as usize..range.end as usize]);
                }
                Err(e) => {
                    assert!(inside, "flip at {flip} outside failed: {e}");
                    assert!(matches!(e, Error::Verification { .. }), "{e:?}");
                }
            }
        }
    }

    #[tokio::test]
    async fn no_byte_of_a_corrupt_group_is_yielded() {
        let d = data(4 * G);
        let mut bad = d.clone();
        bad[2 * G + 5] ^= 1;
        let (digest, ob) = compute(&d);
        let hashes = Arc::new(GroupHashes::from_outboard(digest, d.len() as u64, ob).unwrap());
        let range = 0..d.len() as u64;
        let mut r = GroupVerifier::over(
            Box::pin(std::io::Cursor::new(Bytes::from(bad))),
            hashes,
            range,
        )
        .into_stream()
        .reader;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 4096];
        let err = loop {
            match r.read(&mut buf).await {
                Ok(0) => panic!("the corrupt read completed"),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) => break Error::from(e),
            }
        };
        assert!(matches!(err, Error::Verification { .. }));
        // Exactly the two good groups before the corrupt one came through.
        assert_eq!(out, &d[..2 * G]);
        assert!(
            r.read(&mut buf).await.is_err(),
            "a failed read stays failed"
        );
    }

    #[tokio::test]
    async fn a_short_engine_read_is_a_verification_failure() {
        let d = data(3 * G);
        let (digest, ob) = compute(&d);
        let hashes = Arc::new(GroupHashes::from_outboard(digest, d.len() as u64, ob).unwrap());
        let short = Bytes::copy_from_slice(&d[..2 * G + 10]);
        let mut r = GroupVerifier::over(
            Box::pin(std::io::Cursor::new(short)),
            hashes,
            0..3 * G as u64,
        )
        .into_stream()
        .reader;
        let mut sink = Vec::new();
        let err = Error::from(r.read_to_end(&mut sink).await.unwrap_err());
        assert!(matches!(err, Error::Verification { .. }));
        assert_eq!(sink.len(), 2 * G);
    }

    #[test]
    fn the_cache_keeps_to_its_budget() {
        let one = |n: usize| {
            let d = data(n * G);
            let (digest, ob) = compute(&d);
            Arc::new(GroupHashes::from_outboard(digest, d.len() as u64, ob).unwrap())
        };
        let h = one(100);
        let cache = OutboardCache::new(h.weight() * 3 + 10);
        let ns = Namespace::new("c").unwrap();
        for i in 0..5u8 {
            cache.insert(Key::new(ns.clone(), Digest::of(&[i])), h.clone());
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&Key::new(ns.clone(), Digest::of(&[0]))).is_none());
        assert!(cache.get(&Key::new(ns.clone(), Digest::of(&[4]))).is_some());
        // Too big for the budget: not cached at all.
        let tiny = OutboardCache::new(10);
        tiny.insert(Key::new(ns, Digest::of(b"x")), h);
        assert_eq!(tiny.len(), 0);
    }
}
