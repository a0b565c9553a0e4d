//! Probe of the mem engine's 64 MiB put (issue 16, TUNING.md §puts-hashed-while-read, §owned-bodies): a fresh
//! 64 MiB body put into a `MemOnly` store — from a reader with its declared
//! length (`Store::put`), and as an owned buffer (`Store::put_bytes`) —
//! then deleted, against single-thread `blake3::hash` of the same bytes, in
//! interleaved rounds of one process. Prints the median of each and their
//! ratios; handy under `perf record -g`.
//!
//! `cargo run --release -p bench --example mem_put_probe -- [rounds] [MiB]`

use std::time::{Duration, Instant};

use bench::data::Payload;
use bench::fixtures::{mem_store, ns};

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(30);
    let mib: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let store = mem_store().await?;
    let mut p = Payload::new(mib << 20);
    let ns = ns();
    let (mut puts, mut owned, mut hashes) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let len = p.len() as u64;
        let t = Instant::now();
        let r = store
            .put_opts(
                &ns,
                p.fresh(),
                store_core::PutOptions {
                    len: Some(len),
                    ..Default::default()
                },
            )
            .await?;
        puts.push(t.elapsed());
        let key = r.key().clone();
        drop(r);
        store.delete(&key).await?;
        let t = Instant::now();
        let d = blake3::hash(p.current());
        hashes.push(t.elapsed());
        assert_eq!(d.as_bytes(), key.digest.as_bytes());
        let body = bytes::Bytes::copy_from_slice(p.fresh());
        let t = Instant::now();
        let r = store.put_bytes(&ns, body).await?;
        owned.push(t.elapsed());
        let key = r.key().clone();
        drop(r);
        store.delete(&key).await?;
    }
    let mut pool = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let d = store_types::outboard::compute(p.current());
        pool.push(t.elapsed());
        std::hint::black_box(d);
    }
    println!(
        "digest + outboard on rayon's pool: median {:?}",
        median(&mut pool)
    );
    let mut fresh = Vec::new();
    for _ in 0..rounds {
        let body = bytes::Bytes::copy_from_slice(p.fresh());
        let t = Instant::now();
        let d = store_types::outboard::compute(&body);
        fresh.push(t.elapsed());
        std::hint::black_box(d);
    }
    println!(
        "the same, of a freshly copied buffer: median {:?}",
        median(&mut fresh)
    );
    let (put, bytes, hash) = (median(&mut puts), median(&mut owned), median(&mut hashes));
    let x = |d: Duration| hash.as_secs_f64() / d.as_secs_f64();
    println!(
        "{mib} MiB, {rounds} rounds, medians: blake3::hash {hash:?}; put (reader) {put:?} = {:.2}× BLAKE3; put_bytes {bytes:?} = {:.2}× BLAKE3",
        x(put),
        x(bytes)
    );
    Ok(())
}
