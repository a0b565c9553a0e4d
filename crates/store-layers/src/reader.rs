//! The forwarding base of a [`BlobReader`]'s byte stream: a layer that
//! wants to see (or fault) the bytes of a read wraps the reader it got
//! from `read` / `read_range` with [`wrap_reader`].

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use store_types::BlobReader;
use tokio::io::{AsyncRead, ReadBuf};

/// What a [`ReadHook`] wants the next read to do.
#[derive(Debug)]
pub enum ReadStep {
    /// Read from the inner stream, at most this many bytes.
    Forward(usize),
    /// End the stream here (the reader reports EOF without reading).
    Eof,
    /// Fail the read with this error.
    Fail(io::Error),
}

/// Observes or changes a reader's stream, one `poll_read` at a time.
///
/// # Contract
///
/// `offset` is the number of bytes the wrapped reader has yielded so far.
/// `before` is called once per `poll_read` that reaches the hook (also
/// again after a `Pending`); `after` once per completed inner read, with
/// the bytes it yielded (0 at EOF) or the error it failed with. Hooks run
/// inside `poll_read`: they must not block.
pub trait ReadHook: Send + 'static {
    /// Decides what the next read does. The default forwards `want`.
    fn before(&mut self, offset: u64, want: usize) -> ReadStep {
        let _ = offset;
        ReadStep::Forward(want)
    }

    /// Sees the outcome of one inner read.
    fn after(&mut self, offset: u64, outcome: Result<usize, &io::Error>) {
        let _ = (offset, outcome);
    }
}

/// A reader that forwards to an inner stream through a [`ReadHook`].
pub struct HookedReader<H> {
    inner: Pin<Box<dyn AsyncRead + Send>>,
    hook: H,
    offset: u64,
}

impl<H: ReadHook> HookedReader<H> {
    /// Wraps `inner`.
    pub fn new(inner: Pin<Box<dyn AsyncRead + Send>>, hook: H) -> Self {
        HookedReader {
            inner,
            hook,
            offset: 0,
        }
    }
}

/// Wraps `reader`'s stream in `hook`, keeping its length and its engine
/// digest (a hook that ends the stream early or fails it makes a verified
/// read fail: the facade counts the bytes and compares the digest).
pub fn wrap_reader(reader: BlobReader, hook: impl ReadHook + Unpin) -> BlobReader {
    // Always a stream: the hook sees every byte, never bypassed.
    reader.wrap(|inner| Box::pin(HookedReader::new(inner, hook)))
}

#[deny(clippy::missing_trait_methods)]
impl<H: ReadHook + Unpin> AsyncRead for HookedReader<H> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let want = buf.remaining();
        let limit = match this.hook.before(this.offset, want) {
            ReadStep::Forward(n) => n.min(want),
            ReadStep::Eof => return Poll::Ready(Ok(())),
            ReadStep::Fail(e) => return Poll::Ready(Err(e)),
        };
        let polled = if limit == want {
            let before = buf.filled().len();
            match this.inner.as_mut().poll_read(cx, buf) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(buf.filled().len() - before)),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        } else {
            // Read into a window of `limit` bytes of the caller's buffer.
            let window = buf.initialize_unfilled_to(limit);
            let mut sub = ReadBuf::new(window);
            match this.inner.as_mut().poll_read(cx, &mut sub) {
                Poll::Ready(Ok(())) => {
                    let n = sub.filled().len();
                    buf.advance(n);
                    Poll::Ready(Ok(n))
                }
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        };
        match polled {
            Poll::Ready(Ok(n)) => {
                this.hook.after(this.offset, Ok(n));
                this.offset += n as u64;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => {
                this.hook.after(this.offset, Err(&e));
                Poll::Ready(Err(e))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
