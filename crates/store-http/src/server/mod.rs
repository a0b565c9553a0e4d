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
//! hyper's own HTTP/1 `header_read_timeout` is off: hyper would start it
//! as soon as a keep-alive connection waits for its next request (a boxed
//! timer and a clock read per request), so it could only fire after the
//! watchdog's idle rule (ADR-056). The watchdog's clock is a coarse one
//! (`CLOCK_MONOTONIC_COARSE`, a few milliseconds of resolution). The HTTP/1
//! read buffer is capped at [`MAX_HEADER_BYTES`], which bounds an
//! unfinished header block.
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
//! Every `TRIM_EVERY` (`accept.rs`), when at least `TRIM_AFTER_CLOSED`
//! connections
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
//!
//! # Files
//!
//! - `accept.rs`: the accept loop, its error handling and back-off, the
//!   memory trim and the shutdown drain;
//! - `overload.rs`: the `503 overloaded` answer beyond the connection cap;
//! - `conn.rs`: one connection, from the TLS handshake through the hyper
//!   connection and its watchdog;
//! - `timeouts.rs`: the per-connection activity the watchdog reads and the
//!   IO, body and service wrappers that record it (slow clients);
//! - `sighup.rs`: TLS reload on SIGHUP.

mod accept;
mod conn;
mod overload;
mod sighup;
mod timeouts;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use store_ops::auth::ClientCert;
use tokio::net::TcpListener;

use super::tls::{TlsReloader, TlsSettings};
pub use accept::raise_nofile_limit;

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
    let _sighup = sighup::spawn_sighup_reloader(tls.clone());
    let shared = Arc::new(conn::Shared::new(app, limits, tls));
    let mut server = accept::AcceptLoop::new(shared);
    server.run(listener, shutdown).await;
    server.drain().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
