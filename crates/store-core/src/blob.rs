//! The verifying reader every read returns ([`Blob`]), and the hashing
//! helpers it shares with puts.
//!
//! # How a plain GET answers (ADR-025)
//!
//! The server's side (store-ops' `get`, store-http's `body.rs`) over this
//! reader:
//!
//! ```text
//! GET /v1/blobs/{ns}/{digest} [, Range]
//!  └─ get: Store::get (whole) or stat + Store::read_range (206)
//!     ├─ body ≤ one CHUNK_SIZE: Blob::bytes (verified) before the head
//!     │  → one buffer with Content-Length; corrupt → 422 verification
//!     └─ larger: streamed by Blob::next_chunk — the engine's own read-ahead
//!        buffers as Bytes where it has them (local, object:
//!        BlobReader::Chunks), else ≤ CHUNK_SIZE copied out of the reader —
//!        each held back until the next call succeeded → a failure at EOF
//!        (or in a range's group) withholds the last chunk and aborts the
//!        body: never a complete bad response
//! ```
//!
//! The names: [`Store::get`](crate::Store::get),
//! [`Store::read_range`](crate::Store::read_range), [`Blob::bytes`],
//! [`Blob::next_chunk`], [`BlobReader::Chunks`], [`CHUNK_SIZE`];
//! TUNING.md §small-responses and §response-chunks.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use store_types::{BlobReader, Chunks, Digest, Error, Gather, Result, Tier, CHUNK_SIZE};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::sync::oneshot;

pub(crate) use store_types::outboard::{digest_of, PARALLEL_HASH_MIN};

/// Runs `hash` (CPU-bound hashing) on rayon's pool and awaits its result
/// without holding a runtime worker. Cancel-safe: dropping the future lets
/// the task finish and discards what it returns.
pub(crate) async fn on_pool<T, F>(hash: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = oneshot::channel();
    rayon::spawn(move || {
        let _ = tx.send(hash());
    });
    rx.await.map_err(|_| hashing_lost())
}

/// The error of a hashing task on rayon's pool that ended without a result.
pub(crate) fn hashing_lost() -> Error {
    Error::backend(store_types::ErrorKind::Other, "a hashing task ended early")
}

/// A streaming read of an entry (or of a range of it).
///
/// Whole-entry reads from [`Store::get`](crate::Store::get) are verified:
/// the read fails at EOF with [`Error::Verification`] (inside the
/// `io::Error`; convert it back with `Error::from`) if the bytes do not hash
/// to the key's digest or the length is wrong. The bytes are hashed as they
/// stream — by the engine when it supplies the digest of what it yields
/// (the `digest` a [`BlobReader`] carries, e.g. from its read-ahead thread), else
/// here, on the consumer's thread. Ranged reads from
/// [`Store::read_range`](crate::Store::read_range) are verified too, before
/// any byte is yielded, by chunk group against the entry's outboard
/// (ADR-032).
pub struct Blob {
    len: u64,
    tier: Tier,
    reader: Pin<Box<dyn AsyncRead + Send>>,
    verify: Option<Verifier>,
    /// A range read whose reader checks every byte before yielding it.
    range_checked: bool,
    /// The entry's bytes, when the engine had them in memory
    /// ([`BlobReader::Bytes`]): [`Blob::bytes`] hashes and returns them
    /// without a copy.
    whole: Option<Bytes>,
    /// The engine's owned chunks of a whole read ([`BlobReader::Chunks`]):
    /// [`Blob::next_chunk`] hands them on without a copy.
    chunks: Option<Chunks>,
    /// [`Blob::next_chunk`]'s buffer when it reads through `reader`.
    chunk_buf: BytesMut,
}

/// An engine's [`BlobReader`] as a `Blob` reads it: one byte view, plus
/// the in-memory bytes or owned chunks it may take instead (both read from
/// the same position as `reader`).
struct Body {
    len: u64,
    reader: Pin<Box<dyn AsyncRead + Send>>,
    digest: Option<EngineDigest>,
    whole: Option<Bytes>,
    chunks: Option<Chunks>,
}

