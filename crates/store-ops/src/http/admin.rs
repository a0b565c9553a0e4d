//! The admin routes (scope `admin`): `GET /v1/namespaces`,
//! `GET /v1/namespaces/{ns}/entries?after=&limit=`, `GET /v1/stats[?namespace=]`
//! and `POST /v1/verify`.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::gate::request_id;
use super::handlers::redacted_message;
use crate::admin::VerifyRequest;
use crate::auth::{Identity, Scope};
use crate::error::{ErrorCode, OpsError};
use crate::Ops;

/// Largest accepted `POST /v1/verify` body.
const VERIFY_BODY_LIMIT: usize = 4096;

/// The JSON error answer (as the blob routes answer theirs): counted,
/// internal messages replaced by the request id.
fn fail(ops: &Ops, mut e: OpsError) -> Response {
    ops.metrics().error(e.code);
    let status =
        StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let id = request_id().unwrap_or_default();
    if status.is_server_error() {
        tracing::warn!(request_id = %id, "{e}");
    } else {
        tracing::debug!(request_id = %id, "{e}");
    }
    if e.code == ErrorCode::Internal {
        e.message = redacted_message();
    }
    let mut resp = (status, Json(e.body())).into_response();
    if e.code == ErrorCode::Unauthorized {
        resp.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"blobpool\""),
        );
    }
    resp
}

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
    let json = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return fail(
            &ops,
            OpsError::new(
                ErrorCode::UnsupportedMediaType,
                "this route takes Content-Type: application/json",
            ),
        );
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
    tracing::info!(
        target: "blobpool::audit",
        request_id = %request_id().unwrap_or_default(),
        identity = identity.name(),
        action = "verify",
        target = "-",
        outcome = %summary,
        "audit"
    );
    answer(&ops, r)
}
