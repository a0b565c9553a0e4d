//! The gate every request passes before its handler: a request id, the
//! `Host` check (DNS rebinding), authentication (ADR-023) and, after the
//! handler, one access-log line.
//!
//! The request id is generated here (a client-sent `x-request-id` is not
//! trusted: it would let clients forge log correlation), returned in the
//! `x-request-id` response header, and available to the handlers through
//! a task-local ([`request_id`]) so that a redacted error can name it.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, HOST, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use rand::RngCore;

use super::{HttpConfig, PeerInfo};
use store_ops::auth::{Auth, Identity};
use store_ops::Ops;
use store_ops::{ErrorCode, OpsError};

/// Response header: the request's id (also in the access and audit logs).
pub const HEADER_REQUEST_ID: &str = "x-request-id";

tokio::task_local! {
    static REQUEST_ID: RequestId;
}

/// The id of the request being handled on this task, if any.
pub(crate) fn request_id() -> Option<String> {
    REQUEST_ID.try_with(|id| id.as_str().to_string()).ok()
}

/// A request id: 64 random bits as 16 lowercase hex characters, held
/// inline (no allocation per request).
#[derive(Clone, Copy)]
struct RequestId([u8; 16]);

impl RequestId {
    fn new() -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let n = rand::rng().next_u64();
        let mut b = [0u8; 16];
        for (i, c) in b.iter_mut().enumerate() {
            *c = HEX[(n >> (60 - 4 * i)) as usize & 0xf];
        }
        RequestId(b)
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }

    /// The header's name, built without allocating (a `&str` name
    /// would be copied on every insert).
    const NAME: HeaderName = HeaderName::from_static(HEADER_REQUEST_ID);

    fn header(&self) -> HeaderValue {
        HeaderValue::from_bytes(&self.0).expect("hex digits are a valid header value")
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the gate needs, shared by every request.
pub(crate) struct Gate {
    pub(crate) ops: Ops,
    pub(crate) auth: Auth,
    /// Lowercase host names; empty accepts any, and so does `*` (the
    /// explicit form the configuration asks for).
    pub(crate) allowed_hosts: Vec<String>,
    /// The cache namespaces' own base paths (`http_path`, without a
    /// trailing `/`) and their namespaces, for the route labels.
    cache_paths: Vec<(String, String)>,
}

impl Gate {
    pub(crate) fn new(ops: Ops, cfg: &HttpConfig) -> Arc<Gate> {
        Arc::new(Gate {
            auth: cfg.auth.clone(),
            allowed_hosts: cfg
                .allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            cache_paths: ops
                .config()
                .cache_paths
                .iter()
                .map(|(path, ns)| (path.trim_end_matches('/').to_string(), ns.to_string()))
                .collect(),
            ops,
        })
    }

    /// Who makes `req`, if its `Host` is allowed: `host_not_allowed` or
    /// `unauthorized` otherwise.
    fn admit(&self, req: &Request, peer: Option<&PeerInfo>) -> Result<Identity, OpsError> {
        self.check_host(req)?;
        let authorization = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
        let cert = peer.and_then(|p| p.client_cert.as_ref());
        self.auth
            .authenticate(authorization, cert)
            .map_err(|e| OpsError::new(ErrorCode::Unauthorized, e.to_string()))
    }

    /// The `Host` check (DNS rebinding): the URI's authority, else the
    /// `Host` header, must name an allowed host (when any is configured).
    fn check_host(&self, req: &Request) -> Result<(), OpsError> {
        if self.allowed_hosts.is_empty() || self.allowed_hosts.iter().any(|h| h == "*") {
            return Ok(());
        }
        let host = match req.uri().authority() {
            Some(a) => Some(a.as_str()),
            None => req.headers().get(HOST).and_then(|v| v.to_str().ok()),
        }
        .map(host_part);
        let ok = host.is_some_and(|h| self.allowed_hosts.iter().any(|a| a.eq_ignore_ascii_case(h)));
        if !ok {
            return Err(OpsError::new(
                ErrorCode::HostNotAllowed,
                "this server does not answer for that Host (allowed_hosts)",
            ));
        }
        Ok(())
    }

    /// The route's label and namespace: [`route_of`], else
    /// [`base_path_route`].
    fn route<'p>(&self, path: &'p str) -> (Cow<'static, str>, Option<Cow<'p, str>>) {
        match route_of(path) {
            (UNKNOWN_ROUTE, None) => match base_path_route(&self.cache_paths, path) {
                Some((route, ns)) => (Cow::Owned(route), Some(Cow::Owned(ns.to_string()))),
                None => (Cow::Borrowed(UNKNOWN_ROUTE), None),
            },
            (route, ns) => (Cow::Borrowed(route), ns.map(Cow::Borrowed)),
        }
    }
}

