//! Reads: one blocking call for a read of at most one chunk, else a
//! blocking read-ahead task feeding an [`AsyncRead`] adapter. For a
//! whole-entry read the read-ahead task also hashes each chunk before
//! handing it over, so the BLAKE3 work of a verified get overlaps the
//! consumer's copying ([`BlobReader::yielded_digest`]).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::mpsc as std_mpsc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use store_types::{BlobReader, Digest, Error, Result, CHUNK_SIZE};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{mpsc, oneshot};

use crate::fsio::{blocking, io_err, is_absent};

/// Chunks read ahead of the consumer.
const READ_AHEAD_CHUNKS: usize = 2;

/// What the opening half of a read reports.
enum Opened {
    /// The wanted bytes fit in one chunk and were read at once.
    Inline(Bytes),
    /// The read-ahead task streams `len` bytes through `rx` (and, for a
    /// whole-entry read, their digest through `digest`).
    Streaming {
        len: u64,
        rx: mpsc::Receiver<io::Result<Vec<u8>>>,
        recycle: std_mpsc::Sender<Vec<u8>>,
        digest: Option<oneshot::Receiver<Digest>>,
    },
}

/// Opens `path` and reads `range` of it (the whole file when `None`).
///
/// A range of at most [`CHUNK_SIZE`] bytes is one blocking call (open,
/// `fstat`, `pread`) returning the bytes. Otherwise one blocking task
/// opens the file, reports, and — when more than one chunk is wanted —
/// keeps reading ahead in [`CHUNK_SIZE`] chunks until the range is done or
/// the reader is dropped; a whole file of at most one chunk is read at once
/// by that same task. A streamed whole-file read (`range` `None`) carries
/// the task's digest of the bytes it yields. Returns `None` when the file
/// is absent.
pub(crate) async fn open_reader(
    path: PathBuf,
    range: Option<Range<u64>>,
) -> Result<Option<BlobReader>> {
    let small = |r: &Range<u64>| r.end.saturating_sub(r.start) <= CHUNK_SIZE as u64;
    if let Some(range) = range.clone().filter(small) {
        let bytes = blocking(move || read_small_range(&path, range)).await?;
        return Ok(bytes.map(BlobReader::from_bytes));
    }
    let (ready_tx, ready_rx) = oneshot::channel();
    let task = tokio::task::spawn_blocking(move || read_task(path, range, ready_tx));
    let opened = match ready_rx.await {
        Ok(r) => r?,
        Err(_) => {
            return Err(match task.await {
                Err(e) => Error::Io(format!("read task panicked: {e}")),
                Ok(()) => Error::Io("read task ended without opening".to_string()),
            })
        }
    };
    Ok(opened.map(|o| match o {
        Opened::Inline(bytes) => BlobReader::from_bytes(bytes),
        Opened::Streaming {
            len,
            rx,
            recycle,
            digest,
        } => BlobReader {
            len,
            reader: Box::pin(ChunkReader {
                rx,
                current: Vec::new(),
                pos: 0,
                remaining: len,
                recycle,
            }),
            yielded_digest: digest,
        },
    }))
}

/// The blocking half of a read of at most one chunk: open, `fstat`,
/// `pread`, nothing else. `None` when there is no such file.
fn read_small_range(path: &Path, range: Range<u64>) -> Result<Option<Bytes>> {
    let Some((file, size)) = open_file(path)? else {
        return Ok(None);
    };
    check_range(&range, size)?;
    pread_exact(&file, range.start, (range.end - range.start) as usize)
        .map(Some)
        .map_err(|e| io_err("reading", path, e))
}

/// The blocking task behind [`open_reader`].
///
/// Streamed chunks are `Vec`s the consumer hands back through `recycle`
/// once it has copied them out; the task reads into those again, so a read
/// allocates (and initialises) only the few buffers in flight at once, and
/// fresh ones are read into without zero-filling them first
/// ([`fill_chunk`]). A whole-file read hashes each chunk right after
/// reading it and sends the digest once the last chunk is sent.
fn read_task(
    path: PathBuf,
    range: Option<Range<u64>>,
    ready: oneshot::Sender<Result<Option<Opened>>>,
) {
    let whole = range.is_none();
    let (mut file, len) = match open_range(&path, range) {
        Ok(Some(opened)) => opened,
        Ok(None) => {
            let _ = ready.send(Ok(None));
            return;
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    if len <= CHUNK_SIZE as u64 {
        let bytes = read_chunk(&mut file, len as usize).map_err(|e| io_err("reading", &path, e));
        let _ = ready.send(bytes.map(|b| Some(Opened::Inline(b))));
        return;
    }
    let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
    let (recycle, recycled) = std_mpsc::channel();
    let (digest_tx, digest_rx) = whole.then(oneshot::channel).unzip();
    let opened = Opened::Streaming {
        len,
        rx,
        recycle,
        digest: digest_rx,
    };
    if ready.send(Ok(Some(opened))).is_err() {
        return;
    }
    let mut hasher = digest_tx.as_ref().map(|_| blake3::Hasher::new());
    let mut remaining = len;
    while remaining > 0 {
        let n = remaining.min(CHUNK_SIZE as u64) as usize;
        let chunk = fill_chunk(&mut file, n, recycled.try_recv().ok());
        if let (Ok(bytes), Some(h)) = (&chunk, hasher.as_mut()) {
            h.update(bytes);
        }
        let failed = chunk.is_err();
        if tx.blocking_send(chunk).is_err() || failed {
            return; // Reader dropped, or the error is delivered.
        }
        remaining -= n as u64;
    }
    if let (Some(digest_tx), Some(h)) = (digest_tx, hasher) {
        // The reader may be gone already; then nobody awaits the digest.
        let _ = digest_tx.send(Digest::from(h.finalize()));
    }
}

/// Opens `path` and returns it with its size; `None` when there is no such
/// file (or the name is not a regular file).
fn open_file(path: &Path) -> Result<Option<(File, u64)>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if is_absent(&e) => return Ok(None),
        Err(e) => return Err(io_err("opening", path, e)),
    };
    let meta = file.metadata().map_err(|e| io_err("stat", path, e))?;
    if !meta.is_file() {
        return Ok(None);
    }
    Ok(Some((file, meta.len())))
}

