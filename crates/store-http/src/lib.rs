//! Blobpool's HTTP binding of the ops layer (axum 0.8, hyper 1, rustls).
//! Routes, statuses and headers are documented in `docs/SERVER.md` and
//! recorded in ADR-017.
//!
//! Seams: below, a built [`store_ops::Ops`] (every route is a thin
//! translation to one of its handlers; an [`OpsError`](store_ops::OpsError)
//! becomes its code's status and the JSON error body); above, a
//! [`tokio::net::TcpListener`] ([`serve_with`], [`serve_router`]) or any
//! caller of the axum [`Router`](axum::Router) ([`router_with`]).
//! Identities and scopes come from [`store_ops::auth`]: the gate hands it
//! the `Authorization` header and the verified client certificate.
//!
//! - router assembly: `router`; routes and handlers: `handlers`, `admin`,
//!   `cache`, `refs`, `uploads` (request and response bodies in `body`);
//! - the gate in front of every route (request id, `Host` check,
//!   authentication, access log): `gate`;
//! - the connection layer ([`serve_router`]): `server` (the accept loop,
//!   each connection, the slow-client timeouts, the reload on SIGHUP),
//!   with the TLS configuration in `tls`.
//!
//! Architecture invariant: this crate names no engine (checked by
//! `cargo xtask tidy`); it sees engines only through the `Ops` it is
//! handed.
//!
//! The routes:
//!
//! | route | handler |
//! |---|---|
//! | `PUT /v1/blobs/{ns}` | [`Ops::put`] — body = blob, streamed |
//! | `GET /v1/blobs/{ns}/{digest}` | [`Ops::get`] — streamed, `Range` → 206 |
//! | `GET /v1/blobs/{ns}/{digest}`, `Accept: application/x-bao` | [`Ops::get_bao`] — a verified stream ([`store_ops::bao`]), `Range` → 200 + `x-blobpool-bao-range` |
//! | `HEAD /v1/blobs/{ns}/{digest}` | [`Ops::stat`] as headers |
//! | `DELETE /v1/blobs/{ns}/{digest}` | [`Ops::delete`] — 204 / 404 / 409 |
//! | `POST /v1/have` | [`Ops::have`] |
//! | `DELETE /v1/tokens/{token}` | [`Ops::release_token`] |
//! | `POST /v1/sweep` | [`Ops::sweep`] — the `SweepReport` as JSON |
//! | `GET /health` | [`Ops::health`] |
//! | `GET /metrics` | [`Ops::render_metrics`] |
//! | `GET /v1/namespaces` | [`Ops::namespaces`] (admin) |
//! | `GET /v1/namespaces/{ns}/entries` | [`Ops::list_entries`] (admin) |
//! | `GET /v1/stats` | [`Ops::stats`] (admin) |
//! | `POST /v1/verify` | [`Ops::verify`] (admin) |
//! | `POST /v1/uploads/{ns}` | [`Ops::upload_open`] — a resumable upload session |
//! | `PATCH /v1/uploads/{ns}/{id}` | [`Ops::upload_append`] — `Content-Range` at the offset |
//! | `HEAD /v1/uploads/{ns}/{id}` | [`Ops::upload_status`] — `Upload-Offset` |
//! | `PUT /v1/uploads/{ns}/{id}?digest=` | [`Ops::upload_finish`] — a put's answer |
//! | `DELETE /v1/uploads/{ns}/{id}` | [`Ops::upload_abort`] |
//! | `GET/HEAD/PUT/DELETE/MKCOL/PROPFIND /cache/{ns}/{key}` | [`Ops::cache_get`], [`Ops::cache_stat`], [`Ops::cache_put`], [`Ops::cache_delete`] — the build-cache protocol (`cache` module, ADR-048) |
//!
//! Request bodies are never buffered whole (the blob route streams into
//! the store; `/v1/have` reads at most [`have_body_limit`] bytes), and
//! blob responses stream out of the store.

#![warn(missing_docs)]

mod admin;
mod body;
mod cache;
mod gate;
mod handlers;
mod refs;
mod router;
mod server;
mod tls;
mod uploads;

use std::future::Future;
use std::io;
use std::time::Duration;

use store_ops::Ops;

