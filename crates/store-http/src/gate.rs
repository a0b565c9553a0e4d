//! The gate every request passes before its handler: a request id, the
//! `Host` check (DNS rebinding), authentication (ADR-023) and, after the
//! handler, one access-log line.
//!
//! The request id is generated here (a client-sent `x-request-id` is not
//! trusted: it would let clients forge log correlation), returned in the
//! `x-request-id` response header, and available to the handlers through
//! a task-local ([`request_id`]) so that a redacted error can name it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{AUTHORIZATION, HOST};
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use rand::RngCore;

use super::extract::declared_length;
use super::respond::fail;
use super::routes::{label, ns_segment, LABELS, ROUTES};
use super::{HttpConfig, PeerInfo};
use store_ops::auth::{Auth, Identity};
use store_ops::hosts::HostCheck;
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
    /// The allowed hosts (store-ops' [`HostCheck`], shared with gRPC):
    /// none accepts any, and so does `*` (the explicit form the
    /// configuration asks for).
    pub(crate) hosts: HostCheck,
    /// The label and the namespace's place of every path template the
    /// router mounts, by template (the cache namespaces' base paths
    /// beside [`ROUTES`]).
    labels: HashMap<String, Label>,
}

/// A route's label in metrics and access lines, and where its namespace is.
struct Label {
    route: Cow<'static, str>,
    ns: Ns,
}

/// Where a route names its namespace.
enum Ns {
    None,
    /// The path's `/`-separated segment.
    Segment(usize),
    /// The route's own: a cache namespace's base path.
    Fixed(String),
}

impl Gate {
    pub(crate) fn new(ops: Ops, cfg: &HttpConfig) -> Arc<Gate> {
        Arc::new(Gate {
            auth: cfg.auth.clone(),
            hosts: HostCheck::new(&cfg.allowed_hosts),
            labels: labels(&ops),
            ops,
        })
    }

    /// Who makes `req`: `unauthorized` without valid credentials where
    /// they are needed, `host_not_allowed` for a request without
    /// credentials (anonymous, or any on an open server) whose `Host` is
    /// not allowed. A request that proves an identity (key or client
    /// certificate) is answered under any `Host`: a DNS-rebinding page
    /// cannot send the credentials of the server's origin (ADR-067).
    fn admit(&self, req: &Request, peer: Option<&PeerInfo>) -> Result<Identity, OpsError> {
        let authorization = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
        let cert = peer.and_then(|p| p.client_cert.as_ref());
        let id = self
            .auth
            .authenticate(authorization, cert)
            .map_err(|e| OpsError::new(ErrorCode::Unauthorized, e.to_string()));
        HostCheck::admit(self.check_host(req), id)
    }

    /// The `Host` check (DNS rebinding): the URI's authority, else the
    /// `Host` header, must name an allowed host (when any is configured).
    fn check_host(&self, req: &Request) -> Result<(), OpsError> {
        let authority = match req.uri().authority() {
            Some(a) => Some(a.as_str()),
            None => req.headers().get(HOST).and_then(|v| v.to_str().ok()),
        };
        self.hosts.check(authority)
    }

    /// The label and namespace place of the route that matched.
    fn route(&self, matched: Option<&MatchedPath>) -> (Cow<'static, str>, &Ns) {
        match matched.and_then(|m| self.labels.get(m.as_str())) {
            Some(l) => (l.route.clone(), &l.ns),
            None => (Cow::Borrowed(UNKNOWN_ROUTE), &Ns::None),
        }
    }
}

/// The labels of the route table's templates (borrowed from [`LABELS`])
/// and of the cache namespaces' base paths (`BASE`, `BASE/`,
/// `BASE/{*key}`).
fn labels(ops: &Ops) -> HashMap<String, Label> {
    let mut out = HashMap::new();
    for r in ROUTES {
        let ns = ns_segment(r.path).map_or(Ns::None, Ns::Segment);
        let route = Cow::Borrowed(LABELS[r.path].as_str());
        out.insert(r.path.to_string(), Label { route, ns });
    }
    for (path, ns) in &ops.config().cache_paths {
        let base = path.trim_end_matches('/');
        for p in [
            base.to_string(),
            format!("{base}/"),
            format!("{base}/{{*key}}"),
        ] {
            let (route, ns) = (Cow::Owned(label(&p)), Ns::Fixed(ns.to_string()));
            out.insert(p, Label { route, ns });
        }
    }
    out
}

/// The label of a path no route serves.
const UNKNOWN_ROUTE: &str = "(unknown)";

/// The middleware. Per request it reads the clock twice (the latency
/// histogram and the access log share one measurement) and allocates
/// only the request id's header value; what only the access log needs
/// (the peer's address, the identity's name, the namespace) is kept
/// when that log is on (ADR-056).
pub(crate) async fn gate(State(gate): State<Arc<Gate>>, mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = RequestId::new();
    let method = req.method().clone();
    let (route, ns) = gate.route(req.extensions().get::<MatchedPath>());
    let logged = tracing::enabled!(target: "blobpool::access", tracing::Level::INFO);
    // Only the access line names the namespace (a `Uri` clone shares its
    // bytes: the namespace borrows from it).
    let uri = logged.then(|| req.uri().clone());
    let ns = match (ns, &uri) {
        (Ns::Segment(i), Some(uri)) => uri.path().split('/').nth(*i),
        (Ns::Fixed(ns), Some(_)) => Some(ns.as_str()),
        _ => None,
    };
    let req_bytes = declared_length(req.headers()).ok().flatten().unwrap_or(0);
    let peer = req.extensions().get::<PeerInfo>();
    let remote = peer.map(|p| p.remote);
    let outcome = gate.admit(&req, peer);

    let (identity_name, mut resp) = match outcome {
        Ok(identity) => {
            let name = logged.then(|| identity.name().to_string());
            req.extensions_mut().insert(identity);
            let resp = REQUEST_ID.scope(id, next.run(req)).await;
            (name, resp)
        }
        // The handlers' error answer, logged under the request's id.
        Err(e) => (None, REQUEST_ID.sync_scope(id, || fail(&gate.ops, e))),
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
            ns: ns.unwrap_or("-"),
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
        response_bytes = declared_length(l.resp.headers()).ok().flatten().unwrap_or(0),
        // Time to the response head; bodies stream after it.
        duration_ms = l.elapsed * 1000.0,
        "request"
    );
}
