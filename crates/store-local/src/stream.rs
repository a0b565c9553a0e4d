//! A streamed read (a span longer than [`read_at_once`](crate::reader)
//! allows), driven by its consumer's polls (ADR-085).
//!
//! The read is a [`Pull`] producer inside the reader's `Chunks`: each
//! chunk is read when the consumer (an HTTP body, a copy through the byte
//! view) polls for it, in the consumer's own task — there is no task of
//! the read's own, so no chunk passes between two tasks. Per poll:
//!
//! 1. a permit of the read's live-chunk budget ([`LIVE_CHUNKS`], one
//!    chunk: ADR-057, ADR-086): with none free the poll waits — the
//!    consumer still holds the last chunk (a stalled HTTP client's socket)
//!    — and the waker is called when it is dropped;
//! 2. the next [`STREAM_CHUNK`] bytes read inline when every one of them is
//!    in the page cache (`preadv2(RWF_NOWAIT)`, on roots where inline
//!    reads are on), hashed for a whole-file read, and returned;
//! 3. else one blocking call (`spawn_blocking`), awaited by the poll, that
//!    reads it.
//!
//! A consumer that keeps every byte ([`Demand::Collect`], ADR-084) gets
//! the rest of the span read and hashed in one blocking call, as one
//! buffer ([`read_rest`]). A reader dropped mid-read lets go of the file
//! (closed off the runtime when it was the last holder, [`release`]); a
//! blocking call in flight finishes on its thread, and the file it held
//! is let go of the same way.
//!
//! The file is the open-file cache's descriptor (`cache.rs`) when the
//! cache holds one: a streamed read of a cached entry needs no blocking
//! call to open it.

use std::future::Future;
use std::io;
use std::ops::Range;
use std::pin::Pin;
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use store_types::{BlobReader, Demand, Digest, Key, Pull};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio_util::sync::PollSemaphore;

use crate::cache::{release, OpenFile};
use crate::reader::{pread_fill, pread_nowait_into, LIVE_CHUNKS, STREAM_CHUNK};
use crate::Inner;

/// A streamed read of `span` of `key`'s entry (`size` bytes) from `file`:
/// a [`BlobReader::Chunks`] whose chunks the consumer's polls read,
/// carrying the digest of the bytes when `whole` (the span is the whole
/// entry).
pub(crate) fn open(
    inner: &Arc<Inner>,
    key: &Key,
    file: Arc<OpenFile>,
    whole: bool,
    span: Range<u64>,
) -> BlobReader {
    let len = span.end - span.start;
    let (digest_tx, digest_rx) = whole.then(oneshot::channel).unzip();
    let budget = PollSemaphore::new(Arc::new(Semaphore::new(LIVE_CHUNKS)));
    let (recycle, recycled) = std_mpsc::channel();
    let at = At {
        inner: inner.clone(),
        key: key.clone(),
        file,
        pos: span.start,
        remaining: len,
        recycle,
        recycled,
        hash: digest_tx.map(|d| (Box::new(blake3::Hasher::new()), d)),
    };
    let pull = Pulled {
        at: Some(at),
        reading: None,
        ready: None,
        permits: budget,
        how: Demand::Stream,
    };
    BlobReader::from_pull(len, Box::new(pull), digest_rx)
}

/// Where a streamed read is, and what it reads with.
struct At {
    inner: Arc<Inner>,
    key: Key,
    file: Arc<OpenFile>,
    /// Where the next chunk starts in the file.
    pos: u64,
    /// Bytes still to read.
    remaining: u64,
    /// Where a chunk's buffer goes back once its last `Bytes` handle is
    /// dropped ([`Recycled`]).
    recycle: std_mpsc::Sender<Vec<u8>>,
    /// Buffers handed back, read into again: a read allocates only the few
    /// buffers alive at once.
    recycled: std_mpsc::Receiver<Vec<u8>>,
    /// For a whole-file read: the hash of the bytes read so far, and where
    /// its digest goes after the last one.
    hash: Option<(Box<blake3::Hasher>, oneshot::Sender<Digest>)>,
}

