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
//! - the route table: `routes`; router assembly: `router`; handlers:
//!   `handlers`, `admin`, `cache`, `refs`, `uploads`, over the extractors
//!   in `extract` (caller, path, scope) and the shared answers in
//!   `respond` (request and response bodies in `body`);
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
//! The routes, their scopes and handlers are one table, `routes::ROUTES`
//! (docs/SERVER.md's route list is tested against it); each handler is a
//! thin translation to one [`Ops`] method.
//!
//! Request bodies are never buffered whole (the blob route streams into
//! the store; `/v1/have` reads at most [`have_body_limit`] bytes), and
//! blob responses stream out of the store.

#![warn(missing_docs)]

mod admin;
mod body;
mod cache;
mod extract;
mod gate;
mod handlers;
mod openapi;
mod refs;
mod respond;
mod router;
mod routes;
mod server;
mod tls;
mod uploads;

use std::future::Future;
use std::io;

use store_ops::Ops;

pub use body::have_body_limit;
pub use gate::HEADER_REQUEST_ID;
pub use respond::HEADER_UPLOAD_OFFSET;
pub use router::{router, router_with};
pub use server::{
    raise_nofile_limit, serve_router, serve_router_with_reloader, PeerInfo, ServerLimits,
    ACCEPT_BACKOFF, MAX_HEADER_BYTES,
};
pub use store_ops::auth::ClientCert;
pub use tls::{ClientAuth, TlsReloader, TlsSettings};

/// Everything the HTTP binding needs beyond the [`Ops`]: who may do what,
/// which `Host` names and browser origins are accepted, connection limits
/// and TLS. [`HttpConfig::default`] is the open loopback server of
/// ADR-017: no authentication, no TLS, default limits.
#[derive(Clone, Debug, Default)]
pub struct HttpConfig {
    /// Identities and scopes (ADR-023).
    pub auth: store_ops::auth::Auth,
    /// Accepted `Host` header names (without port); empty, or the one
    /// entry `"*"`, accepts any.
    pub allowed_hosts: Vec<String>,
    /// Origins allowed to make cross-origin requests (CORS), each as a
    /// browser sends it (`https://ui.example.com`, see
    /// [`check_cors_origin`]); empty: no CORS headers at all.
    /// [`serve_with`] refuses a list with an invalid origin (a wildcard
    /// included: the CORS layer allows credentials).
    pub cors_origins: Vec<String>,
    /// Connection limits and timeouts.
    pub limits: ServerLimits,
    /// TLS, when the server terminates it.
    pub tls: Option<TlsSettings>,
}

/// Checks one entry of [`HttpConfig::cors_origins`]: an origin exactly as
/// a browser sends it in `Origin`, `http` or `https`, a lowercase ASCII
/// host (an IDN in its `xn--` form), a port only when it is not the
/// scheme's default, nothing after it (`https://ui.example.com`,
/// `http://localhost:3000`). Anything else could never match a browser's
/// `Origin` (an uppercase letter, a path, a trailing `/`, `:443`), or is
/// refused on purpose: `*` (browsers refuse a wildcard with credentials,
/// which the CORS layer allows, and the layer itself cannot take one in a
/// list) and `null` (the origin of sandboxed frames and local files,
/// which any page can produce). The error says why and, when there is
/// one, the form to write.
pub fn check_cors_origin(origin: &str) -> Result<(), String> {
    let o = origin;
    if o.trim() == "*" {
        return Err(
            "\"*\" is not accepted: the server allows credentials (API keys, client \
             certificates) cross-origin, which browsers refuse with a wildcard origin; list \
             each origin that may call it (e.g. \"https://ui.example.com\")"
                .to_string(),
        );
    }
    if o.trim().eq_ignore_ascii_case("null") {
        return Err(
            "\"null\" is not accepted: it is the origin of sandboxed frames and local \
             files, which any page can produce"
                .to_string(),
        );
    }
    let canonical = canonical_origin(o)?;
    if canonical != o {
        return Err(format!(
            "a browser sends this origin as {canonical:?}, which never equals {o:?}; write it \
             that way"
        ));
    }
    Ok(())
}

