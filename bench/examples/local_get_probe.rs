//! Probe of the local engine's verified whole get (`Store::get` then
//! `Blob::bytes`) of one page-cached entry, read again and again, for
//! `perf record -g`: what the `local (fsync)` "get 1 MiB (verified)" row
//! of the results table measures.
//!
//! `cargo run --release -p bench --example local_get_probe -- [gets] [KiB]`

use std::time::Instant;

use bench::data::Payload;
use bench::fixtures::{ns, Probe};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Held to the end: its directory goes with it.
    let probe = Probe::open(5000, true).await?;
    let (gets, kib, store) = (probe.ops, probe.kib, &probe.store);
    let mut p = Payload::new(kib << 10);
    let put = store.put(&ns(), p.fresh()).await?;
    let key = put.key().clone();
    let t = Instant::now();
    let mut bytes = 0;
    for _ in 0..gets {
        let blob = store.get(&key).await?.ok_or("the entry is gone")?;
        bytes += blob.bytes().await?.len();
    }
    let s = t.elapsed().as_secs_f64();
    println!(
        "{gets} verified gets of {kib} KiB: {:.0} gets/s, {:.2} GiB/s",
        gets as f64 / s,
        bytes as f64 / s / (1u64 << 30) as f64
    );
    Ok(())
}
