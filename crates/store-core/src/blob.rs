use std::fmt;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use store_types::{BlobReader, Digest, Error, Result, Tier};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

/// A streaming read of an entry (or of a range of it).
///
/// Whole-entry reads from [`Store::get`](crate::Store::get) are verified:
/// the bytes are hashed as they stream and the read fails at EOF with
/// [`Error::Verification`] (inside the `io::Error`; convert it back with
/// `Error::from`) if they do not hash to the key's digest or the length is
/// wrong. Ranged reads cannot be checked against a whole-content digest and
/// are not verified ([`Blob::is_verified`]).
pub struct Blob {
    len: u64,
    tier: Tier,
    reader: Pin<Box<dyn AsyncRead + Send>>,
    verify: Option<Verifier>,
}

struct Verifier {
    expected: Digest,
    hasher: blake3::Hasher,
    seen: u64,
    finished: bool,
}

impl Blob {
    pub(crate) fn verified(r: BlobReader, tier: Tier, expected: Digest) -> Self {
        Blob {
            len: r.len,
            tier,
            reader: r.reader,
            verify: Some(Verifier {
                expected,
                hasher: blake3::Hasher::new(),
                seen: 0,
                finished: false,
            }),
        }
    }

    pub(crate) fn unverified(r: BlobReader, tier: Tier) -> Self {
        Blob {
            len: r.len,
            tier,
            reader: r.reader,
            verify: None,
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

    /// Whether the content is checked against the digest at EOF.
    pub fn is_verified(&self) -> bool {
        self.verify.is_some()
    }

    /// Reads everything into memory (verifying when [`Blob::is_verified`]).
    pub async fn bytes(mut self) -> Result<Bytes> {
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

impl AsyncRead for Blob {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match this.reader.as_mut().poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        let Some(v) = this.verify.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let fresh = &buf.filled()[before..];
        if v.finished {
            return Poll::Ready(Ok(()));
        }
        if fresh.is_empty() {
            v.finished = true;
            let actual = Digest::from(v.hasher.finalize());
            if actual != v.expected || v.seen != this.len {
                return Poll::Ready(Err(Error::Verification {
                    expected: v.expected,
                    actual,
                }
                .into()));
            }
            return Poll::Ready(Ok(()));
        }
        v.seen += fresh.len() as u64;
        v.hasher.update(fresh);
        if v.seen > this.len {
            v.finished = true;
            let actual = Digest::from(v.hasher.finalize());
            return Poll::Ready(Err(Error::Verification {
                expected: v.expected,
                actual,
            }
            .into()));
        }
        Poll::Ready(Ok(()))
    }
}
