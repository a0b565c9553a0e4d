//! BLAKE3 outboards: the interior hashes of an entry's BLAKE3 tree, kept
//! beside the entry so any range can be verified against the entry's digest
//! without reading the rest of it (ADR-032).
//!
//! The encoding is [`bao-tree`](bao_tree)'s **post-order outboard** with
//! chunk groups of [`GROUP_SIZE`] = 16 KiB (`BlockSize::from_chunk_log(4)`,
//! the block size iroh-blobs uses): for every parent node of the tree over
//! the entry's 16 KiB groups, in post order, the 64-byte pair of its
//! children's chaining values. An entry of at most one group has an empty
//! outboard; an entry of `n` groups has `n - 1` pairs, ≈ 0.39 % of its size.
//!
//! - [`OutboardBuilder`] computes the digest **and** the outboard in one
//!   pass as a put streams (no second read of the data); large updates hash
//!   their groups on several cores.
//! - [`GroupHashes::from_outboard`] validates a stored outboard against the
//!   entry's digest (every pair is checked on the way up to the root) and
//!   keeps the chaining value of every group, so a range read verifies each
//!   16 KiB group it reads with one hash and one compare.
//!
//! The tree code is bao-tree's where bao-tree offers it (the tree shape, the
//! post-order walk, the encoding tests compare with); the streaming builder
//! is ours because bao-tree's builders need the size up front and a
//! blocking reader, and a put knows neither.

use std::ops::Range;

use bao_tree::iter::BaoChunk;
use bao_tree::{BaoTree, BlockSize};
use blake3::hazmat::{merge_subtrees_non_root, merge_subtrees_root, HasherExt, Mode};
use bytes::Bytes;

use crate::{Digest, Error, Result};

/// log2 of the chunks (1 KiB each) in one chunk group.
pub const GROUP_CHUNK_LOG: u8 = 4;
/// Bytes in one chunk group: 16 KiB.
pub const GROUP_SIZE: usize = 1024 << GROUP_CHUNK_LOG;
/// bao-tree's name for the chunk group size.
pub const BLOCK_SIZE: BlockSize = BlockSize::from_chunk_log(GROUP_CHUNK_LOG);

/// Groups an update must hold before the builder hashes them on several
/// cores (below it, the hand-off costs more than it saves).
const PARALLEL_MIN_GROUPS: usize = 32;

/// The bao-tree shape of an entry of `size` bytes.
pub fn tree(size: u64) -> BaoTree {
    BaoTree::new(size, BLOCK_SIZE)
}

/// The length of the outboard of an entry of `size` bytes.
pub fn outboard_len(size: u64) -> u64 {
    tree(size).outboard_size()
}

/// The number of chunk groups of an entry of `size` bytes (at least one: an
/// empty entry is one empty group).
pub fn group_count(size: u64) -> u64 {
    size.div_ceil(GROUP_SIZE as u64).max(1)
}

/// The byte range of the groups covering `range` of an entry of `size`
/// bytes (an empty range still covers the group it points into, so an empty
/// read of a corrupt entry is caught the same way as any other).
pub fn covering_groups(range: &Range<u64>, size: u64) -> Range<u64> {
    let g = GROUP_SIZE as u64;
    let first = (range.start / g).min(group_count(size) - 1);
    let last = if range.end > range.start {
        (range.end - 1) / g
    } else {
        first
    };
    (first * g)..((last + 1) * g).min(size)
}

/// The chaining value of group `index` (`data` is the whole group), or the
/// root hash when the group is the whole entry.
fn hash_group(index: u64, data: &[u8], is_root: bool) -> blake3::Hash {
    if is_root {
        return blake3::hash(data);
    }
    let mut h = blake3::Hasher::new();
    h.set_input_offset(index * GROUP_SIZE as u64);
    h.update(data);
    blake3::Hash::from(h.finalize_non_root())
}

