//! The route table: every route's method, path template, scope and
//! handler, once. The router mounts it ([`mount`]), the gate labels its
//! metrics and access lines by the template that matched ([`label`]), and
//! a test holds docs/SERVER.md's route list to it, and the OpenAPI
//! description is generated from it ([`crate::openapi`], ADR-066). Adding a
//! route is a row here, its handler and its line in SERVER.md.

use std::collections::HashMap;
use std::sync::LazyLock;

use axum::handler::Handler;
use axum::http::Method;
use axum::routing::{any, MethodFilter, MethodRouter};
use axum::Router;
use store_ops::auth::Scope::{self, Admin, Delete, Read, Write};
use store_ops::Ops;

use crate::{admin, cache, handlers, openapi, refs, uploads};
use Content::{Blob, Bytes, Json, Nothing, Text, Xml};

/// One route: `method` on the axum path template `path` (`{*name}` takes
/// the rest of the path), needing `scope` (`None`: no scope), served by
/// `handler`, described by `doc`.
pub(crate) struct Route {
    pub(crate) method: &'static str,
    pub(crate) path: &'static str,
    pub(crate) scope: Option<Scope>,
    pub(crate) doc: Doc,
    pub(crate) handler: Mount,
}

/// What the OpenAPI description says of a route: a summary, its query
/// parameters (name, JSON Schema type, required), its request body and
/// its success answers (errors are the JSON error body of every route).
pub(crate) struct Doc {
    pub(crate) summary: &'static str,
    pub(crate) query: &'static [(&'static str, &'static str, bool)],
    pub(crate) body: Content,
    pub(crate) ok: &'static [(u16, Content)],
}