impl Body {
    fn of(r: BlobReader) -> Body {
        match r {
            BlobReader::Bytes { bytes, digest } => Body {
                len: bytes.len() as u64,
                reader: Box::pin(std::io::Cursor::new(bytes.clone())),
                digest: digest.map(EngineDigest::Known),
                whole: Some(bytes),
                chunks: None,
            },
            BlobReader::Chunks {
                len,
                chunks,
                digest,
            } => Body {
                len,
                reader: Box::pin(chunks.reader()),
                digest: digest.map(EngineDigest::Later),
                whole: None,
                chunks: Some(chunks),
            },
            BlobReader::Stream {
                len,
                reader,
                digest,
            } => Body {
                len,
                reader,
                digest: digest.map(EngineDigest::Later),
                whole: None,
                chunks: None,
            },
        }
    }
}

struct Verifier {
    expected: Digest,
    /// Bytes yielded so far.
    seen: u64,
    /// Set once the verdict is delivered (or the read failed for good).
    finished: bool,
    check: Check,
}

/// Who hashes the bytes of a verified read.
enum Check {
    /// The facade, as the bytes pass through `poll_read` (boxed: the
    /// hasher's state is ~2 KB; made at the first bytes hashed in pieces,
    /// so an entry in memory hashed at once never allocates one).
    Here(Option<Box<blake3::Hasher>>),
    /// The engine: its digest of the yielded bytes arrives on `digest`.
    /// `at_eof` is set once the reader reported EOF and only the digest
    /// is still awaited (the reader is not polled again).
    Engine { digest: EngineDigest, at_eof: bool },
}

impl Blob {
    pub(crate) fn verified(r: BlobReader, tier: Tier, expected: Digest) -> Self {
        let body = Body::of(r);
        let check = match body.digest {
            Some(digest) => Check::Engine {
                digest,
                at_eof: false,
            },
            None => Check::Here(None),
        };
        Blob {
            len: body.len,
            tier,
            reader: body.reader,
            verify: Some(Verifier {
                expected,
                seen: 0,
                finished: false,
                check,
            }),
            range_checked: false,
            whole: body.whole,
            chunks: body.chunks,
            chunk_buf: BytesMut::new(),
        }
    }

    /// Ranged reads: the reader verifies (by chunk group or whole entry,
    /// see `verified.rs`), so an engine digest is dropped unused.
    pub(crate) fn range_verified(r: BlobReader, tier: Tier) -> Self {
        let r = r.into_stream();
        Blob {
            len: r.len,
            tier,
            reader: r.reader,
            verify: None,
            range_checked: true,
            whole: None,
            chunks: None,
            chunk_buf: BytesMut::new(),
        }
    }

    /// A read passed through as the engine yields it, unchecked: only for
    /// quarantine, which saves the bytes of an entry known to be corrupt.
    pub(crate) fn unverified(r: BlobReader, tier: Tier) -> Self {
        Blob {
            range_checked: false,
            ..Self::range_verified(r, tier)
        }
    }

    /// Number of bytes this read yields.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the read yields no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tier the entry was read from.
    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Whether the bytes are checked against the digest: whole reads at
    /// EOF, range reads group by group before each group's bytes are
    /// yielded. Always true for reads from [`Store`](crate::Store).
    pub fn is_verified(&self) -> bool {
        self.verify.is_some() || self.range_checked
    }

