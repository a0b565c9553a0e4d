//! The axum handlers: HTTP in, [`Ops`] call, HTTP out.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};
use axum::http::header::{
    ACCEPT, ACCEPT_RANGES, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG,
    LOCATION, RANGE, RETRY_AFTER, VARY,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::{
    bao_body, blob_body, body_reader, buffered_body, have_body_limit, read_limited, BUFFERED_MAX,
};
use super::gate::request_id;
use super::{
    HEADER_BAO_RANGE, HEADER_CREATED_AT, HEADER_DEDUPLICATED, HEADER_DIGEST, HEADER_EXPECT_DIGEST,
    HEADER_SIZE, HEADER_TIER,
};
use store_ops::auth::{Identity, Scope};
use store_ops::bao::BAO_MEDIA_TYPE;
use store_ops::payload::{HaveRequest, StatResponse};
use store_ops::range::parse_range_header;
use store_ops::Ops;
use store_ops::{ErrorCode, OpsError};

/// The caller's identity, which the gate put into the request's
/// extensions, taken out of them: axum's `Extension` extractor would clone
/// it (a name and a list of grants) for every request.
pub(super) struct Caller(pub(super) Identity);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Response> {
        match parts.extensions.remove::<Identity>() {
            Some(identity) => Ok(Caller(identity)),
            None => Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request passed no gate (no identity)",
            )
                .into_response()),
        }
    }
}

/// What a client is told instead of an internal error's message (which
/// may name paths, pids or backend addresses): the request id under which
/// the server logged it.
pub(crate) fn redacted_message() -> String {
    match request_id() {
        Some(id) => format!("internal error; the server log has the details under request id {id}"),
        None => "internal error; the server log has the details".to_string(),
    }
}

/// The JSON error answer; counts the error. An `internal` error's message
/// is logged with the request id and replaced by [`redacted_message`].
pub(super) fn fail(ops: &Ops, mut e: OpsError) -> Response {
    ops.metrics().error(e.code);
    let status =
        StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let id = request_id().unwrap_or_default();
    // A token-cap refusal is expected under load and is logged (rate
    // limited) where it is raised; per-request lines would flood the log.
    if status.is_server_error() && e.code != ErrorCode::TooManyTokens {
        tracing::warn!(request_id = %id, "{e}");
    } else {
        tracing::debug!(request_id = %id, "{e}");
    }
    if e.code.redacts_message() {
        e.message = redacted_message();
    }
    let mut resp = (status, Json(e.body())).into_response();
    if e.code == ErrorCode::Unauthorized {
        resp.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"blobpool\""),
        );
        // Build tools send the key as a Basic password.
        resp.headers_mut().append(
            axum::http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"blobpool\""),
        );
    }
    if let (ErrorCode::InvalidRange, Some(size)) = (e.code, e.size) {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
            resp.headers_mut().insert(CONTENT_RANGE, v);
        }
    }
    if let (ErrorCode::UploadOffset, Some(offset)) = (e.code, e.size) {
        super::uploads::offset_headers(resp.headers_mut(), offset);
    }
    if let Some(after) = e.retry_after {
        // Whole seconds, rounded up, at least 1 (RFC 9110 §10.2.3).
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        resp.headers_mut()
            .insert(RETRY_AFTER, value(secs.max(1).to_string()));
    }
    resp
}

/// Requires `Content-Type: application/json` (parameters allowed): a
/// browser cannot send it cross-site without a CORS preflight, which this
/// server answers only for configured origins.
pub(super) fn require_json(headers: &HeaderMap) -> Result<(), OpsError> {
    let ok = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if ok {
        Ok(())
    } else {
        Err(OpsError::new(
            ErrorCode::UnsupportedMediaType,
            "this route takes Content-Type: application/json",
        ))
    }
}

/// One audit line: who did what to which key, and how it ended.
pub(super) fn audit(identity: &Identity, action: &str, target: &str, outcome: &str) {
    tracing::info!(
        target: "blobpool::audit",
        request_id = %request_id().unwrap_or_default(),
        identity = identity.name(),
        action,
        target,
        outcome,
        "audit"
    );
}

pub(super) fn outcome<T>(r: &Result<T, OpsError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    }
}

pub(super) fn path_error(e: PathRejection) -> OpsError {
    OpsError::bad_request(format!("invalid path: {e}"))
}

fn header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

