//! Put / get / stat / has / read_range / delete semantics (issue 2).

use std::sync::Arc;

use store_core::{Error, Key, Mode, Tier};
use store_types::{Digest, Namespace};
use tokio::io::AsyncReadExt;

use crate::data::{content, PatternReader, Untouched};
use crate::harness::{ns, Harness, Spec, THRESHOLD};

/// The tier a blob of `len` bytes lands in, or `None` when the mode rejects
/// it.
fn expected_tier(h: &Harness, len: u64) -> Option<Tier> {
    match h.spec.mode() {
        Mode::MemOnly => Some(Tier::Kv),
        Mode::KvOnly { threshold } => (len <= threshold).then_some(Tier::Kv),
        Mode::DualTier { threshold } => Some(if len <= threshold {
            Tier::Kv
        } else {
            Tier::Large
        }),
    }
}

async fn assert_absent(h: &Harness, key: &Key) {
    assert!(
        !h.store.has(key).await.unwrap(),
        "{key} must not be visible"
    );
    assert!(h.store.get(key).await.unwrap().is_none());
    assert!(h.store.stat(key).await.unwrap().is_none());
    assert_eq!(h.stage_files().await, 0, "no stage file may be left behind");
}

/// Small put, get, stat round trip.
pub async fn put_get_round_trip(spec: Spec) {
    let h = Harness::open(spec).await;
    let data = content(1, 1000);
    let r = h
        .store
        .put_opts(
            &ns(),
            &data[..],
            store_core::PutOptions {
                len: Some(data.len() as u64),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(r.digest, Digest::of(&data));
    assert_eq!(r.size, 1000);
    assert_eq!(r.tier, Tier::Kv);
    assert!(!r.deduplicated);
    let key = Key::new(ns(), r.digest);
    let blob = h.store.get(&key).await.unwrap().unwrap();
    assert!(blob.is_verified());
    assert_eq!(blob.len(), 1000);
    assert_eq!(blob.bytes().await.unwrap(), data);
    let blob = h.store.get(&key).await.unwrap().unwrap();
    assert_eq!(
        read_chunks(blob, 0).await.unwrap(),
        (1000, Digest::of(&data))
    );
    let st = h.store.stat(&key).await.unwrap().unwrap();
    assert_eq!((st.size, st.tier), (1000, Tier::Kv));
}

/// Blobs at threshold−1, threshold, threshold+1 with known and unknown
/// lengths land in the right tier (or are rejected in kv-only mode).
pub async fn threshold_boundaries(spec: Spec) {
    let h = Harness::open(spec).await;
    for (i, len) in [THRESHOLD - 1, THRESHOLD, THRESHOLD + 1]
        .into_iter()
        .enumerate()
    {
        for known in [true, false] {
            let data = content(10 + i as u64 + if known { 100 } else { 0 }, len as usize);
            let declared = known.then_some(len);
            let res = h
                .store
                .put_opts(
                    &ns(),
                    &data[..],
                    store_core::PutOptions {
                        len: declared,
                        ..Default::default()
                    },
                )
                .await;
            match expected_tier(&h, len) {
                Some(tier) => {
                    let r = res.unwrap_or_else(|e| panic!("len {len} known {known}: {e}"));
                    assert_eq!(r.tier, tier, "len {len} known {known}");
                    let key = Key::new(ns(), r.digest);
                    assert_eq!(h.store.stat(&key).await.unwrap().unwrap().tier, tier);
                    let got = h.store.get(&key).await.unwrap().unwrap();
                    assert_eq!(got.tier(), tier);
                    assert_eq!(got.bytes().await.unwrap(), data);
                }
                None => {
                    assert!(
                        matches!(
                            res,
                            Err(Error::TooLarge {
                                limit: THRESHOLD,
                                ..
                            })
                        ),
                        "len {len} known {known}: {res:?}"
                    );
                    assert_absent(&h, &Key::new(ns(), Digest::of(&data))).await;
                }
            }
        }
    }
}

/// kv-only rejects a known over-threshold length before reading the body.
pub async fn over_threshold_known_length_rejected_at_once(spec: Spec) {
    let h = Harness::open(spec).await;
    let body = Untouched::default();
    let res = h
        .store
        .put_opts(
            &ns(),
            body.clone(),
            store_core::PutOptions {
                len: Some(THRESHOLD + 1),
                ..Default::default()
            },
        )
        .await;
    match h.spec.mode() {
        Mode::KvOnly { .. } => {
            assert!(matches!(res, Err(Error::TooLarge { got, .. }) if got == THRESHOLD + 1));
            assert!(!body.was_read(), "the body must not be read");
        }
        // The other modes accept the size; the lying body (it never ends
        // and never matches) must then fail the length check.
        _ => {
            assert!(
                matches!(res, Err(Error::LengthMismatch { declared, .. }) if declared == THRESHOLD + 1),
                "{res:?}"
            );
            assert_eq!(h.stage_files().await, 0);
        }
    }
}

/// The empty blob is a valid entry.
pub async fn empty_blob(spec: Spec) {
    let h = Harness::open(spec).await;
    for declared in [Some(0), None] {
        let r = h
            .store
            .put_opts(
                &ns(),
                &b""[..],
                store_core::PutOptions {
                    len: declared,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(r.digest, Digest::of(b""));
        assert_eq!((r.size, r.tier), (0, Tier::Kv));
        let key = Key::new(ns(), r.digest);
        let blob = h.store.get(&key).await.unwrap().unwrap();
        assert!(blob.is_empty());
        assert!(blob.bytes().await.unwrap().is_empty());
        assert_eq!(h.store.read_range(&key, 0..0).await.unwrap().len(), 0);
    }
}

/// Identical content is stored once; the second put reports dedup and pins.
pub async fn dedup(spec: Spec) {
    let h = Harness::open(spec).await;
    for len in [100usize, THRESHOLD as usize + 500] {
        let data = content(3, len);
        let a = h.store.put(&ns(), &data[..]).await;
        let Some(tier) = expected_tier(&h, len as u64) else {
            assert!(matches!(a, Err(Error::TooLarge { .. })));
            continue;
        };
        let a = a.unwrap();
        let b = h
            .store
            .put_opts(
                &ns(),
                &data[..],
                store_core::PutOptions {
                    len: Some(len as u64),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(a.digest, b.digest);
        assert_eq!((a.tier, b.tier), (tier, tier));
        assert!(!a.deduplicated);
        assert!(b.deduplicated, "second put of the same bytes deduplicates");
        assert_eq!(
            h.store.gc().pin_count(a.key()),
            2,
            "both receipts pin the entry"
        );
        drop(a);
        assert_eq!(h.store.gc().pin_count(b.key()), 1);
        let page = match tier {
            Tier::Kv => h.kv_engine(),
            Tier::Large => h.large_engine().unwrap(),
        }
        .scan(&ns(), None, 100)
        .await
        .unwrap();
        assert_eq!(
            page.iter().filter(|(d, _)| *d == b.digest).count(),
            1,
            "exactly one entry"
        );
    }
}

/// The same bytes in two namespaces are two entries.
pub async fn namespaces_are_independent(spec: Spec) {
    let h = Harness::open(spec).await;
    let other = Namespace::new("other.ns-1").unwrap();
    let data = content(4, 300);
    let a = h.store.put(&ns(), &data[..]).await.unwrap();
    let b = h.store.put(&other, &data[..]).await.unwrap();
    assert!(
        !b.deduplicated,
        "a different namespace is a different entry"
    );
    drop((a, b));
    h.store
        .delete(&Key::new(other.clone(), Digest::of(&data)))
        .await
        .unwrap();
    assert!(h
        .store
        .has(&Key::new(ns(), Digest::of(&data)))
        .await
        .unwrap());
    assert!(!h
        .store
        .has(&Key::new(other, Digest::of(&data)))
        .await
        .unwrap());
}

/// Misses: get/stat answer None; read_range/delete answer Missing.
pub async fn missing_entries(spec: Spec) {
    let h = Harness::open(spec).await;
    let key = Key::new(ns(), Digest::of(b"never stored"));
    assert!(h.store.get(&key).await.unwrap().is_none());
    assert!(h.store.stat(&key).await.unwrap().is_none());
    assert!(!h.store.has(&key).await.unwrap());
    assert!(matches!(
        h.store.read_range(&key, 0..1).await,
        Err(Error::Missing)
    ));
    assert!(matches!(h.store.delete(&key).await, Err(Error::Missing)));
}

/// has_many is index-aligned across both tiers, with duplicates and misses.
pub async fn has_many_index_aligned(spec: Spec) {
    let h = Harness::open(spec).await;
    let small = content(5, 10);
    let big = content(6, THRESHOLD as usize + 1);
    let rs = h.store.put(&ns(), &small[..]).await.unwrap();
    let big_stored = h.store.put(&ns(), &big[..]).await.is_ok();
    let absent = Digest::of(b"absent");
    let ask = [absent, rs.digest, Digest::of(&big), absent, rs.digest];
    let got = h.store.has_many(&ns(), &ask).await.unwrap();
    assert_eq!(got, vec![false, true, big_stored, false, true]);
    assert_eq!(
        big_stored,
        expected_tier(&h, big.len() as u64).is_some(),
        "the large blob is stored exactly when the mode allows it"
    );
    assert!(h.store.has_many(&ns(), &[]).await.unwrap().is_empty());
    let many: Vec<Digest> = (0..1000u32).map(|i| Digest::of(&i.to_le_bytes())).collect();
    assert_eq!(
        h.store.has_many(&ns(), &many).await.unwrap(),
        vec![false; 1000]
    );
}

/// Ranged reads in both tiers: first byte, last byte, middle, whole, empty,
/// and out-of-range requests.
pub async fn read_ranges(spec: Spec) {
    let h = Harness::open(spec).await;
    for (seed, len) in [(7u64, 1000usize), (8, 3 * THRESHOLD as usize + 17)] {
        let data = content(seed, len);
        let Ok(r) = h.store.put(&ns(), &data[..]).await else {
            assert!(expected_tier(&h, len as u64).is_none());
            continue;
        };
        let key = Key::new(ns(), r.digest);
        let n = len as u64;
        for range in [0..1, n - 1..n, 3..n / 2, 0..n, 5..5, n..n] {
            let blob = h.store.read_range(&key, range.clone()).await.unwrap();
            assert!(blob.is_verified());
            assert_eq!(blob.len(), range.end - range.start);
            let got = blob.bytes().await.unwrap();
            assert_eq!(
                got,
                &data[range.start as usize..range.end as usize],
                "{range:?}"
            );
        }
        #[allow(clippy::reversed_empty_ranges)] // a reversed range is one of the bad inputs
        let bad_ranges = [0..n + 1, n + 1..n + 2, 5..4];
        for bad in bad_ranges {
            assert!(
                matches!(
                    h.store.read_range(&key, bad.clone()).await,
                    Err(Error::InvalidRange { size, .. }) if size == n
                ),
                "{bad:?} must be rejected"
            );
        }
    }
}

/// Delete removes the entry from whichever tier holds it; a pinned entry
/// is refused.
pub async fn delete_semantics(spec: Spec) {
    let h = Harness::open(spec).await;
    for len in [50usize, THRESHOLD as usize + 50] {
        let data = content(9, len);
        let Ok(r) = h.store.put(&ns(), &data[..]).await else {
            continue;
        };
        let key = r.key().clone();
        assert!(matches!(
            h.store.delete(&key).await,
            Err(Error::GcRefuse {
                reason: store_types::ProtectReason::Pinned,
                ..
            })
        ));
        assert!(h.store.has(&key).await.unwrap(), "refusal deletes nothing");
        drop(r);
        h.store.delete(&key).await.unwrap();
        assert_absent(&h, &key).await;
        assert!(matches!(h.store.delete(&key).await, Err(Error::Missing)));
    }
}

/// An expected digest that matches is accepted; one that does not fails
/// with Verification and publishes nothing.
pub async fn expected_digest(spec: Spec) {
    let h = Harness::open(spec).await;
    for len in [64usize, THRESHOLD as usize * 2] {
        let data = content(11, len);
        let wrong = Digest::of(b"something else");
        let res = h
            .store
            .put_opts(
                &ns(),
                &data[..],
                store_core::PutOptions {
                    len: Some(len as u64),
                    expect: Some(wrong),
                },
            )
            .await;
        if expected_tier(&h, len as u64).is_none() {
            assert!(matches!(res, Err(Error::TooLarge { .. })));
            continue;
        }
        assert!(
            matches!(res, Err(Error::Verification { expected, actual }) if expected == wrong && actual == Digest::of(&data)),
            "{res:?}"
        );
        assert_absent(&h, &Key::new(ns(), Digest::of(&data))).await;
        let ok = h
            .store
            .put_opts(
                &ns(),
                &data[..],
                store_core::PutOptions {
                    expect: Some(Digest::of(&data)),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(ok.digest, Digest::of(&data));
    }
}

/// `put_bytes` stores what `put` stores, in the same tier, under the same
/// key: small, at the threshold, above it, and large enough to be hashed on
/// the pool; a second put deduplicates; a wrong expected digest fails and
/// stores nothing; a body too large for the mode is refused.
pub async fn put_bytes_matches_put(spec: Spec) {
    let h = Harness::open(spec).await;
    for len in [
        0usize,
        100,
        THRESHOLD as usize,
        THRESHOLD as usize + 1,
        5 << 20,
    ] {
        let data = bytes::Bytes::from(content(16, len));
        let wrong = Digest::of(b"something else");
        let res = h
            .store
            .put_bytes_opts(
                &ns(),
                data.clone(),
                store_core::PutOptions {
                    expect: Some(wrong),
                    ..Default::default()
                },
            )
            .await;
        let Some(tier) = expected_tier(&h, len as u64) else {
            assert!(
                matches!(res, Err(Error::TooLarge { got, .. }) if got == len as u64),
                "len {len}: {res:?}"
            );
            continue;
        };
        assert!(
            matches!(res, Err(Error::Verification { expected, actual }) if expected == wrong && actual == Digest::of(&data)),
            "len {len}: {res:?}"
        );
        let key = Key::new(ns(), Digest::of(&data));
        assert_absent(&h, &key).await;
        let r = h
            .store
            .put_bytes_opts(
                &ns(),
                data.clone(),
                store_core::PutOptions {
                    expect: Some(key.digest),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!((r.digest, r.size, r.tier), (key.digest, len as u64, tier));
        assert!(!r.deduplicated, "len {len}");
        let blob = h.store.get(&key).await.unwrap().expect("stored");
        let got = blob.bytes().await.unwrap();
        assert_eq!((r.tier, &got), (tier, &data), "len {len}");
        if h.spec.mem_only && len > 0 {
            // The mem engine keeps the caller's very buffer: no copy in,
            // none out.
            assert_eq!(got.as_ptr(), data.as_ptr(), "len {len}");
        }
        // The same body through `put` finds it, and `put_bytes` again too.
        let again = h.store.put(&ns(), &data[..]).await.unwrap();
        assert!(
            again.deduplicated && again.digest == key.digest,
            "len {len}"
        );
        let again = h.store.put_bytes(&ns(), data).await.unwrap();
        assert!(again.deduplicated && again.tier == tier, "len {len}");
    }
}

/// A declared length that disagrees with the body fails and publishes
/// nothing, whether the body is shorter or longer, small or large.
pub async fn lying_lengths(spec: Spec) {
    let h = Harness::open(spec).await;
    for len in [0usize, 100, THRESHOLD as usize, THRESHOLD as usize * 3] {
        let data = content(12, len);
        // u64::MAX: the largest declaration must not overflow the
        // pipeline's one-byte-past read limit (found by fuzz/put).
        let mut lies = vec![len as u64 + 1, len as u64 + 1000, u64::MAX];
        if len > 0 {
            lies.push(len as u64 - 1);
            lies.push(0);
        }
        for declared in lies {
            let res = h
                .store
                .put_opts(
                    &ns(),
                    &data[..],
                    store_core::PutOptions {
                        len: Some(declared),
                        ..Default::default()
                    },
                )
                .await;
            let rejected_by_mode = expected_tier(&h, declared).is_none();
            assert!(
                matches!(res, Err(Error::LengthMismatch { declared: d, .. }) if d == declared)
                    || (rejected_by_mode && matches!(res, Err(Error::TooLarge { .. }))),
                "len {len} declared {declared}: {res:?}"
            );
            // A body in memory is checked against the declaration first.
            let options = store_core::PutOptions {
                len: Some(declared),
                ..Default::default()
            };
            let bytes = bytes::Bytes::copy_from_slice(&data);
            let res = h.store.put_bytes_opts(&ns(), bytes, options).await;
            assert!(
                matches!(res, Err(Error::LengthMismatch { declared: d, actual })
                    if d == declared && actual == len as u64),
                "put_bytes_opts: len {len} declared {declared}: {res:?}"
            );
            assert_absent(&h, &Key::new(ns(), Digest::of(&data))).await;
        }
    }
}

/// Bytes corrupted after publish make `get` fail with Verification.
pub async fn corruption_detected(spec: Spec) {
    let h = Harness::open(spec).await;
    // 300 KiB: beyond one 256 KiB chunk, so an engine that hashes on its
    // own thread does (local reads it whole and hashes it in one call); 2 MiB:
    // beyond that too, so it streams and hashes on its read-ahead thread.
    for len in [0usize, 200, THRESHOLD as usize + 1000, 300 << 10, 2 << 20] {
        let data = content(13, len);
        let Ok(r) = h.store.put(&ns(), &data[..]).await else {
            continue;
        };
        let key = r.key().clone();
        h.corrupt(&key).await;
        let blob = h.store.get(&key).await.unwrap().expect("still present");
        let err = blob.bytes().await.unwrap_err();
        assert!(
            matches!(err, Error::Verification { expected, .. } if expected == key.digest),
            "len {len}: {err:?}"
        );
        // Read as a stream instead of whole, the same entry fails at EOF.
        let mut blob = h.store.get(&key).await.unwrap().expect("still present");
        let err = Error::from(blob.read_to_end(&mut Vec::new()).await.unwrap_err());
        assert!(
            matches!(err, Error::Verification { expected, .. } if expected == key.digest),
            "len {len}, streamed: {err:?}"
        );
        // Taken chunk by chunk (TUNING.md §response-chunks: the engine's own buffers where it
        // reads ahead), the call that would end the read fails instead.
        let blob = h.store.get(&key).await.unwrap().expect("still present");
        let err = read_chunks(blob, 0).await.unwrap_err();
        assert!(
            matches!(err, Error::Verification { expected, .. } if expected == key.digest),
            "len {len}, chunked: {err:?}"
        );
    }
}

/// Reads `blob` with [`Blob::next_chunk`](store_core::Blob::next_chunk)
/// after `head` bytes through its `AsyncRead` view (the two views share a
/// position): the byte count and the digest of all the bytes.
async fn read_chunks(mut blob: store_core::Blob, head: usize) -> Result<(u64, Digest), Error> {
    let mut hasher = blake3::Hasher::new();
    let mut first = vec![0u8; head];
    blob.read_exact(&mut first).await?;
    hasher.update(&first);
    let mut total = head as u64;
    while let Some(chunk) = blob.next_chunk().await? {
        assert!(!chunk.is_empty(), "next_chunk yields no empty chunk");
        total += chunk.len() as u64;
        hasher.update(&chunk);
    }
    // The end stays the end.
    assert!(blob.next_chunk().await?.is_none());
    Ok((total, Digest::from(hasher.finalize())))
}

/// A reader that fails mid-stream leaves nothing visible and no stage file.
pub async fn failing_reader_leaves_nothing(spec: Spec) {
    let h = Harness::open(spec).await;
    for (len, at) in [
        (1000u64, 500u64),
        (THRESHOLD * 4, THRESHOLD * 2),
        (THRESHOLD * 4, 10),
    ] {
        for declared in [Some(len), None] {
            let res = h
                .store
                .put_opts(
                    &ns(),
                    PatternReader::failing_at(14, len, at),
                    store_core::PutOptions {
                        len: declared,
                        ..Default::default()
                    },
                )
                .await;
            let rejected_by_mode = expected_tier(&h, len).is_none();
            assert!(
                matches!(res, Err(Error::Io(_)))
                    || (rejected_by_mode && matches!(res, Err(Error::TooLarge { .. }))),
                "{res:?}"
            );
            assert_absent(&h, &Key::new(ns(), PatternReader::digest(14, len))).await;
        }
    }
}

/// A 64 MiB blob of unknown length streams in and out, verified.
pub async fn large_streamed_blob(spec: Spec) {
    let h = Harness::open(spec).await;
    let len = 64u64 << 20;
    let digest = PatternReader::digest(15, len);
    let res = h.store.put(&ns(), PatternReader::new(15, len)).await;
    if expected_tier(&h, len).is_none() {
        assert!(
            matches!(res, Err(Error::TooLarge { limit: THRESHOLD, got }) if got == THRESHOLD + 1)
        );
        assert_absent(&h, &Key::new(ns(), digest)).await;
        return;
    }
    let r = res.unwrap();
    assert_eq!((r.digest, r.size), (digest, len));
    let mut blob = h.store.get(r.key()).await.unwrap().unwrap();
    assert_eq!(blob.len(), len);
    let mut hasher = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = blob.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    assert_eq!(total, len);
    assert_eq!(Digest::from(hasher.finalize()), digest);
    // Chunk by chunk, after a head read through the byte view.
    let blob = h.store.get(r.key()).await.unwrap().unwrap();
    assert_eq!(read_chunks(blob, 1000).await.unwrap(), (len, digest));
    let mid = h
        .store
        .read_range(r.key(), (len / 2)..(len / 2 + 4096))
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(mid.len(), 4096);
}

/// Concurrent puts of identical content: all succeed, exactly one writes.
pub async fn concurrent_identical_puts(spec: Spec) {
    let h = Arc::new(Harness::open(spec).await);
    for len in [500usize, THRESHOLD as usize * 2 + 3] {
        if expected_tier(&h, len as u64).is_none() {
            continue;
        }
        let data = Arc::new(content(16 + len as u64, len));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let h = h.clone();
                let data = data.clone();
                tokio::spawn(async move { h.store.put(&ns(), &data[..]).await })
            })
            .collect();
        let mut receipts = Vec::new();
        for t in tasks {
            receipts.push(t.await.unwrap().unwrap());
        }
        let fresh = receipts.iter().filter(|r| !r.deduplicated).count();
        assert_eq!(fresh, 1, "len {len}: exactly one put writes");
        assert_eq!(h.store.gc().pin_count(receipts[0].key()), 16);
        let got = h.store.get(receipts[0].key()).await.unwrap().unwrap();
        assert_eq!(got.bytes().await.unwrap(), &data[..]);
        assert_eq!(h.stage_files().await, 0);
    }
}

/// Malformed digests and namespaces are KeyInvalid.
pub async fn malformed_keys(spec: Spec) {
    let _h = Harness::open(spec).await;
    let good = Digest::of(b"x").to_hex();
    assert!(matches!(
        Key::parse("contract", &good.to_uppercase()),
        Err(Error::KeyInvalid(_))
    ));
    assert!(matches!(
        Key::parse("../etc", &good),
        Err(Error::KeyInvalid(_))
    ));
    assert!(matches!(
        Key::parse("contract", "abc"),
        Err(Error::KeyInvalid(_))
    ));
    Key::parse("contract", &good).unwrap();
}
