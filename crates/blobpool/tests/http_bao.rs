//! Verified (bao) streams over HTTP (ADR-033): `GET` with `Accept:
//! application/x-bao`, decoded here with bao-tree's own decoder (not
//! Blobpool's), whole and ranged, and what a corrupt entry does to them.

mod common;

use bao_tree::io::sync::DecodeResponseIter;
use bao_tree::io::BaoContentItem;
use bao_tree::{BaoTree, BlockSize, ChunkNum, ChunkRanges};
use common::*;

const BAO: &str = "application/x-bao";
const G: u64 = 16 * 1024;

/// bao-tree's shape of an entry: 16 KiB chunk groups.
fn tree(size: u64) -> BaoTree {
    BaoTree::new(size, BlockSize::from_chunk_log(4))
}

/// The chunk ranges of the byte range `r` (rounded out to 1 KiB chunks),
/// or all of them.
fn chunks(r: Option<&std::ops::Range<u64>>) -> ChunkRanges {
    match r {
        None => ChunkRanges::all(),
        Some(r) => ChunkRanges::from(ChunkNum::full_chunks(r.start)..ChunkNum::chunks(r.end)),
    }
}

/// Decodes `enc` with bao-tree's decoder: the verified bytes of `range`
/// (the whole entry for `None`), or the decoder's error with what it
/// yielded before it.
fn bao_tree_decode(
    digest: &str,
    size: u64,
    range: Option<&std::ops::Range<u64>>,
    enc: &[u8],
) -> Result<Vec<u8>, (String, Vec<u8>)> {
    let root = blake3::Hash::from_hex(digest).unwrap();
    let want = range.cloned().unwrap_or(0..size);
    let ranges = chunks(range);
    let mut out = Vec::new();
    let mut reader = enc;
    for item in DecodeResponseIter::new(root, tree(size), &mut reader, &ranges) {
        match item {
            Ok(BaoContentItem::Leaf(l)) => {
                let (s, e) = (l.offset, l.offset + l.data.len() as u64);
                let (lo, hi) = (s.max(want.start), e.min(want.end));
                if lo < hi {
                    out.extend_from_slice(&l.data[(lo - s) as usize..(hi - s) as usize]);
                }
            }
            Ok(BaoContentItem::Parent(_)) => {}
            Err(e) => return Err((e.to_string(), out)),
        }
    }
    if !reader.is_empty() {
        return Err(("trailing bytes".into(), out));
    }
    Ok(out)
}

async fn bao_get(s: &Server, path: &str, range: Option<&str>) -> reqwest::Response {
    // No pooled connections: an aborted response's connection is dead.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut req = client.get(s.url(path)).header("accept", BAO);
    if let Some(r) = range {
        req = req.header("range", r);
    }
    req.send().await.unwrap()
}

/// The body, and whether it ended cleanly.
async fn body(mut resp: reqwest::Response) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => got.extend_from_slice(&c),
            Ok(None) => return (got, true),
            Err(_) => return (got, false),
        }
    }
}

/// A bao stream that must not complete: what arrived before the abort
/// (nothing if the connection dropped before the headers, which a server
/// may do when the failure comes before it flushed them).
async fn aborted(s: &Server, path: &str, range: Option<&str>) -> Vec<u8> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut req = client.get(s.url(path)).header("accept", BAO);
    if let Some(r) = range {
        req = req.header("range", r);
    }
    match req.send().await {
        Err(_) => Vec::new(),
        Ok(resp) => {
            assert_eq!(resp.status(), 200);
            let (got, clean) = body(resp).await;
            assert!(!clean, "a stream over a corrupt group ended cleanly");
            got
        }
    }
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn whole_entries_decode_with_bao_tree() {
    let s = start(Opts::default()).await;
    for (i, n) in [0u64, 1, 16384, 16385, 100_000, (1 << 20) + 4321]
        .into_iter()
        .enumerate()
    {
        let data = bytes_of(n, 40 + i as u64);
        let (_t, d) = s.put_ok("bao", data.clone()).await;
        let resp = bao_get(&s, &format!("/v1/blobs/bao/{d}"), None).await;
        assert_eq!(resp.status(), 200, "{n}");
        assert_eq!(header(&resp, "content-type"), Some(BAO));
        assert_eq!(header(&resp, "x-blobpool-digest"), Some(d.as_str()));
        let size = n.to_string();
        assert_eq!(header(&resp, "x-blobpool-size"), Some(size.as_str()));
        assert_eq!(header(&resp, "x-blobpool-bao-range"), None);
        assert_eq!(header(&resp, "vary"), Some("accept"));
        let (enc, clean) = body(resp).await;
        assert!(clean, "{n}");
        // The whole entry's encoding: every pair, then every byte.
        assert_eq!(enc.len() as u64, n + tree(n).outboard_size(), "{n}");
        let got = bao_tree_decode(&d, n, None, &enc).unwrap_or_else(|(e, _)| panic!("{n}: {e}"));
        assert_eq!(got, data, "{n}");
        // Without the Accept header: the plain bytes, as before.
        let plain = s.get(&format!("/v1/blobs/bao/{d}")).await;
        assert_eq!(plain.status(), 200);
        assert_eq!(
            header(&plain, "content-type"),
            Some("application/octet-stream")
        );
        assert_eq!(plain.bytes().await.unwrap(), data);
    }
    assert_eq!(s.ops.metrics().bao_gets(), 6);
}

