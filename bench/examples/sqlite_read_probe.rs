//! Probe of the SQLite engine's point reads on the working-set population
//! (ADR-055): reads 1 KiB entries of `target/bench-workset` uniformly at
//! random for a few seconds and prints the rate and
//! `SqliteEngine::read_path` (inline, fell back, pooled).
//!
//! `cargo run --release -p bench --example sqlite_read_probe -- [seconds] [dir]`

use std::time::{Duration, Instant};

use bench::fixtures::ns;
use rand::Rng;
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Digest, EngineExt as _, Key};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let secs: u64 = args.next().map_or(5, |s| s.parse().expect("seconds"));
    let dir = args.next().unwrap_or_else(|| "target/bench-workset".into());
    let manifest = std::fs::read_to_string(format!("{dir}/manifest.txt")).expect("manifest");
    let keys: Vec<Key> = manifest
        .lines()
        .filter(|l| l.starts_with("1024 "))
        .map(|l| {
            let hex = l.split(' ').nth(1).expect("digest");
            Key::new(ns(), hex.parse::<Digest>().expect("hex"))
        })
        .collect();
    let options = SqliteOptions {
        cache_bytes: 0,
        ..SqliteOptions::default()
    };
    let e = SqliteEngine::open(format!("{dir}/bp-default/kv.sqlite"), options)
        .await
        .expect("open");
    let mut rng = rand::rng();
    for round in 0..3 {
        let before = e.read_path();
        let (start, mut n) = (Instant::now(), 0u64);
        while start.elapsed() < Duration::from_secs(secs) {
            let k = &keys[rng.random_range(0..keys.len())];
            e.read_whole(k).await.expect("read").expect("present");
            n += 1;
        }
        let after = e.read_path();
        println!(
            "round {round}: {:.0} reads/s; inline {}, fell back {}, pooled {}",
            n as f64 / start.elapsed().as_secs_f64(),
            after.inline - before.inline,
            after.fell_back - before.fell_back,
            after.pooled - before.pooled,
        );
    }
}
