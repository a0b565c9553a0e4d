//! The stored-inventory gauges of `/metrics`: the last snapshot of the
//! store's statistics and the scrape signal that asks for a fresh one
//! (refreshed by a task of [`crate::Ops::spawn_tasks`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use store_core::{Store, TierStats};
use tokio::sync::Notify;

/// The stored-inventory gauges of `/metrics` are recomputed at most this
/// often (and at most every ten times the last computation's duration,
/// whichever is longer), and only when scraped.
pub const INVENTORY_REFRESH: Duration = Duration::from_secs(30);

/// The stored inventory as a scrape sees it.
pub(crate) struct InventorySample {
    /// Per namespace and tier.
    pub(crate) rows: Vec<TierStats>,
    /// Seconds since the snapshot was taken.
    pub(crate) age_secs: f64,
}

struct Snapshot {
    at: Instant,
    took: Duration,
    rows: Vec<TierStats>,
}

/// The last stored-inventory snapshot for `/metrics`, and the scrape
/// signal that asks for a fresh one.
#[derive(Default)]
pub(crate) struct Inventory {
    snapshot: Mutex<Option<Snapshot>>,
    wanted: Notify,
}

impl std::fmt::Debug for Inventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inventory")
            .field("rows", &self.lock().as_ref().map(|s| s.rows.len()))
            .finish()
    }
}

impl Inventory {
    /// Waits until a scrape asks for a fresh snapshot, then, if the last
    /// one is stale ([`INVENTORY_REFRESH`]), recomputes it from `store`.
    pub(crate) async fn refresh(&self, store: &Store) {
        self.wanted.notified().await;
        if !self.stale() {
            return;
        }
        let started = Instant::now();
        match store.stats(None).await {
            Ok(rows) => {
                *self.lock() = Some(Snapshot {
                    at: Instant::now(),
                    took: started.elapsed(),
                    rows,
                });
            }
            Err(e) => {
                tracing::warn!(
                    "inventory gauges: cannot compute statistics: {}",
                    store_types::Report::new(&e)
                );
                // Do not retry at once on a failing backend.
                if let Some(s) = self.lock().as_mut() {
                    s.at = Instant::now();
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Snapshot>> {
        self.snapshot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stale(&self) -> bool {
        match self.lock().as_ref() {
            None => true,
            Some(s) => s.at.elapsed() >= INVENTORY_REFRESH.max(s.took * 10),
        }
    }

    /// The last snapshot's rows and age, for the gauges of `/metrics`
    /// (`crate::metrics`; `None` before the first refresh), and asks the
    /// refresher for a fresh one.
    pub(crate) fn sample(&self) -> Option<InventorySample> {
        self.wanted.notify_one();
        let guard = self.lock();
        let s = guard.as_ref()?;
        Some(InventorySample {
            rows: s.rows.clone(),
            age_secs: s.at.elapsed().as_secs_f64(),
        })
    }
}
