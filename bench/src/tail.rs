//! Tail latency under mixed load, with and without a sweep (issue 33,
//! library side): 16 clients on one store — 90 % verified gets of a live
//! set, 10 % puts of fresh bodies — timed per operation into HDR
//! histograms, in rounds that alternate between no sweep and a sweep that
//! collects 100,000 garbage entries (marked by one pass, deleted by the
//! next: the store's delete window is zero) while the clients run.
//!
//! The store is the default composite on disk at its default durability
//! (SQLite `synchronous=FULL` up to 64 KiB, local files above). The live
//! set is protected by a liveness source that answers "live" for every
//! entry of its namespace, so the sweep arbitrates it too; the garbage
//! namespace's source answers "not live".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use store_core::{Key, LivenessSource, Namespace, Store, SweepOptions};

use crate::data::{unique_body, KIB};
use crate::fixtures::{err, BenchResult};
use crate::sweep::NothingLive;

/// What one tail measurement does.
#[derive(Clone, Debug)]
pub struct TailPlan {
    /// Concurrent clients.
    pub clients: usize,
    /// Entries of the live set.
    pub live: usize,
    /// Size of live entries and of the clients' puts.
    pub size: usize,
    /// Percent of operations that are gets.
    pub read_pct: u32,
    /// Garbage entries each sweep round collects.
    pub garbage: usize,
    /// Length of a no-sweep window.
    pub window: Duration,
    /// Rounds of each kind.
    pub rounds: usize,
}

impl TailPlan {
    /// The shape: 16 clients, 90/10, 100k garbage.
    pub fn full() -> Self {
        TailPlan {
            clients: 16,
            live: 50_000,
            size: 4 * KIB,
            read_pct: 90,
            garbage: 100_000,
            window: Duration::from_secs(5),
            rounds: 2,
        }
    }

    /// A short shape for smoke runs.
    pub fn quick() -> Self {
        TailPlan {
            live: 2_000,
            garbage: 10_000,
            window: Duration::from_secs(1),
            rounds: 2,
            ..TailPlan::full()
        }
    }
}

/// p50 / p99 / p999 and the count, in microseconds.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Percentiles {
    /// Operations recorded.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Largest.
    pub max_us: u64,
}

impl Percentiles {
    /// Reads them off a histogram of microseconds.
    pub fn of(h: &Histogram<u64>) -> Self {
        Percentiles {
            count: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// One round's result.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct TailRound {
    /// Whether a sweep ran during the window.
    pub sweep: bool,
    /// Gets.
    pub get: Percentiles,
    /// Puts.
    pub put: Percentiles,
    /// Window length, seconds.
    pub secs: f64,
    /// Entries the sweep's passes deleted (sweep rounds).
    pub deleted: u64,
    /// Entries the mark pass arbitrated (sweep rounds).
    pub arbitrated: u64,
    /// Where the SQLite database's reads and writes went during the
    /// window (every database file the process has open).
    #[serde(default)]
    pub waits: Option<RoundWaits>,
}

/// The SQLite waits of one round (`store_sqlite::open_databases`, the
/// deltas over the window): which path point reads took and what the
/// slow ones waited for.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct RoundWaits {
    /// Point reads answered on the calling thread.
    pub inline: u64,
    /// Point reads that would have waited for the disk and ran again.
    pub fell_back: u64,
    /// Reads run where they may wait (fallbacks, no free connection at
    /// once, scans).
    pub pooled: u64,
    /// Waits for a read connection, and their mean (µs).
    pub read_connection: (u64, u64),
    /// Point reads not answered inline, and their mean time (µs).
    pub point_read: (u64, u64),
    /// Bulk (sweep) transactions, and their mean time (µs).
    pub bulk: (u64, u64),
    /// Foreground writes' time behind a bulk transaction: count, mean (µs).
    pub behind_bulk: (u64, u64),
}

/// The process's SQLite waits so far, summed over its database files.
fn sqlite_waits() -> (store_sqlite::ReadPath, store_sqlite::WaitHistograms) {
    let mut path = store_sqlite::ReadPath::default();
    let mut h = store_sqlite::WaitHistograms::default();
    for d in store_sqlite::open_databases() {
        path.inline += d.read_path.inline;
        path.fell_back += d.read_path.fell_back;
        path.pooled += d.read_path.pooled;
        h.add(&d.histograms);
    }
    (path, h)
}

impl RoundWaits {
    /// The waits between `before` (a [`sqlite_waits`] reading) and now.
    fn since(before: &(store_sqlite::ReadPath, store_sqlite::WaitHistograms)) -> RoundWaits {
        let (p1, h1) = sqlite_waits();
        let (p0, h0) = before;
        let d = |a: &store_sqlite::WaitHistogram, b: &store_sqlite::WaitHistogram| {
            let n = a.count().saturating_sub(b.count());
            let sum = a.sum_us.saturating_sub(b.sum_us);
            (n, sum.checked_div(n).unwrap_or(0))
        };
        RoundWaits {
            // Saturating: an engine closed meanwhile leaves the sums.
            inline: p1.inline.saturating_sub(p0.inline),
            fell_back: p1.fell_back.saturating_sub(p0.fell_back),
            pooled: p1.pooled.saturating_sub(p0.pooled),
            read_connection: d(&h1.read_connection, &h0.read_connection),
            point_read: d(&h1.point_read, &h0.point_read),
            bulk: d(&h1.bulk_transaction, &h0.bulk_transaction),
            behind_bulk: d(&h1.write_behind_bulk, &h0.write_behind_bulk),
        }
    }
}

impl TailRound {
    /// All operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        (self.get.count + self.put.count) as f64 / self.secs
    }
}

