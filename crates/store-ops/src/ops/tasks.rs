//! The background tasks of an [`Ops`]: the token and upload reapers,
//! the sweep scheduler and the inventory refresher, and the sweep itself.

use std::sync::{Arc, Weak};
use std::time::Duration;

use store_core::{SweepOptions, SweepReport};

use super::{Inner, Ops};
use crate::error::OpsError;

/// `d` ± 10%.
fn jittered(d: Duration) -> Duration {
    use rand::Rng;
    d.mul_f64(rand::rng().random_range(0.9..1.1))
}

impl Ops {
    /// Spawns the upload-session reaper (every quarter of the idle timeout,
    /// at most a minute), or `None` when uploads are not enabled. The task
    /// stops by itself once every clone of this `Ops` is dropped.
    pub fn spawn_upload_reaper(&self) -> Option<tokio::task::JoinHandle<()>> {
        let every = self.inner.uploads.as_ref()?.reap_every();
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(uploads) = weak.upgrade().and_then(|i| i.uploads.clone()) else {
                    return;
                };
                uploads.reap().await;
            }
        }))
    }

    /// Spawns a task ending expired tokens every `every` (useful only when
    /// tokens have a TTL). The task stops by itself once every clone of
    /// this `Ops` is dropped.
    pub fn spawn_token_reaper(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { return };
                inner.tokens.reap();
            }
        })
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

    /// Starts the task that recomputes the stored-inventory gauges of
    /// `/metrics` after a scrape found them older than
    /// [`crate::INVENTORY_REFRESH`] (or missing). A scrape never waits for
    /// it: it renders the last snapshot (none before the first refresh).
    /// The HTTP server runs one; abort the handle to stop it.
    pub fn spawn_inventory_refresher(&self) -> tokio::task::JoinHandle<()> {
        let ops = self.clone();
        tokio::spawn(async move {
            loop {
                ops.metrics().inventory.refresh(ops.store()).await;
            }
        })
    }

    /// One GC pass; the report is data even when the sweep aborted.
    pub async fn sweep(&self) -> Result<SweepReport, OpsError> {
        let report = self.inner.store.gc().sweep(SweepOptions::default()).await?;
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
