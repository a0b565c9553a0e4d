//! A streamed read whose bytes arrive as owned chunks (TUNING.md §response-chunks): readable
//! as bytes through [`Chunks::reader`] (one copy into the caller's
//! buffer), or taken chunk by chunk through [`Chunks::next_chunk`] (no
//! copy) by a consumer that forwards them, such as an HTTP response body;
//! an engine hands them over as [`BlobReader::Chunks`](crate::BlobReader::Chunks).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// The owned chunks of a streamed read, shared by its two views (the
/// `AsyncRead` and [`Chunks::poll_chunk`]), which read from one position:
/// what one view consumed, the other does not see again.
///
/// The bytes come from an engine, either over a channel from a task of
/// its own ([`Chunks::new`]) or from a producer the consumer's polls
/// drive ([`Chunks::pulled`], ADR-085). An `Err` item ends the read with
/// that error (later calls fail with its kind and message), and a
/// producer that ends before `len` bytes arrived ends it with
/// `UnexpectedEof` (the task died).
/// Cloning shares the position. Only one consumer reads at a time (a
/// `Blob` owns both views), so the lock is never contended.
#[derive(Clone)]
pub struct Chunks {
    state: Arc<Mutex<State>>,
}

/// How the consumer of a streamed read takes it, told to a producer
/// before it is first polled ([`Pull::demand`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Demand {
    /// Chunk by chunk, each let go of before the next is wanted (an HTTP
    /// body, a copy through the byte view): the producer keeps only its
    /// few chunks alive at once.
    Stream,
    /// All of it, kept in memory ([`Chunks::collect`]): the producer may
    /// yield it as one buffer, which the consumer keeps without a copy.
    Collect,
}

/// A producer of a streamed read's chunks that runs in its consumer's
/// task (ADR-085): each chunk is read when the consumer polls for it, so
/// no chunk passes between two tasks. A producer that must wait (for the
/// disk, for its consumer to let go of earlier chunks) registers the
/// poll's waker and answers `Pending`, like any stream.
pub trait Pull: Send {
    /// How the consumer takes the chunks: told once, before the first
    /// poll ([`Demand::Collect`] from [`Chunks::collect`], else
    /// [`Demand::Stream`] at the first poll).
    fn demand(&mut self, how: Demand);

    /// The next chunk, or `None` at the end. An `Err` ends the read; it
    /// is not polled again after an `Err` or a `None`.
    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Option<io::Result<Bytes>>>;
}

/// Where the chunks come from.
enum Source {
    /// A task of the engine's, sending them.
    Channel(mpsc::Receiver<io::Result<Bytes>>),
    /// A producer polled in the consumer's task; `told` once it has its
    /// [`Demand`].
    Pull { pull: Box<dyn Pull>, told: bool },
}

impl Source {
    fn tell(&mut self, how: Demand) {
        if let Source::Pull { pull, told } = self {
            if !*told {
                *told = true;
                pull.demand(how);
            }
        }
    }

    fn poll_next(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        match self {
            Source::Channel(rx) => rx.poll_recv(cx),
            Source::Pull { pull, .. } => pull.poll_next(cx),
        }
    }
}

struct State {
    source: Source,
    /// The unread part of the chunk the byte view is in.
    current: Bytes,
    /// Bytes still expected from the source.
    remaining: u64,
    /// Set once the end or an error was reported: later polls answer the
    /// end, or an error of the same kind and message.
    done: Option<Result<(), (io::ErrorKind, String)>>,
}

impl Chunks {
    /// Chunks of a read of `len` bytes in all, sent on `rx`.
    pub fn new(len: u64, rx: mpsc::Receiver<io::Result<Bytes>>) -> Self {
        Chunks::with_source(len, Source::Channel(rx))
    }

    /// Chunks of a read of `len` bytes that `pull` produces when polled,
    /// in the consumer's task (ADR-085).
    pub fn pulled(len: u64, pull: Box<dyn Pull>) -> Self {
        Chunks::with_source(len, Source::Pull { pull, told: false })
    }

    fn with_source(len: u64, source: Source) -> Self {
        Chunks {
            state: Arc::new(Mutex::new(State {
                source,
                current: Bytes::new(),
                remaining: len,
                done: None,
            })),
        }
    }