fn parent(left: &blake3::Hash, right: &blake3::Hash, is_root: bool) -> blake3::Hash {
    let (l, r) = (*left.as_bytes(), *right.as_bytes());
    if is_root {
        merge_subtrees_root(&l, &r, Mode::Hash)
    } else {
        blake3::Hash::from(merge_subtrees_non_root(&l, &r, Mode::Hash))
    }
}

/// Computes an entry's digest and outboard as its bytes stream by.
///
/// Memory: one pending group (16 KiB), a stack of at most 64 chaining
/// values, and the outboard itself (0.39 % of the bytes so far).
#[derive(Clone)]
pub struct OutboardBuilder {
    /// Bytes of the group being filled; never more than one group. A full
    /// group stays here until more bytes arrive, since the last group of a
    /// one-group entry is hashed as the root.
    pending: Vec<u8>,
    /// Groups hashed and pushed so far.
    groups: u64,
    /// Chaining values of the complete subtrees not yet merged, left to
    /// right (blake3's lazy-merge stack).
    stack: Vec<blake3::Hash>,
    /// Post-order pairs emitted so far.
    outboard: Vec<u8>,
    /// Total bytes seen.
    len: u64,
    parallel: bool,
}

impl Default for OutboardBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for OutboardBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboardBuilder")
            .field("len", &self.len)
            .field("outboard_len", &self.outboard.len())
            .finish()
    }
}

impl OutboardBuilder {
    /// A builder that hashes large updates on several cores.
    pub fn new() -> Self {
        OutboardBuilder {
            pending: Vec::with_capacity(GROUP_SIZE),
            groups: 0,
            stack: Vec::new(),
            outboard: Vec::new(),
            len: 0,
            parallel: true,
        }
    }

    /// Reserves room for the outboard of an entry of `size` bytes (the
    /// declared length of a put), so it grows without reallocating: the
    /// outboard is 0.39 % of the entry and held in memory until the put
    /// publishes it.
    /// At most 8 MiB is reserved (a declared length is the client's word).
    pub fn reserve_for(&mut self, size: u64) {
        let want = usize::try_from(outboard_len(size).min(8 << 20)).unwrap_or(0);
        self.outboard
            .reserve(want.saturating_sub(self.outboard.len()));
    }

    /// A builder that hashes on the calling thread only.
    pub fn single_threaded() -> Self {
        OutboardBuilder {
            parallel: false,
            ..Self::new()
        }
    }

    /// Bytes seen so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte was seen yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pushes the chaining value of the next group, merging the complete
    /// subtrees to its left first (each merge emits its pair, which is
    /// exactly post order).
    fn push_cv(&mut self, cv: blake3::Hash) {
        let keep = self.groups.count_ones() as usize;
        while self.stack.len() > keep {
            let right = self.stack.pop().expect("stack holds two");
            let left = self.stack.pop().expect("stack holds two");
            self.outboard.extend_from_slice(left.as_bytes());
            self.outboard.extend_from_slice(right.as_bytes());
            self.stack.push(parent(&left, &right, false));
        }
        self.stack.push(cv);
        self.groups += 1;
    }

    /// Hashes and pushes the pending group (which is full and not the last).
    fn flush_pending(&mut self) {
        let cv = hash_group(self.groups, &self.pending, false);
        self.pending.clear();
        self.push_cv(cv);
    }