/// A path under a cache namespace's own base path (`http_path`): its
/// label, `BASE` or `BASE/{key}` (a configured path, so the label set
/// stays bounded), and the namespace.
fn base_path_route<'c>(
    cache_paths: &'c [(String, String)],
    path: &str,
) -> Option<(String, &'c str)> {
    cache_paths.iter().find_map(|(base, ns)| {
        let rest = path.strip_prefix(base.as_str())?;
        if rest.is_empty() || rest == "/" {
            Some((base.clone(), ns.as_str()))
        } else if rest.starts_with('/') {
            Some((format!("{base}/{{key}}"), ns.as_str()))
        } else {
            None
        }
    })
}

/// The label of a path no route serves.
const UNKNOWN_ROUTE: &str = "(unknown)";

/// The host part of a `Host` value or URI authority: no port, no
/// brackets around an IPv6 literal, lowercase.
#[cfg(test)]
pub(crate) fn host_name(authority: &str) -> String {
    host_part(authority).to_ascii_lowercase()
}

/// [`host_name`] without the lowercasing (and so without allocating).
fn host_part(authority: &str) -> &str {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        match a.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => a,
        }
    };
    host.trim_end_matches('.')
}

/// The route's label and namespace for the access log (no digests or
/// tokens: the label is the route pattern).
fn route_of(path: &str) -> (&'static str, Option<&str>) {
    // The first five segments (no route has more; `..` patterns only
    // need to know there are more), without a Vec per request.
    let mut buf = [""; 5];
    let mut n = 0;
    for (slot, part) in buf.iter_mut().zip(path.trim_start_matches('/').split('/')) {
        *slot = part;
        n += 1;
    }
    match &buf[..n] {
        ["v1", "blobs", ns] => ("/v1/blobs/{ns}", Some(ns)),
        ["v1", "blobs", ns, _] => ("/v1/blobs/{ns}/{digest}", Some(ns)),
        ["v1", "have"] => ("/v1/have", None),
        ["v1", "tokens", _] => ("/v1/tokens/{token}", None),
        ["v1", "sweep"] => ("/v1/sweep", None),
        ["v1", "refs", ns] => ("/v1/refs/{ns}", Some(ns)),
        ["v1", "refs", ns, ..] => ("/v1/refs/{ns}/{name}", Some(ns)),
        ["v1", "namespaces"] => ("/v1/namespaces", None),
        ["v1", "namespaces", ns, "entries"] => ("/v1/namespaces/{ns}/entries", Some(ns)),
        ["v1", "stats"] => ("/v1/stats", None),
        ["v1", "verify"] => ("/v1/verify", None),
        ["v1", "uploads", ns] => ("/v1/uploads/{ns}", Some(ns)),
        ["v1", "uploads", ns, _] => ("/v1/uploads/{ns}/{id}", Some(ns)),
        ["health"] => ("/health", None),
        ["metrics"] => ("/metrics", None),
        ["cache", ns] | ["cache", ns, ""] => ("/cache/{ns}", Some(ns)),
        ["cache", ns, ..] => ("/cache/{ns}/{key}", Some(ns)),
        _ => (UNKNOWN_ROUTE, None),
    }
}

/// A JSON error answer from the gate itself (before any handler).
fn refuse(ops: &Ops, e: OpsError, id: RequestId) -> Response {
    ops.metrics().error(e.code);
    let status = StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::BAD_REQUEST);
    let mut resp = (status, Json(e.body())).into_response();
    if e.code == ErrorCode::Unauthorized {
        resp.headers_mut().insert(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"blobpool\""),
        );
        // Build tools send the key as a Basic password.
        resp.headers_mut().append(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"blobpool\""),
        );
    }
    resp.headers_mut().insert(RequestId::NAME, id.header());
    resp
}

/// A `Content-Length` header's value; 0 when absent or invalid.
fn content_length(h: &HeaderMap) -> u64 {
    h.get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
}

