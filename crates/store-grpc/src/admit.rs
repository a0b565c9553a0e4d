//! What every gRPC request passes before tonic decodes it (ADR-074,
//! ADR-077), in this order:
//!
//! - **Who calls, from where.** The caller is authenticated once, from
//!   its request headers, before any byte of its body is read: the
//!   `authorization` header (`Bearer <key>` or `Basic`) or the verified
//!   client certificate in the request's extensions, with the handlers'
//!   [`Auth`](store_ops::auth::Auth) ([`crate::Shared::authenticate`]).
//!   The host it names (HTTP/2's `:authority`, else HTTP/1.1's `Host`) is
//!   checked against [`crate::GrpcConfig::allowed_hosts`] with the HTTP
//!   gate's rule ([`HostCheck::admit`](store_ops::hosts::HostCheck::admit)):
//!   refused for a caller without credentials, ignored for one that
//!   proves an identity. A caller refused here is answered at once with
//!   the handlers' status (`UNAUTHENTICATED` for a key that matches none,
//!   `PERMISSION_DENIED` for the host), and so is, on a server that
//!   grants anonymous callers nothing, a caller without credentials
//!   (`UNAUTHENTICATED`), but for `Capabilities` ([`Admit::anyone`]): the
//!   inner service is not called and no budget is taken. An admitted
//!   caller's [`Admitted`] identity rides in the request's extensions to
//!   [`crate::call::Call::identity`], which applies the scopes (tonic's
//!   `Request` keeps no URI, hence the extension).
//! - **The memory budget.** Each gRPC message's length (its 5-byte frame
//!   header, read as the body streams in) is taken from the server's
//!   byte budget ([`crate::GrpcConfig::message_memory`]) *before* tonic
//!   buffers and decodes it, without waiting: a message the budget cannot
//!   take at once fails the call with `RESOURCE_EXHAUSTED`. A unary
//!   call's permit is held until its response body is dropped (its
//!   answer is built and sent); a client stream's (`ByteStream.Write`)
//!   passes from one message to the next. Handlers add what their
//!   answers hold ([`Held::hold`]: `BatchReadBlobs`). `Capabilities`
//!   messages (at most [`SMALL_MESSAGE`]) take none: anyone may send
//!   them. On a server with keys or certificates, the callers without
//!   credentials it admits (it grants anonymous callers something) share
//!   a quarter of the budget ([`ANONYMOUS_SHARE`], ADR-079): together they
//!   cannot take what the callers who proved an identity need. (On an
//!   open server everyone is anonymous and has the whole budget.)

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::http::header::{AUTHORIZATION, HOST};
use axum::http::{Request, Response};
use bytes::{Buf, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use store_ops::auth::Identity;
use store_ops::{ErrorCode, OpsError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::Status;
use tower_service::Service;

use crate::Shared;

/// The part of the budget that callers without credentials share, as a
/// divisor of the whole (ADR-079): a quarter.
pub(crate) const ANONYMOUS_SHARE: usize = 4;

/// The server's budget of gRPC message bytes held at once, and the part
/// of it that anonymous callers share.
pub(crate) struct Budget {
    all: Pool,
    anonymous: Pool,
}

/// Bytes to take from, now or never.
struct Pool {
    sem: Arc<Semaphore>,
    total: usize,
    /// Whose bytes these are, for the refusal's message.
    what: &'static str,
}

/// Bytes taken from the budget: from the whole and, for an anonymous
/// caller, from the anonymous share; given back when dropped.
pub(crate) struct Permit {
    _all: OwnedSemaphorePermit,
    _anonymous: Option<OwnedSemaphorePermit>,
}

impl Budget {
    /// A budget of `total` bytes, of which `total / ANONYMOUS_SHARE`
    /// for anonymous callers.
    pub(crate) fn new(total: usize) -> Budget {
        let total = total.min(Semaphore::MAX_PERMITS);
        Budget {
            all: Pool::new(total, "gRPC messages"),
            anonymous: Pool::new(total / ANONYMOUS_SHARE, "anonymous callers' gRPC messages"),
        }
    }

    /// `bytes` of the budget for a caller, now or never (`too_many`,
    /// naming what the server holds); an `anonymous` caller's also from
    /// the anonymous share, first.
    fn take(&self, bytes: usize, anonymous: bool) -> Result<Option<Permit>, OpsError> {
        if bytes == 0 {
            return Ok(None);
        }
        let anonymous = match anonymous {
            true => Some(self.anonymous.take(bytes)?),
            false => None,
        };
        Ok(Some(Permit {
            _all: self.all.take(bytes)?,
            _anonymous: anonymous,
        }))
    }
}

impl Pool {
    fn new(total: usize, what: &'static str) -> Pool {
        Pool {
            sem: Arc::new(Semaphore::new(total)),
            total,
            what,
        }
    }

    fn take(&self, bytes: usize) -> Result<OwnedSemaphorePermit, OpsError> {
        let n = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.sem.clone().try_acquire_many_owned(n).map_err(|_| {
            let held = self.total - self.sem.available_permits();
            OpsError::new(
                ErrorCode::TooMany,
                format!(
                    "the server is holding {} of {} (its limit is {}) and \
                     cannot take {} more now; retry, or send large blobs over ByteStream",
                    mib(held),
                    self.what,
                    mib(self.total),
                    mib(bytes)
                ),
            )
        })
    }
}

/// `bytes` in MiB, for people.
fn mib(bytes: usize) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The longest `Capabilities` message (its decoding limit): its request
/// names an instance, nothing more.
pub(crate) const SMALL_MESSAGE: usize = 4 << 10;

/// The identity of an admitted request's caller (in its extensions).
#[derive(Clone)]
pub(crate) struct Admitted(pub(crate) Identity);

/// The budget a call holds, released when the last of its request body,
/// its handler's request and its response body is dropped.
#[derive(Default)]
pub(crate) struct Held {
    /// Whether the caller has no credentials (takes from the anonymous
    /// share too).
    anonymous: bool,
    /// The current request message's bytes.
    message: Mutex<Option<Permit>>,
    /// What the handler added for its answer.
    answer: Mutex<Vec<Permit>>,
}

/// The handle a request's extensions carry.
#[derive(Clone, Default)]
pub(crate) struct HeldRef(pub(crate) Arc<Held>);

impl HeldRef {
    /// A call's, for a caller with or without credentials.
    fn new(anonymous: bool) -> HeldRef {
        HeldRef(Arc::new(Held {
            anonymous,
            ..Held::default()
        }))
    }
}

impl Held {
    /// Takes `bytes` more of `shared`'s budget for the call's answer, or
    /// refuses at once (`too_many`).
    pub(crate) fn hold(&self, shared: &Shared, bytes: u64) -> Result<(), OpsError> {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        if let Some(p) = shared.budget.take(bytes, self.anonymous)? {
            self.answer
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(p);
        }
        Ok(())
    }

    fn replace_message(&self, p: Option<Permit>) {
        *self.message.lock().unwrap_or_else(|e| e.into_inner()) = p;
    }
}

/// A service of [`crate::routes`] behind the caller's admission and the
/// budget.
#[derive(Clone)]
pub(crate) struct Admit<S> {
    inner: S,
    shared: Arc<Shared>,
    /// The longest message that takes the budget: the service's decoding
    /// limit (tonic refuses a longer one from its header); 0: none does.
    budgeted: usize,
    /// Whether callers without credentials are admitted even where they
    /// are granted nothing.
    anyone: bool,
}

impl<S> Admit<S> {
    /// `inner` (a cache service, decoding messages up to `limit` bytes)
    /// behind the checks, with `shared`'s configuration and budget.
    pub(crate) fn new(inner: S, shared: Arc<Shared>, limit: usize) -> Admit<S> {
        Admit {
            inner,
            shared,
            budgeted: limit,
            anyone: false,
        }
    }

    /// `inner` (`Capabilities`, decoding messages up to [`SMALL_MESSAGE`])
    /// behind the host and credential checks: callers without credentials
    /// are answered on any server, and its messages take no budget.
    pub(crate) fn anyone(inner: S, shared: Arc<Shared>) -> Admit<S> {
        Admit {
            inner,
            shared,
            budgeted: 0,
            anyone: true,
        }
    }

    /// The caller of `req`, from its headers (one authentication per
    /// call): its identity, or why it is refused before its body is read
    /// (the handlers' `unauthorized` or `host_not_allowed`; `unauthorized`
    /// without credentials where those are granted nothing).
    fn admit<B>(&self, req: &Request<B>) -> Result<Identity, OpsError> {
        let authority = match req.uri().authority() {
            Some(a) => Some(a.as_str()),
            None => req.headers().get(HOST).and_then(|v| v.to_str().ok()),
        };
        let authorization = req.headers().get(AUTHORIZATION).map(|v| v.as_bytes());
        let identity = (self.shared).authenticate(authorization, req.extensions(), authority)?;
        let auth = &self.shared.cfg.auth;
        if identity.is_anonymous()
            && auth.is_enabled()
            && auth.anonymous_grants().is_empty()
            && !self.anyone
        {
            return Err(OpsError::new(
                ErrorCode::Unauthorized,
                "authentication required: this server grants anonymous requests nothing; \
                 send an API key (`authorization: Bearer <key>`) or a client certificate",
            ));
        }
        Ok(identity)
    }

    /// The answer to a caller refused with `e` (counted in the errors,
    /// with an access line; not timed: the handler's route label is not
    /// known, and `path` is the caller's).
    fn refuse(&self, path: &str, e: &OpsError, started: std::time::Instant) -> Response<Body> {
        self.shared.ops.metrics().error(e.code);
        let status = crate::call::status(e);
        let secs = started.elapsed().as_secs_f64();
        crate::call::access("-", path, status.code() as i32, secs);
        status.into_http()
    }
}

impl<S: NamedService> NamedService for Admit<S> {
    const NAME: &'static str = S::NAME;
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<S> Service<Request<Body>> for Admit<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Body>) -> BoxFuture {
        let started = std::time::Instant::now();
        let identity = match self.admit(&req) {
            Ok(identity) => identity,
            Err(e) => {
                let refused = self.refuse(req.uri().path(), &e, started);
                return Box::pin(std::future::ready(Ok(refused)));
            }
        };
        // On an open server everyone is anonymous, and shares it all.
        let anonymous = identity.is_anonymous() && self.shared.cfg.auth.is_enabled();
        let held = HeldRef::new(anonymous);
        req.extensions_mut().insert(Admitted(identity));
        req.extensions_mut().insert(held.clone());
        let shared = self.shared.clone();
        let metered = held.clone();
        let budgeted = self.budgeted;
        let req = req.map(move |b| Body::new(Metered::new(b, shared, metered, budgeted)));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let resp = fut.await?;
            Ok(resp.map(|b| {
                Body::new(Holding {
                    inner: b,
                    _held: held,
                })
            }))
        })
    }
}

