//! Every cache key overwrite and delete and every reference change is
//! audited with who, what and before → after (issue 39, ADR-052),
//! refused attempts included. One test per file: it installs the
//! process-wide subscriber.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use store_core::CacheBounds;

const A: &str = "bpk_audit_cache_a";
const B: &str = "bpk_audit_cache_b";
const ADMIN: &str = "bpk_audit_cache_admin";

fn b3(s: &str) -> String {
    blake3::hash(s.as_bytes()).to_hex().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_overwrites_deletes_and_ref_moves_are_audited() {
    let log = Captured::audit_log();
    let s = start_with_keys(
        vec![
            api_key("a", A, &["read", "write"]),
            api_key("b", B, &["read", "write"]),
            api_key("admin", ADMIN, &["read", "write", "delete"]),
        ],
        Opts {
            window: Duration::ZERO,
            cache: vec![(
                "cc",
                CacheBounds {
                    max_bytes: None,
                    max_age: None,
                },
            )],
            ..Default::default()
        },
    )
    .await;
    let send = |method: reqwest::Method, who: &'static str, path: &str, body: &'static str| {
        s.http
            .request(method, s.url(path))
            .bearer_auth(who)
            .body(body)
            .send()
    };
    use reqwest::Method;
    assert_eq!(
        send(Method::PUT, A, "/cache/cc/k", "one")
            .await
            .unwrap()
            .status(),
        201
    );
    assert_eq!(
        send(Method::PUT, A, "/cache/cc/k", "two")
            .await
            .unwrap()
            .status(),
        201
    );
    assert_eq!(
        send(Method::PUT, B, "/cache/cc/k", "bad")
            .await
            .unwrap()
            .status(),
        403
    );
    assert_eq!(
        send(Method::DELETE, ADMIN, "/cache/cc/k", "")
            .await
            .unwrap()
            .status(),
        204
    );
    // References: created, moved, refused, deleted.
    let blob = |body: &'static str| async move {
        let r = send(Method::PUT, A, "/v1/blobs/docs", body).await.unwrap();
        let v: serde_json::Value = r.json().await.unwrap();
        v["digest"].as_str().unwrap().to_string()
    };
    let (x, y) = (blob("x").await, blob("y").await);
    let set = |who: &'static str, d: &str| {
        s.http
            .put(s.url("/v1/refs/docs/r"))
            .bearer_auth(who)
            .header("content-type", "application/json")
            .body(json!({ "digest": d }).to_string())
            .send()
    };
    assert_eq!(set(A, &x).await.unwrap().status(), 201);
    assert_eq!(set(A, &y).await.unwrap().status(), 200);
    assert_eq!(set(B, &x).await.unwrap().status(), 403);
    assert_eq!(
        send(Method::DELETE, A, "/v1/refs/docs/r", "")
            .await
            .unwrap()
            .status(),
        204
    );

    let lines = log.audit_lines();
    let t = |i: &str, a: &str, tg: &str, o: String| (i.into(), a.into(), tg.into(), o);
    let expected = [
        t(
            "a",
            "cache_put",
            "cc/k",
            format!("ok: {} -> {}", b3("one"), b3("two")),
        ),
        t("b", "cache_put", "cc/k", "forbidden".into()),
        t(
            "admin",
            "cache_delete",
            "cc/k",
            format!("ok: {} -> none", b3("two")),
        ),
        t("a", "set_ref", "docs/r", format!("ok: none -> {x}")),
        t("a", "set_ref", "docs/r", format!("ok: {x} -> {y}")),
        t("b", "set_ref", "docs/r", "forbidden".into()),
        t("a", "delete_ref", "docs/r", format!("ok: {y} -> none")),
    ];
    for e in &expected {
        assert!(lines.contains(e), "missing {e:?} in {lines:?}");
    }
    // A new key is not audited (every build output would be).
    assert_eq!(
        lines.iter().filter(|l| l.1 == "cache_put").count(),
        2,
        "{lines:?}"
    );
}
