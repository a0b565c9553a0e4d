//! Reads: one (ranged) GET, drained by a read-ahead task into owned chunks
//! ([`BlobReader::from_chunks`]: read as bytes, or taken as they are by a
//! consumer that forwards them, TUNING.md §response-chunks). For a whole-object read the task
//! also hashes each chunk before handing it over, overlapping the BLAKE3
//! work of a verified get with the consumer's
//! (the `digest` of [`store_types::BlobReader::Chunks`]).
//!
//! No blocking thread ever waits for the consumer: a body streamed from a
//! service is forwarded by an async task, and a local file
//! ([`GetResultPayload::File`]) is read by an async task in short blocking
//! calls, each filling only the room already free in the channel to the
//! reader, so a reader whose consumer stalls (a slow or stopped HTTP
//! client) holds no blocking-pool thread while it waits.

use std::io::{self, Read, Seek, SeekFrom};
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use object_store::path::Path;
use object_store::{GetOptions, GetResultPayload};
use store_types::{BlobReader, Digest, Result, CHUNK_SIZE};
use tokio::sync::{mpsc, oneshot};

use crate::error::backend_err;
use crate::Inner;

/// Chunks read ahead of the consumer.
const READ_AHEAD_CHUNKS: usize = 4;

impl Inner {
    /// Reads `range` of the object at `path` (all of it when `None`);
    /// `None` when there is no such object. A streamed whole-object read
    /// carries the read-ahead task's digest of the bytes it yields.
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
        let whole = range.is_none();
        let opts = GetOptions::new().with_range(range);
        let got = match self.store.get_opts(path, opts).await {
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
        let (digest_rx, tx) = if whole {
            let (digest_tx, digest_rx) = oneshot::channel();
            (Some(digest_rx), ChunkSender::hashing(tx, digest_tx))
        } else {
            (None, ChunkSender::plain(tx))
        };
        let start = got.range.start;
        match got.payload {
            GetResultPayload::File(file, fs_path) => {
                tokio::spawn(read_file(file, fs_path, start, len, tx));
            }
            GetResultPayload::Stream(stream) => {
                let path = path.clone();
                tokio::spawn(forward_stream(stream, path, tx));
            }
        }
        Ok(Some(BlobReader::from_chunks(len, rx, digest_rx)))
    }
}

/// The read-ahead task's end of the chunk channel; for a whole-object
/// read it also hashes every chunk it sends, and sends the digest of them
/// all when [`ChunkSender::finish`]ed.
struct ChunkSender {
    tx: mpsc::Sender<io::Result<Bytes>>,
    hash: Option<(blake3::Hasher, oneshot::Sender<Digest>)>,
}

impl ChunkSender {
    fn plain(tx: mpsc::Sender<io::Result<Bytes>>) -> Self {
        ChunkSender { tx, hash: None }
    }

    fn hashing(tx: mpsc::Sender<io::Result<Bytes>>, digest: oneshot::Sender<Digest>) -> Self {
        ChunkSender {
            tx,
            hash: Some((blake3::Hasher::new(), digest)),
        }
    }

    /// Hashes a chunk (when hashing) and returns what to send.
    fn hash(&mut self, chunk: io::Result<Bytes>) -> io::Result<Bytes> {
        if let (Ok(bytes), Some((h, _))) = (&chunk, self.hash.as_mut()) {
            h.update(bytes);
        }
        chunk
    }

    /// Sends a chunk; false when the reader is gone.
    async fn send(&mut self, chunk: io::Result<Bytes>) -> bool {
        let chunk = self.hash(chunk);
        self.tx.send(chunk).await.is_ok()
    }

    /// After the last chunk: sends the digest of all chunks sent (when
    /// hashing). Not called after an error: the dropped digest sender
    /// then tells the facade no digest is coming.
    fn finish(self) {
        if let Some((h, digest)) = self.hash {
            let _ = digest.send(Digest::from(h.finalize()));
        }
    }
}

/// Most chunks one blocking call of [`read_file`] reads (4 MiB).
const MAX_CHUNKS_PER_CALL: usize = 16;

/// What [`read_file`] carries from one blocking call to the next.
struct FileRead {
    file: std::fs::File,
    fs_path: std::path::PathBuf,
    /// Where to seek before the first read.
    start: Option<u64>,
    /// Bytes still to read.
    remaining: u64,
    hash: Option<(blake3::Hasher, oneshot::Sender<Digest>)>,
}

