//! Admin handlers: namespace and entry listings, per-namespace statistics,
//! online verification, health and the `/metrics` exposition.
//!
//! Every handler here needs the `admin` scope (checked by the transport
//! binding with [`Ops::authorize`]).

use serde::{Deserialize, Serialize};
use store_core::{EntryPage, Store, TierStats, VerifyOptions, VerifySummary, MAX_LIST_LIMIT};
use store_types::{Digest, Namespace};

use crate::error::OpsError;
use crate::payload::HealthResponse;
use crate::Ops;

/// The most entries read at once by [`Ops::verify`].
pub const MAX_VERIFY_CONCURRENCY: usize = 8;

/// The default of [`VerifyRequest::concurrency`].
pub const DEFAULT_VERIFY_CONCURRENCY: usize = 2;

/// The slowest [`VerifyRequest::max_rate`] a request may ask for, bytes
/// per second (1 MiB/s): a verify request answers when it is done, and a
/// slower one would outlast any client's timeout on all but an empty
/// store (a client that drops it stops it). Direct-mode verify
/// (`blobpool verify --max-rate`) has no floor.
pub const MIN_VERIFY_RATE: u64 = 1 << 20;

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
    /// Bytes per second to read at most, at least [`MIN_VERIFY_RATE`]
    /// (default: unpaced).
    #[serde(default)]
    pub max_rate: Option<u64>,
    /// Entries read at once (1..=[`MAX_VERIFY_CONCURRENCY`], default
    /// [`DEFAULT_VERIFY_CONCURRENCY`]).
    #[serde(default)]
    pub concurrency: Option<usize>,
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
        let ns = Namespace::new(namespace)?;
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
        let ns = namespace.map(Namespace::new).transpose()?;
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
        if let Some(rate) = req.max_rate.filter(|r| *r < MIN_VERIFY_RATE) {
            return Err(OpsError::bad_request(format!(
                "max_rate must be at least {MIN_VERIFY_RATE} bytes per second (1 MiB/s), got \
                 {rate}: the request answers when the verify is done; pace a slower one with \
                 `blobpool verify --max-rate` in direct mode"
            )));
        }
        let opts = VerifyOptions {
            namespace: req.namespace.as_deref().map(Namespace::new).transpose()?,
            concurrency,
            max_rate: req.max_rate,
            ..VerifyOptions::new()
        };
        Ok(self.store().verify(&opts).await?)
    }

    /// Asks every tier one cheap question; `status: "unavailable"` with the
    /// error when a tier fails.
    pub async fn health(&self) -> HealthResponse {
        let store = self.store();
        let probe_ns = Namespace::new("health").expect("valid namespace");
        let probe = store
            .has_many(&probe_ns, &[Digest::from_bytes([0; 32])])
            .await;
        HealthResponse {
            status: if probe.is_ok() { "ok" } else { "unavailable" }.to_string(),
            mode: mode_name(store),
            fleet: store.gc().is_fleet(),
            tokens: self.tokens().len() as u64,
            error: probe
                .err()
                .map(|e| store_types::Report::new(&e).to_string()),
        }
    }

    /// The Prometheus text exposition of the counters.
    pub fn render_metrics(&self) -> String {
        self.tokens().reap();
        self.metrics().render(&self.tokens().stats())
    }
}

fn mode_name(store: &Store) -> String {
    match store.mode() {
        store_core::Mode::MemOnly => "mem-only",
        store_core::Mode::KvOnly { .. } => "kv-only",
        store_core::Mode::DualTier { .. } => "dual-tier",
    }
    .to_string()
}