/// The serialisation a browser gives the origin `o` (lowercase scheme and
/// host, no default port, no trailing `/`), or why `o` is not an origin.
fn canonical_origin(o: &str) -> Result<String, String> {
    let expected = "expected scheme://host[:port], e.g. \"https://ui.example.com\"";
    let t = o.trim();
    let Some((scheme, rest)) = t.split_once("://") else {
        return Err(format!("not an origin ({expected})"));
    };
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" => "443",
        "http" => "80",
        _ => {
            return Err(format!(
                "scheme {scheme:?}: only http and https ({expected})"
            ))
        }
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.contains(['/', '?', '#']) {
        return Err(format!(
            "an origin has no path, query or fragment ({expected})"
        ));
    }
    if authority.contains('@') {
        return Err(format!(
            "an origin has no user name or password ({expected})"
        ));
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("unclosed [ ({expected})"))?;
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("[{addr}] is not an IPv6 address"));
        }
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("unexpected {p:?} after the host ({expected})"))?,
            ),
        };
        (format!("[{}]", addr.to_ascii_lowercase()), port)
    } else {
        let (h, p) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        if h.is_empty() {
            return Err(format!("no host ({expected})"));
        }
        if !h.is_ascii() {
            return Err(format!(
                "host {h:?}: browsers send an internationalised name in its ASCII (xn--) form"
            ));
        }
        if let Some(c) = h
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')))
        {
            return Err(format!("host {h:?}: {c:?} is not allowed in a host name"));
        }
        (h.to_ascii_lowercase(), p)
    };
    let port = match port {
        None => String::new(),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => {
                let n = n.to_string();
                if n == default_port {
                    String::new()
                } else {
                    format!(":{n}")
                }
            }
            _ => return Err(format!("port {p:?} is not a port number (1-65535)")),
        },
    };
    Ok(format!("{scheme}://{host}{port}"))
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

/// Serves `ops` on `listener` until `shutdown` resolves, then stops
/// accepting connections and waits for in-flight requests (puts included)
/// to finish. Runs [`Ops::spawn_tasks`] (the reapers, the inventory
/// refresher) meanwhile.
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
    // An origin the CORS layer cannot take would panic inside it, after
    // the caller announced it is listening: refuse it as an error instead.
    for o in &cfg.cors_origins {
        check_cors_origin(o).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cors_origins {o:?}: {e}"),
            )
        })?;
    }
    let tasks = ops.spawn_tasks();
    let app = router_with(ops, &cfg);
    let result = serve_router(listener, app, cfg.limits, cfg.tls, shutdown).await;
    tasks.iter().for_each(|t| t.abort());
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

#[cfg(test)]
mod cors_origin_tests {
    use super::check_cors_origin;

    /// The forms a browser sends are accepted; every other form, which no
    /// `Origin` header could equal, is refused with the form to write, and
    /// the wildcard (which made the CORS layer panic) with the reason.
    #[test]
    fn origins_are_accepted_only_as_browsers_send_them() {
        for ok in [
            "https://ui.example.com",
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "http://[::1]:8080",
            "https://xn--bcher-kva.example",
        ] {
            assert_eq!(check_cors_origin(ok), Ok(()), "{ok}");
        }
        for (bad, want) in [
            ("*", "wildcard"),
            ("null", "sandboxed"),
            ("https://ui.example.com/", "\"https://ui.example.com\""),
            ("HTTPS://UI.example.com", "\"https://ui.example.com\""),
            ("https://ui.example.com:443", "\"https://ui.example.com\""),
            ("http://ui.example.com:80", "\"http://ui.example.com\""),
            ("http://[::1]:80", "\"http://[::1]\""),
            ("https://ui.example.com/app", "no path"),
            ("https://ui.example.com?x", "no path"),
            ("ui.example.com", "not an origin"),
            ("file:///tmp", "only http and https"),
            ("https://", "no host"),
            ("https://a b.example", "not allowed"),
            ("http://ui.example.com:0", "not a port"),
            ("http://ui.example.com:+80", "not a port"),
            ("http://u:p@ui.example.com", "no user name"),
            ("http://[zz]:80", "not an IPv6"),
            ("http://bücher.example", "xn--"),
        ] {
            let e = check_cors_origin(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
