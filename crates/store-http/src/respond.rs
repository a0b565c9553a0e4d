//! The answers every route shares: the JSON error ([`fail`]), the audit
//! line, an entry's headers, a put's and a get's answer. The route
//! modules import from here and never from each other.

use axum::http::header::{
    ACCEPT_RANGES, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, ETAG, LOCATION,
    RETRY_AFTER, VARY, WWW_AUTHENTICATE,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::{blob_body, buffered_body, BUFFERED_MAX};
use super::gate::request_id;
use super::{HEADER_DEDUPLICATED, HEADER_DIGEST, HEADER_TIER};
use store_ops::auth::Identity;
use store_ops::Ops;
use store_ops::{ErrorCode, OpsError};

/// The value of `$r`, a `Result<_, OpsError>`; its error is returned as
/// [`fail`]'s answer.
macro_rules! or_fail {
    ($ops:expr, $r:expr) => {
        match $r {
            Ok(v) => v,
            Err(e) => return $crate::respond::fail($ops, e),
        }
    };
}
pub(crate) use or_fail;

/// Response header: the session's committed offset.
pub const HEADER_UPLOAD_OFFSET: &str = "upload-offset";

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
pub(crate) fn fail(ops: &Ops, mut e: OpsError) -> Response {
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
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"blobpool\""),
        );
        // Build tools send the key as a Basic password.
        resp.headers_mut().append(
            WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"blobpool\""),
        );
    }
    if let (ErrorCode::InvalidRange, Some(size)) = (e.code, e.size) {
        if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
            resp.headers_mut().insert(CONTENT_RANGE, v);
        }
    }
    if let (ErrorCode::UploadOffset, Some(offset)) = (e.code, e.size) {
        offset_headers(resp.headers_mut(), offset);
    }
    if let Some(after) = e.retry_after {
        // Whole seconds, rounded up, at least 1 (RFC 9110 §10.2.3).
        let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
        resp.headers_mut()
            .insert(RETRY_AFTER, value(secs.max(1).to_string()));
    }
    resp
}

/// `Upload-Offset: n` and the registry's `Range: 0-(n-1)` (absent at 0).
pub(crate) fn offset_headers(h: &mut HeaderMap, offset: u64) {
    if let Ok(v) = HeaderValue::from_str(&offset.to_string()) {
        h.insert(HeaderName::from_static(HEADER_UPLOAD_OFFSET), v);
    }
    if offset > 0 {
        if let Ok(v) = HeaderValue::from_str(&format!("0-{}", offset - 1)) {
            h.insert(axum::http::header::RANGE, v);
        }
    }
}

/// One audit line: who did what to which key, and how it ended.
pub(crate) fn audit(identity: &Identity, action: &str, target: &str, outcome: &str) {
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

/// An audit outcome: `ok` or the error's code.
pub(crate) fn outcome<T>(r: &Result<T, OpsError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(e) => e.code.as_str(),
    }
}

pub(crate) fn header(name: &'static str) -> HeaderName {
    HeaderName::from_static(name)
}

pub(crate) fn value(s: impl AsRef<str>) -> HeaderValue {
    HeaderValue::from_str(s.as_ref()).expect("header values built here are visible ASCII")
}

/// The names of the entry headers, checked once at compile time
/// (`HeaderName::from_static` at run time checks every byte).
const DIGEST_NAME: HeaderName = HeaderName::from_static(HEADER_DIGEST);
const TIER_NAME: HeaderName = HeaderName::from_static(HEADER_TIER);

/// Headers describing an entry (shared by `GET` and `HEAD`), from the
/// digest's hex as the store answered it (checked as a header value).
pub(crate) fn entry_headers(h: &mut HeaderMap, digest: &str, tier: store_core::Tier) {
    let quoted = bytes::Bytes::from(format!("\"{digest}\""));
    let value = |b: bytes::Bytes| {
        HeaderValue::from_maybe_shared(b).expect("a digest's hex is a valid header value")
    };
    let digest = value(quoted.slice(1..quoted.len() - 1));
    entry_headers_with(h, value(quoted), digest, tier);
}

/// [`entry_headers`] of a digest, its hex written once into the buffer
/// the ETag and the digest header share, and not checked again byte by
/// byte: this function wrote every byte.
fn entry_headers_of(h: &mut HeaderMap, digest: &store_core::Digest, tier: store_core::Tier) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut quoted = Vec::with_capacity(66);
    quoted.push(b'"');
    for b in digest.as_bytes() {
        quoted.push(HEX[usize::from(b >> 4)]);
        quoted.push(HEX[usize::from(b & 0xf)]);
    }
    quoted.push(b'"');
    let quoted = bytes::Bytes::from(quoted);
    // SAFETY: every byte is a hex digit or `"`, visible ASCII, which
    // `HeaderValue::from_maybe_shared` accepts (debug builds check it).
    let value = |b| unsafe { HeaderValue::from_maybe_shared_unchecked(b) };
    let digest = value(quoted.slice(1..quoted.len() - 1));
    entry_headers_with(h, value(quoted), digest, tier);
}

/// The entry headers with `etag` the digest in double quotes and
/// `digest` its hex (both sharing one buffer).
fn entry_headers_with(
    h: &mut HeaderMap,
    etag: HeaderValue,
    digest: HeaderValue,
    tier: store_core::Tier,
) {
    h.reserve(9);
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    h.insert(ETAG, etag);
    // Content under a digest never changes.
    h.insert(
        CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    h.insert(DIGEST_NAME, digest);
    h.insert(
        TIER_NAME,
        HeaderValue::from_static(match tier {
            store_core::Tier::Kv => "kv",
            store_core::Tier::Large => "large",
        }),
    );
    // The same URL also answers `application/x-bao` (ADR-033).
    h.insert(VARY, HeaderValue::from_static("accept"));
}

/// A put's answer (also a finished upload's): `201` (`200` when the entry
/// existed) with `{token, digest}`, `Location`, and the dedup and tier
/// headers.
pub(crate) fn put_answer(ns: &str, out: &store_ops::PutOutcome) -> Response {
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

/// A get's answer: `200` (`206` for a range) with the entry headers and
/// the body (buffered when small, else streamed).
pub(crate) async fn blob_response(ops: Ops, got: store_ops::GetResponse) -> Response {
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
