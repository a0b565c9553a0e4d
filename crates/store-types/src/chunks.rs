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
/// The bytes come from an engine's read-ahead task over a channel; an
/// `Err` item ends the read with that error (later calls fail with its kind
/// and message), and a channel that closes
/// before `len` bytes arrived ends it with `UnexpectedEof` (the task died).
/// Cloning shares the position. Only one consumer reads at a time (a
/// `Blob` owns both views), so the lock is never contended.
#[derive(Clone)]
pub struct Chunks {
    state: Arc<Mutex<State>>,
}

struct State {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    /// The unread part of the chunk the byte view is in.
    current: Bytes,
    /// Bytes still expected from the channel.
    remaining: u64,
    /// Set once the end or an error was reported: later polls answer the
    /// end, or an error of the same kind and message.
    done: Option<Result<(), (io::ErrorKind, String)>>,
}

impl Chunks {
    /// Chunks of a read of `len` bytes in all, sent on `rx`.
    pub fn new(len: u64, rx: mpsc::Receiver<io::Result<Bytes>>) -> Self {
        Chunks {
            state: Arc::new(Mutex::new(State {
                rx,
                current: Bytes::new(),
                remaining: len,
                done: None,
            })),
        }
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
            match ready!(self.rx.poll_recv(cx)) {
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

    #[tokio::test]
    async fn a_channel_closed_before_len_bytes_is_an_early_end() {
        let c = chunks(&[b"abc"], 10);
        assert_eq!(c.next_chunk().await.unwrap().unwrap(), &b"abc"[..]);
        let e = c.next_chunk().await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        // And it stays failed, for either view.
        let e = c.reader().read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
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
