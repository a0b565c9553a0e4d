//! Probe of the SQLite NORMAL put path (TUNING.md §sqlite-normal-puts): the store's put, the
//! engine's put alone, 16 concurrent store putters, and the raw rusqlite
//! `INSERT` (one transaction each), measured in interleaved rounds of one
//! process so their ratios mean something on a noisy machine.
//!
//! `cargo run --release -p bench --example sqlite_put_probe -- [rounds] [ops] [normal|full] [raw|store|engine|16]`
//!
//! Prints per-round rates and, at the end, the median of each figure and its
//! ratio to the raw insert. Per round it also prints the CPU time per put of
//! the process and of the engine's writer thread, and the writer's sleeps
//! (voluntary context switches) per put, from `/proc` (Linux): unlike
//! rates, these hardly move with other load on the machine (TUNING.md §sqlite-normal-puts). Also
//! handy under `perf record -g` (pass `store`, `engine`, `16` or `raw` as a
//! fourth argument to run that one only).

use std::time::Instant;

use bench::data::{unique_body, Payload, KIB};
use bench::fixtures::{ns, sqlite_store};
use bench::raw::{fresh_key, RawSqlite};
use bytes::Bytes;
use store_sqlite::Durability;
use store_types::{Digest, Key, KvEngine};

/// The writer thread's voluntary context switches (its sleeps) and its
/// CPU time in ns, from /proc (Linux only; zeros elsewhere).
fn writer_thread() -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0, 0);
    };
    for t in tasks.flatten() {
        let p = t.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !comm.starts_with("blobpool-sqlit") {
            continue;
        }
        let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
        let sleeps = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let cpu = std::fs::read_to_string(p.join("schedstat"))
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        return (sleeps, cpu);
    }
    (0, 0)
}

/// CPU time of the whole process in ns: the sum over its threads (a
/// thread that has exited is no longer counted; the probe's threads live
/// as long as the process).
fn process_cpu() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| {
            std::fs::read_to_string(t.path().join("schedstat"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Per put: writer sleeps, writer CPU µs, process CPU µs.
fn costs(before: ((u64, u64), u64), n: u64) -> String {
    let ((s0, w0), p0) = before;
    let ((s1, w1), p1) = (writer_thread(), process_cpu());
    let n = n.max(1) as f64;
    format!(
        "writer sleeps/put {:.2}, writer cpu/put {:.1} µs, process cpu/put {:.1} µs",
        (s1 - s0) as f64 / n,
        (w1 - w0) as f64 / 1000.0 / n,
        (p1 - p0) as f64 / 1000.0 / n
    )
}

fn snap() -> ((u64, u64), u64) {
    (writer_thread(), process_cpu())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let ops: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5000);
    let durability = if args.get(3).map(String::as_str) == Some("full") {
        Durability::Full
    } else {
        Durability::Normal
    };
    let only = args.get(4).cloned();
    let want = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    rt.block_on(async {
        let (store, engine) = sqlite_store(dir.path(), durability).await.unwrap();
        let db = RawSqlite::open(&dir.path().join("raw.sqlite"), durability).unwrap();
        let ns = ns();
        let mut p = Payload::new(KIB);
        let (mut raw, mut st, mut eng, mut conc) = (vec![], vec![], vec![], vec![]);
        for round in 0..rounds {
            if want("raw") {
                let c = snap();
                let t = Instant::now();
                for _ in 0..ops {
                    db.insert("bench", &fresh_key(), p.fresh()).unwrap();
                }
                raw.push(ops as f64 / t.elapsed().as_secs_f64());
                eprintln!("  round {round}: raw: {}", costs(c, ops));
            }
            if want("store") {
                let c = snap();
                let t = Instant::now();
                for _ in 0..ops {
                    let r = store
                        .put_opts(
                            &ns,
                            p.fresh(),
                            store_core::PutOptions {
                                len: Some(KIB as u64),
                                ..Default::default()
                            },
                        )
                        .await;
                    assert!(!r.unwrap().deduplicated);
                }
                st.push(ops as f64 / t.elapsed().as_secs_f64());
                eprintln!("  round {round}: store: {}", costs(c, ops));
            }
            if want("engine") {
                let t = Instant::now();
                for _ in 0..ops {
                    let body = Bytes::copy_from_slice(p.fresh());
                    let key = Key::new(ns.clone(), Digest::from_bytes(fresh_key()));
                    engine.put(&key, body).await.unwrap();
                }
                eng.push(ops as f64 / t.elapsed().as_secs_f64());
            }
            if want("16") {
                let before = engine.stats();
                let c = snap();
                let t = Instant::now();
                let mut tasks = Vec::new();
                for _ in 0..16 {
                    let store = store.clone();
                    let ns = ns.clone();
                    let count = ops / 16;
                    tasks.push(tokio::spawn(async move {
                        for _ in 0..count {
                            let body = unique_body(KIB);
                            store
                                .put_opts(
                                    &ns,
                                    &body[..],
                                    store_core::PutOptions {
                                        len: Some(KIB as u64),
                                        ..Default::default()
                                    },
                                )
                                .await
                                .unwrap();
                        }
                    }));
                }
                for t in tasks {
                    t.await.unwrap();
                }
                conc.push((ops / 16 * 16) as f64 / t.elapsed().as_secs_f64());
                eprintln!("  round {round}: 16 putters: {}", costs(c, ops / 16 * 16));
                let after = engine.stats();
                let per = (after.writes_committed - before.writes_committed) as f64
                    / (after.commits - before.commits).max(1) as f64;
                eprintln!("  round {round}: 16 putters {per:.1} puts/commit");
            }
            eprintln!(
                "round {round}: raw {:?} store {:?} engine {:?} 16 {:?}",
                raw.last().map(|r| *r as u64),
                st.last().map(|r| *r as u64),
                eng.last().map(|r| *r as u64),
                conc.last().map(|r| *r as u64),
            );
        }
        let raw_m = if raw.is_empty() {
            f64::NAN
        } else {
            median(&mut raw)
        };
        for (name, v) in [
            ("store", &mut st),
            ("engine", &mut eng),
            ("16 putters", &mut conc),
        ] {
            if v.is_empty() {
                continue;
            }
            let m = median(v);
            println!(
                "{name:>10}: {m:>8.0}/s  {:.2}x raw ({raw_m:.0}/s)",
                m / raw_m
            );
        }
    });
}