/// The middleware. Per request it reads the clock twice (the latency
/// histogram and the access log share one measurement) and allocates
/// only the request id's header value; what only the access log needs
/// (the peer's address, the identity's name, the namespace) is kept
/// when that log is on (ADR-056).
pub(crate) async fn gate(State(gate): State<Arc<Gate>>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = RequestId::new();
    let method = req.method().clone();
    // A `Uri` clone shares its bytes: the route label borrows from it.
    let uri = req.uri().clone();
    let (route, ns) = gate.route(uri.path());
    let req_bytes = content_length(req.headers());
    let peer = req.extensions().get::<PeerInfo>();
    let remote = peer.map(|p| p.remote);
    let outcome = gate.admit(&req, peer);
    let logged = tracing::enabled!(target: "blobpool::access", tracing::Level::INFO);

    let (identity_name, mut resp) = match outcome {
        Ok(identity) => {
            let name = logged.then(|| identity.name().to_string());
            req.extensions_mut().insert(identity);
            let resp = REQUEST_ID.scope(id, next.run(req)).await;
            (name, resp)
        }
        Err(e) => (None, refuse(&gate.ops, e, id)),
    };
    resp.headers_mut().insert(RequestId::NAME, id.header());
    let elapsed = started.elapsed().as_secs_f64();
    gate.ops
        .metrics()
        .request(route.clone(), method.as_str(), elapsed);
    if logged {
        access_log(AccessLine {
            id,
            remote,
            identity: identity_name.as_deref().unwrap_or("-"),
            method: &method,
            route: &route,
            ns: ns.as_deref().unwrap_or("-"),
            resp: &resp,
            req_bytes,
            elapsed,
        });
    }
    resp
}

/// What one access-log line says.
struct AccessLine<'a> {
    id: RequestId,
    remote: Option<std::net::SocketAddr>,
    identity: &'a str,
    method: &'a axum::http::Method,
    route: &'a str,
    ns: &'a str,
    resp: &'a Response,
    req_bytes: u64,
    elapsed: f64,
}

fn access_log(l: AccessLine<'_>) {
    let remote = l.remote.map_or_else(|| "-".to_string(), |r| r.to_string());
    tracing::info!(
        target: "blobpool::access",
        request_id = %l.id,
        remote = %remote,
        identity = %l.identity,
        method = %l.method,
        route = %l.route,
        namespace = l.ns,
        status = l.resp.status().as_u16(),
        request_bytes = l.req_bytes,
        response_bytes = content_length(l.resp.headers()),
        // Time to the response head; bodies stream after it.
        duration_ms = l.elapsed * 1000.0,
        "request"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_drop_ports_and_brackets() {
        assert_eq!(host_name("Example.COM:8080"), "example.com");
        assert_eq!(host_name("localhost"), "localhost");
        assert_eq!(host_name("[::1]:7070"), "::1");
        assert_eq!(host_name("127.0.0.1:7070"), "127.0.0.1");
        assert_eq!(host_name("blobs.example.com."), "blobs.example.com");
    }

    #[test]
    fn routes_are_labelled_without_secrets() {
        assert_eq!(
            route_of("/v1/blobs/docs/abc"),
            ("/v1/blobs/{ns}/{digest}", Some("docs"))
        );
        assert_eq!(route_of("/v1/tokens/secret"), ("/v1/tokens/{token}", None));
        assert_eq!(route_of("/nope"), ("(unknown)", None));
        assert_eq!(route_of("/v1/uploads/up"), ("/v1/uploads/{ns}", Some("up")));
        assert_eq!(
            route_of("/v1/uploads/up/0a1b2c3d-ff"),
            ("/v1/uploads/{ns}/{id}", Some("up"))
        );
        assert_eq!(route_of("/cache/cc/a/b"), ("/cache/{ns}/{key}", Some("cc")));
    }

    #[test]
    fn base_paths_are_labelled_by_their_configured_path() {
        let paths = vec![("/bazel".to_string(), "bazel".to_string())];
        let r = |p: &str| base_path_route(&paths, p);
        assert_eq!(r("/bazel"), Some(("/bazel".to_string(), "bazel")));
        assert_eq!(r("/bazel/"), Some(("/bazel".to_string(), "bazel")));
        assert_eq!(
            r("/bazel/cas/0123abcd"),
            Some(("/bazel/{key}".to_string(), "bazel"))
        );
        // A path that only shares the prefix is not under the base path.
        assert_eq!(r("/bazelisk/x"), None);
        assert_eq!(r("/other"), None);
    }
}
