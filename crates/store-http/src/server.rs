//! The connection layer: accepting, TLS, per-connection timeouts, the
//! connection cap and the shutdown drain (docs/SERVER.md, Security).
//!
//! # Model
//!
//! [`serve_router`] runs one accept loop over a `TcpListener` and one task
//! per connection. Each connection task owns:
//!
//! - a **permit** of the connection cap ([`ServerLimits::max_connections`]).
//!   A connection accepted beyond the cap is handed to a short-lived task
//!   that writes a minimal `503` (`overloaded`, `Retry-After: 1`,
//!   `Connection: close`) and closes it; the accept loop never waits on it.
//! - an IO wrapper under TLS and HTTP that records read activity and fails
//!   a write that stays pending, without progress, for
//!   [`ServerLimits::write_timeout`] (a peer that stopped reading).
//! - the TLS handshake, bounded by [`ServerLimits::header_read_timeout`].
//! - a hyper connection (HTTP/1.1, and HTTP/2 via ALPN `h2` or cleartext
//!   prior knowledge when [`ServerLimits::http2_max_streams`] is set).
//! - a service wrapper in front of the router that inserts [`PeerInfo`] into
//!   each request, wraps the request body so that a body delivering no data
//!   for [`ServerLimits::body_read_timeout`] fails (the handlers answer
//!   `incomplete_body`; a put publishes nothing), and counts the request as
//!   in flight until its response body has been produced or dropped.
//! - a watchdog, woken a few times per timeout, that closes the connection
//!   when it has no request in flight and either (a) no first request has
//!   started within `header_read_timeout`, (b) over HTTP/1 the bytes of the
//!   next request started arriving more than `header_read_timeout` ago
//!   without completing its header block (slowloris), or (c) the connection
//!   has been idle for [`ServerLimits::idle_timeout`]. A connection whose
//!   request is still being processed, or whose response is still
//!   streaming, is never closed for idleness. With requests in flight the
//!   watchdog closes the connection only when a response body handed a
//!   frame to the writer and was not asked for the next one within
//!   `write_timeout` (a stalled reader over HTTP/2, where flow control
//!   blocks the stream while the socket stays writable).
//!
//! hyper's own HTTP/1 `header_read_timeout` also runs (with `TokioTimer`),
//! set to `header_read_timeout + idle_timeout`: hyper starts that timer as
//! soon as a keep-alive connection waits for its next request, so it can
//! only be a backstop behind the watchdog's precise rules. The HTTP/1 read
//! buffer is capped at [`MAX_HEADER_BYTES`], which bounds an unfinished
//! header block.
//!
//! # Shutdown
//!
//! When the `shutdown` future resolves the listener is closed, every
//! connection is told to shut down gracefully (HTTP/1: finish the request
//! in flight, then close; HTTP/2: `GOAWAY`, finish open streams), and the
//! loop waits at most [`ServerLimits::drain_timeout`]. Connections still
//! open then are aborted, which cancels their in-flight handlers (the
//! store's puts are cancel-safe: nothing is published and the stage file
//! is removed); their number is logged.
//!
//! # Memory after a burst
//!
//! Every [`TRIM_EVERY`], when at least [`TRIM_AFTER_CLOSED`] connections
//! have closed since the last time, the loop asks the allocator to return
//! its free memory to the system (glibc `malloc_trim`): the buffers of a
//! flood or of stalled streams the timeouts ended would otherwise stay in
//! the process's resident set.
//!
//! # Accept errors
//!
//! Out of file descriptors or buffers (`EMFILE`, `ENFILE`, `ENOBUFS`,
//! `ENOMEM`): an error is logged at most once every few seconds and the
//! loop backs off for [`ACCEPT_BACKOFF`] instead of spinning. Errors that
//! concern only the connection being accepted (`ECONNABORTED`, ...) are
//! skipped. [`raise_nofile_limit`] raises the process's descriptor limit.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
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
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

