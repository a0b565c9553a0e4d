//! Verified (bao) streams: an entry, or one byte range of it, in
//! [`bao-tree`](bao_tree)'s encoding, which a client checks against the
//! entry's digest as the bytes arrive (ADR-033).
//!
//! The encoding is bao-tree 0.17's pre-order response for a set of chunk
//! ranges, with the entry's outboard ([`store_types::outboard`]: 16 KiB
//! chunk groups): for every tree node on the way to the requested chunks,
//! its 64-byte pair of child hashes, then the chunk group's bytes (or, for a
//! group the range covers only in part, the 1 KiB chunks it covers with the
//! hashes inside the group). A client needs the entry's digest, its size and
//! the requested ranges to decode it ([`decode`] does, with bao-tree's
//! decoder); nothing else in the stream is trusted.
//!
//! - [`encode`] runs bao-tree's validating encoder
//!   ([`bao_tree::io::fsm::encode_ranges_validated`]) over a [`BaoSource`]
//!   and hands the encoding out as a stream of chunks. Memory stays bounded
//!   whatever the entry's size: the source reads the covering chunk groups
//!   forward from the store (one group at a time, each verified by
//!   `Store::read_range` before the encoder sees it), and the output goes
//!   through a channel of [`OUTPUT_CHANNEL`] chunks of at most
//!   [`OUTPUT_CHUNK`] bytes.
//! - [`decode`] turns a bao stream back into the verified bytes of the
//!   requested range, yielding each chunk group only once it hashed up to
//!   the digest.
//!
//! Nothing here knows about HTTP (the route is in `store-http`'s
//! `handlers.rs`, the store reads in [`crate::Ops::get_bao`]).
//!
//! # How a bao stream flows
//!
//! ```text
//! GET /v1/blobs/{ns}/{digest}, Accept: application/x-bao [, Range]
//!  └─ Ops::get_bao: stat → resolve the range (416 as for plain gets)
//!     ├─ size ≤ BAO_MEMORY_MAX: verified whole read → outboard::compute
//!     │  → memory source
//!     └─ larger: Store::outboard (validated, cached)
//!        → Store::read_range(covering groups) → SpanReader (first group read
//!          now: corrupt → 422 before any header)
//!     → encode: bao-tree's encode_ranges_validated over the source,
//!       into a channel of OUTPUT_CHANNEL × OUTPUT_CHUNK chunks → chunked
//!       200 body (an error mid-way: the chunks before it, then an aborted
//!       body)
//! CLI get: Accept bao → decode (bao-tree's ResponseDecoder over the
//!   body) → each verified group to the sink; a cut → one-byte bao probes
//! ```
//!
//! The names: [`crate::BAO_MEMORY_MAX`], [`SpanReader`], [`encode`],
//! [`OUTPUT_CHANNEL`], [`OUTPUT_CHUNK`], [`decode`].

use std::io;
use std::ops::Range;
use std::pin::Pin;

