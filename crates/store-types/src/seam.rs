//! The engine-state seam (ADR-010 as repaired by ADR-012 §5).
//!
//! SQL-backed engines expose the clause families they support through
//! [`GcSeam`]; a family an engine does not support is `None` — absent from
//! its capability answer, never a body that fails at run time:
//!
//! | engine   | `ensure_gc_schema`      | window | pin | sweep lock |
//! |----------|-------------------------|--------|-----|------------|
//! | postgres | `gc_pins` + `gc_window` | yes    | yes | yes        |
//! | sqlite   | `gc_window` only        | yes    | no  | no         |
//! | pg-lo    | `gc_window` only        | yes¹   | no  | no         |
//! | local, mem | not seam members      |        |     |            |
//!
//! ¹ used only when pg-lo is the one window host (the kv engine is not
//! SQL-backed).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{Digest, Key, Namespace, Result, Timestamp};

/// A seam member's capability answer.
#[derive(Clone)]
pub struct GcSeam {
    /// Schema management; every seam member has it.
    pub schema: Arc<dyn GcSchema>,
    /// The durable delete-window clauses.
    pub window: Option<Arc<dyn WindowClauses>>,
    /// Fleet pin-row clauses (postgres only).
    pub pins: Option<Arc<dyn PinClauses>>,
    /// The fleet sweep lock (postgres advisory lock only).
    pub sweep_lock: Option<Arc<dyn SweepLockClause>>,
}

impl std::fmt::Debug for GcSeam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcSeam")
            .field("window", &self.window.is_some())
            .field("pins", &self.pins.is_some())
            .field("sweep_lock", &self.sweep_lock.is_some())
            .finish()
    }
}

/// Creates the engine's GC tables.
///
/// # Contract
///
/// `ensure_gc_schema` is idempotent and creates exactly the tables of the
/// ADR-012 §5 row for the engine; `gc_tables` lists the `gc_*` tables that
/// exist now (what the applicability tests assert on).
#[async_trait]
pub trait GcSchema: Send + Sync {
    /// Creates the GC tables this engine hosts, if missing.
    async fn ensure_gc_schema(&self) -> Result<()>;
    /// Names of existing `gc_*` tables, sorted.
    async fn gc_tables(&self) -> Result<Vec<String>>;
}

/// A staged delete candidate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedCandidate {
    /// The candidate.
    pub key: Key,
    /// Its size when staged.
    pub size: u64,
    /// Not deletable before this instant.
    pub visible_after: Timestamp,
}

/// The durable delete window (`gc_window`).
///
/// # Contract
///
/// - `stage` is idempotent per key (re-staging keeps the earliest row).
/// - `take_due` returns staged rows with `visible_after <= now`, ordered by
///   key, without removing them; `unstage` removes rows (rescue or after a
///   delete). A crash between an entry delete and `unstage` leaves a row
///   for an absent entry, which the next sweep unstages.
#[async_trait]
pub trait WindowClauses: Send + Sync {
    /// Stages candidates.
    async fn stage(&self, candidates: &[StagedCandidate]) -> Result<()>;
    /// Which of `digests` in `ns` are staged, index-aligned.
    async fn staged_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>>;
    /// Up to `limit` due rows with key greater than `after`.
    async fn take_due(
        &self,
        now: Timestamp,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<StagedCandidate>>;
    /// Removes rows.
    async fn unstage(&self, keys: &[Key]) -> Result<()>;
    /// Number of staged rows (all namespaces).
    async fn staged_count(&self) -> Result<u64>;
}

/// Fleet pin rows `(key, owner, expires_at)` in `gc_pins`.
#[async_trait]
pub trait PinClauses: Send + Sync {
    /// Inserts or extends the pin row of (key, owner), expiring at `now + ttl`.
    async fn pin_commit(&self, key: &Key, owner: &str, now: Timestamp, ttl: Duration)
        -> Result<()>;
    /// Extends a live row; returns `false` (and changes nothing) when the
    /// row is absent or already expired.
    async fn pin_renew(
        &self,
        key: &Key,
        owner: &str,
        now: Timestamp,
        ttl: Duration,
    ) -> Result<bool>;
    /// Whether each key has an unexpired pin row, index-aligned.
    async fn pin_check(&self, keys: &[Key], now: Timestamp) -> Result<Vec<bool>>;
    /// Deletes expired rows; returns how many.
    async fn reap_expired(&self, now: Timestamp) -> Result<u64>;
}

/// Held while a sweep runs; released on drop.
pub trait SweepLockGuard: Send {}

/// The fleet sweep lock (a PostgreSQL advisory lock).
#[async_trait]
pub trait SweepLockClause: Send + Sync {
    /// Takes the lock without waiting; `None` if another sweeper holds it.
    async fn try_lock(&self) -> Result<Option<Box<dyn SweepLockGuard>>>;
}
