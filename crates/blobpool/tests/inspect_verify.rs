//! Introspection (`/v1/namespaces`, entries, `/v1/stats`, the inventory
//! gauges, `blobpool ls`/`du`) and verification (`/v1/verify`,
//! `Store::verify`, quarantine, `blobpool verify`) over sqlite + local.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use store_core::{QuarantineOutcome, VerifyOptions};
use store_types::{Digest, Key, Namespace, Tier};
use tokio::io::AsyncReadExt;

const BIN: &str = env!("CARGO_BIN_EXE_blobpool");

fn key(ns: &str, digest: &str) -> Key {
    Key::parse(ns, digest).unwrap()
}

async fn get_json(s: &Server, path: &str) -> serde_json::Value {
    let resp = s.get(path).await;
    assert_eq!(resp.status(), 200, "{path}");
    resp.json().await.unwrap()
}

#[tokio::test]
async fn listing_pages_through_both_tiers_and_stats_count_them() {
    let s = start(Opts::default()).await; // threshold 1024
    let mut a_kv = BTreeSet::new();
    let mut tokens = Vec::new();
    for i in 0..5 {
        let (t, d) = s.put_ok("alpha", bytes_of(100 + i, i)).await;
        tokens.push(t);
        a_kv.insert(d);
    }
    let mut a_large = BTreeSet::new();
    for i in 0..2 {
        let (t, d) = s.put_ok("alpha", bytes_of(5000 + i, 100 + i)).await;
        tokens.push(t);
        a_large.insert(d);
    }
    let (_, b) = s.put_ok("beta", bytes_of(10, 7)).await;

    let v = get_json(&s, "/v1/namespaces").await;
    assert_eq!(v, serde_json::json!({"namespaces": ["alpha", "beta"]}));

    // Pages of 2 over 7 entries: 4 pages, digest order, next null at the end.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/namespaces/alpha/entries?limit=2&after={a}"),
            None => "/v1/namespaces/alpha/entries?limit=2".to_string(),
        };
        let v = get_json(&s, &path).await;
        assert_eq!(keys(&v), set(&["entries", "next"]));
        pages += 1;
        for e in v["entries"].as_array().unwrap() {
            assert_eq!(keys(e), set(&["digest", "size", "tier", "created_at"]));
            let d = e["digest"].as_str().unwrap().to_string();
            let tier = e["tier"].as_str().unwrap();
            let size = e["size"].as_u64().unwrap();
            if a_kv.contains(&d) {
                assert_eq!(tier, "kv");
                assert!(size < 1024);
            } else {
                assert!(a_large.contains(&d), "{d}");
                assert_eq!(tier, "large");
                assert!(size >= 5000);
            }
            assert!(e["created_at"].as_i64().unwrap() > 1_600_000_000_000);
            seen.push(d);
        }
        match v["next"].as_str() {
            Some(n) => {
                assert_eq!(Some(n), seen.last().map(String::as_str));
                after = Some(n.to_string());
            }
            None => break,
        }
    }
    assert_eq!(pages, 4);
    let all: BTreeSet<String> = a_kv.union(&a_large).cloned().collect();
    assert_eq!(
        seen,
        all.iter().cloned().collect::<Vec<_>>(),
        "sorted, no dupes"
    );

    // An exact fit has no further page.
    let v = get_json(&s, "/v1/namespaces/alpha/entries?limit=7").await;
    assert_eq!(v["entries"].as_array().unwrap().len(), 7);
    assert!(v["next"].is_null());
    let v = get_json(&s, "/v1/namespaces/nothing/entries").await;
    assert_eq!(v, serde_json::json!({"entries": [], "next": null}));

    // Bad parameters.
    for (path, status, code) in [
        ("/v1/namespaces/alpha/entries?limit=0", 400, "bad_request"),
        (
            "/v1/namespaces/alpha/entries?limit=1001",
            400,
            "bad_request",
        ),
        ("/v1/namespaces/alpha/entries?limit=x", 400, "bad_request"),
        ("/v1/namespaces/alpha/entries?after=zz", 400, "key_invalid"),
        ("/v1/namespaces/alpha/entries?sort=size", 400, "bad_request"),
        ("/v1/namespaces/Alpha/entries", 400, "key_invalid"),
        ("/v1/stats?namespace=a/b", 400, "key_invalid"),
    ] {
        assert_error(s.get(path).await, status, code).await;
    }

    // Stats: per namespace and tier; every entry still pinned by its token.
    let kv_bytes: u64 = (0..5).map(|i| 100 + i).sum();
    let v = get_json(&s, "/v1/stats").await;
    assert_eq!(
        v["namespaces"],
        serde_json::json!([
            {"namespace": "alpha", "tier": "kv", "entries": 5, "bytes": kv_bytes, "pinned": 5, "staged": 0},
            {"namespace": "alpha", "tier": "large", "entries": 2, "bytes": 10001, "pinned": 2, "staged": 0},
            {"namespace": "beta", "tier": "kv", "entries": 1, "bytes": 10, "pinned": 1, "staged": 0},
        ])
    );
    assert_eq!(
        v["total"],
        serde_json::json!({"entries": 8, "bytes": kv_bytes + 10011, "pinned": 8, "staged": 0})
    );
    for t in &tokens[..3] {
        assert_eq!(s.delete(&format!("/v1/tokens/{t}")).await.status(), 204);
    }
    let v = get_json(&s, "/v1/stats?namespace=alpha").await;
    assert_eq!(v["total"]["pinned"], 4);
    assert_eq!(v["total"]["entries"], 7);
    assert_eq!(v["namespaces"].as_array().unwrap().len(), 2);

    // The library view agrees.
    let page = s
        .store()
        .list(&Namespace::new("beta").unwrap(), None, 10)
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 1);
    assert_eq!(page.entries[0].digest.to_hex(), b);
    assert_eq!(page.entries[0].tier, Tier::Kv);

    // Inventory gauges: the first scrape asks for a snapshot, a later one
    // shows it.
    let _ = s.get("/metrics").await.text().await.unwrap();
    let mut text = String::new();
    for _ in 0..250 {
        text = s.get("/metrics").await.text().await.unwrap();
        if text.contains("blobpool_stored_entries{namespace=\"alpha\",tier=\"kv\"} 5") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        text.contains("blobpool_stored_entries{namespace=\"alpha\",tier=\"kv\"} 5"),
        "{text}"
    );
    assert!(text.contains("blobpool_stored_bytes{namespace=\"alpha\",tier=\"large\"} 10001"));
    assert!(text.contains("blobpool_stored_entries{namespace=\"beta\",tier=\"kv\"} 1"));
    assert!(text.contains("# TYPE blobpool_inventory_age_seconds gauge"));
}

