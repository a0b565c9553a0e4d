//! Setting a reference over HTTP never lets a `write`-only caller cause
//! deletions (issue 30 item 4, ADR-045): a namespace's switch from the
//! implicit `keep` to `refs` — which makes every unreferenced entry there
//! garbage — happens only after the reference committed, never for a
//! failed (412) or refused set, and only for a caller who may delete in the
//! namespace.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

const WRITER: &str = "bpk_policy_writer";
const OWNER: &str = "bpk_policy_owner";

async fn server() -> Server {
    start_with_keys(
        vec![
            api_key("writer", WRITER, &["read", "write"]),
            api_key("owner", OWNER, &["read", "write", "delete"]),
        ],
        Opts {
            window: Duration::ZERO,
            ..Default::default()
        },
    )
    .await
}

/// Puts `body` as `key`, releases its token (so nothing pins it), returns
/// the digest.
async fn put_unpinned(s: &Server, secret: &str, ns: &str, body: &str) -> String {
    let v: serde_json::Value = s
        .http
        .put(s.url(&format!("/v1/blobs/{ns}")))
        .bearer_auth(secret)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = v["token"].as_str().unwrap();
    let r = s
        .http
        .delete(s.url(&format!("/v1/tokens/{token}")))
        .bearer_auth(secret)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    v["digest"].as_str().unwrap().to_string()
}

async fn set_ref(
    s: &Server,
    secret: &str,
    ns: &str,
    name: &str,
    digest: &str,
    if_match: Option<&str>,
) -> reqwest::Response {
    let mut b = s
        .http
        .put(s.url(&format!("/v1/refs/{ns}/{name}")))
        .bearer_auth(secret)
        .header("content-type", "application/json")
        .body(json!({ "digest": digest }).to_string());
    if let Some(m) = if_match {
        b = b.header("if-match", format!("\"{m}\""));
    }
    b.send().await.unwrap()
}

/// Two sweeps through the store (window zero: stage, then delete).
async fn sweep_twice(s: &Server) {
    for _ in 0..2 {
        s.store()
            .gc()
            .sweep(store_core::SweepOptions::default())
            .await
            .unwrap();
    }
}

async fn exists(s: &Server, ns: &str, d: &str) -> bool {
    s.http
        .head(s.url(&format!("/v1/blobs/{ns}/{d}")))
        .bearer_auth(OWNER)
        .send()
        .await
        .unwrap()
        .status()
        == 200
}

async fn policy(s: &Server, ns: &str) -> store_core::GcPolicy {
    s.store()
        .effective_gc_policy(&store_types::Namespace::new(ns).unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_conditional_set_switches_nothing() {
    let s = server().await;
    let mine = put_unpinned(&s, WRITER, "shared", "the writer's blob").await;
    let theirs = put_unpinned(&s, OWNER, "shared", "someone else's blob").await;
    // A conditional set that fails (the reference does not hold `theirs`)
    // — by a caller who could switch the policy, even.
    for secret in [WRITER, OWNER] {
        let r = set_ref(&s, secret, "shared", "x", &mine, Some(&theirs)).await;
        assert_eq!(r.status(), 412);
    }
    assert_eq!(policy(&s, "shared").await, store_core::GcPolicy::Keep);
    sweep_twice(&s).await;
    assert!(exists(&s, "shared", &mine).await && exists(&s, "shared", &theirs).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_only_caller_cannot_make_others_entries_garbage() {
    let s = server().await;
    let mine = put_unpinned(&s, WRITER, "shared", "the writer's blob").await;
    let theirs = put_unpinned(&s, OWNER, "shared", "someone else's blob").await;
    let r = set_ref(&s, WRITER, "shared", "mine", &mine, None).await;
    assert_eq!(r.status(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v.get("policy_adopted"), None, "{v}");
    // The reference is committed and protects; the namespace stays keep.
    assert_eq!(policy(&s, "shared").await, store_core::GcPolicy::Keep);
    sweep_twice(&s).await;
    assert!(exists(&s, "shared", &theirs).await, "others' entry deleted");
    assert!(exists(&s, "shared", &mine).await);

    // A caller who may delete there switches it, after the commit, and the
    // answer says so.
    let r = set_ref(&s, OWNER, "shared", "theirs", &theirs, None).await;
    assert_eq!(r.status(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["policy_adopted"], true, "{v}");
    assert_eq!(policy(&s, "shared").await, store_core::GcPolicy::Refs);
    let loose = put_unpinned(&s, OWNER, "shared", "unreferenced").await;
    sweep_twice(&s).await;
    assert!(!exists(&s, "shared", &loose).await, "garbage kept");
    assert!(exists(&s, "shared", &mine).await && exists(&s, "shared", &theirs).await);
}