use bao_tree::io::fsm::{encode_ranges_validated, ResponseDecoder, ResponseDecoderNext};
use bao_tree::io::outboard::PostOrderMemOutboard;
use bao_tree::io::{BaoContentItem, DecodeError, EncodeError};
use bao_tree::{ChunkNum, ChunkRanges};
use bytes::{Bytes, BytesMut};
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use iroh_io::{AsyncSliceReader, AsyncStreamWriter, TokioStreamReader};
use store_types::outboard::{self, GroupHashes, GROUP_SIZE};
use store_types::{Digest, Error};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The media type of a bao stream (request it with `Accept`, recognise it
/// in `Content-Type`).
pub const BAO_MEDIA_TYPE: &str = "application/x-bao";

/// Largest chunk of encoded output handed to the transport at once.
pub const OUTPUT_CHUNK: usize = 64 * 1024;

/// Encoded chunks queued between the encoder and the transport. With
/// [`OUTPUT_CHUNK`] and one chunk group read ahead, a stream holds at most
/// ≈ 4 × 64 KiB + 32 KiB however large the entry.
pub const OUTPUT_CHANNEL: usize = 2;

/// A stream of encoded (or decoded) chunks; an `Err` item ends it.
pub type ChunkStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// bao-tree's chunk ranges covering the byte range `range`, rounded out to
/// whole 1 KiB chunks (what the encoder is asked for and the decoder
/// expects; [`decode`] trims the decoded chunks back to `range`).
pub fn chunk_ranges(range: &Range<u64>) -> ChunkRanges {
    ChunkRanges::from(ChunkNum::full_chunks(range.start)..ChunkNum::chunks(range.end))
}

/// The chunk ranges of a request: `None` (the whole entry) is
/// [`ChunkRanges::all`].
fn request_ranges(range: Option<&Range<u64>>) -> ChunkRanges {
    match range {
        None => ChunkRanges::all(),
        Some(r) => chunk_ranges(r),
    }
}

/// bao-tree's in-memory outboard over a validated [`GroupHashes`] (no
/// copy: the pairs are shared).
pub fn mem_outboard(hashes: &GroupHashes) -> PostOrderMemOutboard<Bytes> {
    PostOrderMemOutboard {
        root: blake3::Hash::from(*hashes.digest().as_bytes()),
        tree: outboard::tree(hashes.size()),
        data: hashes.outboard().clone(),
    }
}

/// bao-tree's in-memory outboard of `data`, computed here (the small-entry
/// path: `data` was read whole and verified). Fails with
/// [`Error::Verification`] when `data` does not hash to `digest`.
pub fn outboard_of(digest: Digest, data: &[u8]) -> Result<PostOrderMemOutboard<Bytes>, Error> {
    let (actual, pairs) = outboard::compute(data);
    if actual != digest {
        return Err(Error::Verification {
            expected: digest,
            actual,
        });
    }
    Ok(PostOrderMemOutboard {
        root: blake3::Hash::from(*digest.as_bytes()),
        tree: outboard::tree(data.len() as u64),
        data: pairs,
    })
}

/// Where [`encode`] reads the entry's bytes.
pub enum BaoSource {
    /// The whole entry, in memory (small entries).
    Memory(Bytes),
    /// A group-aligned span of the entry, read forward.
    Span(SpanReader),
}

impl std::fmt::Debug for BaoSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BaoSource::Memory(b) => f.debug_tuple("Memory").field(&b.len()).finish(),
            BaoSource::Span(s) => f.debug_tuple("Span").field(s).finish(),
        }
    }
}

impl AsyncSliceReader for BaoSource {
    async fn read_at(&mut self, offset: u64, len: usize) -> io::Result<Bytes> {
        match self {
            BaoSource::Memory(b) => b.read_at(offset, len).await,
            BaoSource::Span(s) => s.read_at(offset, len).await,
        }
    }

    async fn size(&mut self) -> io::Result<u64> {
        match self {
            BaoSource::Memory(b) => Ok(b.len() as u64),
            BaoSource::Span(s) => Ok(s.size),
        }
    }
}

/// The bytes `span` of an entry of `size` bytes, from a reader positioned
/// at `span.start` (a verified `Store::read_range` of exactly that span),
/// offered to the encoder as positioned reads.
///
/// The encoder reads chunk groups in increasing order, so reads must go
/// forward: a read before the current position fails; a read past the span
/// returns what the span has (nothing), which the encoder reports as a
/// missing group. At most one read's bytes (one group) are held.
pub struct SpanReader {
    reader: Pin<Box<dyn AsyncRead + Send>>,
    /// The entry offset of the reader's next byte.
    pos: u64,
    end: u64,
    size: u64,
    /// Bytes read ahead by [`SpanReader::prefetch`], starting at `pos`.
    ahead: Bytes,
}

impl std::fmt::Debug for SpanReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpanReader")
            .field("pos", &self.pos)
            .field("end", &self.end)
            .field("size", &self.size)
            .finish()
    }
}

