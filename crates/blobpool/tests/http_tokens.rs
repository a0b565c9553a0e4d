//! Pin tokens over HTTP (ADR-012 §2, ADR-018): renewal probes, refusals,
//! expiry, release, the cap (puts refused, never a token evicted); delete
//! refusals while a token's pin is held; the sweep report.

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
    assert_eq!(s.store().gc().pin_count(&key), 1);
    // Idle past the TTL: the token ends and its pin is dropped (by the
    // reaper, without any request).
    assert!(eventually(10, || async { s.store().gc().pin_count(&key) == 0 }).await);
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

async fn head_status(s: &Server, path: &str) -> u16 {
    s.http
        .head(s.url(path))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Issue 11 item 6: a flood of anonymous puts used to evict the oldest
/// tokens at the cap, unpinning a victim's entry for the next sweep. Now
/// the flood is refused before anything is stored, and the victim's pin
/// holds.
#[tokio::test]
async fn a_token_flood_is_refused_and_never_unpins_a_victim() {
    const CAP: usize = 8;
    let s = start(Opts {
        max_tokens: CAP,
        window: Duration::ZERO,
        unreferenced: vec!["tmp"],
        ..Default::default()
    })
    .await;
    // The victim: a large blob in a swept namespace, token kept.
    let victim_len = 2 << 20;
    let resp = s
        .http
        .put(s.url("/v1/blobs/tmp"))
        .body(stream_body(victim_len, 42))
        .header("content-length", victim_len)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let v: serde_json::Value = resp.json().await.unwrap();
    let victim_token = v["token"].as_str().unwrap().to_string();
    let victim = v["digest"].as_str().unwrap().to_string();
    assert_eq!(victim, digest_of(victim_len, 42));

    // The flood: 40 concurrent one-byte puts. Exactly the free slots are
    // granted; every other put is refused with 503, Retry-After and the
    // stable code, and what it carried is not stored.
    let s = &s;
    let flood = (0..40u8).map(|i| async move { (i, s.put("tmp", vec![i]).await) });
    let mut granted = Vec::new();
    let mut refused = Vec::new();
    for (i, resp) in futures::future::join_all(flood).await {
        match resp.status().as_u16() {
            201 => {
                let v: serde_json::Value = resp.json().await.unwrap();
                granted.push((v["token"].as_str().unwrap().to_string(), i));
            }
            503 => {
                let retry = resp.headers().get("retry-after").cloned();
                assert_eq!(retry.as_ref().map(|v| v.to_str().unwrap()), Some("1"));
                let v = assert_error(resp, 503, "too_many_tokens").await;
                let msg = v["error"]["message"].as_str().unwrap();
                assert!(msg.contains("nothing was stored"), "{msg}");
                refused.push(i);
            }
            other => panic!("flood put {i}: unexpected status {other}"),
        }
    }
    assert_eq!(granted.len(), CAP - 1);
    assert_eq!(refused.len(), 40 - (CAP - 1));
    let digest = |i: u8| blake3::hash(&[i]).to_hex().to_string();
    for &i in &refused {
        let d = digest(i);
        assert_eq!(head_status(s, &format!("/v1/blobs/tmp/{d}")).await, 404);
        assert_eq!(
            s.have_ok(json!({"namespace": "tmp", "digests": [d]})).await,
            [false],
            "refused put {i} must not be stored"
        );
    }
    let st = s.ops.tokens().stats();
    assert_eq!((st.live, st.reserved), (CAP as u64, 0));
    assert_eq!((st.expired, st.released), (0, 0));
    assert_eq!(st.refused, refused.len() as u64);

    // The victim's token still renews; a sweep (twice: stage, then delete
    // with window 0) leaves its blob present and readable.
    let probe = json!({"namespace": "tmp", "digests": [victim], "token": victim_token});
    assert_eq!(s.have_ok(probe.clone()).await, [true]);
    for _ in 0..2 {
        let resp = s
            .http
            .post(s.url("/v1/sweep"))
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let r: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(r["aborted"], serde_json::Value::Null);
        assert_eq!(r["total"]["protected"]["pinned"], CAP as u64, "{r}");
        assert_eq!(r["total"]["deleted"], 0, "{r}");
    }
    let resp = s.get(&format!("/v1/blobs/tmp/{victim}")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(hash_body(resp).await.unwrap(), (victim.clone(), victim_len));
    assert_eq!(s.have_ok(probe).await, [true]);

    // Releasing one flood token lets exactly one put through again.
    let (flood_token, _) = &granted[0];
    assert_eq!(
        s.delete(&format!("/v1/tokens/{flood_token}"))
            .await
            .status(),
        204
    );
    let retried = refused[0];
    let resp = s.put("tmp", vec![retried]).await;
    assert_eq!(resp.status(), 201);
    assert_eq!(
        head_status(s, &format!("/v1/blobs/tmp/{}", digest(retried))).await,
        200
    );
    assert_error(s.put("tmp", vec![refused[1]]).await, 503, "too_many_tokens").await;
    let metrics = s.get("/metrics").await.text().await.unwrap();
    let want = format!("blobpool_tokens_refused_total {}", refused.len() + 1);
    assert!(metrics.lines().any(|l| l == want), "{want}");
    assert!(metrics.lines().any(|l| l == "blobpool_tokens 8"));
    assert!(metrics
        .lines()
        .any(|l| l == "blobpool_errors_total{code=\"too_many_tokens\"} 34"));
}

/// A put holds its token slot while it runs; a put that fails or is
/// cancelled gives it back (the slot is a drop guard).
#[tokio::test]
async fn failed_and_cancelled_puts_free_their_token_slot() {
    let s = start(Opts {
        max_tokens: 2,
        ..Default::default()
    })
    .await;
    // A failed put (wrong expected digest) leaks no slot.
    for _ in 0..3 {
        let resp = s
            .http
            .put(s.url("/v1/blobs/docs"))
            .header("x-blobpool-expect-digest", "0".repeat(64))
            .body(&b"not that"[..])
            .send()
            .await
            .unwrap();
        assert_error(resp, 422, "verification").await;
    }
    assert_eq!((s.ops.tokens().len(), s.ops.tokens().reserved()), (0, 0));
    // A put in flight (its body never ends) holds one slot...
    let (mut writer, reader) = tokio::io::duplex(64);
    tokio::io::AsyncWriteExt::write_all(&mut writer, b"partial")
        .await
        .unwrap();
    let ops = s.ops.clone();
    let open = store_ops::auth::Identity::open();
    let slow = tokio::spawn(async move { ops.put(&open, "slow", reader, None, None).await });
    assert!(eventually(10, || async { s.ops.tokens().reserved() == 1 }).await);
    // ...so one more put fills the cap of 2, and the next is refused.
    let (_held, _) = s.put_ok("docs", &b"one"[..]).await;
    assert_error(s.put("docs", &b"two"[..]).await, 503, "too_many_tokens").await;
    // Cancelling the slow put frees its slot; nothing of it was stored.
    slow.abort();
    assert!(slow.await.unwrap_err().is_cancelled());
    assert_eq!(s.ops.tokens().reserved(), 0);
    assert!(s.ns_is_empty("slow").await);
    drop(writer);
    assert_eq!(s.put("docs", &b"two"[..]).await.status(), 201);
    assert_eq!(s.ops.tokens().len(), 2);
}

/// ADR-012 §2: a non-fleet token's pin does not expire. With the default
/// configuration tokens have no idle lifetime at all.
#[tokio::test]
async fn non_fleet_tokens_have_no_idle_lifetime_by_default() {
    let store = || async {
        store_core::Store::builder()
            .kv(store_mem::MemEngine::new())
            .mode(store_core::Mode::MemOnly)
            .build()
            .await
            .unwrap()
    };
    let ops = store_ops::Ops::new(store().await, store_ops::OpsConfig::default()).unwrap();
    assert_eq!(ops.tokens().ttl(), None);
    assert_eq!(ops.config().token_ttl, None);
    let open = store_ops::auth::Identity::open();
    let out = ops
        .put(&open, "docs", &b"kept"[..], None, None)
        .await
        .unwrap();
    // Nothing ever reaps it.
    assert_eq!(ops.tokens().reap(), 0);
    let key = store_types::Key::parse("docs", &out.response.digest).unwrap();
    assert_eq!(ops.store().gc().pin_count(&key), 1);
    assert!(ops
        .tokens()
        .lookup(out.response.token.as_deref().unwrap())
        .is_some());
    // A zero TTL is refused by Ops::new itself.
    let zero = store_ops::OpsConfig {
        token_ttl: Some(Duration::ZERO),
        ..Default::default()
    };
    match store_ops::Ops::new(store().await, zero) {
        Err(store_types::Error::Config(m)) => assert!(m.contains("token_ttl"), "{m}"),
        other => panic!("expected a config error, got {other:?}"),
    }
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
        let resp = s
            .http
            .post(s.url("/v1/sweep"))
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
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
        "resumed_deletes",
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
    let resp = s
        .http
        .post(s.url("/v1/sweep"))
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let r: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(r["aborted"], "no_liveness_sources");
    assert_eq!(r["total"]["deleted"], 0);
}
