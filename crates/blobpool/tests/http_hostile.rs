//! Hostile and broken input over HTTP: malformed payloads, oversized
//! probes, bad keys, path traversal, clients that disconnect mid-upload,
//! bodies that disagree with their `Content-Length`, corrupted content.

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn malformed_have_payloads_are_bad_requests() {
    let s = start(Opts::default()).await;
    let d = blake3::hash(b"x").to_hex().to_string();
    let bodies = [
        "".to_string(),
        "{".to_string(),
        "not json".to_string(),
        "[]".to_string(),
        "null".to_string(),
        json!({"digests": [d]}).to_string(),
        json!({"namespace": "a"}).to_string(),
        json!({"namespace": 5, "digests": [d]}).to_string(),
        json!({"namespace": "a", "digests": d}).to_string(),
        json!({"namespace": "a", "digests": [1, 2]}).to_string(),
        json!({"namespace": "a", "digests": [d], "token": 7}).to_string(),
        json!({"namespace": "a", "digests": [d], "extra": true}).to_string(),
        format!("{{\"namespace\":\"a\",\"digests\":[\"{d}\"]}} trailing"),
    ];
    for body in bodies {
        let resp = s.post_json("/v1/have", body.clone()).await;
        assert_error(resp, 400, "bad_request").await;
    }
    assert_eq!(s.get("/health").await.status(), 200);
}

#[tokio::test]
async fn malformed_keys_are_key_invalid() {
    let s = start(Opts::default()).await;
    let good = blake3::hash(b"x").to_hex().to_string();
    let bad_digests = [
        "abc".to_string(),
        good.to_uppercase(),
        format!("{}g", &good[..63]),
        format!("{good}0"),
        format!("0x{}", &good[2..]),
    ];
    for bad in &bad_digests {
        let v = assert_error(
            s.have(json!({"namespace": "a", "digests": [good, bad]}))
                .await,
            400,
            "key_invalid",
        )
        .await;
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("digests[1]"));
        for path in [format!("/v1/blobs/a/{bad}")] {
            assert_error(s.get(&path).await, 400, "key_invalid").await;
            assert_error(s.delete(&path).await, 400, "key_invalid").await;
            let head = s.http.head(s.url(&path)).send().await.unwrap();
            assert_eq!(head.status(), 400);
        }
    }
    for ns in ["UPPER", "-dash", "a%20b", "%C3%A9", &"x".repeat(65)] {
        let resp = s.put(ns, &b"data"[..]).await;
        assert_error(resp, 400, "key_invalid").await;
        assert_error(
            s.get(&format!("/v1/blobs/{ns}/{good}")).await,
            400,
            "key_invalid",
        )
        .await;
    }
    assert_error(
        s.have(json!({"namespace": "../etc", "digests": []})).await,
        400,
        "key_invalid",
    )
    .await;
    assert!(s.store_is_empty().await);
}