impl SpanReader {
    /// Bytes `span` of an entry of `size` bytes, read from `reader`.
    pub fn new(reader: Pin<Box<dyn AsyncRead + Send>>, span: Range<u64>, size: u64) -> Self {
        SpanReader {
            reader,
            pos: span.start,
            end: span.end.min(size),
            size,
            ahead: Bytes::new(),
        }
    }

    /// Reads the span's first chunk group now, so that a failure there
    /// (a corrupt first group, an I/O error) is reported before a response
    /// is committed to. Fails with the read's error.
    ///
    /// Cancel safety: dropping the future mid-way leaves nothing behind
    /// outside this reader, but the bytes it had read are lost, so the
    /// reader must be dropped with it (a later read would be misplaced).
    /// [`crate::Ops::get_bao`] owns its reader and drops both together.
    pub async fn prefetch(&mut self) -> io::Result<()> {
        let want = (self.end - self.pos).min(GROUP_SIZE as u64) as usize;
        let got = read_up_to(self.reader.as_mut(), want).await?;
        self.ahead = got;
        Ok(())
    }

    async fn read_at(&mut self, offset: u64, len: usize) -> io::Result<Bytes> {
        if offset < self.pos {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bao source: read at offset {offset} after offset {} (reads go forward)",
                    self.pos
                ),
            ));
        }
        // Skip forward (the encoder never leaves gaps inside a span, but
        // the reader does not rely on it).
        while self.pos < offset.min(self.end) {
            let skip = (offset.min(self.end) - self.pos) as usize;
            let n = self.take(skip.min(GROUP_SIZE)).await?.len();
            if n == 0 {
                return Ok(Bytes::new());
            }
        }
        if offset >= self.end {
            return Ok(Bytes::new());
        }
        let want = len.min((self.end - offset) as usize);
        let mut out = BytesMut::with_capacity(want);
        while out.len() < want {
            let got = self.take(want - out.len()).await?;
            if got.is_empty() {
                break;
            }
            out.extend_from_slice(&got);
        }
        Ok(out.freeze())
    }

    /// At most `n` next bytes of the span (empty at its end).
    async fn take(&mut self, n: usize) -> io::Result<Bytes> {
        let got = if self.ahead.is_empty() {
            read_up_to(self.reader.as_mut(), n).await?
        } else {
            let k = n.min(self.ahead.len());
            self.ahead.split_to(k)
        };
        self.pos += got.len() as u64;
        Ok(got)
    }
}

/// Reads up to `n` bytes (fewer only at EOF).
async fn read_up_to(mut r: Pin<&mut (dyn AsyncRead + Send)>, n: usize) -> io::Result<Bytes> {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        let k = r.read(&mut buf[filled..]).await?;
        if k == 0 {
            break;
        }
        filled += k;
    }
    buf.truncate(filled);
    Ok(Bytes::from(buf))
}

/// The encoder's output: writes gathered into chunks of up to
/// [`OUTPUT_CHUNK`] bytes and sent down a bounded channel, which also
/// carries the encoder's error after the chunks it produced before it.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: BytesMut,
}

impl ChannelWriter {
    async fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.tx.send(Ok(chunk)).await.map_err(|_| gone())
    }

    /// Sends what is buffered, then `e` (the stream's last item).
    async fn fail(&mut self, e: io::Error) {
        // When the receiver is gone there is no one left to tell.
        if self.send().await.is_ok() {
            let _ = self.tx.send(Err(e)).await;
        }
    }
}

/// The body was dropped: the client went away.
fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, "bao stream: receiver gone")
}

impl AsyncStreamWriter for ChannelWriter {
    async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        // Chunks stay within OUTPUT_CHUNK (a single write is at most one
        // group and its inner pairs, well below it).
        if self.buf.len() + data.len() > OUTPUT_CHUNK {
            self.send().await?;
        }
        self.buf.extend_from_slice(data);
        if self.buf.len() >= OUTPUT_CHUNK {
            self.send().await?;
        }
        Ok(())
    }

    async fn write_bytes(&mut self, data: Bytes) -> io::Result<()> {
        self.write(&data).await
    }

    async fn sync(&mut self) -> io::Result<()> {
        self.send().await
    }
}