/// [`Error::InvalidRange`] unless `range` lies within `size` bytes.
fn check_range(range: &Range<u64>, size: u64) -> Result<()> {
    if range.start > range.end || range.end > size {
        return Err(Error::InvalidRange {
            start: range.start,
            end: range.end,
            size,
        });
    }
    Ok(())
}

/// Opens `path`, positions it at the start of `range`, and returns it with
/// the number of bytes to read; `None` when there is no such file.
fn open_range(path: &Path, range: Option<Range<u64>>) -> Result<Option<(File, u64)>> {
    let Some((mut file, size)) = open_file(path)? else {
        return Ok(None);
    };
    let Some(range) = range else {
        return Ok(Some((file, size)));
    };
    check_range(&range, size)?;
    if range.start > 0 {
        file.seek(SeekFrom::Start(range.start))
            .map_err(|e| io_err("seeking", path, e))?;
    }
    Ok(Some((file, range.end - range.start)))
}

/// Reads exactly `n` bytes at `offset` (`pread`, no seek); a file that
/// ends early is an error.
fn pread_exact(file: &File, offset: u64, n: usize) -> io::Result<Bytes> {
    let mut buf = vec![0u8; n];
    file.read_exact_at(&mut buf, offset).map_err(short_file)?;
    Ok(Bytes::from(buf))
}

/// Names an early end of file as what it means here.
fn short_file(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(e.kind(), "stored file is shorter than its recorded size")
    } else {
        e
    }
}

/// Reads exactly `n` bytes; a file that ends early is an error.
fn read_chunk(file: &mut File, n: usize) -> io::Result<Bytes> {
    fill_chunk(file, n, None).map(Bytes::from)
}

/// Reads exactly `n` bytes into `spare` (a buffer handed back by the
/// consumer) or a new buffer; a file that ends early is an error.
///
/// Neither zero-fills: a recycled buffer is already initialised (its
/// length is the size of the chunk it held) and is read into with one
/// `read_exact`; a new one is read into its uninitialised spare capacity
/// by `Take::read_to_end` (std reads a `File` into spare capacity without
/// initialising it).
fn fill_chunk(file: &mut File, n: usize, spare: Option<Vec<u8>>) -> io::Result<Vec<u8>> {
    if let Some(mut buf) = spare.filter(|b| b.len() >= n) {
        buf.truncate(n);
        file.read_exact(&mut buf).map_err(short_file)?;
        return Ok(buf);
    }
    let mut buf = Vec::with_capacity(n);
    file.take(n as u64).read_to_end(&mut buf)?;
    if buf.len() < n {
        return Err(short_file(io::ErrorKind::UnexpectedEof.into()));
    }
    Ok(buf)
}

/// [`AsyncRead`] over the chunks of a read-ahead task.
struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Vec<u8>>>,
    /// The current chunk; `current[pos..]` is still unread.
    current: Vec<u8>,
    pos: usize,
    /// Bytes still expected from the task, to tell a complete read from a
    /// task that died early.
    remaining: u64,
    /// Hands fully read chunks back to the task for reuse.
    recycle: std_mpsc::Sender<Vec<u8>>,
}

impl AsyncRead for ChunkReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if buf.remaining() == 0 {
                return Poll::Ready(Ok(()));
            }
            let this = &mut *self;
            if this.pos < this.current.len() {
                let n = (this.current.len() - this.pos).min(buf.remaining());
                buf.put_slice(&this.current[this.pos..this.pos + n]);
                this.pos += n;
                return Poll::Ready(Ok(()));
            }
            match ready!(this.rx.poll_recv(cx)) {
                Some(Ok(chunk)) => {
                    this.remaining = this.remaining.saturating_sub(chunk.len() as u64);
                    let done = std::mem::replace(&mut this.current, chunk);
                    this.pos = 0;
                    if done.capacity() > 0 {
                        // The task may have finished: then the buffer is freed.
                        let _ = this.recycle.send(done);
                    }
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None if this.remaining == 0 => return Poll::Ready(Ok(())),
                None => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "read task ended early",
                    )))
                }
            }
        }
    }
}
