//! `/v1/refs` handlers (ADR-024).
//!
//! | route | scope |
//! |---|---|
//! | `PUT /v1/refs/{ns}/{*name}` `{"digest", "token"?}` | `write` |
//! | `GET /v1/refs/{ns}/{*name}` | `read` |
//! | `DELETE /v1/refs/{ns}/{*name}` | `write` |
//! | `GET /v1/refs/{ns}?prefix=&after=&limit=` | `read` |
//!
//! `If-Match: "<digest>"` makes a set or delete conditional on the current
//! digest, `If-None-Match: *` makes a set create-only; a failed
//! precondition is `412 ref_conflict`. Answers carry `ETag: "<digest>"`.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::header::{ETAG, IF_MATCH, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::body::read_limited;
use super::extract::{json_body, Authorized, Caller, Json as Takes, PathOf, Write};
use super::respond::{audit, fail, or_fail};
use store_ops::refs::{expect_from_headers, SetRefRequest, MAX_REF_PAGE};
use store_ops::Ops;
use store_ops::OpsError;

/// Largest set body: a digest, a token and JSON punctuation.
const SET_BODY_LIMIT: usize = 4096;

fn precondition(h: &HeaderMap) -> Result<store_core::RefExpect, OpsError> {
    let get = |name| h.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    if (h.contains_key(IF_MATCH) && get(IF_MATCH).is_none())
        || (h.contains_key(IF_NONE_MATCH) && get(IF_NONE_MATCH).is_none())
    {
        return Err(OpsError::bad_request("unreadable If-Match / If-None-Match"));
    }
    expect_from_headers(get(IF_MATCH), get(IF_NONE_MATCH))
}

fn with_etag(mut resp: Response, digest: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(&format!("\"{digest}\"")) {
        resp.headers_mut().insert(ETAG, v);
    }
    resp
}

/// `PUT /v1/refs/{ns}/{*name}`.
/// Authorized before the body is read: an unauthorised client costs no
/// more than its headers.
pub(super) async fn set_ref(
    State(ops): State<Ops>,
    Authorized { who, path, .. }: Authorized<Takes<Write>, (String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let (ns, name) = path;
    let expect = or_fail!(&ops, precondition(&headers));
    let bytes = or_fail!(&ops, read_limited(body, SET_BODY_LIMIT, 1).await);
    let req: SetRefRequest = or_fail!(&ops, json_body(&bytes, "ref body"));
    let had_token = req.token.is_some();
    let r = ops.refs().set(&who, &ns, &name, req, expect).await;
    // Every set is audited, with or without a token; a first reference
    // that switched the namespace to `refs` says so (ADR-045).
    audit(
        &who,
        "set_ref",
        &format!("{ns}/{name}"),
        &match &r {
            Ok(out) => format!(
                "ok: {} -> {}{}",
                out.previous.as_deref().unwrap_or("none"),
                out.reference.digest,
                if out.policy_adopted {
                    "; gc policy keep -> refs"
                } else {
                    ""
                }
            ),
            Err(e) => e.code.as_str().to_string(),
        },
    );
    if had_token {
        let released = matches!(&r, Ok(s) if s.token_released);
        audit(
            &who,
            "release_token",
            &format!("{ns} (with ref {name})"),
            if released { "ok" } else { "kept" },
        );
    }
    match r {
        Ok(out) => {
            let status = if out.previous.is_none() {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let d = out.reference.digest.clone();
            with_etag((status, Json(out)).into_response(), &d)
        }
        Err(e) => fail(&ops, e),
    }
}

/// `GET /v1/refs/{ns}/{*name}`.
pub(super) async fn get_ref(
    State(ops): State<Ops>,
    Caller(identity): Caller,
    PathOf((ns, name)): PathOf<(String, String)>,
) -> Response {
    match ops.refs().get(&identity, &ns, &name).await {
        Ok(r) => {
            let d = r.digest.clone();
            with_etag(Json(r).into_response(), &d)
        }
        Err(e) => fail(&ops, e),
    }
}

/// `DELETE /v1/refs/{ns}/{*name}`.
pub(super) async fn delete_ref(
    State(ops): State<Ops>,
    Caller(identity): Caller,
    PathOf((ns, name)): PathOf<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let r = match precondition(&headers) {
        Ok(expect) => ops.refs().delete(&identity, &ns, &name, expect).await,
        Err(e) => Err(e),
    };
    audit(
        &identity,
        "delete_ref",
        &format!("{ns}/{name}"),
        &match &r {
            Ok(before) => format!("ok: {before} -> none"),
            Err(e) => e.code.as_str().to_string(),
        },
    );
    match r {
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => fail(&ops, e),
    }
}

/// Query of a listing.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    #[serde(default)]
    prefix: String,
    after: Option<String>,
    limit: Option<usize>,
}

/// `GET /v1/refs/{ns}`.
pub(super) async fn list_refs(
    State(ops): State<Ops>,
    Caller(identity): Caller,
    PathOf(ns): PathOf<String>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        Err(e) => return fail(&ops, OpsError::bad_request(format!("invalid query: {e}"))),
    };
    match ops
        .refs()
        .list(
            &identity,
            &ns,
            &q.prefix,
            q.after.as_deref(),
            q.limit.unwrap_or(MAX_REF_PAGE),
        )
        .await
    {
        Ok(page) => Json(page).into_response(),
        Err(e) => fail(&ops, e),
    }
}
