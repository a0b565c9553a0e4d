//! One accepted connection: the TLS handshake (bounded by the header read
//! timeout), the hyper connection (HTTP/1.1, HTTP/2 by ALPN or prior
//! knowledge) over the router, and the watchdog that closes it when the
//! rules of the module documentation say so.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tokio::time::Instant;

use super::timeouts::{ConnService, ConnState, TimedIo, Verdict};
use super::{PeerInfo, ServerLimits, MAX_HEADER_BYTES};
use crate::tls::{client_cert_names, TlsReloader};

/// After an idle connection was told to shut down gracefully, how long it
/// gets before it is dropped.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What every connection task shares.
pub(super) struct Shared {
    app: Router,
    pub(super) limits: ServerLimits,
    pub(super) tls: Option<Arc<TlsReloader>>,
    /// Cleartext: HTTP/1.1, plus h2c prior knowledge when HTTP/2 is on.
    plain: auto::Builder<TokioExecutor>,
    /// HTTP/1.1 only (TLS without ALPN `h2`).
    http1: auto::Builder<TokioExecutor>,
    /// HTTP/2 only (TLS with ALPN `h2`).
    http2: auto::Builder<TokioExecutor>,
}

impl Shared {
    pub(super) fn new(app: Router, limits: ServerLimits, tls: Option<Arc<TlsReloader>>) -> Self {
        let mut b = auto::Builder::new(TokioExecutor::new());
        b.http1()
            .timer(TokioTimer::new())
            // Off: the watchdog enforces the header and idle rules. hyper's
            // own timer cost a boxed sleep and a clock read per request and
            // could only fire after the watchdog's idle rule (ADR-056).
            .header_read_timeout(None)
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
///
/// A TLS connection's handshake and its stream are boxed: their state
/// (rustls's) would otherwise make every connection's task that much
/// larger, and spawning a task copies its future.
pub(super) async fn connection(
    stream: TcpStream,
    remote: SocketAddr,
    _permit: OwnedSemaphorePermit,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) {
    let state = Arc::new(ConnState::new());
    let io = TimedIo::new(stream, state.clone(), shared.limits.write_timeout);
    if let Some(tls) = &shared.tls {
        Box::pin(over_tls(io, remote, state, tls, &shared, stop)).await;
        return;
    }
    let peer = PeerInfo {
        remote,
        tls: false,
        client_cert: None,
    };
    drive(io, peer, state, &shared.plain, &shared, stop).await;
}

/// [`connection`] under TLS: the handshake (bounded by the header read
/// timeout), then HTTP/1.1 or HTTP/2 by ALPN.
async fn over_tls(
    io: TimedIo,
    remote: SocketAddr,
    state: Arc<ConnState>,
    tls: &TlsReloader,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
) {
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
    drive(stream, peer, state, builder, shared, stop).await;
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
    // The first tick one period from now: an immediate one would wake a
    // fresh connection for nothing (ADR-056).
    let mut ticker = tokio::time::interval_at(Instant::now() + tick, tick);
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
