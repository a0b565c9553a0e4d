//! The admin routes (scope `admin`): `GET /v1/namespaces`,
//! `GET /v1/namespaces/{ns}/entries?after=&limit=`, `GET /v1/stats[?namespace=]`
//! and `POST /v1/verify`.

use axum::body::Body;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::extract::{json_body, Admin, Authorized, Json as Takes, PathOf};
use super::respond::{audit, fail, or_fail};
use store_ops::Ops;
use store_ops::OpsError;
use store_ops::VerifyRequest;

/// Largest accepted `POST /v1/verify` body.
const VERIFY_BODY_LIMIT: usize = 4096;

fn answer<T: Serialize>(ops: &Ops, r: Result<T, OpsError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => fail(ops, e),
    }
}

/// The query parameters, `name=value` pairs; values are taken verbatim
/// (digests, numbers and namespaces need no percent-encoding), and
/// unknown or repeated names are `bad_request`.
fn query<'a>(uri: &'a Uri, known: &[&str]) -> Result<Vec<(&'a str, &'a str)>, OpsError> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !known.contains(&k) {
            return Err(OpsError::bad_request(format!(
                "unknown query parameter {k:?} (known: {})",
                known.join(", ")
            )));
        }
        if out.iter().any(|(o, _)| *o == k) {
            return Err(OpsError::bad_request(format!(
                "query parameter {k:?} given twice"
            )));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn param<'a>(q: &[(&str, &'a str)], name: &str) -> Option<&'a str> {
    q.iter()
        .find(|(k, v)| *k == name && !v.is_empty())
        .map(|(_, v)| *v)
}

/// `GET /v1/namespaces`.
pub(super) async fn namespaces(State(ops): State<Ops>, _: Authorized<Admin>) -> Response {
    let r = ops.namespaces().await;
    answer(&ops, r)
}

/// `GET /v1/namespaces/{ns}/entries?after=DIGEST&limit=N`.
pub(super) async fn entries(
    State(ops): State<Ops>,
    _: Authorized<Admin>,
    PathOf(ns): PathOf<String>,
    uri: Uri,
) -> Response {
    let q = or_fail!(&ops, query(&uri, &["after", "limit"]));
    let limit = match param(&q, "limit").map(str::parse::<usize>).transpose() {
        Ok(l) => l,
        Err(e) => return fail(&ops, OpsError::bad_request(format!("limit: {e}"))),
    };
    let r = ops.list_entries(&ns, param(&q, "after"), limit).await;
    answer(&ops, r)
}

/// `GET /v1/stats[?namespace=NS]`.
pub(super) async fn stats(State(ops): State<Ops>, _: Authorized<Admin>, uri: Uri) -> Response {
    let q = or_fail!(&ops, query(&uri, &["namespace"]));
    let r = ops.stats(param(&q, "namespace")).await;
    answer(&ops, r)
}

/// `POST /v1/verify` with `{"namespace"?, "quarantine"?, "max_rate"?,
/// "concurrency"?}` (`Content-Type: application/json`).
pub(super) async fn verify(
    State(ops): State<Ops>,
    Authorized { who, .. }: Authorized<Takes<Admin>>,
    body: Body,
) -> Response {
    let bytes = axum::body::to_bytes(body, VERIFY_BODY_LIMIT).await;
    let bytes = or_fail!(
        &ops,
        bytes.map_err(|e| OpsError::bad_request(format!(
            "verify request body (at most {VERIFY_BODY_LIMIT} bytes): {e}"
        )))
    );
    let req: VerifyRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        VerifyRequest::default()
    } else {
        or_fail!(&ops, json_body(&bytes, "verify request"))
    };
    let r = ops.verify(req).await;
    let summary = match &r {
        Ok(s) => format!(
            "ok checked={} ok={} corrupt={} missing={} failed={}",
            s.checked, s.ok, s.corrupt, s.missing, s.failed
        ),
        Err(e) => e.code.as_str().to_string(),
    };
    audit(&who, "verify", "-", &summary);
    answer(&ops, r)
}
