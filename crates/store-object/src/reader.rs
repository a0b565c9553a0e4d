//! Reads: one (ranged) GET, drained by a read-ahead task into an
//! [`AsyncRead`] adapter.

use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetResultPayload};
use store_types::{BlobReader, Result, CHUNK_SIZE};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

use crate::retry::backend_err;
use crate::Inner;

/// Chunks read ahead of the consumer.
const READ_AHEAD_CHUNKS: usize = 4;

impl Inner {
    /// Reads `range` of the object at `path` (all of it when `None`);
    /// `None` when there is no such object.
    pub(crate) async fn open_reader(
        &self,
        path: &Path,
        range: Option<Range<u64>>,
    ) -> Result<Option<BlobReader>> {
        if let Some(r) = &range {
            if r.start >= r.end {
                // An empty range is no valid HTTP range: just check presence.
                return Ok(self
                    .exists(path)
                    .await?
                    .then(|| BlobReader::from_bytes(Bytes::new())));
            }
        }
        let opts = GetOptions::new().with_range(range);
        let got = match self
            .retry("reading", path, || self.store.get_opts(path, opts.clone()))
            .await
        {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(backend_err("reading", path, e)),
        };
        let len = got.range.end - got.range.start;
        if len <= CHUNK_SIZE as u64 {
            let bytes = got
                .bytes()
                .await
                .map_err(|e| backend_err("reading", path, e))?;
            return Ok(Some(BlobReader::from_bytes(bytes)));
        }
        let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
        let start = got.range.start;
        match got.payload {
            GetResultPayload::File(file, fs_path) => {
                tokio::task::spawn_blocking(move || read_file(file, &fs_path, start, len, tx));
            }
            GetResultPayload::Stream(stream) => {
                let path = path.clone();
                tokio::spawn(forward_stream(stream, path, tx));
            }
        }
        Ok(Some(BlobReader {
            len,
            reader: Box::pin(ChunkReader {
                rx,
                current: Bytes::new(),
                remaining: len,
            }),
        }))
    }
}

/// Reads `len` bytes of a local file from `start`, in [`CHUNK_SIZE`]
/// chunks, until done or the reader is gone.
fn read_file(
    mut file: std::fs::File,
    fs_path: &std::path::Path,
    start: u64,
    len: u64,
    tx: mpsc::Sender<io::Result<Bytes>>,
) {
    let err =
        |e: io::Error| io::Error::new(e.kind(), format!("reading {}: {e}", fs_path.display()));
    if let Err(e) = file.seek(SeekFrom::Start(start)) {
        let _ = tx.blocking_send(Err(err(e)));
        return;
    }
    let mut remaining = len;
    while remaining > 0 {
        let n = remaining.min(CHUNK_SIZE as u64) as usize;
        let mut buf = vec![0u8; n];
        let chunk = file
            .read_exact(&mut buf)
            .map(|()| Bytes::from(buf))
            .map_err(err);
        let failed = chunk.is_err();
        if tx.blocking_send(chunk).is_err() || failed {
            return;
        }
        remaining -= n as u64;
    }
}

/// Drains a GET body into `tx`, coalescing small frames into
/// [`CHUNK_SIZE`] chunks.
async fn forward_stream(
    mut stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    path: Path,
    tx: mpsc::Sender<io::Result<Bytes>>,
) {
    let mut buf = BytesMut::new();
    loop {
        match stream.next().await {
            Some(Ok(frame)) => {
                if buf.is_empty() && frame.len() >= CHUNK_SIZE {
                    if tx.send(Ok(frame)).await.is_err() {
                        return;
                    }
                    continue;
                }
                buf.extend_from_slice(&frame);
                if buf.len() >= CHUNK_SIZE && tx.send(Ok(buf.split().freeze())).await.is_err() {
                    return;
                }
            }
            Some(Err(e)) => {
                let e = backend_err("reading", &path, e);
                let _ = tx.send(Err(e.into())).await;
                return;
            }
            None => {
                if !buf.is_empty() {
                    let _ = tx.send(Ok(buf.freeze())).await;
                }
                return;
            }
        }
    }
}

/// [`AsyncRead`] over the chunks of a read-ahead task.
struct ChunkReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    /// The unread rest of the current chunk.
    current: Bytes,
    /// Bytes still expected, to tell a complete read from one cut short.
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
                    if chunk.len() as u64 > self.remaining {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "object store returned more bytes than the object's size",
                        )));
                    }
                    self.remaining -= chunk.len() as u64;
                    self.current = chunk;
                }
                Some(Err(e)) => return Poll::Ready(Err(e)),
                None if self.remaining == 0 => return Poll::Ready(Ok(())),
                None => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "object store read ended early",
                    )))
                }
            }
        }
    }
}
