//! `/cache/{ns}/{key}`: the HTTP build-cache protocol (issue 31,
//! ADR-048) over [`Ops::cache`].
//!
//! | method | answer |
//! |---|---|
//! | `PUT` | `201` (`200` when the entry existed); the key now names the body |
//! | `GET` | `200`/`206` with the body; `404` when the key or its entry is gone |
//! | `HEAD` | `200` with `Content-Length`; `404` likewise |
//! | `DELETE` | `204`; `404` when there was no such key |
//! | `MKCOL` | `201`: directories are implicit (WebDAV clients, sccache) |
//! | `PROPFIND` | `207`: a collection for a path ending in `/`, else the key's length or `404` |
//!
//! Scopes (the route table's): `read` for `GET`, `HEAD` and `PROPFIND`;
//! `write` for `PUT` and `MKCOL`; `delete` for `DELETE`. With only `write`, a `PUT` creates keys
//! and re-puts the bytes a key names, but replaces a key another identity
//! set only with `delete` (`403`); in a write-once namespace
//! (`immutable = true`) nobody replaces a key (ADR-052). `PUT` honours
//! `If-None-Match: *` (`412` when the key exists) and `If-Match: "<digest>"`
//! (`412` unless the key names it). Every `DELETE`, and every `PUT` on a
//! key that existed, writes an audit line (before → after). Authentication
//! as for every route (`Bearer`, or `Basic` with the key as password where
//! enabled).
//!
//! Bazel's HTTP cache (ADR-070) needs nothing of its own here: `cas/<hex>`
//! takes a SHA-256 or BLAKE3 name (a `PUT` whose body hashes to neither is
//! `422`, nothing stored), and a `GET`/`HEAD` of an `ac/` action result
//! whose outputs are gone is `404` — both decided by [`Ops::cache`].

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE, RANGE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::body::body_reader;
use super::extract::{declared_length, Caller};
use super::respond::{audit, blob_response, entry_headers, fail, or_fail, value};
use super::routes::ROUTES;
use store_ops::auth::Identity;
use store_ops::range::parse_range_header;
use store_ops::refs::expect_from_headers;
use store_ops::Ops;
use store_ops::{ErrorCode, OpsError};

/// The template of a cache key's route, whose rows give each method's
/// scope (for every cache path).
const CACHE_KEY: &str = "/cache/{ns}/{*key}";

/// Every method on `/cache/{ns}` and `/cache/{ns}/` (no key).
pub(super) async fn cache_ns(
    State(ops): State<Ops>,
    Caller(identity): Caller,
    Path(ns): Path<String>,
    req: Request,
) -> Response {
    serve(ops, identity, ns, String::new(), req).await
}

/// Every method on `/cache/{ns}/{*key}`. Typed path parameters and the
/// request taken whole: no map of parameters, no copy of the headers.
pub(super) async fn cache_key(
    State(ops): State<Ops>,
    Caller(identity): Caller,
    Path((ns, key)): Path<(String, String)>,
    req: Request,
) -> Response {
    serve(ops, identity, ns, key, req).await
}

/// A namespace's own base path (`http_path`, e.g. `/bazel/{*key}`): the
/// same protocol with the namespace fixed by the route; `keyed` for the
/// `{*key}` route.
pub(super) fn alias(ns: String, keyed: bool) -> axum::routing::MethodRouter<Ops> {
    let ns: std::sync::Arc<str> = ns.into();
    if keyed {
        axum::routing::any(
            move |State(ops): State<Ops>,
                  Caller(identity): Caller,
                  Path(key): Path<String>,
                  req: Request| { serve(ops, identity, ns.to_string(), key, req) },
        )
    } else {
        axum::routing::any(
            move |State(ops): State<Ops>, Caller(identity): Caller, req: Request| {
                serve(ops, identity, ns.to_string(), String::new(), req)
            },
        )
    }
}

async fn serve(ops: Ops, identity: Identity, ns: String, key: String, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let (method, uri, headers) = (parts.method, parts.uri, parts.headers);
    // The scope of the method's row in the route table.
    let row = ROUTES
        .iter()
        .find(|r| r.path == CACHE_KEY && r.method == method.as_str());
    let scope = row.and_then(|r| r.scope).ok_or_else(|| {
        let m = format!("{method} is not a cache method (GET, HEAD, PUT, DELETE, MKCOL, PROPFIND)");
        OpsError::new(ErrorCode::MethodNotAllowed, m)
    });
    let scope = or_fail!(&ops, scope);
    or_fail!(&ops, ops.authorize(&identity, scope, Some(&ns)));
    let is_dir = key.is_empty() || key.ends_with('/');
    match method.as_str() {
        "MKCOL" => match ops.cache().check(&ns) {
            Ok(()) => StatusCode::CREATED.into_response(),
            Err(e) => fail(&ops, e),
        },
        "PROPFIND" => propfind(&ops, &ns, &key, is_dir, uri.path()).await,
        _ if is_dir => fail(
            &ops,
            OpsError::new(
                ErrorCode::NotFound,
                "a cache key names an entry, not a directory",
            ),
        ),
        "PUT" => put(&ops, &identity, &ns, &key, &headers, body).await,
        "GET" => {
            let range = headers
                .get(RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_range_header);
            match ops.cache().get(&ns, &key, range).await {
                Ok(got) => blob_response(ops, got).await,
                Err(e) => fail(&ops, e),
            }
        }
        "HEAD" => match ops.cache().stat(&ns, &key).await {
            Ok(st) => {
                let mut h = HeaderMap::new();
                entry_headers(&mut h, &st.digest, st.tier);
                h.insert(CONTENT_LENGTH, value(st.size.to_string()));
                (StatusCode::OK, h).into_response()
            }
            Err(e) => fail(&ops, e),
        },
        _ => delete(&ops, &identity, &ns, &key).await,
    }
}

