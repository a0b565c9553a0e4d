//! What an engine read answers: [`BlobReader`] (the bytes, as one of three
//! body kinds), [`ReadOptions`] (what to read) and [`SizedRead`] (the
//! entry's size and the span read).

use std::fmt;
use std::ops::Range;
use std::pin::Pin;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::oneshot;

use crate::{Chunks, Digest};

/// A streaming read of (part of) an entry, as one of three body kinds.
/// Engines return raw bytes; the facade adds verification.
///
/// The kind says how the bytes may be taken without a copy, so the rules
/// that once lived in prose are the type's:
///
/// - [`BlobReader::Bytes`]: the engine holds the bytes in memory (a `Bytes`
///   handle); a whole verified read hashes them in place. An engine digest,
///   if any, is there up front.
/// - [`BlobReader::Chunks`]: owned chunks from a read-ahead task or a
///   producer the consumer's polls drive ([`BlobReader::from_pull`]); an
///   HTTP response body forwards them without copying (TUNING.md
///   §response-chunks). A producer told that its consumer keeps every
///   byte may yield the whole read as one chunk.
/// - [`BlobReader::Stream`]: any other `AsyncRead`. A reader that wraps
///   another one to observe or change its bytes (a layer's hook) is always
///   a `Stream` ([`BlobReader::wrap`]), so no view can bypass it.
///
/// # The engine digest
///
/// `digest`, when present, is the BLAKE3 digest of **exactly** the bytes
/// the body yields, in order, computed by the engine as it produced them
/// (as it reads them, ahead of the consumer or in its polls). It arrives
/// once the engine has produced the last byte (possibly before the
/// consumer reads EOF). On a verified whole read the facade then does not
/// hash: it counts the bytes, awaits the digest after EOF and compares it
/// with the key's digest; a
/// mismatch, or a byte count other than the length, fails the read with
/// [`Error::Verification`](crate::Error::Verification). A sender dropped
/// without sending (the engine stopped early) fails the read with
/// [`Error::Io`](crate::Error::Io) unless the body already failed. `None`:
/// the facade hashes every byte itself. Ranged reads are verified by the
/// facade with the entry's outboard (ADR-032); engines need not hash them.
pub enum BlobReader {
    /// Bytes in memory.
    Bytes {
        /// The bytes.
        bytes: Bytes,
        /// Their BLAKE3 digest, when the engine already has it.
        digest: Option<Digest>,
    },
    /// Owned chunks from a read-ahead task or a pulled producer.
    Chunks {
        /// Number of bytes the chunks add up to.
        len: u64,
        /// The chunks (also readable as bytes: [`Chunks::reader`]).
        chunks: Chunks,
        /// The engine's digest of the yielded bytes, when it hashes.
        digest: Option<oneshot::Receiver<Digest>>,
    },
    /// Any other stream of bytes.
    Stream {
        /// Number of bytes the reader yields.
        len: u64,
        /// The bytes.
        reader: Pin<Box<dyn AsyncRead + Send>>,
        /// The engine's digest of the yielded bytes, when it hashes.
        digest: Option<oneshot::Receiver<Digest>>,
    },
}

/// A `BlobReader` taken apart into one byte stream: what a consumer that
/// does not take views needs.
pub struct StreamParts {
    /// Number of bytes `reader` yields.
    pub len: u64,
    /// The bytes.
    pub reader: Pin<Box<dyn AsyncRead + Send>>,
    /// The engine's digest of them, if it hashed ([`BlobReader`]).
    pub digest: Option<oneshot::Receiver<Digest>>,
}

impl BlobReader {
    /// Bytes in memory, not hashed by the engine.
    pub fn from_bytes(bytes: Bytes) -> Self {
        BlobReader::Bytes {
            bytes,
            digest: None,
        }
    }

    /// Bytes in memory that the engine has already hashed: `digest` must be
    /// the BLAKE3 digest of exactly `bytes`. A verified read then does not
    /// hash them again.
    pub fn hashed_bytes(bytes: Bytes, digest: Digest) -> Self {
        BlobReader::Bytes {
            bytes,
            digest: Some(digest),
        }
    }

    /// A read of `len` bytes arriving as owned chunks on `rx` (an `Err`
    /// item ends the read with it; a channel closed early ends it with
    /// `UnexpectedEof`).
    pub fn from_chunks(
        len: u64,
        rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
        digest: Option<oneshot::Receiver<Digest>>,
    ) -> Self {
        BlobReader::Chunks {
            len,
            chunks: Chunks::new(len, rx),
            digest,
        }
    }