#[tokio::test]
async fn admin_routes_need_the_admin_scope() {
    use store_ops::auth::{hash_key, parse_key_hash, ApiKey, Auth, Grant};
    let key = |name: &str, secret: &str, scopes: &[&str]| ApiKey {
        name: name.into(),
        hash: parse_key_hash(&hash_key(secret)).unwrap(),
        grants: Grant::parse_all(scopes).unwrap(),
    };
    let http = store_http::HttpConfig {
        auth: Auth::new(
            vec![
                key("reader", "bpk_reader", &["read"]),
                key("admin", "bpk_admin", &["admin"]),
            ],
            vec![],
            vec![],
        )
        .unwrap(),
        ..Default::default()
    };
    let s = start(Opts {
        http,
        ..Default::default()
    })
    .await;
    for path in ["/v1/namespaces", "/v1/namespaces/a/entries", "/v1/stats"] {
        assert_error(s.get(path).await, 401, "unauthorized").await;
        let resp = s
            .http
            .get(s.url(path))
            .bearer_auth("bpk_reader")
            .send()
            .await
            .unwrap();
        assert_error(resp, 403, "forbidden").await;
        let resp = s
            .http
            .get(s.url(path))
            .bearer_auth("bpk_admin")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    let resp = s
        .http
        .post(s.url("/v1/verify"))
        .bearer_auth("bpk_reader")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_error(resp, 403, "forbidden").await;
}

/// Reads a quarantined file.
fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Positions where two equally long buffers differ.
fn diff_positions(a: &[u8], b: &[u8]) -> Vec<usize> {
    assert_eq!(a.len(), b.len());
    (0..a.len()).filter(|i| a[*i] != b[*i]).collect()
}

#[tokio::test]
async fn corrupt_entries_are_reported_quarantined_and_healed_by_a_reput() {
    let s = start(Opts::default()).await;
    let small = bytes_of(500, 1);
    let big = bytes_of(300_000, 2);
    let (small_token, ds) = s.put_ok("docs", small.clone()).await;
    let (_, dl) = s.put_ok("docs", big.clone()).await;
    let (_, fine) = s.put_ok("docs", bytes_of(600, 3)).await;
    let (_, other) = s.put_ok("other", bytes_of(4000, 4)).await;
    let (ks, kl) = (key("docs", &ds), key("docs", &dl));
    s.kv.corrupt_one_byte(&ks).await.unwrap();
    s.large.corrupt_one_byte(&kl).await.unwrap();

    // Over HTTP: reported, nothing removed; quarantine is refused.
    let resp = s.post_json("/v1/verify", "{}").await;
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        (
            &v["checked"],
            &v["ok"],
            &v["corrupt"],
            &v["missing"],
            &v["failed"]
        ),
        (
            &serde_json::json!(4),
            &serde_json::json!(2),
            &serde_json::json!(2),
            &serde_json::json!(0),
            &serde_json::json!(0)
        ),
        "{v}"
    );
    assert_eq!(v["quarantined"], 0);
    let corrupt: BTreeSet<(String, String)> = v["corrupt_entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["digest"].as_str().unwrap().to_string(),
                c["tier"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        corrupt,
        [
            (ds.clone(), "kv".to_string()),
            (dl.clone(), "large".to_string())
        ]
        .into_iter()
        .collect()
    );
    let v: serde_json::Value = s
        .post_json("/v1/verify", r#"{"namespace":"other"}"#)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (v["checked"].as_u64(), v["ok"].as_u64()),
        (Some(1), Some(1))
    );
    assert_error(
        s.post_json("/v1/verify", r#"{"quarantine":true}"#).await,
        400,
        "bad_request",
    )
    .await;
    assert_error(
        s.post_json("/v1/verify", r#"{"bogus":1}"#).await,
        400,
        "bad_request",
    )
    .await;
    assert_error(
        s.post_json("/v1/verify", r#"{"concurrency":99}"#).await,
        400,
        "bad_request",
    )
    .await;
    // A rate below 1 MiB/s would keep the request open past any client's
    // timeout (Schemathesis: `max_rate: 1` hung for 10 s): refused.
    for slow in [0, 1, store_ops::MIN_VERIFY_RATE - 1] {
        assert_error(
            s.post_json("/v1/verify", format!(r#"{{"max_rate":{slow}}}"#))
                .await,
            400,
            "bad_request",
        )
        .await;
    }
    let v: serde_json::Value = s
        .post_json(
            "/v1/verify",
            format!(
                r#"{{"namespace":"other","max_rate":{}}}"#,
                store_ops::MIN_VERIFY_RATE
            ),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["ok"].as_u64(), Some(1), "{v}");

    // A sound entry is never removed by quarantine.
    let sound = key("docs", &fine);
    let out = s
        .store()
        .quarantine(&sound, |mut blob| async move {
            let mut sink = Vec::new();
            blob.read_to_end(&mut sink).await?;
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(
        out,
        QuarantineOutcome::Sound {
            tier: Tier::Kv,
            size: 600
        }
    );
    assert!(s.store().has(&sound).await.unwrap());
    // A save step that does not take every byte removes nothing.
    let r = s.store().quarantine(&kl, |_blob| async { Ok(()) }).await;
    assert!(r.is_err(), "{r:?}");
    assert!(s.store().has(&kl).await.unwrap());

    // The library with a quarantine directory: raw bytes land in DIR, the
    // entries leave the served set (the kv one although its put token
    // still pins it).
    assert_eq!(s.store().gc().pin_count(&ks), 1);
    let qdir = s.dir.path().join("quarantine");
    let opts = VerifyOptions {
        quarantine_dir: Some(qdir.clone()),
        ..VerifyOptions::new()
    };
    let sum = s.store().verify(&opts).await.unwrap();
    assert_eq!(
        (sum.checked, sum.ok, sum.corrupt, sum.quarantined),
        (4, 2, 2, 2),
        "{sum:?}"
    );
    for c in &sum.corrupt_entries {
        let want = qdir.join("docs").join(format!("{}.corrupt", c.digest));
        assert_eq!(c.quarantined.as_deref(), Some(want.as_path()));
        assert!(c.quarantine_error.is_none());
    }
    let raw_small = read(&qdir.join(format!("docs/{ds}.corrupt")));
    assert_eq!(diff_positions(&raw_small, &small).len(), 1);
    let raw_big = read(&qdir.join(format!("docs/{dl}.corrupt")));
    assert_eq!(diff_positions(&raw_big, &big).len(), 1);
    assert_eq!(
        Digest::of(&raw_big),
        sum.corrupt_entries
            .iter()
            .find(|c| c.digest.to_hex() == dl)
            .unwrap()
            .actual
            .unwrap()
    );
    assert_eq!(s.get(&format!("/v1/blobs/docs/{ds}")).await.status(), 404);
    assert_eq!(s.get(&format!("/v1/blobs/docs/{dl}")).await.status(), 404);
    assert_eq!(s.store().gc().pin_count(&ks), 1, "pins stay");
    let again = s.store().verify(&opts).await.unwrap();
    assert_eq!((again.checked, again.ok, again.corrupt), (2, 2, 0));

    // A re-put of the right content heals: a new entry, verified on read.
    for (ns_digest, body) in [(&ds, small.clone()), (&dl, big.clone())] {
        let resp = s.put("docs", body).await;
        assert_eq!(resp.status(), 201, "a fresh entry, not a dedup hit");
        let (d, n) = hash_body(s.get(&format!("/v1/blobs/docs/{ns_digest}")).await)
            .await
            .unwrap();
        assert_eq!(&d, ns_digest);
        assert!(n > 0);
    }
    let v: serde_json::Value = s.post_json("/v1/verify", "{}").await.json().await.unwrap();
    assert_eq!(
        (v["ok"].as_u64(), v["corrupt"].as_u64()),
        (Some(4), Some(0))
    );
    assert_eq!(
        s.delete(&format!("/v1/tokens/{small_token}"))
            .await
            .status(),
        204
    );
    let _ = other;
}

#[tokio::test]
async fn verify_is_paced_by_max_rate() {
    let s = start(Opts::default()).await;
    for i in 0..3 {
        s.put_ok("rate", bytes_of(200_000, i)).await;
    }
    let started = Instant::now();
    let ticks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let t = Arc::clone(&ticks);
    let sum = s
        .store()
        .verify(&VerifyOptions {
            max_rate: Some(1_000_000),
            progress: Some(Arc::new(move |e| {
                if let store_core::VerifyEvent::Bytes(n) = e {
                    t.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                }
            })),
            ..VerifyOptions::new()
        })
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!((sum.checked, sum.ok, sum.bytes), (3, 3, 600_000));
    assert_eq!(ticks.load(std::sync::atomic::Ordering::Relaxed), 600_000);
    // 600 kB at 1 MB/s, with at most a 100 ms burst of credit.
    assert!(took >= Duration::from_millis(450), "{took:?}");
}

fn cmd(dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("BLOBPOOL_") {
            c.env_remove(k);
        }
    }
    c.stdin(Stdio::null());
    c
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    out(&o)
}

#[test]
fn cli_ls_du_and_verify_in_direct_mode_quarantine_a_flipped_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let put = |name: &str, body: &[u8], ns: &str| {
        std::fs::write(d.join(name), body).unwrap();
        ok(cmd(d).args(["put", "-n", ns, name]).output().unwrap())
    };
    let big = bytes_of(100_000, 9);
    let dbig = put("big", &big, "imgs");
    let d1 = put("a", b"one", "docs");
    let d2 = put("b", b"two", "docs");

    assert_eq!(ok(cmd(d).arg("ls").output().unwrap()), "docs\nimgs");
    let listing = ok(cmd(d).args(["ls", "docs"]).output().unwrap());
    let mut want = vec![d1.clone(), d2.clone()];
    want.sort();
    let got: Vec<&str> = listing
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(got, want);
    assert!(
        listing.lines().all(|l| l.split('\t').nth(2) == Some("kv")),
        "{listing}"
    );
    let o = cmd(d)
        .args(["ls", "docs", "--limit", "1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains(&format!("--after {}", want[0])));
    assert_eq!(ok(o), listing.lines().next().unwrap());
    let rest = ok(cmd(d)
        .args(["ls", "docs", "--after", &want[0]])
        .output()
        .unwrap());
    assert_eq!(rest, listing.lines().nth(1).unwrap());

    let du: serde_json::Value =
        serde_json::from_str(&ok(cmd(d).args(["du", "--json"]).output().unwrap())).unwrap();
    assert_eq!(du["total"]["entries"], 3);
    assert_eq!(du["total"]["bytes"], 100_006);
    let text = ok(cmd(d).args(["du", "imgs"]).output().unwrap());
    assert!(text.starts_with("NAMESPACE"), "{text}");
    assert!(text.contains("imgs       large"), "{text}");

    // Flip a byte of the large file on disk.
    let path = d
        .join("blobpool-data/large/imgs")
        .join(&dbig[..2])
        .join(&dbig);
    let mut raw = std::fs::read(&path).unwrap();
    raw[1234] ^= 0x55;
    std::fs::write(&path, &raw).unwrap();

    let o = cmd(d).args(["verify", "--json", "-q"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(
        (v["checked"].as_u64(), v["corrupt"].as_u64()),
        (Some(3), Some(1))
    );
    assert!(v["entries_per_sec"].as_f64().unwrap() > 0.0);
    assert!(String::from_utf8_lossy(&o.stderr).starts_with("blobpool: corrupt: "));

    let o = cmd(d)
        .args([
            "verify",
            "imgs",
            "--quarantine",
            "q",
            "--max-rate",
            "10M",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(v["quarantined"], 1, "{v}");
    assert_eq!(
        std::fs::read(d.join(format!("q/imgs/{dbig}.corrupt"))).unwrap(),
        raw
    );
    assert_eq!(ok(cmd(d).args(["ls", "imgs"]).output().unwrap()), "");
    // Healed by a re-put; verify is clean again.
    assert_eq!(put("big2", &big, "imgs"), dbig);
    let text = ok(cmd(d).arg("verify").output().unwrap());
    assert!(
        text.starts_with("checked 3: ok 3, corrupt 0, missing 0, failed 0"),
        "{text}"
    );
}

#[tokio::test]
async fn cli_ls_du_and_verify_through_a_server() {
    let s = start(Opts::default()).await;
    let (_, d1) = s.put_ok("docs", b"hello".to_vec()).await;
    let (_, dl) = s.put_ok("docs", bytes_of(20_000, 5)).await;
    s.large.corrupt_one_byte(&key("docs", &dl)).await.unwrap();
    let base = s.base.clone();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let run = move |args: Vec<String>| {
        let d = d.clone();
        let base = base.clone();
        tokio::task::spawn_blocking(move || {
            cmd(&d)
                .arg("--server")
                .arg(&base)
                .args(&args)
                .output()
                .unwrap()
        })
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(ok(run(args(&["ls"])).await.unwrap()), "docs");
    let l = ok(run(args(&["ls", "docs", "--json"])).await.unwrap());
    let v: serde_json::Value = serde_json::from_str(&l).unwrap();
    let listed: BTreeSet<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["digest"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [d1.as_str(), dl.as_str()].into_iter().collect());
    let du: serde_json::Value =
        serde_json::from_str(&ok(run(args(&["du", "docs", "--json"])).await.unwrap())).unwrap();
    assert_eq!(du["total"]["entries"], 2);
    assert_eq!(du["total"]["pinned"], 2);
    let o = run(args(&["verify", "--json"])).await.unwrap();
    assert_eq!(o.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_str(&out(&o)).unwrap();
    assert_eq!(
        (v["ok"].as_u64(), v["corrupt"].as_u64()),
        (Some(1), Some(1))
    );
    let o = run(args(&["verify", "--quarantine", "q"])).await.unwrap();
    assert_eq!(o.status.code(), Some(2), "a usage error over --server");
}

/// Issue 30 item 7 (ADR-046): a quarantine removes only the copy it
/// hashed. Q2 hashes a pinned, corrupt entry and waits in its save step;
/// Q1 runs on the same key meanwhile; then a put of the right content. On
/// the old code Q1 removed the corrupt copy, the put wrote a fresh one
/// (`deduplicated: false`), and Q2 — deciding on the corrupt copy's hash —
/// removed the fresh one: an acknowledged put lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_never_removes_a_copy_it_did_not_hash() {
    let s = start(Opts::default()).await;
    let data = bytes_of(500, 9);
    let (_token, d) = s.put_ok("docs", data.clone()).await; // the token pins it
    let k = key("docs", &d);
    s.kv.corrupt_one_byte(&k).await.unwrap();
    let store = s.store().clone();
    let read_all = |mut blob: store_core::Blob| async move {
        let mut sink = Vec::new();
        blob.read_to_end(&mut sink).await?;
        Ok(())
    };
    let (hashed_tx, hashed_rx) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let q2 = tokio::spawn({
        let (store, k) = (store.clone(), k.clone());
        async move {
            store
                .quarantine(&k, |blob| async move {
                    read_all(blob).await?;
                    hashed_tx.send(()).ok();
                    go_rx.await.ok();
                    Ok(())
                })
                .await
        }
    });
    hashed_rx.await.unwrap();
    let q1 = tokio::spawn({
        let (store, k) = (store.clone(), k.clone());
        async move { store.quarantine(&k, read_all).await }
    });
    // Room for Q1 to finish, if it can before Q2.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A put finding the corrupt copy waits for the quarantines (ADR-053),
    // so it runs beside Q2's save step rather than before it ends.
    let put = tokio::spawn({
        let (store, k, data) = (store.clone(), k.clone(), data.clone());
        async move { store.put(&k.namespace, &data[..]).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    go_tx.send(()).unwrap();
    let (r2, r1) = (q2.await.unwrap().unwrap(), q1.await.unwrap().unwrap());
    let put = put.await.unwrap().unwrap();
    assert!(matches!(r2, QuarantineOutcome::Removed { .. }), "{r2:?}");
    if !put.deduplicated {
        // The put wrote a fresh copy after Q2 hashed the corrupt one.
        assert!(
            store.has(&k).await.unwrap(),
            "a fresh copy was removed on the corrupt copy's hash (Q1: {r1:?})"
        );
    } else {
        // Q1 waited for Q2 and found the key gone.
        assert_eq!(r1, QuarantineOutcome::Absent);
    }
    // A put now heals the key.
    store.put(&k.namespace, &data[..]).await.unwrap();
    let got = store.get(&k).await.unwrap().unwrap().bytes().await.unwrap();
    assert_eq!(&got[..], &data[..]);
}