    /// Tells the producer that the consumer keeps every byte
    /// ([`Demand::Collect`]), when it has not been told how yet; a
    /// no-op otherwise (and for a channel's chunks).
    pub fn collect(&self) {
        self.lock().source.tell(Demand::Collect);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the state consistent (every
        // field is updated by a single assignment), so a poisoned lock is
        // used as it is.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next chunk: first what the byte view left of the chunk it was
    /// in, then the channel's chunks as they come (never empty); `None` at
    /// the end. Cancel-safe: a chunk is removed only when returned.
    pub fn poll_chunk(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        self.lock().poll_chunk(cx)
    }

    /// [`Chunks::poll_chunk`] as a future. Cancel-safe.
    pub async fn next_chunk(&self) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// The byte view: an `AsyncRead` over the same chunks.
    pub fn reader(&self) -> impl AsyncRead + Send + 'static {
        ChunksReader(self.clone())
    }
}

impl State {
    fn poll_chunk(&mut self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        self.source.tell(Demand::Stream);
        if !self.current.is_empty() {
            return Poll::Ready(Ok(Some(std::mem::take(&mut self.current))));
        }
        if let Some(done) = self.done.clone() {
            return Poll::Ready(match done {
                Ok(()) => Ok(None),
                Err((kind, msg)) => Err(io::Error::new(kind, msg)),
            });
        }
        let got = loop {
            match ready!(self.source.poll_next(cx)) {
                Some(Ok(chunk)) if chunk.is_empty() => continue,
                Some(Ok(chunk)) if chunk.len() as u64 > self.remaining => {
                    break Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the engine's read yielded more bytes than it declared",
                    ))
                }
                Some(Ok(chunk)) => {
                    self.remaining -= chunk.len() as u64;
                    return Poll::Ready(Ok(Some(chunk)));
                }
                Some(Err(e)) => break Err(e),
                None if self.remaining == 0 => break Ok(()),
                None => {
                    break Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("the engine's read ended {} bytes early", self.remaining),
                    ))
                }
            }
        };
        self.done = Some(
            got.as_ref()
                .map(|_| ())
                .map_err(|e| (e.kind(), e.to_string())),
        );
        Poll::Ready(got.map(|()| None))
    }
}

/// Chunks gathered into one buffer: the first kept as it is while it is
/// all there is (a producer told [`Demand::Collect`] sends one), later
/// ones copied after it.
#[derive(Debug)]
pub struct Gather {
    first: Bytes,
    rest: Option<bytes::BytesMut>,
    /// The total expected, to size the buffer a second chunk starts.
    expect: u64,
}

impl Gather {
    /// An empty gathering of about `expect` bytes (capped at 64 MiB up
    /// front; a length is the engine's word).
    pub fn new(expect: u64) -> Self {
        Gather {
            first: Bytes::new(),
            rest: None,
            expect,
        }
    }

    /// Adds `chunk` after what was gathered.
    pub fn push(&mut self, chunk: Bytes) {
        if let Some(rest) = &mut self.rest {
            rest.extend_from_slice(&chunk);
        } else if self.first.is_empty() {
            self.first = chunk;
        } else {
            let cap = self.expect.min(64 << 20) as usize;
            let mut rest = bytes::BytesMut::with_capacity(cap.max(self.first.len() + chunk.len()));
            rest.extend_from_slice(&self.first);
            rest.extend_from_slice(&chunk);
            self.first = Bytes::new();
            self.rest = Some(rest);
        }
    }

    /// Bytes gathered so far.
    pub fn len(&self) -> usize {
        self.rest.as_ref().map_or(self.first.len(), |r| r.len())
    }

    /// Whether nothing was gathered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Everything gathered, as one buffer.
    pub fn finish(self) -> Bytes {
        match self.rest {
            Some(rest) => rest.freeze(),
            None => self.first,
        }
    }
}

struct ChunksReader(Chunks);