    /// Feeds the next bytes of the entry.
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        // Complete the pending group; it is flushed only once more bytes
        // follow it.
        if !self.pending.is_empty() || data.len() <= GROUP_SIZE {
            if self.pending.len() == GROUP_SIZE && !data.is_empty() {
                self.flush_pending();
            }
            let take = (GROUP_SIZE - self.pending.len()).min(data.len());
            self.pending.extend_from_slice(&data[..take]);
            data = &data[take..];
            if data.is_empty() {
                return;
            }
            self.flush_pending();
        }
        // `data` now starts on a group boundary. Hash every full group that
        // is certainly not the last (at least one byte follows it); keep the
        // tail (1..=GROUP_SIZE bytes) pending.
        let full = (data.len() - 1) / GROUP_SIZE;
        let (body, tail) = data.split_at(full * GROUP_SIZE);
        if full >= PARALLEL_MIN_GROUPS && self.parallel {
            let first = self.groups;
            let cvs = hash_groups_parallel(first, body);
            for cv in cvs {
                self.push_cv(cv);
            }
        } else {
            for group in body.chunks(GROUP_SIZE) {
                let cv = hash_group(self.groups, group, false);
                self.push_cv(cv);
            }
        }
        self.pending.extend_from_slice(tail);
    }

    /// Pushes groups hashed apart from the builder ([`HashedGroups::hash`],
    /// typically on another thread while the caller reads on): the next
    /// `h.groups()` full groups of the entry. Push them in order; bytes
    /// given to [`OutboardBuilder::update`] after them continue the entry.
    ///
    /// # Panics
    /// When the builder holds a partial group (an earlier `update` left
    /// bytes pending), when `h` does not start where the builder stands, or
    /// when the builder would then hold a single group (a one-group entry
    /// is hashed as the root, which [`HashedGroups`] never does).
    pub fn push_hashed(&mut self, h: HashedGroups) {
        assert!(
            self.pending.is_empty(),
            "push_hashed after an update left bytes pending"
        );
        assert_eq!(h.first, self.groups, "hashed groups pushed out of order");
        assert!(
            self.groups + h.cvs.len() as u64 >= 2 || h.cvs.is_empty(),
            "a one-group entry cannot be pushed pre-hashed"
        );
        self.len += (h.cvs.len() * GROUP_SIZE) as u64;
        for cv in h.cvs {
            self.push_cv(cv);
        }
    }

    /// The entry's digest and its post-order outboard.
    pub fn finalize(mut self) -> (Digest, Bytes) {
        if self.pending.is_empty() && self.groups >= 2 {
            // The last group came through `push_hashed` and is already
            // pushed (merged exactly as `push_cv` would have done for it);
            // only the right spine remains.
            return self.merge_spine();
        }
        if self.groups == 0 {
            // One group (possibly empty): it is the root; no pairs.
            return (
                Digest::from(blake3::hash(&self.pending)),
                Bytes::from(self.outboard),
            );
        }
        let last = hash_group(self.groups, &self.pending, false);
        self.push_cv(last);
        self.merge_spine()
    }

    fn merge_spine(mut self) -> (Digest, Bytes) {
        // Merge the right spine from the bottom up; the last merge is the root.
        while self.stack.len() > 1 {
            let right = self.stack.pop().expect("stack holds two");
            let left = self.stack.pop().expect("stack holds two");
            self.outboard.extend_from_slice(left.as_bytes());
            self.outboard.extend_from_slice(right.as_bytes());
            let is_root = self.stack.is_empty();
            self.stack.push(parent(&left, &right, is_root));
        }
        let root = self.stack.pop().expect("one root");
        (Digest::from(root), Bytes::from(self.outboard))
    }
}

/// The chaining values of consecutive full chunk groups of an entry,
/// hashed apart from its [`OutboardBuilder`] — on another thread, while the
/// put reads the next bytes — and handed to it with
/// [`OutboardBuilder::push_hashed`].
#[derive(Clone, Debug)]
pub struct HashedGroups {
    first: u64,
    cvs: Vec<blake3::Hash>,
}

impl HashedGroups {
    /// Hashes `data`, a whole number of groups starting at byte `offset` of
    /// the entry, on the calling thread. The groups are hashed as interior
    /// nodes: the entry must have at least two groups.
    ///
    /// # Panics
    /// When `offset` or `data.len()` is not a multiple of [`GROUP_SIZE`].
    pub fn hash(offset: u64, data: &[u8]) -> HashedGroups {
        assert!(
            offset.is_multiple_of(GROUP_SIZE as u64) && data.len().is_multiple_of(GROUP_SIZE),
            "hashed groups must be whole groups"
        );
        let first = offset / GROUP_SIZE as u64;
        let mut cvs = vec![blake3::Hash::from([0u8; 32]); data.len() / GROUP_SIZE];
        hash_into(first, data, &mut cvs);
        HashedGroups { first, cvs }
    }