/// A request or answer body: none, JSON of a named schema
/// (`components.schemas`), bytes (`application/octet-stream`; a blob also
/// as `application/x-bao`), Prometheus text or WebDAV XML.
#[derive(Clone, Copy)]
pub(crate) enum Content {
    Nothing,
    Json(&'static str),
    Bytes,
    Blob,
    Text,
    Xml,
}

const fn d(summary: &'static str, body: Content, ok: &'static [(u16, Content)]) -> Doc {
    Doc {
        summary,
        query: &[],
        body,
        ok,
    }
}

/// [`d`] with query parameters.
const fn q(
    summary: &'static str,
    query: &'static [(&'static str, &'static str, bool)],
    body: Content,
    ok: &'static [(u16, Content)],
) -> Doc {
    Doc {
        summary,
        query,
        body,
        ok,
    }
}

/// Adds a handler to a path's method router for a method (`None`: every
/// method, for a path with WebDAV methods, which axum cannot filter).
pub(crate) type Mount = fn(MethodRouter<Ops>, Option<MethodFilter>) -> MethodRouter<Ops>;

const fn r(
    method: &'static str,
    path: &'static str,
    scope: Scope,
    doc: Doc,
    handler: Mount,
) -> Route {
    Route {
        method,
        path,
        scope: Some(scope),
        doc,
        handler,
    }
}

const PUT: &[(u16, Content)] = &[(201, Json("PutAnswer")), (200, Json("PutAnswer"))];
const GOT: &[(u16, Content)] = &[(200, Blob), (206, Bytes)];
const DONE: &[(u16, Content)] = &[(204, Nothing)];
const PAGE: &[(&str, &str, bool)] = &[("after", "string", false), ("limit", "integer", false)];
const NO_BODY: Content = Json("NoFields");

/// Every route (the rows of a path mount in this order: it is the order
/// of the `Allow` header). The rows of a path with a WebDAV method all
/// name one handler, which dispatches on the method itself.
#[rustfmt::skip]
pub(crate) static ROUTES: &[Route] = &[
    r("PUT", "/v1/blobs/{ns}", Write, d("Store a blob (blobs/put)", Bytes, PUT), |m, f| at(m, f, handlers::put_blob)),
    r("GET", "/v1/blobs/{ns}/{digest}", Read, d("Read a blob, a range of it, or its bao stream", Nothing, GOT), |m, f| at(m, f, handlers::get_blob)),
    r("HEAD", "/v1/blobs/{ns}/{digest}", Read, d("Stat a blob", Nothing, &[(200, Nothing)]), |m, f| at(m, f, handlers::head_blob)),
    r("DELETE", "/v1/blobs/{ns}/{digest}", Delete, d("Delete a blob", Nothing, DONE), |m, f| at(m, f, handlers::delete_blob)),
    r("POST", "/v1/uploads/{ns}", Write, d("Open a resumable upload session", NO_BODY, &[(201, Json("UploadSession"))]), |m, f| at(m, f, uploads::open)),
    r("PATCH", "/v1/uploads/{ns}/{id}", Write, d("Append a chunk to an upload session", Bytes, DONE), |m, f| at(m, f, uploads::append)),
    r("HEAD", "/v1/uploads/{ns}/{id}", Write, d("An upload session's committed offset", Nothing, DONE), |m, f| at(m, f, uploads::status)),
    r("PUT", "/v1/uploads/{ns}/{id}", Write, q("Finish an upload session", &[("digest", "string", true)], Bytes, PUT), |m, f| at(m, f, uploads::finish)),
    r("DELETE", "/v1/uploads/{ns}/{id}", Write, d("Abort an upload session", Nothing, DONE), |m, f| at(m, f, uploads::abort)),
    r("POST", "/v1/have", Read, d("Which digests are present (blobs/have); renew a pin token", Json("HaveRequest"), &[(200, Json("HaveAnswer"))]), |m, f| at(m, f, handlers::have)),
    r("DELETE", "/v1/tokens/{token}", Write, d("Release a pin token", Nothing, DONE), |m, f| at(m, f, handlers::release_token)),
    r("POST", "/v1/sweep", Admin, d("Run one garbage collection pass", NO_BODY, &[(200, Json("SweepReport"))]), |m, f| at(m, f, handlers::sweep)),
    r("GET", "/v1/refs/{ns}", Read, q("List references", &[("prefix", "string", false), ("after", "string", false), ("limit", "integer", false)], Nothing, &[(200, Json("RefList"))]), |m, f| at(m, f, refs::list_refs)),
    r("PUT", "/v1/refs/{ns}/{*name}", Write, d("Set a reference", Json("RefSet"), &[(201, Json("RefSetAnswer")), (200, Json("RefSetAnswer"))]), |m, f| at(m, f, refs::set_ref)),
    r("GET", "/v1/refs/{ns}/{*name}", Read, d("Read a reference", Nothing, &[(200, Json("Ref"))]), |m, f| at(m, f, refs::get_ref)),
    r("DELETE", "/v1/refs/{ns}/{*name}", Write, d("Delete a reference", Nothing, DONE), |m, f| at(m, f, refs::delete_ref)),
    r("GET", "/v1/namespaces", Admin, d("Namespaces holding entries", Nothing, &[(200, Json("Namespaces"))]), |m, f| at(m, f, admin::namespaces)),
    r("GET", "/v1/namespaces/{ns}/entries", Admin, q("A page of a namespace's entries", PAGE, Nothing, &[(200, Json("Entries"))]), |m, f| at(m, f, admin::entries)),
    r("GET", "/v1/stats", Admin, q("Entry and byte counts", &[("namespace", "string", false)], Nothing, &[(200, Json("Stats"))]), |m, f| at(m, f, admin::stats)),
    r("POST", "/v1/verify", Admin, d("Re-read and verify every entry", Json("VerifyRequest"), &[(200, Json("VerifySummary"))]), |m, f| at(m, f, admin::verify)),
    r("MKCOL", "/cache/{ns}", Write, d("WebDAV: make a collection", Nothing, &[(201, Nothing)]), |m, f| at(m, f, cache::cache_ns)),
    r("PROPFIND", "/cache/{ns}", Read, d("WebDAV: a collection's properties", Nothing, &[(207, Xml)]), |m, f| at(m, f, cache::cache_ns)),
    r("MKCOL", "/cache/{ns}/", Write, d("WebDAV: make a collection", Nothing, &[(201, Nothing)]), |m, f| at(m, f, cache::cache_ns)),
    r("PROPFIND", "/cache/{ns}/", Read, d("WebDAV: a collection's properties", Nothing, &[(207, Xml)]), |m, f| at(m, f, cache::cache_ns)),
    r("PUT", "/cache/{ns}/{*key}", Write, d("Store a build-cache entry under a key", Bytes, &[(201, Nothing), (200, Nothing)]), |m, f| at(m, f, cache::cache_key)),
    r("GET", "/cache/{ns}/{*key}", Read, d("Read a build-cache entry", Nothing, &[(200, Bytes), (206, Bytes)]), |m, f| at(m, f, cache::cache_key)),
    r("HEAD", "/cache/{ns}/{*key}", Read, d("Stat a build-cache entry", Nothing, &[(200, Nothing)]), |m, f| at(m, f, cache::cache_key)),
    r("DELETE", "/cache/{ns}/{*key}", Delete, d("Delete a build-cache key", Nothing, DONE), |m, f| at(m, f, cache::cache_key)),
    r("MKCOL", "/cache/{ns}/{*key}", Write, d("WebDAV: make a collection", Nothing, &[(201, Nothing)]), |m, f| at(m, f, cache::cache_key)),
    r("PROPFIND", "/cache/{ns}/{*key}", Read, d("WebDAV: a key's properties", Nothing, &[(207, Xml)]), |m, f| at(m, f, cache::cache_key)),
    Route { method: "GET", path: "/health", scope: None, doc: d("Health of every tier", Nothing, &[(200, Json("Health")), (503, Json("Health"))]), handler: |m, f| at(m, f, handlers::health) },
    r("GET", "/metrics", Admin, d("Prometheus metrics", Nothing, &[(200, Text)]), |m, f| at(m, f, handlers::metrics)),
    Route { method: "GET", path: "/openapi.json", scope: None, doc: d("This description (OpenAPI 3.1)", Nothing, &[(200, Json("Object"))]), handler: |m, f| at(m, f, openapi::serve) },
];

fn at<H: Handler<T, Ops>, T: 'static>(
    m: MethodRouter<Ops>,
    f: Option<MethodFilter>,
    h: H,
) -> MethodRouter<Ops> {
    match f {
        Some(f) => m.on(f, h),
        None => any(h),
    }
}