/// `DELETE`: removes the key, audited with the digest it named.
async fn delete(ops: &Ops, identity: &Identity, ns: &str, key: &str) -> Response {
    let r = ops.cache().delete(ns, key).await;
    audit(
        identity,
        "cache_delete",
        &format!("{ns}/{key}"),
        &match &r {
            Ok(Some(before)) => format!("ok: {before} -> none"),
            Ok(None) => "not_found".to_string(),
            Err(e) => e.code.as_str().to_string(),
        },
    );
    match r {
        Ok(Some(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(None) => fail(
            ops,
            OpsError::new(ErrorCode::NotFound, format!("no cache key {key} in {ns}")),
        ),
        Err(e) => fail(ops, e),
    }
}

async fn put(
    ops: &Ops,
    identity: &Identity,
    ns: &str,
    key: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let header = |name: axum::http::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let precondition = or_fail!(
        ops,
        expect_from_headers(
            header(axum::http::header::IF_MATCH),
            header(axum::http::header::IF_NONE_MATCH),
        )
    );
    let len = or_fail!(ops, declared_length(headers));
    let (reader, body_failed) = body_reader(body);
    let r = ops
        .cache()
        .put(identity, ns, key, reader, len, precondition)
        .await;
    // A key that existed (replaced, re-put, or refused) is audited; a new
    // key is not (every build output would be).
    let existed = match &r {
        Ok(out) => out.previous.is_some(),
        Err(e) => matches!(e.code, ErrorCode::Forbidden | ErrorCode::RefConflict),
    };
    if existed {
        audit(
            identity,
            "cache_put",
            &format!("{ns}/{key}"),
            &match &r {
                Ok(out) => format!(
                    "ok: {} -> {}",
                    out.previous.map(|d| d.to_hex()).unwrap_or_default(),
                    out.digest
                ),
                Err(e) => e.code.as_str().to_string(),
            },
        );
    }
    match r {
        Ok(out) => {
            let status = if out.deduplicated {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            let mut h = HeaderMap::new();
            h.insert(
                axum::http::HeaderName::from_static(super::HEADER_DIGEST),
                value(out.digest.to_hex()),
            );
            (status, h).into_response()
        }
        Err(mut e) => {
            if body_failed.load(Ordering::SeqCst) && e.code.redacts_message() {
                e = OpsError::new(ErrorCode::IncompleteBody, e.message);
            }
            fail(ops, e)
        }
    }
}

/// `PROPFIND` (depth 0): a collection for a directory path, the key's
/// length for a key, `404` for a missing key.
async fn propfind(ops: &Ops, ns: &str, key: &str, is_dir: bool, path: &str) -> Response {
    let prop = if is_dir {
        or_fail!(ops, ops.cache().check(ns));
        // Directories are implicit: no time of their own.
        format!(
            "<D:resourcetype><D:collection/></D:resourcetype>\
             <D:getlastmodified>{}</D:getlastmodified>",
            httpdate::fmt_http_date(std::time::UNIX_EPOCH)
        )
    } else {
        match ops.cache().stat(ns, key).await {
            Ok(st) => format!(
                "<D:resourcetype/><D:getcontentlength>{}</D:getcontentlength>\
                 <D:getetag>\"{}\"</D:getetag><D:getlastmodified>{}</D:getlastmodified>",
                st.size,
                st.digest,
                httpdate::fmt_http_date(
                    std::time::UNIX_EPOCH
                        + std::time::Duration::from_millis(st.created_at.max(0) as u64)
                )
            ),
            Err(e) => return fail(ops, e),
        }
    };
    let href: String = path
        .chars()
        .filter(|c| !matches!(c, '<' | '>' | '&' | '"' | '\''))
        .collect();
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?>\
         <D:multistatus xmlns:D=\"DAV:\"><D:response><D:href>{href}</D:href>\
         <D:propstat><D:prop>{prop}</D:prop><D:status>HTTP/1.1 200 OK</D:status>\
         </D:propstat></D:response></D:multistatus>"
    );
    (
        StatusCode::MULTI_STATUS,
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("application/xml; charset=utf-8"),
        )],
        Body::from(xml),
    )
        .into_response()
}
