//! Slow clients: the per-connection activity the watchdog of `conn.rs`
//! reads ([`ConnState`]), and the wrappers that record it and enforce the
//! body read and write timeouts: the socket ([`TimedIo`]), the request
//! body ([`ReadTimeoutBody`]), the response body ([`GuardedBody`]) and the
//! service in front of the router ([`ConnService`]).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::{PeerInfo, ServerLimits};

/// The watchdog's decision.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Keep,
    Idle,
    HeaderTimeout,
    /// A response body handed a frame to the writer and was not asked for
    /// the next one for the write timeout: the peer stopped reading (over
    /// HTTP/2 the socket stays writable, flow control blocks the stream).
    WriteStalled,
}

/// Milliseconds on a coarse monotonic clock (`CLOCK_MONOTONIC_COARSE` on
/// Linux: the kernel's last tick, read from the vDSO without touching the
/// TSC; a few milliseconds of resolution, which the watchdog's
/// second-scale rules do not notice). The connection's activity is stamped
/// several times per request; a precise clock read each time cost
/// measurable CPU (ADR-056).
fn coarse_ms() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call.
        if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0 {
            return ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000;
        }
    }
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    EPOCH
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Per-connection activity, shared by the IO wrapper, the service wrapper
/// and the watchdog. Times are milliseconds since `start` on the coarse
/// clock ([`coarse_ms`]).
pub(super) struct ConnState {
    start: u64,
    /// Requests whose response body has not ended yet.
    in_flight: AtomicUsize,
    /// Requests started so far.
    requests: AtomicU64,
    /// When `in_flight` last dropped to zero (or the connection began).
    idle_since: AtomicU64,
    /// 1 + when the first byte arrived while no request was in flight
    /// (the next request's header is arriving); 0: none.
    header_since: AtomicU64,
    /// The connection speaks HTTP/2 (reads are PINGs, SETTINGS, ...: not
    /// the start of a request header).
    h2: AtomicBool,
    /// Per response body in flight: 1 + when it last handed a frame to the
    /// writer without being polled since; 0 when it is being polled or
    /// waits on its own source. A slot no body holds any more (only this
    /// list does) is reused by the next response, so a keep-alive
    /// connection allocates none per request.
    responses: std::sync::Mutex<Vec<Arc<AtomicU64>>>,
}

impl ConnState {
    pub(super) fn new() -> Self {
        ConnState {
            start: coarse_ms(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            header_since: AtomicU64::new(0),
            h2: AtomicBool::new(false),
            responses: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        coarse_ms().saturating_sub(self.start)
    }

    /// The connection is ready for its first request (after the TLS
    /// handshake).
    pub(super) fn restart_clock(&self) {
        self.idle_since.store(self.now_ms(), Ordering::SeqCst);
        self.header_since.store(0, Ordering::SeqCst);
    }

    fn on_read(&self) {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            let _ = self.header_since.compare_exchange(
                0,
                self.now_ms() + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }

    fn begin(self: &Arc<Self>, version: hyper::Version) -> RequestGuard {
        if version == hyper::Version::HTTP_2 {
            self.h2.store(true, Ordering::SeqCst);
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.requests.fetch_add(1, Ordering::SeqCst);
        self.header_since.store(0, Ordering::SeqCst);
        RequestGuard(self.clone())
    }

    /// Registers a response body's stall clock.
    fn track_response(&self) -> Arc<AtomicU64> {
        let mut responses = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(free) = responses.iter().find(|c| Arc::strong_count(c) == 1) {
            free.store(0, Ordering::SeqCst);
            return free.clone();
        }
        // Beyond a few free slots (after a burst of HTTP/2 streams) the
        // unused ones are dropped.
        let mut free = 0;
        responses.retain(|c| {
            Arc::strong_count(c) > 1 || {
                free += 1;
                free <= 4
            }
        });
        let clock = Arc::new(AtomicU64::new(0));
        responses.push(clock.clone());
        clock
    }

    pub(super) fn verdict(&self, limits: &ServerLimits) -> Verdict {
        let now = self.now_ms();
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            let write_ms = limits.write_timeout.as_millis() as u64;
            let responses = self.responses.lock().unwrap_or_else(|p| p.into_inner());
            // A free slot (only this list holds it) is no response.
            let stalled = responses.iter().any(|c| {
                let handed = c.load(Ordering::SeqCst);
                let held = Arc::strong_count(c) > 1;
                held && handed != 0 && now >= handed - 1 + write_ms
            });
            return if stalled {
                Verdict::WriteStalled
            } else {
                Verdict::Keep
            };
        }
        let header_ms = limits.header_read_timeout.as_millis() as u64;
        let idle_ms = limits.idle_timeout.as_millis() as u64;
        let idle_since = self.idle_since.load(Ordering::SeqCst);
        if self.requests.load(Ordering::SeqCst) == 0 {
            // A new connection must start a request promptly, whatever
            // protocol it speaks.
            return if now >= idle_since + header_ms {
                Verdict::HeaderTimeout
            } else {
                Verdict::Keep
            };
        }
        if !self.h2.load(Ordering::SeqCst) {
            let header_since = self.header_since.load(Ordering::SeqCst);
            if header_since != 0 {
                return if now >= header_since - 1 + header_ms {
                    Verdict::HeaderTimeout
                } else {
                    Verdict::Keep
                };
            }
        }
        if now >= idle_since + idle_ms {
            Verdict::Idle
        } else {
            Verdict::Keep
        }
    }
}

/// A request in flight; ends when its response body ends or is dropped.
struct RequestGuard(Arc<ConnState>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let s = &self.0;
        if s.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            s.idle_since.store(s.now_ms(), Ordering::SeqCst);
            s.header_since.store(0, Ordering::SeqCst);
        }
    }
}

/// The service hyper calls: peer info, body read timeout and in-flight
/// accounting around the router.
#[derive(Clone)]
pub(super) struct ConnService {
    pub(super) app: Router,
    pub(super) peer: Arc<PeerInfo>,
    pub(super) state: Arc<ConnState>,
    pub(super) body_timeout: Duration,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<GuardedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let guard = self.state.begin(req.version());
        let (mut parts, body) = req.into_parts();
        parts.extensions.insert((*self.peer).clone());
        let body = Body::new(ReadTimeoutBody::new(body, self.body_timeout));
        let req = Request::from_parts(parts, body);
        let mut app = self.app.clone();
        Box::pin(async move {
            use tower_service::Service;
            let resp =
                match std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut app, cx))
                    .await
                {
                    Ok(()) => app.call(req).await,
                    Err(e) => Err(e),
                };
            let resp = match resp {
                Ok(r) => r,
                Err(never) => match never {},
            };
            let handed = guard.0.track_response();
            Ok(resp.map(|inner| GuardedBody {
                inner,
                guard: Some(guard),
                handed,
            }))
        })
    }
}

