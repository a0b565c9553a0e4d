//! Probe for TUNING.md §small-outboards (not a test): what a verified 4 KiB `read_range`
//! costs when the store has no validated outboard cached (cache budget 0,
//! so every read misses), for a local entry of exactly 1 MiB — which keeps
//! no outboard and has it computed from one verified whole read — against
//! one of 1 MiB + 16 KiB, which loads and validates its kept outboard; with
//! the cached-outboard read of the 1 MiB entry alongside. Alternating
//! rounds of one run.
//!
//! `cargo run --release -p tests-contract --example outboard_miss_probe [dir]`

use std::time::Instant;

use store_core::{Key, Mode, Store, OUTBOARD_KEPT_ABOVE};
use store_local::{LocalEngine, LocalOptions};
use tests_contract::data::content;
use tests_contract::ns_named;

/// A store over a fresh local engine under `root` with an outboard cache
/// of `cache` bytes, holding an entry of exactly 1 MiB and one of 1 MiB +
/// 16 KiB; their keys.
async fn store(root: &std::path::Path, cache: usize) -> (Store, Key, Key) {
    let large = LocalEngine::open(root, LocalOptions::default())
        .await
        .unwrap();
    let s = Store::builder()
        .kv(store_mem::MemEngine::new())
        .large(large)
        .mode(Mode::DualTier { threshold: 0 })
        .outboard_cache_bytes(cache)
        .build()
        .await
        .unwrap();
    let n = OUTBOARD_KEPT_ABOVE as usize;
    let mut keys = Vec::new();
    for data in [content(1, n), content(2, n + 16384)] {
        let r = s.put(&ns_named("p"), &data[..]).await.unwrap();
        keys.push(r.key().clone());
    }
    (s, keys[0].clone(), keys[1].clone())
}

const N: u64 = 2_000;

async fn rate(s: &Store, key: &Key) -> f64 {
    let t = Instant::now();
    for i in 0..N {
        let at = (i * 7919) % 240 * 4096;
        let b = s.read_range(key, at..at + 4096).await.unwrap();
        assert_eq!(b.bytes().await.unwrap().len(), 4096);
    }
    N as f64 / t.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let base = std::env::args().nth(1).map(std::path::PathBuf::from);
    let dir = tempfile::tempdir_in(base.unwrap_or_else(std::env::temp_dir)).unwrap();
    let (miss, small, large) = store(&dir.path().join("miss"), 0).await;
    let (hit, hit_small, _) = store(&dir.path().join("hit"), 64 << 20).await;
    for round in 0..3 {
        let computed = rate(&miss, &small).await;
        let loaded = rate(&miss, &large).await;
        let cached = rate(&hit, &hit_small).await;
        println!(
            "round {round}: 4 KiB range, outboard not cached: 1 MiB entry (computed) \
             {computed:.0}/s, 1 MiB + 16 KiB entry (loaded) {loaded:.0}/s \
             ({:.2}×); cached, 1 MiB entry {cached:.0}/s",
            computed / loaded
        );
    }
}