use super::tls::{client_cert_names, TlsReloader, TlsSettings};
use store_ops::auth::ClientCert;

/// Connection limits and timeouts of [`serve_router`]. Every field has a
/// documented default ([`ServerLimits::default`]). Durations and
/// `max_connections` must be non-zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Time allowed to receive a request's whole header block (from its
    /// first byte, or for a new connection from the end of the TLS
    /// handshake / the accept); also bounds the TLS handshake.
    pub header_read_timeout: Duration,
    /// A keep-alive connection with no request in flight is closed after
    /// this long without a new request.
    pub idle_timeout: Duration,
    /// A request body that delivers no byte for this long fails
    /// (`incomplete_body`; the put publishes nothing).
    pub body_read_timeout: Duration,
    /// A response write that makes no progress for this long (a stalled
    /// reader) closes the connection.
    pub write_timeout: Duration,
    /// Cap on open connections; beyond it a connection is answered 503
    /// and closed.
    pub max_connections: usize,
    /// After shutdown is requested, in-flight requests get this long to
    /// finish; then their connections are dropped (uploads cancelled:
    /// nothing published, stage removed).
    pub drain_timeout: Duration,
    /// HTTP/2 (cleartext h2c with prior knowledge, or ALPN `h2` over TLS):
    /// the cap on concurrent streams per connection; `None` turns HTTP/2
    /// off.
    pub http2_max_streams: Option<u32>,
}

impl Default for ServerLimits {
    /// Header 10 s, idle 60 s, body read 30 s, write 60 s, 4,096
    /// connections, drain 30 s, HTTP/2 at most 100 streams.
    fn default() -> Self {
        ServerLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(60),
            max_connections: 4096,
            drain_timeout: Duration::from_secs(30),
            http2_max_streams: Some(100),
        }
    }
}

impl ServerLimits {
    fn validate(&self) -> io::Result<()> {
        let zero = [
            ("header_read_timeout", self.header_read_timeout),
            ("idle_timeout", self.idle_timeout),
            ("body_read_timeout", self.body_read_timeout),
            ("write_timeout", self.write_timeout),
            ("drain_timeout", self.drain_timeout),
        ]
        .into_iter()
        .find(|(_, d)| d.is_zero());
        if let Some((name, _)) = zero {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("server limits: {name} must be non-zero"),
            ));
        }
        if self.max_connections == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "server limits: max_connections must be at least 1",
            ));
        }
        if self.http2_max_streams == Some(0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "server limits: http2_max_streams must be at least 1 (or unset to disable HTTP/2)",
            ));
        }
        Ok(())
    }
}

/// What the connection layer knows about the peer; inserted into every
/// request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    /// The peer's address.
    pub remote: SocketAddr,
    /// The connection is TLS.
    pub tls: bool,
    /// The verified client certificate (mutual TLS), if one was presented.
    pub client_cert: Option<ClientCert>,
}

/// Cap on the HTTP/1 read buffer, hence on an unfinished header block
/// (HTTP/2: on the header list).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Pause of the accept loop after an accept failed for lack of file
/// descriptors or memory.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// At most one accept-error (or overload) log line per this interval.
const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// How long the `503 overloaded` answer may take to write, plus how long
/// the rejected connection's request is then read and discarded (so that
/// closing does not reset the connection before the client read the
/// answer).
const REJECT_TIMEOUT: Duration = Duration::from_secs(2);