    /// How many groups these are.
    pub fn groups(&self) -> u64 {
        self.cvs.len() as u64
    }

    /// Hashes `data` (as [`HashedGroups::hash`]) as one task on rayon's
    /// global pool and sends the groups, with `data` handed back, on the
    /// returned channel: the caller goes on reading while a core hashes.
    /// Dropping the receiver is harmless (the task still runs, then drops
    /// `data`).
    ///
    /// # Panics
    /// When `offset` or the length is not a multiple of [`GROUP_SIZE`]
    /// (checked here, before the task is queued).
    pub fn spawn<T>(offset: u64, data: T) -> tokio::sync::oneshot::Receiver<(T, HashedGroups)>
    where
        T: AsRef<[u8]> + Send + 'static,
    {
        assert!(
            offset.is_multiple_of(GROUP_SIZE as u64)
                && data.as_ref().len().is_multiple_of(GROUP_SIZE),
            "hashed groups must be whole groups"
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        rayon::spawn(move || {
            let h = HashedGroups::hash(offset, data.as_ref());
            let _ = tx.send((data, h));
        });
        rx
    }
}

/// Chaining values of the full groups of `body` (which starts at group
/// `first`), computed on rayon's global pool (one thread per core, started
/// once: no thread is spawned per batch). The caller blocks until they are
/// done, as it would hashing them itself.
fn hash_groups_parallel(first: u64, body: &[u8]) -> Vec<blake3::Hash> {
    use rayon::prelude::*;
    let groups = body.len() / GROUP_SIZE;
    let mut out = vec![blake3::Hash::from([0u8; 32]); groups];
    // Slices of several groups each: enough work per task to amortise the
    // pool's hand-off, enough tasks to keep every core busy.
    const PER_TASK: usize = 8;
    out.par_chunks_mut(PER_TASK)
        .zip(body[..groups * GROUP_SIZE].par_chunks(PER_TASK * GROUP_SIZE))
        .enumerate()
        .for_each(|(t, (slot, part))| hash_into(first + (t * PER_TASK) as u64, part, slot));
    out
}

fn hash_into(first: u64, part: &[u8], slot: &mut [blake3::Hash]) {
    for (i, (g, cv)) in part.chunks(GROUP_SIZE).zip(slot.iter_mut()).enumerate() {
        *cv = hash_group(first + i as u64, g, false);
    }
}

/// Buffers at least this large are hashed on several cores (rayon's pool
/// through the outboard builder). Below it the pool's hand-off costs what
/// it saves: measured on 2 cores, 1 MiB hashes at 4.4–5.3 GiB/s on the pool
/// against 5.0–5.8 single-threaded, 4 MiB at 7.5–7.8 (TUNING.md §multi-core-hashing).
pub const PARALLEL_HASH_MIN: u64 = 4 << 20;

/// The BLAKE3 digest of `bytes`, on several cores when they are large
/// enough ([`PARALLEL_HASH_MIN`]: the outboard builder's parallel groups;
/// its outboard is dropped).
pub fn digest_of(bytes: &[u8]) -> Digest {
    if (bytes.len() as u64) < PARALLEL_HASH_MIN {
        return Digest::of(bytes);
    }
    let mut builder = OutboardBuilder::new();
    builder.update(bytes);
    builder.finalize().0
}

/// Computes the digest and outboard of bytes already in memory.
pub fn compute(data: &[u8]) -> (Digest, Bytes) {
    let mut b = OutboardBuilder::new();
    b.update(data);
    b.finalize()
}

/// The chaining value of every chunk group of an entry, taken from its
/// outboard after checking the outboard against the entry's digest.
///
/// With these, verifying a range costs one hash of each covering group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupHashes {
    size: u64,
    digest: Digest,
    /// One chaining value per group (for a one-group entry: the root).
    cvs: Vec<[u8; 32]>,
    /// The validated outboard itself (for bao encodings).
    outboard: Bytes,
}

