//! The OpenAPI 3.1 description of the HTTP API, generated from the route
//! table ([`ROUTES`]) so that it cannot drift from what is routed
//! (ADR-066): each row's method, path template, scope and [`Doc`] become an
//! operation; every error is the JSON error body. Built once, served at
//! `GET /openapi.json` (no scope) and committed as docs/openapi.json, which
//! a test holds to it (`UPDATE_OPENAPI=1` rewrites the file). WebDAV's
//! `MKCOL` and `PROPFIND` are not OpenAPI 3.1 methods: the description
//! names them in its `x-webdav` list instead.

use std::sync::LazyLock;

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::routes::{label, Content, Doc, ROUTES};

/// The description, serialized once (a request borrows it).
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    let mut text = serde_json::to_string_pretty(&document()).expect("JSON serializes");
    text.push('\n');
    text
});

/// `GET /openapi.json`.
pub(crate) async fn serve() -> Response {
    ([(CONTENT_TYPE, "application/json")], DOCUMENT.as_str()).into_response()
}

/// The methods OpenAPI 3.1 can describe.
const METHODS: [&str; 6] = ["GET", "HEAD", "PUT", "POST", "PATCH", "DELETE"];

/// The description of every route of [`ROUTES`].
fn document() -> Value {
    let mut paths = Map::new();
    let mut webdav = Vec::new();
    for route in ROUTES {
        let path = label(route.path);
        if !METHODS.contains(&route.method) {
            let named = format!("{} {path}", route.method);
            if !webdav.contains(&named) {
                webdav.push(named);
            }
            continue;
        }
        let mut op = operation(&path, &route.doc, route.method == "HEAD");
        op["security"] = match route.scope {
            None => json!([]),
            Some(scope) => {
                op["x-blobpool-scope"] = json!(scope.as_str());
                json!([{"bearer": []}, {"basic": []}])
            }
        };
        let methods = paths.entry(path).or_insert_with(|| json!({}));
        methods[route.method.to_ascii_lowercase()] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Blobpool",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A content-addressed blob store's HTTP API: docs/SERVER.md is the reference.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "paths": paths,
        "components": {"schemas": schemas(), "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer", "description": "an API key"},
            "basic": {"type": "http", "scheme": "basic", "description": "any user name, the API key as the password"},
        }},
        "x-webdav": webdav,
    })
}

/// One operation: its summary, path and query parameters, request body,
/// success answers and the error body (none for `HEAD`).
fn operation(path: &str, doc: &Doc, head: bool) -> Value {
    let mut params: Vec<Value> = path
        .split('/')
        .filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": path_schema(name)}))
        .collect();
    params.extend(doc.query.iter().map(|(name, ty, required)| {
        json!({"name": name, "in": "query", "required": required, "schema": {"type": ty}})
    }));
    let mut responses = Map::new();
    for (status, content) in doc.ok {
        responses.insert(status.to_string(), answer("success", *content));
    }
    let error = if head {
        Content::Nothing
    } else {
        Content::Json("Error")
    };
    responses.insert(
        "default".into(),
        answer("an error (docs/SERVER.md, Conventions)", error),
    );
    let mut op = json!({"summary": doc.summary, "parameters": params, "responses": responses});
    if let Some(media) = media(doc.body) {
        op["requestBody"] = json!({"required": false, "content": media});
    }
    op
}

/// A response object.
fn answer(description: &str, content: Content) -> Value {
    match media(content) {
        Some(media) => json!({"description": description, "content": media}),
        None => json!({"description": description}),
    }
}

