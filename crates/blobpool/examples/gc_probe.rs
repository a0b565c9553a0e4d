//! Cost of references on put, and sweep throughput, on the embedded
//! default (SQLite kv + local files, fsync on, dual-tier at 64 KiB).
//!
//! ```sh
//! cargo run --release -p blobpool --example gc_probe            # 2,000 puts, 20,000 swept
//! cargo run --release -p blobpool --example gc_probe -- --quick
//! ```
//!
//! - put 1 KiB vs put 1 KiB + `Refs::set` (the reference committed under
//!   the put's pin), interleaved rounds, medians compared;
//! - sweep: N unreferenced entries in an `unreferenced` namespace (window
//!   0), one sweep staging them and one deleting them, entries/s for each.

use std::time::{Duration, Instant};

use store_core::{GcPolicy, Mode, Namespace, RefExpect, RefName, Store, SweepOptions};
use store_local::{LocalEngine, LocalOptions};
use store_sqlite::{SqliteEngine, SqliteOptions};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

async fn open(dir: &std::path::Path) -> Res<Store> {
    let kv = SqliteEngine::open(dir.join("kv.sqlite"), SqliteOptions::default()).await?;
    let large = LocalEngine::open(
        dir.join("large"),
        LocalOptions {
            shared_media: false,
            fsync: true,
            ..LocalOptions::default()
        },
    )
    .await?;
    Ok(Store::builder()
        .kv(kv)
        .large(large)
        .mode(Mode::DualTier {
            threshold: 64 * 1024,
        })
        .window(Duration::ZERO)
        .build()
        .await?)
}

fn body(i: u64) -> Vec<u8> {
    let mut v = vec![0u8; 1024];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() -> Res<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let (puts, swept, rounds) = if quick {
        (200u64, 2_000u64, 3)
    } else {
        (2_000, 20_000, 5)
    };
    let dir = tempfile::tempdir()?;
    let store = open(dir.path()).await?;
    let refs = store.refs().expect("sqlite holds references");
    let ns = Namespace::new("probe")?;
    let mut plain = Vec::new();
    let mut with_ref = Vec::new();
    let mut seed = 0u64;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..puts {
            seed += 1;
            store.put(&ns, &body(seed)[..]).await?;
        }
        plain.push(puts as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        for i in 0..puts {
            seed += 1;
            let r = store.put(&ns, &body(seed)[..]).await?;
            let name = RefName::new(format!("r/{seed}/{i}"))?;
            refs.set(&ns, &name, r.digest, RefExpect::Absent).await?;
        }
        with_ref.push(puts as f64 / t.elapsed().as_secs_f64());
    }
    let (p, r) = (median(plain), median(with_ref));
    println!(
        "put 1 KiB: {p:.0}/s; put 1 KiB + reference: {r:.0}/s; ratio {:.2}",
        r / p
    );

    let gns = Namespace::new("garbage")?;
    store
        .set_gc_policy(gns.clone(), GcPolicy::Unreferenced)
        .await?;
    // The other namespaces stay out of the measured sweeps.
    store.set_gc_policy(ns.clone(), GcPolicy::Keep).await?;
    for i in 0..swept {
        store.put(&gns, &body(1 << 40 | i)[..]).await?;
    }
    let t = Instant::now();
    let stage = store.gc().sweep(SweepOptions::default()).await?;
    let staged_in = t.elapsed();
    let t = Instant::now();
    let delete = store.gc().sweep(SweepOptions::default()).await?;
    let deleted_in = t.elapsed();
    println!(
        "sweep of {swept} unreferenced 1 KiB entries: staged {} in {:.2}s ({:.0}/s), deleted {} in {:.2}s ({:.0}/s)",
        stage.total.staged,
        staged_in.as_secs_f64(),
        stage.total.staged as f64 / staged_in.as_secs_f64(),
        delete.total.deleted,
        deleted_in.as_secs_f64(),
        delete.total.deleted as f64 / deleted_in.as_secs_f64(),
    );
    Ok(())
}