/// Sends raw bytes on a fresh connection and returns everything the server
/// answers until it closes (or `secs` pass).
async fn raw(s: &Server, request: &[u8], secs: u64) -> String {
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(secs), c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn path_traversal_in_namespaces_is_refused() {
    let s = start(Opts::default()).await;
    let d = blake3::hash(b"evil").to_hex().to_string();
    // Percent-encoded separators and dots reach the handler as one segment
    // and fail validation. Sent raw: URL libraries normalize `%2E%2E`.
    for ns in [
        "..%2F..%2Fetc",
        "..%2f",
        "%2E%2E",
        "a%2Fb",
        "..%2F",
        ".hidden",
        "%2e%2e%2f",
    ] {
        for (method, target) in [
            ("PUT", format!("/v1/blobs/{ns}")),
            ("GET", format!("/v1/blobs/{ns}/{d}")),
            ("DELETE", format!("/v1/blobs/{ns}/{d}")),
        ] {
            let req = format!(
                "{method} {target} HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nconnection: close\r\n\r\nevil"
            );
            let answer = raw(&s, req.as_bytes(), 5).await;
            assert!(answer.starts_with("HTTP/1.1 400"), "{target}: {answer}");
            assert!(answer.contains("\"key_invalid\""), "{target}: {answer}");
        }
    }
    // Literal `../` segments, sent raw so no client normalizes them: no
    // route matches.
    for target in [
        "/v1/blobs/../../etc",
        "/v1/blobs/../x",
        "/v1/blobs/a/../../b",
        "/v1/blobs/./x/..",
    ] {
        let req = format!(
            "PUT {target} HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\nconnection: close\r\n\r\nevil"
        );
        let answer = raw(&s, req.as_bytes(), 5).await;
        let status = answer.split_whitespace().nth(1).unwrap_or("");
        // 404 (no route), 405 (`..` taken as a namespace on the
        // GET/HEAD/DELETE route) or 400: refused before the store is asked.
        assert!(
            ["400", "404", "405"].contains(&status),
            "{target}: {answer}"
        );
        // And with methods that route: the `..` namespace is invalid.
        let req = format!("GET {target}/{d} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        let answer = raw(&s, req.as_bytes(), 5).await;
        let status = answer.split_whitespace().nth(1).unwrap_or("");
        assert!(["400", "404"].contains(&status), "{target}: {answer}");
    }
    assert!(s.store_is_empty().await);
    // Nothing was written outside the large tier's root either.
    let mut names: Vec<String> = std::fs::read_dir(s.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("kv.sqlite"))
        .collect();
    names.sort();
    assert_eq!(names, ["large", "uploads"]);
}

#[tokio::test]
async fn a_million_digest_probe_is_too_many_and_the_server_stays_healthy() {
    let s = start(Opts::default()).await;
    let d = blake3::hash(b"x").to_hex().to_string();
    let digests: Vec<&str> = std::iter::repeat_n(d.as_str(), 1_000_000).collect();
    let body = serde_json::to_vec(&json!({"namespace": "a", "digests": digests})).unwrap();
    assert!(body.len() > 60_000_000);
    let v = assert_error(s.post_json("/v1/have", body).await, 413, "too_many").await;
    assert!(v["error"]["message"].as_str().unwrap().contains("10000"));
    // Just over the digest limit, within the body limit: too_many as well.
    let digests: Vec<&str> = std::iter::repeat_n(d.as_str(), 10_001).collect();
    let resp = s.have(json!({"namespace": "a", "digests": digests})).await;
    assert_error(resp, 413, "too_many").await;
    // At the limit: answered.
    let digests: Vec<&str> = std::iter::repeat_n(d.as_str(), 10_000).collect();
    let present = s
        .have_ok(json!({"namespace": "a", "digests": digests}))
        .await;
    assert_eq!(present.len(), 10_000);
    assert_eq!(s.get("/health").await.status(), 200);
    let (_t, d) = s.put_ok("a", &b"still works"[..]).await;
    assert_eq!(s.get(&format!("/v1/blobs/a/{d}")).await.status(), 200);
}

#[tokio::test]
async fn a_client_that_disconnects_mid_upload_leaves_nothing() {
    let s = start(Opts {
        threshold: 1024,
        ..Default::default()
    })
    .await;
    // Known length: declares 10 MiB, sends 1 MiB (past the threshold, so the
    // put is staging into the large tier), then hangs up.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"PUT /v1/blobs/gone HTTP/1.1\r\nhost: x\r\ncontent-length: 10485760\r\n\r\n")
        .await
        .unwrap();
    c.write_all(&vec![5u8; 1 << 20]).await.unwrap();
    assert!(
        eventually(10, || async { s.large.stage_file_count().unwrap() == 1 }).await,
        "the put should be staging"
    );
    drop(c);
    assert!(
        eventually(10, || async { s.large.stage_file_count().unwrap() == 0 }).await,
        "the stage file must go"
    );
    // Chunked: a few chunks, no terminating chunk, hang up.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"PUT /v1/blobs/gone HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..8 {
        c.write_all(b"20000\r\n").await.unwrap();
        c.write_all(&vec![6u8; 0x20000]).await.unwrap();
        c.write_all(b"\r\n").await.unwrap();
    }
    assert!(eventually(10, || async { s.large.stage_file_count().unwrap() == 1 }).await);
    drop(c);
    assert!(eventually(10, || async { s.large.stage_file_count().unwrap() == 0 }).await);
    // Small (kv-bound) upload cut short.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"PUT /v1/blobs/gone HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\nshort")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(s.ns_is_empty("gone").await);
    assert!(s.store_is_empty().await);
    assert_eq!(s.ops.tokens().len(), 0);
    assert!(
        eventually(5, || async {
            s.ops.metrics().errors(store_ops::ErrorCode::IncompleteBody) == 3
        })
        .await
    );
    assert_eq!(s.get("/health").await.status(), 200);
}

#[tokio::test]
async fn a_body_shorter_than_content_length_stores_nothing() {
    let s = start(Opts {
        threshold: 1024,
        ..Default::default()
    })
    .await;
    // Half-closes after a short body: the server sees EOF before the
    // declared length.
    for (declared, sent) in [(100usize, 10usize), (5000, 3000)] {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        let head = format!(
            "PUT /v1/blobs/short HTTP/1.1\r\nhost: x\r\ncontent-length: {declared}\r\n\r\n"
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(&vec![1u8; sent]).await.unwrap();
        c.shutdown().await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out)).await;
        let answer = String::from_utf8_lossy(&out);
        // The answer, if the server could still send one, is an error.
        if let Some(status) = answer.split_whitespace().nth(1) {
            assert_eq!(status, "400", "{answer}");
            assert!(answer.contains("incomplete_body"), "{answer}");
        }
    }
    assert!(eventually(5, || async { s.large.stage_file_count().unwrap() == 0 }).await);
    assert!(s.store_is_empty().await);
}

