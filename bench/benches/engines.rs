//! `cargo bench -p bench --bench engines`: per-engine and composite figures
//! (criterion). Put and get at 1 KiB, 64 KiB, 1 MiB and 64 MiB (bytes/s;
//! criterion's time per iteration is the op latency, its inverse ops/s),
//! `has_many` of 1000 digests, a 4 KiB `read_range` inside a 64 MiB entry,
//! 16 concurrent 1 KiB putters (group commit), and a mark sweep over 100k
//! entries (elements/s = entries arbitrated per second).
//!
//! The ratio table lives in `cargo xtask bench`; this is the detail.
//!
//! Run without `--bench` (e.g. `cargo test --benches`), criterion's test
//! mode runs each benchmark once: the suite then shrinks to 1 KiB sizes and a
//! 1,000-entry sweep and skips PostgreSQL, so it stays quick.

use std::path::Path;
use std::time::{Duration, Instant};

use bench::data::{size_name, KIB, MIB, SIZES};
use bench::fixtures::{self, BenchResult, PgScope};
use bench::measure::Workload;
use bench::sweep::{self, SweepWork, SWEEP_ENTRIES};
use bench::workloads::*;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use store_core::Store;
use store_sqlite::Durability;
use tokio::runtime::Runtime;

/// Whether this is a real benchmark run (not criterion's test mode).
fn heavy() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Times `iters` operations of `w` (after its untimed reset).
fn bench_workload(
    group: &mut BenchmarkGroup<'_, WallTime>,
    rt: &Runtime,
    id: &str,
    throughput: Throughput,
    w: &mut dyn Workload,
) {
    group.throughput(throughput);
    group.bench_function(id, |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let cap = w.max_batch();
                let mut total = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let n = left.min(cap);
                    w.reset().await;
                    let t = Instant::now();
                    w.run(n).await;
                    total += t.elapsed();
                    left -= n;
                }
                total
            })
        })
    });
}

/// How a group's puts clean up between batches.
#[derive(Clone, Copy)]
enum Cleanup<'a> {
    /// Keep everything.
    Keep,
    /// Delete the entries through the store (mem).
    Delete,
    /// Remove the local engine's content files under this root.
    Files(&'a Path),
}

/// Put/get per size, ranged read and `has_many` over one store.
fn store_group(
    c: &mut Criterion,
    rt: &Runtime,
    name: &str,
    store: &Store,
    sizes: &[usize],
    ranged: bool,
    cleanup: Cleanup<'_>,
) -> BenchResult<()> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    for &size in sizes {
        let sz = size_name(size);
        let mut w: Box<dyn Workload> = match cleanup {
            Cleanup::Keep => Box::new(put_op(store.clone(), size)),
            Cleanup::Delete => Box::new(churn_put_op(store.clone(), size)),
            Cleanup::Files(root) => Box::new(local_put_op(store.clone(), size, root)),
        };
        bench_workload(
            &mut g,
            rt,
            &format!("put/{sz}"),
            Throughput::Bytes(size as u64),
            &mut *w,
        );
        let key = rt.block_on(put_one(store, size))?;
        let mut w = get_op(store.clone(), key, size);
        bench_workload(
            &mut g,
            rt,
            &format!("get/{sz}"),
            Throughput::Bytes(size as u64),
            &mut w,
        );
    }
    if ranged && heavy() {
        let key = rt.block_on(put_one(store, RANGE_BLOB))?;
        let mut w = range_op(store.clone(), key);
        bench_workload(
            &mut g,
            rt,
            "read_range/4 KiB of 64 MiB",
            Throughput::Bytes(RANGE_LEN as u64),
            &mut w,
        );
    }
    let digests = rt.block_on(has_many_set(store, 500))?;
    let mut w = has_many_op(store.clone(), digests, 500);
    bench_workload(
        &mut g,
        rt,
        "has_many/1000",
        Throughput::Elements(1000),
        &mut w,
    );
    g.finish();
    Ok(())
}

fn concurrent_group(c: &mut Criterion, rt: &Runtime, name: &str, store: &Store) {
    let mut g = c.benchmark_group(name);
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let mut w = concurrent_put_op(store.clone(), KIB, 16);
    bench_workload(
        &mut g,
        rt,
        "put/1 KiB x16 putters",
        Throughput::Elements(1),
        &mut w,
    );
    g.finish();
}

fn sweep_group(c: &mut Criterion, rt: &Runtime, name: &str, store: Store) -> BenchResult<()> {
    let n = if heavy() { SWEEP_ENTRIES } else { 1000 };
    let keys = rt.block_on(sweep::fill(&store, n, 64))?;
    let mut w = rt.block_on(SweepWork::new(store, keys))?;
    let mut g = c.benchmark_group(name);
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    bench_workload(
        &mut g,
        rt,
        &format!("mark sweep/{n} entries"),
        Throughput::Elements(n as u64),
        &mut w,
    );
    g.finish();
    Ok(())
}

fn run(c: &mut Criterion) -> BenchResult<()> {
    let rt = Runtime::new().map_err(fixtures::err)?;
    let scratch = tempfile::tempdir().map_err(fixtures::err)?;
    let big = heavy();
    let all: &[usize] = if big { &SIZES } else { &[KIB] };
    let kv: &[usize] = if big {
        &[KIB, 4 * KIB, 64 * KIB, MIB]
    } else {
        &[KIB]
    };

    let mem = rt.block_on(fixtures::mem_store())?;
    store_group(c, &rt, "mem", &mem, all, true, Cleanup::Delete)?;
    sweep_group(c, &rt, "mem", rt.block_on(fixtures::mem_store())?)?;

    let (sq, _) = rt.block_on(fixtures::sqlite_store(
        &scratch.path().join("sqlite"),
        Durability::Full,
    ))?;
    store_group(c, &rt, "sqlite", &sq, kv, false, Cleanup::Keep)?;
    concurrent_group(c, &rt, "sqlite", &sq);
    let (sq_sweep, _) = rt.block_on(fixtures::sqlite_store(
        &scratch.path().join("sqlite-sweep"),
        Durability::Full,
    ))?;
    sweep_group(c, &rt, "sqlite", sq_sweep)?;

    for (name, fsync) in [("local", true), ("local-nofsync", false)] {
        let dir = scratch.path().join(name);
        let store = rt.block_on(fixtures::local_store(&dir, fsync))?;
        let root = dir.join("large");
        store_group(c, &rt, name, &store, all, fsync, Cleanup::Files(&root))?;
    }

    let dir = scratch.path().join("composite");
    let comp = rt.block_on(fixtures::composite_store(&dir))?;
    let root = dir.join("large");
    store_group(
        c,
        &rt,
        "sqlite+local",
        &comp,
        all,
        true,
        Cleanup::Files(&root),
    )?;

    if big {
        let pg = rt.block_on(PgScope::new())?;
        let result = (|| {
            let (pgs, _) = rt.block_on(fixtures::postgres_store(&pg))?;
            store_group(c, &rt, "postgres", &pgs, kv, false, Cleanup::Keep)?;
            concurrent_group(c, &rt, "postgres", &pgs);
            let lo = rt.block_on(fixtures::pglo_store(&pg))?;
            store_group(c, &rt, "pg-lo", &lo, all, true, Cleanup::Keep)
        })();
        let cleaned = rt.block_on(pg.cleanup());
        result?;
        cleaned?;
    }
    Ok(())
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    if let Err(e) = run(&mut c) {
        eprintln!("engines bench failed: {e}");
        std::process::exit(1);
    }
    c.final_summary();
}
