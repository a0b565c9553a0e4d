//! Pin tokens over HTTP (ADR-012 §2, ADR-018): renewal probes, refusals,
//! expiry, release, the cap; delete refusals while a token's pin is held;
//! the sweep report.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test]
async fn renewal_probe_answers_present_for_its_own_digest_only() {
    let s = start(Opts::default()).await;
    let (token, d) = s.put_ok("docs", &b"pinned"[..]).await;
    let (other_token, other) = s.put_ok("docs", vec![9u8; 4000]).await;
    let probe = |ns: &str, digest: &str, token: &str| json!({"namespace": ns, "digests": [digest], "token": token});
    // Its own digest, in its own namespace: renewed, present.
    assert_eq!(s.have_ok(probe("docs", &d, &token)).await, [true]);
    assert_eq!(s.have_ok(probe("docs", &other, &other_token)).await, [true]);
    // Another (present) digest: false, not an error.
    assert_eq!(s.have_ok(probe("docs", &other, &token)).await, [false]);
    // The same digest in another namespace.
    assert_eq!(s.have_ok(probe("elsewhere", &d, &token)).await, [false]);
    // Unknown tokens: never minted here, malformed, empty.
    for t in ["0123456789abcdef0123456789abcdef", "not a token", ""] {
        assert_eq!(s.have_ok(probe("docs", &d, t)).await, [false], "{t:?}");
    }
    // The plain probe still sees the entry.
    assert_eq!(
        s.have_ok(json!({"namespace": "docs", "digests": [d]}))
            .await,
        [true]
    );
    assert_eq!(s.ops.tokens().stats().renewed, 2);
    // A renewal probe carries exactly one digest.
    for digests in [json!([]), json!([d, d])] {
        let resp = s
            .have(json!({"namespace": "docs", "digests": digests, "token": token}))
            .await;
        assert_error(resp, 400, "bad_request").await;
    }
}

#[tokio::test]
async fn renewal_keeps_a_token_alive_and_idleness_ends_it() {
    let s = start(Opts {
        token_ttl: Duration::from_millis(1500),
        ..Default::default()
    })
    .await;
    let (token, d) = s.put_ok("docs", &b"renew me"[..]).await;
    let probe = json!({"namespace": "docs", "digests": [d], "token": token});
    // Renewed every 300 ms for 3 s: stays alive well past one TTL.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(s.have_ok(probe.clone()).await, [true]);
    }
    let key = store_types::Key::parse("docs", &d).unwrap();
    assert_eq!(s.store().pin_count(&key), 1);
    // Idle past the TTL: the token ends and its pin is dropped (by the
    // reaper, without any request).
    assert!(eventually(10, || async { s.store().pin_count(&key) == 0 }).await);
    assert_eq!(s.have_ok(probe).await, [false]);
    assert_eq!(s.ops.tokens().stats().expired, 1);
    // Unpinned: a direct delete now succeeds.
    assert_eq!(s.delete(&format!("/v1/blobs/docs/{d}")).await.status(), 204);
}

#[tokio::test]
async fn delete_is_refused_while_the_token_pin_is_held() {
    let s = start(Opts::default()).await;
    for (ns, body) in [("small", vec![1u8; 10]), ("big", vec![2u8; 5000])] {
        let (token, d) = s.put_ok(ns, body).await;
        let path = format!("/v1/blobs/{ns}/{d}");
        let v = assert_error(s.delete(&path).await, 409, "gc_refuse").await;
        assert_eq!(v["error"]["reason"], "pinned");
        assert!(v["error"]["message"].as_str().unwrap().contains("pinned"));
        // Still there.
        assert_eq!(s.get(&path).await.status(), 200);
        // Release the token: 204, and only once.
        let rel = s.delete(&format!("/v1/tokens/{token}")).await;
        assert_eq!(rel.status(), 204);
        let again = s.delete(&format!("/v1/tokens/{token}")).await;
        assert_error(again, 404, "missing").await;
        // Now deletable; then gone.
        assert_eq!(s.delete(&path).await.status(), 204);
        assert_error(s.delete(&path).await, 404, "missing").await;
        assert_error(s.get(&path).await, 404, "missing").await;
        // The released token no longer renews anything.
        assert_eq!(
            s.have_ok(json!({"namespace": ns, "digests": [d], "token": token}))
                .await,
            [false]
        );
    }
}

