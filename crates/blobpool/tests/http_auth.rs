//! Identities, scopes and browser safety over real sockets (ADR-023):
//! every route refuses anonymous and wrong-scope callers with stable codes
//! and changes nothing; pin tokens belong to the identity that minted
//! them; per-identity token caps; cross-site simple requests, foreign
//! `Host`s and CORS; internal errors reach clients redacted.

mod common;

use common::*;
use serde_json::json;
use store_http::HttpConfig;
use store_ops::auth::{hash_key, parse_key_hash, ApiKey, Auth, Grant};

const READER: &str = "bpk_reader";
const WRITER: &str = "bpk_writer";
const DELETER: &str = "bpk_deleter";
const ADMIN: &str = "bpk_admin";
const OTHER_WRITER: &str = "bpk_other";

fn key(name: &str, secret: &str, scopes: &[&str]) -> ApiKey {
    ApiKey {
        name: name.into(),
        hash: parse_key_hash(&hash_key(secret)).unwrap(),
        grants: Grant::parse_all(scopes).unwrap(),
    }
}

fn auth() -> Auth {
    Auth::new(
        vec![
            key("reader", READER, &["read"]),
            key("writer", WRITER, &["read", "write:ci-*"]),
            key("other", OTHER_WRITER, &["write:ci-*"]),
            key("deleter", DELETER, &["delete:ci-*"]),
            key("admin", ADMIN, &["admin"]),
        ],
        vec![],
        Grant::parse_all(&["read:public"]).unwrap(),
    )
    .unwrap()
}

async fn start_auth(opts: Opts) -> Server {
    start(Opts {
        http: HttpConfig {
            auth: auth(),
            ..Default::default()
        },
        ..opts
    })
    .await
}

/// A request with an optional bearer key.
fn req(
    s: &Server,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
) -> reqwest::RequestBuilder {
    let b = s.http.request(method, s.url(path));
    match key {
        Some(k) => b.bearer_auth(k),
        None => b,
    }
}

async fn put_as(s: &Server, ns: &str, body: &'static [u8], key: &str) -> (String, String) {
    let resp = req(
        s,
        reqwest::Method::PUT,
        &format!("/v1/blobs/{ns}"),
        Some(key),
    )
    .body(body)
    .send()
    .await
    .unwrap();
    assert!(resp.status().is_success(), "{:?}", resp.status());
    let v: serde_json::Value = resp.json().await.unwrap();
    (
        v["token"].as_str().unwrap().to_string(),
        v["digest"].as_str().unwrap().to_string(),
    )
}

#[tokio::test]
async fn every_route_refuses_the_anonymous_and_the_unscoped_and_changes_nothing() {
    let s = start_auth(Opts::default()).await;
    let (token, d) = put_as(&s, "ci-main", b"protected", WRITER).await;
    let big_before = s.store().stat(&key_of("ci-main", &d)).await.unwrap();
    assert!(big_before.is_some());
    use reqwest::Method as M;
    let have = json!({"namespace": "ci-main", "digests": [d]}).to_string();
    let renew = json!({"namespace": "ci-main", "digests": [d], "token": token}).to_string();
    // (method, path, json body, key that lacks the scope)
    let cases: Vec<(M, String, Option<String>, &str)> = vec![
        (M::PUT, "/v1/blobs/ci-main".into(), None, READER),
        (M::PUT, "/v1/blobs/prod".into(), None, WRITER),
        (M::GET, format!("/v1/blobs/ci-main/{d}"), None, DELETER),
        (M::HEAD, format!("/v1/blobs/ci-main/{d}"), None, DELETER),
        (M::DELETE, format!("/v1/blobs/ci-main/{d}"), None, WRITER),
        (M::POST, "/v1/have".into(), Some(have), DELETER),
        (M::POST, "/v1/have".into(), Some(renew), READER),
        (M::DELETE, format!("/v1/tokens/{token}"), None, READER),
        (M::POST, "/v1/sweep".into(), Some("{}".into()), WRITER),
        (M::GET, "/metrics".into(), None, WRITER),
    ];
    for (method, path, body, wrong) in &cases {
        for (k, status, code) in [
            (None, 401, "unauthorized"),
            (Some("bpk_not_a_key"), 401, "unauthorized"),
            (Some(*wrong), 403, "forbidden"),
        ] {
            let mut b = req(&s, method.clone(), path, k);
            if let Some(body) = body {
                b = b
                    .header("content-type", "application/json")
                    .body(body.clone());
            } else if *method == M::PUT {
                b = b.body("intruder");
            }
            let resp = b.send().await.unwrap();
            assert_eq!(resp.status(), status, "{method} {path} as {k:?}");
            if status == 401 {
                assert_eq!(
                    resp.headers()["www-authenticate"],
                    "Bearer realm=\"blobpool\"",
                    "{method} {path}"
                );
            }
            if *method != M::HEAD {
                let v: serde_json::Value = resp.json().await.unwrap();
                assert_eq!(v["error"]["code"], code, "{method} {path} as {k:?}: {v}");
            }
        }
    }
    // Nothing changed: the entry, its token and no stray entries.
    assert!(s
        .store()
        .stat(&key_of("ci-main", &d))
        .await
        .unwrap()
        .is_some());
    assert!(s.ops.tokens().lookup(&token).is_some());
    assert!(s.ns_is_empty("prod").await);
    // Health stays open (load balancers probe it without keys).
    assert_eq!(s.get("/health").await.status(), 200);
}

