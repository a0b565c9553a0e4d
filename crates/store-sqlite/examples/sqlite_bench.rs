//! Quick throughput check of the sqlite engine against raw rusqlite, in the
//! same run (PERF-NOTES: always quote the ratio to the limit).
//!
//! `cargo run --release -p store-sqlite --example sqlite_bench -- [entries] [blob_bytes]`
//!
//! 1. raw rusqlite, one 4 KiB insert per transaction (WAL, synchronous=FULL);
//! 2. the engine with 16 concurrent putters (group commit);
//! 3. a GC-sweep-shaped pass over `entries` rows: `scan` pages of 1000,
//!    `staged_many` and `stage` per page.

use std::time::{Duration, Instant};

use bytes::Bytes;
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Digest, Engine, Key, KvEngine, Namespace, StagedCandidate, Timestamp};

const PUT_WINDOW: Duration = Duration::from_secs(2);

fn blob(i: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len.max(8)];
    v[..8].copy_from_slice(&i.to_le_bytes());
    for (j, b) in v.iter_mut().enumerate().skip(8) {
        *b = (i as usize).wrapping_mul(31).wrapping_add(j) as u8;
    }
    v.truncate(len);
    v
}

fn raw_rate(dir: &std::path::Path, per_tx: u64) -> f64 {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let run = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let conn = rusqlite::Connection::open(dir.join(format!("raw{run}.sqlite"))).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE t (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID;",
    )
    .unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < PUT_WINDOW {
        conn.execute_batch("BEGIN").unwrap();
        for _ in 0..per_tx {
            let v = blob(n, 4096);
            conn.prepare_cached("INSERT INTO t (k, v) VALUES (?1, ?2)")
                .unwrap()
                .execute((&Digest::of(&v).as_bytes()[..], &v[..]))
                .unwrap();
            n += 1;
        }
        conn.execute_batch("COMMIT").unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

async fn group_commit_rate(engine: &SqliteEngine) -> f64 {
    static EPOCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let epoch = EPOCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ns = Namespace::new("puts").unwrap();
    let start = Instant::now();
    let tasks: Vec<_> = (0..16u64)
        .map(|t| {
            let (engine, ns) = (engine.clone(), ns.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while start.elapsed() < PUT_WINDOW {
                    let v = blob(epoch << 48 | t << 40 | n, 4096);
                    let key = Key::new(ns.clone(), Digest::of(&v));
                    engine.put(&key, Bytes::from(v)).await.unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / start.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let entries: u64 = args.get(1).map_or(100_000, |s| s.parse().unwrap());
    let blob_len: usize = args.get(2).map_or(64, |s| s.parse().unwrap());
    let dir = tempfile::tempdir().unwrap();

    let raw = raw_rate(dir.path(), 1);
    let raw16 = raw_rate(dir.path(), 16);
    let engine = SqliteEngine::open(dir.path().join("db.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let grouped = group_commit_rate(&engine).await;
    println!(
        "4 KiB puts, FULL: raw 1/tx {raw:.0}/s, raw 16/tx {raw16:.0}/s, \
         engine 16 putters {grouped:.0}/s (x{:.2} of 1/tx, x{:.2} of 16/tx); stats {:?}",
        grouped / raw,
        grouped / raw16,
        engine.stats()
    );

    // Fill a namespace for the sweep pass (batched puts, not timed).
    let ns = Namespace::new("sweep").unwrap();
    let fill = Instant::now();
    for chunk in (0..entries).collect::<Vec<_>>().chunks(2000) {
        let puts: Vec<_> = chunk
            .iter()
            .map(|&i| {
                let engine = engine.clone();
                let v = blob(i, blob_len);
                let key = Key::new(ns.clone(), Digest::of(&v));
                tokio::spawn(async move { engine.put(&key, Bytes::from(v)).await.unwrap() })
            })
            .collect();
        for p in puts {
            p.await.unwrap();
        }
    }
    println!(
        "filled {entries} x {blob_len} B in {:.2?} ({:.0}/s)",
        fill.elapsed(),
        entries as f64 / fill.elapsed().as_secs_f64()
    );

    let seam = engine.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    let window = seam.window.unwrap();
    let start = Instant::now();
    let (mut after, mut seen) = (None, 0u64);
    let (mut t_scan, mut t_staged, mut t_stage) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    loop {
        let t = Instant::now();
        let page = engine.scan(&ns, after, 1000).await.unwrap();
        t_scan += t.elapsed();
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().0);
        seen += page.len() as u64;
        let digests: Vec<Digest> = page.iter().map(|p| p.0).collect();
        let t = Instant::now();
        let staged = window.staged_many(&ns, &digests).await.unwrap();
        t_staged += t.elapsed();
        let fresh: Vec<StagedCandidate> = page
            .iter()
            .zip(staged)
            .filter(|(_, s)| !s)
            .map(|((d, size), _)| StagedCandidate {
                key: Key::new(ns.clone(), *d),
                size: *size,
                visible_after: Timestamp::now(),
            })
            .collect();
        let t = Instant::now();
        window.stage(&fresh).await.unwrap();
        t_stage += t.elapsed();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "sweep pass: {seen} entries in {secs:.3}s = {:.0} entries/s \
         (scan {t_scan:.2?}, staged_many {t_staged:.2?}, stage {t_stage:.2?})",
        seen as f64 / secs
    );
    assert_eq!(window.staged_count().await.unwrap(), seen);
}