#[tokio::test]
async fn two_tokens_on_one_entry_each_hold_a_pin() {
    let s = start(Opts::default()).await;
    let (t1, d) = s.put_ok("docs", &b"twice"[..]).await;
    let (t2, d2) = s.put_ok("docs", &b"twice"[..]).await;
    assert_eq!(d, d2);
    let path = format!("/v1/blobs/docs/{d}");
    assert_eq!(s.delete(&format!("/v1/tokens/{t1}")).await.status(), 204);
    assert_error(s.delete(&path).await, 409, "gc_refuse").await;
    assert_eq!(s.delete(&format!("/v1/tokens/{t2}")).await.status(), 204);
    assert_eq!(s.delete(&path).await.status(), 204);
}

#[tokio::test]
async fn the_token_cap_evicts_the_oldest() {
    let s = start(Opts {
        max_tokens: 3,
        ..Default::default()
    })
    .await;
    let mut minted = Vec::new();
    for i in 0..5u8 {
        minted.push(s.put_ok("cap", vec![i; 8]).await);
    }
    assert_eq!(s.ops.tokens().len(), 3);
    assert_eq!(s.ops.tokens().stats().evicted, 2);
    for (i, (token, d)) in minted.iter().enumerate() {
        let alive = s
            .have_ok(json!({"namespace": "cap", "digests": [d], "token": token}))
            .await;
        assert_eq!(alive, [i >= 2], "token {i}");
    }
    // The evicted tokens' entries are unpinned.
    let (_, d0) = &minted[0];
    assert_eq!(s.delete(&format!("/v1/blobs/cap/{d0}")).await.status(), 204);
}

#[tokio::test]
async fn sweep_report_json() {
    let s = start(Opts {
        window: Duration::ZERO,
        unreferenced: vec!["tmp"],
        ..Default::default()
    })
    .await;
    let (token, d) = s.put_ok("tmp", vec![4u8; 3000]).await;
    let (_keep_token, kept) = s.put_ok("keep", &b"no source"[..]).await;
    let sweep = || async {
        let resp = s.http.post(s.url("/v1/sweep")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.json::<serde_json::Value>().await.unwrap()
    };
    let report_keys = set(&[
        "aborted",
        "total",
        "namespaces",
        "unswept_namespaces",
        "reaped_pins",
        "reaped_stages",
        "duration",
    ]);
    // Pinned by the token: protected, nothing staged.
    let r = sweep().await;
    assert_eq!(keys(&r), report_keys);
    assert_eq!(r["aborted"], serde_json::Value::Null);
    assert_eq!(r["total"]["scanned"], 1);
    assert_eq!(r["total"]["protected"]["pinned"], 1);
    assert_eq!(r["total"]["staged"], 0);
    assert_eq!(r["unswept_namespaces"], json!(["keep"]));
    assert_eq!(
        keys(&r["total"]),
        set(&[
            "scanned",
            "protected",
            "staged",
            "deleted",
            "rescued",
            "vanished",
            "bytes_freed"
        ])
    );
    // Released: staged by one sweep, deleted by the next (window 0).
    assert_eq!(s.delete(&format!("/v1/tokens/{token}")).await.status(), 204);
    let r = sweep().await;
    assert_eq!(r["total"]["staged"], 1);
    assert_eq!(r["namespaces"]["tmp"]["staged"], 1);
    assert_eq!(r["total"]["deleted"], 0);
    let r = sweep().await;
    assert_eq!(r["total"]["deleted"], 1);
    assert_eq!(r["total"]["bytes_freed"], 3000);
    assert_eq!(s.get(&format!("/v1/blobs/tmp/{d}")).await.status(), 404);
    // The namespace without a source is never swept.
    assert_eq!(s.get(&format!("/v1/blobs/keep/{kept}")).await.status(), 200);
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(metrics.lines().any(|l| l == "blobpool_sweeps_total 3"));
    assert!(metrics
        .lines()
        .any(|l| l == "blobpool_sweep_deleted_total 1"));
}

#[tokio::test]
async fn sweep_without_sources_reports_the_abort() {
    let s = start(Opts::default()).await;
    let resp = s.http.post(s.url("/v1/sweep")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let r: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(r["aborted"], "no_liveness_sources");
    assert_eq!(r["total"]["deleted"], 0);
}