impl At {
    /// Takes `buf`, just read at `pos`, as the next chunk: hashed for a
    /// whole-file read (the digest sent after the last), the position
    /// moved on, and wrapped to hand its buffer and `live` permit back
    /// when dropped.
    fn chunk(&mut self, buf: Vec<u8>, live: OwnedSemaphorePermit) -> Bytes {
        self.advance(&buf);
        Recycled::bytes(buf, &self.recycle, live)
    }

    fn advance(&mut self, buf: &[u8]) {
        if let Some((h, _)) = self.hash.as_mut() {
            h.update(buf);
        }
        self.pos += buf.len() as u64;
        self.remaining -= buf.len() as u64;
        if self.remaining == 0 {
            if let Some((h, digest)) = self.hash.take() {
                // The reader may be gone already; then nobody awaits it.
                let _ = digest.send(Digest::from(h.finalize()));
            }
        }
    }

    /// The next chunk's length, and a buffer handed back to read it into.
    fn next(&self) -> (usize, Option<Vec<u8>>) {
        let n = self.remaining.min(STREAM_CHUNK as u64) as usize;
        (n, self.recycled.try_recv().ok())
    }

    /// `e`, naming the file.
    fn failed(&self, e: io::Error) -> io::Error {
        let path = self.inner.content_path(&self.key);
        io::Error::new(e.kind(), format!("reading {}: {e}", path.display()))
    }
}

/// What a blocking call read, and the read's state back.
type Read = (At, io::Result<Bytes>);

/// The [`Pull`] producer of a streamed read (see the module docs).
struct Pulled {
    /// The read's state; `None` while a blocking call has it, and once the
    /// read ended.
    at: Option<At>,
    /// The blocking call reading chunks, while one runs.
    reading: Option<JoinHandle<Read>>,
    /// The chunk a blocking call read, not yet returned.
    ready: Option<io::Result<Bytes>>,
    /// The read's live-chunk budget ([`LIVE_CHUNKS`] permits), as the
    /// polls wait for it: a chunk is read only with a permit, which its
    /// buffer keeps until the last `Bytes` handle on it is dropped
    /// ([`Recycled`]).
    permits: PollSemaphore,
    how: Demand,
}

impl Pull for Pulled {
    fn demand(&mut self, how: Demand) {
        self.how = how;
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            if let Some(chunk) = self.ready.take() {
                return Poll::Ready(Some(chunk));
            }
            if let Some(reading) = self.reading.as_mut() {
                let read = ready!(Pin::new(reading).poll(cx));
                self.reading = None;
                match read {
                    Ok((at, chunk)) => (self.at, self.ready) = (Some(at), Some(chunk)),
                    Err(e) => return Poll::Ready(Some(Err(io::Error::other(e)))),
                }
                continue;
            }
            let Some(at) = self.at.as_mut() else {
                return Poll::Ready(None);
            };
            if at.remaining == 0 {
                self.end();
                return Poll::Ready(None);
            }
            if self.how == Demand::Collect {
                let mut at = self.at.take().expect("checked above");
                let call = move || {
                    let rest = read_rest(&mut at);
                    (at, rest)
                };
                self.reading = Some(tokio::task::spawn_blocking(call));
                continue;
            }
            let Some(live) = ready!(self.permits.poll_acquire(cx)) else {
                // The budget is never closed.
                return Poll::Ready(Some(Err(io::Error::other("read budget closed"))));
            };
            let live = match read_inline(at, live) {
                Ok(chunk) => return Poll::Ready(Some(Ok(chunk))),
                Err(live) => live,
            };
            let mut at = self.at.take().expect("checked above");
            let call = move || {
                let chunk = read_one(&mut at, live);
                (at, chunk)
            };
            self.reading = Some(tokio::task::spawn_blocking(call));
        }
    }
}

