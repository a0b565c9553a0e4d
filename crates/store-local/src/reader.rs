//! Reads: one blocking call for a read of at most one chunk, else an
//! async read-ahead task feeding an [`AsyncRead`] adapter. The task waits
//! for the consumer in async code and reads in short blocking calls
//! (`spawn_blocking`) that each fill only the room already free in the
//! channel to the reader and then return, so a reader whose consumer
//! stalls (a slow or stopped HTTP client) holds no blocking-pool thread
//! while it waits: only its few read-ahead chunks and the open file. For
//! a whole-entry read the blocking call also hashes each chunk before it
//! is handed over, so the BLAKE3 work of a verified get overlaps the
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

use crate::error::{blocking, io_err, is_absent};

/// Chunks read ahead of the consumer (the channel's capacity).
const READ_AHEAD_CHUNKS: usize = 3;

/// Most chunks one blocking call reads (4 MiB): with a consumer that keeps
/// up, the call returns at this bound rather than at a full channel.
const MAX_CHUNKS_PER_CALL: usize = 16;

/// What the opening half of a read reports.
enum Opened {
    /// The wanted bytes fit in one chunk and were read at once.
    Inline(Bytes),
    /// `len` bytes (more than one chunk) are to be read from `file`'s
    /// current position.
    Streaming { file: File, len: u64 },
}

