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
use axum::extract::{Query, State};
use axum::http::header::{CONTENT_RANGE, LOCATION};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::body::body_reader;
use super::extract::{Authorized, Caller, Json as Takes, PathOf, Write};
use super::respond::{audit, fail, offset_headers, outcome, put_answer};
use store_ops::auth::{Identity, Scope};
use store_ops::uploads::UploadStatus;
use store_ops::Ops;
use store_ops::OpsError;

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
/// Like every other POST it takes `Content-Type: application/json`: a
/// browser cannot send it cross-site without a CORS preflight (no
/// cross-site session opens).
pub(super) async fn open(
    State(ops): State<Ops>,
    Authorized { who, path: ns, .. }: Authorized<Takes<Write>, String>,
) -> Response {
    match ops.uploads().open(&who, &ns).await {
        Ok(st) => status_response(StatusCode::CREATED, &st, true),
        Err(e) => fail(&ops, e),
    }
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

/// Authorizes a request on session `(ns, id)`.
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
    Caller(identity): Caller,
    PathOf((ns, id)): PathOf<(String, String)>,
) -> Response {
    let r = match check_session(&ops, &identity, &ns, &id) {
        Ok(()) => ops.uploads().status(&identity, &ns, &id).await,
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
    Caller(identity): Caller,
    PathOf((ns, id)): PathOf<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        check_session(&ops, &identity, &ns, &id)?;
        let start = chunk_start(&headers)?;
        let (reader, _) = body_reader(body);
        ops.uploads()
            .append(&identity, &ns, &id, start, reader)
            .await
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
    Caller(identity): Caller,
    // After the query, as axum's rejection of it comes first.
    Query(query): Query<HashMap<String, String>>,
    PathOf((ns, id)): PathOf<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        check_session(&ops, &identity, &ns, &id)?;
        let digest = query.get("digest").ok_or_else(|| {
            OpsError::bad_request("finishing an upload needs ?digest=<the content's BLAKE3 hex>")
        })?;
        let start = chunk_start(&headers)?;
        let (reader, _) = body_reader(body);
        ops.uploads()
            .finish(&identity, &ns, &id, digest, start, reader)
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
    Caller(identity): Caller,
    PathOf((ns, id)): PathOf<(String, String)>,
) -> Response {
    let r = async {
        check_session(&ops, &identity, &ns, &id)?;
        // What the session held, for the audit line (a status read: it
        // neither claims the session nor keeps it alive).
        let before = ops.uploads().status(&identity, &ns, &id).await?;
        ops.uploads().abort(&identity, &ns, &id).await?;
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
