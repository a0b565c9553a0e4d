//! Bazel's HTTP cache on a cache namespace (issue 42 items 1-2, ADR-070),
//! on sqlite + local: `cas/` names by SHA-256 (Bazel's default) or BLAKE3,
//! verified as the body is read with nothing stored on a mismatch;
//! `ac/` action results served only while their outputs are present, a
//! hit refreshing the outputs' recency; the write-only rules on both; and
//! the calls a REAPI binding makes (`CacheOps::put_cas`, `get_cas`,
//! `find_missing`, `get_action_result`, `put_action_result`).
//!
//! SHA-256 digests are the FIPS 180-2 examples (the test needs no SHA-256
//! of its own); action results and trees are protobuf encoded here by
//! hand, field numbers from REAPI's `remote_execution.proto`, so the
//! server's decoder is checked against the wire format, not itself.

mod common;

use std::time::Duration;

use common::*;
use store_core::CacheBounds;
use store_ops::auth::Identity;
use store_ops::cache::{CasDigest, DigestFunction};
use store_types::{Digest, Key, Namespace, RefName};

/// SHA-256 of `abc`.
const SHA_ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
/// SHA-256 of [`LONG`].
const SHA_LONG: &str = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
const LONG: &str = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
/// SHA-256 of a million `a`s (larger than the kv threshold: the large
/// tier's streamed put).
const SHA_MILLION_A: &str = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
/// SHA-256 of the empty body.
const SHA_EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// An action's digest (the `ac/` key; never checked against anything).
const ACTION: &str = "1111111111111111111111111111111111111111111111111111111111111111";