impl AsyncRead for ChunksReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let mut state = self.0.lock();
        if state.current.is_empty() {
            match ready!(state.poll_chunk(cx))? {
                Some(chunk) => state.current = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = state.current.len().min(buf.remaining());
        buf.put_slice(&state.current[..n]);
        state.current.advance(n);
        if state.current.is_empty() {
            // Drained: let go of the chunk now, so an engine that reuses
            // its buffers (local's read-ahead) gets this one back at once.
            state.current = Bytes::new();
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn chunks(parts: &[&[u8]], len: u64) -> Chunks {
        let (tx, rx) = mpsc::channel(parts.len().max(1));
        for p in parts {
            tx.try_send(Ok(Bytes::copy_from_slice(p))).unwrap();
        }
        Chunks::new(len, rx)
    }

    #[tokio::test]
    async fn both_views_read_from_one_position() {
        let c = chunks(&[b"hello ", b"", b"chunked ", b"world"], 19);
        let mut r = c.reader();
        let mut two = [0u8; 2];
        r.read_exact(&mut two).await.unwrap();
        assert_eq!(&two, b"he");
        // The rest of the chunk the reader was in, then whole chunks (the
        // empty one skipped).
        assert_eq!(c.next_chunk().await.unwrap().unwrap(), &b"llo "[..]);
        assert_eq!(c.next_chunk().await.unwrap().unwrap(), &b"chunked "[..]);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"world");
        assert!(c.next_chunk().await.unwrap().is_none());
        assert!(c.next_chunk().await.unwrap().is_none());
    }

    /// A producer that records what it was told and yields `parts`.
    struct Told {
        how: Arc<Mutex<Vec<Demand>>>,
        parts: Vec<Bytes>,
    }

    impl Pull for Told {
        fn demand(&mut self, how: Demand) {
            self.how.lock().unwrap().push(how);
        }

        fn poll_next(
            &mut self,
            _cx: &mut std::task::Context<'_>,
        ) -> Poll<Option<io::Result<Bytes>>> {
            assert!(!self.how.lock().unwrap().is_empty(), "polled before told");
            Poll::Ready((!self.parts.is_empty()).then(|| Ok(self.parts.remove(0))))
        }
    }

    /// Chunks of `len` bytes from a [`Told`] yielding `parts`.
    fn told(parts: &[&'static [u8]], len: u64) -> (Chunks, Arc<Mutex<Vec<Demand>>>) {
        let how = Arc::new(Mutex::new(Vec::new()));
        let pull = Told {
            how: how.clone(),
            parts: parts.iter().map(|p| Bytes::from_static(p)).collect(),
        };
        (Chunks::pulled(len, Box::new(pull)), how)
    }

    #[tokio::test]
    async fn a_pulled_producer_is_told_once_how_the_chunks_are_taken() {
        let (c, how) = told(&[b"ab", b"c"], 3);
        c.collect();
        c.collect();
        assert_eq!(c.next_chunk().await.unwrap().unwrap(), &b"ab"[..]);
        assert_eq!(*how.lock().unwrap(), [Demand::Collect]);

        let (c, how) = told(&[b"ab", b"c"], 3);
        let mut got = Vec::new();
        c.reader().read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"abc");
        // Polled first: streaming; a later `collect` changes nothing.
        c.collect();
        assert_eq!(*how.lock().unwrap(), [Demand::Stream]);

        let (c, how) = told(&[b"abc"], 3);
        drop(c);
        assert!(
            how.lock().unwrap().is_empty(),
            "dropped unpolled: no demand"
        );
    }

    #[test]
    fn a_gathered_single_chunk_is_kept_without_a_copy() {
        let one = Bytes::from(vec![7u8; 1000]);
        let mut g = Gather::new(1000);
        g.push(one.clone());
        assert_eq!(g.len(), 1000);
        let got = g.finish();
        assert_eq!(got.as_ptr(), one.as_ptr());
        let mut g = Gather::new(6);
        assert!(g.is_empty());
        for part in [&b"ab"[..], b"", b"cd", b"ef"] {
            g.push(Bytes::copy_from_slice(part));
        }
        assert_eq!(g.finish(), &b"abcdef"[..]);
    }

    #[tokio::test]
    async fn a_source_that_ends_before_len_bytes_is_an_early_end() {
        for c in [chunks(&[b"abc"], 10), told(&[b"abc"], 10).0] {
            assert_eq!(c.next_chunk().await.unwrap().unwrap(), &b"abc"[..]);
            let e = c.next_chunk().await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            // And it stays failed, for either view.
            let e = c.reader().read_to_end(&mut Vec::new()).await.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        }
    }

    #[tokio::test]
    async fn more_bytes_than_len_fail_the_read() {
        let c = chunks(&[b"abc", b"def"], 4);
        assert_eq!(c.next_chunk().await.unwrap().unwrap(), &b"abc"[..]);
        let e = c.next_chunk().await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test]
    async fn an_error_item_ends_the_read_with_it() {
        let (tx, rx) = mpsc::channel(2);
        tx.try_send(Ok(Bytes::from_static(b"ab"))).unwrap();
        tx.try_send(Err(io::Error::new(io::ErrorKind::PermissionDenied, "no")))
            .unwrap();
        drop(tx);
        let c = Chunks::new(4, rx);
        let mut out = Vec::new();
        let e = c.reader().read_to_end(&mut out).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(out, b"ab");
        let e = c.next_chunk().await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(e.to_string(), "no", "the same error again");
    }
}
