//! The axum handlers of blobs, tokens, sweeps, health and metrics: HTTP
//! in, [`Ops`] call, HTTP out.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::State;
use axum::http::header::{ACCEPT, ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_TYPE, ETAG, RANGE};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::{bao_body, body_reader, have_body_limit, read_limited};
use super::extract::{
    declared_length, json_body, Admin, Authorized, Caller, JsonType, PathOf, Read, Write,
};
use super::gate::request_id;
use super::respond::{
    audit, blob_response, entry_headers, fail, header, or_fail, outcome, put_answer,
    redacted_message, value,
};
use super::{HEADER_BAO_RANGE, HEADER_CREATED_AT, HEADER_EXPECT_DIGEST, HEADER_SIZE};
use store_ops::auth::Scope;
use store_ops::bao::BAO_MEDIA_TYPE;
use store_ops::payload::{HaveRequest, StatResponse};
use store_ops::range::parse_range_header;
use store_ops::Ops;
use store_ops::{ErrorCode, OpsError};

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

/// `PUT /v1/blobs/{ns}`.
pub(super) async fn put_blob(
    State(ops): State<Ops>,
    Authorized { who, path: ns, .. }: Authorized<Write, String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let len = or_fail!(&ops, declared_length(&headers));
    let expect = headers.get(HEADER_EXPECT_DIGEST).map(|v| v.to_str());
    let expect = or_fail!(
        &ops,
        expect.transpose().map_err(|_| OpsError::new(
            ErrorCode::KeyInvalid,
            format!("{HEADER_EXPECT_DIGEST} must be 64 lowercase hex characters"),
        ))
    );
    let (reader, body_failed) = body_reader(body);
    match ops.put(&who, &ns, reader, len, expect).await {
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
    Authorized {
        path: (ns, digest), ..
    }: Authorized<Read, (String, String)>,
    req: axum::extract::Request,
) -> Response {
    let headers = req.headers();
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

/// `GET /v1/blobs/{ns}/{digest}` with `Accept: application/x-bao`: `200`
/// with the bao encoding of the entry, or of the requested range (named in
/// `x-blobpool-bao-range`); chunked, aborted on a failure mid-stream.
async fn get_bao(
    ops: Ops,
    ns: &str,
    digest: &str,
    range: Option<store_ops::range::RangeRequest>,
) -> Response {
    let got = or_fail!(&ops, ops.get_bao(ns, digest, range).await);
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
    Authorized {
        path: (ns, digest), ..
    }: Authorized<Read, (String, String)>,
) -> Response {
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
    Caller(identity): Caller,
    PathOf((ns, digest)): PathOf<(String, String)>,
) -> Response {
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
    Caller(identity): Caller,
    _: JsonType,
    body: Body,
) -> Response {
    let max = ops.config().max_have_digests;
    let bytes = or_fail!(&ops, read_limited(body, have_body_limit(max), max).await);
    let req: HaveRequest = or_fail!(&ops, json_body(&bytes, "have request"));
    let scope = if req.token.is_some() {
        Scope::Write
    } else {
        Scope::Read
    };
    or_fail!(&ops, ops.authorize(&identity, scope, Some(&req.namespace)));
    match ops.have(&identity, req).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => fail(&ops, e),
    }
}

/// `DELETE /v1/tokens/{token}`.
pub(super) async fn release_token(
    State(ops): State<Ops>,
    Caller(identity): Caller,
    PathOf(token): PathOf<String>,
) -> Response {
    let r = ops.release_token(&identity, &token);
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
    Caller(identity): Caller,
    _: JsonType,
) -> Response {
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
pub(super) async fn metrics(State(ops): State<Ops>, _: Authorized<Admin>) -> Response {
    if let Err(e) = ops.cache().refresh_usage().await {
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