async fn server(max_bytes: Option<u64>) -> Server {
    start(Opts {
        window: Duration::ZERO,
        cache: vec![(
            "bz",
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

fn b3(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

fn ns() -> Namespace {
    Namespace::new("bz").unwrap()
}

/// The entry `key` names in `bz` (`None`: no such key).
async fn key_of(s: &Server, key: &str) -> Option<Digest> {
    let cache = s.ops.store().cache().unwrap();
    cache
        .lookup(&ns(), &RefName::new(key).unwrap())
        .await
        .unwrap()
}

/// Whether `bz` holds an entry of BLAKE3 digest `hex`.
async fn has_entry(s: &Server, hex: &str) -> bool {
    let key = Key::new(ns(), Digest::parse(hex).unwrap());
    s.ops.store().stat(&key).await.unwrap().is_some()
}

// Protobuf, by hand: a field's tag, a varint, a length-delimited field.
fn varint(mut n: u64, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn field(tag: u64, bytes: &[u8], out: &mut Vec<u8>) {
    varint(tag << 3 | 2, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// REAPI `Digest { hash = 1, size_bytes = 2 }`.
fn digest(hash: &str, size: u64) -> Vec<u8> {
    let mut d = Vec::new();
    field(1, hash.as_bytes(), &mut d);
    varint(2 << 3, &mut d);
    varint(size, &mut d);
    d
}

/// REAPI `ActionResult`: `output_files` (2) of `OutputFile { path = 1,
/// digest = 2 }`, `output_directories` (3) of `OutputDirectory { path =
/// 1, tree_digest = 3 }`, `exit_code` (4), `stdout_digest` (6).
fn action_result(files: &[(&str, &str, u64)], dirs: &[(&str, &str, u64)]) -> Vec<u8> {
    let mut ar = Vec::new();
    for (path, hash, size) in files {
        let mut f = Vec::new();
        field(1, path.as_bytes(), &mut f);
        field(2, &digest(hash, *size), &mut f);
        field(2, &f, &mut ar);
    }
    for (path, hash, size) in dirs {
        let mut d = Vec::new();
        field(1, path.as_bytes(), &mut d);
        field(3, &digest(hash, *size), &mut d);
        field(3, &d, &mut ar);
    }
    varint(4 << 3, &mut ar);
    varint(0, &mut ar);
    field(6, &digest(SHA_EMPTY, 0), &mut ar);
    ar
}

/// REAPI `Tree { root = 1 }` whose root `Directory` holds `files` (1) of
/// `FileNode { name = 1, digest = 2 }`.
fn tree(files: &[(&str, &str, u64)]) -> Vec<u8> {
    let mut dir = Vec::new();
    for (name, hash, size) in files {
        let mut f = Vec::new();
        field(1, name.as_bytes(), &mut f);
        field(2, &digest(hash, *size), &mut f);
        field(1, &f, &mut dir);
    }
    let mut t = Vec::new();
    field(1, &dir, &mut t);
    t
}

#[tokio::test]
async fn sha256_names_are_keys_to_blake3_entries() {
    let s = server(None).await;
    let r = put(&s, &format!("/cache/bz/cas/{SHA_ABC}"), "abc").await;
    assert_eq!(r.status(), 201);
    // Stored under its BLAKE3 digest; the SHA-256 name is a key to it.
    assert_eq!(r.headers()["x-blobpool-digest"], b3(b"abc").as_str());
    let k = key_of(&s, &format!("cas/{SHA_ABC}")).await;
    assert_eq!(k.map(|d| d.to_hex()), Some(b3(b"abc")));
    let r = s.get(&format!("/cache/bz/cas/{SHA_ABC}")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), "abc");
    let r = s
        .http
        .head(s.url(&format!("/cache/bz/cas/{SHA_ABC}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-length"], "3");
    // Its BLAKE3 name finds the same entry (no key of its own).
    let r = s.get(&format!("/cache/bz/cas/{}", b3(b"abc"))).await;
    assert_eq!(r.text().await.unwrap(), "abc");
    // Again: deduplicated.
    assert_eq!(
        put(&s, &format!("/cache/bz/cas/{SHA_ABC}"), "abc")
            .await
            .status(),
        200
    );
    // A large body, streamed into the large tier, with and without a
    // declared length.
    let million = vec![b'a'; 1_000_000];
    let path = format!("/cache/bz/cas/{SHA_MILLION_A}");
    assert_eq!(put(&s, &path, million.clone()).await.status(), 201);
    s.delete(&path).await;
    let chunks = million
        .chunks(65536)
        .map(|c| Ok::<_, std::io::Error>(c.to_vec()));
    let body = reqwest::Body::wrap_stream(futures::stream::iter(chunks.collect::<Vec<_>>()));
    assert_eq!(put(&s, &path, body).await.status(), 200, "entry kept");
    let got = s.get(&path).await.bytes().await.unwrap();
    assert!(got == million, "the million a's come back");
    // BLAKE3 names work as before.
    let d = b3(LONG.as_bytes());
    assert_eq!(
        put(&s, &format!("/cache/bz/cas/{d}"), LONG).await.status(),
        201
    );
    assert_eq!(key_of(&s, &format!("cas/{d}")).await.unwrap().to_hex(), d);
}

#[tokio::test]
async fn a_body_that_is_not_its_name_stores_nothing() {
    let s = server(None).await;
    // Neither the SHA-256 nor the BLAKE3 of "abd" is SHA_ABC.
    let e = assert_error(
        put(&s, &format!("/cache/bz/cas/{SHA_ABC}"), "abd").await,
        422,
        "verification",
    )
    .await;
    let m = e["error"]["message"].as_str().unwrap();
    assert!(m.contains("SHA-256") && m.contains("BLAKE3"), "{m}");
    assert!(
        m.contains(&b3(b"abd")),
        "names what the body hashes to: {m}"
    );
    assert_eq!(key_of(&s, &format!("cas/{SHA_ABC}")).await, None);
    assert!(!has_entry(&s, &b3(b"abd")).await, "no entry stored");
    // The same through the large tier: no entry, no stage left behind.
    let wrong = vec![b'b'; 1_000_000];
    assert_error(
        put(&s, &format!("/cache/bz/cas/{SHA_MILLION_A}"), wrong.clone()).await,
        422,
        "verification",
    )
    .await;
    assert_eq!(key_of(&s, &format!("cas/{SHA_MILLION_A}")).await, None);
    assert!(!has_entry(&s, &b3(&wrong)).await);
    assert_eq!(s.large.stage_file_count().unwrap(), 0);
    // A BLAKE3 name the body does not hash to either.
    let e = assert_error(
        put(&s, &format!("/cache/bz/cas/{}", b3(b"x")), "abc").await,
        422,
        "verification",
    )
    .await;
    assert!(e.to_string().contains(SHA_ABC), "{e}");
    assert!(!has_entry(&s, &b3(b"abc")).await);
    assert_eq!(
        s.ops.store().cache().unwrap().usage().await.unwrap().len(),
        0
    );
    // A malformed name says what a cas/ key takes.
    let e = assert_error(
        put(&s, "/cache/bz/cas/ABC", "abc").await,
        400,
        "key_invalid",
    )
    .await;
    assert!(e.to_string().contains("SHA-256"), "{e}");
}

#[tokio::test]
async fn an_action_result_is_served_only_while_its_outputs_are_present() {
    let s = server(None).await;
    let ac = format!("/cache/bz/ac/{ACTION}");
    let ar = action_result(&[("out/a", SHA_ABC, 3), ("out/b", SHA_LONG, 56)], &[]);
    assert_eq!(put(&s, &ac, ar.clone()).await.status(), 201);
    // Neither output uploaded: a miss (Bazel runs the action again).
    let e = assert_error(s.get(&ac).await, 404, "not_found").await;
    assert!(e.to_string().contains("out/a"), "{e}");
    let r = s.http.head(s.url(&ac)).send().await.unwrap();
    assert_eq!(r.status(), 404);
    put(&s, &format!("/cache/bz/cas/{SHA_ABC}"), "abc").await;
    let e = assert_error(s.get(&ac).await, 404, "not_found").await;
    assert!(e.to_string().contains("out/b"), "{e}");
    // The miss left the key: once every output is there, a hit.
    put(&s, &format!("/cache/bz/cas/{SHA_LONG}"), LONG).await;
    let r = s.get(&ac).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), ar);
    // An output deleted: a miss again.
    assert_eq!(
        s.delete(&format!("/cache/bz/cas/{SHA_LONG}"))
            .await
            .status(),
        204
    );
    assert_error(s.get(&ac).await, 404, "not_found").await;
    // Hits and misses are counted as such.
    let (hits, misses) = s.ops.metrics().cache_lookups("bz");
    assert!(hits >= 1 && misses >= 4, "{hits} {misses}");
}

#[tokio::test]
async fn an_output_directory_needs_its_tree_and_the_tree_its_files() {
    let s = server(None).await;
    let file = b"file in a directory";
    let t = tree(&[("f", &b3(file), file.len() as u64)]);
    let ac = format!("/cache/bz/ac/{ACTION}");
    let ar = action_result(&[], &[("out/dir", &b3(&t), t.len() as u64)]);
    assert_eq!(put(&s, &ac, ar).await.status(), 201);
    let e = assert_error(s.get(&ac).await, 404, "not_found").await;
    assert!(e.to_string().contains("out/dir"), "{e}");
    put(&s, &format!("/cache/bz/cas/{}", b3(&t)), t.clone()).await;
    let e = assert_error(s.get(&ac).await, 404, "not_found").await;
    assert!(e.to_string().contains("file f"), "{e}");
    put(&s, &format!("/cache/bz/cas/{}", b3(file)), file.to_vec()).await;
    assert_eq!(s.get(&ac).await.status(), 200);
    // A tree digest naming something that is no Tree: a miss.
    let ar = action_result(&[], &[("out/dir", SHA_ABC, 3)]);
    put(&s, &format!("/cache/bz/cas/{SHA_ABC}"), "abc").await;
    put(&s, &format!("/cache/bz/ac/{}", b3(b"other")), ar).await;
    let e = assert_error(
        s.get(&format!("/cache/bz/ac/{}", b3(b"other"))).await,
        404,
        "not_found",
    )
    .await;
    assert!(e.to_string().contains("not a REAPI Tree"), "{e}");
}

#[tokio::test]
async fn an_ac_body_that_is_no_action_result_is_served_as_put() {
    let s = server(None).await;
    // ccache's layout=bazel stores its own result bytes under ac/.
    let ccache = b"cCrS\x00\x01\x00\x00compressed ccache result".to_vec();
    let path = format!("/cache/bz/ac/{ACTION}");
    assert_eq!(put(&s, &path, ccache.clone()).await.status(), 201);
    assert_eq!(s.get(&path).await.bytes().await.unwrap(), ccache);
    // A valid protobuf naming no digest, and an action result with a
    // malformed digest: served unvalidated too.
    let mut empty = Vec::new();
    varint(4 << 3, &mut empty);
    varint(1, &mut empty);
    assert_eq!(put(&s, "/cache/bz/ac/x", empty.clone()).await.status(), 201);
    assert_eq!(s.get("/cache/bz/ac/x").await.bytes().await.unwrap(), empty);
    let odd = action_result(&[("out/a", "not-hex", 3)], &[]);
    assert_eq!(put(&s, "/cache/bz/ac/y", odd.clone()).await.status(), 201);
    assert_eq!(s.get("/cache/bz/ac/y").await.bytes().await.unwrap(), odd);
}

/// Waits until `bz`'s keys hold at most `max` bytes (a write-time trim
/// runs in a task of its own); fails after 5 s.
async fn trimmed_to(s: &Server, max: u64) {
    let started = std::time::Instant::now();
    let cache = s.ops.store().cache().unwrap();
    loop {
        let usage = cache.usage().await.unwrap();
        let bytes = usage.iter().find(|(n, _)| n.as_str() == "bz");
        let bytes = bytes.map_or(0, |(_, u)| u.bytes);
        if bytes <= max {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{bytes} bytes");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_hit_keeps_its_outputs_recent_so_other_keys_go_first() {
    let s = server(Some(3500)).await;
    // Reads more than ACCESS_RESOLUTION apart are ordered.
    let step = || tokio::time::sleep(Duration::from_millis(150));
    let output = vec![7u8; 1000];
    let out = b3(&output);
    put(&s, &format!("/cache/bz/cas/{out}"), output.clone()).await;
    let ac = format!("/cache/bz/ac/{ACTION}");
    let ar = action_result(&[("out/o", &out, 1000)], &[]);
    assert_eq!(put(&s, &ac, ar).await.status(), 201);
    step().await;
    for i in 1..=2u8 {
        put(&s, &format!("/cache/bz/f{i}"), vec![i; 1000]).await;
        step().await;
    }
    // The hit: the output is now more recent than f1 and f2.
    assert_eq!(s.get(&ac).await.status(), 200);
    step().await;
    // Past the bound: the least recently used key goes, f1 — not the
    // output, which was put first.
    put(&s, "/cache/bz/f3", vec![3u8; 1000]).await;
    trimmed_to(&s, 3500).await;
    assert_eq!(s.get("/cache/bz/f1").await.status(), 404);
    assert_eq!(
        key_of(&s, &format!("cas/{out}")).await.unwrap().to_hex(),
        out
    );
    assert_eq!(s.get(&ac).await.status(), 200, "the result still hits");
}

const A: &str = "bpk_bazel_writer_a";
const B: &str = "bpk_bazel_writer_b";

async fn put_as(s: &Server, who: &str, path: &str, body: &'static str) -> reqwest::Response {
    let r = s.http.put(s.url(path)).bearer_auth(who).body(body);
    r.send().await.unwrap()
}

#[tokio::test]
async fn write_only_keys_add_cas_and_ac_keys_but_replace_none() {
    let unbounded = CacheBounds {
        max_bytes: None,
        max_age: None,
    };
    let s = start_with_keys(
        vec![
            api_key("a", A, &["read", "write"]),
            api_key("b", B, &["read", "write"]),
        ],
        Opts {
            window: Duration::ZERO,
            cache: vec![("bz", unbounded), ("once", unbounded)],
            immutable: vec!["once"],
            ..Default::default()
        },
    )
    .await;
    for ns in ["bz", "once"] {
        let cas = format!("/cache/{ns}/cas/{SHA_ABC}");
        assert_eq!(put_as(&s, A, &cas, "abc").await.status(), 201, "{ns}");
        // Another writer re-puts the same content address: the same bytes.
        assert_eq!(put_as(&s, B, &cas, "abc").await.status(), 200, "{ns}");
        assert_error(put_as(&s, B, &cas, "abd").await, 422, "verification").await;
        let ac = format!("/cache/{ns}/ac/{ACTION}");
        assert_eq!(put_as(&s, A, &ac, "result a").await.status(), 201);
        assert_error(put_as(&s, B, &ac, "poison").await, 403, "forbidden").await;
        assert_eq!(put_as(&s, B, &ac, "result a").await.status(), 200);
        let r = s.http.get(s.url(&ac)).bearer_auth(B).send().await.unwrap();
        assert_eq!(r.text().await.unwrap(), "result a");
    }
    // If-None-Match: * on an existing cas/ key.
    let r = s
        .http
        .put(s.url(&format!("/cache/bz/cas/{SHA_ABC}")))
        .bearer_auth(A)
        .header("if-none-match", "*")
        .body("abc")
        .send()
        .await
        .unwrap();
    assert_error(r, 412, "ref_conflict").await;
}

#[tokio::test]
async fn the_reapi_calls_of_the_cache_handle() {
    let s = server(None).await;
    let (me, cache) = (Identity::open(), s.ops.cache());
    let sha = |h: &str| CasDigest {
        function: DigestFunction::Sha256,
        hash: h.into(),
        size: 3,
    };
    // Told the function, a put checks that one only.
    let b3_abc = b3(b"abc");
    let e = cache
        .put_cas(
            &me,
            "bz",
            Some(DigestFunction::Sha256),
            &b3_abc,
            &b"abc"[..],
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, store_ops::ErrorCode::Verification, "{e:?}");
    let e = cache
        .put_cas(
            &me,
            "bz",
            Some(DigestFunction::Blake3),
            SHA_ABC,
            &b"abc"[..],
            Some(3),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code, store_ops::ErrorCode::Verification, "{e:?}");
    assert!(e.message.contains(&b3_abc), "{e:?}");
    assert!(!has_entry(&s, &b3_abc).await);
    let out = cache
        .put_cas(
            &me,
            "bz",
            Some(DigestFunction::Sha256),
            SHA_ABC,
            &b"abc"[..],
            Some(3),
        )
        .await
        .unwrap();
    assert_eq!(out.digest.to_hex(), b3_abc);
    // The BLAKE3 entry, put without a key, found by BLAKE3 only.
    let blake = CasDigest {
        function: DigestFunction::Blake3,
        hash: b3(b"abc"),
        size: 3,
    };
    let empty = CasDigest {
        function: DigestFunction::Sha256,
        hash: SHA_EMPTY.into(),
        size: 0,
    };
    let asked = [sha(SHA_LONG), sha(SHA_ABC), blake, empty, sha(&b3_abc)];
    let missing = cache.find_missing(&me, "bz", &asked).await.unwrap();
    assert_eq!(missing, vec![0, 4]);
    let got = cache
        .get_cas(&me, "bz", Some(DigestFunction::Sha256), SHA_ABC, None)
        .await
        .unwrap();
    assert_eq!(got.blob.bytes().await.unwrap(), "abc");
    let e = cache
        .get_cas(&me, "bz", Some(DigestFunction::Sha256), &b3_abc, None)
        .await
        .unwrap_err();
    assert_eq!(e.code, store_ops::ErrorCode::NotFound);
    assert!(cache
        .get_cas(&me, "bz", Some(DigestFunction::Blake3), &b3_abc, None)
        .await
        .is_ok());
    // Action results: validated on the way out.
    let ar = action_result(&[("out/a", SHA_ABC, 3), ("out/b", SHA_LONG, 56)], &[]);
    let put = cache
        .put_action_result(&me, "bz", ACTION, ar.clone().into())
        .await
        .unwrap();
    assert!(put.previous.is_none());
    let e = cache
        .get_action_result(&me, "bz", ACTION)
        .await
        .unwrap_err();
    assert_eq!(e.code, store_ops::ErrorCode::NotFound);
    assert!(e.message.contains("out/b"), "{e:?}");
    cache
        .put_cas(&me, "bz", None, SHA_LONG, LONG.as_bytes(), None)
        .await
        .unwrap();
    let got = cache.get_action_result(&me, "bz", ACTION).await.unwrap();
    assert_eq!(got, ar);
    let e = cache
        .get_action_result(&me, "bz", "nothex")
        .await
        .unwrap_err();
    assert_eq!(e.code, store_ops::ErrorCode::KeyInvalid);
    // Scopes are checked: a read-only identity puts nothing.
    let reader = Identity::new(
        "reader",
        store_ops::auth::Credential::Key,
        store_ops::auth::Grant::parse_all(&["read"]).unwrap(),
    );
    let e = cache
        .put_cas(&reader, "bz", None, SHA_ABC, &b"abc"[..], None)
        .await
        .unwrap_err();
    assert_eq!(e.code, store_ops::ErrorCode::Forbidden);
}