type ChunkTx = mpsc::Sender<io::Result<Bytes>>;

/// Reads `len` bytes of a local file from `start`, in [`CHUNK_SIZE`]
/// chunks, until done or the reader is gone: an async task that waits for
/// room in the channel (for the consumer) and then reads, in one blocking
/// call ([`read_file_some`]), as many chunks as there is room for. No
/// blocking thread waits for the consumer.
async fn read_file(
    file: std::fs::File,
    fs_path: std::path::PathBuf,
    start: u64,
    len: u64,
    tx: ChunkSender,
) {
    let ChunkSender { mut tx, hash } = tx;
    let mut state = FileRead {
        file,
        fs_path,
        start: Some(start),
        remaining: len,
        hash,
    };
    loop {
        let Ok(permit) = tx.reserve_owned().await else {
            let file = state.file;
            drop(tokio::task::spawn_blocking(move || drop(file)));
            return; // Reader dropped; the file is closed off the runtime.
        };
        match tokio::task::spawn_blocking(move || read_file_some(state, permit)).await {
            Ok(Some((s, t))) => (state, tx) = (s, t),
            // Done, failed (the error is sent) or reader dropped; a panic
            // drops the sender early, which the reader reports.
            Ok(None) | Err(_) => return,
        }
    }
}

/// One blocking call of [`read_file`]: reads chunks into reserved slots of
/// the channel — the first into `permit`, each further one only if a slot
/// is free at once, at most [`MAX_CHUNKS_PER_CALL`] — hashing each when
/// hashing. Returns the state and the sender when more is to be read;
/// `None` when done (digest sent), failed (error sent: no digest) or the
/// reader is gone.
fn read_file_some(
    mut state: FileRead,
    mut permit: mpsc::OwnedPermit<io::Result<Bytes>>,
) -> Option<(FileRead, ChunkTx)> {
    let path = state.fs_path.clone();
    let err = |e: io::Error| io::Error::new(e.kind(), format!("reading {}: {e}", path.display()));
    if let Some(start) = state.start.take() {
        if let Err(e) = state.file.seek(SeekFrom::Start(start)) {
            permit.send(Err(err(e)));
            return None;
        }
    }
    let mut chunks_left = MAX_CHUNKS_PER_CALL;
    loop {
        let n = state.remaining.min(CHUNK_SIZE as u64) as usize;
        let chunk = match read_chunk(&mut state.file, n) {
            Ok(chunk) => chunk,
            Err(e) => {
                permit.send(Err(err(e)));
                return None;
            }
        };
        if let Some((h, _)) = state.hash.as_mut() {
            h.update(&chunk);
        }
        let tx = permit.send(Ok(chunk));
        state.remaining -= n as u64;
        if state.remaining == 0 {
            ChunkSender {
                tx,
                hash: state.hash,
            }
            .finish();
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

/// Reads exactly `n` bytes into a new buffer without zero-filling it
/// first (std reads a `File` into a `Vec`'s spare capacity uninitialised);
/// a file that ends early is an error.
fn read_chunk(file: &mut std::fs::File, n: usize) -> io::Result<Bytes> {
    let mut buf = Vec::with_capacity(n);
    file.take(n as u64).read_to_end(&mut buf)?;
    if buf.len() < n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "object file is shorter than its size",
        ));
    }
    Ok(Bytes::from(buf))
}

/// Drains a GET body into `tx`, coalescing small frames into
/// [`CHUNK_SIZE`] chunks.
async fn forward_stream(
    mut stream: futures::stream::BoxStream<'static, object_store::Result<Bytes>>,
    path: Path,
    mut tx: ChunkSender,
) {
    let mut buf = BytesMut::new();
    loop {
        match stream.next().await {
            Some(Ok(frame)) => {
                if buf.is_empty() && frame.len() >= CHUNK_SIZE {
                    if !tx.send(Ok(frame)).await {
                        return;
                    }
                    continue;
                }
                buf.extend_from_slice(&frame);
                if buf.len() >= CHUNK_SIZE && !tx.send(Ok(buf.split().freeze())).await {
                    return;
                }
            }
            Some(Err(e)) => {
                let e = backend_err("reading", &path, e);
                tx.send(Err(e.into())).await;
                return;
            }
            None => {
                if !buf.is_empty() && !tx.send(Ok(buf.freeze())).await {
                    return;
                }
                tx.finish();
                return;
            }
        }
    }
}
