//! The admin routes (scope `admin`): `GET /v1/namespaces`,
//! `GET /v1/namespaces/{ns}/entries?after=&limit=`, `GET /v1/stats[?namespace=]`
//! and `POST /v1/verify`.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::handlers::{audit, fail, require_json};
use store_ops::auth::{Identity, Scope};
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
pub(super) async fn namespaces(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
) -> Response {
    if let Err(e) = ops.authorize(&identity, Scope::Admin, None) {
        return fail(&ops, e);
    }
    let r = ops.namespaces().await;
    answer(&ops, r)
}

/// `GET /v1/namespaces/{ns}/entries?after=DIGEST&limit=N`.
pub(super) async fn entries(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    path: Result<Path<String>, PathRejection>,
    uri: Uri,
) -> Response {
    if let Err(e) = ops.authorize(&identity, Scope::Admin, None) {
        return fail(&ops, e);
    }
    let ns = match path {
        Ok(Path(ns)) => ns,
        Err(e) => return fail(&ops, OpsError::bad_request(format!("invalid path: {e}"))),
    };
    let q = match query(&uri, &["after", "limit"]) {
        Ok(q) => q,
        Err(e) => return fail(&ops, e),
    };
    let limit = match param(&q, "limit").map(str::parse::<usize>).transpose() {
        Ok(l) => l,
        Err(e) => return fail(&ops, OpsError::bad_request(format!("limit: {e}"))),
    };
    let r = ops.list_entries(&ns, param(&q, "after"), limit).await;
    answer(&ops, r)
}

/// `GET /v1/stats[?namespace=NS]`.
pub(super) async fn stats(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    uri: Uri,
) -> Response {
    if let Err(e) = ops.authorize(&identity, Scope::Admin, None) {
        return fail(&ops, e);
    }
    let q = match query(&uri, &["namespace"]) {
        Ok(q) => q,
        Err(e) => return fail(&ops, e),
    };
    let r = ops.stats(param(&q, "namespace")).await;
    answer(&ops, r)
}

/// `POST /v1/verify` with `{"namespace"?, "quarantine"?, "max_rate"?,
/// "concurrency"?}` (`Content-Type: application/json`).
pub(super) async fn verify(
    State(ops): State<Ops>,
    Extension(identity): Extension<Identity>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(e) = require_json(&headers) {
        return fail(&ops, e);
    }
    if let Err(e) = ops.authorize(&identity, Scope::Admin, None) {
        return fail(&ops, e);
    }
    let bytes = match axum::body::to_bytes(body, VERIFY_BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => {
            return fail(
                &ops,
                OpsError::bad_request(format!(
                    "verify request body (at most {VERIFY_BODY_LIMIT} bytes): {e}"
                )),
            )
        }
    };
    let req: VerifyRequest = if bytes.iter().all(u8::is_ascii_whitespace) {
        VerifyRequest::default()
    } else {
        match serde_json::from_slice(&bytes) {
            Ok(r) => r,
            Err(e) => {
                return fail(
                    &ops,
                    OpsError::bad_request(format!("invalid verify request: {e}")),
                )
            }
        }
    };
    let r = ops.verify(req).await;
    let summary = match &r {
        Ok(s) => format!(
            "ok checked={} ok={} corrupt={} missing={} failed={}",
            s.checked, s.ok, s.corrupt, s.missing, s.failed
        ),
        Err(e) => e.code.as_str().to_string(),
    };
    audit(&identity, "verify", "-", &summary);
    answer(&ops, r)
}