/// A response body that keeps its request counted as in flight until it
/// ends or is dropped, and tells the watchdog how long the writer has not
/// asked for the next frame.
pub(super) struct GuardedBody {
    inner: Body,
    guard: Option<RequestGuard>,
    handed: Arc<AtomicU64>,
}

impl HttpBody for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        this.handed.store(0, Ordering::SeqCst);
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.guard = None,
            Poll::Ready(Some(Ok(_))) => {
                if let Some(g) = &this.guard {
                    this.handed.store(g.0.now_ms() + 1, Ordering::SeqCst);
                }
            }
            Poll::Pending => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The error of a request body that delivered nothing for the body read
/// timeout.
#[derive(Debug)]
struct BodyReadTimeout(Duration);

impl std::fmt::Display for BodyReadTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no data received for {:?} (body read timeout)", self.0)
    }
}

impl std::error::Error for BodyReadTimeout {}

/// A request body that fails when no frame arrives for `timeout` while it
/// is being read.
struct ReadTimeoutBody {
    inner: Incoming,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    armed: bool,
    failed: bool,
}

impl ReadTimeoutBody {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        ReadTimeoutBody {
            inner,
            timeout,
            sleep: None,
            armed: false,
            failed: false,
        }
    }
}

impl HttpBody for ReadTimeoutBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.failed {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                this.armed = false;
                Poll::Ready(r.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let deadline = Instant::now() + this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if !this.armed {
                    sleep.as_mut().reset(deadline);
                    this.armed = true;
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    this.failed = true;
                    return Poll::Ready(Some(Err(Box::new(BodyReadTimeout(this.timeout)))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The socket under TLS and HTTP: records reads for the watchdog and fails
/// a write (or flush) that stays pending without progress for
/// `write_timeout`.
pub(super) struct TimedIo {
    inner: TcpStream,
    state: Arc<ConnState>,
    write_timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl TimedIo {
    pub(super) fn new(inner: TcpStream, state: Arc<ConnState>, write_timeout: Duration) -> Self {
        TimedIo {
            inner,
            state,
            write_timeout,
            sleep: None,
            armed: false,
        }
    }

    /// After the inner write returned `r`: progress disarms the timer, a
    /// pending write arms it (once) and fails when it fires.
    fn check_write<T>(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(r) => {
                self.armed = false;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let deadline = Instant::now() + self.write_timeout;
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if !self.armed {
                    sleep.as_mut().reset(deadline);
                    self.armed = true;
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "write made no progress for {:?} (write timeout)",
                            self.write_timeout
                        ),
                    )));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.on_read();
        }
        r
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, data);
        this.check_write(cx, r)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check_write(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.check_write(cx, r)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check_write(cx, r)
    }
}
