//! Verified range reads and outboards (issue 15): a range is checked by
//! 16 KiB chunk group against the entry's BLAKE3 outboard, so corruption
//! fails exactly the ranges whose covering groups hold it, and never
//! yields wrong bytes; small entries are verified whole.

use std::ops::Range;
use std::sync::Arc;

use bao_tree::io::outboard::PostOrderMemOutboard;
use bao_tree::BlockSize;
use bytes::Bytes;
use store_core::{Error, Key, Mode, Tier, OUTBOARD_KEPT_ABOVE, WHOLE_VERIFY_MAX};
use store_types::outboard::{GROUP_CHUNK_LOG, GROUP_SIZE};
use store_types::Engine;

use crate::data::content;
use crate::harness::{ns, Harness, Spec, THRESHOLD};

/// Whether the mode accepts a blob of `len` bytes.
fn accepted(h: &Harness, len: u64) -> bool {
    match h.spec.mode() {
        Mode::MemOnly | Mode::DualTier { .. } => true,
        Mode::KvOnly { threshold } => len <= threshold,
    }
}

/// Puts `data`, or asserts the mode rejects it (`None`).
async fn put_or_rejected(h: &Harness, data: &[u8]) -> Option<Key> {
    let res = h.store.put(&ns(), data).await;
    if accepted(h, data.len() as u64) {
        Some(res.expect("put").key().clone())
    } else {
        assert!(
            matches!(
                res,
                Err(Error::TooLarge {
                    limit: THRESHOLD,
                    ..
                })
            ),
            "{}: {} bytes: {res:?}",
            h.spec.name,
            data.len()
        );
        None
    }
}

/// The range's bytes, with an error of opening the read or of reading it
/// alike.
async fn read(h: &Harness, key: &Key, range: Range<u64>) -> store_core::Result<Bytes> {
    let blob = h.store.read_range(key, range.clone()).await?;
    assert!(blob.is_verified());
    assert_eq!(blob.len(), range.end - range.start);
    blob.bytes().await
}

/// `range` of `key` must fail with [`Error::Verification`].
async fn assert_verification(h: &Harness, key: &Key, range: Range<u64>, why: &str) {
    match read(h, key, range.clone()).await {
        Err(Error::Verification { .. }) => {}
        Err(e) => panic!("{}: {range:?} ({why}): {e:?}", h.spec.name),
        Ok(b) => panic!(
            "{}: {range:?} ({why}) yielded {} bytes of a corrupt entry",
            h.spec.name,
            b.len()
        ),
    }
}

/// The engine of the tier holding `key`.
async fn tier_engine(h: &Harness, key: &Key) -> Arc<dyn Engine> {
    let stat = h.store.stat(key).await.unwrap().expect("present");
    match stat.tier {
        Tier::Kv => h.kv_engine(),
        Tier::Large => h.large_engine().expect("a large tier"),
    }
}

/// An entry with one byte flipped in group 7: ranges inside other groups
/// read the right bytes, ranges whose covering groups include group 7 fail
/// with Verification. A fresh store, which has no cached outboard, fails
/// every range when the engine keeps none — always for a 20-group entry
/// (at most 1 MiB: none is kept, TUNING.md §small-outboards), and for a 70-group one (over
/// 1 MiB, which keeps its outboard) on an engine that keeps none (the outboard is then computed from a
/// verified whole read, which the flip fails).
pub async fn range_corruption_is_caught_only_in_covering_groups(spec: Spec) {
    let kept = OUTBOARD_KEPT_ABOVE / GROUP_SIZE as u64;
    for groups in [20, kept + 6] {
        range_corruption_in(spec, groups).await;
    }
}