impl GroupHashes {
    /// Validates `outboard` for an entry of `size` bytes and digest
    /// `digest`, keeping the group hashes.
    ///
    /// Fails with [`Error::Verification`] when the outboard has the wrong
    /// length or any pair does not hash up to `digest` (a corrupt or
    /// foreign outboard is never used to judge data).
    pub fn from_outboard(digest: Digest, size: u64, outboard: Bytes) -> Result<GroupHashes> {
        let tree = tree(size);
        let wrong = |actual: blake3::Hash| Error::Verification {
            expected: digest,
            actual: Digest::from(actual),
        };
        if outboard.len() as u64 != tree.outboard_size() {
            return Err(wrong(blake3::hash(&outboard)));
        }
        let groups = group_count(size) as usize;
        if groups == 1 {
            return Ok(GroupHashes {
                size,
                digest,
                cvs: vec![*digest.as_bytes()],
                outboard,
            });
        }
        // Replay the post-order walk: leaves take their chaining values from
        // the pairs of their parents; every parent's pair must hash to the
        // value its own parent's pair holds for it, up to the root.
        enum Slot {
            Leaf(usize),
            Known(blake3::Hash),
        }
        let mut cvs = vec![[0u8; 32]; groups];
        let mut stack: Vec<Slot> = Vec::with_capacity(64);
        let mut pairs = outboard.chunks_exact(64);
        let mut leaf = 0usize;
        let mut root = None;
        for item in tree.post_order_chunks_iter() {
            match item {
                BaoChunk::Leaf { .. } => {
                    stack.push(Slot::Leaf(leaf));
                    leaf += 1;
                }
                BaoChunk::Parent { is_root, .. } => {
                    let pair = pairs.next().expect("outboard length checked");
                    let l = blake3::Hash::from(<[u8; 32]>::try_from(&pair[..32]).expect("32"));
                    let r = blake3::Hash::from(<[u8; 32]>::try_from(&pair[32..]).expect("32"));
                    for (slot, claimed) in [
                        (stack.pop().expect("right child"), r),
                        (stack.pop().expect("left child"), l),
                    ] {
                        match slot {
                            Slot::Leaf(i) => cvs[i] = *claimed.as_bytes(),
                            Slot::Known(h) if h == claimed => {}
                            Slot::Known(h) => return Err(wrong(h)),
                        }
                    }
                    let p = parent(&l, &r, is_root);
                    if is_root {
                        root = Some(p);
                    }
                    stack.push(Slot::Known(p));
                }
            }
        }
        match root {
            Some(r) if Digest::from(r) == digest => Ok(GroupHashes {
                size,
                digest,
                cvs,
                outboard,
            }),
            Some(r) => Err(wrong(r)),
            None => Err(wrong(blake3::hash(&outboard))),
        }
    }

    /// The entry's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The entry's digest.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// The validated post-order outboard (bao-tree's
    /// `PostOrderMemOutboard::data`).
    pub fn outboard(&self) -> &Bytes {
        &self.outboard
    }

    /// The number of chunk groups.
    pub fn groups(&self) -> u64 {
        self.cvs.len() as u64
    }

    /// Heap bytes held (for cache accounting).
    pub fn weight(&self) -> usize {
        self.cvs.len() * 32 + self.outboard.len() + 64
    }

