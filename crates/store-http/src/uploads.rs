//! The resumable upload routes (ADR-034):
//!
//! | request | answer |
//! |---|---|
//! | `POST /v1/uploads/{ns}` (`Content-Type: application/json`) | `201`, `Location`, `Upload-Offset: 0`, the session as JSON |
//! | `PATCH /v1/uploads/{ns}/{id}` (+ `Content-Range: bytes a-b/*`) | `204`, `Upload-Offset`; `416` at a wrong offset |
//! | `HEAD /v1/uploads/{ns}/{id}` | `204`, `Upload-Offset` |
//! | `PUT /v1/uploads/{ns}/{id}?digest=<hex>` (+ last chunk) | a put's answer: `201` `{token, digest}`; `422` on a mismatch |
//! | `DELETE /v1/uploads/{ns}/{id}` | `204` |
//!
//! A finish and an abort each write one `blobpool::audit` line (actions
//! `upload_finish`, `upload_abort`; target `{ns}/{id}`), whatever their
//! outcome, before -> after as the other audit lines: `ok: N bytes ->
//! <digest>` (`…; deduplicated` when the entry was there), `ok: N bytes ->
//! none` (the session's N committed bytes removed), or the error code.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_RANGE, LOCATION};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::body::body_reader;
use super::handlers::{audit, fail, outcome, path_error, put_answer, require_json};
use store_ops::auth::{Identity, Scope};
use store_ops::uploads::UploadStatus;
use store_ops::Ops;
use store_ops::OpsError;

/// Response header: the session's committed offset.
pub const HEADER_UPLOAD_OFFSET: &str = "upload-offset";

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

/// The start of a chunk's `Content-Range: bytes a-b/*` (or `a-b/total`,
/// or `a-*`); `None` without the header. `b` must match the body's length
/// when the body has one; the ops layer checks `a`.
fn chunk_start(headers: &HeaderMap) -> Result<Option<u64>, OpsError> {
    let Some(v) = headers.get(CONTENT_RANGE) else {
        return Ok(None);
    };
    let bad = || {
        OpsError::bad_request(
            "Content-Range of an upload chunk must be `bytes <start>-<end>/*` (or `/<total>`)",
        )
    };
    let s = v.to_str().map_err(|_| bad())?.trim();
    let s = s.strip_prefix("bytes ").unwrap_or(s).trim();
    let (range, _) = s.split_once('/').unwrap_or((s, "*"));
    let (a, _) = range.split_once('-').ok_or_else(bad)?;
    a.trim().parse().map(Some).map_err(|_| bad())
}

fn status_response(code: StatusCode, st: &UploadStatus, with_body: bool) -> Response {
    let mut resp = if with_body {
        (code, Json(st)).into_response()
    } else {
        code.into_response()
    };
    offset_headers(resp.headers_mut(), st.offset);
    if let Ok(v) = HeaderValue::from_str(&st.location) {
        resp.headers_mut().insert(LOCATION, v);
    }
    resp
}

/// `POST /v1/uploads/{ns}` (`Content-Type: application/json`, no body).
pub(super) async fn open(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let ns = match path {
        Ok(Path(ns)) => ns,
        Err(e) => return fail(&ops, path_error(e)),
    };
    // Like every other POST: a browser cannot send this content type
    // cross-site without a CORS preflight (no cross-site session opens).
    if let Err(e) = require_json(&headers) {
        return fail(&ops, e);
    }
    if let Err(e) = ops.authorize(&identity, Scope::Write, Some(&ns)) {
        return fail(&ops, e);
    }
    match ops.upload_open(&identity, &ns).await {
        Ok(st) => status_response(StatusCode::CREATED, &st, true),
        Err(e) => fail(&ops, e),
    }
}