async fn range_corruption_in(spec: Spec, groups: u64) {
    let h = Harness::open(spec).await;
    let g = GROUP_SIZE as u64;
    let n = groups * g + 123;
    let data = content(31, n as usize);
    let Some(key) = put_or_rejected(&h, &data).await else {
        return;
    };
    // Group-verified (not whole), and in the large tier where there is one.
    let stat = h.store.stat(&key).await.unwrap().expect("present");
    assert!(stat.size > WHOLE_VERIFY_MAX);
    let tier = if h.spec.mem_only {
        Tier::Kv
    } else {
        Tier::Large
    };
    assert_eq!(stat.tier, tier, "{}", h.spec.name);
    // Load (and validate) the outboard before the damage.
    assert_eq!(read(&h, &key, 0..1).await.unwrap(), &data[..1]);
    let ob = h.store.outboard(&key).await.unwrap().expect("outboard");
    assert_eq!(ob.digest(), key.digest);

    let flipped = 7 * g + 100;
    h.corrupt_at(&key, flipped).await;

    for ok in [
        0..1,
        0..g,
        0..7 * g,
        3 * g + 5..5 * g + 7,
        6 * g + 16000..7 * g,
        8 * g..8 * g + 1,
        8 * g..n,
        (groups - 1) * g + 77..n,
        n - 1..n,
    ] {
        let got = read(&h, &key, ok.clone())
            .await
            .unwrap_or_else(|e| panic!("{}: {ok:?} avoids group 7: {e:?}", h.spec.name));
        assert_eq!(
            got,
            &data[ok.start as usize..ok.end as usize],
            "{}: {ok:?}",
            h.spec.name
        );
    }
    for bad in [
        flipped..flipped + 1,
        7 * g..7 * g + 1,
        8 * g - 1..8 * g,
        6 * g + 16000..7 * g + 1,
        7 * g + 200..9 * g,
        0..n,
    ] {
        assert_verification(&h, &key, bad, "covers group 7").await;
    }
    let whole = h.store.get(&key).await.unwrap().expect("present");
    assert!(matches!(
        whole.bytes().await,
        Err(Error::Verification { expected, .. }) if expected == key.digest
    ));

    // A fresh store: no cached outboard.
    let stored = tier_engine(&h, &key)
        .await
        .read_outboard(&key)
        .await
        .unwrap();
    // Entries of at most 1 MiB keep none, on every engine (TUNING.md §small-outboards); larger
    // large-tier ones keep theirs where the engine keeps outboards.
    let kind = tier_engine(&h, &key).await.capabilities().kind;
    if n <= OUTBOARD_KEPT_ABOVE {
        assert_eq!(stored, None, "{}: {n} bytes", h.spec.name);
    } else if tier == Tier::Large && KEEPS_OUTBOARDS.contains(&kind) {
        assert!(
            stored.is_some(),
            "{}: {n} bytes keep an outboard",
            h.spec.name
        );
    }
    let h = h.reopen().await;
    if stored.is_some() {
        assert_eq!(read(&h, &key, 0..g).await.unwrap(), &data[..g as usize]);
        assert_verification(&h, &key, flipped..flipped + 1, "covers group 7").await;
    } else {
        assert_verification(&h, &key, 0..g, "no outboard to check it against").await;
        assert!(matches!(
            h.store.outboard(&key).await,
            Err(Error::Verification { .. })
        ));
    }
}

/// The facade's outboards are bao-tree's post-order outboards with 16 KiB
/// chunk groups, whose root is the digest — as put left them, and as a
/// fresh store computes or loads them.
pub async fn outboards_match_bao_tree(spec: Spec) {
    let h = Harness::open(spec).await;
    let g = GROUP_SIZE;
    let mut keys = Vec::new();
    for (seed, len) in [
        (40u64, 0usize),
        (41, 1),
        (42, g),
        (43, g - 1),
        (44, g + 1),
        (45, 3 * g + 1),
        (46, (1 << 20) + 4321),
        // The last size that keeps no outboard (TUNING.md §small-outboards), and the first
        // that keeps one.
        (47, 1 << 20),
        (48, (1 << 20) + 1),
    ] {
        let data = content(seed, len);
        let Some(key) = put_or_rejected(&h, &data).await else {
            continue;
        };
        let want = PostOrderMemOutboard::create(&data, BlockSize::from_chunk_log(GROUP_CHUNK_LOG));
        assert_eq!(want.root.as_bytes(), key.digest.as_bytes(), "len {len}");
        keys.push((key, want.data));
    }
    assert!(!keys.is_empty());
    check_outboards(&h, &keys, "as put left them").await;
    let h = h.reopen().await;
    check_outboards(&h, &keys, "in a fresh store").await;
}

/// Large engines that publish an outboard with each entry (ADR-032): the
/// example engine keeps none (its entries get theirs lazily).
const KEEPS_OUTBOARDS: [&str; 4] = ["mem", "local", "object", "pg-lo"];

/// Each key's outboard is `want`: the engine's own (for a large-tier entry
/// on an engine that keeps outboards, published with the entry, before
/// any range read) and the store's.
async fn check_outboards(h: &Harness, keys: &[(Key, Vec<u8>)], when: &str) {
    for (key, want) in keys {
        let stat = h.store.stat(key).await.unwrap().expect("present");
        let engine = tier_engine(h, key).await;
        let kept = engine.read_outboard(key).await.unwrap();
        // Entries of at most 1 MiB keep none (ADR-032, TUNING.md §small-outboards).
        let needs = stat.size > OUTBOARD_KEPT_ABOVE;
        if stat.tier == Tier::Large
            && needs
            && KEEPS_OUTBOARDS.contains(&engine.capabilities().kind)
        {
            assert!(
                kept.as_deref() == Some(&want[..]),
                "{}: {key}: the {} engine keeps no outboard, or a wrong one ({when})",
                h.spec.name,
                engine.capabilities().kind
            );
        } else if stat.tier == Tier::Kv || !needs {
            assert_eq!(
                kept, None,
                "{}: kv entries, and entries of at most 1 MiB, keep no outboard",
                h.spec.name
            );
        }
        let ob = h.store.outboard(key).await.unwrap().expect("present");
        assert_eq!(ob.digest(), key.digest);
        assert!(
            ob.outboard()[..] == want[..],
            "{}: {key}: outboard differs from bao-tree's ({when})",
            h.spec.name
        );
    }
}

