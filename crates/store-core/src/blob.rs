use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use store_types::{BlobReader, Digest, Error, Result, Tier};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::sync::oneshot;

/// Buffers at least this large are hashed on several cores (rayon's pool
/// through the outboard builder). Below it the pool's hand-off costs what
/// it saves: measured on 2 cores, 1 MiB hashes at 4.4–5.3 GiB/s on the pool
/// against 5.0–5.8 single-threaded, 4 MiB at 7.5–7.8 (ADR-035).
pub(crate) const PARALLEL_HASH_MIN: u64 = 4 << 20;

/// The BLAKE3 digest of `bytes`, on several cores when they are large
/// enough ([`PARALLEL_HASH_MIN`]: the outboard builder's parallel groups;
/// its outboard is dropped).
pub(crate) fn digest_of(bytes: &[u8]) -> Digest {
    if (bytes.len() as u64) < PARALLEL_HASH_MIN {
        return Digest::of(bytes);
    }
    let mut builder = store_types::outboard::OutboardBuilder::new();
    builder.update(bytes);
    builder.finalize().0
}

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
/// ([`BlobReader::yielded_digest`], e.g. on its read-ahead thread), else
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
    /// ([`BlobReader::in_memory`]): [`Blob::bytes`] hashes and returns them
    /// without a copy.
    whole: Option<Bytes>,
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
    /// hasher's state is ~2 KB).
    Here(Box<blake3::Hasher>),
    /// The engine: its digest of the yielded bytes arrives on `digest`.
    /// `at_eof` is set once the reader reported EOF and only the digest
    /// is still awaited (the reader is not polled again).
    Engine {
        digest: oneshot::Receiver<Digest>,
        at_eof: bool,
    },
}

impl Blob {
    pub(crate) fn verified(r: BlobReader, tier: Tier, expected: Digest) -> Self {
        let check = match r.yielded_digest {
            Some(digest) => Check::Engine {
                digest,
                at_eof: false,
            },
            None => Check::Here(Box::new(blake3::Hasher::new())),
        };
        Blob {
            len: r.len,
            tier,
            reader: r.reader,
            verify: Some(Verifier {
                expected,
                seen: 0,
                finished: false,
                check,
            }),
            range_checked: false,
            whole: r.in_memory,
        }
    }

    /// Ranged reads: the reader verifies (by chunk group or whole entry,
    /// see `verified.rs`), so an engine digest is dropped unused.
    pub(crate) fn range_verified(r: BlobReader, tier: Tier) -> Self {
        Blob {
            len: r.len,
            tier,
            reader: r.reader,
            verify: None,
            range_checked: true,
            whole: None,
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
    /// without a copy; a large one the facade verifies is hashed in one
    /// pass on several cores once read (no byte leaves before the verdict
    /// anyway).
    pub async fn bytes(mut self) -> Result<Bytes> {
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
        let got = ready!(Pin::new(digest).poll(cx));
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
            return match &mut v.check {
                Check::Here(hasher) => {
                    let actual = Digest::from(hasher.finalize());
                    Poll::Ready(v.verdict(this.len, actual))
                }
                Check::Engine { at_eof, .. } => {
                    *at_eof = true;
                    v.poll_engine_digest(cx, this.len)
                }
            };
        }
        v.seen += fresh.len() as u64;
        match &mut v.check {
            Check::Here(hasher) => {
                hasher.update(fresh);
                if v.seen > this.len {
                    let actual = Digest::from(hasher.finalize());
                    return Poll::Ready(v.verdict(this.len, actual));
                }
            }
            Check::Engine { .. } if v.seen > this.len => {
                // The engine yields more than it declared: its digest (sent
                // only after its last byte) cannot be awaited here, and the
                // facade did not hash, so there is no digest to report.
                v.finished = true;
                return Poll::Ready(Err(Error::io(
                    store_types::ErrorKind::InvalidData,
                    "verify read",
                )
                .with_source(format!(
                    "the engine yielded more than the {} bytes it declared",
                    this.len
                ))
                .into()));
            }
            Check::Engine { .. } => {}
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A reader yielding `bytes` with an engine digest on `rx`.
    fn engine_reader(bytes: &'static [u8], rx: oneshot::Receiver<Digest>) -> BlobReader {
        BlobReader {
            yielded_digest: Some(rx),
            in_memory: None,
            ..BlobReader::from_bytes(Bytes::from_static(bytes))
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
        let r = BlobReader {
            len: data.len() as u64 + 1,
            ..engine_reader(data, rx)
        };
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
        let r = BlobReader {
            len: data.len() as u64 - 1,
            ..engine_reader(data, rx)
        };
        let err = verified(r, Digest::of(data)).bytes().await.unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
    }

    /// An engine's in-memory bytes are hashed in place (on several cores
    /// when large) and returned without a copy; wrong ones fail, small or
    /// large, and a declared length they do not have fails too.
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
            let r = BlobReader {
                len: n as u64 + 1,
                ..BlobReader::from_bytes(data.clone())
            };
            let err = verified(r, Digest::of(&data)).bytes().await.unwrap_err();
            assert!(matches!(err, Error::Verification { .. }), "{err:?}");
        }
    }

    /// Bytes an engine read and hashed in one go ([`BlobReader::hashed_bytes`])
    /// are judged by the engine's digest, not hashed again, and returned
    /// without a copy; a digest that is not the key's fails, and so does a
    /// declared length the bytes do not have.
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
        let r = BlobReader {
            len: data.len() as u64 + 1,
            ..BlobReader::hashed_bytes(data.clone(), expected)
        };
        let err = verified(r, expected).bytes().await.unwrap_err();
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
}