/// After an idle connection was told to shut down gracefully, how long it
/// gets before it is dropped.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` until `shutdown` resolves, then drains (see
/// the module documentation): stops accepting, lets in-flight requests
/// finish for at most `limits.drain_timeout`, aborts the rest and returns
/// `Ok(())`.
///
/// With `tls`, the files are read first (an unreadable or invalid file is
/// an `io::Error` naming its role, e.g. `TLS certificate file: …`) and, on
/// Unix, re-read on SIGHUP: new connections use the new files, existing
/// ones are untouched, and a failed reload is logged and keeps the
/// previous configuration. Invalid `limits` (a zero duration or cap) are
/// an `InvalidInput` error.
///
/// Not cancel-safe in the graceful sense: dropping the future closes the
/// listener and every connection at once (in-flight handlers are
/// cancelled; the store's puts publish nothing and remove their stage).
/// Resolve `shutdown` instead to drain.
pub async fn serve_router<F>(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    tls: Option<TlsSettings>,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    limits.validate()?;
    let tls = match tls {
        Some(settings) => Some(Arc::new(TlsReloader::load(
            settings,
            limits.http2_max_streams.is_some(),
        )?)),
        None => None,
    };
    serve_router_with_reloader(listener, app, limits, tls, shutdown).await
}