    /// Reads everything into memory (verifying when [`Blob::is_verified`]).
    ///
    /// An entry the engine holds in memory is hashed in place and returned
    /// without a copy; so is one an engine streams as owned chunks when it
    /// sends it as one buffer, told that the chunks are kept
    /// (`Chunks::collect`, ADR-084); a large one the facade verifies is
    /// hashed in one pass on several cores once read (no byte leaves
    /// before the verdict anyway).
    pub async fn bytes(mut self) -> Result<Bytes> {
        if let Some(chunks) = self.chunks.as_ref().filter(|_| self.gathers_chunks()) {
            // Told before the first chunk is read, the engine may send the
            // whole read as one buffer, kept here without a copy.
            chunks.collect();
            let mut all = Gather::new(self.len);
            while let Some(chunk) = self.next_chunk().await.map_err(Error::from)? {
                all.push(chunk);
            }
            return Ok(all.finish());
        }
        let Blob {
            reader,
            verify,
            len,
            whole,
            ..
        } = &mut self;
        if let Some(v) = verify
            .as_mut()
            .filter(|v| !v.finished && v.seen == 0 && matches!(v.check, Check::Engine { .. }))
        {
            // Bytes the engine read and hashed in one go: await its digest
            // (already sent) and hand its buffer on without a copy.
            if let Some(bytes) = whole.take() {
                v.seen = bytes.len() as u64;
                let len = *len;
                std::future::poll_fn(|cx| v.poll_engine_digest(cx, len))
                    .await
                    .map_err(Error::from)?;
                return Ok(bytes);
            }
        }
        let hashed_here = verify
            .as_mut()
            .filter(|v| !v.finished && v.seen == 0 && matches!(v.check, Check::Here(_)));
        if let Some(v) = hashed_here {
            // The engine's own buffer: no copy.
            if let Some(bytes) = whole.take() {
                v.seen = bytes.len() as u64;
                v.verdict(*len, digest_of(&bytes)).map_err(Error::from)?;
                return Ok(bytes);
            }
            if *len >= PARALLEL_HASH_MIN {
                let mut buf =
                    BytesMut::with_capacity(((*len).min(64 << 20) as usize).saturating_add(1));
                loop {
                    let n = reader.read_buf(&mut buf).await.map_err(Error::from)?;
                    if n == 0 || buf.len() as u64 > *len {
                        break;
                    }
                }
                v.seen = buf.len() as u64;
                v.verdict(*len, digest_of(&buf)).map_err(Error::from)?;
                return Ok(buf.freeze());
            }
        }
        // One byte of headroom: the final read that observes EOF (and runs
        // the verification) must not force the buffer to grow and copy.
        let mut buf = BytesMut::with_capacity((self.len.min(64 << 20) as usize).saturating_add(1));
        loop {
            let n = self.read_buf(&mut buf).await.map_err(Error::from)?;
            if n == 0 {
                return Ok(buf.freeze());
            }
        }
    }
}

impl Blob {
    /// Whether [`Blob::bytes`] gathers the engine's owned chunks as they
    /// are: unless a large read is hashed here, which is faster read whole
    /// first and hashed on every core.
    fn gathers_chunks(&self) -> bool {
        !self.verify.as_ref().is_some_and(|v| {
            matches!(v.check, Check::Here(_)) && v.seen == 0 && self.len >= PARALLEL_HASH_MIN
        })
    }