    /// Checks `data`, the whole of group `index`, against the outboard.
    /// Fails with [`Error::Verification`] on a mismatch or a wrong length.
    pub fn verify_group(&self, index: u64, data: &[u8]) -> Result<()> {
        let groups = self.cvs.len() as u64;
        let start = index.saturating_mul(GROUP_SIZE as u64);
        let want_len = self.size.saturating_sub(start).min(GROUP_SIZE as u64);
        let expected = self
            .cvs
            .get(index as usize)
            .copied()
            .map(blake3::Hash::from);
        if data.len() as u64 != want_len || expected.is_none() {
            // Wrong length: never hashed as if it were the group (an empty
            // non-root subtree has no chaining value at all).
            return Err(Error::Verification {
                expected: self.digest,
                actual: Digest::of(data),
            });
        }
        let actual = hash_group(index, data, groups == 1);
        match expected {
            Some(e) if e == actual => Ok(()),
            _ => Err(Error::Verification {
                expected: self.digest,
                actual: Digest::from(actual),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bao_tree::io::outboard::PostOrderMemOutboard;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    fn reference(d: &[u8]) -> (Digest, Vec<u8>) {
        let ob = PostOrderMemOutboard::create(d, BLOCK_SIZE);
        (Digest::from(ob.root), ob.data)
    }

    const G: usize = GROUP_SIZE;

    /// The sizes the issue names plus the tree's awkward shapes.
    fn sizes() -> Vec<usize> {
        vec![
            0,
            1,
            1023,
            1024,
            G - 1,
            G,
            G + 1,
            2 * G,
            2 * G + 1,
            3 * G,
            5 * G - 1,
            8 * G,
            33 * G + 7,
            (PARALLEL_MIN_GROUPS + 1) * G,
            (2 * PARALLEL_MIN_GROUPS + 3) * G + 100,
        ]
    }

    #[test]
    fn matches_bao_tree_at_edge_sizes_in_one_update() {
        for n in sizes() {
            let d = data(n);
            let (digest, ob) = compute(&d);
            let (rd, rob) = reference(&d);
            assert_eq!(digest, rd, "digest at {n}");
            assert_eq!(digest, Digest::of(&d), "blake3 at {n}");
            assert_eq!(&ob[..], &rob[..], "outboard at {n}");
            assert_eq!(ob.len() as u64, outboard_len(n as u64));
        }
    }

    #[test]
    fn matches_bao_tree_whatever_the_update_sizes() {
        for n in sizes() {
            let d = data(n);
            let (rd, rob) = reference(&d);
            for step in [1usize, 7, 1000, G - 1, G, G + 1, 3 * G + 5, 64 * G] {
                if step == 1 && n > 3 * G {
                    continue;
                }
                let mut b = OutboardBuilder::single_threaded();
                for part in d.chunks(step) {
                    b.update(part);
                }
                b.update(&[]);
                let (digest, ob) = b.finalize();
                assert_eq!((digest, &ob[..]), (rd, &rob[..]), "n {n} step {step}");
            }
        }
    }

    #[test]
    fn groups_hashed_apart_then_updates_match_bao_tree() {
        for n in sizes().into_iter().filter(|&n| n > 2 * G) {
            let d = data(n);
            let (rd, rob) = reference(&d);
            for per in [2usize, 3, 16] {
                // Whole regions of `per` groups pushed pre-hashed, in
                // order; the rest (if any) through `update`.
                let regions = n / (per * G);
                if regions == 0 {
                    continue;
                }
                for rest_by_update in [true, false] {
                    let hashed = if rest_by_update || n.is_multiple_of(per * G) {
                        regions
                    } else {
                        continue;
                    };
                    let mut b = OutboardBuilder::single_threaded();
                    for r in 0..hashed {
                        let at = r * per * G;
                        b.push_hashed(HashedGroups::hash(at as u64, &d[at..at + per * G]));
                    }
                    b.update(&d[hashed * per * G..]);
                    assert_eq!(b.len(), n as u64);
                    let (digest, ob) = b.finalize();
                    assert_eq!((digest, &ob[..]), (rd, &rob[..]), "n {n} per {per}");
                }
            }
        }
        // Every byte pre-hashed: the last group came through push_hashed.
        let d = data(8 * G);
        let mut b = OutboardBuilder::new();
        b.push_hashed(HashedGroups::hash(0, &d[..4 * G]));
        b.push_hashed(HashedGroups::hash(4 * G as u64, &d[4 * G..]));
        let (digest, ob) = b.finalize();
        let (rd, rob) = reference(&d);
        assert_eq!((digest, &ob[..]), (rd, &rob[..]));
    }

    #[test]
    fn matches_bao_tree_at_64_mib_in_parallel() {
        let d = data(64 << 20);
        let (rd, rob) = reference(&d);
        let mut b = OutboardBuilder::new();
        for part in d.chunks(256 * 1024) {
            b.update(part);
        }
        let (digest, ob) = b.finalize();
        assert_eq!(digest, rd);
        assert_eq!(&ob[..], &rob[..]);
        // 16 KiB groups: 4095 pairs of 64 bytes, 0.39 % of the entry.
        assert_eq!(ob.len(), 4095 * 64);
    }

    #[test]
    fn group_hashes_verify_every_group_and_catch_flips() {
        for n in sizes() {
            let d = data(n);
            let (digest, ob) = compute(&d);
            let gh =
                GroupHashes::from_outboard(digest, n as u64, ob.clone()).expect("valid outboard");
            for (i, g) in d.chunks(G).enumerate() {
                gh.verify_group(i as u64, g).expect("group verifies");
                let mut bad = g.to_vec();
                bad[g.len() / 2] ^= 1;
                assert!(matches!(
                    gh.verify_group(i as u64, &bad),
                    Err(Error::Verification { .. })
                ));
                // A short group fails too.
                if !g.is_empty() {
                    assert!(gh.verify_group(i as u64, &g[..g.len() - 1]).is_err());
                }
            }
            if n == 0 {
                gh.verify_group(0, &[]).expect("empty entry's one group");
            }
        }
    }

    #[test]
    fn corrupt_wrong_length_or_foreign_outboards_are_refused() {
        let d = data(9 * G + 3);
        let (digest, ob) = compute(&d);
        for at in [0, 31, 32, 63, 64, ob.len() / 2, ob.len() - 1] {
            let mut bad = ob.to_vec();
            bad[at] ^= 0x40;
            assert!(
                GroupHashes::from_outboard(digest, d.len() as u64, Bytes::from(bad)).is_err(),
                "flip at {at}"
            );
        }
        assert!(
            GroupHashes::from_outboard(digest, d.len() as u64, ob.slice(..ob.len() - 64)).is_err()
        );
        let (other, other_ob) = compute(&data(9 * G + 4));
        assert!(GroupHashes::from_outboard(digest, d.len() as u64, other_ob).is_err());
        assert!(GroupHashes::from_outboard(other, d.len() as u64, ob.clone()).is_err());
        // A one-group entry's outboard must be empty.
        assert!(
            GroupHashes::from_outboard(Digest::of(b"x"), 1, Bytes::from_static(&[0; 64])).is_err()
        );
    }

    #[test]
    fn covering_groups_round_out_to_group_bounds() {
        let g = G as u64;
        let size = 10 * g + 5;
        assert_eq!(covering_groups(&(0..1), size), 0..g);
        assert_eq!(covering_groups(&(g - 1..g + 1), size), 0..2 * g);
        assert_eq!(covering_groups(&(g..2 * g), size), g..2 * g);
        assert_eq!(covering_groups(&(10 * g..size), size), 10 * g..size);
        assert_eq!(covering_groups(&(3 * g..3 * g), size), 3 * g..4 * g);
        assert_eq!(covering_groups(&(size..size), size), 10 * g..size);
        assert_eq!(covering_groups(&(0..0), 0), 0..0);
    }
}
