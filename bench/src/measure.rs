//! The timing loop of the ratio table: a figure, its limits and its peer
//! are measured in **interleaved rounds** (the order rotating each round),
//! so a burst of load from elsewhere hits them alike and their ratio stays
//! meaningful even when the absolute figures swing.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

/// A boxed, non-`Send` future (the table drives everything from one
/// `block_on`).
pub type LocalFut<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Something to time: `run(n)` performs `n` operations.
pub trait Workload {
    /// Performs `n` operations (timed).
    fn run(&mut self, n: u64) -> LocalFut<'_>;

    /// Untimed preparation before each timed `run` (default: nothing).
    fn reset(&mut self) -> LocalFut<'_> {
        Box::pin(async {})
    }

    /// Most operations one timed `run` may perform (default: unbounded).
    fn max_batch(&self) -> u64 {
        u64::MAX
    }

    /// Fewest operations one timed `run` should perform (default 1; a
    /// workload spread over `k` concurrent tasks needs a multiple of `k`).
    fn min_batch(&self) -> u64 {
        1
    }
}

/// A [`Workload`] made of an async closure and an untimed async reset.
pub struct Op<F, R> {
    f: F,
    reset: R,
    min_batch: u64,
}

/// Wraps an async closure `async |n| { ... n operations ... }`.
pub fn op<F: AsyncFnMut(u64)>(f: F) -> Op<F, impl AsyncFnMut()> {
    Op {
        f,
        reset: async || {},
        min_batch: 1,
    }
}

impl<F, R> Op<F, R> {
    /// Runs `reset` (untimed) before every timed batch — e.g. to delete
    /// what the previous batch wrote.
    pub fn with_reset<R2: AsyncFnMut()>(self, reset: R2) -> Op<F, R2> {
        Op {
            f: self.f,
            reset,
            min_batch: self.min_batch,
        }
    }

    /// Never times fewer than `n` operations at once.
    pub fn with_min_batch(mut self, n: u64) -> Self {
        self.min_batch = n.max(1);
        self
    }
}

impl<F: AsyncFnMut(u64), R: AsyncFnMut()> Workload for Op<F, R> {
    fn run(&mut self, n: u64) -> LocalFut<'_> {
        Box::pin((self.f)(n))
    }

    fn reset(&mut self) -> LocalFut<'_> {
        Box::pin((self.reset)())
    }

    fn min_batch(&self) -> u64 {
        self.min_batch
    }
}

/// How long to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Timed rounds per workload (the median is reported).
    pub rounds: usize,
    /// Target duration of one timed batch.
    pub slice: Duration,
}

impl Plan {
    /// `--quick`: a few short rounds.
    pub const QUICK: Plan = Plan {
        rounds: 5,
        slice: Duration::from_millis(40),
    };
    /// The full run.
    pub const FULL: Plan = Plan {
        rounds: 5,
        slice: Duration::from_millis(250),
    };
}

/// One workload's result.
#[derive(Clone, Debug)]
pub struct Measured {
    /// Median seconds per operation.
    pub secs_per_op: f64,
    /// Every round's seconds per operation.
    pub samples: Vec<f64>,
    /// Operations per timed batch.
    pub batch: u64,
}

impl Measured {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        1.0 / self.secs_per_op
    }

    /// Relative spread of the rounds: (max - min) / median.
    pub fn spread(&self) -> f64 {
        let min = self.samples.iter().cloned().fold(f64::INFINITY, f64::min);
        let max = self.samples.iter().cloned().fold(0.0, f64::max);
        (max - min) / self.secs_per_op
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

async fn timed(w: &mut dyn Workload, n: u64) -> Duration {
    w.reset().await;
    let t = Instant::now();
    w.run(n).await;
    t.elapsed()
}

/// Warms `w` up and picks the batch size that takes about `slice`.
async fn calibrate(w: &mut dyn Workload, slice: Duration) -> u64 {
    let cap = w.max_batch().max(1);
    let floor = w.min_batch().clamp(1, cap);
    let mut n = floor;
    loop {
        let t = timed(w, n).await;
        if n >= cap || t >= slice / 8 {
            let per = t.as_secs_f64() / n as f64;
            let want = (slice.as_secs_f64() / per.max(1e-9)).round() as u64;
            return want.clamp(floor, cap);
        }
        n = (n * 4).min(cap);
    }
}

/// Measures every workload of `group` in `plan.rounds` interleaved rounds;
/// results are index-aligned with `group`.
pub async fn interleaved(plan: Plan, group: &mut [&mut dyn Workload]) -> Vec<Measured> {
    let mut batches = Vec::with_capacity(group.len());
    for w in group.iter_mut() {
        batches.push(calibrate(&mut **w, plan.slice).await);
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::with_capacity(plan.rounds); group.len()];
    let k = group.len();
    for round in 0..plan.rounds.max(1) {
        for j in 0..k {
            let i = (round + j) % k;
            let n = batches[i];
            let t = timed(&mut *group[i], n).await;
            samples[i].push(t.as_secs_f64() / n as f64);
        }
    }
    samples
        .into_iter()
        .zip(batches)
        .map(|(mut s, batch)| Measured {
            secs_per_op: median(&mut s.clone()),
            samples: std::mem::take(&mut s),
            batch,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[tokio::test]
    async fn interleaves_and_counts() {
        let mut a_ops = 0u64;
        let mut b_ops = 0u64;
        {
            let mut a = op(async |n: u64| {
                a_ops += n;
                tokio::time::sleep(Duration::from_micros(200 * n)).await;
            });
            let mut b = op(async |n: u64| {
                b_ops += n;
                tokio::time::sleep(Duration::from_micros(400 * n)).await;
            });
            let plan = Plan {
                rounds: 3,
                slice: Duration::from_millis(10),
            };
            let r = interleaved(plan, &mut [&mut a, &mut b]).await;
            assert_eq!(r.len(), 2);
            // No timing comparison between the two (a loaded machine can
            // invert 200 µs against 400 µs: tokio's timer has 1 ms
            // granularity); only what a sleep guarantees — never shorter
            // than asked — is asserted.
            assert!(r[0].secs_per_op >= 200e-6, "{}", r[0].secs_per_op);
            assert!(r[1].secs_per_op >= 400e-6, "{}", r[1].secs_per_op);
            assert_eq!(r[0].samples.len(), 3);
            assert_eq!(r[1].samples.len(), 3);
        }
        assert!(a_ops > 3 && b_ops > 3);
    }
}