/// A request body that takes each gRPC message's length from the budget
/// as its frame header passes (the bytes themselves pass unchanged).
struct Metered {
    inner: Body,
    shared: Arc<Shared>,
    held: HeldRef,
    /// The longest message that takes the budget ([`Admit`]'s).
    budgeted: usize,
    /// The frame header being read, and how much of it has been.
    header: [u8; 5],
    have: usize,
    /// The current message's bytes still to pass.
    remaining: usize,
    failed: bool,
}

impl Metered {
    fn new(inner: Body, shared: Arc<Shared>, held: HeldRef, budgeted: usize) -> Metered {
        Metered {
            inner,
            shared,
            held,
            budgeted,
            header: [0; 5],
            have: 0,
            remaining: 0,
            failed: false,
        }
    }

    /// Walks `data`'s frame headers and message bytes, admitting each
    /// message whose header completes.
    fn observe(&mut self, mut data: &[u8]) -> Result<(), Status> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data.advance(n);
                continue;
            }
            let n = (5 - self.have).min(data.len());
            self.header[self.have..self.have + n].copy_from_slice(&data[..n]);
            self.have += n;
            data.advance(n);
            if self.have == 5 {
                self.have = 0;
                let len = u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]) as usize;
                self.remaining = len;
                self.admit(len)?;
            }
        }
        Ok(())
    }

    /// Admits a message of `len` bytes: the previous message's bytes are
    /// given back first. Longer than the service decodes: tonic refuses
    /// it from its header, before buffering it, so it takes nothing.
    fn admit(&self, len: usize) -> Result<(), Status> {
        let held = &self.held.0;
        held.replace_message(None);
        let weight = if len > self.budgeted { 0 } else { len };
        match self.shared.budget.take(weight, held.anonymous) {
            Ok(p) => {
                held.replace_message(p);
                Ok(())
            }
            Err(e) => {
                self.shared.ops.metrics().error(e.code);
                tracing::debug!("gRPC message refused: {}", e.message);
                Err(crate::call::status(&e))
            }
        }
    }
}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let frame = match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
            Some(Ok(f)) => f,
            other => return Poll::Ready(other),
        };
        if let Some(data) = frame.data_ref() {
            let data = data.clone();
            if let Err(s) = self.observe(&data) {
                self.failed = true;
                return Poll::Ready(Some(Err(s)));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its call's budget until it is dropped.
struct Holding {
    inner: Body,
    _held: HeldRef,
}

impl HttpBody for Holding {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