pub use body::have_body_limit;
pub use gate::HEADER_REQUEST_ID;
pub use router::{router, router_with};
pub use server::{
    raise_nofile_limit, serve_router, serve_router_with_reloader, PeerInfo, ServerLimits,
    ACCEPT_BACKOFF, MAX_HEADER_BYTES,
};
pub use store_ops::auth::ClientCert;
pub use tls::{ClientAuth, TlsReloader, TlsSettings};
pub use uploads::HEADER_UPLOAD_OFFSET;

/// Everything the HTTP binding needs beyond the [`Ops`]: who may do what,
/// which `Host` names and browser origins are accepted, connection limits
/// and TLS. [`HttpConfig::default`] is the open loopback server of
/// ADR-017: no authentication, no TLS, default limits.
#[derive(Clone, Debug, Default)]
pub struct HttpConfig {
    /// Identities and scopes (ADR-023).
    pub auth: store_ops::auth::Auth,
    /// Accepted `Host` header names (without port); empty accepts any.
    pub allowed_hosts: Vec<String>,
    /// Origins allowed to make cross-origin requests (CORS); empty: no
    /// CORS headers at all.
    pub cors_origins: Vec<String>,
    /// Connection limits and timeouts.
    pub limits: ServerLimits,
    /// TLS, when the server terminates it.
    pub tls: Option<TlsSettings>,
}

/// Request header: the digest the uploaded content must hash to.
pub const HEADER_EXPECT_DIGEST: &str = "x-blobpool-expect-digest";
/// Response header: the tier holding the entry (`kv` or `large`).
pub const HEADER_TIER: &str = "x-blobpool-tier";
/// Response header: the entry's publication time, Unix milliseconds.
pub const HEADER_CREATED_AT: &str = "x-blobpool-created-at";
/// Response header: the entry's digest.
pub const HEADER_DIGEST: &str = "x-blobpool-digest";
/// Response header on bao streams: the whole entry's size in bytes (a
/// decoder needs it for the tree's shape).
pub const HEADER_SIZE: &str = "x-blobpool-size";
/// Response header on bao streams of a range: the encoded byte range,
/// `first-last` (inclusive, like `Range`).
pub const HEADER_BAO_RANGE: &str = "x-blobpool-bao-range";
/// Response header on puts: `true` when the entry already existed.
pub const HEADER_DEDUPLICATED: &str = "x-blobpool-deduplicated";

/// How often the server ends expired pin tokens: a quarter of the TTL,
/// between 50 ms and 30 s.
fn reap_interval(ttl: Duration) -> Duration {
    (ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(30))
}

/// Serves `ops` on `listener` until `shutdown` resolves, then stops
/// accepting connections and waits for in-flight requests (puts included)
/// to finish. When tokens have an idle TTL, runs the token reaper
/// meanwhile.
///
/// Not cancel-safe in the graceful sense: dropping the future closes the
/// listener and every connection at once (in-flight puts are cancelled,
/// which publishes nothing or leaves an unpinned entry, see [`Ops::put`])
/// and leaves the reaper running until `ops` is dropped. Resolve
/// `shutdown` instead to drain.
pub async fn serve<F>(listener: tokio::net::TcpListener, ops: Ops, shutdown: F) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_with(listener, ops, HttpConfig::default(), shutdown).await
}

/// [`serve`] with a configuration: authentication, `Host` and CORS
/// policy, connection limits and TLS ([`serve_router`] describes the
/// connection layer and the shutdown drain: after `shutdown` resolves,
/// in-flight requests get [`ServerLimits::drain_timeout`], then their
/// connections are dropped).
///
/// Not cancel-safe in the graceful sense, as [`serve`].
pub async fn serve_with<F>(
    listener: tokio::net::TcpListener,
    ops: Ops,
    cfg: HttpConfig,
    shutdown: F,
) -> io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let reaper = ops
        .tokens()
        .ttl()
        .map(|ttl| ops.spawn_token_reaper(reap_interval(ttl)));
    let inventory = ops.spawn_inventory_refresher();
    let upload_reaper = ops.spawn_upload_reaper();
    let app = router_with(ops, &cfg);
    let result = serve_router(listener, app, cfg.limits, cfg.tls, shutdown).await;
    if let Some(r) = reaper {
        r.abort();
    }
    inventory.abort();
    if let Some(r) = upload_reaper {
        r.abort();
    }
    result
}

/// Resolves on Ctrl-C (SIGINT) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
    tracing::info!("shutdown requested: finishing in-flight requests");
}