pub(super) fn value(s: impl AsRef<str>) -> HeaderValue {
    HeaderValue::from_str(s.as_ref()).expect("header values built here are visible ASCII")
}

/// A header value over `b` without copying it.
fn shared_value(b: bytes::Bytes) -> HeaderValue {
    HeaderValue::from_maybe_shared(b).expect("header values built here are visible ASCII")
}

/// Headers describing an entry (shared by `GET` and `HEAD`).
pub(super) fn entry_headers(h: &mut HeaderMap, digest: &str, tier: store_core::Tier) {
    let mut quoted = Vec::with_capacity(digest.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(digest.as_bytes());
    quoted.push(b'"');
    entry_headers_quoted(h, quoted, tier);
}

/// [`entry_headers`] of a digest, its hex written once into the buffer
/// the ETag and the digest header share.
fn entry_headers_of(h: &mut HeaderMap, digest: &store_core::Digest, tier: store_core::Tier) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut quoted = Vec::with_capacity(66);
    quoted.push(b'"');
    for b in digest.as_bytes() {
        quoted.push(HEX[usize::from(b >> 4)]);
        quoted.push(HEX[usize::from(b & 0xf)]);
    }
    quoted.push(b'"');
    entry_headers_quoted(h, quoted, tier);
}

/// The entry headers with `quoted` the digest in double quotes (its
/// exact length: `Bytes` takes it without copying).
fn entry_headers_quoted(h: &mut HeaderMap, quoted: Vec<u8>, tier: store_core::Tier) {
    h.reserve(9);
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    // One buffer for both: the ETag is the digest in quotes, and a
    // header value built from `Bytes` shares them.
    let quoted = bytes::Bytes::from(quoted);
    let digest_value = quoted.slice(1..quoted.len() - 1);
    h.insert(ETAG, shared_value(quoted));
    // Content under a digest never changes.
    h.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    h.insert(header(HEADER_DIGEST), shared_value(digest_value));
    h.insert(
        header(HEADER_TIER),
        HeaderValue::from_static(match tier {
            store_core::Tier::Kv => "kv",
            store_core::Tier::Large => "large",
        }),
    );
    // The same URL also answers `application/x-bao` (ADR-033).
    h.insert(VARY, HeaderValue::from_static("accept"));
}

/// Whether the `Accept` header asks for a bao stream: some listed media
/// type is `application/x-bao` (parameters allowed) without `q=0`.
fn accepts_bao(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let media = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.split_once('=').is_some_and(|(k, v)| {
                    k.trim().eq_ignore_ascii_case("q")
                        && v.trim().parse::<f32>().is_ok_and(|q| q <= 0.0)
                })
            });
            media.eq_ignore_ascii_case(BAO_MEDIA_TYPE) && !refused
        })
}

/// A put's answer (also a finished upload's): `201` (`200` when the entry
/// existed) with `{token, digest}`, `Location`, and the dedup and tier
/// headers.
pub(super) fn put_answer(ns: &str, out: &store_ops::PutOutcome) -> Response {
    let status = if out.deduplicated {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut resp = (status, Json(&out.response)).into_response();
    let h = resp.headers_mut();
    h.insert(
        LOCATION,
        value(format!("/v1/blobs/{ns}/{}", out.response.digest)),
    );
    h.insert(
        header(HEADER_DEDUPLICATED),
        value(out.deduplicated.to_string()),
    );
    h.insert(header(HEADER_TIER), value(out.tier.to_string()));
    resp
}

/// `PUT /v1/blobs/{ns}`.
pub(super) async fn put_blob(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let ns = match path {
        Ok(Path(ns)) => ns,
        Err(e) => return fail(&ops, path_error(e)),
    };
    if let Err(e) = ops.authorize(&identity, Scope::Write, Some(&ns)) {
        return fail(&ops, e);
    }
    let len = match headers.get(CONTENT_LENGTH) {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) => Some(n),
            None => return fail(&ops, OpsError::bad_request("invalid Content-Length header")),
        },
    };
    let expect = match headers.get(HEADER_EXPECT_DIGEST) {
        None => None,
        Some(v) => match v.to_str() {
            Ok(s) => Some(s.to_string()),
            Err(_) => {
                return fail(
                    &ops,
                    OpsError::new(
                        ErrorCode::KeyInvalid,
                        format!("{HEADER_EXPECT_DIGEST} must be 64 lowercase hex characters"),
                    ),
                )
            }
        },
    };
    let (reader, body_failed) = body_reader(body);
    match ops
        .put_as(&identity, &ns, reader, len, expect.as_deref())
        .await
    {
        Ok(out) => put_answer(&ns, &out),
        Err(mut e) => {
            if body_failed.load(Ordering::SeqCst) && e.code.redacts_message() {
                e = OpsError::new(ErrorCode::IncompleteBody, e.message);
            }
            fail(&ops, e)
        }
    }
}

