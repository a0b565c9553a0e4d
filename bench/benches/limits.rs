//! `cargo bench -p bench --bench limits`: the machine's limits and the
//! peers, alone (criterion): BLAKE3, raw write+fsync+rename and file reads,
//! raw rusqlite insert/select (WAL, FULL and NORMAL), raw sqlx bytea and
//! large objects, `cacache` puts and verified gets (async and blocking API)
//! and, with the `iroh` feature, iroh-blobs' at every size.
//!
//! In criterion's test mode (no `--bench`) only 1 KiB runs and PostgreSQL
//! is skipped.

use std::time::{Duration, Instant};

use bench::data::{size_name, KIB, MIB, SIZES};
use bench::fixtures::{self, BenchResult, PgScope};
use bench::measure::Workload;
use bench::peer::Cacache;
use bench::raw::{RawFs, RawPg, RawSqlite};
use bench::workloads::*;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput};
use store_sqlite::Durability;
use tokio::runtime::Runtime;

fn heavy() -> bool {
    std::env::args().any(|a| a == "--bench")
}

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
                w.reset().await;
                let t = Instant::now();
                w.run(iters).await;
                t.elapsed()
            })
        })
    });
}

fn group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500));
    g
}

fn run(c: &mut Criterion) -> BenchResult<()> {
    let rt = Runtime::new().map_err(fixtures::err)?;
    let scratch = tempfile::tempdir().map_err(fixtures::err)?;
    let sizes: &[usize] = if heavy() { &SIZES } else { &[KIB] };
    let small: &[usize] = if heavy() {
        &[KIB, 4 * KIB, 64 * KIB, MIB]
    } else {
        &[KIB]
    };

    let mut g = group(c, "blake3");
    for &size in sizes {
        let mut w = blake3_op(size);
        bench_workload(
            &mut g,
            &rt,
            &size_name(size),
            Throughput::Bytes(size as u64),
            &mut w,
        );
    }
    g.finish();

    let fs = RawFs::new(scratch.path().join("raw")).map_err(fixtures::err)?;
    let mut g = group(c, "raw-fs");
    for &size in sizes {
        let sz = size_name(size);
        let t = Throughput::Bytes(size as u64);
        let mut w = fs_put_op(&fs, size, true);
        bench_workload(
            &mut g,
            &rt,
            &format!("write+fsync+rename/{sz}"),
            t.clone(),
            &mut w,
        );
        let mut w = fs_put_op(&fs, size, false);
        bench_workload(
            &mut g,
            &rt,
            &format!("write+rename/{sz}"),
            t.clone(),
            &mut w,
        );
        let mut w = fs_get_op(&fs, size)?;
        bench_workload(&mut g, &rt, &format!("read/{sz}"), t, &mut w);
    }
    g.finish();

    let cc = Cacache::new(scratch.path().join("cacache"));
    let mut g = group(c, "cacache");
    for &size in sizes {
        let sz = size_name(size);
        let t = Throughput::Bytes(size as u64);
        let mut w = cacache_put_op(&cc, size);
        bench_workload(&mut g, &rt, &format!("write_hash/{sz}"), t.clone(), &mut w);
        let mut w = rt.block_on(cacache_get_op(&cc, size))?;
        bench_workload(&mut g, &rt, &format!("read_hash/{sz}"), t.clone(), &mut w);
        let mut w = cacache_put_sync_op(&cc, size);
        let name = format!("write_hash_sync/{sz}");
        bench_workload(&mut g, &rt, &name, t.clone(), &mut w);
        let mut w = rt.block_on(cacache_get_sync_op(&cc, size))?;
        bench_workload(&mut g, &rt, &format!("read_hash_sync/{sz}"), t, &mut w);
    }
    g.finish();

    #[cfg(feature = "iroh")]
    {
        let mut g = group(c, "iroh-blobs");
        for &size in sizes {
            let sz = size_name(size);
            let t = Throughput::Bytes(size as u64);
            let root = scratch.path().join(format!("iroh-blobs-{size}"));
            let mut w = rt.block_on(iroh_put_op(&root.join("put"), size))?;
            bench_workload(&mut g, &rt, &format!("add_bytes/{sz}"), t.clone(), &mut w);
            let mut w = rt.block_on(iroh_get_op(&root.join("get"), size))?;
            bench_workload(&mut g, &rt, &format!("get_bytes/{sz}"), t, &mut w);
        }
        g.finish();
    }

    for (name, durability) in [
        ("raw-sqlite-full", Durability::Full),
        ("raw-sqlite-normal", Durability::Normal),
    ] {
        let db = RawSqlite::open(&scratch.path().join(format!("{name}.sqlite")), durability)?;
        let mut g = group(c, name);
        for &size in small {
            let sz = size_name(size);
            let t = Throughput::Bytes(size as u64);
            let mut w = sqlite_put_op(&db, size);
            bench_workload(&mut g, &rt, &format!("insert/{sz}"), t.clone(), &mut w);
            let mut w = sqlite_get_op(&db, size)?;
            bench_workload(&mut g, &rt, &format!("select/{sz}"), t, &mut w);
        }
        g.finish();
    }

    if heavy() {
        let pg = rt.block_on(PgScope::new())?;
        let result = (|| {
            let raw = rt.block_on(RawPg::new(&pg))?;
            let mut g = group(c, "raw-postgres");
            for &size in small {
                let sz = size_name(size);
                let t = Throughput::Bytes(size as u64);
                let mut w = pg_put_op(&raw, size);
                bench_workload(
                    &mut g,
                    &rt,
                    &format!("bytea insert/{sz}"),
                    t.clone(),
                    &mut w,
                );
                let mut w = rt.block_on(pg_get_op(&raw, size))?;
                bench_workload(&mut g, &rt, &format!("bytea select/{sz}"), t, &mut w);
            }
            for size in [MIB, 64 * MIB] {
                let sz = size_name(size);
                let t = Throughput::Bytes(size as u64);
                let mut w = lo_put_op(&raw, size);
                bench_workload(
                    &mut g,
                    &rt,
                    &format!("lo_from_bytea/{sz}"),
                    t.clone(),
                    &mut w,
                );
                let mut w = rt.block_on(lo_get_op(&raw, size))?;
                bench_workload(&mut g, &rt, &format!("lo_get/{sz}"), t, &mut w);
            }
            g.finish();
            Ok::<_, String>(())
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
        eprintln!("limits bench failed: {e}");
        std::process::exit(1);
    }
    c.final_summary();
}