/// The `io::Error` of a failed encoding: the store's typed error when the
/// source failed (a verification failure stays one, see
/// [`Error::from_io`]), bao-tree's description otherwise.
fn encode_error(e: EncodeError) -> io::Error {
    match e {
        EncodeError::Io(e) => e,
        other => io::Error::from(other),
    }
}

/// The bao encoding of `ranges` of the entry whose outboard is `outboard`,
/// read from `source`, as a stream of chunks.
///
/// `source` must hold every chunk group the ranges touch (for
/// [`BaoSource::Span`]: the span `covering_groups` of the byte range). The
/// stream ends cleanly only when the whole encoding was produced; a failed
/// read or a group that does not match the outboard ends it with an `Err`
/// item (a transport must then abort the response, never end it cleanly).
///
/// The encoder runs inside the stream: dropping the stream stops it, with
/// nothing left behind.
pub fn encode(
    source: BaoSource,
    outboard: PostOrderMemOutboard<Bytes>,
    ranges: ChunkRanges,
) -> ChunkStream {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(OUTPUT_CHANNEL);
    let run = async move {
        let mut w = ChannelWriter {
            tx,
            buf: BytesMut::with_capacity(OUTPUT_CHUNK),
        };
        let done = match encode_ranges_validated(source, outboard, &ranges, &mut w).await {
            Ok(()) => w.send().await,
            Err(e) => Err(encode_error(e)),
        };
        if let Err(e) = done {
            w.fail(e).await;
        }
    };
    // The encoder runs as the stream is polled; the channel carries its
    // chunks (and its error, last) in order; the stream ends once the
    // encoder is done and the channel drained.
    let driver = futures::stream::once(run).filter_map(|()| futures::future::ready(None));
    Box::pin(futures::stream::select(rx, driver))
}

/// Encodes `range` (`None`: the whole entry) of `data`, an entry held in
/// memory whose digest is `digest`. Fails before producing anything when
/// `data` does not hash to `digest`.
pub fn encode_memory(
    digest: Digest,
    data: Bytes,
    range: Option<&Range<u64>>,
) -> Result<ChunkStream, Error> {
    let ob = outboard_of(digest, &data)?;
    Ok(encode(BaoSource::Memory(data), ob, request_ranges(range)))
}

/// Encodes `range` (`None`: the whole entry) from `span`, a [`SpanReader`]
/// over the groups covering it, with the entry's validated `hashes`.
pub fn encode_span(
    hashes: &GroupHashes,
    span: SpanReader,
    range: Option<&Range<u64>>,
) -> ChunkStream {
    encode(
        BaoSource::Span(span),
        mem_outboard(hashes),
        request_ranges(range),
    )
}

/// Why a bao stream did not decode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BaoDecodeError {
    /// A hash in the stream did not match: the bytes (or the hashes) are
    /// not the entry's. Nothing from the failing group was yielded.
    #[error("bao stream of {digest}: {what} at byte offset {offset} does not hash to the digest")]
    Mismatch {
        /// The entry's digest.
        digest: Digest,
        /// `"chunk group"` or `"tree node"`.
        what: &'static str,
        /// Where the failing group starts, or the middle of the failing
        /// node's subtree.
        offset: u64,
    },
    /// The stream ended before the encoding did (a server that aborted
    /// the response, a dropped connection), or reading it failed.
    #[error("bao stream of {digest}: cut off or unreadable after {verified} verified bytes")]
    Incomplete {
        /// The entry's digest.
        digest: Digest,
        /// Bytes of the range yielded (all verified) before it ended.
        verified: u64,
        /// The read error, when there was one (none for a plain early end).
        #[source]
        source: Option<io::Error>,
    },
    /// Bytes followed the end of the encoding.
    #[error("bao stream of {digest}: unexpected bytes after the end of the encoding")]
    Trailing {
        /// The entry's digest.
        digest: Digest,
    },
}

