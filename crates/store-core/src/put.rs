//! The put pipeline (SPEC §4): buffer up to the threshold, spill to the
//! large tier's stage beyond it, hash while streaming, pin, publish.
//!
//! # How a put flows
//!
//! ```text
//! put(ns, body) / put_opts(ns, body, PutOptions { len?, expect? })
//!  ├─ len known > threshold ──────────────────────────┐ (dual-tier; kv-only → TooLarge at once)
//!  ├─ len known, from OVERLAP_MIN to PREALLOCATE_MAX, │
//!  │   ≤ threshold (mem-only, raised thresholds): one │
//!  │   buffer (≥ 4 MiB: 2 MiB-aligned, huge pages);   │
//!  │   each full KV_REGION hashed on rayon's pool     │
//!  │   while the next is read, regions rejoined       │
//!  │   without a copy → kv.put as below               │
//!  ├─ read ≤ threshold+1 bytes into a buffer          │
//!  │   ├─ ended ≤ threshold: hash → check expect/len  │
//!  │   │   → pin(key) → kv.put (fleet: put_pinned =   │
//!  │   │     lock_shared + entry + pin row, one tx)   │
//!  │   └─ overflow: kv-only → TooLarge ───────────────┤
//!  └─ large: stage ← buffer, then HASH_BATCH batches at aligned offsets, each
//!          written to the stage and (same Bytes) hashed on rayon's pool while
//!          the next is read — ≤ MAX_BATCHES_IN_FLIGHT unpushed; the groups'
//!          chaining values go into the OutboardBuilder in order, the last
//!          partial piece is hashed by the caller; the engine writes on its
//!          writer thread: hashing, reading and writing overlap
//!          (entries ≤ OUTBOARD_KEPT_ABOVE: no outboard handed over; a range
//!           read computes theirs from one whole read when it is not cached)
//!          (expect given: stage_expecting — an engine may upload straight to
//!           the final name, e.g. store-object, publishing only on success)
//!          → check len/expect (abort stage on mismatch)
//!          → stage.set_outboard(outboard) (published with the entry, ADR-032)
//!          → pin(key)
//!          → non-fleet: stage.publish (engine dedups before fsync)
//!            fleet + Stage::Joint (pg-lo): publish_pinned (LO + row + pin
//!              row, one tx)
//!            fleet+local: pin_first (pin row commits) THEN publish (rename)
//!            fleet+object: pin_first THEN publish (conditional PUT / copy)
//!  → PutReceipt { digest, size, tier, deduplicated, pin }
//!
//! put_bytes(ns, bytes: Bytes) / put_bytes_opts(…, PutOptions { len?, expect? })
//!                                        (a body the caller already owns)
//!  ├─ > threshold: dual-tier → the large path above over &bytes[..]; else TooLarge
//!  └─ ≤ threshold: hash (≥ 4 MiB: on rayon's pool, every core; the task awaits)
//!      → check expect → pin(key) → kv.put(bytes) — the very buffer, no copy
//! ```
//!
//! Memory: at most the threshold + one chunk + the batches being hashed
//! (+ the engine's bounded write queue). Any failure aborts the stage:
//! nothing visible, no stage file. TUNING.md §puts-hashed-while-read,
//! §small-outboards and §owned-bodies give the measurements behind the
//! sizes.
//!
//! The names: [`Store::put_opts`], [`Store::put_bytes_opts`],
//! [`PutOptions`], [`PutReceipt`]; [`OVERLAP_MIN`], [`PREALLOCATE_MAX`],
//! [`KV_REGION`], [`HASH_BATCH`] (one [`CHUNK_SIZE`]),
//! [`MAX_BATCHES_IN_FLIGHT`], [`OUTBOARD_KEPT_ABOVE`](crate::OUTBOARD_KEPT_ABOVE);
//! the engine side: [`Stage::Joint`], [`store_types::StagedWrite::publish`],
//! [`store_types::LargeEngine::stage_expecting`].

use bytes::{Bytes, BytesMut};
use store_gc::Pin;
use store_types::{Digest, Error, Key, Namespace, PublishOutcome, Result, Stage, Tier, CHUNK_SIZE};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::inspect::StoredCopy;
use crate::store::Store;
use crate::Mode;

/// What a put checks the body against ([`Store::put_opts`],
/// [`Store::put_bytes_opts`]); the default checks nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PutOptions {
    /// The declared length, if known: a body of another length fails with
    /// [`Error::LengthMismatch`] and publishes nothing.
    pub len: Option<u64>,
    /// The digest the caller expects: a mismatch fails with
    /// [`Error::Verification`] and publishes nothing.
    pub expect: Option<Digest>,
}

