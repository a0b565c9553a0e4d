//! The background tasks of an [`Ops`]: the token and upload reapers,
//! the sweep scheduler and the inventory refresher, and the sweep itself.

use std::sync::{Arc, Weak};
use std::time::Duration;

use store_core::{SweepOptions, SweepReport};

use super::{background, Inner, Ops};
use crate::error::OpsError;

/// Spawns `f` every `every` (delayed ticks) until `weak` is gone.
fn every_tick<S, F, Fut, T>(every: Duration, weak: Weak<S>, f: F) -> tokio::task::JoinHandle<()>
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(held) = weak.upgrade() else { return };
            f(held).await;
        }
    })
}

/// `d` ± 10%.
fn jittered(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.9..1.1))
}

impl Ops {
    /// Spawns the server's background tasks; abort the handles to stop
    /// them. The token reaper, when tokens have an idle TTL, runs every
    /// quarter of it (50 ms to 30 s); the upload-session reaper, when
    /// uploads are enabled, every quarter of the idle timeout (at most a
    /// minute); both also stop once every clone of this `Ops` is dropped.
    /// The third recomputes `/metrics`' inventory gauges after a scrape
    /// found them older than [`crate::INVENTORY_REFRESH`] (a scrape never
    /// waits for it: it renders the last snapshot, none before the first).
    pub fn spawn_tasks(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let token_reap = self.inner.tokens.ttl().map(|ttl| {
            let every = (ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
            let weak = Arc::downgrade(&self.inner);
            every_tick(every, weak, |i: Arc<Inner>| async move { i.tokens.reap() })
        });
        // The session table lives as long as `inner`, its only holder.
        let upload_reap = self.inner.uploads.as_ref().map(|u| {
            every_tick(u.reap_every(), Arc::downgrade(u), |u| async move {
                u.reap().await
            })
        });
        let ops = self.clone();
        let inventory = tokio::spawn(async move {
            loop {
                ops.metrics().inventory.refresh(ops.store()).await;
            }
        });
        [token_reap, upload_reap, Some(inventory)]
            .into_iter()
            .flatten()
            .collect()
    }

    /// Spawns a task running [`Ops::sweep`] every `every` ±10% (jitter, so
    /// the nodes of a fleet drift apart; the fleet sweep lock keeps at most
    /// one sweep running and a node that finds it held reports
    /// `aborted: sweeper_lock`). Each report goes to the `blobpool::gc`
    /// log target and to the sweep metrics. The task stops by itself once
    /// every clone of this `Ops` is dropped, or when aborted (a sweep in
    /// progress then finishes its batch: sweeps run as tasks of their own,
    /// ADR-021).
    pub fn spawn_sweep_scheduler(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(jittered(every)).await;
                let Some(inner) = weak.upgrade() else { return };
                let ops = Ops { inner };
                match ops.sweep().await {
                    Ok(report) => tracing::info!(
                        target: "blobpool::gc",
                        "scheduled sweep: {}",
                        serde_json::to_string(&report).unwrap_or_default()
                    ),
                    Err(e) => {
                        tracing::warn!(target: "blobpool::gc", "scheduled sweep failed: {}", store_types::Report::new(&e))
                    }
                }
            }
        })
    }

    /// One GC pass; the report is data even when the sweep aborted.
    ///
    /// The sweep runs on the sweep thread, at a lower CPU priority than
    /// requests (ADR-076). Cancel-safe: dropped, the sweep is dropped with
    /// it and stops at its next batch boundary (ADR-021).
    pub async fn sweep(&self) -> Result<SweepReport, OpsError> {
        let store = self.inner.store.clone();
        let swept =
            background::on_sweep_thread(
                async move { store.gc().sweep(SweepOptions::default()).await },
            );
        let report = swept.await?;
        self.inner.metrics.sweep(&report);
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduled_sweeps_are_jittered_within_ten_percent() {
        for _ in 0..200 {
            let j = jittered(Duration::from_secs(100));
            assert!(
                j >= Duration::from_secs(90) && j <= Duration::from_secs(110),
                "{j:?}"
            );
        }
    }
}