/// [`serve_router`] with a TLS configuration the caller holds, e.g. to
/// call [`TlsReloader::reload`] itself. SIGHUP reloads it too (Unix).
///
/// Not cancel-safe in the graceful sense: dropping the future closes the
/// listener and every connection at once. Resolve `shutdown` to drain.
pub async fn serve_router_with_reloader<F>(
    listener: TcpListener,
    app: Router,
    limits: ServerLimits,
    tls: Option<Arc<TlsReloader>>,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    limits.validate()?;
    // Always listening: without TLS a SIGHUP (a `systemctl reload`, a
    // closed terminal) must not stop the server.
    let _sighup = spawn_sighup_reloader(tls.clone());
    let shared = Arc::new(Shared::new(app, limits, tls));
    let limits = &shared.limits;

    let (stop_tx, stop_rx) = watch::channel(false);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let reject_permits = Arc::new(Semaphore::new((limits.max_connections / 8).clamp(16, 256)));
    let mut conns: JoinSet<()> = JoinSet::new();
    let mut rejects: JoinSet<()> = JoinSet::new();
    let mut accept_log = RateLimited::new(LOG_INTERVAL);
    let mut overload_log = RateLimited::new(LOG_INTERVAL);
    let mut closed_since_trim: usize = 0;
    let mut trim_tick = tokio::time::interval(TRIM_EVERY);
    trim_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            _ = trim_tick.tick() => {
                if closed_since_trim >= TRIM_AFTER_CLOSED {
                    closed_since_trim = 0;
                    tokio::task::spawn_blocking(return_freed_memory);
                }
            }
            Some(done) = conns.join_next(), if !conns.is_empty() => {
                closed_since_trim += 1;
                if let Err(e) = done {
                    if e.is_panic() {
                        tracing::error!("connection task panicked: {e}");
                    }
                }
            }
            Some(_) = rejects.join_next(), if !rejects.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    let _ = stream.set_nodelay(true);
                    match permits.clone().try_acquire_owned() {
                        Ok(permit) => {
                            conns.spawn(connection(
                                stream,
                                remote,
                                permit,
                                shared.clone(),
                                stop_rx.clone(),
                            ));
                        }
                        Err(_) => {
                            if let Some(suppressed) = overload_log.ready() {
                                tracing::warn!(
                                    "connection cap of {} reached: answering 503 overloaded \
                                     ({suppressed} more since the last report)",
                                    limits.max_connections
                                );
                            }
                            // Bounded too: past it the socket is just closed.
                            if let Ok(p) = reject_permits.clone().try_acquire_owned() {
                                rejects.spawn(reject(stream, shared.clone(), p));
                            }
                        }
                    }
                }
                Err(e) => match classify_accept_error(&e) {
                    AcceptError::Connection => {
                        tracing::debug!("accept: {e} (skipped)");
                    }
                    kind => {
                        if let Some(suppressed) = accept_log.ready() {
                            if kind == AcceptError::Resources {
                                tracing::error!(
                                    "accept failed: {e}: out of file descriptors or memory; \
                                     backing off ({suppressed} more since the last report; \
                                     raise the open-files limit or max_connections)"
                                );
                            } else {
                                tracing::error!(
                                    "accept failed: {e}; backing off \
                                     ({suppressed} more since the last report)"
                                );
                            }
                        }
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                        }
                    }
                },
            },
        }
    }

    // Drain: no new connections, graceful shutdown of the open ones.
    drop(listener);
    let _ = stop_tx.send(true);
    let open = conns.len();
    if open > 0 {
        tracing::info!(
            "shutting down: draining {open} connection(s) for at most {:?}",
            limits.drain_timeout
        );
    }
    let drained = tokio::time::timeout(limits.drain_timeout, async {
        while conns.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    if !drained {
        let left = conns.len();
        tracing::warn!(
            "drain timeout of {:?} reached: aborting {left} connection(s) \
             (in-flight requests cancelled)",
            limits.drain_timeout
        );
        // Aborts and waits, so the cancelled handlers have run their drops
        // (stage files removed) when this returns.
        conns.shutdown().await;
    }
    rejects.shutdown().await;
    Ok(())
}

/// A task that reloads `tls` on SIGHUP (without TLS it only logs that
/// there is nothing to reload: the signal's default action would stop the
/// process); aborted when dropped.
fn spawn_sighup_reloader(tls: Option<Arc<TlsReloader>>) -> AbortOnDrop {
    #[cfg(unix)]
    let task = {
        use tokio::signal::unix::{signal, SignalKind};
        // Registered here, before the accept loop starts, so a SIGHUP sent
        // once the server answers is always seen by the loop below.
        let hup = signal(SignalKind::hangup());
        tokio::spawn(async move {
            let mut hup = match hup {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("cannot listen for SIGHUP (TLS reload disabled): {e}");
                    return;
                }
            };
            while hup.recv().await.is_some() {
                let Some(tls) = &tls else {
                    tracing::info!("SIGHUP: nothing to reload (no [tls]); still serving");
                    continue;
                };
                match tls.reload() {
                    Ok(()) => tracing::info!("SIGHUP: TLS certificate, key and client CA reloaded"),
                    Err(e) => tracing::error!(
                        "SIGHUP: TLS reload failed, keeping the previous configuration: {e}"
                    ),
                }
            }
        })
    };
    #[cfg(not(unix))]
    let task = tokio::spawn(async move {
        let _ = tls;
    });
    AbortOnDrop(task)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// How often the accept loop considers returning freed memory.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Connections that must have closed since the last trim for the next one:
/// a burst of clients (a flood, a stall the timeouts ended) leaves its
/// buffers in the allocator's free lists, which glibc does not give back
/// to the system by itself.
const TRIM_AFTER_CLOSED: usize = 256;

/// Returns the allocator's free memory to the system (glibc's
/// `malloc_trim`; a no-op elsewhere). Runs on the blocking pool: it walks
/// the heap.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory; it takes no
    // pointers and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What every connection task shares.
struct Shared {
    app: Router,
    limits: ServerLimits,
    tls: Option<Arc<TlsReloader>>,
    /// Cleartext: HTTP/1.1, plus h2c prior knowledge when HTTP/2 is on.
    plain: auto::Builder<TokioExecutor>,
    /// HTTP/1.1 only (TLS without ALPN `h2`).
    http1: auto::Builder<TokioExecutor>,
    /// HTTP/2 only (TLS with ALPN `h2`).
    http2: auto::Builder<TokioExecutor>,
}

impl Shared {
    fn new(app: Router, limits: ServerLimits, tls: Option<Arc<TlsReloader>>) -> Self {
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            // A backstop only: hyper starts this timer as soon as a
            // keep-alive connection waits, see the module docs.
            .header_read_timeout(limits.header_read_timeout + limits.idle_timeout)
            .max_buf_size(MAX_HEADER_BYTES)
            .keep_alive(true);
        if let Some(streams) = limits.http2_max_streams {
            b.http2()
                .timer(TokioTimer::new())
                .max_concurrent_streams(streams)
                .max_header_list_size(MAX_HEADER_BYTES as u32)
                .keep_alive_interval(limits.idle_timeout.min(Duration::from_secs(30)))
                .keep_alive_timeout(limits.write_timeout.min(Duration::from_secs(20)));
        }
        let http1 = b.clone().http1_only();
        let http2 = b.clone().http2_only();
        let plain = if limits.http2_max_streams.is_some() {
            b
        } else {
            http1.clone()
        };
        Shared {
            app,
            limits,
            tls,
            plain,
            http1,
            http2,
        }
    }
}

/// One accepted connection, from TLS handshake to close.
async fn connection(
    stream: TcpStream,
    remote: SocketAddr,
    _permit: OwnedSemaphorePermit,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let state = Arc::new(ConnState::new());
    let io = TimedIo::new(stream, state.clone(), shared.limits.write_timeout);
    let Some(tls) = &shared.tls else {
        let peer = PeerInfo {
            remote,
            tls: false,
            client_cert: None,
        };
        drive(io, peer, state, &shared.plain, &shared, stop).await;
        return;
    };
    if *stop.borrow() {
        return;
    }
    let handshake =
        tokio::time::timeout(shared.limits.header_read_timeout, tls.acceptor().accept(io));
    let stream = tokio::select! {
        r = handshake => match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!("TLS handshake with {remote} failed: {e}");
                return;
            }
            Err(_) => {
                tracing::debug!("TLS handshake with {remote} timed out");
                return;
            }
        },
        _ = stop.changed() => return,
    };
    let (_, session) = stream.get_ref();
    let client_cert = session
        .peer_certificates()
        .and_then(|certs| certs.first())
        .map(client_cert_names);
    let h2 = session.alpn_protocol() == Some(b"h2".as_slice());
    let peer = PeerInfo {
        remote,
        tls: true,
        client_cert,
    };
    state.restart_clock();
    let builder = if h2 { &shared.http2 } else { &shared.http1 };
    drive(stream, peer, state, builder, &shared, stop).await;
}