/// `GET /v1/blobs/{ns}/{digest}`. Takes the request whole: a `HeaderMap`
/// extractor would copy the headers.
pub(super) async fn get_blob(
    State(ops): State<Ops>,
    Caller(identity): Caller,
    path: Result<Path<(String, String)>, PathRejection>,
    req: axum::extract::Request,
) -> Response {
    let headers = req.headers();
    let (ns, digest) = match path {
        Ok(Path(p)) => p,
        Err(e) => return fail(&ops, path_error(e)),
    };
    if let Err(e) = ops.authorize(&identity, Scope::Read, Some(&ns)) {
        return fail(&ops, e);
    }
    // An unparsable Range header is ignored (RFC 9110 §14.2).
    let range = headers
        .get(RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_range_header);
    if accepts_bao(headers) {
        return get_bao(ops, &ns, &digest, range).await;
    }
    match ops.get(&ns, &digest, range).await {
        Ok(got) => blob_response(ops, got).await,
        Err(e) => fail(&ops, e),
    }
}

/// A get's answer: `200` (`206` for a range) with the entry headers and
/// the body (buffered when small, else streamed).
pub(super) async fn blob_response(ops: Ops, got: store_ops::GetResponse) -> Response {
    let status = if got.range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let len = got.blob.len();
    // A buffered body has an exact length: hyper writes its
    // `Content-Length` itself (no header value to build and parse back).
    let (body, sized) = if len <= BUFFERED_MAX {
        match buffered_body(got.blob, &ops).await {
            Ok(b) => (b, true),
            Err(e) => return fail(&ops, e),
        }
    } else {
        (blob_body(got.blob, ops), false)
    };
    // The headers go straight into the response's own map.
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    entry_headers_of(h, &got.digest, got.tier);
    if !sized {
        h.insert(CONTENT_LENGTH, HeaderValue::from(len));
    }
    if let Some(r) = &got.range {
        h.insert(
            CONTENT_RANGE,
            value(format!("bytes {}-{}/{}", r.start, r.end - 1, got.size)),
        );
    }
    resp
}

/// `GET /v1/blobs/{ns}/{digest}` with `Accept: application/x-bao`: `200`
/// with the bao encoding of the entry, or of the requested range (named in
/// `x-blobpool-bao-range`); chunked, aborted on a failure mid-stream.
async fn get_bao(
    ops: Ops,
    ns: &str,
    digest: &str,
    range: Option<store_ops::range::RangeRequest>,
) -> Response {
    let got = match ops.get_bao(ns, digest, range).await {
        Ok(g) => g,
        Err(e) => return fail(&ops, e),
    };
    let mut h = HeaderMap::new();
    entry_headers(&mut h, &got.digest.to_hex(), got.tier);
    // Another representation than the plain bytes: its own type, no ETag
    // (that names the plain representation), no byte ranges of it.
    h.insert(CONTENT_TYPE, HeaderValue::from_static(BAO_MEDIA_TYPE));
    h.remove(ETAG);
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("none"));
    h.insert(header(HEADER_SIZE), value(got.size.to_string()));
    if let Some(r) = &got.range {
        h.insert(
            header(HEADER_BAO_RANGE),
            value(format!("{}-{}", r.start, r.end - 1)),
        );
    }
    let body = bao_body(got.stream, ops);
    (StatusCode::OK, h, body).into_response()
}

/// `HEAD /v1/blobs/{ns}/{digest}`.
pub(super) async fn head_blob(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let (ns, digest) = match path {
        Ok(Path(p)) => p,
        Err(e) => return fail(&ops, path_error(e)),
    };
    if let Err(e) = ops.authorize(&identity, Scope::Read, Some(&ns)) {
        return fail(&ops, e);
    }
    match ops.stat(&ns, &digest).await {
        Ok(StatResponse {
            digest,
            size,
            tier,
            created_at,
            ..
        }) => {
            let mut h = HeaderMap::new();
            entry_headers(&mut h, &digest, tier);
            h.insert(CONTENT_LENGTH, value(size.to_string()));
            h.insert(header(HEADER_CREATED_AT), value(created_at.to_string()));
            (StatusCode::OK, h).into_response()
        }
        Err(e) => fail(&ops, e),
    }
}