#[tokio::test]
async fn scoped_identities_do_what_their_scopes_allow() {
    let s = start_auth(Opts::default()).await;
    let (token, d) = put_as(&s, "ci-main", b"hello", WRITER).await;
    let path = format!("/v1/blobs/ci-main/{d}");
    let got = req(&s, reqwest::Method::GET, &path, Some(READER))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap(), "hello");
    // A renewal probe by the owner.
    let resp = req(&s, reqwest::Method::POST, "/v1/have", Some(WRITER))
        .header("content-type", "application/json")
        .body(json!({"namespace": "ci-main", "digests": [d], "token": token}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Release by the owner, then the deleter deletes.
    let resp = req(
        &s,
        reqwest::Method::DELETE,
        &format!("/v1/tokens/{token}"),
        Some(WRITER),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 204);
    let resp = req(&s, reqwest::Method::DELETE, &path, Some(DELETER))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    // The admin sweeps and reads metrics.
    let resp = req(&s, reqwest::Method::POST, "/v1/sweep", Some(ADMIN))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = req(&s, reqwest::Method::GET, "/metrics", Some(ADMIN))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn anonymous_grants_open_only_their_namespaces() {
    let s = start_auth(Opts::default()).await;
    s.store().put(&ns("public"), &b"shared"[..]).await.unwrap();
    s.store().put(&ns("private"), &b"shared"[..]).await.unwrap();
    let d = blake3::hash(b"shared").to_hex().to_string();
    assert_eq!(s.get(&format!("/v1/blobs/public/{d}")).await.status(), 200);
    let resp = s.get(&format!("/v1/blobs/private/{d}")).await;
    assert_error(resp, 401, "unauthorized").await;
    let resp = s.put("public", "anonymous write").await;
    assert_error(resp, 401, "unauthorized").await;
}

#[tokio::test]
async fn a_pin_token_belongs_to_the_identity_that_minted_it() {
    let s = start_auth(Opts::default()).await;
    let (token, d) = put_as(&s, "ci-main", b"mine", WRITER).await;
    // Another identity with the same write scope can neither renew...
    let resp = req(&s, reqwest::Method::POST, "/v1/have", Some(OTHER_WRITER))
        .header("content-type", "application/json")
        .body(json!({"namespace": "ci-main", "digests": [d], "token": token}).to_string())
        .send()
        .await
        .unwrap();
    assert_error(resp, 403, "forbidden").await;
    // ...nor release it.
    let resp = req(
        &s,
        reqwest::Method::DELETE,
        &format!("/v1/tokens/{token}"),
        Some(OTHER_WRITER),
    )
    .send()
    .await
    .unwrap();
    assert_error(resp, 403, "forbidden").await;
    assert!(
        s.ops.tokens().lookup(&token).is_some(),
        "the token survived"
    );
    // The entry stays protected.
    let resp = req(
        &s,
        reqwest::Method::DELETE,
        &format!("/v1/blobs/ci-main/{d}"),
        Some(DELETER),
    )
    .send()
    .await
    .unwrap();
    assert_error(resp, 409, "gc_refuse").await;
    // An admin may release anyone's token (operator clean-up).
    let resp = req(
        &s,
        reqwest::Method::DELETE,
        &format!("/v1/tokens/{token}"),
        Some(ADMIN),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(resp.status(), 204);
    assert!(s.ops.tokens().lookup(&token).is_none());
}

#[tokio::test]
async fn the_token_cap_is_per_identity_and_refuses_before_storing() {
    let s = start_auth(Opts {
        max_tokens_per_owner: Some(2),
        ..Default::default()
    })
    .await;
    put_as(&s, "ci-a", b"one", WRITER).await;
    put_as(&s, "ci-a", b"two", WRITER).await;
    let resp = req(&s, reqwest::Method::PUT, "/v1/blobs/ci-a", Some(WRITER))
        .body("three")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_error(resp, 503, "too_many_tokens").await;
    let three = blake3::hash(b"three").to_hex().to_string();
    assert!(s
        .store()
        .stat(&key_of("ci-a", &three))
        .await
        .unwrap()
        .is_none());
    // Another identity is not held back by the first one's tokens.
    put_as(&s, "ci-a", b"three", OTHER_WRITER).await;
}

#[tokio::test]
async fn cross_site_simple_posts_are_refused() {
    let s = start(Opts::default()).await;
    s.put_ok("tmp", "x").await;
    for ct in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        for path in ["/v1/sweep", "/v1/have"] {
            let mut b = s.http.post(s.url(path)).body("{}");
            if let Some(ct) = ct {
                b = b.header("content-type", ct);
            }
            let resp = b.send().await.unwrap();
            assert_error(resp, 415, "unsupported_media_type").await;
        }
    }
    // `application/json; charset=utf-8` is JSON.
    let resp = s
        .http
        .post(s.url("/v1/sweep"))
        .header("content-type", "application/json; charset=utf-8")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // No CORS headers unless origins are configured.
    let resp = s
        .http
        .request(reqwest::Method::OPTIONS, s.url("/v1/sweep"))
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(resp.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn foreign_hosts_are_refused_and_cors_only_for_listed_origins() {
    let s = start(Opts {
        http: HttpConfig {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into()],
            cors_origins: vec!["https://app.example".into()],
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    assert_eq!(s.get("/health").await.status(), 200);
    // A DNS-rebinding page's requests carry its own host name.
    let resp = s
        .http
        .get(s.url("/health"))
        .header("host", "evil.example:7070")
        .send()
        .await
        .unwrap();
    assert_error(resp, 421, "host_not_allowed").await;
    let preflight = |origin: &'static str| {
        s.http
            .request(reqwest::Method::OPTIONS, s.url("/v1/have"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type")
            .send()
    };
    let ok = preflight("https://app.example").await.unwrap();
    assert_eq!(
        ok.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    let no = preflight("https://evil.example").await.unwrap();
    assert!(no.headers().get("access-control-allow-origin").is_none());
}

#[tokio::test]
async fn internal_errors_reach_clients_redacted_with_a_request_id() {
    let s = start(Opts::default()).await;
    // Break the large tier under the server: its root becomes a file.
    let root = s.dir.path().join("large");
    std::fs::remove_dir_all(&root).unwrap();
    std::fs::write(&root, b"not a directory").unwrap();
    let resp = s.put("docs", vec![1u8; 64 * 1024]).await;
    assert_eq!(resp.status(), 500);
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_string();
    let text = resp.text().await.unwrap();
    let dir = s.dir.path().to_str().unwrap();
    assert!(!text.contains(dir), "a path leaked: {text}");
    assert!(!text.contains("/tmp"), "a path leaked: {text}");
    assert!(!text.contains(&std::process::id().to_string()), "{text}");
    assert!(text.contains(&id), "the body names the request id: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["code"], "internal");
}

fn ns(s: &str) -> store_types::Namespace {
    store_types::Namespace::new(s).unwrap()
}

fn key_of(n: &str, d: &str) -> store_types::Key {
    store_types::Key::parse(n, d).unwrap()
}

/// The key as the password of `Basic` credentials (any user name), as
/// ccache, sccache's WebDAV backend, Gradle and Bazel send it: the right
/// key is the key's identity with its scopes; a wrong key or malformed
/// credentials are `401` offering both schemes, never anonymous.
#[tokio::test]
async fn basic_credentials_carry_the_key_as_password() {
    let s = start_auth(Opts::default()).await;
    let (_, d) = put_as(&s, "ci-main", b"via basic", WRITER).await;
    let path = format!("/v1/blobs/ci-main/{d}");
    let got = s
        .http
        .get(s.url(&path))
        .basic_auth("any-user-name", Some(READER))
        .send()
        .await
        .unwrap();
    assert_eq!(got.status(), 200);
    assert_eq!(got.bytes().await.unwrap(), "via basic");
    // Basic grants the key's scopes, no more: the reader cannot write.
    let resp = s
        .http
        .put(s.url("/v1/blobs/ci-main"))
        .basic_auth("ci", Some(READER))
        .body("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    // A wrong key: 401 (not downgraded to the anonymous identity, which
    // may read `public`).
    let public = format!("/v1/blobs/public/{}", "0".repeat(64));
    assert_eq!(
        s.get(&public).await.status(),
        404,
        "anonymous may read there (nothing stored)"
    );
    for (what, header) in [
        ("wrong key", "Basic Y2k6YnBrX3dyb25n".to_string()), // ci:bpk_wrong
        ("no colon", "Basic bm9jb2xvbg==".to_string()),      // nocolon
        ("not base64", "Basic !!!not-base64".to_string()),
        ("not UTF-8", "Basic //46eA==".to_string()), // ff fe : x
        ("no credentials", "Basic".to_string()),
        ("empty password", "Basic Y2k6".to_string()), // ci:
    ] {
        for p in [&path, &public] {
            let resp = s
                .http
                .get(s.url(p))
                .header("authorization", &header)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 401, "{what}: {p}");
            let offered: Vec<&str> = resp
                .headers()
                .get_all("www-authenticate")
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            assert_eq!(
                offered,
                ["Bearer realm=\"blobpool\"", "Basic realm=\"blobpool\""],
                "{what}"
            );
            let v: serde_json::Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["code"], "unauthorized", "{what}: {v}");
        }
    }
}