/// Serves HTTP on `io` with the watchdog until the connection ends.
async fn drive<I>(
    io: I,
    peer: PeerInfo,
    state: Arc<ConnState>,
    builder: &auto::Builder<TokioExecutor>,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = &shared.limits;
    let remote = peer.remote;
    let service = ConnService {
        app: shared.app.clone(),
        peer: Arc::new(peer),
        state: state.clone(),
        body_timeout: limits.body_read_timeout,
    };
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);

    let tick = (limits.header_read_timeout.min(limits.idle_timeout) / 8)
        .clamp(Duration::from_millis(10), Duration::from_millis(500));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    let mut close_by: Option<Instant> = None;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("connection from {remote}: {e}");
                }
                return;
            }
            _ = ticker.tick() => {
                if let Some(deadline) = close_by {
                    if Instant::now() >= deadline {
                        return;
                    }
                    continue;
                }
                match state.verdict(limits) {
                    Verdict::Keep => {}
                    Verdict::Idle => {
                        tracing::debug!("connection from {remote}: idle, closing");
                        conn.as_mut().graceful_shutdown();
                        close_by = Some(Instant::now() + IDLE_CLOSE_GRACE);
                    }
                    Verdict::WriteStalled => {
                        tracing::debug!(
                            "connection from {remote}: a response was not read for {:?}, closing",
                            limits.write_timeout
                        );
                        return;
                    }
                    Verdict::HeaderTimeout => {
                        tracing::debug!(
                            "connection from {remote}: no complete request header within {:?}, closing",
                            limits.header_read_timeout
                        );
                        return;
                    }
                }
            }
            _ = stop.changed(), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// The watchdog's decision.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Keep,
    Idle,
    HeaderTimeout,
    /// A response body handed a frame to the writer and was not asked for
    /// the next one for the write timeout: the peer stopped reading (over
    /// HTTP/2 the socket stays writable, flow control blocks the stream).
    WriteStalled,
}