/// What a successful put returns.
#[derive(Debug)]
pub struct PutReceipt {
    /// The content's digest.
    pub digest: Digest,
    /// Its length in bytes.
    pub size: u64,
    /// Where it lives.
    pub tier: Tier,
    /// Whether the entry already existed (nothing new was written).
    pub deduplicated: bool,
    /// Protects the entry until the caller has recorded a reference to it.
    pub pin: Pin,
}

impl PutReceipt {
    /// The stored entry's key.
    pub fn key(&self) -> &Key {
        self.pin.key()
    }
}

/// Bytes a large put reads, hashes and hands to the stage at a time: one
/// chunk. A 2 MiB batch (which the outboard builder hashes on every core)
/// measured 6.6–6.9 GiB/s against 5.0–5.8 single-threaded, but raised the
/// 1 GiB put + get peak RSS from 1.25 to 9.96 MiB above baseline (batches
/// queued behind the engine's writer), past the memory target of
/// threshold + 4 MiB; so puts stay at one chunk per batch (TUNING.md §multi-core-hashing), and
/// use the second core by hashing each batch on the pool while the next is
/// read (TUNING.md §puts-hashed-while-read).
const HASH_BATCH: usize = CHUNK_SIZE;

/// The most a put with a declared length allocates for its kv buffer before
/// any byte arrives.
const PREALLOCATE_MAX: usize = 64 << 20;

/// Bytes of a kv-path put hashed as one task on rayon's pool while the next
/// ones are read (TUNING.md §puts-hashed-while-read).
const KV_REGION: usize = 1 << 20;

/// Declared lengths from which a kv-path put hashes while it reads
/// ([`fill_hashing`]); shorter bodies are read whole, then hashed.
const OVERLAP_MIN: u64 = 2 * KV_REGION as u64;

/// Large-tier batches hashed on the pool but not yet pushed into the
/// outboard builder: bounds the chunks a put keeps alive for hashing
/// beyond what the stage holds (TUNING.md §puts-hashed-while-read).
const MAX_BATCHES_IN_FLIGHT: usize = 4;