/// `DELETE /v1/blobs/{ns}/{digest}`.
pub(super) async fn delete_blob(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let (ns, digest) = match path {
        Ok(Path(p)) => p,
        Err(e) => return fail(&ops, path_error(e)),
    };
    let r = match ops.authorize(&identity, Scope::Delete, Some(&ns)) {
        Ok(()) => ops.delete(&ns, &digest).await,
        Err(e) => Err(e),
    };
    audit(&identity, "delete", &format!("{ns}/{digest}"), outcome(&r));
    match r {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => fail(&ops, e),
    }
}

/// `POST /v1/have`.
pub(super) async fn have(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(e) = require_json(&headers) {
        return fail(&ops, e);
    }
    let max = ops.config().max_have_digests;
    let bytes = match read_limited(body, have_body_limit(max), max).await {
        Ok(b) => b,
        Err(e) => return fail(&ops, e),
    };
    let req: HaveRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return fail(
                &ops,
                OpsError::bad_request(format!("invalid have request: {e}")),
            )
        }
    };
    let scope = if req.token.is_some() {
        Scope::Write
    } else {
        Scope::Read
    };
    if let Err(e) = ops.authorize(&identity, scope, Some(&req.namespace)) {
        return fail(&ops, e);
    }
    match ops.have_as(&identity, req).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => fail(&ops, e),
    }
}

/// `DELETE /v1/tokens/{token}`.
pub(super) async fn release_token(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let token = match path {
        Ok(Path(t)) => t,
        Err(e) => return fail(&ops, path_error(e)),
    };
    let r = ops.release_token_as(&identity, &token);
    // The audit line names the pinned key, never the token (a bearer
    // secret of its owner).
    let target = match &r {
        Ok(key) => key.to_string(),
        Err(_) => "-".to_string(),
    };
    audit(&identity, "release_token", &target, outcome(&r));
    match r {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => fail(&ops, e),
    }
}

/// `POST /v1/sweep`.
pub(super) async fn sweep(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = require_json(&headers) {
        return fail(&ops, e);
    }
    if let Err(e) = ops.authorize(&identity, Scope::Admin, None) {
        audit(&identity, "sweep", "-", e.code.as_str());
        return fail(&ops, e);
    }
    let r = ops.sweep().await;
    let summary = match &r {
        Ok(rep) => format!("ok {}", serde_json::to_string(rep).unwrap_or_default()),
        Err(e) => e.code.as_str().to_string(),
    };
    audit(&identity, "sweep", "-", &summary);
    match r {
        Ok(report) => Json(report).into_response(),
        Err(e) => fail(&ops, e),
    }
}

/// `GET /health`.
pub(super) async fn health(State(ops): State<Ops>) -> Response {
    let mut h = ops.health().await;
    if let Some(err) = h.error.take() {
        tracing::warn!(request_id = %request_id().unwrap_or_default(), "health: {err}");
        h.error = Some(redacted_message());
    }
    let status = if h.status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(h)).into_response()
}

/// `GET /metrics`.
pub(super) async fn metrics(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
) -> Response {
    if let Err(e) = ops.authorize(&identity, Scope::Admin, None) {
        return fail(&ops, e);
    }
    if let Err(e) = ops.refresh_cache_usage().await {
        // The gauges keep their last reading; the rest still renders.
        tracing::warn!("reading cache usage for /metrics failed: {e}");
    }
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        ops.render_metrics(),
    )
        .into_response()
}

/// Unknown routes.
pub(super) async fn not_found(State(ops): State<Ops>, method: Method, uri: Uri) -> Response {
    fail(
        &ops,
        OpsError::new(
            ErrorCode::NotFound,
            format!("no route for {method} {}", uri.path()),
        ),
    )
}

/// Known routes, wrong method.
pub(super) async fn method_not_allowed(
    State(ops): State<Ops>,
    method: Method,
    uri: Uri,
) -> Response {
    fail(
        &ops,
        OpsError::new(
            ErrorCode::MethodNotAllowed,
            format!("{method} is not allowed on {}", uri.path()),
        ),
    )
}