/// The media type map of a body (`None`: no body).
fn media(content: Content) -> Option<Value> {
    let bytes =
        json!({"schema": {"type": "string", "contentMediaType": "application/octet-stream"}});
    Some(match content {
        Content::Nothing => return None,
        Content::Json(name) => {
            json!({"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}})
        }
        Content::Bytes => json!({"application/octet-stream": bytes}),
        Content::Blob => json!({"application/octet-stream": bytes, "application/x-bao": bytes}),
        Content::Text => json!({"text/plain": {"schema": {"type": "string"}}}),
        Content::Xml => json!({"application/xml": {"schema": {"type": "string"}}}),
    })
}

/// The schema of a path parameter (docs/SERVER.md, Conventions).
fn path_schema(name: &str) -> Value {
    match name {
        "ns" => json!({"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]{0,63}$"}),
        "digest" => json!({"$ref": "#/components/schemas/Digest"}),
        _ => json!({"type": "string", "minLength": 1}),
    }
}

/// The named schemas of the request and answer bodies.
fn schemas() -> Value {
    let digest = json!({"$ref": "#/components/schemas/Digest"});
    let digest_or_null = json!({"oneOf": [digest, {"type": "null"}]});
    let string_or_null = json!({"type": ["string", "null"]});
    let count = json!({"type": "integer", "minimum": 0});
    let object = |required: &[&str], properties: Value| json!({"type": "object", "required": required, "properties": properties});
    json!({
        "Digest": {"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "BLAKE3-256, lowercase hex"},
        "Object": {"type": "object"},
        "NoFields": {"type": "object", "maxProperties": 0, "description": "none: the route takes Content-Type: application/json and reads no body"},
        "Error": object(&["error"], json!({"error": object(&["code", "message"], json!({
            "code": {"type": "string"}, "message": {"type": "string"},
            "reason": {"enum": ["pinned", "live", "protect_callback"]},
        }))})),
        "PutAnswer": object(&["token", "digest"], json!({
            "token": string_or_null, "digest": digest, "cache": {"const": true},
        })),
        "HaveRequest": object(&["namespace", "digests"], json!({
            "namespace": {"type": "string"}, "digests": {"type": "array", "items": {"type": "string"}},
            "token": {"type": "string"},
        })),
        "HaveAnswer": object(&["present"], json!({"present": {"type": "array", "items": {"type": "boolean"}}})),
        "UploadSession": object(&["id", "namespace", "offset", "location"], json!({
            "id": {"type": "string"}, "namespace": {"type": "string"}, "offset": count, "location": {"type": "string"},
        })),
        "RefSet": object(&["digest"], json!({"digest": {"type": "string"}, "token": {"type": "string"}})),
        "Ref": object(&["namespace", "name", "digest"], json!({
            "namespace": {"type": "string"}, "name": {"type": "string"}, "digest": digest,
        })),
        "RefSetAnswer": object(&["namespace", "name", "digest", "previous", "token_released"], json!({
            "namespace": {"type": "string"}, "name": {"type": "string"}, "digest": digest,
            "previous": digest_or_null, "token_released": {"type": "boolean"}, "policy_adopted": {"const": true},
        })),
        "RefList": object(&["refs", "next"], json!({
            "refs": {"type": "array", "items": {"$ref": "#/components/schemas/Ref"}}, "next": string_or_null,
        })),
        "Namespaces": object(&["namespaces"], json!({"namespaces": {"type": "array", "items": {"type": "string"}}})),
        "Entries": object(&["entries", "next"], json!({
            "entries": {"type": "array", "items": object(&["digest", "size", "tier", "created_at"], json!({
                "digest": digest, "size": count, "tier": {"enum": ["kv", "large"]}, "created_at": {"type": "integer"},
            }))},
            "next": digest_or_null,
        })),
        "Stats": object(&["namespaces", "total"], json!({"namespaces": {"type": "array"}, "total": {"type": "object"}})),
        "SweepReport": object(&["aborted", "total"], json!({"aborted": string_or_null, "total": {"type": "object"}})),
        "VerifyRequest": {"type": "object", "additionalProperties": false, "properties": {
            "namespace": {"type": "string"}, "quarantine": {"const": false},
            "max_rate": {"type": "integer", "minimum": store_ops::MIN_VERIFY_RATE},
            "concurrency": {"type": "integer", "minimum": 1, "maximum": 8},
        }},
        "VerifySummary": object(&["checked", "ok", "corrupt", "missing", "failed"], json!({
            "checked": count, "ok": count, "corrupt": count, "missing": count, "failed": count,
        })),
        "Health": object(&["status", "mode", "fleet", "tokens"], json!({
            "status": {"enum": ["ok", "unavailable"]}, "mode": {"type": "string"}, "fleet": {"type": "boolean"},
            "tokens": count, "error": {"type": "string"},
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/openapi.json is the generated description; `UPDATE_OPENAPI=1`
    /// rewrites it.
    #[test]
    fn docs_openapi_json_is_the_generated_description() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(path, DOCUMENT.as_str()).unwrap();
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == *DOCUMENT,
            "docs/openapi.json differs from the route table's description: \
             rerun with UPDATE_OPENAPI=1 (cargo test -p store-http openapi) and commit it"
        );
    }

    /// Every route is an operation, or a WebDAV method named in `x-webdav`.
    #[test]
    fn every_route_is_described() {
        let doc = document();
        for r in ROUTES {
            let path = label(r.path);
            let op = &doc["paths"][&path][r.method.to_ascii_lowercase()];
            let listed = doc["x-webdav"]
                .as_array()
                .unwrap()
                .contains(&json!(format!("{} {path}", r.method)));
            assert!(op.is_object() || listed, "{} {path}", r.method);
        }
    }
}
