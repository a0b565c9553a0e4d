//! gRPC beside HTTP on one port: a request whose `content-type` starts
//! with `application/grpc` goes to the gRPC routes, every other one to
//! the HTTP router. The connection layer already speaks HTTP/2 (cleartext
//! prior knowledge, or ALPN `h2` under TLS), so `grpc://` and `grpcs://`
//! clients reach the same listener as HTTP clients.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use axum::routing::future::RouteFuture;
use axum::Router;
use store_ops::Ops;
use tower_service::Service;

use crate::GrpcConfig;

/// `http` with the gRPC services over `ops` mounted beside it (see the
/// module docs). The HTTP router's layers (its gate: `Host` check,
/// authentication, access log) do not see gRPC requests: the gRPC
/// services authenticate their own metadata with `cfg.auth`, apply the
/// same `Host` rule with `cfg.allowed_hosts` and bound their messages'
/// memory with `cfg.message_memory` (ADR-074).
pub fn mount(http: Router, ops: Ops, cfg: GrpcConfig) -> Router {
    let grpc = crate::routes(ops, cfg).prepare().into_axum_router();
    Router::new().fallback_service(Switch { http, grpc })
}

/// The content-type switch.
#[derive(Clone)]
struct Switch {
    http: Router,
    grpc: Router,
}

fn is_grpc(req: &Request) -> bool {
    (req.headers().get(axum::http::header::CONTENT_TYPE))
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

impl Service<Request<Body>> for Switch {
    type Response = Response;
    type Error = Infallible;
    type Future = RouteFuture<Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both routers are always ready (axum's `Router` is).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if is_grpc(&req) {
            self.grpc.call(req)
        } else {
            self.http.call(req)
        }
    }
}