#[tokio::test]
async fn ranges_decode_with_bao_tree() {
    let s = start(Opts::default()).await;
    for (n, seed) in [(5000u64, 1u64), (100_000, 2), ((1 << 20) + 4321, 3)] {
        let data = bytes_of(n, seed);
        let (_t, d) = s.put_ok("bao", data.clone()).await;
        let mut cases = vec![
            (0, 0),
            (10, 20),
            (1000, 1100),
            (n - 1, n - 1),
            (n - 100, n - 1),
            (0, n - 1),
        ];
        if n > 3 * G {
            cases.extend([
                (G - 10, G + 10),                 // across a group boundary
                (G, 2 * G - 1),                   // exactly one group
                (G + 5, 3 * G + 5),               // several groups
                (n / G * G, n - 1),               // the last, partial group
                (n / G * G - 3, n - 1),           // into it from the one before
                (2 * G + 100, 2 * G + 99 + 1024), // inside one group
            ]);
        }
        for (a, b) in cases {
            let r = format!("bytes={a}-{b}");
            let resp = bao_get(&s, &format!("/v1/blobs/bao/{d}"), Some(&r)).await;
            assert_eq!(resp.status(), 200, "{n} {r}");
            assert_eq!(header(&resp, "content-type"), Some(BAO));
            let br = format!("{a}-{b}");
            assert_eq!(header(&resp, "x-blobpool-bao-range"), Some(br.as_str()));
            let size = n.to_string();
            assert_eq!(header(&resp, "x-blobpool-size"), Some(size.as_str()));
            let (enc, clean) = body(resp).await;
            assert!(clean, "{n} {r}");
            let range = a..b + 1;
            let got = bao_tree_decode(&d, n, Some(&range), &enc)
                .unwrap_or_else(|(e, _)| panic!("{n} {r}: {e}"));
            assert_eq!(got, &data[a as usize..=b as usize], "{n} {r}");
        }
        // Suffix and open-ended forms resolve as for plain gets.
        let resp = bao_get(&s, &format!("/v1/blobs/bao/{d}"), Some("bytes=-7")).await;
        let br = format!("{}-{}", n - 7, n - 1);
        assert_eq!(header(&resp, "x-blobpool-bao-range"), Some(br.as_str()));
        let (enc, _) = body(resp).await;
        let got = bao_tree_decode(&d, n, Some(&(n - 7..n)), &enc).unwrap();
        assert_eq!(got, &data[(n - 7) as usize..]);
        // Unsatisfiable and multiple ranges: 416, as for plain gets.
        let past = format!("bytes={n}-");
        let resp = bao_get(&s, &format!("/v1/blobs/bao/{d}"), Some(&past)).await;
        assert_eq!(
            header(&resp, "content-range"),
            Some(format!("bytes */{n}").as_str())
        );
        assert_error(resp, 416, "invalid_range").await;
        let resp = bao_get(&s, &format!("/v1/blobs/bao/{d}"), Some("bytes=0-1,5-6")).await;
        assert_error(resp, 416, "invalid_range").await;
    }
    // Absent: 404 as ever.
    let zero = "0".repeat(64);
    let resp = bao_get(&s, &format!("/v1/blobs/bao/{zero}"), None).await;
    assert_error(resp, 404, "missing").await;
}

#[tokio::test]
async fn accept_negotiation() {
    let s = start(Opts::default()).await;
    let (_t, d) = s.put_ok("bao", bytes_of(3000, 9)).await;
    let url = s.url(&format!("/v1/blobs/bao/{d}"));
    for (accept, bao) in [
        ("application/x-bao", true),
        ("Application/X-Bao", true),
        ("application/octet-stream, application/x-bao;q=0.9", true),
        ("application/x-bao;q=0", false),
        ("*/*", false),
        ("application/octet-stream", false),
    ] {
        let resp = s
            .http
            .get(&url)
            .header("accept", accept)
            .send()
            .await
            .unwrap();
        let ct = header(&resp, "content-type").unwrap().to_string();
        assert_eq!(ct == BAO, bao, "{accept}: {ct}");
    }
}

