//! Admin handlers: namespace and entry listings, per-namespace statistics,
//! online verification, and the stored-inventory gauges of `/metrics`.
//!
//! Every handler here needs the `admin` scope (checked by the transport
//! binding with [`Ops::authorize`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use store_core::{EntryPage, TierStats, VerifyOptions, VerifySummary, MAX_LIST_LIMIT};
use store_types::{Digest, Namespace};
use tokio::sync::Notify;

use crate::error::OpsError;
use crate::Ops;

/// The most entries read at once by [`Ops::verify`].
pub const MAX_VERIFY_CONCURRENCY: usize = 8;

/// The default of [`VerifyRequest::concurrency`].
pub const DEFAULT_VERIFY_CONCURRENCY: usize = 2;

/// The stored-inventory gauges of `/metrics` are recomputed at most this
/// often (and at most every ten times the last computation's duration,
/// whichever is longer), and only when scraped.
pub const INVENTORY_REFRESH: Duration = Duration::from_secs(30);

/// `GET /v1/namespaces`: namespaces holding at least one entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespacesResponse {
    /// Sorted namespace names.
    pub namespaces: Vec<Namespace>,
}

/// `GET /v1/stats`: per namespace and tier, and the sum.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsResponse {
    /// One row per namespace and tier holding entries.
    pub namespaces: Vec<TierStats>,
    /// The sums over every row.
    pub total: StatsTotal,
}

/// Sums of [`TierStats`] rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsTotal {
    /// Entries.
    pub entries: u64,
    /// Content bytes.
    pub bytes: u64,
    /// Entries pinned in this process.
    pub pinned: u64,
    /// Entries staged in the delete window.
    pub staged: u64,
}

impl StatsResponse {
    /// Rows plus their sum.
    pub fn new(namespaces: Vec<TierStats>) -> Self {
        let mut total = StatsTotal::default();
        for r in &namespaces {
            total.entries += r.entries;
            total.bytes += r.bytes;
            total.pinned += r.pinned;
            total.staged += r.staged;
        }
        StatsResponse { namespaces, total }
    }
}

/// `POST /v1/verify`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyRequest {
    /// Only this namespace (default: all).
    #[serde(default)]
    pub namespace: Option<String>,
    /// Quarantine corrupt entries. Refused over the ops layer: the server
    /// has no quarantine directory (use `blobpool verify --quarantine DIR`
    /// in direct mode).
    #[serde(default)]
    pub quarantine: bool,
    /// Bytes per second to read at most (default: unpaced).
    #[serde(default)]
    pub max_rate: Option<u64>,
    /// Entries read at once (1..=[`MAX_VERIFY_CONCURRENCY`], default
    /// [`DEFAULT_VERIFY_CONCURRENCY`]).
    #[serde(default)]
    pub concurrency: Option<usize>,
}

fn parse_ns(namespace: &str) -> Result<Namespace, OpsError> {
    Namespace::new(namespace).map_err(OpsError::from)
}

impl Ops {
    /// Namespaces holding at least one entry (both tiers).
    pub async fn namespaces(&self) -> Result<NamespacesResponse, OpsError> {
        Ok(NamespacesResponse {
            namespaces: self.store().namespaces().await?,
        })
    }

    /// One page of `namespace`'s entries after `after` (a digest), at most
    /// `limit` (1..=1000, default 1000) of them; `bad_request` for a limit
    /// out of range, `key_invalid` for a bad namespace or cursor.
    pub async fn list_entries(
        &self,
        namespace: &str,
        after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<EntryPage, OpsError> {
        let ns = parse_ns(namespace)?;
        let after = after.map(Digest::parse).transpose()?;
        let limit = limit.unwrap_or(MAX_LIST_LIMIT);
        if limit == 0 || limit > MAX_LIST_LIMIT {
            return Err(OpsError::bad_request(format!(
                "limit must be between 1 and {MAX_LIST_LIMIT}, got {limit}"
            )));
        }
        Ok(self.store().list(&ns, after, limit).await?)
    }

    /// Entries, bytes, pinned and staged entries per namespace and tier
    /// (every namespace, or `namespace` only). A full scan of the listed
    /// namespaces.
    pub async fn stats(&self, namespace: Option<&str>) -> Result<StatsResponse, OpsError> {
        let ns = namespace.map(parse_ns).transpose()?;
        Ok(StatsResponse::new(self.store().stats(ns.as_ref()).await?))
    }

    /// Re-reads every entry (or a namespace's) through the verified read
    /// path and reports `checked, ok, corrupt, missing, failed` (see
    /// [`store_core::Store::verify`]). `quarantine: true` is refused with
    /// `bad_request`: the ops layer has no quarantine directory.
    ///
    /// Runs until done: over HTTP the answer comes at the end. Dropping the
    /// future stops it (it only reads).
    pub async fn verify(&self, req: VerifyRequest) -> Result<VerifySummary, OpsError> {
        if req.quarantine {
            return Err(OpsError::bad_request(
                "quarantine is not available through the server (it has no quarantine \
                 directory): verify reports corrupt entries; quarantine them with \
                 `blobpool verify --quarantine DIR` in direct mode",
            ));
        }
        let concurrency = req.concurrency.unwrap_or(DEFAULT_VERIFY_CONCURRENCY);
        if concurrency == 0 || concurrency > MAX_VERIFY_CONCURRENCY {
            return Err(OpsError::bad_request(format!(
                "concurrency must be between 1 and {MAX_VERIFY_CONCURRENCY}, got {concurrency}"
            )));
        }
        if req.max_rate == Some(0) {
            return Err(OpsError::bad_request("max_rate must be at least 1"));
        }
        let opts = VerifyOptions {
            namespace: req.namespace.as_deref().map(parse_ns).transpose()?,
            concurrency,
            max_rate: req.max_rate,
            ..VerifyOptions::new()
        };
        Ok(self.store().verify(&opts).await?)
    }

    /// Starts the task that recomputes the stored-inventory gauges of
    /// `/metrics` after a scrape found them older than
    /// [`INVENTORY_REFRESH`] (or missing). A scrape never waits for it: it
    /// renders the last snapshot (none before the first refresh). The
    /// HTTP server runs one; abort the handle to stop it.
    pub fn spawn_inventory_refresher(&self) -> tokio::task::JoinHandle<()> {
        let ops = self.clone();
        tokio::spawn(async move {
            let inv = &ops.metrics().inventory;
            loop {
                inv.wanted.notified().await;
                if !inv.stale() {
                    continue;
                }
                let started = Instant::now();
                match ops.store().stats(None).await {
                    Ok(rows) => {
                        *inv.lock() = Some(Snapshot {
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
                        if let Some(s) = inv.lock().as_mut() {
                            s.at = Instant::now();
                        }
                    }
                }
            }
        })
    }
}

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
