//! Probe of a cache-key read's bookkeeping (ADR-073): `Cache::lookup` of
//! remembered keys through a store on SQLite, on a manual clock that
//! advances 1 ms every 33 reads (a server at 33,000 reads per second), so
//! the periods, the writes of noted reads and the counts do not depend on
//! the machine's speed or load. Counts, per lookup: heap allocations (a
//! counting global allocator), the SQLite writer's jobs and its busy time
//! (statements and commits), and the process's CPU time (every thread:
//! the lookups and the writes they cause).
//!
//! `cargo run --release -p bench --example cache_lookup_probe -- [keys] [lookups]`
//! (defaults 1000 keys, 1,000,000 lookups; keys read uniformly at random).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use store_core::{ManualClock, Store};
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Namespace, RefName, Timestamp};

/// The system allocator, counting allocations (every thread).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; the counter has no effect on
// the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// User plus system CPU time of the whole process, µs.
fn cpu_us() -> u64 {
    // SAFETY: getrusage writes into the zeroed struct we own.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    tv(u.ru_utime) + tv(u.ru_stime)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let keys: usize = args.next().map_or(1000, |s| s.parse().expect("keys"));
    let lookups: u64 = args
        .next()
        .map_or(1_000_000, |s| s.parse().expect("lookups"));
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = SqliteEngine::open(dir.path().join("kv.sqlite"), SqliteOptions::default())
        .await
        .expect("open");
    let clock = ManualClock::new(Timestamp(1_000_000_000));
    let store = Store::builder()
        .kv(engine.clone())
        .clock(Arc::new(clock.clone()))
        .build()
        .await
        .expect("store");
    let cache = store.cache().expect("sqlite holds cache keys");
    let ns = Namespace::new("cc").expect("ns");
    let names: Vec<RefName> = (0..keys)
        .map(|i| RefName::new(format!("k/{i}")).expect("key"))
        .collect();
    for (i, k) in names.iter().enumerate() {
        let body = Bytes::from(format!("{i:01024}"));
        cache.put(&ns, k, body).await.expect("put");
    }
    for k in &names {
        cache.lookup(&ns, k).await.expect("warm");
    }
    cache.flush_access().await.expect("flush");
    let (a0, c0, s0, w0) = (
        ALLOCATIONS.load(Ordering::Relaxed),
        cpu_us(),
        engine.stats(),
        engine.waits(),
    );
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..lookups {
        if i % 33 == 32 {
            clock.advance(Duration::from_millis(1));
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = &names[(x % keys as u64) as usize];
        cache.lookup(&ns, k).await.expect("lookup").expect("a key");
    }
    // What the lookups noted and have not written yet is theirs too.
    cache.flush_access().await.expect("flush");
    let (a1, c1, s1, w1) = (
        ALLOCATIONS.load(Ordering::Relaxed),
        cpu_us(),
        engine.stats(),
        engine.waits(),
    );
    let n = lookups as f64;
    let busy = (w1.statements_us + w1.commit_us) - (w0.statements_us + w0.commit_us);
    println!(
        "keys {keys}, lookups {lookups}, clock span {} s",
        lookups / 33 / 1000
    );
    println!(
        "per lookup: {:.2} allocations, {:.3} µs CPU (process), {:.3} µs writer busy; \
         writer jobs {} in {} commits",
        (a1 - a0) as f64 / n,
        (c1 - c0) as f64 / n,
        busy as f64 / n,
        s1.writes_committed - s0.writes_committed,
        s1.commits - s0.commits,
    );
}