/// A liveness source that answers "live" for everything.
pub struct AllLive;

#[async_trait]
impl LivenessSource for AllLive {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>, store_types::Error> {
        Ok(vec![true; keys.len()])
    }
}

fn live_ns() -> Namespace {
    Namespace::new("live").expect("valid namespace")
}

fn garbage_ns() -> Namespace {
    Namespace::new("garbage").expect("valid namespace")
}

/// Puts `n` fresh entries of `size` into `ns` with 16 writers.
async fn fill(store: &Store, ns: Namespace, n: usize, size: usize) -> BenchResult<Vec<Key>> {
    crate::sweep::fill_ns(store, &ns, n, size, 16).await
}

/// Prepares `store` (whose delete window must be zero): the live set and
/// both namespaces' liveness sources. Returns the live keys.
pub async fn prepare(store: &Store, plan: &TailPlan) -> BenchResult<Arc<Vec<Key>>> {
    store
        .gc()
        .register_liveness_source(live_ns(), Arc::new(AllLive))
        .await
        .map_err(err)?;
    store
        .gc()
        .register_liveness_source(garbage_ns(), Arc::new(NothingLive))
        .await
        .map_err(err)?;
    Ok(Arc::new(
        fill(store, live_ns(), plan.live, plan.size).await?,
    ))
}

/// Runs the clients until `stop` is set; returns (gets, puts) histograms.
async fn clients(
    store: &Store,
    plan: &TailPlan,
    live: &Arc<Vec<Key>>,
    stop: &Arc<AtomicBool>,
    seed: u64,
) -> BenchResult<(Histogram<u64>, Histogram<u64>)> {
    let mut tasks = Vec::new();
    for c in 0..plan.clients {
        let (store, live, stop) = (store.clone(), live.clone(), stop.clone());
        let (size, read_pct) = (plan.size, plan.read_pct);
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (c as u64) << 32);
            let mut gets = Histogram::<u64>::new(3).map_err(err)?;
            let mut puts = Histogram::<u64>::new(3).map_err(err)?;
            while !stop.load(Ordering::Relaxed) {
                if rng.random_range(0..100) < read_pct {
                    let key = &live[rng.random_range(0..live.len())];
                    let t = Instant::now();
                    let blob = store
                        .get(key)
                        .await
                        .map_err(err)?
                        .ok_or("live entry gone")?;
                    let bytes = blob.bytes().await.map_err(err)?;
                    gets.record(t.elapsed().as_micros() as u64).map_err(err)?;
                    if bytes.len() != size {
                        return Err(format!("get answered {} bytes", bytes.len()));
                    }
                } else {
                    let body = bytes::Bytes::from(unique_body(size));
                    let t = Instant::now();
                    store.put_bytes(&live_ns(), body).await.map_err(err)?;
                    puts.record(t.elapsed().as_micros() as u64).map_err(err)?;
                }
            }
            Ok::<_, String>((gets, puts))
        }));
    }
    let mut gets = Histogram::<u64>::new(3).map_err(err)?;
    let mut puts = Histogram::<u64>::new(3).map_err(err)?;
    for t in tasks {
        let (g, p) = t.await.map_err(err)??;
        gets.add(g).map_err(err)?;
        puts.add(p).map_err(err)?;
    }
    Ok((gets, puts))
}