/// `router` with every route of [`ROUTES`] mounted.
pub(crate) fn mount(mut router: Router<Ops>) -> Router<Ops> {
    let filter = |m: &str| -> Option<MethodFilter> {
        Method::from_bytes(m.as_bytes()).ok()?.try_into().ok()
    };
    for (i, first) in ROUTES.iter().enumerate() {
        if ROUTES[..i].iter().any(|r| r.path == first.path) {
            continue;
        }
        let rows = ROUTES.iter().filter(|r| r.path == first.path);
        let methods = if rows.clone().any(|r| filter(r.method).is_none()) {
            (first.handler)(MethodRouter::new(), None)
        } else {
            rows.fold(MethodRouter::new(), |m, r| (r.handler)(m, filter(r.method)))
        };
        router = router.route(first.path, methods);
    }
    router
}

/// The label of a path template in metrics and access lines: the
/// template with `{*name}` written `{name}` and no trailing `/`
/// (`/cache/{ns}/` is `/cache/{ns}`).
pub(crate) fn label(path: &str) -> String {
    let l = path.replace("{*", "{");
    match l.strip_suffix('/') {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => l,
    }
}

/// [`label`] of every path of [`ROUTES`], computed once (a label is
/// borrowed per request, never built).
pub(crate) static LABELS: LazyLock<HashMap<&'static str, String>> =
    LazyLock::new(|| ROUTES.iter().map(|r| (r.path, label(r.path))).collect());