    /// A read of `len` bytes that `pull` produces in the consumer's task,
    /// chunk by chunk as it is polled ([`Chunks::pulled`], ADR-085); a
    /// consumer that keeps every byte ([`Chunks::collect`]) tells it so
    /// first, and may then get them as one buffer.
    pub fn from_pull(
        len: u64,
        pull: Box<dyn crate::chunks::Pull>,
        digest: Option<oneshot::Receiver<Digest>>,
    ) -> Self {
        BlobReader::Chunks {
            len,
            chunks: Chunks::pulled(len, pull),
            digest,
        }
    }

    /// A stream of `len` bytes the engine does not hash.
    pub fn stream(len: u64, reader: impl AsyncRead + Send + 'static) -> Self {
        BlobReader::Stream {
            len,
            reader: Box::pin(reader),
            digest: None,
        }
    }

    /// Number of bytes the body yields.
    pub fn len(&self) -> u64 {
        match self {
            BlobReader::Bytes { bytes, .. } => bytes.len() as u64,
            BlobReader::Chunks { len, .. } | BlobReader::Stream { len, .. } => *len,
        }
    }

    /// Whether the body yields no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the engine supplies a digest of the bytes.
    pub fn has_digest(&self) -> bool {
        match self {
            BlobReader::Bytes { digest, .. } => digest.is_some(),
            BlobReader::Chunks { digest, .. } | BlobReader::Stream { digest, .. } => {
                digest.is_some()
            }
        }
    }

    /// The body as one byte stream (views given up), with its length and
    /// the engine's digest. An up-front digest of in-memory bytes is sent
    /// on a fresh channel.
    pub fn into_stream(self) -> StreamParts {
        match self {
            BlobReader::Bytes { bytes, digest } => StreamParts {
                len: bytes.len() as u64,
                reader: Box::pin(std::io::Cursor::new(bytes)),
                digest: digest.map(ready_digest),
            },
            BlobReader::Chunks {
                len,
                chunks,
                digest,
            } => StreamParts {
                len,
                reader: Box::pin(chunks.reader()),
                digest,
            },
            BlobReader::Stream {
                len,
                reader,
                digest,
            } => StreamParts {
                len,
                reader,
                digest,
            },
        }
    }

    /// The body's byte stream passed through `wrap` (a layer observing or
    /// changing the bytes): always a [`BlobReader::Stream`], so no view can
    /// bypass the wrapper. Length and engine digest are kept.
    pub fn wrap(
        self,
        wrap: impl FnOnce(Pin<Box<dyn AsyncRead + Send>>) -> Pin<Box<dyn AsyncRead + Send>>,
    ) -> Self {
        let parts = self.into_stream();
        BlobReader::Stream {
            len: parts.len,
            reader: wrap(parts.reader),
            digest: parts.digest,
        }
    }

    /// The bytes in memory: taken as they are from a [`BlobReader::Bytes`],
    /// else read to the end or to `limit` bytes, whichever comes first (a
    /// caller that must tell a longer body apart asks for one byte more
    /// than it expects). Raw: nothing verified.
    ///
    /// Cancel-safe in the sense that dropping it drops the read.
    pub async fn into_bytes(self, limit: u64) -> std::io::Result<Bytes> {
        let (len, chunks) = match self {
            BlobReader::Bytes { bytes, .. } => return Ok(bytes),
            BlobReader::Chunks { len, chunks, .. } if len <= limit => (len, chunks),
            other => return other.into_bytes_read(limit).await,
        };
        chunks.collect();
        let mut all = crate::chunks::Gather::new(len);
        while let Some(chunk) = chunks.next_chunk().await? {
            all.push(chunk);
        }
        Ok(all.finish())
    }

    /// [`BlobReader::into_bytes`] through the byte view.
    async fn into_bytes_read(self, limit: u64) -> std::io::Result<Bytes> {
        let parts = self.into_stream();
        let mut buf = Vec::with_capacity(parts.len.min(limit) as usize);
        parts.reader.take(limit).read_to_end(&mut buf).await?;
        Ok(Bytes::from(buf))
    }

