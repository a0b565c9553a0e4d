//! Probe of the local engine's unsynced 1 MiB put (issue 16: the puts that
//! trail iroh-blobs at comparable durability): `Store::put` of fresh bodies
//! into a `local (fsync: false)` store, the entries deleted between rounds,
//! for `perf record -g`.
//!
//! `cargo run --release -p bench --example local_put_probe -- [puts] [KiB]`

use std::time::Instant;

use bench::data::Payload;
use bench::fixtures::{ns, Probe};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Held to the end: its directory goes with it.
    let probe = Probe::open(5000, false).await?;
    let (puts, kib, store) = (probe.ops, probe.kib, &probe.store);
    let mut p = Payload::new(kib << 10);
    let ns = ns();
    let mut keys = Vec::new();
    let t = Instant::now();
    for i in 0..puts {
        let len = p.len() as u64;
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
        keys.push(r.key().clone());
        drop(r);
        if i % 100 == 99 {
            for k in keys.drain(..) {
                store.delete(&k).await?;
            }
        }
    }
    println!(
        "{puts} puts of {kib} KiB (deletes every 100 included): {:.0} puts/s",
        puts as f64 / t.elapsed().as_secs_f64()
    );
    Ok(())
}