/// Authorizes a request on session `(ns, id)`.
fn session_path(
    ops: &Ops,
    identity: &Identity,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(String, String), OpsError> {
    let (ns, id) = path.map(|Path(p)| p).map_err(path_error)?;
    check_session(ops, identity, &ns, &id)?;
    Ok((ns, id))
}

/// The audit target of session `(ns, id)`: `{ns}/{id}`, or `{ns}/-` for
/// an id that is not a session id's shape (it never reaches a log line).
fn audit_target(ns: &str, id: &str) -> String {
    if store_ops::uploads::is_session_id(id) {
        format!("{ns}/{id}")
    } else {
        format!("{ns}/-")
    }
}

/// [`session_path`] on an extracted path.
fn check_session(ops: &Ops, identity: &Identity, ns: &str, id: &str) -> Result<(), OpsError> {
    ops.authorize(identity, Scope::Write, Some(ns))?;
    // Checked before the id can reach an answer or a log line: a session
    // id is `<node>-<32 hex>` (lowercase hex and dashes, short).
    if !store_ops::uploads::is_session_id(id) {
        return Err(OpsError::new(
            store_ops::ErrorCode::Missing,
            "no such upload session (malformed session id)",
        ));
    }
    Ok(())
}

/// `HEAD /v1/uploads/{ns}/{id}`.
pub(super) async fn status(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let r = match session_path(&ops, &identity, path) {
        Ok((ns, id)) => ops.upload_status(&identity, &ns, &id).await,
        Err(e) => Err(e),
    };
    match r {
        Ok(st) => status_response(StatusCode::NO_CONTENT, &st, false),
        Err(e) => fail(&ops, e),
    }
}

/// `PATCH /v1/uploads/{ns}/{id}`.
pub(super) async fn append(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        let (ns, id) = session_path(&ops, &identity, path)?;
        let start = chunk_start(&headers)?;
        let (reader, _) = body_reader(body);
        ops.upload_append(&identity, &ns, &id, start, reader).await
    }
    .await;
    match r {
        Ok(st) => status_response(StatusCode::NO_CONTENT, &st, false),
        Err(e) => fail(&ops, e),
    }
}

/// `PUT /v1/uploads/{ns}/{id}?digest=<hex>`.
pub(super) async fn finish(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<(String, String)>, PathRejection>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (ns, id) = match path {
        Ok(Path(p)) => p,
        Err(e) => return fail(&ops, path_error(e)),
    };
    let r = async {
        check_session(&ops, &identity, &ns, &id)?;
        let digest = query.get("digest").ok_or_else(|| {
            OpsError::bad_request("finishing an upload needs ?digest=<the content's BLAKE3 hex>")
        })?;
        let start = chunk_start(&headers)?;
        let (reader, _) = body_reader(body);
        ops.upload_finish(&identity, &ns, &id, digest, start, reader)
            .await
    }
    .await;
    // Before -> after: the session's bytes became the entry (never the
    // pin token: a bearer secret of its owner).
    let done = match &r {
        Ok(out) => format!(
            "ok: {} bytes -> {}{}",
            out.size,
            out.response.digest,
            if out.deduplicated {
                "; deduplicated"
            } else {
                ""
            }
        ),
        Err(_) => outcome(&r).to_string(),
    };
    audit(&identity, "upload_finish", &audit_target(&ns, &id), &done);
    match r {
        Ok(out) => put_answer(&ns, &out),
        Err(e) => fail(&ops, e),
    }
}

/// `DELETE /v1/uploads/{ns}/{id}`.
pub(super) async fn abort(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let (ns, id) = match path {
        Ok(Path(p)) => p,
        Err(e) => return fail(&ops, path_error(e)),
    };
    let r = async {
        check_session(&ops, &identity, &ns, &id)?;
        // What the session held, for the audit line (a status read: it
        // neither claims the session nor keeps it alive).
        let before = ops.upload_status(&identity, &ns, &id).await?;
        ops.upload_abort(&identity, &ns, &id).await?;
        Ok::<_, OpsError>(before.offset)
    }
    .await;
    let done = match &r {
        Ok(held) => format!("ok: {held} bytes -> none"),
        Err(_) => outcome(&r).to_string(),
    };
    audit(&identity, "upload_abort", &audit_target(&ns, &id), &done);
    match r {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => fail(&ops, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_starts_are_parsed() {
        let mut h = HeaderMap::new();
        assert_eq!(chunk_start(&h).unwrap(), None);
        for (v, want) in [("bytes 0-99/*", 0), ("bytes 100-199/1000", 100), ("5-9", 5)] {
            h.insert(CONTENT_RANGE, HeaderValue::from_static(v));
            assert_eq!(chunk_start(&h).unwrap(), Some(want), "{v}");
        }
        h.insert(CONTENT_RANGE, HeaderValue::from_static("bytes x-1/*"));
        assert!(chunk_start(&h).is_err());
    }
}
