//! Reads: one blocking call for a read of at most one chunk, else a
//! blocking read-ahead task feeding an [`AsyncRead`] adapter.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use store_types::{BlobReader, Error, Result, CHUNK_SIZE};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{mpsc, oneshot};

use crate::fsio::{blocking, io_err, is_absent};

/// Chunks read ahead of the consumer.
const READ_AHEAD_CHUNKS: usize = 2;

/// What the opening half of a read reports.
enum Opened {
    /// The wanted bytes fit in one chunk and were read at once.
    Inline(Bytes),
    /// The read-ahead task streams `len` bytes through `rx`.
    Streaming {
        len: u64,
        rx: mpsc::Receiver<io::Result<Bytes>>,
    },
}

/// Opens `path` and reads `range` of it (the whole file when `None`).
///
/// A range of at most [`CHUNK_SIZE`] bytes is one blocking call (open,
/// `fstat`, `pread`) returning the bytes. Otherwise one blocking task
/// opens the file, reports, and — when more than one chunk is wanted —
/// keeps reading ahead in [`CHUNK_SIZE`] chunks until the range is done or
/// the reader is dropped; a whole file of at most one chunk is read at once
/// by that same task. Returns `None` when the file is absent.
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
        Opened::Streaming { len, rx } => BlobReader {
            len,
            reader: Box::pin(ChunkReader {
                rx,
                current: Bytes::new(),
                remaining: len,
            }),
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
fn read_task(
    path: PathBuf,
    range: Option<Range<u64>>,
    ready: oneshot::Sender<Result<Option<Opened>>>,
) {
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
    if ready.send(Ok(Some(Opened::Streaming { len, rx }))).is_err() {
        return;
    }
    let mut remaining = len;
    while remaining > 0 {
        let n = remaining.min(CHUNK_SIZE as u64) as usize;
        let chunk = read_chunk(&mut file, n);
        let failed = chunk.is_err();
        if tx.blocking_send(chunk).is_err() || failed {
            return; // Reader dropped, or the error is delivered.
        }
        remaining -= n as u64;
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
    let mut buf = vec![0u8; n];
    file.read_exact(&mut buf).map_err(short_file)?;
    Ok(Bytes::from(buf))
}

/// [`AsyncRead`] over the chunks of a read-ahead task.
struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    /// The unread rest of the current chunk.
    current: Bytes,
    /// Bytes still expected from the task, to tell a complete read from a
    /// task that died early.
    remaining: u64,
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
            if !self.current.is_empty() {
                let n = self.current.len().min(buf.remaining());
                buf.put_slice(&self.current[..n]);
                self.current.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(self.rx.poll_recv(cx)) {
                Some(Ok(chunk)) => {
                    self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
                    self.current = chunk;
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None if self.remaining == 0 => return Poll::Ready(Ok(())),
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
