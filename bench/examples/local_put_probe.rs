//! Probe of the local engine's unsynced 1 MiB put (issue 16: the puts that
//! trail iroh-blobs at comparable durability): `Store::put` of fresh bodies
//! into a `local (fsync: false)` store, the entries deleted between rounds,
//! for `perf record -g`.
//!
//! `cargo run --release -p bench --example local_put_probe -- [puts] [KiB]`

use std::time::Instant;

use bench::data::Payload;
use bench::fixtures::{local_store, ns};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let puts: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5000);
    let kib: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(1024);
    let dir = tempfile::tempdir()?;
    let store = local_store(dir.path(), false)
        .await
        .map_err(|e| e.to_string())?;
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