    /// The next chunk of the read; `None` at the end.
    ///
    /// When the engine reads ahead into owned buffers
    /// ([`BlobReader::Chunks`]: the local and object-storage engines' whole
    /// reads) they are handed on without a copy; an entry the engine holds
    /// in memory comes as one chunk, verified first, when the engine hashed
    /// it or it is shorter than 4 MiB; any other read is copied out of the
    /// reader in chunks of up to [`CHUNK_SIZE`] bytes (TUNING.md §response-chunks).
    ///
    /// Verified like the [`AsyncRead`] view: the bytes are hashed (or
    /// counted against the engine's digest) as they pass, and the call
    /// after the last chunk — the one that would answer `None` — fails with
    /// [`Error::Verification`] (inside the `io::Error`; convert it back with
    /// `Error::from`) if they do not hash to the digest. A consumer that
    /// must never forward a bad byte holds the last chunk (the one that
    /// brings the count to [`Blob::len`]) back until the next call
    /// succeeds, as the HTTP response body does. The two views read from
    /// one position and may be mixed.
    ///
    /// An engine's read-ahead may keep only a few chunks alive at once
    /// (the local engine: two of 64 KiB, ADR-057): a consumer gets the
    /// next chunk only after it has dropped (or forwarded and the sink
    /// has dropped) the earlier ones, so one that collects chunks without
    /// letting go of them waits forever — copy them instead.
    ///
    /// Cancel-safe: a chunk is consumed only when it is returned.
    pub async fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_next_chunk(cx)).await
    }

    /// [`Blob::next_chunk`] as a poll function.
    pub fn poll_next_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        let len = self.len;
        if let (Some(v), Some(whole)) = (
            self.verify.as_mut().filter(|v| !v.finished && v.seen == 0),
            &self.whole,
        ) {
            // In memory: the verdict first, then all of it at once — when
            // the engine hashed it, or when hashing it here in one poll is
            // short (below PARALLEL_HASH_MIN); a larger entry hashed here is
            // copied out below, 128 KiB per poll, as the byte view reads it.
            let verdict = match &mut v.check {
                Check::Here(_) if whole.len() as u64 >= PARALLEL_HASH_MIN => None,
                Check::Here(_) => {
                    v.seen = whole.len() as u64;
                    let actual = digest_of(whole);
                    Some(v.verdict(len, actual))
                }
                Check::Engine { .. } => {
                    v.seen = whole.len() as u64;
                    match v.poll_engine_digest(cx, len) {
                        Poll::Ready(verdict) => Some(verdict),
                        Poll::Pending => {
                            // Nothing consumed: the next poll starts over.
                            v.seen = 0;
                            return Poll::Pending;
                        }
                    }
                }
            };
            if let Some(verdict) = verdict {
                // The reader yields the same bytes: it must not yield them
                // again, after a pass or (unverified) after a failure.
                self.reader = Box::pin(tokio::io::empty());
                let whole = self.whole.take().unwrap_or_default();
                verdict?;
                return Poll::Ready(Ok((!whole.is_empty()).then_some(whole)));
            }
        }
        if let Some(chunks) = &self.chunks {
            let Some(v) = self.verify.as_mut().filter(|v| !v.finished) else {
                return chunks.poll_chunk(cx);
            };
            if let Check::Engine { at_eof: true, .. } = v.check {
                return v.poll_engine_digest(cx, len).map_ok(|()| None);
            }
            return Poll::Ready(match ready!(chunks.poll_chunk(cx))? {
                Some(chunk) => v.saw(&chunk, len).map(|()| Some(chunk)),
                None => return v.poll_at_eof(cx, len).map_ok(|()| None),
            });
        }
        if self.chunk_buf.capacity() == 0 {
            // A fresh buffer only once the last one is used up (as
            // `ReaderStream` does): a reader that yields a verified range
            // 16 KiB group at a time fills one 128 KiB buffer with 8
            // chunks instead of pinning a new buffer per chunk.
            self.chunk_buf.reserve(CHUNK_SIZE);
        }
        let mut buf = std::mem::take(&mut self.chunk_buf);
        let got = tokio_util::io::poll_read_buf(Pin::new(&mut *self), cx, &mut buf);
        let chunk = buf.split();
        self.chunk_buf = buf;
        match ready!(got)? {
            0 => Poll::Ready(Ok(None)),
            _ => Poll::Ready(Ok(Some(chunk.freeze()))),
        }
    }
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blob")
            .field("len", &self.len)
            .field("tier", &self.tier)
            .field("verified", &self.is_verified())
            .finish()
    }
}

impl Verifier {
    /// The verdict once every byte has been seen and `actual` is the
    /// digest of all of them.
    fn verdict(&mut self, len: u64, actual: Digest) -> io::Result<()> {
        self.finished = true;
        if actual != self.expected || self.seen != len {
            return Err(Error::Verification {
                expected: self.expected,
                actual,
            }
            .into());
        }
        Ok(())
    }