    /// The part `offset..offset + len` of this body (raw, no digest):
    /// sliced in place from bytes in memory, else the stream with `offset`
    /// bytes read past first. `InvalidInput` unless the part is within
    /// [`BlobReader::len`].
    pub async fn slice(self, offset: u64, len: u64) -> std::io::Result<BlobReader> {
        let total = self.len();
        let end = offset.checked_add(len).filter(|e| *e <= total);
        let Some(end) = end else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{offset}+{len} is past the body's {total} bytes"),
            ));
        };
        if let BlobReader::Bytes { bytes, .. } = &self {
            return Ok(BlobReader::from_bytes(
                bytes.slice(offset as usize..end as usize),
            ));
        }
        let mut reader = self.into_stream().reader;
        let skipped =
            tokio::io::copy(&mut (&mut reader).take(offset), &mut tokio::io::sink()).await?;
        if skipped != offset {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(BlobReader::stream(len, reader.take(len)))
    }
}

/// A receiver that already holds `digest`.
fn ready_digest(digest: Digest) -> oneshot::Receiver<Digest> {
    let (tx, rx) = oneshot::channel();
    // The receiver is alive: it is returned.
    let _ = tx.send(digest);
    rx
}

impl fmt::Debug for BlobReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            BlobReader::Bytes { .. } => "bytes",
            BlobReader::Chunks { .. } => "chunks",
            BlobReader::Stream { .. } => "stream",
        };
        f.debug_struct("BlobReader")
            .field("kind", &kind)
            .field("len", &self.len())
            .field("digest", &self.has_digest())
            .finish()
    }
}

/// A verified range read as the facade asks for it: the bytes wanted, and
/// how to widen them to what verification needs once the entry's size is
/// known — the whole entry when it is at most [`RangeRequest::whole_max`]
/// bytes, else the 16 KiB chunk groups covering the range
/// ([`crate::outboard::covering_groups`], ADR-032).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRequest {
    /// The bytes the caller wants.
    pub range: Range<u64>,
    /// Entries of at most this many bytes are read whole (and verified
    /// whole by the facade).
    pub whole_max: u64,
}

impl RangeRequest {
    /// A request for `range`, reading entries of at most `whole_max`
    /// bytes whole.
    pub fn new(range: Range<u64>, whole_max: u64) -> Self {
        RangeRequest { range, whole_max }
    }

    /// Whether an entry of `size` bytes is read whole.
    pub fn reads_whole(&self, size: u64) -> bool {
        size <= self.whole_max
    }

    /// The bytes to read of an entry of `size` bytes: all of it when it is
    /// read whole, else the chunk groups covering the range.
    /// [`Error::InvalidRange`](crate::Error::InvalidRange) (naming `size`)
    /// unless `start <= end <= size`.
    pub fn span(&self, size: u64) -> crate::Result<Range<u64>> {
        let r = &self.range;
        if r.start > r.end || r.end > size {
            return Err(crate::Error::InvalidRange {
                start: r.start,
                end: r.end,
                size,
            });
        }
        if self.reads_whole(size) {
            return Ok(0..size);
        }
        Ok(crate::outboard::covering_groups(r, size))
    }
}

/// What [`Engine::read`](crate::Engine::read) reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// `None` (the default): the whole entry. `Some`: the request's span
    /// ([`RangeRequest::span`]) — the whole entry when it is small enough.
    pub range: Option<RangeRequest>,
    /// Read the storage itself, never an in-memory copy the engine may
    /// keep (the SQLite hot-entry cache, TUNING.md §sqlite-hot-cache):
    /// what `verify` and `quarantine` read, so they judge the stored bytes.
    pub from_storage: bool,
}

/// How an engine answers one [`ReadOptions`] for an entry of a known size
/// ([`ReadOptions::plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReadPlan {
    /// Read the whole entry (its whole-read path; it may hash).
    Whole,
    /// Read exactly this span (its range path; it need not hash).
    Span(Range<u64>),
}

impl ReadOptions {
    /// The whole entry.
    pub fn whole() -> Self {
        ReadOptions::default()
    }

    /// The whole entry, from storage.
    pub fn stored() -> Self {
        ReadOptions {
            range: None,
            from_storage: true,
        }
    }

    /// The span of `request`.
    pub fn range(request: RangeRequest) -> Self {
        ReadOptions {
            range: Some(request),
            from_storage: false,
        }
    }

