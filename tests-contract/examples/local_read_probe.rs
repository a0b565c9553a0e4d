//! Probe for TUNING.md §local-small-reads (not a test): verified 4 KiB `read_range` of a 64 MiB
//! local entry and verified 1 KiB gets, with the open-file cache on (inline
//! reads) and off (one blocking call), against open+pread / a whole-file
//! read, in alternating rounds of one run.
//!
//! `cargo run --release -p tests-contract --example local_read_probe [dir]`
//!
//! With `PROBE_RANGE_ONLY=1` it runs only the cached verified range reads
//! (a million of them), for `perf record`.

use std::os::unix::fs::FileExt;
use std::time::Instant;

use store_core::{Mode, Store};
use store_local::{LocalEngine, LocalOptions};
use tests_contract::data::content;
use tests_contract::ns_named;

async fn store(root: &std::path::Path, open_files: usize) -> Store {
    let large = LocalEngine::open(
        root,
        LocalOptions {
            open_files,
            ..LocalOptions::default()
        },
    )
    .await
    .unwrap();
    Store::builder()
        .kv(store_mem::MemEngine::new())
        .large(large)
        .mode(Mode::DualTier { threshold: 0 })
        .build()
        .await
        .unwrap()
}

const N: u64 = 20_000;

fn offset(i: u64) -> u64 {
    ((i * 7919) % (64 * 1024 / 4)) * 4096
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let base = std::env::args().nth(1).map(std::path::PathBuf::from);
    let dir = tempfile::tempdir_in(base.unwrap_or_else(std::env::temp_dir)).unwrap();
    let on = store(&dir.path().join("on"), 256).await;
    let off = store(&dir.path().join("off"), 0).await;
    let big = content(1, 64 << 20);
    let small = content(2, 1024);
    let mut keys = Vec::new();
    for s in [&on, &off] {
        let b = s.put(&ns_named("p"), &big[..]).await.unwrap();
        let k = s.put(&ns_named("p"), &small[..]).await.unwrap();
        keys.push((b.key().clone(), k.key().clone()));
    }
    let raw_big = dir.path().join("raw-big");
    let raw_small = dir.path().join("raw-small");
    std::fs::write(&raw_big, &big).unwrap();
    std::fs::write(&raw_small, &small).unwrap();
    if std::env::var_os("PROBE_RANGE_ONLY").is_some() {
        let t = Instant::now();
        for i in 0..50 * N {
            let o = offset(i);
            let r = on.read_range(&keys[0].0, o..o + 4096).await.unwrap();
            assert_eq!(r.bytes().await.unwrap().len(), 4096);
        }
        println!("{:.0} ops/s", (50 * N) as f64 / t.elapsed().as_secs_f64());
        return;
    }
    let mut best = std::collections::BTreeMap::<&str, f64>::new();
    for _round in 0..5 {
        let t = Instant::now();
        for i in 0..N {
            let f = std::fs::File::open(&raw_big).unwrap();
            let mut b = vec![0u8; 4096];
            f.read_exact_at(&mut b, offset(i)).unwrap();
        }
        let r = N as f64 / t.elapsed().as_secs_f64();
        let e = best.entry("range raw open+pread").or_default();
        *e = e.max(r);
        for (name, s, k) in [
            ("range cache on", &on, &keys[0].0),
            ("range cache off", &off, &keys[1].0),
        ] {
            let t = Instant::now();
            for i in 0..N {
                let o = offset(i);
                let b = s
                    .read_range(k, o..o + 4096)
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                assert_eq!(b.len(), 4096);
            }
            let r = N as f64 / t.elapsed().as_secs_f64();
            let e = best.entry(name).or_default();
            *e = e.max(r);
        }
        let t = Instant::now();
        for _ in 0..N {
            let v = std::fs::read(&raw_small).unwrap();
            assert_eq!(v.len(), 1024);
        }
        let r = N as f64 / t.elapsed().as_secs_f64();
        let e = best.entry("get 1 KiB raw read").or_default();
        *e = e.max(r);
        for (name, s, k) in [
            ("get 1 KiB cache on", &on, &keys[0].1),
            ("get 1 KiB cache off", &off, &keys[1].1),
        ] {
            let t = Instant::now();
            for _ in 0..N {
                let b = s.get(k).await.unwrap().unwrap().bytes().await.unwrap();
                assert_eq!(b.len(), 1024);
            }
            let r = N as f64 / t.elapsed().as_secs_f64();
            let e = best.entry(name).or_default();
            *e = e.max(r);
        }
    }
    for (k, v) in &best {
        println!("{k:24} {:>10.0} ops/s", v);
    }
    let raw = best["range raw open+pread"];
    println!(
        "range: cache on {:.3}x raw, cache off {:.3}x raw",
        best["range cache on"] / raw,
        best["range cache off"] / raw
    );
    let raw = best["get 1 KiB raw read"];
    println!(
        "get 1 KiB: cache on {:.3}x raw, cache off {:.3}x raw",
        best["get 1 KiB cache on"] / raw,
        best["get 1 KiB cache off"] / raw
    );
}