    /// After EOF on an engine-hashed read: awaits the engine's digest.
    fn poll_engine_digest(&mut self, cx: &mut Context<'_>, len: u64) -> Poll<io::Result<()>> {
        let Check::Engine { digest, .. } = &mut self.check else {
            unreachable!("only engine-hashed reads await a digest");
        };
        let got = ready!(digest.poll(cx));
        Poll::Ready(match got {
            Ok(actual) => self.verdict(len, actual),
            Err(_) => {
                self.finished = true;
                Err(
                    Error::io(store_types::ErrorKind::InvalidData, "verify read")
                        .with_source("the engine ended the read without the digest of its bytes")
                        .into(),
                )
            }
        })
    }
}

/// An engine's digest of the bytes it yields: already there (bytes it
/// read and hashed in one go: no channel to allocate), or sent once it
/// has produced the last byte.
enum EngineDigest {
    Known(Digest),
    Later(oneshot::Receiver<Digest>),
}

impl EngineDigest {
    /// The digest once it is there; `Err` if the engine dropped its sender
    /// without sending one.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<Digest, oneshot::error::RecvError>> {
        match self {
            EngineDigest::Known(d) => Poll::Ready(Ok(*d)),
            EngineDigest::Later(rx) => Pin::new(rx).poll(cx),
        }
    }
}

/// The hasher of a [`Check::Here`], made on first use.
fn hasher_of(h: &mut Option<Box<blake3::Hasher>>) -> &mut blake3::Hasher {
    h.get_or_insert_with(|| Box::new(blake3::Hasher::new()))
}

impl Verifier {
    /// After EOF: the verdict on every byte seen (hashed here, or the
    /// engine's digest awaited).
    fn poll_at_eof(&mut self, cx: &mut Context<'_>, len: u64) -> Poll<io::Result<()>> {
        match &mut self.check {
            Check::Here(hasher) => {
                let actual = Digest::from(hasher_of(hasher).finalize());
                Poll::Ready(self.verdict(len, actual))
            }
            Check::Engine { digest, .. } if self.seen < len => {
                // Ended short: the engine sends its digest only after its
                // last byte, which may wait for this reader to let go of
                // the chunks it holds (a live-chunk budget, ADR-057), so
                // it is taken if already sent but never awaited.
                if let Poll::Ready(Ok(actual)) = digest.poll(cx) {
                    return Poll::Ready(self.verdict(len, actual));
                }
                self.finished = true;
                Poll::Ready(Err(Error::io(
                    store_types::ErrorKind::InvalidData,
                    "verify read",
                )
                .with_source(format!(
                    "the read ended after {} of the {len} bytes declared",
                    self.seen
                ))
                .into()))
            }
            Check::Engine { at_eof, .. } => {
                *at_eof = true;
                self.poll_engine_digest(cx, len)
            }
        }
    }

    /// Takes in bytes the read yields (not EOF): hashes them here or
    /// counts them, failing the read once they exceed `len`.
    fn saw(&mut self, fresh: &[u8], len: u64) -> io::Result<()> {
        self.seen += fresh.len() as u64;
        match &mut self.check {
            Check::Here(hasher) => {
                let hasher = hasher_of(hasher);
                hasher.update(fresh);
                if self.seen > len {
                    let actual = Digest::from(hasher.finalize());
                    return self.verdict(len, actual);
                }
            }
            Check::Engine { .. } if self.seen > len => {
                // The engine yields more than it declared: its digest (sent
                // only after its last byte) cannot be awaited here, and the
                // facade did not hash, so there is no digest to report.
                self.finished = true;
                return Err(
                    Error::io(store_types::ErrorKind::InvalidData, "verify read")
                        .with_source(format!(
                            "the engine yielded more than the {len} bytes it declared"
                        ))
                        .into(),
                );
            }
            Check::Engine { .. } => {}
        }
        Ok(())
    }
}