#[tokio::test]
async fn a_body_longer_than_content_length_is_cut_at_the_declared_length() {
    let s = start(Opts::default()).await;
    // HTTP/1.1 frames the body by Content-Length: the first 5 bytes are the
    // body; what follows is parsed as the next request on the connection,
    // which is garbage and refused. The over-long content is never stored.
    let answer = raw(
        &s,
        b"PUT /v1/blobs/long HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhelloEXTRA BYTES THAT ARE NOT HTTP\r\n\r\n",
        5,
    )
    .await;
    let mut statuses = answer
        .match_indices("HTTP/1.1 ")
        .map(|(i, _)| answer[i + 9..i + 12].to_string());
    assert_eq!(statuses.next().as_deref(), Some("201"), "{answer}");
    assert_eq!(statuses.next().as_deref(), Some("400"), "{answer}");
    let hello = blake3::hash(b"hello").to_hex().to_string();
    assert!(answer.contains(&hello), "{answer}");
    let long = blake3::hash(b"helloEXTRA BYTES THAT ARE NOT HTTP\r\n\r\n")
        .to_hex()
        .to_string();
    let present = s
        .have_ok(json!({"namespace": "long", "digests": [hello, long]}))
        .await;
    assert_eq!(present, [true, false]);

    // The transport-neutral layer enforces the declared length itself: a
    // reader longer than `len` fails with length_mismatch, nothing stored.
    let open = store_ops::auth::Identity::open();
    for (len, body) in [(5u64, vec![1u8; 6]), (2000, vec![2u8; 5000])] {
        let e = s
            .ops
            .put(&open, "strict", &body[..], Some(len), None)
            .await
            .unwrap_err();
        assert_eq!(e.code, store_ops::ErrorCode::LengthMismatch);
    }
    assert!(s.ns_is_empty("strict").await);
}

