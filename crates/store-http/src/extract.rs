//! The extractors that stand in for every handler's preamble: the caller
//! ([`Caller`]), the typed path ([`PathOf`]), `Content-Type:
//! application/json` ([`JsonType`]) and all three with the route's scope
//! checked ([`Authorized`]). A rejection is the handler's own error answer
//! ([`fail`]); extractors run in argument order, so a handler lists them
//! in the order its errors take precedence.

use std::marker::PhantomData;

use axum::extract::{FromRequestParts, Path};
use axum::http::header::CONTENT_TYPE;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::respond::fail;
use store_ops::auth::{Identity, Scope};
use store_ops::Ops;
use store_ops::{ErrorCode, OpsError};

/// The caller's identity, which the gate put into the request's
/// extensions, taken out of them: axum's `Extension` extractor would clone
/// it (a name and a list of grants) for every request.
pub(crate) struct Caller(pub(crate) Identity);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Response> {
        let no_gate = (
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request passed no gate (no identity)",
        );
        let identity = parts.extensions.remove::<Identity>();
        identity.map(Caller).ok_or_else(|| no_gate.into_response())
    }
}

/// The path parameters as `T` (`String`, `(String, String)`); a path that
/// does not decode is `400 bad_request` "invalid path: …".
pub(crate) struct PathOf<T>(pub(crate) T);

impl<T: DeserializeOwned + Send> FromRequestParts<Ops> for PathOf<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, ops: &Ops) -> Result<Self, Response> {
        let invalid = |e| fail(ops, OpsError::bad_request(format!("invalid path: {e}")));
        Path::<T>::from_request_parts(parts, ops)
            .await
            .map(|Path(p)| PathOf(p))
            .map_err(invalid)
    }
}

/// A JSON request body as `T`; one that does not parse is `400
/// bad_request` "invalid `what`: …".
pub(crate) fn json_body<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, OpsError> {
    serde_json::from_slice(bytes).map_err(|e| OpsError::bad_request(format!("invalid {what}: {e}")))
}

/// A request's `Content-Length`, if it sends one; a value that is not a
/// number is `400 bad_request`.
pub(crate) fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, OpsError> {
    let Some(v) = headers.get(axum::http::header::CONTENT_LENGTH) else {
        return Ok(None);
    };
    match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
        Some(n) => Ok(Some(n)),
        None => Err(OpsError::bad_request("invalid Content-Length header")),
    }
}

/// Requires `Content-Type: application/json` (parameters allowed): a
/// browser cannot send it cross-site without a CORS preflight, which this
/// server answers only for configured origins.
pub(crate) struct JsonType;

impl FromRequestParts<Ops> for JsonType {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, ops: &Ops) -> Result<Self, Response> {
        let json = (parts.headers.get(CONTENT_TYPE))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
        if json {
            return Ok(JsonType);
        }
        let message = "this route takes Content-Type: application/json";
        Err(fail(
            ops,
            OpsError::new(ErrorCode::UnsupportedMediaType, message),
        ))
    }
}

/// A scope a route requires, as a type: [`Read`], [`Write`], [`Admin`],
/// and [`Json`] of one for a route that also takes JSON.
pub(crate) trait Need {
    const SCOPE: Scope;
    /// Whether `Content-Type: application/json` is required (checked
    /// after the path, before the scope).
    const JSON: bool = false;
}

macro_rules! needs {
    ($($(#[$doc:meta])* $name:ident),*) => {$(
        $(#[$doc])* pub(crate) struct $name;
        impl Need for $name {
            const SCOPE: Scope = Scope::$name;
        }
    )*};
}
needs!(
    /// The `read` scope.
    Read,
    /// The `write` scope.
    Write,
    /// The `admin` scope.
    Admin
);

/// Scope `N` on a route that takes `Content-Type: application/json`.
pub(crate) struct Json<N>(PhantomData<N>);

impl<N: Need> Need for Json<N> {
    const SCOPE: Scope = N::SCOPE;
    const JSON: bool = true;
}

/// Path parameters an [`Authorized`] route takes; the first one, when
/// there is one, is the namespace the scope applies to.
pub(crate) trait Params: DeserializeOwned + Default + Send {
    /// `false` for `()`: a route without parameters (the scope is global).
    const IN_PATH: bool = true;
    fn ns(&self) -> Option<&str>;
}

impl Params for () {
    const IN_PATH: bool = false;
    fn ns(&self) -> Option<&str> {
        None
    }
}
impl Params for String {
    fn ns(&self) -> Option<&str> {
        Some(self)
    }
}
impl Params for (String, String) {
    fn ns(&self) -> Option<&str> {
        Some(&self.0)
    }
}

/// The caller, allowed scope `N` on the path's namespace (or globally,
/// for `P = ()`), and the path: [`PathOf`], then [`JsonType`] when `N`
/// asks for it, then `401`/`403` for want of the scope.
pub(crate) struct Authorized<N, P = ()> {
    pub(crate) who: Identity,
    pub(crate) path: P,
    need: PhantomData<N>,
}

impl<N: Need, P: Params> FromRequestParts<Ops> for Authorized<N, P> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, ops: &Ops) -> Result<Self, Response> {
        let path = if P::IN_PATH {
            PathOf::<P>::from_request_parts(parts, ops).await?.0
        } else {
            P::default()
        };
        if N::JSON {
            JsonType::from_request_parts(parts, ops).await?;
        }
        let Caller(who) = Caller::from_request_parts(parts, ops).await?;
        match ops.authorize(&who, N::SCOPE, path.ns()) {
            Ok(()) => Ok(Authorized {
                who,
                path,
                need: PhantomData,
            }),
            Err(e) => Err(fail(ops, e)),
        }
    }
}