/// Per-connection activity, shared by the IO wrapper, the service wrapper
/// and the watchdog. Times are milliseconds since `start`.
struct ConnState {
    start: Instant,
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
    /// waits on its own source.
    responses: std::sync::Mutex<Vec<std::sync::Weak<AtomicU64>>>,
}

impl ConnState {
    fn new() -> Self {
        ConnState {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            idle_since: AtomicU64::new(0),
            header_since: AtomicU64::new(0),
            h2: AtomicBool::new(false),
            responses: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The connection is ready for its first request (after the TLS
    /// handshake).
    fn restart_clock(&self) {
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
        let clock = Arc::new(AtomicU64::new(0));
        let mut responses = self.responses.lock().unwrap_or_else(|p| p.into_inner());
        responses.retain(|w| w.strong_count() > 0);
        responses.push(Arc::downgrade(&clock));
        clock
    }

    fn verdict(&self, limits: &ServerLimits) -> Verdict {
        let now = self.now_ms();
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            let write_ms = limits.write_timeout.as_millis() as u64;
            let responses = self.responses.lock().unwrap_or_else(|p| p.into_inner());
            let stalled = responses.iter().filter_map(|w| w.upgrade()).any(|c| {
                let handed = c.load(Ordering::SeqCst);
                handed != 0 && now >= handed - 1 + write_ms
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
struct ConnService {
    app: Router,
    peer: Arc<PeerInfo>,
    state: Arc<ConnState>,
    body_timeout: Duration,
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
struct GuardedBody {
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
struct TimedIo {
    inner: TcpStream,
    state: Arc<ConnState>,
    write_timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl TimedIo {
    fn new(inner: TcpStream, state: Arc<ConnState>, write_timeout: Duration) -> Self {
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

/// The body of the answer to a connection beyond the cap.
const OVERLOADED_BODY: &str =
    r#"{"error":{"code":"overloaded","message":"too many open connections; retry shortly"}}"#;

/// The whole `503 overloaded` answer.
fn overloaded_response() -> String {
    format!(
        "HTTP/1.1 503 Service Unavailable\r\n\
         Retry-After: 1\r\n\
         Connection: close\r\n\
         Content-Type: application/json\r\n\
         Content-Length: {}\r\n\
         \r\n\
         {OVERLOADED_BODY}",
        OVERLOADED_BODY.len()
    )
}

/// Answers a connection beyond the cap with `503 overloaded` and closes
/// it, all within [`REJECT_TIMEOUT`].
async fn reject(stream: TcpStream, shared: Arc<Shared>, _permit: OwnedSemaphorePermit) {
    let _ = tokio::time::timeout(REJECT_TIMEOUT, async move {
        match &shared.tls {
            None => answer_overloaded(stream).await,
            Some(tls) => {
                let stream = tls.acceptor().accept(stream).await?;
                if stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice()) {
                    // The client will speak HTTP/2: an HTTP/1 answer would
                    // be noise. Just close.
                    return Ok(());
                }
                answer_overloaded(stream).await
            }
        }
    })
    .await;
}

async fn answer_overloaded<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> io::Result<()> {
    s.write_all(overloaded_response().as_bytes()).await?;
    s.flush().await?;
    s.shutdown().await?;
    // Read and discard what the client sends until it closes, so that
    // closing with unread data does not reset the connection before the
    // client read the answer.
    let mut buf = [0u8; 4096];
    let mut total = 0usize;
    while total < 64 * 1024 {
        match s.read(&mut buf).await? {
            0 => break,
            n => total += n,
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AcceptError {
    /// Out of descriptors, buffers or memory: back off.
    Resources,
    /// Concerns only the connection being accepted: skip it.
    Connection,
    /// Anything else: log and back off (never spin).
    Other,
}

fn classify_accept_error(e: &io::Error) -> AcceptError {
    #[cfg(unix)]
    {
        if let Some(code) = e.raw_os_error() {
            match code {
                libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM => {
                    return AcceptError::Resources
                }
                libc::ECONNABORTED
                | libc::ECONNRESET
                | libc::ECONNREFUSED
                | libc::EINTR
                | libc::EAGAIN
                | libc::EPROTO
                | libc::EPERM
                | libc::ETIMEDOUT
                | libc::ENETDOWN
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::EHOSTUNREACH
                | libc::ENOPROTOOPT
                | libc::EOPNOTSUPP => return AcceptError::Connection,
                _ => {}
            }
        }
    }
    match e.kind() {
        io::ErrorKind::OutOfMemory => AcceptError::Resources,
        io::ErrorKind::ConnectionAborted
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::Interrupted
        | io::ErrorKind::WouldBlock
        | io::ErrorKind::TimedOut => AcceptError::Connection,
        _ => AcceptError::Other,
    }
}

/// One report per interval, counting what was suppressed in between.
struct RateLimited {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    fn new(every: Duration) -> Self {
        RateLimited {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(suppressed since the last report)` when a report is due.
    fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(t) if now.duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard
/// limit; returns `(soft limit now, hard limit)`. The server needs one
/// descriptor per connection plus the store's files; call it once at
/// start and log the figure. On macOS the soft limit is capped at
/// `OPEN_MAX` (10,240) when the hard limit is unlimited. Not supported
/// off Unix.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    #[cfg(unix)]
    {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `rl` is a valid, writable rlimit for the call.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let hard = rl.rlim_max;
        #[cfg(target_os = "macos")]
        let target = hard.min(10_240);
        #[cfg(not(target_os = "macos"))]
        let target = hard;
        if rl.rlim_cur < target {
            let wanted = libc::rlimit {
                rlim_cur: target,
                rlim_max: hard,
            };
            // SAFETY: `wanted` is a valid rlimit for the call.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } != 0 {
                return Err(io::Error::last_os_error());
            }
            rl.rlim_cur = target;
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
        Ok((rl.rlim_cur as u64, hard as u64))
    }
    #[cfg(not(unix))]
    {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "RLIMIT_NOFILE is a Unix limit",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_are_classified() {
        let e = |code| io::Error::from_raw_os_error(code);
        assert_eq!(
            classify_accept_error(&e(libc::EMFILE)),
            AcceptError::Resources
        );
        assert_eq!(
            classify_accept_error(&e(libc::ENFILE)),
            AcceptError::Resources
        );
        assert_eq!(
            classify_accept_error(&e(libc::ENOBUFS)),
            AcceptError::Resources
        );
        assert_eq!(
            classify_accept_error(&e(libc::ENOMEM)),
            AcceptError::Resources
        );
        assert_eq!(
            classify_accept_error(&e(libc::ECONNABORTED)),
            AcceptError::Connection
        );
        assert_eq!(classify_accept_error(&e(libc::EBADF)), AcceptError::Other);
    }

    #[test]
    fn rate_limited_reports_once_per_interval() {
        let mut r = RateLimited::new(Duration::from_secs(3600));
        assert_eq!(r.ready(), Some(0));
        assert_eq!(r.ready(), None);
        assert_eq!(r.ready(), None);
        r.last = Some(Instant::now() - Duration::from_secs(7200));
        assert_eq!(r.ready(), Some(2));
    }

    #[test]
    fn limits_are_validated() {
        assert!(ServerLimits::default().validate().is_ok());
        let l = ServerLimits {
            max_connections: 0,
            ..Default::default()
        };
        assert_eq!(
            l.validate().unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        let l = ServerLimits {
            idle_timeout: Duration::ZERO,
            ..Default::default()
        };
        assert!(l
            .validate()
            .unwrap_err()
            .to_string()
            .contains("idle_timeout"));
    }

    #[test]
    fn raise_nofile_limit_reaches_the_hard_limit() {
        let (soft, hard) = raise_nofile_limit().unwrap();
        assert!(soft > 0 && soft <= hard);
    }

    #[test]
    fn the_overloaded_answer_is_well_formed() {
        let r = overloaded_response();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "overloaded");
    }
}