/// Opens `path` and reads `range` of it (the whole file when `None`).
///
/// A range of at most [`CHUNK_SIZE`] bytes is one blocking call (open,
/// `fstat`, `pread`) returning the bytes. Otherwise one blocking call
/// opens the file (and reads it at once when it is at most one chunk);
/// for more than one chunk a read-ahead task ([`read_ahead`]) then reads
/// in [`CHUNK_SIZE`] chunks, in short blocking calls that never wait for
/// the consumer, until the range is done or the reader is dropped. A streamed whole-file read (`range`
/// `None`) carries the task's digest of the bytes it yields. Returns
/// `None` when the file is absent.
pub(crate) async fn open_reader(
    path: PathBuf,
    range: Option<Range<u64>>,
) -> Result<Option<BlobReader>> {
    let small = |r: &Range<u64>| r.end.saturating_sub(r.start) <= CHUNK_SIZE as u64;
    if let Some(range) = range.clone().filter(small) {
        let bytes = blocking(move || read_small_range(&path, range)).await?;
        return Ok(bytes.map(BlobReader::from_bytes));
    }
    let whole = range.is_none();
    let opening = path.clone();
    let Some(opened) = blocking(move || open_streaming(&opening, range)).await? else {
        return Ok(None);
    };
    let (file, len) = match opened {
        Opened::Inline(bytes) => return Ok(Some(BlobReader::from_bytes(bytes))),
        Opened::Streaming { file, len } => (file, len),
    };
    let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
    let (recycle, recycled) = std_mpsc::channel();
    let (digest_tx, digest_rx) = whole.then(oneshot::channel).unzip();
    let state = ReadAhead {
        file,
        path,
        remaining: len,
        recycled,
        hash: digest_tx.map(|d| (Box::new(blake3::Hasher::new()), d)),
    };
    tokio::spawn(read_ahead(state, tx));
    Ok(Some(BlobReader {
        len,
        reader: Box::pin(ChunkReader {
            rx,
            current: Vec::new(),
            pos: 0,
            remaining: len,
            recycle,
        }),
        yielded_digest: digest_rx,
        in_memory: None,
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

/// The opening blocking call of a streamed read: opens `path`, positions
/// it at the start of `range`, and reads a file of at most one chunk at
/// once. `None` when there is no such file.
fn open_streaming(path: &Path, range: Option<Range<u64>>) -> Result<Option<Opened>> {
    let Some((mut file, len)) = open_range(path, range)? else {
        return Ok(None);
    };
    if len <= CHUNK_SIZE as u64 {
        let bytes = read_chunk(&mut file, len as usize).map_err(|e| io_err("reading", path, e))?;
        return Ok(Some(Opened::Inline(bytes)));
    }
    Ok(Some(Opened::Streaming { file, len }))
}

/// What the read-ahead task carries from one blocking call to the next.
struct ReadAhead {
    file: File,
    path: PathBuf,
    /// Bytes still to read.
    remaining: u64,
    /// Buffers the consumer handed back.
    recycled: std_mpsc::Receiver<Vec<u8>>,
    /// For a whole-file read: the hash of the bytes sent so far, and where
    /// its digest goes at the end.
    hash: Option<(Box<blake3::Hasher>, oneshot::Sender<Digest>)>,
}

/// The read-ahead task behind a streamed [`open_reader`]: an async task
/// that waits for room in the channel to the reader — for the consumer —
/// and then reads in one blocking call ([`read_some`]) as many
/// [`CHUNK_SIZE`] chunks as there is room for.
///
/// No blocking thread ever waits for the consumer: a blocking call reads
/// a chunk only into a slot already reserved in the channel and returns
/// as soon as the channel is full (or after [`MAX_CHUNKS_PER_CALL`]
/// chunks); the waiting is done here, in async code. A reader whose
/// consumer stalls thus holds no blocking thread, only the chunks in the
/// channel ([`READ_AHEAD_CHUNKS`]). The task ends when the range is read,
/// a read fails (the error is the last thing sent) or the reader is
/// dropped (the file is then closed on a blocking thread).
async fn read_ahead(mut state: ReadAhead, mut tx: mpsc::Sender<io::Result<Vec<u8>>>) {
    loop {
        let Ok(permit) = tx.reserve_owned().await else {
            close_off_runtime(state.file);
            return; // Reader dropped.
        };
        match tokio::task::spawn_blocking(move || read_some(state, permit)).await {
            Ok(Some((s, t))) => (state, tx) = (s, t),
            // Done, failed (the error is sent) or reader dropped; a panic
            // drops the sender early, which the reader reports.
            Ok(None) | Err(_) => return,
        }
    }
}

/// One blocking call of [`read_ahead`]: reads chunks into reserved slots
/// of the channel — the first into `permit`, each further one only if a
/// slot is free at once — hashing each (for a whole-file read) right after
/// reading it. Returns the state and the sender when more is to be read;
/// `None` when done (digest sent), failed (error sent) or the reader is
/// gone. The file is closed here, on the blocking thread, when done.
///
/// Chunks are `Vec`s the consumer hands back through `recycled` once it
/// has copied them out; they are read into again, so a read allocates
/// (and initialises) only the few buffers in flight at once, and fresh
/// ones are read into without zero-filling them first ([`fill_chunk`]).
fn read_some(
    mut state: ReadAhead,
    mut permit: mpsc::OwnedPermit<io::Result<Vec<u8>>>,
) -> Option<(ReadAhead, mpsc::Sender<io::Result<Vec<u8>>>)> {
    let mut chunks_left = MAX_CHUNKS_PER_CALL;
    loop {
        let n = state.remaining.min(CHUNK_SIZE as u64) as usize;
        let chunk = fill_chunk(&mut state.file, n, state.recycled.try_recv().ok());
        let chunk = match chunk {
            Ok(bytes) => {
                if let Some((h, _)) = state.hash.as_mut() {
                    h.update(&bytes);
                }
                bytes
            }
            Err(e) => {
                let e = io::Error::new(e.kind(), format!("reading {}: {e}", state.path.display()));
                permit.send(Err(e));
                return None;
            }
        };
        let tx = permit.send(Ok(chunk));
        state.remaining -= n as u64;
        if state.remaining == 0 {
            if let Some((h, digest)) = state.hash {
                // The reader may be gone already; then nobody awaits it.
                let _ = digest.send(Digest::from(h.finalize()));
            }
            return None;
        }
        chunks_left -= 1;
        if chunks_left == 0 {
            return Some((state, tx));
        }
        permit = match tx.try_reserve_owned() {
            Ok(p) => p,
            Err(mpsc::error::TrySendError::Full(tx)) => return Some((state, tx)),
            Err(mpsc::error::TrySendError::Closed(_)) => return None,
        };
    }
}

/// Closes `file` on a blocking thread (`close(2)` may wait on the server
/// on network file systems).
fn close_off_runtime(file: File) {
    drop(tokio::task::spawn_blocking(move || drop(file)));
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