/// Reads from `body` into `buf` until EOF or until `buf` holds `cap` bytes.
/// Returns whether EOF was reached.
async fn fill<R: AsyncRead + Unpin + ?Sized>(
    body: &mut R,
    buf: &mut BytesMut,
    cap: usize,
) -> Result<bool> {
    while buf.len() < cap {
        let want = (cap - buf.len()).min(CHUNK_SIZE);
        buf.reserve(want);
        let n = (&mut *body)
            .take(want as u64)
            .read_buf(buf)
            .await
            .map_err(Error::from)?;
        if n == 0 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Reads a body of declared length `len` into one buffer (allocated once,
/// huge-page backed when large: [`store_types::buffer::entry_buffer`]),
/// hashing each full [`KV_REGION`] on rayon's pool while the next one is
/// read (TUNING.md §puts-hashed-while-read). The regions travel to the pool and back as handles of
/// the one allocation and are joined again without a copy. Fails with
/// [`Error::LengthMismatch`] when the body is shorter or longer than `len`.
async fn fill_hashing<R: AsyncRead + Unpin + ?Sized>(
    body: &mut R,
    len: usize,
) -> Result<(BytesMut, Digest)> {
    use store_types::outboard::{HashedGroups, OutboardBuilder};
    let mut rest = store_types::buffer::entry_buffer(len);
    let mut in_flight = std::collections::VecDeque::new();
    let mut offset = 0usize;
    loop {
        let want = (len - offset).min(KV_REGION);
        let eof = fill(body, &mut rest, want).await?;
        if eof {
            return Err(Error::LengthMismatch {
                declared: len as u64,
                actual: (offset + rest.len()) as u64,
            });
        }
        if offset + want == len {
            break;
        }
        let region = rest.split_to(want);
        in_flight.push_back(HashedGroups::spawn(offset as u64, region));
        offset += want;
    }
    // One byte past the declared length means the body is longer.
    let mut probe = [0u8; 1];
    if body.read(&mut probe).await.map_err(Error::from)? > 0 {
        return Err(Error::LengthMismatch {
            declared: len as u64,
            actual: len as u64 + 1,
        });
    }
    let mut builder = OutboardBuilder::new();
    let mut whole: Option<BytesMut> = None;
    for rx in in_flight {
        let (region, groups) = rx.await.map_err(|_| crate::blob::hashing_lost())?;
        builder.push_hashed(groups);
        whole = Some(join(whole, region));
    }
    // The last region (at most KV_REGION bytes) is hashed here.
    builder.update(&rest);
    let digest = builder.finalize().0;
    Ok((join(whole, rest), digest))
}

/// `head` followed by `tail`: no copy when they are adjacent views of one
/// allocation (as regions split off one buffer are), else `tail` is
/// appended.
fn join(head: Option<BytesMut>, tail: BytesMut) -> BytesMut {
    match head {
        None => tail,
        Some(mut head) => {
            if let Err(tail) = head.try_unsplit(tail) {
                head.extend_from_slice(&tail);
            }
            head
        }
    }
}

fn check_expect(expect: Option<Digest>, actual: Digest) -> Result<()> {
    match expect {
        Some(expected) if expected != actual => Err(Error::Verification { expected, actual }),
        _ => Ok(()),
    }
}

impl Store {
    /// Stores the bytes of `body` in `ns`: [`Store::put_opts`] with nothing
    /// to check the body against.
    ///
    /// Cancel-safe as [`Store::put_opts`].
    pub async fn put<R>(&self, ns: &Namespace, body: R) -> Result<PutReceipt>
    where
        R: AsyncRead + Unpin + Send,
    {
        self.put_opts(ns, body, PutOptions::default()).await
    }

    /// Stores the bytes of `body` in `ns`, checked against `options` (the
    /// declared length, the expected digest; see [`PutOptions`]).
    ///
    /// Memory stays bounded by the threshold plus one chunk (and up to
    /// four one-chunk batches being hashed on rayon's pool, TUNING.md
    /// §puts-hashed-while-read) whatever
    /// the body's size. The receipt's [`Pin`] protects the entry from GC until
    /// dropped; a put that finds the entry already stored pins it and
    /// reports `deduplicated: true`.
    ///
    /// Cancel-safe: dropping the future before it returns never leaves a
    /// half-written visible entry. At worst it leaves a complete entry
    /// nobody holds a pin on (ordinary garbage, for the next sweeps), a stage
    /// the engine's maintenance removes (a stage file, a multipart upload;
    /// pg-lo's transaction rolls back), or — fleet — a pin row that expires
    /// after its TTL.
    pub async fn put_opts<R>(
        &self,
        ns: &Namespace,
        mut body: R,
        options: PutOptions,
    ) -> Result<PutReceipt>
    where
        R: AsyncRead + Unpin + Send,
    {
        let PutOptions { len, expect } = options;
        let (limit, spill) = self.kv_limit();
        if let Some(n) = len {
            if n > limit {
                if !spill {
                    return Err(Error::TooLarge { limit, got: n });
                }
                return self
                    .put_large(ns, &mut body, BytesMut::new(), len, expect)
                    .await;
            }
        }
        // Read one byte past what the kv tier may hold (or past the declared
        // length) to learn whether the body overflows.
        let cap = len.unwrap_or(limit).min(limit).saturating_add(1);
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        // A declared length is allocated at once (up to a bound, so a
        // false declaration cannot reserve unbounded memory): no regrowth
        // copies while the buffer fills.
        let initial = match len {
            Some(_) => cap.min(PREALLOCATE_MAX + 1),
            None => cap.min(CHUNK_SIZE),
        };
        if let Some(n) = len.filter(|&n| (OVERLAP_MIN..=PREALLOCATE_MAX as u64).contains(&n)) {
            // Large enough to hash on other cores while the rest is read.
            let (buf, digest) = fill_hashing(&mut body, n as usize).await?;
            return self.put_kv(ns, buf.freeze(), digest, expect).await;
        }
        let mut buf = BytesMut::with_capacity(initial);
        let eof = fill(&mut body, &mut buf, cap).await?;
        let got = buf.len() as u64;
        if let Some(n) = len {
            if got != n {
                return Err(Error::LengthMismatch {
                    declared: n,
                    actual: got,
                });
            }
        }
        if !eof || got > limit {
            if !spill {
                return Err(Error::TooLarge { limit, got });
            }
            return self.put_large(ns, &mut body, buf, len, expect).await;
        }
        let digest = crate::blob::digest_of(&buf);
        self.put_kv(ns, buf.freeze(), digest, expect).await
    }

    /// Stores `bytes`, a body already in memory, in `ns`:
    /// [`Store::put_bytes_opts`] with nothing to check them against.
    ///
    /// Cancel-safe as [`Store::put_bytes_opts`].
    pub async fn put_bytes(&self, ns: &Namespace, bytes: Bytes) -> Result<PutReceipt> {
        self.put_bytes_opts(ns, bytes, PutOptions::default()).await
    }

    /// Stores `bytes`, a body already in memory, in `ns`, checked against `options`: [`Store::put_opts`]
    /// without the read, and with the same errors, pins and cancel-safety.
    ///
    /// On the kv tier the entry is `bytes` itself — no copy (the mem engine
    /// keeps this very buffer; a database engine writes it from there) —
    /// and a body of 4 MiB or more is hashed on every core, on rayon's
    /// pool, while the calling task awaits it without holding a runtime
    /// worker. A body for the large tier is streamed into the engine's
    /// stage as `put` streams a reader (its bytes are written elsewhere
    /// anyway). A body too large for a store without a large tier fails
    /// with [`Error::TooLarge`] before anything is hashed.
    ///
    /// An engine that keeps the buffer (mem) keeps all of it: a `Bytes`
    /// sliced from a much larger allocation holds that allocation for as
    /// long as the entry lives — pass `Bytes::copy_from_slice(..)` then.
    pub async fn put_bytes_opts(
        &self,
        ns: &Namespace,
        bytes: Bytes,
        options: PutOptions,
    ) -> Result<PutReceipt> {
        let PutOptions {
            len: declared,
            expect,
        } = options;
        let len = bytes.len() as u64;
        if let Some(declared) = declared.filter(|d| *d != len) {
            return Err(Error::LengthMismatch {
                declared,
                actual: len,
            });
        }
        let (limit, spill) = self.kv_limit();
        if len > limit {
            if !spill {
                return Err(Error::TooLarge { limit, got: len });
            }
            return self
                .put_large(ns, &mut &bytes[..], BytesMut::new(), Some(len), expect)
                .await;
        }
        let (bytes, digest) = if len >= crate::blob::PARALLEL_HASH_MIN {
            crate::blob::on_pool(move || {
                let digest = crate::blob::digest_of(&bytes);
                (bytes, digest)
            })
            .await?
        } else {
            let digest = Digest::of(&bytes);
            (bytes, digest)
        };
        self.put_kv(ns, bytes, digest, expect).await
    }

    /// The most bytes the kv tier takes in this mode, and whether a larger
    /// body spills to the large tier (dual-tier) rather than failing.
    fn kv_limit(&self) -> (u64, bool) {
        match self.inner.mode {
            Mode::MemOnly => (u64::MAX, false),
            Mode::KvOnly { threshold } => (threshold, false),
            Mode::DualTier { threshold } => (threshold, true),
        }
    }

    /// The kv half of a put: `buf` is the whole body, `digest` its hash.
    async fn put_kv(
        &self,
        ns: &Namespace,
        buf: Bytes,
        digest: Digest,
        expect: Option<Digest>,
    ) -> Result<PutReceipt> {
        check_expect(expect, digest)?;
        let got = buf.len() as u64;
        let key = Key::new(ns.clone(), digest);
        let pin = self.inner.gc.pins().pin(key.clone()).await;
        let outcome = match self.pin_intent() {
            // Fleet: entry and pin row in one transaction on the GC host.
            Some((intent, fleet)) => fleet.pins.put_pinned(&key, buf, &intent).await?,
            None => match self.inner.kv.put(&key, buf.clone()).await? {
                // A dedup is acknowledged only onto a sound copy: a
                // corrupt one is what a quarantine removes (ADR-053).
                PublishOutcome::AlreadyPresent => match self.stored_copy(Tier::Kv, &key).await? {
                    StoredCopy::Sound => PublishOutcome::AlreadyPresent,
                    _ => {
                        let kv = std::sync::Arc::clone(&self.inner.kv);
                        let k = key.clone();
                        let publish = Box::pin(async move { kv.put(&k, buf).await });
                        self.heal_copy(&key, Tier::Kv, Some(publish)).await?
                    }
                },
                inserted => inserted,
            },
        };
        Ok(PutReceipt {
            digest,
            size: got,
            tier: Tier::Kv,
            deduplicated: outcome == PublishOutcome::AlreadyPresent,
            pin,
        })
    }

    async fn put_large<R>(
        &self,
        ns: &Namespace,
        body: &mut R,
        prefix: BytesMut,
        len: Option<u64>,
        expect: Option<Digest>,
    ) -> Result<PutReceipt>
    where
        R: AsyncRead + Unpin + Send,
    {
        let large = self
            .inner
            .large
            .as_ref()
            .expect("dual-tier stores always have a large engine");
        // With an expected digest the engine may write straight to the
        // entry's final location: the stage is published under that key
        // only, and only once the bytes are verified to hash to it.
        let mut stage = match &expect {
            Some(d) => large.stage_expecting(ns, d).await?,
            None => large.stage(ns).await?,
        };
        let hasher = if self.inner.outboards_at_put {
            let mut b = store_types::outboard::OutboardBuilder::new();
            if let Some(n) = len {
                b.reserve_for(n);
            }
            PutHasher::Outboard(b)
        } else {
            PutHasher::Plain(Box::new(blake3::Hasher::new()))
        };
        match stream_into(&mut stage, body, prefix, len, hasher).await {
            Ok((digest, size, outboard)) => {
                if let Err(e) = check_expect(expect, digest) {
                    let _ = stage.abort().await;
                    return Err(e);
                }
                // The outboard is published with the entry (ADR-032) —
                // unless the entry is at most 1 MiB: a range read computes
                // that from one whole read when it needs it (TUNING.md §small-outboards), and
                // the engine saves an outboard file, object or row per put.
                if let Some(outboard) =
                    outboard.filter(|_| size > crate::verified::OUTBOARD_KEPT_ABOVE)
                {
                    if let Err(e) = stage.set_outboard(outboard).await {
                        let _ = stage.abort().await;
                        return Err(e);
                    }
                }
                self.publish_large(stage, ns, digest, size).await
            }
            Err(e) => {
                let _ = stage.abort().await;
                Err(e)
            }
        }
    }

    async fn publish_large(
        &self,
        stage: Stage,
        ns: &Namespace,
        digest: Digest,
        size: u64,
    ) -> Result<PutReceipt> {
        let key = Key::new(ns.clone(), digest);
        // Pin before looking: a sweep deleting this key finishes first (the
        // pin waits on its gate), and no sweep can start deleting it after.
        // The engine's publish finds an existing entry itself (before any
        // fsync) and discards the stage: no extra round trip, and no second
        // connection while the stage holds one (pg-lo).
        let pin = self.inner.gc.pins().pin(key.clone()).await;
        let outcome = match (self.pin_intent(), stage) {
            (None, stage) => self.publish_checked(&key, stage).await?,
            // Fleet, transactional large tier: LO + companion row + pin row
            // in one transaction.
            (Some((intent, _)), Stage::Joint(stage)) => stage.publish_pinned(&key, &intent).await?,
            // Fleet, shared media: pin row first, then the publishing
            // rename — never the reverse (ADR-012 §4).
            (Some((intent, fleet)), stage) => {
                if let Err(e) = fleet.pins.pin_first(&key, &intent).await {
                    let _ = stage.abort().await;
                    return Err(e);
                }
                stage.publish(&key).await?
            }
        };
        let deduplicated = outcome == PublishOutcome::AlreadyPresent;
        Ok(PutReceipt {
            digest,
            size,
            tier: Tier::Large,
            deduplicated,
            pin,
        })
    }
}

impl Store {
    /// A non-fleet large publish that is never acknowledged onto a corrupt
    /// copy (ADR-053). A stage that holds no database connection
    /// ([`Stage::Plain`]) looks first: an existing copy is hashed from
    /// storage, and a corrupt one is replaced by the stage's bytes under
    /// the quarantine lock. A joint stage (a transaction on a pooled
    /// connection: asking for a second one while holding it could starve
    /// the pool) publishes first; a deduplicated copy is then hashed, and a
    /// corrupt one removed under the lock and the put refused (its bytes
    /// went with the stage). A dedup onto a sound copy costs one whole read
    /// and hash of it.
    async fn publish_checked(&self, key: &Key, stage: Stage) -> Result<PublishOutcome> {
        let stage = match stage {
            // A stat first: a new entry (the usual put) pays no read. A
            // copy that appears after it is judged after the publish.
            Stage::Plain(plain) => match self.has_copy(Tier::Large, key).await {
                Err(e) => {
                    let _ = plain.abort().await;
                    return Err(e);
                }
                Ok(false) => Stage::Plain(plain),
                Ok(true) => match self.stored_copy(Tier::Large, key).await {
                    Err(e) => {
                        let _ = plain.abort().await;
                        return Err(e);
                    }
                    Ok(StoredCopy::Corrupt { .. }) => {
                        let k = key.clone();
                        let publish = Box::pin(async move { plain.publish(&k).await });
                        return self.heal_copy(key, Tier::Large, Some(publish)).await;
                    }
                    // The engine deduplicates onto a sound copy (and may
                    // give it the stage's outboard).
                    Ok(StoredCopy::Sound) => return plain.publish(key).await,
                    Ok(StoredCopy::Absent) => Stage::Plain(plain),
                },
            },
            joint @ Stage::Joint(_) => joint,
        };
        match stage.publish(key).await? {
            PublishOutcome::AlreadyPresent => match self.stored_copy(Tier::Large, key).await? {
                StoredCopy::Sound => Ok(PublishOutcome::AlreadyPresent),
                _ => self.heal_copy(key, Tier::Large, None).await,
            },
            inserted => Ok(inserted),
        }
    }
}

/// How a large put hashes: building the outboard (the default), or a plain
/// digest ([`crate::StoreBuilder::outboards_at_put`] off).
enum PutHasher {
    Outboard(store_types::outboard::OutboardBuilder),
    Plain(Box<blake3::Hasher>),
}

impl PutHasher {
    fn update(&mut self, bytes: &[u8]) {
        match self {
            PutHasher::Outboard(b) => {
                b.update(bytes);
            }
            PutHasher::Plain(h) => {
                h.update(bytes);
            }
        }
    }

    fn finalize(self) -> (Digest, Option<Bytes>) {
        match self {
            PutHasher::Outboard(b) => {
                let (d, ob) = b.finalize();
                (d, Some(ob))
            }
            PutHasher::Plain(h) => (Digest::from_bytes(*h.finalize().as_bytes()), None),
        }
    }
}

/// Streams `prefix` then the rest of `body` into the stage, hashing as it
/// goes (the stage's writer runs concurrently, so hashing overlaps I/O) and
/// building the entry's outboard in the same pass (unless `hasher` is
/// plain). Enforces the declared length. Returns the digest, the size and
/// the outboard.
///
/// With an outboard builder the body is cut into [`HASH_BATCH`]es at
/// batch-aligned offsets of the entry; each full batch goes to the stage
/// and, as a handle of the same buffer, to rayon's pool to be hashed while
/// the next one is read (at most [`MAX_BATCHES_IN_FLIGHT`] unpushed, TUNING.md §puts-hashed-while-read).
async fn stream_into<R>(
    stage: &mut Stage,
    body: &mut R,
    prefix: BytesMut,
    len: Option<u64>,
    hasher: PutHasher,
) -> Result<(Digest, u64, Option<Bytes>)>
where
    R: AsyncRead + Unpin + Send,
{
    let mut builder = match hasher {
        PutHasher::Outboard(b) => b,
        plain @ PutHasher::Plain(_) => return stream_plain(stage, body, prefix, len, plain).await,
    };
    let mut in_flight = InFlight::new();
    // Bytes read but not yet handed on; starts with the kv probe's buffer.
    let mut pending = prefix;
    let mut total = 0u64;
    let mut eof = false;
    // Set once a piece was hashed here: the builder then holds a partial
    // group, and every later byte goes through it too.
    let mut inline = false;
    loop {
        let boundary = HASH_BATCH - (total % HASH_BATCH as u64) as usize;
        if pending.len() < boundary && !eof {
            // Never read more than one byte past the declared length.
            let limit = match len {
                Some(n) => n.saturating_add(1).saturating_sub(total) as usize,
                None => usize::MAX,
            };
            let want = boundary.min(limit);
            if pending.len() < want {
                eof = fill(body, &mut pending, want).await?;
            }
        }
        if pending.is_empty() {
            break;
        }
        let piece = pending.split_to(boundary.min(pending.len())).freeze();
        let at = total;
        total += piece.len() as u64;
        if let Some(n) = len {
            if total > n {
                return Err(Error::LengthMismatch {
                    declared: n,
                    actual: total,
                });
            }
        }
        hash_piece(&mut builder, &mut in_flight, &mut inline, at, &piece).await?;
        stage.write(piece).await?;
    }
    if let Some(n) = len {
        if total != n {
            return Err(Error::LengthMismatch {
                declared: n,
                actual: total,
            });
        }
    }
    while !in_flight.is_empty() {
        push_next(&mut builder, &mut in_flight).await?;
    }
    let (digest, outboard) = builder.finalize();
    Ok((digest, total, Some(outboard)))
}

/// Hands `piece`, at offset `at` of the entry, to the outboard: a full,
/// aligned batch is hashed on the pool (after waiting for the oldest one
/// when [`MAX_BATCHES_IN_FLIGHT`] are unpushed); any other piece — the
/// entry's last, or its only one — is hashed here after every batch before
/// it, and so is every later byte (`inline`).
async fn hash_piece(
    builder: &mut store_types::outboard::OutboardBuilder,
    in_flight: &mut InFlight,
    inline: &mut bool,
    at: u64,
    piece: &Bytes,
) -> Result<()> {
    if piece.len() == HASH_BATCH && !*inline {
        if in_flight.len() >= MAX_BATCHES_IN_FLIGHT {
            push_next(builder, in_flight).await?;
        }
        in_flight.push_back(store_types::outboard::HashedGroups::spawn(
            at,
            piece.clone(),
        ));
        return Ok(());
    }
    while !in_flight.is_empty() {
        push_next(builder, in_flight).await?;
    }
    builder.update(piece);
    *inline = true;
    Ok(())
}

type InFlight = std::collections::VecDeque<
    tokio::sync::oneshot::Receiver<(Bytes, store_types::outboard::HashedGroups)>,
>;

/// Waits for the oldest batch on the pool and pushes its groups.
async fn push_next(
    builder: &mut store_types::outboard::OutboardBuilder,
    in_flight: &mut InFlight,
) -> Result<()> {
    let rx = in_flight.pop_front().expect("a batch in flight");
    let (_, groups) = rx.await.map_err(|_| crate::blob::hashing_lost())?;
    builder.push_hashed(groups);
    Ok(())
}

/// [`stream_into`] with a plain hasher: each chunk hashed on the caller's
/// thread ([`crate::StoreBuilder::outboards_at_put`] off).
async fn stream_plain<R>(
    stage: &mut Stage,
    body: &mut R,
    prefix: BytesMut,
    len: Option<u64>,
    mut hasher: PutHasher,
) -> Result<(Digest, u64, Option<Bytes>)>
where
    R: AsyncRead + Unpin + Send,
{
    let mut total = prefix.len() as u64;
    if !prefix.is_empty() {
        hasher.update(&prefix);
        stage.write(prefix.freeze()).await?;
    }
    loop {
        // Never read more than one byte past the declared length.
        let cap = match len {
            Some(n) => n
                .saturating_add(1)
                .saturating_sub(total)
                .min(HASH_BATCH as u64) as usize,
            None => HASH_BATCH,
        };
        if cap == 0 {
            break;
        }
        let mut chunk = BytesMut::with_capacity(cap);
        let eof = fill(body, &mut chunk, cap).await?;
        if !chunk.is_empty() {
            total += chunk.len() as u64;
            if let Some(n) = len {
                if total > n {
                    return Err(Error::LengthMismatch {
                        declared: n,
                        actual: total,
                    });
                }
            }
            hasher.update(&chunk);
            let chunk: Bytes = chunk.freeze();
            stage.write(chunk).await?;
        }
        if eof {
            break;
        }
    }
    if let Some(n) = len {
        if total != n {
            return Err(Error::LengthMismatch {
                declared: n,
                actual: total,
            });
        }
    }
    let (digest, outboard) = hasher.finalize();
    Ok((digest, total, outboard))
}

#[cfg(test)]
mod tests {
    use std::pin::Pin as StdPin;
    use std::sync::{Arc, Mutex};
    use std::task::{Context, Poll};

    use async_trait::async_trait;
    use store_types::outboard::{self, GROUP_SIZE};
    use tokio::io::ReadBuf;

    use super::*;

    /// A body that hands out `data` in odd-sized pieces and answers
    /// `Pending` (waking itself) on every other poll, as a network body
    /// does.
    struct Chunky {
        data: Vec<u8>,
        at: usize,
        polls: usize,
    }

    impl Chunky {
        fn new(data: Vec<u8>) -> Self {
            Chunky {
                data,
                at: 0,
                polls: 0,
            }
        }
    }

    impl AsyncRead for Chunky {
        fn poll_read(
            mut self: StdPin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            const SIZES: [usize; 6] = [1, 7, 16_385, 100_003, 3, 262_147];
            self.polls += 1;
            if self.polls.is_multiple_of(2) {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let piece = SIZES[self.polls / 2 % SIZES.len()];
            let n = piece.min(buf.remaining()).min(self.data.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.data[at..at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| (i * 31 + i / 251 + i / 65_521) as u8)
            .collect()
    }

    #[tokio::test]
    async fn kv_bodies_hashed_while_read_give_the_digest_and_the_bytes() {
        for n in [
            2 * KV_REGION,
            2 * KV_REGION + 1,
            3 * KV_REGION + 12_345,
            4 * KV_REGION,
            5 * KV_REGION + 7,
        ] {
            let d = data(n);
            let (buf, digest) = fill_hashing(&mut Chunky::new(d.clone()), n)
                .await
                .expect("fill");
            assert_eq!(digest, Digest::of(&d), "digest at {n}");
            assert!(buf[..] == d[..], "bytes at {n}");
            if cfg!(target_os = "linux") && n >= store_types::buffer::HUGE_BUFFER_MIN {
                // The regions were joined in place: the buffer is still the
                // one 2 MiB-aligned allocation (a copying join would have
                // moved it).
                assert!(
                    (buf.as_ptr() as usize).is_multiple_of(2 << 20),
                    "joined without a copy at {n}"
                );
            }
        }
    }

    #[tokio::test]
    async fn kv_bodies_of_another_length_fail() {
        let n = 3 * KV_REGION + 5;
        let short = fill_hashing(&mut Chunky::new(data(n - 1)), n).await;
        assert!(
            matches!(short, Err(Error::LengthMismatch { declared, actual })
                if declared == n as u64 && actual == n as u64 - 1),
            "{short:?}"
        );
        let long = fill_hashing(&mut Chunky::new(data(n + 10)), n).await;
        assert!(
            matches!(long, Err(Error::LengthMismatch { declared, actual })
                if declared == n as u64 && actual == n as u64 + 1),
            "{long:?}"
        );
    }

    /// A stage that keeps what it is given.
    #[derive(Debug, Default)]
    struct Collect(Arc<Mutex<Vec<u8>>>);

    #[async_trait]
    impl store_types::StagedWrite for Collect {
        async fn write(&mut self, chunk: Bytes) -> Result<()> {
            self.0.lock().unwrap().extend_from_slice(&chunk);
            Ok(())
        }
        async fn publish(self: Box<Self>, _key: &Key) -> Result<PublishOutcome> {
            Ok(PublishOutcome::Inserted)
        }
        async fn abort(self: Box<Self>) -> Result<()> {
            Ok(())
        }
    }

    async fn stream(
        d: &[u8],
        prefix_len: usize,
        len: Option<u64>,
    ) -> (Result<(Digest, u64, Option<Bytes>)>, Vec<u8>) {
        let written = Arc::new(Mutex::new(Vec::new()));
        let mut stage = Stage::Plain(Box::new(Collect(written.clone())));
        let prefix = BytesMut::from(&d[..prefix_len]);
        let mut body = Chunky::new(d[prefix_len..].to_vec());
        let hasher = PutHasher::Outboard(outboard::OutboardBuilder::new());
        let r = stream_into(&mut stage, &mut body, prefix, len, hasher).await;
        let w = written.lock().unwrap().clone();
        (r, w)
    }

    #[tokio::test]
    async fn large_puts_hashed_on_the_pool_give_the_digest_and_the_outboard() {
        let b = HASH_BATCH;
        for n in [
            0,
            100,
            GROUP_SIZE + 1,
            b - 1,
            b,
            b + 1,
            4 * b,
            5 * b + GROUP_SIZE,
            (MAX_BATCHES_IN_FLIGHT + 3) * b + 12_345,
        ] {
            let d = data(n);
            let (rd, rob) = outboard::compute(&d);
            for prefix in [0, 65_537.min(n), (b + 3).min(n)] {
                for len in [Some(n as u64), None] {
                    let (r, written) = stream(&d, prefix, len).await;
                    let (digest, size, ob) = r.expect("stream");
                    let what = format!("n {n} prefix {prefix} len {len:?}");
                    assert_eq!(digest, rd, "digest: {what}");
                    assert_eq!(size, n as u64, "size: {what}");
                    assert_eq!(ob.as_deref(), Some(&rob[..]), "outboard: {what}");
                    assert!(written == d, "staged bytes: {what}");
                }
            }
        }
    }

    #[tokio::test]
    async fn large_puts_of_another_length_fail() {
        let n = 3 * HASH_BATCH + 17;
        let d = data(n);
        let (short, _) = stream(&d, 0, Some(n as u64 + 1)).await;
        assert!(
            matches!(short, Err(Error::LengthMismatch { actual, .. }) if actual == n as u64),
            "{short:?}"
        );
        let (long, _) = stream(&d, 0, Some(n as u64 - 1)).await;
        assert!(
            matches!(long, Err(Error::LengthMismatch { actual, .. }) if actual == n as u64),
            "{long:?}"
        );
    }
}
