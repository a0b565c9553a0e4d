//! A `write` key only adds (issue 39, ADR-052): it creates cache keys and
//! references and re-puts the bytes a key names, but replacing or removing
//! what another identity set needs `delete` on the namespace; write-once
//! cache namespaces (`immutable = true`) are replaced by nobody; `PUT`
//! on a cache key honours `If-None-Match: *` and `If-Match`.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use store_core::CacheBounds;

const A: &str = "bpk_write_only_a";
const B: &str = "bpk_write_only_b";
const ADMIN: &str = "bpk_write_only_admin";

async fn server() -> Server {
    let unbounded = CacheBounds {
        max_bytes: None,
        max_age: None,
    };
    start_with_keys(
        vec![
            api_key("a", A, &["read", "write"]),
            api_key("b", B, &["read", "write"]),
            api_key("admin", ADMIN, &["read", "write", "delete", "admin"]),
        ],
        Opts {
            window: Duration::ZERO,
            cache: vec![("cc", unbounded), ("ac", unbounded)],
            immutable: vec!["ac"],
            ..Default::default()
        },
    )
    .await
}

async fn put(s: &Server, who: &str, path: &str, body: &'static str) -> reqwest::Response {
    s.http
        .put(s.url(path))
        .bearer_auth(who)
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn put_if(
    s: &Server,
    who: &str,
    path: &str,
    header: (&str, String),
    body: &'static str,
) -> reqwest::Response {
    s.http
        .put(s.url(path))
        .bearer_auth(who)
        .header(header.0, header.1)
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn text(s: &Server, path: &str) -> String {
    let r = s.http.get(s.url(path)).bearer_auth(A).send().await.unwrap();
    assert_eq!(r.status(), 200, "GET {path}");
    r.text().await.unwrap()
}

async fn sweep(s: &Server) {
    let r = s
        .http
        .post(s.url("/v1/sweep"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

fn b3(s: &str) -> String {
    blake3::hash(s.as_bytes()).to_hex().to_string()
}

#[tokio::test]
async fn a_write_key_cannot_replace_or_empty_another_identitys_cache_key() {
    let s = server().await;
    assert_eq!(
        put(&s, A, "/cache/cc/ab/key1", "a's object").await.status(),
        201
    );
    // b overwrites with its own bytes, or with nothing: refused, unchanged.
    assert_error(
        put(&s, B, "/cache/cc/ab/key1", "poison").await,
        403,
        "forbidden",
    )
    .await;
    assert_error(put(&s, B, "/cache/cc/ab/key1", "").await, 403, "forbidden").await;
    assert_eq!(text(&s, "/cache/cc/ab/key1").await, "a's object");
    // Two sweeps later a's entry is still there (the refused puts stored
    // garbage that is now gone; the key still protects a's entry).
    sweep(&s).await;
    sweep(&s).await;
    assert_eq!(text(&s, "/cache/cc/ab/key1").await, "a's object");
    // The same bytes again are fine for anyone (a build that reproduced
    // the output), and do not make b the owner.
    assert_eq!(
        put(&s, B, "/cache/cc/ab/key1", "a's object").await.status(),
        200
    );
    assert_error(
        put(&s, B, "/cache/cc/ab/key1", "poison").await,
        403,
        "forbidden",
    )
    .await;
    // a replaces its own key; an identity with `delete` replaces anything.
    assert!(put(&s, A, "/cache/cc/ab/key1", "a's second")
        .await
        .status()
        .is_success());
    assert_eq!(text(&s, "/cache/cc/ab/key1").await, "a's second");
    assert!(put(&s, ADMIN, "/cache/cc/ab/key1", "admin's")
        .await
        .status()
        .is_success());
    assert_eq!(text(&s, "/cache/cc/ab/key1").await, "admin's");
    // Deleting a key needs `delete`.
    let r = s
        .http
        .delete(s.url("/cache/cc/ab/key1"))
        .bearer_auth(B)
        .send()
        .await
        .unwrap();
    assert_error(r, 403, "forbidden").await;
    assert_eq!(text(&s, "/cache/cc/ab/key1").await, "admin's");
}

#[tokio::test]
async fn cache_puts_honour_if_none_match_and_if_match() {
    let s = server().await;
    let star = || ("if-none-match", "*".to_string());
    assert_eq!(
        put_if(&s, A, "/cache/cc/k", star(), "first").await.status(),
        201
    );
    // The key exists: 412, even with the same bytes, even for its owner.
    assert_error(
        put_if(&s, A, "/cache/cc/k", star(), "first").await,
        412,
        "ref_conflict",
    )
    .await;
    assert_error(
        put_if(&s, ADMIN, "/cache/cc/k", star(), "other").await,
        412,
        "ref_conflict",
    )
    .await;
    // If-Match names the digest the key must hold.
    let wrong = ("if-match", format!("\"{}\"", b3("nope")));
    assert_error(
        put_if(&s, A, "/cache/cc/k", wrong, "second").await,
        412,
        "ref_conflict",
    )
    .await;
    assert_eq!(text(&s, "/cache/cc/k").await, "first");
    let right = ("if-match", format!("\"{}\"", b3("first")));
    assert!(put_if(&s, A, "/cache/cc/k", right, "second")
        .await
        .status()
        .is_success());
    assert_eq!(text(&s, "/cache/cc/k").await, "second");
    // A malformed precondition is a bad request, not ignored.
    let bad = ("if-none-match", "\"abc\"".to_string());
    assert_error(
        put_if(&s, A, "/cache/cc/k", bad, "third").await,
        400,
        "bad_request",
    )
    .await;
}

#[tokio::test]
async fn a_write_once_namespace_replaces_only_through_delete() {
    let s = server().await;
    assert_eq!(
        put(&s, A, "/cache/ac/ac/1234", "result").await.status(),
        201
    );
    assert_eq!(
        put(&s, A, "/cache/ac/ac/1234", "result").await.status(),
        200
    );
    // Nobody replaces it: not its owner, not an identity with `delete`.
    assert_error(
        put(&s, A, "/cache/ac/ac/1234", "other").await,
        403,
        "forbidden",
    )
    .await;
    let r = assert_error(
        put(&s, ADMIN, "/cache/ac/ac/1234", "other").await,
        403,
        "forbidden",
    )
    .await;
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("write-once"),
        "{r}"
    );
    assert_eq!(text(&s, "/cache/ac/ac/1234").await, "result");
    // DELETE then PUT.
    let r = s
        .http
        .delete(s.url("/cache/ac/ac/1234"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // (200: the refused puts above had stored the bytes already.)
    assert!(put(&s, B, "/cache/ac/ac/1234", "other")
        .await
        .status()
        .is_success());
    assert_eq!(text(&s, "/cache/ac/ac/1234").await, "other");
}

#[tokio::test]
async fn a_write_key_cannot_move_or_delete_another_identitys_reference() {
    let s = server().await;
    let blob = |who: &'static str, body: &'static str| {
        let s = &s;
        async move {
            let r = s
                .http
                .put(s.url("/v1/blobs/docs"))
                .bearer_auth(who)
                .body(body)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 201);
            let v: serde_json::Value = r.json().await.unwrap();
            v["digest"].as_str().unwrap().to_string()
        }
    };
    let set = |who: &'static str, digest: String| {
        let s = &s;
        async move {
            s.http
                .put(s.url("/v1/refs/docs/release"))
                .bearer_auth(who)
                .header("content-type", "application/json")
                .body(json!({ "digest": digest }).to_string())
                .send()
                .await
                .unwrap()
        }
    };
    let delete = |who: &'static str| {
        let s = &s;
        async move {
            s.http
                .delete(s.url("/v1/refs/docs/release"))
                .bearer_auth(who)
                .send()
                .await
                .unwrap()
        }
    };
    let (da, db) = (blob(A, "a's release").await, blob(B, "b's release").await);
    assert_eq!(set(A, da.clone()).await.status(), 201);
    assert_error(set(B, db.clone()).await, 403, "forbidden").await;
    assert_error(delete(B).await, 403, "forbidden").await;
    // Re-setting the digest it holds is harmless and allowed.
    assert_eq!(set(B, da.clone()).await.status(), 200);
    let r = s
        .http
        .get(s.url("/v1/refs/docs/release"))
        .bearer_auth(B)
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["digest"], da.as_str());
    // Its creator moves and deletes it; `delete` may do either.
    assert_eq!(set(A, db.clone()).await.status(), 200);
    assert_eq!(set(ADMIN, da.clone()).await.status(), 200);
    assert_error(delete(A).await, 403, "forbidden").await;
    assert_eq!(delete(ADMIN).await.status(), 204);
    assert_eq!(set(A, da).await.status(), 201);
    assert_eq!(delete(A).await.status(), 204);
}