    /// Answers these options in two steps, for an engine whose whole-read
    /// and range paths are separate calls: a whole read is `whole()` alone
    /// (its length is the size); a ranged one sizes the entry with `size`
    /// (`None`: absent), plans, then calls `whole()` or `span(span)`. An
    /// entry deleted between the steps is absent.
    ///
    /// Cancel-safe when the steps are (they only read).
    pub async fn read_with<SF, W, WF, S, PF>(
        &self,
        size: SF,
        whole: W,
        span: S,
    ) -> crate::Result<Option<SizedRead>>
    where
        SF: std::future::Future<Output = crate::Result<Option<u64>>>,
        W: FnOnce() -> WF,
        WF: std::future::Future<Output = crate::Result<Option<BlobReader>>>,
        S: FnOnce(Range<u64>) -> PF,
        PF: std::future::Future<Output = crate::Result<Option<BlobReader>>>,
    {
        if self.range.is_none() {
            return Ok(whole().await?.map(SizedRead::whole));
        }
        let Some(size) = size.await? else {
            return Ok(None);
        };
        let plan = self.plan(size)?;
        let reader = match &plan {
            ReadPlan::Whole => whole().await?,
            ReadPlan::Span(s) => span(s.clone()).await?,
        };
        Ok(reader.map(|r| SizedRead::planned(size, plan, r)))
    }

    /// What to read of an entry of `size` bytes, checking the range
    /// ([`Error::InvalidRange`](crate::Error::InvalidRange) naming `size`).
    pub fn plan(&self, size: u64) -> crate::Result<ReadPlan> {
        match &self.range {
            None => Ok(ReadPlan::Whole),
            Some(request) => {
                let span = request.span(size)?;
                Ok(if request.reads_whole(size) {
                    ReadPlan::Whole
                } else {
                    ReadPlan::Span(span)
                })
            }
        }
    }
}

/// What [`Engine::read`](crate::Engine::read) answers: the entry's size,
/// the span read and its bytes.
#[derive(Debug)]
pub struct SizedRead {
    /// The entry's size in bytes.
    pub size: u64,
    /// The bytes `reader` yields: all of them (`0..size`) for a whole
    /// read, else the planned span.
    pub span: Range<u64>,
    /// The read of `span`.
    pub reader: BlobReader,
}

impl SizedRead {
    /// A whole read: its size is the reader's length.
    pub fn whole(reader: BlobReader) -> Self {
        let size = reader.len();
        SizedRead {
            size,
            span: 0..size,
            reader,
        }
    }

    /// `options` answered from an entry's bytes in memory: all of them, or
    /// the planned span sliced out (a handle clone either way).
    /// [`Error::InvalidRange`](crate::Error::InvalidRange) as
    /// [`ReadOptions::plan`].
    pub fn from_bytes(bytes: Bytes, options: &ReadOptions) -> crate::Result<Self> {
        Self::from_memory(bytes, None, options)
    }

    /// [`from_bytes`](Self::from_bytes) for bytes whose BLAKE3 digest the
    /// engine already has: a whole read carries it
    /// ([`BlobReader::hashed_bytes`]), so a verified read does not hash
    /// them again; a span does not (the facade verifies ranges itself).
    pub fn from_hashed_bytes(
        bytes: Bytes,
        digest: Digest,
        options: &ReadOptions,
    ) -> crate::Result<Self> {
        Self::from_memory(bytes, Some(digest), options)
    }

    fn from_memory(
        bytes: Bytes,
        digest: Option<Digest>,
        options: &ReadOptions,
    ) -> crate::Result<Self> {
        let size = bytes.len() as u64;
        let plan = options.plan(size)?;
        let reader = match &plan {
            ReadPlan::Whole => BlobReader::Bytes { bytes, digest },
            // Both bounds are <= size, which came from a usize.
            ReadPlan::Span(span) => {
                BlobReader::from_bytes(bytes.slice(span.start as usize..span.end as usize))
            }
        };
        Ok(SizedRead::planned(size, plan, reader))
    }

    /// A read that followed `plan` for an entry of `size` bytes.
    pub fn planned(size: u64, plan: ReadPlan, reader: BlobReader) -> Self {
        let span = match plan {
            ReadPlan::Whole => 0..size,
            ReadPlan::Span(span) => span,
        };
        SizedRead { size, span, reader }
    }
}
