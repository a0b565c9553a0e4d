//! Request and response body adapters: streaming uploads into the store,
//! bounded JSON bodies, and blob responses that fail visibly.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt, TryStreamExt};
use store_core::{Blob, Error};
use tokio_util::io::StreamReader;

use store_ops::bao::ChunkStream;
use store_ops::Ops;
use store_ops::{ErrorCode, OpsError};

/// The engines' read-ahead chunk: the most [`Blob::next_chunk`] copies per
/// chunk, and the largest response read whole before its head
/// ([`BUFFERED_MAX`]). Streamed bodies send the chunks as they come (an
/// engine's own, which may be larger).
const RESPONSE_CHUNK: usize = store_types::CHUNK_SIZE;

/// How much of an oversized `/v1/have` body is read and discarded before
/// answering `too_many`, so that ordinary clients (which write the whole
/// body before reading the answer) see the error instead of a reset
/// connection. Beyond it the connection is closed after the answer.
const HAVE_DRAIN_CAP: u64 = 256 << 20;

/// Largest `/v1/have` body accepted for `max_digests` digests: 80 bytes per
/// digest (a quoted 64-hex string, a comma, some whitespace) plus 4 KiB for
/// the rest.
pub fn have_body_limit(max_digests: usize) -> usize {
    4096usize.saturating_add(max_digests.saturating_mul(80))
}

/// The request body as an `AsyncRead`, plus a flag set when the body
/// failed (client gone, body shorter than `Content-Length`, ...).
pub(crate) fn body_reader(
    body: Body,
) -> (
    StreamReader<impl Stream<Item = io::Result<Bytes>> + Send + Unpin, Bytes>,
    Arc<AtomicBool>,
) {
    let failed = Arc::new(AtomicBool::new(false));
    let flag = failed.clone();
    let stream = body.into_data_stream().map_err(move |e| {
        flag.store(true, Ordering::SeqCst);
        io::Error::other(format!("request body: {e}"))
    });
    (StreamReader::new(stream), failed)
}

/// Reads a small body whole, failing with `too_many` past `limit` bytes.
pub(crate) async fn read_limited(
    body: Body,
    limit: usize,
    max_digests: usize,
) -> Result<Bytes, OpsError> {
    let mut stream = body.into_data_stream();
    let mut buf = BytesMut::new();
    let mut total: u64 = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| OpsError::new(ErrorCode::IncompleteBody, format!("request body: {e}")))?;
        total += chunk.len() as u64;
        if total > limit as u64 {
            if total > HAVE_DRAIN_CAP {
                break;
            }
            continue;
        }
        buf.extend_from_slice(&chunk);
    }
    if total > limit as u64 {
        return Err(OpsError::new(
            ErrorCode::TooMany,
            format!(
                "request body exceeds {limit} bytes; a have request lists at most {max_digests} digests"
            ),
        ));
    }
    Ok(buf.freeze())
}

/// Largest blob response (a whole entry or a range) that is read and
/// verified whole before its head is sent: one response chunk.
pub(crate) const BUFFERED_MAX: u64 = RESPONSE_CHUNK as u64;

/// A small blob response body (at most [`BUFFERED_MAX`] bytes), read and
/// verified before the head: sent as one buffer (no chunk stream, no
/// 128 KiB read buffer per response), and a corrupt entry is an error the
/// caller answers with a status (`verification`, 422) instead of a response
/// cut short.
///
/// Cancel-safe: it only reads.
pub(crate) async fn buffered_body(blob: Blob, ops: &Ops) -> Result<Body, OpsError> {
    let bytes = blob.bytes().await?;
    ops.metrics().get_bytes(bytes.len() as u64);
    Ok(Body::from(bytes))
}