/// Where a path template names the namespace: its `/`-separated segment.
pub(crate) fn ns_segment(path: &str) -> Option<usize> {
    path.split('/').position(|s| s == "{ns}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// `(method, path, scope)` of each route docs/SERVER.md's `## Routes`
    /// table lists: a cell may name several methods (`GET` / `HEAD`) and
    /// paths; a scope cell names one scope for all of a row's methods, or
    /// one each.
    fn documented(heading: &str) -> BTreeSet<(String, String, String)> {
        let doc = include_str!("../../../docs/SERVER.md");
        let section = doc.find(heading).expect("SERVER.md has the section");
        let start = section + doc[section..].find("\n| method |").expect("a table");
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let mut out = BTreeSet::new();
        for line in doc[start..]
            .lines()
            .skip(3)
            .take_while(|l| l.starts_with('|'))
        {
            let cols: Vec<&str> = line.trim_matches('|').split('|').collect();
            let methods: Vec<String> = ticked(cols[0])
                .into_iter()
                .filter(|m| m.bytes().all(|b| b.is_ascii_uppercase()))
                .collect();
            let scopes: Vec<String> = ticked(cols[2])
                .into_iter()
                .filter(|s| ["read", "write", "delete", "admin"].contains(&s.as_str()))
                .collect();
            for (i, m) in methods.iter().enumerate() {
                let scope = match scopes.len() {
                    0 => "none".to_string(),
                    n if n == methods.len() => scopes[i].clone(),
                    _ => scopes[0].clone(),
                };
                for p in ticked(cols[1]).iter().filter(|p| p.starts_with('/')) {
                    let p = p.split('?').next().unwrap_or(p).to_string();
                    out.insert((m.clone(), p, scope.clone()));
                }
            }
        }
        out
    }

    #[test]
    fn server_md_lists_the_route_table() {
        let table: BTreeSet<(String, String, String)> = ROUTES
            .iter()
            .map(|r| {
                let scope = r.scope.map_or("none", Scope::as_str);
                (r.method.to_string(), label(r.path), scope.to_string())
            })
            .collect();
        let doc = documented("\n## Routes\n");
        let missing: Vec<_> = table.difference(&doc).collect();
        let extra: Vec<_> = doc.difference(&table).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "docs/SERVER.md ## Routes differs from routes::ROUTES: not documented {missing:?}, \
             documented but not routed {extra:?}"
        );
    }

    /// Every row of SERVER.md's route × scope × owner table (which
    /// `http_scope_table.rs` holds to the server) is a route of the table,
    /// with its scope.
    #[test]
    fn the_scope_table_rows_are_routes() {
        let table: BTreeSet<(String, String, String)> = ROUTES
            .iter()
            .map(|r| {
                let scope = r.scope.map_or("none", Scope::as_str);
                (r.method.to_string(), label(r.path), scope.to_string())
            })
            .collect();
        let rows = documented("### What each scope may do: route × scope × owner");
        assert!(
            rows.len() >= 20,
            "the scope table was not found whole: {rows:?}"
        );
        let unrouted: Vec<_> = rows.difference(&table).collect();
        assert!(unrouted.is_empty(), "not in routes::ROUTES: {unrouted:?}");
    }

    /// Concrete paths, routed over the table's templates, get the labels
    /// and namespaces the gate's hand-kept `route_of` gave them.
    #[tokio::test]
    async fn requests_are_labelled_by_the_template_they_match() {
        use axum::extract::MatchedPath;
        use tower_service::Service;
        let mut router: Router = Router::new();
        for (i, r) in ROUTES.iter().enumerate() {
            if ROUTES[..i].iter().all(|o| o.path != r.path) {
                let answer = |m: MatchedPath| async move {
                    let ns = ns_segment(m.as_str()).map_or("-".into(), |i| i.to_string());
                    format!("{} {ns}", label(m.as_str()))
                };
                router = router.route(r.path, any(answer));
            }
        }
        for (path, route, ns) in [
            ("/v1/blobs/docs", "/v1/blobs/{ns}", "docs"),
            ("/v1/blobs/docs/abc", "/v1/blobs/{ns}/{digest}", "docs"),
            ("/v1/tokens/secret", "/v1/tokens/{token}", "-"),
            ("/v1/uploads/up", "/v1/uploads/{ns}", "up"),
            ("/v1/uploads/up/0a1b2c3d-ff", "/v1/uploads/{ns}/{id}", "up"),
            ("/v1/refs/r", "/v1/refs/{ns}", "r"),
            ("/v1/refs/r/a/b/c", "/v1/refs/{ns}/{name}", "r"),
            (
                "/v1/namespaces/n/entries",
                "/v1/namespaces/{ns}/entries",
                "n",
            ),
            ("/cache/cc", "/cache/{ns}", "cc"),
            ("/cache/cc/", "/cache/{ns}", "cc"),
            ("/cache/cc/a/b", "/cache/{ns}/{key}", "cc"),
            ("/metrics", "/metrics", "-"),
        ] {
            let req = axum::http::Request::get(path).body(axum::body::Body::empty());
            let resp = router.call(req.unwrap()).await.unwrap();
            let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
            let (got, at) = std::str::from_utf8(&body).unwrap().split_once(' ').unwrap();
            assert_eq!(got, route, "{path}");
            let got_ns = at
                .parse()
                .map_or("-", |i: usize| path.split('/').nth(i).unwrap());
            assert_eq!(got_ns, ns, "{path}");
        }
    }

    #[test]
    fn labels_name_the_template_without_secrets() {
        assert_eq!(label("/v1/blobs/{ns}/{digest}"), "/v1/blobs/{ns}/{digest}");
        assert_eq!(label("/v1/refs/{ns}/{*name}"), "/v1/refs/{ns}/{name}");
        assert_eq!(label("/cache/{ns}/"), "/cache/{ns}");
        assert_eq!(label("/bazel/{*key}"), "/bazel/{key}");
        assert_eq!(ns_segment("/v1/uploads/{ns}/{id}"), Some(3));
        assert_eq!(ns_segment("/v1/tokens/{token}"), None);
    }
}
