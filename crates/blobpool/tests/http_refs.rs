//! References over HTTP (ADR-024) on the sqlite + local server: set with a
//! token, compare-and-swap, listing, validation, and what GC does with
//! them — a referenced entry survives sweeps (even sweeps racing the set),
//! deleting the last reference makes it garbage after the window, and a
//! namespace that never used references is never swept.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

async fn set_ref(
    s: &Server,
    ns: &str,
    name: &str,
    body: serde_json::Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut b = s
        .http
        .put(s.url(&format!("/v1/refs/{ns}/{name}")))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.send().await.unwrap()
}

async fn sweep(s: &Server) -> serde_json::Value {
    let r = s
        .http
        .post(s.url("/v1/sweep"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

async fn exists(s: &Server, ns: &str, d: &str) -> bool {
    let r = s
        .http
        .head(s.url(&format!("/v1/blobs/{ns}/{d}")))
        .send()
        .await
        .unwrap();
    r.status() == 200
}

fn zero_window() -> Opts {
    Opts {
        window: Duration::ZERO,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_reference_set_with_the_put_token_protects_until_it_is_deleted() {
    let s = start(zero_window()).await;
    let (token, d) = s.put_ok("docs", "keep me").await;
    let r = set_ref(
        &s,
        "docs",
        "release/v1",
        json!({"digest": d, "token": token}),
        &[],
    )
    .await;
    assert_eq!(r.status(), 201);
    assert_eq!(r.headers()["etag"], format!("\"{d}\""));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["token_released"], true);
    assert_eq!(v["previous"], serde_json::Value::Null);
    assert!(s.ops.tokens().lookup(&token).is_none(), "token released");
    // An unreferenced neighbour in the same namespace is garbage now.
    let (t2, loose) = s.put_ok("docs", "loose").await;
    s.http
        .delete(s.url(&format!("/v1/tokens/{t2}")))
        .send()
        .await
        .unwrap();
    for _ in 0..2 {
        sweep(&s).await;
    }
    assert!(
        exists(&s, "docs", &d).await,
        "the referenced entry survives"
    );
    assert!(
        !exists(&s, "docs", &loose).await,
        "the unreferenced one went"
    );
    // Deleting the last reference makes the entry garbage after the window.
    let r = s
        .http
        .delete(s.url("/v1/refs/docs/release/v1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    for _ in 0..2 {
        sweep(&s).await;
    }
    assert!(!exists(&s, "docs", &d).await);
    // The namespace stays a refs namespace after its last reference.
    assert_eq!(
        s.store()
            .effective_gc_policy(&store_types::Namespace::new("docs").unwrap())
            .await
            .unwrap(),
        store_core::GcPolicy::Refs
    );
}

#[tokio::test]
async fn a_namespace_that_never_used_references_is_never_swept() {
    let s = start(zero_window()).await;
    let (t, d) = s.put_ok("legacy", "old data").await;
    s.http
        .delete(s.url(&format!("/v1/tokens/{t}")))
        .send()
        .await
        .unwrap();
    for _ in 0..2 {
        let report = sweep(&s).await;
        // No namespace has a policy: the sweep has no source at all.
        assert_eq!(report["aborted"], "no_liveness_sources", "{report}");
    }
    assert!(exists(&s, "legacy", &d).await);
    // Once another namespace uses references, sweeps run and skip it.
    let (t1, d1) = s.put_ok("docs", "referenced").await;
    set_ref(&s, "docs", "r", json!({"digest": d1, "token": t1}), &[]).await;
    for _ in 0..2 {
        let report = sweep(&s).await;
        let unswept = report["unswept_namespaces"].as_array().unwrap();
        assert!(unswept.iter().any(|n| n == "legacy"), "{report}");
    }
    assert!(exists(&s, "legacy", &d).await);
}

#[tokio::test]
async fn sweeps_racing_the_set_never_see_the_entry_unprotected() {
    let s = start(zero_window()).await;
    // Make "race" a refs namespace first, so sweeps collect there.
    let (t0, d0) = s.put_ok("race", "anchor").await;
    set_ref(
        &s,
        "race",
        "anchor",
        json!({"digest": d0, "token": t0}),
        &[],
    )
    .await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = {
        let (ops, stop) = (s.ops.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                ops.sweep().await.unwrap();
                n += 1;
            }
            n
        })
    };
    let mut kept = Vec::new();
    for i in 0..20 {
        let (token, d) = s.put_ok("race", format!("blob {i}")).await;
        let r = set_ref(
            &s,
            "race",
            &format!("items/{i}"),
            json!({"digest": d, "token": token}),
            &[],
        )
        .await;
        assert_eq!(r.status(), 201);
        kept.push(d);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sweeps = sweeper.await.unwrap();
    assert!(sweeps > 0);
    for _ in 0..2 {
        sweep(&s).await;
    }
    for d in &kept {
        assert!(exists(&s, "race", d).await, "{d} was swept");
    }
}

#[tokio::test]
async fn compare_and_swap_listing_and_validation() {
    let s = start(Opts::default()).await;
    let (_, a) = s.put_ok("cas", "a").await;
    let (_, b) = s.put_ok("cas", "b").await;
    let r = set_ref(
        &s,
        "cas",
        "head",
        json!({"digest": a}),
        &[("if-none-match", "*")],
    )
    .await;
    assert_eq!(r.status(), 201);
    // Create-only again: conflict, nothing changed.
    let r = set_ref(
        &s,
        "cas",
        "head",
        json!({"digest": b}),
        &[("if-none-match", "*")],
    )
    .await;
    let v = assert_error(r, 412, "ref_conflict").await;
    assert!(v["error"]["message"].as_str().unwrap().contains(&a), "{v}");
    // A stale If-Match: conflict.
    let stale = format!("\"{b}\"");
    let r = set_ref(
        &s,
        "cas",
        "head",
        json!({"digest": b}),
        &[("if-match", &stale)],
    )
    .await;
    assert_error(r, 412, "ref_conflict").await;
    // The right one: moved, previous reported.
    let cur = format!("\"{a}\"");
    let r = set_ref(
        &s,
        "cas",
        "head",
        json!({"digest": b}),
        &[("if-match", &cur)],
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["previous"], a);
    let got: serde_json::Value = s.get("/v1/refs/cas/head").await.json().await.unwrap();
    assert_eq!(got["digest"], b);
    // A conditional delete with a stale digest is refused.
    let r = s
        .http
        .delete(s.url("/v1/refs/cas/head"))
        .header("if-match", &cur)
        .send()
        .await
        .unwrap();
    assert_error(r, 412, "ref_conflict").await;
    // Listing: pages, prefix (with `_`, which is not a wildcard).
    for name in ["x/1", "x/2", "x/3", "x_1", "y/1"] {
        let r = set_ref(&s, "cas", name, json!({"digest": a}), &[]).await;
        assert_eq!(r.status(), 201, "{name}");
    }
    let page: serde_json::Value = s
        .get("/v1/refs/cas?prefix=x/&limit=2")
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = page["refs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["x/1", "x/2"]);
    assert_eq!(page["next"], "x/2");
    let page: serde_json::Value = s
        .get("/v1/refs/cas?prefix=x/&limit=2&after=x/2")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(page["refs"].as_array().unwrap().len(), 1);
    assert_eq!(page["next"], serde_json::Value::Null);
    let page: serde_json::Value = s.get("/v1/refs/cas?prefix=x_").await.json().await.unwrap();
    assert_eq!(page["refs"].as_array().unwrap().len(), 1);
    // Validation and missing entries.
    // (`..` segments in the URL itself are resolved by the client; an
    // encoded `/` is decoded by the server and then refused.)
    for bad in ["a%20b", "a//b", "a%2F..%2Fb", "%2Fabs"] {
        let r = set_ref(&s, "cas", bad, json!({"digest": a}), &[]).await;
        assert_error(r, 400, "key_invalid").await;
    }
    let r = set_ref(
        &s,
        "cas",
        "nothing",
        json!({"digest": digest_of(7, 7)}),
        &[],
    )
    .await;
    assert_error(r, 404, "missing").await;
    let r = s
        .http
        .put(s.url("/v1/refs/cas/plain"))
        .header("content-type", "text/plain")
        .body(json!({"digest": a}).to_string())
        .send()
        .await
        .unwrap();
    assert_error(r, 415, "unsupported_media_type").await;
    assert_error(s.get("/v1/refs/cas/none").await, 404, "missing").await;
}