/// A blob response body, streamed (larger ones than [`BUFFERED_MAX`]): the
/// blob's chunks as [`Blob::next_chunk`] gives them — the engine's own
/// read-ahead buffers where it has them, with no copy (TUNING.md §response-chunks).
///
/// Every chunk but the last goes out as soon as it comes; the last (the
/// one that brings the count to [`Blob::len`]) is held back until the
/// next read returns the verdict, so a failure at EOF — a verified read
/// whose bytes do not hash to the digest — withholds it and aborts the
/// response: a client framing by `Content-Length` sees a short body and a
/// closed connection, never a complete response with bad bytes.
///
/// At most one chunk it yielded is alive at a time ([`InFlight`]): the
/// next is read only once the transport has written (and dropped) the
/// previous one, so a client that stops reading holds one chunk of the
/// response in this process, not the transport's whole write queue
/// (ADR-057).
pub(crate) fn blob_body(blob: Blob, ops: Ops) -> Body {
    let total = blob.len();
    let flight = Arc::new(InFlight::default());
    type State = Option<(Blob, u64, Arc<InFlight>, Ops)>;
    let init: State = Some((blob, 0, flight, ops));
    let stream = futures::stream::unfold(init, move |state| async move {
        let (mut blob, mut sent, flight, ops) = state?;
        std::future::poll_fn(|cx| flight.poll_room(cx)).await;
        let chunk = match blob.next_chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return None,
            Err(e) => return Some((Err(abort(e, &ops)), None)),
        };
        sent += chunk.len() as u64;
        if sent >= total {
            // The last one: out only after the verdict.
            match blob.next_chunk().await {
                Ok(None) => {}
                Ok(Some(_)) => {
                    let e = io::Error::other("a blob read yielded more bytes than its length");
                    return Some((Err(abort(e, &ops)), None));
                }
                Err(e) => return Some((Err(abort(e, &ops)), None)),
            }
        }
        ops.metrics().get_bytes(chunk.len() as u64);
        let chunk = flight.track(chunk);
        let next = (sent < total).then_some((blob, sent, flight, ops));
        Some((Ok(chunk), next))
    });
    Body::from_stream(stream)
}

/// Counts and logs a blob response's failure; the error that aborts it.
fn abort(e: io::Error, ops: &Ops) -> io::Error {
    let err = Error::from(e);
    let code = OpsError::from(err.clone()).code;
    ops.metrics().error(code);
    tracing::warn!("aborting a blob response: {err}");
    io::Error::from(err)
}

/// Whether a chunk a response body yielded is still alive (queued or
/// being written by the transport), and who to wake when it is dropped.
#[derive(Default)]
struct InFlight {
    alive: AtomicBool,
    waker: futures::task::AtomicWaker,
}

impl InFlight {
    /// Ready once no yielded chunk is alive.
    fn poll_room(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        if !self.alive.load(Ordering::Acquire) {
            return std::task::Poll::Ready(());
        }
        self.waker.register(cx.waker());
        if self.alive.load(Ordering::Acquire) {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    }

    /// `chunk`, marked alive until its last handle is dropped.
    fn track(self: &Arc<Self>, chunk: Bytes) -> Bytes {
        self.alive.store(true, Ordering::Release);
        Bytes::from_owner(Tracked {
            chunk,
            flight: self.clone(),
        })
    }
}

/// A yielded chunk; dropping it lets the body read the next one.
struct Tracked {
    chunk: Bytes,
    flight: Arc<InFlight>,
}

impl AsRef<[u8]> for Tracked {
    fn as_ref(&self) -> &[u8] {
        &self.chunk
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // The chunk's bytes go first (an engine's buffer back to its read).
        self.chunk = Bytes::new();
        self.flight.alive.store(false, Ordering::Release);
        self.flight.waker.wake();
    }
}

/// How long a failing bao response waits, after its last good chunk,
/// before aborting: the transport gets to flush what it was handed, so the
/// client holds every byte up to the failing group (and a client asking
/// about the cut finds the corrupt group where the stream stopped).
const BAO_ABORT_GRACE: std::time::Duration = std::time::Duration::from_millis(20);

/// A bao response body ([`store_ops::Ops::get_bao`]): the encoder's chunks as
/// they come; its error (a group failing verification mid-stream, a
/// backend error) is counted, logged and passed on after
/// [`BAO_ABORT_GRACE`], so the response is aborted and a client never sees
/// a clean end of a stream that is not whole. (Unlike [`blob_body`]
/// nothing needs holding back: a client checks every chunk group of a bao
/// stream on its own.)
pub(crate) fn bao_body(stream: ChunkStream, ops: Ops) -> Body {
    let stream = stream.then(move |item| {
        let ops = ops.clone();
        async move {
            match item {
                Ok(chunk) => {
                    ops.metrics().get_bytes(chunk.len() as u64);
                    Ok(chunk)
                }
                Err(e) => {
                    let err = Error::from_io("bao stream", e);
                    let code = OpsError::from(err.clone()).code;
                    ops.metrics().error(code);
                    tracing::warn!("aborting a bao response: {err}");
                    tokio::time::sleep(BAO_ABORT_GRACE).await;
                    Err(io::Error::from(err))
                }
            }
        }
    });
    Body::from_stream(stream)
}
