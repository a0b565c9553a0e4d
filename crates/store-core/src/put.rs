//! The put pipeline (SPEC §4): buffer up to the threshold, spill to the
//! large tier's stage beyond it, hash while streaming, pin, publish.

use bytes::{Bytes, BytesMut};
use store_gc::Pin;
use store_types::{
    Digest, Error, Key, Namespace, PublishOutcome, Result, StagedWrite, Tier, CHUNK_SIZE,
};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::store::Store;
use crate::Mode;

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
/// threshold + 4 MiB; so puts stay at one chunk per batch (ADR-035).
const HASH_BATCH: usize = CHUNK_SIZE;

/// The most a put with a declared length allocates for its kv buffer before
/// any byte arrives.
const PREALLOCATE_MAX: usize = 64 << 20;

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

fn check_expect(expect: Option<Digest>, actual: Digest) -> Result<()> {
    match expect {
        Some(expected) if expected != actual => Err(Error::Verification { expected, actual }),
        _ => Ok(()),
    }
}

impl Store {
    /// Stores the bytes of `body` in `ns`.
    ///
    /// - `len`: the declared length, if known; a body of another length
    ///   fails with [`Error::LengthMismatch`] and publishes nothing.
    /// - `expect`: the digest the caller expects; a mismatch fails with
    ///   [`Error::Verification`] and publishes nothing.
    ///
    /// Memory stays bounded by the threshold plus one chunk whatever the
    /// body's size. The receipt's [`Pin`] protects the entry from GC until
    /// dropped; a put that finds the entry already stored pins it and
    /// reports `deduplicated: true`.
    ///
    /// Cancel-safe: dropping the future before it returns never leaves a
    /// half-written visible entry. At worst it leaves a complete entry
    /// nobody holds a pin on (ordinary garbage, for the next sweeps), a stage
    /// the engine's maintenance removes (a stage file, a multipart upload;
    /// pg-lo's transaction rolls back), or — fleet — a pin row that expires
    /// after its TTL.
    pub async fn put<R>(
        &self,
        ns: &Namespace,
        mut body: R,
        len: Option<u64>,
        expect: Option<Digest>,
    ) -> Result<PutReceipt>
    where
        R: AsyncRead + Unpin + Send,
    {
        let mode = self.inner.mode;
        let (limit, spill) = match mode {
            Mode::MemOnly => (u64::MAX, false),
            Mode::KvOnly { threshold } => (threshold, false),
            Mode::DualTier { threshold } => (threshold, true),
        };
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
        check_expect(expect, digest)?;
        let key = Key::new(ns.clone(), digest);
        let pin = self.inner.gc.pins().pin(key.clone()).await;
        let outcome = match self.pin_intent() {
            // Fleet: entry and pin row in one transaction on the GC host.
            Some((intent, fleet)) => fleet.pins.put_pinned(&key, buf.freeze(), &intent).await?,
            None => self.inner.kv.put(&key, buf.freeze()).await?,
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
                // unless the entry is small enough to be verified whole on
                // every range read, which never needs it (and saves the
                // engine an outboard file, object or column per put).
                if let Some(outboard) =
                    outboard.filter(|_| size > crate::verified::WHOLE_VERIFY_MAX)
                {
                    if let Err(e) = stage.set_outboard(outboard).await {
                        let _ = stage.abort().await;
                        return Err(e);
                    }
                }
                self.publish_large(stage, large.joint_pin_publish(), ns, digest, size)
                    .await
            }
            Err(e) => {
                let _ = stage.abort().await;
                Err(e)
            }
        }
    }

    async fn publish_large(
        &self,
        stage: Box<dyn StagedWrite>,
        joint: bool,
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
        let outcome = match self.pin_intent() {
            None => stage.publish(&key).await?,
            // Fleet, transactional large tier: LO + companion row + pin row
            // in one transaction.
            Some((intent, _)) if joint => stage.publish_pinned(&key, &intent).await?,
            // Fleet, shared media: pin row first, then the publishing
            // rename — never the reverse (ADR-012 §4).
            Some((intent, fleet)) => {
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
async fn stream_into<R>(
    stage: &mut Box<dyn StagedWrite>,
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