#[tokio::test]
async fn invalid_content_length_is_a_bad_request() {
    let s = start(Opts::default()).await;
    let answer = raw(
        &s,
        b"PUT /v1/blobs/cl HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\nconnection: close\r\n\r\n",
        5,
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(s.store_is_empty().await);
}

#[tokio::test]
async fn a_corrupted_blob_aborts_the_response_instead_of_completing() {
    let s = start(Opts {
        threshold: 1024,
        ..Default::default()
    })
    .await;
    let data = bytes_of(3 << 20, 77);
    let (_t, d) = s.put_ok("rot", data.clone()).await;
    let key = store_types::Key::parse("rot", &d).unwrap();
    // No pooled connections: an aborted response's connection is dead.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let range = |r: &'static str| {
        fresh
            .get(s.url(&format!("/v1/blobs/rot/{d}")))
            .header("range", r)
            .send()
    };
    // One clean range read first: the server now holds the entry's checked
    // outboard (whether the engine kept one or it was computed), so later
    // range reads verify only the groups they cover.
    let resp = range("bytes=0-9").await.unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.bytes().await.unwrap(), &data[..10]);
    s.large.corrupt_one_byte(&key).await.unwrap(); // the middle byte
    let resp = s.get(&format!("/v1/blobs/rot/{d}")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.content_length(), Some(3 << 20));
    // The last chunk is withheld and the connection dropped: the body read
    // fails; a client never holds a complete body with bad bytes.
    assert!(hash_body(resp).await.is_err());
    assert!(
        eventually(5, || async {
            s.ops.metrics().errors(store_ops::ErrorCode::Verification) == 1
        })
        .await
    );
    // Ranged reads are verified (ADR-032): one away from the flipped byte's
    // chunk group is served intact...
    let resp = range("bytes=0-9").await.unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.bytes().await.unwrap(), &data[..10]);
    // ...one covering it (and longer than the 256 KiB read whole before
    // the head, so it streams) never completes: the connection drops before
    // the headers or before the body's end (the server holds back the end of
    // what it has), and no byte of the corrupt group is ever sent.
    let mid = (3u64 << 20) / 2;
    let sent = fresh
        .get(s.url(&format!("/v1/blobs/rot/{d}")))
        .header("range", format!("bytes={}-{}", mid - 300_000, mid + 10))
        .send()
        .await;
    let mut got = Vec::new();
    let failed = match sent {
        Err(_) => true,
        Ok(mut body) => {
            assert_eq!(body.status(), 206);
            loop {
                match body.chunk().await {
                    Ok(Some(c)) => got.extend_from_slice(&c),
                    Ok(None) => break false,
                    Err(_) => break true,
                }
            }
        }
    };
    assert!(failed, "a 206 over a corrupt group completed");
    let start = (mid - 300_000) as usize;
    assert!(got.len() < 300_010);
    assert_eq!(
        &got[..],
        &data[start..start + got.len()],
        "only verified bytes"
    );
}

#[tokio::test]
async fn a_corrupt_small_body_is_answered_422_before_any_byte() {
    // Bodies of at most 256 KiB (whole entries or ranges) are read and
    // verified before the head: a corrupt one is a JSON `verification`
    // error, not a 200 cut short.
    let s = start(Opts {
        threshold: 1024,
        ..Default::default()
    })
    .await;
    let len = 100u64 << 10;
    let data = bytes_of(len, 78);
    let (_t, d) = s.put_ok("rot", data.clone()).await;
    let key = store_types::Key::parse("rot", &d).unwrap();
    let path = format!("/v1/blobs/rot/{d}");
    let resp = s.get(&path).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.bytes().await.unwrap(), &data[..]);
    let ranged = |r: String| {
        reqwest::Client::new()
            .get(s.url(&path))
            .header("range", r)
            .send()
    };
    // A range read before the damage caches the entry's outboard: at
    // 100 KiB it keeps none (TUNING.md §small-outboards), and one computed after the flip
    // would fail every range.
    let resp = ranged("bytes=0-9".into()).await.unwrap();
    assert_eq!(resp.status(), 206);
    s.large.corrupt_one_byte(&key).await.unwrap(); // the middle byte
    assert_error(s.get(&path).await, 422, "verification").await;
    // A range over the flipped byte's chunk group: 422 too...
    let mid = len / 2;
    let resp = ranged(format!("bytes={}-{}", mid - 10, mid + 10))
        .await
        .unwrap();
    assert_error(resp, 422, "verification").await;
    // ...one away from it is served intact.
    let resp = ranged("bytes=0-9".into()).await.unwrap();
    assert_eq!(resp.status(), 206);
    assert_eq!(resp.bytes().await.unwrap(), &data[..10]);
    assert!(s.ops.metrics().errors(store_ops::ErrorCode::Verification) >= 2);
}