/// One round without a sweep: the clients for `plan.window`.
pub async fn quiet_round(
    store: &Store,
    plan: &TailPlan,
    live: &Arc<Vec<Key>>,
    seed: u64,
) -> BenchResult<TailRound> {
    let stop = Arc::new(AtomicBool::new(false));
    let before = sqlite_waits();
    let t = Instant::now();
    let timer = {
        let (stop, window) = (stop.clone(), plan.window);
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            stop.store(true, Ordering::Relaxed);
        })
    };
    let (g, p) = clients(store, plan, live, &stop, seed).await?;
    timer.await.map_err(err)?;
    Ok(TailRound {
        sweep: false,
        get: Percentiles::of(&g),
        put: Percentiles::of(&p),
        secs: t.elapsed().as_secs_f64(),
        deleted: 0,
        arbitrated: 0,
        waits: Some(RoundWaits::since(&before)),
    })
}

/// One round with a sweep: `plan.garbage` entries are written (untimed),
/// then the clients run exactly as long as the two sweep passes (mark,
/// then execute) take. Fails unless every garbage entry was deleted.
pub async fn sweep_round(
    store: &Store,
    plan: &TailPlan,
    live: &Arc<Vec<Key>>,
    seed: u64,
) -> BenchResult<TailRound> {
    fill(store, garbage_ns(), plan.garbage, KIB).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let before = sqlite_waits();
    let t = Instant::now();
    let sweeper = {
        let (store, stop) = (store.clone(), stop.clone());
        tokio::spawn(async move {
            let result = async {
                let mark = store
                    .gc()
                    .sweep(SweepOptions::default())
                    .await
                    .map_err(err)?;
                let exec = store
                    .gc()
                    .sweep(SweepOptions::default())
                    .await
                    .map_err(err)?;
                Ok::<_, String>((mark, exec))
            }
            .await;
            stop.store(true, Ordering::Relaxed);
            result
        })
    };
    let (g, p) = clients(store, plan, live, &stop, seed).await?;
    let secs = t.elapsed().as_secs_f64();
    let (mark, exec) = sweeper.await.map_err(err)??;
    let deleted = mark.total.deleted + exec.total.deleted;
    let garbage = mark.namespaces.get(&garbage_ns()).map_or(0, |c| c.staged);
    if garbage != plan.garbage as u64 || deleted < plan.garbage as u64 {
        return Err(format!(
            "the sweep staged {garbage} and deleted {deleted} of {} garbage entries",
            plan.garbage
        ));
    }
    Ok(TailRound {
        sweep: true,
        get: Percentiles::of(&g),
        put: Percentiles::of(&p),
        secs,
        deleted,
        arbitrated: mark.arbitrated(),
        waits: Some(RoundWaits::since(&before)),
    })
}

/// Every round of `plan` on `store`, alternating quiet and sweep rounds.
pub async fn run(store: &Store, plan: &TailPlan) -> BenchResult<Vec<TailRound>> {
    let live = prepare(store, plan).await?;
    // One untimed warm-up window.
    quiet_round(
        store,
        &TailPlan {
            window: Duration::from_millis(500),
            ..plan.clone()
        },
        &live,
        0,
    )
    .await?;
    let mut out = Vec::new();
    for r in 0..plan.rounds {
        let seed = r as u64 + 1;
        if r % 2 == 0 {
            out.push(quiet_round(store, plan, &live, seed).await?);
            out.push(sweep_round(store, plan, &live, seed).await?);
        } else {
            out.push(sweep_round(store, plan, &live, seed).await?);
            out.push(quiet_round(store, plan, &live, seed).await?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gets of `n` digests never stored (so no cache answers them), from
    /// `from` on.
    async fn miss(store: &Store, from: u32, n: u32) {
        for i in from..from + n {
            let k = Key::new(live_ns(), store_types::Digest::of(&i.to_le_bytes()));
            assert!(store.get(&k).await.unwrap().is_none());
        }
    }

    /// A round's waits are what happened between its two readings: the
    /// reads made before the first are not counted. (No other test of
    /// this binary opens a database.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rounds_waits_count_its_own_reads_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::fixtures::composite_store_window(dir.path(), Duration::ZERO)
            .await
            .unwrap();
        let reads = |w: &RoundWaits| w.inline + w.pooled;
        let start = sqlite_waits();
        miss(&store, 0, 5).await;
        let five = reads(&RoundWaits::since(&start));
        assert!(five >= 5, "five gets made no point reads");
        miss(&store, 5, 50).await;
        let before = sqlite_waits();
        miss(&store, 55, 5).await;
        assert_eq!(reads(&RoundWaits::since(&before)), five);
    }
}