/// Entries of at most [`WHOLE_VERIFY_MAX`] bytes (every kv entry; a
/// large-tier one that small) are verified whole, so any range of a
/// corrupt one fails with Verification, wherever the damage is.
pub async fn small_range_on_corrupt_entry_fails(spec: Spec) {
    let h = Harness::open(spec).await;
    for (seed, len) in [(50u64, 1000u64), (51, THRESHOLD + 1000)] {
        let data = content(seed, len as usize);
        let Some(key) = put_or_rejected(&h, &data).await else {
            continue;
        };
        assert!(len <= WHOLE_VERIFY_MAX);
        assert_eq!(read(&h, &key, 0..len).await.unwrap(), &data[..]);
        h.corrupt(&key).await;
        for range in [0..1, len - 1..len, 10..20, len / 2..len / 2 + 1, 0..len] {
            assert_verification(&h, &key, range, "small entries are verified whole").await;
        }
    }
}

/// `Engine::read` on each engine of the composite: the engine holding the
/// entry answers its size and a read of exactly what the options plan —
/// the whole entry (also from storage), or `RangeRequest::span`: the whole
/// entry up to `whole_max`, else the covering chunk groups — and the same
/// `InvalidRange` the facade gives; an engine not holding it answers
/// `None`. Twice each, so an engine that caches what it read (local's open
/// files, sqlite's hot entries) answers the second time from its cache the
/// same.
pub async fn read_answers_size_and_span(spec: Spec) {
    use store_types::{RangeRequest, ReadOptions};
    let h = Harness::open(spec).await;
    let g = GROUP_SIZE as u64;
    let mut keys = Vec::new();
    for (i, len) in [0usize, 1000, 3 * GROUP_SIZE + 100, 5 * GROUP_SIZE]
        .into_iter()
        .enumerate()
    {
        let data = content(700 + i as u64, len);
        if let Some(k) = put_or_rejected(&h, &data).await {
            keys.push((k, data));
        }
    }
    let absent = Key::new(ns(), store_types::Digest::of(b"never stored"));
    let engines: Vec<Arc<dyn Engine>> = std::iter::once(h.kv_engine())
        .chain(h.large_engine())
        .collect();
    for engine in &engines {
        let req = RangeRequest::new(0..0, WHOLE_VERIFY_MAX);
        for options in [
            ReadOptions::range(req),
            ReadOptions::whole(),
            ReadOptions::stored(),
        ] {
            let got = engine.read(&absent, &options).await.unwrap();
            assert!(got.is_none(), "{}: absent key, {options:?}", spec.name);
        }
    }
    for (key, data) in &keys {
        let size = data.len() as u64;
        let ranges = [
            0..size,
            size / 2..size,
            size / 3..(size / 3 + 1).min(size),
            (g + 5).min(size)..(2 * g + 7).min(size),
        ];
        for engine in &engines {
            let holds = engine.meta(key).await.unwrap().is_some();
            for options in [ReadOptions::whole(), ReadOptions::stored()] {
                let what = format!("{}: {size} bytes, {options:?}", spec.name);
                for _round in 0..2 {
                    let got = engine.read(key, &options).await.unwrap();
                    let Some(read) = got else {
                        assert!(!holds, "{what}: None from the engine holding it");
                        continue;
                    };
                    assert!(holds, "{what}: answered by an engine without it");
                    assert_eq!((read.size, read.span.clone()), (size, 0..size), "{what}");
                    let bytes = read.reader.into_bytes(size + 1).await.unwrap();
                    assert!(bytes == data[..], "{what}: wrong bytes");
                }
            }
            for whole_max in [WHOLE_VERIFY_MAX, 0] {
                for range in ranges.clone() {
                    let req = RangeRequest::new(range.clone(), whole_max);
                    for round in 0..2 {
                        let what = format!(
                            "{}: {size} bytes, {range:?}, whole_max {whole_max}, round {round}",
                            spec.name
                        );
                        let options = ReadOptions::range(req.clone());
                        let got = engine.read(key, &options).await.unwrap();
                        let Some(read) = got else {
                            assert!(!holds, "{what}: None from the engine holding it");
                            continue;
                        };
                        assert!(holds, "{what}: answered by an engine without it");
                        let want = req.span(size).unwrap();
                        assert_eq!(read.size, size, "{what}");
                        assert_eq!(read.span, want, "{what}");
                        assert_eq!(read.reader.len(), want.end - want.start, "{what}");
                        let buf = read.reader.into_bytes(size + 1).await.unwrap();
                        assert!(
                            buf == data[want.start as usize..want.end as usize],
                            "{what}: wrong bytes"
                        );
                    }
                }
                let bad = RangeRequest::new(size..size + 1, whole_max);
                match engine.read(key, &ReadOptions::range(bad)).await {
                    Ok(None) if !holds => {}
                    Err(Error::InvalidRange {
                        start,
                        end,
                        size: s,
                    }) if holds => {
                        assert_eq!((start, end, s), (size, size + 1, size), "{}", spec.name);
                    }
                    other => panic!("{}: {size} bytes, range past the end: {other:?}", spec.name),
                }
            }
        }
    }
}
