//! The build-cache protocol and cache namespaces over HTTP (issue 31,
//! ADR-048), on sqlite + local: keys, no pin tokens, `cas/` verification,
//! WebDAV's `MKCOL`/`PROPFIND`, the size bound evicting least recently
//! used keys at a sweep, references still protecting, hit/miss metrics.

mod common;

use std::time::Duration;

use common::*;
use store_core::CacheBounds;

async fn server(max_bytes: Option<u64>) -> Server {
    start(Opts {
        window: Duration::ZERO,
        cache: vec![(
            "cc",
            CacheBounds {
                max_bytes,
                max_age: None,
            },
        )],
        ..Default::default()
    })
    .await
}

async fn put(s: &Server, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
    s.http.put(s.url(path)).body(body).send().await.unwrap()
}

async fn sweep(s: &Server) -> serde_json::Value {
    let r = s
        .http
        .post(s.url("/v1/sweep"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().await.unwrap()
}

#[tokio::test]
async fn keys_round_trip_without_tokens() {
    let s = server(None).await;
    let r = put(&s, "/cache/cc/ab/cdef0123", "object one").await;
    assert_eq!(r.status(), 201);
    let r = put(&s, "/cache/cc/ab/cdef0123", "object one").await;
    assert_eq!(r.status(), 200, "the same bytes again: deduplicated");
    let r = s.get("/cache/cc/ab/cdef0123").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), "object one");
    let r = s
        .http
        .head(s.url("/cache/cc/ab/cdef0123"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], "10");
    // A key now names new bytes (a cache replaces).
    assert_eq!(
        put(&s, "/cache/cc/ab/cdef0123", "object two")
            .await
            .status(),
        201
    );
    assert_eq!(
        s.get("/cache/cc/ab/cdef0123").await.text().await.unwrap(),
        "object two"
    );
    // Misses.
    assert_error(s.get("/cache/cc/ab/none").await, 404, "not_found").await;
    let r = s.http.head(s.url("/cache/cc/none")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // DELETE removes the key.
    assert_eq!(s.delete("/cache/cc/ab/cdef0123").await.status(), 204);
    assert_error(s.get("/cache/cc/ab/cdef0123").await, 404, "not_found").await;
    assert_error(s.delete("/cache/cc/ab/cdef0123").await, 404, "not_found").await;
    // No pin token was minted by any of it.
    assert_eq!(s.ops.tokens().stats().live, 0);
    assert_eq!(s.ops.metrics().cache_lookups("cc"), (3, 3));
    let m = s.get("/metrics").await.text().await.unwrap();
    assert!(
        m.contains("blobpool_cache_requests_total{namespace=\"cc\",result=\"hit\"} 3"),
        "{m}"
    );
    assert!(m.contains("blobpool_cache_keys{namespace=\"cc\"} 0"), "{m}");
}

#[tokio::test]
async fn blob_puts_in_a_cache_namespace_take_no_token() {
    let s = server(None).await;
    let r = put(&s, "/v1/blobs/cc", "plain put").await;
    assert_eq!(r.status(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["token"], serde_json::Value::Null);
    assert_eq!(v["cache"], true);
    let d = v["digest"].as_str().unwrap().to_string();
    assert_eq!(s.ops.tokens().stats().live, 0);
    // Recorded under its content address.
    let r = s.get(&format!("/cache/cc/cas/{d}")).await;
    assert_eq!(r.text().await.unwrap(), "plain put");
    // Other namespaces still answer the ADR-012 shape, token and all.
    let v: serde_json::Value = put(&s, "/v1/blobs/other", "x").await.json().await.unwrap();
    assert!(v["token"].is_string());
    assert!(v.get("cache").is_none(), "{v}");
}

#[tokio::test]
async fn cas_keys_are_verified() {
    let s = server(None).await;
    let body = "content addressed";
    let d = blake3::hash(body.as_bytes()).to_hex().to_string();
    assert_eq!(
        put(&s, &format!("/cache/cc/cas/{d}"), body).await.status(),
        201
    );
    let wrong = blake3::hash(b"else").to_hex().to_string();
    assert_error(
        put(&s, &format!("/cache/cc/cas/{wrong}"), body).await,
        422,
        "verification",
    )
    .await;
    assert_error(
        s.get(&format!("/cache/cc/cas/{wrong}")).await,
        404,
        "not_found",
    )
    .await;
    let e = assert_error(
        put(&s, "/cache/cc/cas/sha256ish", body).await,
        400,
        "key_invalid",
    )
    .await;
    assert!(e.to_string().contains("digest_function=blake3"), "{e}");
    // Keys follow reference-name rules.
    assert_error(put(&s, "/cache/cc/a/b%20c", "x").await, 400, "key_invalid").await;
    // Not a cache namespace: 404 naming the configuration.
    let e = assert_error(put(&s, "/cache/other/k", "x").await, 404, "not_found").await;
    assert!(e.to_string().contains("policy = \\\"cache\\\""), "{e}");
}

#[tokio::test]
async fn webdav_directories_are_implicit() {
    let s = server(None).await;
    let mkcol = reqwest::Method::from_bytes(b"MKCOL").unwrap();
    let propfind = reqwest::Method::from_bytes(b"PROPFIND").unwrap();
    let r = s
        .http
        .request(mkcol, s.url("/cache/cc/a/b/"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let r = s
        .http
        .request(propfind.clone(), s.url("/cache/cc/a/b/"))
        .header("depth", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 207);
    assert!(r.text().await.unwrap().contains("<D:collection/>"));
    put(&s, "/cache/cc/a/b/c", "abc").await;
    let r = s
        .http
        .request(propfind.clone(), s.url("/cache/cc/a/b/c"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 207);
    assert!(r.text().await.unwrap().contains("<D:getcontentlength>3<"));
    let r = s
        .http
        .request(propfind, s.url("/cache/cc/a/b/d"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

/// Over `max_bytes`, a sweep removes the least recently used keys and
/// their entries; a read moves a key to the front; a referenced entry is
/// never deleted; within the bound nothing goes.
#[tokio::test]
async fn the_size_bound_evicts_least_recently_used() {
    let s = server(Some(3000)).await;
    let body = |i: u8| vec![i; 1000];
    for i in 0..3u8 {
        assert_eq!(
            put(&s, &format!("/cache/cc/k{i}"), body(i)).await.status(),
            201
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Within the bound: a sweep keeps everything.
    sweep(&s).await;
    for i in 0..3 {
        assert_eq!(
            s.get(&format!("/cache/cc/k{i}")).await.status(),
            200,
            "k{i}"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Reads, oldest first, then k0 read again: k1 is the least recent.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(s.get("/cache/cc/k0").await.status(), 200);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(put(&s, "/cache/cc/k3", body(3)).await.status(), 201);
    // The put past the bound starts a trim (ADR-069), which deletes the
    // evicted entry itself: no sweep stages or deletes anything.
    let d1 = blake3::hash(&body(1)).to_hex().to_string();
    within_bound(&s, 3000).await;
    assert_eq!(s.get("/cache/cc/k1").await.status(), 404, "the key is gone");
    let started = std::time::Instant::now();
    while s.get(&format!("/v1/blobs/cc/{d1}")).await.status() != 404 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "its entry stays"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rep = sweep(&s).await;
    assert_eq!(rep["total"]["staged"], 0, "{rep}");
    for k in ["k0", "k2", "k3"] {
        assert_eq!(s.get(&format!("/cache/cc/{k}")).await.status(), 200, "{k}");
    }
    // A reference protects its entry even when its key is evicted.
    let d2 = blake3::hash(&body(2)).to_hex().to_string();
    let refs = s.ops.store().refs().unwrap();
    refs.set(
        &store_types::Namespace::new("cc").unwrap(),
        &store_types::RefName::new("keep/k2").unwrap(),
        store_types::Digest::parse(&d2).unwrap(),
        store_types::RefExpect::Absent,
    )
    .await
    .unwrap();
    for i in 4..8u8 {
        assert_eq!(
            put(&s, &format!("/cache/cc/k{i}"), body(i)).await.status(),
            201
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    sweep(&s).await;
    sweep(&s).await;
    assert_eq!(
        s.get("/cache/cc/k2").await.status(),
        404,
        "its key was evicted"
    );
    let r = s.get(&format!("/v1/blobs/cc/{d2}")).await;
    assert_eq!(r.status(), 200, "the referenced entry stays");
    let usage = s.ops.store().cache().unwrap().usage().await.unwrap();
    let (_, u) = usage.iter().find(|(n, _)| n.as_str() == "cc").unwrap();
    assert!(u.bytes <= 3000, "{u:?}");
    assert_eq!(u.keys, 3);
}

/// Waits (at most 5 s) until cache namespace `cc`'s keys and the large
/// tier's files each hold at most `max` bytes; the time it took.
async fn within_bound(s: &Server, max: u64) -> Duration {
    let started = std::time::Instant::now();
    let cache = s.ops.store().cache().unwrap();
    loop {
        let usage = cache.usage().await.unwrap();
        let keys = usage.iter().find(|(n, _)| n.as_str() == "cc");
        let keys = keys.map_or(0, |(_, u)| u.bytes);
        let disk = disk_bytes(&s.dir.path().join("large"));
        if keys <= max && disk <= max {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still over {max} bytes: keys {keys}, disk {disk}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The bytes of the files under `dir`.
fn disk_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Puts past `max_bytes` trim at once and their evicted entries leave the
/// disk within seconds, with no sweep (ADR-069): 40 MiB put into a 1 MiB
/// cache, 16 concurrent puts at a time. An entry larger than the bound is
/// refused with `413 too_large`, declared or streamed, and evicts nothing.
#[tokio::test]
async fn the_bound_holds_at_write_time() {
    const MIB: usize = 1 << 20;
    let s = server(Some(MIB as u64)).await;
    let started = std::time::Instant::now();
    let mut peak = 0;
    for round in 0..10u32 {
        let s = &s;
        let puts = (0..16u32).map(|i| async move {
            let n = round * 16 + i;
            let body: Vec<u8> = (0..MIB / 4).map(|j| (j as u32 ^ n) as u8).collect();
            let body = [&n.to_le_bytes()[..], &body].concat();
            put(s, &format!("/cache/cc/r{round}/k{i}"), body).await
        });
        for r in futures::future::join_all(puts).await {
            assert_eq!(r.status(), 201);
        }
        peak = peak.max(disk_bytes(&s.dir.path().join("large")));
    }
    let put_for = started.elapsed();
    let settled = within_bound(&s, MIB as u64).await;
    eprintln!(
        "40 MiB into a 1 MiB cache: puts {put_for:?}, peak on disk {peak} bytes, within the \
         bound {settled:?} after the last put"
    );
    // Trimmed while the puts go on, not at a sweep (before ADR-069 all
    // 40 MiB stayed until one): the peak stays under half of what was put.
    // How far above the bound it goes depends on scheduling — the trim and
    // its deletes run beside the puts (4.8-12 MiB seen, the most under
    // load) — so the bound itself is checked once the puts stop, below.
    assert!(peak < 20 * MIB as u64, "{peak} bytes on disk at once");
    let kept = disk_bytes(&s.dir.path().join("large"));
    assert!(kept > 0, "the latest entries stay");
    // Refused, declared or streamed, leaving every key in place.
    let big = vec![7u8; MIB + 1];
    let r = put(&s, "/cache/cc/big", big.clone()).await;
    assert_eq!(r.status(), 413);
    let err: serde_json::Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "too_large", "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_bytes"), "{err}");
    let chunks: Vec<_> = (big.chunks(64 << 10))
        .map(|c| Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(c)))
        .collect();
    let stream = futures::stream::iter(chunks);
    let r = put(&s, "/cache/cc/big", reqwest::Body::wrap_stream(stream)).await;
    assert_eq!(r.status(), 413);
    assert_eq!(s.get("/cache/cc/big").await.status(), 404);
    assert_eq!(
        disk_bytes(&s.dir.path().join("large")),
        kept,
        "nothing evicted"
    );
}

/// A namespace's own base path (`http_path`) answers the same protocol,
/// Bazel's `/ac/` and `/cas/` layout included.
#[tokio::test]
async fn a_cache_namespace_answers_under_its_own_base_path() {
    let s = start(Opts {
        window: Duration::ZERO,
        cache: vec![("bazel", CacheBounds::default())],
        cache_paths: vec![("/bazel-cache", "bazel")],
        ..Default::default()
    })
    .await;
    let body = "action result";
    let d = blake3::hash(body.as_bytes()).to_hex().to_string();
    assert_eq!(
        put(&s, &format!("/bazel-cache/cas/{d}"), body)
            .await
            .status(),
        201
    );
    assert_eq!(
        put(&s, "/bazel-cache/ac/0011", "ac entry").await.status(),
        201
    );
    assert_eq!(
        s.get(&format!("/bazel-cache/cas/{d}"))
            .await
            .text()
            .await
            .unwrap(),
        body
    );
    // The same keys under /cache/{ns}.
    assert_eq!(
        s.get("/cache/bazel/ac/0011").await.text().await.unwrap(),
        "ac entry"
    );
    assert_error(s.get("/bazel-cache/ac/none").await, 404, "not_found").await;
    assert_eq!(s.delete("/bazel-cache/ac/0011").await.status(), 204);
    assert_error(s.get("/cache/bazel/ac/0011").await, 404, "not_found").await;
    // The base path's requests are timed under its configured pattern,
    // never the raw path.
    let m = s.ops.metrics();
    assert_eq!(m.requests_timed("/bazel-cache/{key}", "PUT"), 2);
    assert_eq!(m.requests_timed("/bazel-cache/{key}", "DELETE"), 1);
    assert_eq!(m.requests_timed("(unknown)", "PUT"), 0);
}

/// Every metric family `/metrics` renders — the server's, the cache's, the
/// request histogram, build info — is documented in docs/SERVER.md (the
/// list there is checked, not hand-maintained).
#[tokio::test]
async fn every_metric_family_is_documented() {
    let s = server(None).await;
    put(&s, "/cache/cc/k", "x").await;
    s.get("/cache/cc/k").await;
    let m = s.get("/metrics").await.text().await.unwrap();
    let mut families: Vec<&str> = m
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let layers = store_layers::render_prometheus(&store_layers::MetricsLayer::new().snapshot());
    families.extend(
        layers
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next()),
    );
    assert!(families.len() > 30, "{families:?}");
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/SERVER.md"))
        .unwrap();
    let missing: Vec<&&str> = families.iter().filter(|f| !doc.contains(**f)).collect();
    assert!(
        missing.is_empty(),
        "metric families missing from docs/SERVER.md: {missing:?}"
    );
}

/// Gradle's HTTP build cache, request for request (its client cannot run
/// here: Debian's Gradle 4.4 needs Java ≤ 9 and Maven Central is not
/// reachable): `PUT <url>/<key>` with its artefact media type, Basic
/// credentials and `Expect: 100-continue`; `GET` with its `Accept`; a miss
/// is a plain 404.
#[tokio::test]
async fn gradle_requests_are_answered() {
    let s = start_with_keys(
        vec![api_key("gradle", "bpk_gradle", &["read", "write"])],
        Opts {
            cache: vec![("gradle", CacheBounds::default())],
            ..Default::default()
        },
    )
    .await;
    let key = "/cache/gradle/5f2b3c6d8a9e0f1a2b3c4d5e6f708192";
    let media = "application/vnd.gradle.build-cache-artifact.v2";
    let r = s
        .http
        .put(s.url(key))
        .basic_auth("ignored-user", Some("bpk_gradle"))
        .header("content-type", media)
        .header("expect", "100-continue")
        .body(vec![7u8; 5000])
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let r = s
        .http
        .get(s.url(key))
        .basic_auth("ignored-user", Some("bpk_gradle"))
        .header("accept", format!("{media}, */*"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap().len(), 5000);
    let r = s
        .http
        .get(s.url("/cache/gradle/00000000000000000000000000000000"))
        .basic_auth("ignored-user", Some("bpk_gradle"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Without credentials: 401 offering Basic, as Gradle expects.
    let r = s.get(key).await;
    assert_eq!(r.status(), 401);
    let offered: Vec<String> = r
        .headers()
        .get_all("www-authenticate")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(
        offered.iter().any(|v| v.starts_with("Basic")),
        "{offered:?}"
    );
}