#[tokio::test]
async fn a_corrupt_entry_never_decodes_to_wrong_bytes() {
    let s = start(Opts::default()).await;
    let n = (1u64 << 20) + 4321;
    let data = bytes_of(n, 5);
    let (_t, d) = s.put_ok("rot", data.clone()).await;
    let key = store_types::Key::parse("rot", &d).unwrap();
    let path = format!("/v1/blobs/rot/{d}");
    let flip = 10 * G + 500;
    // The local engine keeps the outboard published with the entry, so
    // streams verify only the groups they read. (A clean read first all
    // the same: it warms the store's outboard cache.)
    let (_, clean) = body(bao_get(&s, &path, Some("bytes=0-9")).await).await;
    assert!(clean);
    s.large.corrupt_byte_at(&key, flip).await.unwrap();

    // The whole entry: the stream starts (the first group is sound) and is
    // aborted at the corrupt group; bao-tree's decoder yields only the
    // bytes before it and then fails.
    let enc = aborted(&s, &path, None).await;
    let (_, got) = bao_tree_decode(&d, n, None, &enc).expect_err("decodes despite the flip");
    assert!(
        got.len() as u64 <= flip / G * G,
        "bytes of the corrupt group"
    );
    assert_eq!(&got[..], &data[..got.len()], "only verified bytes");
    assert!(
        eventually(5, || async {
            s.ops.metrics().errors(store_ops::ErrorCode::Verification) >= 1
        })
        .await
    );

    // A range starting in the corrupt group: refused before any byte.
    let r = format!("bytes={}-{}", flip - 10, flip + 10);
    assert_error(bao_get(&s, &path, Some(&r)).await, 422, "verification").await;
    // A range reaching it from a sound group: starts, then aborts.
    let (a, b) = (9 * G, flip + 10);
    let enc = aborted(&s, &path, Some(&format!("bytes={a}-{b}"))).await;
    let (_, got) = bao_tree_decode(&d, n, Some(&(a..b + 1)), &enc).expect_err("decodes");
    assert_eq!(&got[..], &data[a as usize..a as usize + got.len()]);
    assert!(got.len() as u64 <= G);
    // A range away from it is served whole and decodes.
    let resp = bao_get(&s, &path, Some("bytes=0-99999")).await;
    let (enc, clean) = body(resp).await;
    assert!(clean);
    assert_eq!(
        bao_tree_decode(&d, n, Some(&(0..100_000)), &enc).unwrap(),
        &data[..100_000]
    );

    // An entry without a kept outboard (stored before outboards; over
    // 1 MiB, so that it had one to forget, TUNING.md §small-outboards), corrupt before one
    // was ever computed: the whole read that computes it fails, so any
    // stream is refused up front.
    let other = bytes_of(70 * G, 7);
    let (_t, od) = s.put_ok("rot", other).await;
    let okey = store_types::Key::parse("rot", &od).unwrap();
    s.large
        .forget_outboard(&okey)
        .expect("the local engine keeps the outboard beside the entry");
    s.large.corrupt_byte_at(&okey, 3 * G).await.unwrap();
    let resp = bao_get(&s, &format!("/v1/blobs/rot/{od}"), Some("bytes=0-9")).await;
    assert_error(resp, 422, "verification").await;

    // A small (kv) entry is read whole first: corrupt, it is refused
    // before the stream starts.
    let small = bytes_of(600, 6);
    let (_t, sd) = s.put_ok("rot", small).await;
    let skey = store_types::Key::parse("rot", &sd).unwrap();
    s.kv.corrupt_one_byte(&skey).await.unwrap();
    let resp = bao_get(&s, &format!("/v1/blobs/rot/{sd}"), None).await;
    assert_error(resp, 422, "verification").await;
}

#[tokio::test]
async fn a_tampered_stream_fails_bao_tree_decoding() {
    // What a client is protected from even if a server (or the path) sent
    // wrong bytes: bao-tree's decoder refuses them at the group they are in.
    let s = start(Opts::default()).await;
    let n = 200_000u64;
    let data = bytes_of(n, 8);
    let (_t, d) = s.put_ok("bao", data.clone()).await;
    let (mut enc, clean) = body(bao_get(&s, &format!("/v1/blobs/bao/{d}"), None).await).await;
    assert!(clean);
    let ob = tree(n).outboard_size() as usize;
    let at = ob + (5 * G) as usize + 7;
    enc[at] ^= 1;
    let (_, got) = bao_tree_decode(&d, n, None, &enc).expect_err("a flipped byte decodes");
    assert_eq!(&got[..], &data[..got.len()]);
    assert!(got.len() as u64 <= 5 * G);
}