impl BaoDecodeError {
    /// Whether the stream proved the content wrong (as opposed to merely
    /// ending early).
    pub fn is_mismatch(&self) -> bool {
        matches!(self, BaoDecodeError::Mismatch { .. })
    }
}

/// Decodes a bao stream of `range` (`None`: the whole entry) of the entry
/// `digest` of `size` bytes, read from `encoded`, into the range's bytes:
/// each yielded chunk hashed up to `digest` first (bao-tree's
/// [`ResponseDecoder`] does the checking), in order, trimmed to `range`.
///
/// The stream ends after the last byte of the range once the encoding ended
/// exactly there; an `Err` item ends it otherwise. Memory: one chunk group.
pub fn decode<R>(
    digest: Digest,
    size: u64,
    range: Option<Range<u64>>,
    encoded: R,
) -> impl Stream<Item = Result<Bytes, BaoDecodeError>> + Send
where
    R: AsyncRead + Unpin + Send,
{
    let want = range.clone().unwrap_or(0..size);
    let decoder = ResponseDecoder::new(
        blake3::Hash::from(*digest.as_bytes()),
        request_ranges(range.as_ref()),
        outboard::tree(size),
        TokioStreamReader::new(encoded),
    );
    struct State<R> {
        decoder: Option<ResponseDecoder<TokioStreamReader<R>>>,
        yielded: u64,
    }
    let init = State {
        decoder: Some(decoder),
        yielded: 0,
    };
    futures::stream::unfold(init, move |mut st| {
        let want = want.clone();
        async move {
            loop {
                let dec = st.decoder.take()?;
                match dec.next().await {
                    ResponseDecoderNext::More((next, item)) => match item {
                        Ok(BaoContentItem::Parent(_)) => st.decoder = Some(next),
                        Ok(BaoContentItem::Leaf(leaf)) => {
                            st.decoder = Some(next);
                            let start = leaf.offset.max(want.start);
                            let end = (leaf.offset + leaf.data.len() as u64).min(want.end);
                            if start >= end {
                                continue;
                            }
                            let lo = (start - leaf.offset) as usize;
                            let hi = (end - leaf.offset) as usize;
                            st.yielded += (hi - lo) as u64;
                            return Some((Ok(leaf.data.slice(lo..hi)), st));
                        }
                        Err(e) => {
                            let err = decode_error(digest, st.yielded, e);
                            return Some((Err(err), st));
                        }
                    },
                    ResponseDecoderNext::Done(mut reader) => {
                        if st.yielded != want.end - want.start {
                            let err = BaoDecodeError::Incomplete {
                                digest,
                                verified: st.yielded,
                                source: None,
                            };
                            return Some((Err(err), st));
                        }
                        let mut one = [0u8; 1];
                        return match reader.0.read(&mut one).await {
                            Ok(0) => None,
                            Ok(_) => Some((Err(BaoDecodeError::Trailing { digest }), st)),
                            Err(e) => Some((
                                Err(BaoDecodeError::Incomplete {
                                    digest,
                                    verified: st.yielded,
                                    source: Some(e),
                                }),
                                st,
                            )),
                        };
                    }
                }
            }
        }
    })
}