impl AsyncRead for Blob {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(v) = this.verify.as_mut().filter(|v| !v.finished) else {
            return this.reader.as_mut().poll_read(cx, buf);
        };
        if let Check::Engine { at_eof: true, .. } = v.check {
            return v.poll_engine_digest(cx, this.len);
        }
        if buf.remaining() == 0 {
            // Nothing can be read into a full buffer; that is no EOF.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(this.reader.as_mut().poll_read(cx, buf))?;
        let fresh = &buf.filled()[before..];
        if fresh.is_empty() {
            // EOF: every byte has been seen.
            return v.poll_at_eof(cx, this.len);
        }
        Poll::Ready(v.saw(fresh, this.len))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A reader yielding `bytes` with an engine digest on `rx`.
    fn engine_reader(bytes: &'static [u8], rx: oneshot::Receiver<Digest>) -> BlobReader {
        declared(bytes, rx, bytes.len() as u64)
    }

    /// [`engine_reader`] declaring `len` bytes, whatever it yields.
    fn declared(bytes: &'static [u8], rx: oneshot::Receiver<Digest>, len: u64) -> BlobReader {
        BlobReader::Stream {
            len,
            reader: Box::pin(std::io::Cursor::new(bytes)),
            digest: Some(rx),
        }
    }

    fn verified(r: BlobReader, expected: Digest) -> Blob {
        Blob::verified(r, Tier::Large, expected)
    }

    #[tokio::test]
    async fn a_matching_engine_digest_passes_without_hashing_here() {
        let (tx, rx) = oneshot::channel();
        let expected = Digest::of(b"the content");
        tx.send(expected).unwrap();
        // The bytes do not hash to `expected`: a pass shows the facade
        // relied on the engine's digest instead of hashing.
        let blob = verified(engine_reader(b"other bytes", rx), expected);
        assert!(blob.is_verified());
        assert_eq!(
            blob.bytes().await.unwrap(),
            Bytes::from_static(b"other bytes")
        );
    }

    #[tokio::test]
    async fn a_digest_sent_after_eof_is_awaited() {
        let (tx, rx) = oneshot::channel();
        let data = b"late digest";
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send(Digest::of(data)).unwrap();
        });
        let blob = verified(engine_reader(data, rx), Digest::of(data));
        assert_eq!(blob.bytes().await.unwrap(), Bytes::from_static(data));
        sender.await.unwrap();
    }

    /// A read that ends before its declared length fails at once: the
    /// engine would send its digest only after the last byte (and may be
    /// waiting for this reader to drop chunks first), so awaiting it could
    /// hang. The sender stays alive and silent here; before this rule the
    /// read never ended (a fault layer truncating a local read hung).
    #[tokio::test]
    async fn an_engine_hashed_read_that_ends_short_fails_without_awaiting_the_digest() {
        let (_tx, rx) = oneshot::channel();
        let data = b"the first bytes";
        let blob = verified(declared(data, rx, 1000), Digest::of(b"x"));
        let read = tokio::time::timeout(Duration::from_secs(30), blob.bytes()).await;
        let err = read.expect("the short read ends").unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn a_mismatching_engine_digest_fails_at_eof() {
        let (tx, rx) = oneshot::channel();
        let data = b"stored bytes";
        let expected = Digest::of(b"what the key says");
        tx.send(Digest::of(data)).unwrap();
        let mut blob = verified(engine_reader(data, rx), expected);
        // Every byte is delivered; the failure comes with EOF.
        let mut buf = [0u8; 64];
        let n = blob.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], data);
        let err = Error::from(blob.read(&mut buf).await.unwrap_err());
        assert_eq!(
            err,
            Error::Verification {
                expected,
                actual: Digest::of(data)
            }
        );
        // The verdict is final; later reads see the reader's EOF.
        assert_eq!(blob.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_dropped_digest_sender_fails_with_io() {
        let (tx, rx) = oneshot::channel::<Digest>();
        drop(tx);
        let data = b"no digest";
        let err = verified(engine_reader(data, rx), Digest::of(data))
            .bytes()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
    }

    #[tokio::test]
    async fn a_short_read_fails_even_with_a_matching_engine_digest() {
        let (tx, rx) = oneshot::channel();
        let data = b"declared longer";
        tx.send(Digest::of(data)).unwrap();
        let r = declared(data, rx, data.len() as u64 + 1);
        let err = verified(r, Digest::of(data)).bytes().await.unwrap_err();
        assert_eq!(
            err,
            Error::Verification {
                expected: Digest::of(data),
                actual: Digest::of(data)
            }
        );
    }

    #[tokio::test]
    async fn yielding_more_than_declared_fails_at_once() {
        let (tx, rx) = oneshot::channel();
        let data = b"declared shorter";
        tx.send(Digest::of(data)).unwrap();
        let r = declared(data, rx, data.len() as u64 - 1);
        let err = verified(r, Digest::of(data)).bytes().await.unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
    }

    /// An engine's in-memory bytes are hashed in place (on several cores
    /// when large) and returned without a copy; wrong ones fail, small or
    /// large (their length is the bytes', by type).
    #[tokio::test]
    async fn in_memory_bytes_are_verified_in_place() {
        for n in [10usize, 3 << 20] {
            let data = Bytes::from((0..n).map(|i| (i % 251) as u8).collect::<Vec<_>>());
            let got = verified(BlobReader::from_bytes(data.clone()), Digest::of(&data))
                .bytes()
                .await
                .unwrap();
            assert_eq!(got, data);
            assert_eq!(got.as_ptr(), data.as_ptr(), "{n} bytes: no copy");
            let wrong = Digest::of(b"other");
            let err = verified(BlobReader::from_bytes(data.clone()), wrong)
                .bytes()
                .await
                .unwrap_err();
            assert!(matches!(err, Error::Verification { .. }), "{err:?}");
        }
    }

    /// Bytes an engine read and hashed in one go ([`BlobReader::hashed_bytes`])
    /// are judged by the engine's digest, not hashed again, and returned
    /// without a copy; a digest that is not the key's fails.
    #[tokio::test]
    async fn engine_hashed_bytes_are_taken_as_they_are() {
        let data = Bytes::from_static(b"hashed by the engine");
        let expected = Digest::of(&data);
        // The engine's digest is `expected` while the bytes hash to
        // something else: a pass shows no hashing happened here.
        let other = Bytes::from_static(b"bytes the engine hashed");
        let got = verified(BlobReader::hashed_bytes(other.clone(), expected), expected)
            .bytes()
            .await
            .unwrap();
        assert_eq!(got.as_ptr(), other.as_ptr(), "no copy");
        // A key whose digest is not the engine's: whole, and streamed.
        let for_other_key = || {
            verified(
                BlobReader::hashed_bytes(data.clone(), expected),
                Digest::of(b"key"),
            )
        };
        let err = for_other_key().bytes().await.unwrap_err();
        assert_eq!(
            err,
            Error::Verification {
                expected: Digest::of(b"key"),
                actual: expected
            }
        );
        let err = Error::from(
            for_other_key()
                .read_to_end(&mut Vec::new())
                .await
                .unwrap_err(),
        );
        assert!(matches!(err, Error::Verification { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn without_an_engine_digest_the_bytes_are_hashed_here() {
        let data = Bytes::from_static(b"hashed by the facade");
        let ok = verified(BlobReader::from_bytes(data.clone()), Digest::of(&data));
        assert_eq!(ok.bytes().await.unwrap(), data);
        let wrong = Digest::of(b"something else");
        let err = verified(BlobReader::from_bytes(data.clone()), wrong)
            .bytes()
            .await
            .unwrap_err();
        assert_eq!(
            err,
            Error::Verification {
                expected: wrong,
                actual: Digest::of(&data)
            }
        );
    }

    #[tokio::test]
    async fn unverified_reads_ignore_an_engine_digest() {
        let (tx, rx) = oneshot::channel::<Digest>();
        drop(tx);
        let blob = Blob::unverified(engine_reader(b"a range", rx), Tier::Large);
        assert!(!blob.is_verified());
        assert_eq!(blob.bytes().await.unwrap(), Bytes::from_static(b"a range"));
    }

    /// A read of `parts` sent as owned chunks, with an engine digest.
    fn chunked(parts: &[&'static [u8]], digest: Digest) -> (BlobReader, Vec<Bytes>) {
        let sent: Vec<Bytes> = parts.iter().map(|p| Bytes::from_static(p)).collect();
        let (tx, rx) = tokio::sync::mpsc::channel(parts.len());
        for b in &sent {
            tx.try_send(Ok(b.clone())).unwrap();
        }
        let (dtx, drx) = oneshot::channel();
        dtx.send(digest).unwrap();
        let len = sent.iter().map(|b| b.len() as u64).sum();
        (BlobReader::from_chunks(len, rx, Some(drx)), sent)
    }

    #[tokio::test]
    async fn next_chunk_hands_on_the_engines_chunks_without_a_copy() {
        let (r, sent) = chunked(&[b"abc", b"def"], Digest::of(b"abcdef"));
        let mut blob = verified(r, Digest::of(b"abcdef"));
        for want in &sent {
            let got = blob.next_chunk().await.unwrap().unwrap();
            assert_eq!(got, want);
            assert_eq!(got.as_ptr(), want.as_ptr(), "the very buffer, not a copy");
        }
        assert!(blob.next_chunk().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn next_chunk_fails_the_call_after_the_last_chunk_on_a_bad_digest() {
        let (r, _) = chunked(&[b"abc", b"def"], Digest::of(b"other"));
        let mut blob = verified(r, Digest::of(b"abcdef"));
        assert!(blob.next_chunk().await.unwrap().is_some());
        assert!(blob.next_chunk().await.unwrap().is_some());
        let err = Error::from(blob.next_chunk().await.unwrap_err());
        assert!(matches!(err, Error::Verification { .. }), "{err:?}");
    }

    #[tokio::test]
    async fn next_chunk_verifies_an_in_memory_entry_before_any_byte() {
        let good = Bytes::from_static(b"the content");
        let mut blob = verified(BlobReader::from_bytes(good.clone()), Digest::of(&good));
        assert_eq!(blob.next_chunk().await.unwrap().unwrap(), good);
        assert!(blob.next_chunk().await.unwrap().is_none());

        let bad = BlobReader::from_bytes(Bytes::from_static(b"other bytes"));
        let mut blob = verified(bad, Digest::of(&good));
        let err = Error::from(blob.next_chunk().await.unwrap_err());
        assert!(matches!(err, Error::Verification { .. }), "{err:?}");
        // Nothing unverified comes out afterwards, from either view.
        assert!(blob.next_chunk().await.unwrap().is_none());
        let mut rest = Vec::new();
        blob.read_to_end(&mut rest).await.unwrap();
        assert!(rest.is_empty());
    }

    #[tokio::test]
    async fn next_chunk_copies_out_of_a_reader_without_chunks() {
        // A wrapped reader (as a layer's): no in-memory bytes, no chunks.
        let (tx, rx) = oneshot::channel();
        tx.send(Digest::of(b"streamed")).unwrap();
        let r = engine_reader(b"streamed", rx);
        let mut blob = verified(r, Digest::of(b"streamed"));
        assert_eq!(blob.next_chunk().await.unwrap().unwrap(), &b"streamed"[..]);
        assert!(blob.next_chunk().await.unwrap().is_none());
    }

    /// Yields its bytes 16 KiB per read, as a verified range read does.
    struct GroupAtATime(Bytes);

    impl AsyncRead for GroupAtATime {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let n = self.0.len().min(16 << 10).min(buf.remaining());
            buf.put_slice(&self.0.split_to(n));
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn next_chunk_copies_small_reads_into_one_buffer() {
        let data = Bytes::from(vec![5u8; 64 << 10]);
        let r = BlobReader::stream(data.len() as u64, GroupAtATime(data));
        let mut blob = Blob::range_verified(r, Tier::Large);
        let a = blob.next_chunk().await.unwrap().unwrap();
        let b = blob.next_chunk().await.unwrap().unwrap();
        assert_eq!((a.len(), b.len()), (16 << 10, 16 << 10));
        // Held chunks do not make every next one allocate a fresh buffer.
        assert_eq!(b.as_ptr() as usize, a.as_ptr() as usize + a.len());
    }
}