impl Pulled {
    /// Lets go of the file (closed off the runtime if this was its last
    /// holder).
    fn end(&mut self) {
        if let Some(at) = self.at.take() {
            release(at.file);
        }
    }
}

impl Drop for Pulled {
    fn drop(&mut self) {
        self.end();
        // A blocking call in flight owns the state: once it is done, its
        // file is let go of as `end` would (a call still running drops its
        // output on its own thread; a finished one's output would
        // otherwise be dropped here, on the runtime).
        if let Some(reading) = self.reading.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                drop(rt.spawn(async move {
                    if let Ok((at, _)) = reading.await {
                        release(at.file);
                    }
                }));
            }
        }
    }
}

/// The next chunk read in the consumer's task when inline reads are on
/// and every byte of it is in the page cache (`preadv2(RWF_NOWAIT)`),
/// then hashed (for a whole-file read: 64 KiB, ~15 µs). `Err` with the
/// permit when it would have waited: a blocking call reads it.
fn read_inline(at: &mut At, live: OwnedSemaphorePermit) -> Result<Bytes, OwnedSemaphorePermit> {
    if !at.inner.inline.on() {
        return Err(live);
    }
    let (n, spare) = at.next();
    match pread_nowait_into(&at.inner, &at.file.file, at.pos, n, spare) {
        Ok(buf) => Ok(at.chunk(buf, live)),
        Err(spare) => {
            if let Some(buf) = spare {
                // Back in the queue, for the blocking call.
                let _ = at.recycle.send(buf);
            }
            Err(live)
        }
    }
}

/// One blocking call of a streamed read: the chunk `live` is for.
fn read_one(at: &mut At, live: OwnedSemaphorePermit) -> io::Result<Bytes> {
    let (n, spare) = at.next();
    match pread_fill(&at.file.file, at.pos, n, spare) {
        Ok(buf) => Ok(at.chunk(buf, live)),
        Err(e) => Err(at.failed(e)),
    }
}

/// The rest of the span for a consumer that keeps every byte
/// ([`Demand::Collect`]), in one blocking call: read into one buffer,
/// hashed (on every core when large, `digest_of`) for a whole-file read,
/// and returned as one chunk, outside the live-chunk budget — the
/// consumer holds all of it anyway. An entry too large for memory fails
/// the read rather than the process.
fn read_rest(at: &mut At) -> io::Result<Bytes> {
    let too_large = || io::Error::new(io::ErrorKind::OutOfMemory, "entry larger than memory");
    let n = usize::try_from(at.remaining).map_err(|_| too_large())?;
    let mut buf = Vec::new();
    buf.try_reserve_exact(n).map_err(|_| too_large())?;
    let buf = pread_fill(&at.file.file, at.pos, n, Some(buf)).map_err(|e| at.failed(e))?;
    if let Some((_, to)) = at.hash.take() {
        let _ = to.send(store_types::outboard::digest_of(&buf));
    }
    at.advance(&buf);
    Ok(Bytes::from(buf))
}

/// A streamed read's chunk buffer, sent back to the read for reuse when
/// the last `Bytes` handle on it is dropped, together with the permit of
/// the read's budget it holds (released right after the buffer is back,
/// so the poll that the permit wakes finds it).
struct Recycled {
    buf: Vec<u8>,
    to: std_mpsc::Sender<Vec<u8>>,
    _live: OwnedSemaphorePermit,
}

impl Recycled {
    fn bytes(buf: Vec<u8>, to: &std_mpsc::Sender<Vec<u8>>, live: OwnedSemaphorePermit) -> Bytes {
        Bytes::from_owner(Recycled {
            buf,
            to: to.clone(),
            _live: live,
        })
    }
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.capacity() > 0 {
            // The read may have ended: then the buffer is freed.
            let _ = self.to.send(buf);
        }
    }
}