fn decode_error(digest: Digest, verified: u64, e: DecodeError) -> BaoDecodeError {
    match e {
        DecodeError::LeafHashMismatch(chunk) => BaoDecodeError::Mismatch {
            digest,
            what: "chunk group",
            offset: chunk.to_bytes(),
        },
        DecodeError::ParentHashMismatch(node) => BaoDecodeError::Mismatch {
            digest,
            what: "tree node",
            offset: node.mid().to_bytes(),
        },
        DecodeError::LeafNotFound(_) | DecodeError::ParentNotFound(_) => {
            BaoDecodeError::Incomplete {
                digest,
                verified,
                source: None,
            }
        }
        DecodeError::Io(e) => BaoDecodeError::Incomplete {
            digest,
            verified,
            source: Some(e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bao_tree::io::sync::{encode_ranges_validated as reference_encode, DecodeResponseIter};

    const G: u64 = GROUP_SIZE as u64;

    fn data(n: u64) -> Vec<u8> {
        (0..n).map(|i| (i * 131 + i / 977) as u8).collect()
    }

    fn digest(d: &[u8]) -> Digest {
        Digest::of(d)
    }

    fn hashes(d: &[u8]) -> GroupHashes {
        let (dg, ob) = outboard::compute(d);
        GroupHashes::from_outboard(dg, d.len() as u64, ob).expect("valid outboard")
    }

    /// A span reader over `span` of `d` that holds only those bytes.
    fn span_of(d: &[u8], span: Range<u64>) -> SpanReader {
        let bytes = d[span.start as usize..span.end as usize].to_vec();
        SpanReader::new(Box::pin(std::io::Cursor::new(bytes)), span, d.len() as u64)
    }

    async fn collect(mut s: ChunkStream) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c?);
        }
        Ok(out)
    }

    /// bao-tree's own (sync) encoder's output for the same request.
    fn reference(d: &[u8], range: Option<&Range<u64>>) -> Vec<u8> {
        let ob = PostOrderMemOutboard::create(d, outboard::BLOCK_SIZE);
        let mut out = Vec::new();
        reference_encode(d, &ob, &request_ranges(range), &mut out).expect("reference encodes");
        out
    }

    /// Decodes with bao-tree's own (sync) decoder: the bytes of `range`.
    fn bao_tree_decode(d: &[u8], range: Option<&Range<u64>>, enc: &[u8]) -> Vec<u8> {
        let want = range.cloned().unwrap_or(0..d.len() as u64);
        let ranges = request_ranges(range);
        let iter = DecodeResponseIter::new(
            blake3::hash(d),
            outboard::tree(d.len() as u64),
            enc,
            &ranges,
        );
        let mut out = Vec::new();
        for item in iter {
            if let BaoContentItem::Leaf(l) = item.expect("bao-tree decodes") {
                let (s, e) = (l.offset, l.offset + l.data.len() as u64);
                let (lo, hi) = (s.max(want.start), e.min(want.end));
                if lo < hi {
                    out.extend_from_slice(&l.data[(lo - s) as usize..(hi - s) as usize]);
                }
            }
        }
        out
    }

    async fn ours_decode(d: &[u8], range: Option<Range<u64>>, enc: Vec<u8>) -> Vec<u8> {
        let s = decode(digest(d), d.len() as u64, range, std::io::Cursor::new(enc));
        futures::pin_mut!(s);
        let mut out = Vec::new();
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c.expect("our decoder decodes"));
        }
        out
    }

    fn sizes() -> Vec<u64> {
        vec![
            0,
            1,
            1023,
            1024,
            G - 1,
            G,
            G + 1,
            3 * G + 7,
            (1 << 20) + 4321,
        ]
    }

    fn ranges(size: u64) -> Vec<Range<u64>> {
        let mut v = vec![0..1, 0..size, size - 1..size, size / 2..size / 2 + 1];
        for r in [
            10..20,
            1000..1100,
            G - 10..G + 10,
            G..2 * G,
            G + 5..3 * G - 5,
            3 * G..size,
            2047..2049,
        ] {
            if r.start < r.end && r.end <= size {
                v.push(r);
            }
        }
        v
    }

    #[tokio::test]
    async fn whole_entries_encode_as_bao_tree_does_and_decode() {
        for n in sizes() {
            let d = data(n);
            let want = reference(&d, None);
            let mem = encode_memory(digest(&d), Bytes::from(d.clone()), None).expect("encodes");
            let mem = collect(mem).await.expect("memory stream");
            assert_eq!(mem, want, "memory encoding at {n}");
            let span = encode_span(&hashes(&d), span_of(&d, 0..n), None);
            let span = collect(span).await.expect("span stream");
            assert_eq!(span, want, "span encoding at {n}");
            assert_eq!(
                bao_tree_decode(&d, None, &span),
                d,
                "bao-tree decode at {n}"
            );
            assert_eq!(ours_decode(&d, None, span).await, d, "our decode at {n}");
        }
    }

    #[tokio::test]
    async fn ranges_encode_from_their_covering_groups_only() {
        for n in sizes().into_iter().filter(|n| *n > 0) {
            let d = data(n);
            let h = hashes(&d);
            for r in ranges(n) {
                let want = reference(&d, Some(&r));
                let cover = outboard::covering_groups(&r, n);
                let mut reader = span_of(&d, cover.clone());
                reader.prefetch().await.expect("prefetch");
                let enc = collect(encode_span(&h, reader, Some(&r)))
                    .await
                    .unwrap_or_else(|e| panic!("{n} {r:?} over {cover:?}: {e}"));
                assert_eq!(enc, want, "encoding of {r:?} at {n}");
                let mem = encode_memory(digest(&d), Bytes::from(d.clone()), Some(&r)).unwrap();
                assert_eq!(collect(mem).await.unwrap(), want);
                let slice = &d[r.start as usize..r.end as usize];
                assert_eq!(bao_tree_decode(&d, Some(&r), &enc), slice, "{r:?} at {n}");
                assert_eq!(ours_decode(&d, Some(r.clone()), enc).await, slice);
            }
        }
    }

    #[tokio::test]
    async fn a_corrupt_group_ends_the_stream_with_an_error() {
        let n = 5 * G + 3;
        let d = data(n);
        let h = hashes(&d);
        let mut bad = d.clone();
        bad[(2 * G + 100) as usize] ^= 1;
        // The source hands the encoder a wrong group (as if a store did not
        // verify): bao-tree's validating encoder refuses to send it.
        let mut s = encode_span(&h, span_of(&bad, 0..n), None);
        let mut sent = Vec::new();
        let mut failed = false;
        while let Some(c) = s.next().await {
            match c {
                Ok(c) => sent.extend_from_slice(&c),
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        assert!(failed, "the stream ended cleanly");
        let good = reference(&d, None);
        assert!(sent.len() < good.len());
        assert_eq!(&sent[..], &good[..sent.len()], "only good bytes were sent");
        // A range away from the flip encodes fine from its own groups.
        let r = 10..20;
        let enc = collect(encode_span(&h, span_of(&bad, 0..G), Some(&r))).await;
        assert_eq!(enc.unwrap(), reference(&d, Some(&r)));
        // Memory: wrong bytes never start a stream.
        assert!(matches!(
            encode_memory(digest(&d), Bytes::from(bad), None),
            Err(Error::Verification { .. })
        ));
    }

    #[tokio::test]
    async fn the_decoder_yields_only_verified_bytes() {
        let n = 4 * G + 11;
        let d = data(n);
        let enc = reference(&d, None);
        // Flip a data byte of the third group: the first two groups come
        // out, then a mismatch.
        let ob_len = outboard::outboard_len(n) as usize;
        let mut bad = enc.clone();
        let at = ob_len + (2 * G + 5) as usize;
        assert!(at < bad.len());
        bad[at] ^= 0x10;
        let s = decode(digest(&d), n, None, std::io::Cursor::new(bad));
        futures::pin_mut!(s);
        let mut out = Vec::new();
        let mut err = None;
        while let Some(c) = s.next().await {
            match c {
                Ok(c) => out.extend_from_slice(&c),
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let err = err.expect("a mismatch");
        assert!(err.is_mismatch(), "{err}");
        assert_eq!(&out[..], &d[..out.len()]);
        assert!(out.len() as u64 <= 2 * G);
        // Cut short: incomplete, never a clean end.
        let s = decode(
            digest(&d),
            n,
            None,
            std::io::Cursor::new(enc[..enc.len() - 1].to_vec()),
        );
        let items: Vec<_> = s.collect().await;
        assert!(matches!(
            items.last(),
            Some(Err(BaoDecodeError::Incomplete { .. }))
        ));
        // Trailing bytes: refused.
        let mut long = enc.clone();
        long.push(0);
        let s = decode(digest(&d), n, None, std::io::Cursor::new(long));
        let items: Vec<_> = s.collect().await;
        assert!(matches!(
            items.last(),
            Some(Err(BaoDecodeError::Trailing { .. }))
        ));
        // Another entry's stream under this digest: refused at once.
        let other = reference(&data(n + 1)[..n as usize + 1], None);
        let s = decode(digest(&d), n, None, std::io::Cursor::new(other));
        let items: Vec<_> = s.collect().await;
        assert!(items.iter().all(|i| i.is_err()) && !items.is_empty());
    }

    /// An `AsyncRead` over memory that counts the bytes it handed out.
    struct Counting {
        data: std::io::Cursor<Vec<u8>>,
        read: std::sync::Arc<std::sync::atomic::AtomicU64>,
    }

    impl AsyncRead for Counting {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            let before = buf.filled().len();
            let r = Pin::new(&mut self.data).poll_read(cx, buf);
            let n = (buf.filled().len() - before) as u64;
            self.read.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
            r
        }
    }

    #[tokio::test]
    async fn the_encoder_reads_only_as_fast_as_the_stream_is_taken() {
        let n = 8u64 << 20;
        let d = data(n);
        let h = hashes(&d);
        let read = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let src = Counting {
            data: std::io::Cursor::new(d.clone()),
            read: read.clone(),
        };
        let span = SpanReader::new(Box::pin(src), 0..n, n);
        let mut s = encode_span(&h, span, None);
        let first = s.next().await.expect("a chunk").expect("no error");
        assert!(first.len() <= OUTPUT_CHUNK);
        // The encoder runs only while the stream is polled, and within a
        // poll it stops at the channel's bound: one chunk taken, little more
        // than the channel's worth has been read.
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        let ahead = read.load(std::sync::atomic::Ordering::SeqCst);
        let bound = ((OUTPUT_CHANNEL + 3) * OUTPUT_CHUNK + 2 * GROUP_SIZE) as u64;
        assert!(
            ahead <= bound,
            "read {ahead} bytes ahead of a stalled stream"
        );
        // Taken to the end, it is the whole encoding.
        let mut all = first.to_vec();
        all.extend(collect(s).await.unwrap());
        assert_eq!(all, reference(&d, None));
        assert_eq!(read.load(std::sync::atomic::Ordering::SeqCst), n);
    }

    #[test]
    fn chunk_ranges_round_out_to_chunks() {
        let r = chunk_ranges(&(1..3));
        assert_eq!(r, ChunkRanges::from(ChunkNum(0)..ChunkNum(1)));
        let r = chunk_ranges(&(1023..1025));
        assert_eq!(r, ChunkRanges::from(ChunkNum(0)..ChunkNum(2)));
        let r = chunk_ranges(&(2048..4096));
        assert_eq!(r, ChunkRanges::from(ChunkNum(2)..ChunkNum(4)));
    }

    #[tokio::test]
    async fn span_reads_go_forward_only() {
        let d = data(3 * G);
        let mut s = span_of(&d, G..3 * G);
        s.prefetch().await.unwrap();
        let a = s.read_at(G, GROUP_SIZE).await.unwrap();
        assert_eq!(&a[..], &d[G as usize..2 * G as usize]);
        assert!(s.read_at(0, 10).await.is_err());
        let b = s.read_at(2 * G + 10, 5).await.unwrap();
        assert_eq!(&b[..], &d[(2 * G + 10) as usize..(2 * G + 15) as usize]);
        assert!(s.read_at(3 * G, 5).await.unwrap().is_empty());
    }
}
