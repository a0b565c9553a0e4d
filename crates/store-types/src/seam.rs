//! The engine-state seam (ADR-010 as repaired by ADR-012 §5).
//!
//! SQL-backed engines expose the clause families they support through
//! [`GcSeam`]; a family an engine does not support is `None` — absent from
//! its capability answer, never a body that fails at run time:
//!
//! | engine   | `ensure_gc_schema`      | window | pin | sweep lock | window deletes² |
//! |----------|-------------------------|--------|-----|------------|-----------------|
//! | postgres | `gc_pins` + `gc_window` | yes    | yes | yes        | no              |
//! | sqlite   | `gc_window` only        | yes    | no  | no         | yes             |
//! | pg-lo    | `gc_window` only        | yes¹   | no  | no         | no              |
//! | local, mem | not seam members      |        |     |            |                 |
//!
//! ¹ used only when pg-lo is the one window host (the kv engine is not
//! SQL-backed).
//! ² [`WindowDeletes`], used by a non-fleet sweep when the window host is
//! the kv engine (ADR-081).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use bytes::Bytes;

use crate::{
    BoundLivenessTable, Digest, FleetBatch, FleetPolicy, Instance, Key, LivenessTable, Namespace,
    PinGeneration, PinIntent, PolicyRow, ProtectReason, PublishOutcome, Result, Timestamp,
};

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
    /// Entry deletes that unstage in the same transaction (sqlite only,
    /// ADR-081): the window rows and the entries are one database's.
    pub window_deletes: Option<Arc<dyn WindowDeletes>>,
}

impl std::fmt::Debug for GcSeam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcSeam")
            .field("window", &self.window.is_some())
            .field("pins", &self.pins.is_some())
            .field("sweep_lock", &self.sweep_lock.is_some())
            .field("window_deletes", &self.window_deletes.is_some())
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
///
/// # Whose clock
///
/// A host that has a clock of its own — a database several processes
/// share (PostgreSQL) — answers [`WindowClauses::now`] with it and judges
/// `take_due` by it, **ignoring the `now` parameter**: every node of a
/// fleet then stages (`visible_after = now() + window`) and executes by
/// one clock, whatever their own clocks say. Hosts without one answer
/// `None` (the default) and use the caller's `now`, the collector's
/// injected clock: the in-process window, and SQLite's (one process on one
/// machine, whose clock is the database's).
#[async_trait]
pub trait WindowClauses: Send + Sync {
    /// Stages candidates.
    async fn stage(&self, candidates: &[StagedCandidate]) -> Result<()>;
    /// Which of `digests` in `ns` are staged, index-aligned.
    async fn staged_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>>;
    /// Up to `limit` due rows with key greater than `after`: `visible_after
    /// <= now` by the host's own clock when it has one (then `now` is not
    /// used), else by `now`.
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
    /// The host's own clock, if it has one (see "Whose clock" above): the
    /// time to stage by (`visible_after = now + window`) and the time
    /// `take_due` judges by. `None` (the default): the host has no clock of
    /// its own; callers use theirs.
    async fn now(&self) -> Result<Option<Timestamp>> {
        Ok(None)
    }
}

/// A window host that also holds the kv engine's entries (sqlite,
/// ADR-081): a sweep's delete of a chunk and the unstage of what it
/// deleted commit together, one write transaction instead of two.
///
/// # Contract
///
/// `delete_unstaging` deletes each of `digests` from `ns` and, in the same
/// transaction, removes the `gc_window` row of every digest it deleted.
/// A digest the entries did not hold keeps its row (the caller deletes it
/// from a later tier, then unstages it). It answers like
/// [`crate::Engine::delete_many`]: the freed size per digest, `None` when
/// absent. A failure part way leaves earlier chunks committed, each with
/// its rows unstaged; nothing is ever deleted without its unstage, nor
/// unstaged without its delete.
#[async_trait]
pub trait WindowDeletes: Send + Sync {
    /// Deletes `digests` of `ns` and unstages those it held, atomically
    /// per chunk.
    async fn delete_unstaging(
        &self,
        ns: &Namespace,
        digests: &[Digest],
    ) -> Result<Vec<Option<u64>>>;
}

/// The fleet host's clauses (postgres only), one trait per concern:
/// [`PinRows`], [`LivenessClauses`], [`BatchClauses`] and
/// [`PolicyClauses`]; every type with all four is one.
pub trait PinClauses: PinRows + LivenessClauses + BatchClauses + PolicyClauses {}

impl<T: PinRows + LivenessClauses + BatchClauses + PolicyClauses + ?Sized> PinClauses for T {}

/// Fleet pin rows `(key, owner, expires_at, generation)` in `gc_pins`.
///
/// # Generations (ADR-054)
///
/// Each row carries a [`PinGeneration`]: every writer that creates the row
/// of (key, owner), or finds it already expired by the host's clock,
/// gives it a new one; a writer that extends an unexpired row keeps it.
/// Writers judge expiry under the key's shared lock, by the clock at
/// their statement, so a row a sweep batch judged expired never keeps its
/// generation. An unchanged, unexpired generation therefore proves the
/// row held without a gap since that generation was assigned (the fleet
/// reference guard relies on it, [`crate::PinProof`]).
///
/// # Whose clock
///
/// Pin rows are written and judged by the **host's clock** (PostgreSQL's
/// `gc_now()`), never by a node's: a row written by one node and judged by
/// another must not depend on their clocks agreeing. The `now` parameters
/// here (and of [`FleetBatch::protected`], and [`PinIntent::now`]) are the
/// caller's clock, for hosts without a clock of their own; the PostgreSQL
/// host ignores them and binds `ttl` as a duration.
#[async_trait]
pub trait PinRows: Send + Sync {
    /// Inserts or extends the pin row of (key, owner), expiring `ttl` after
    /// the host's now (a new generation if the row was absent or expired).
    async fn pin_commit(&self, key: &Key, owner: &str, now: Timestamp, ttl: Duration)
        -> Result<()>;
    /// Extends a live row to expire `ttl` after the host's now (its
    /// generation stays); returns `false` (and changes nothing) when the
    /// row is absent or already expired.
    async fn pin_renew(
        &self,
        key: &Key,
        owner: &str,
        now: Timestamp,
        ttl: Duration,
    ) -> Result<bool>;
    /// Whether each key has an unexpired pin row (by the host's clock),
    /// index-aligned.
    async fn pin_check(&self, keys: &[Key], now: Timestamp) -> Result<Vec<bool>>;
    /// Deletes rows expired by the host's clock; returns how many.
    async fn reap_expired(&self, now: Timestamp) -> Result<u64>;

    /// Where `gc_pins` lives (database and schema), for engines that
    /// commit pin rows in their own transaction (pg-lo's joint publish).
    fn pin_host(&self) -> Instance;

    /// The fleet put of a kv entry: takes the key's shared lock, inserts
    /// the entry (if absent) and upserts the pin row of `pin` in **one
    /// transaction**. A dedup hit still commits the pin.
    async fn put_pinned(&self, key: &Key, bytes: Bytes, pin: &PinIntent) -> Result<PublishOutcome>;

    /// The pin-first step of a put whose publish is not transactional
    /// (a rename on shared media): takes the key's shared lock and commits
    /// the pin row, before the caller publishes. Returns the row's
    /// generation after the commit (see "Generations" above): the proof a
    /// later reference set presents ([`crate::PinProof`]).
    async fn pin_first(&self, key: &Key, pin: &PinIntent) -> Result<PinGeneration>;
}

/// Fleet liveness tables: checked, bound, and registered in the shared
/// database so every node's sweep consults them.
#[async_trait]
pub trait LivenessClauses: Send + Sync {
    /// Checks that a fleet liveness table exists and has the named columns;
    /// returns it bound to `ns` (with the digest column's encoding).
    async fn bind_liveness_table(
        &self,
        ns: &Namespace,
        table: &LivenessTable,
    ) -> Result<BoundLivenessTable>;

    /// Registers a fleet liveness table for `ns` **in the shared database**
    /// on behalf of `registrant` (checked as by
    /// [`LivenessClauses::bind_liveness_table`]), so every node's sweep
    /// consults it. Idempotent per registrant.
    async fn register_liveness_table(
        &self,
        ns: &Namespace,
        table: &LivenessTable,
        registrant: &str,
    ) -> Result<BoundLivenessTable>;

    /// Removes `registrant`'s registration of the table for `ns`, or with
    /// `None` every registrant's (the table stops protecting anything);
    /// `false` if nothing was registered. The table protects while any
    /// registration of it remains.
    async fn deregister_liveness_table(
        &self,
        ns: &Namespace,
        table: &LivenessTable,
        registrant: Option<&str>,
    ) -> Result<bool>;

    /// Every liveness table registered in the shared database, by any node.
    async fn liveness_tables(&self) -> Result<Vec<BoundLivenessTable>>;
}

/// A fleet sweep's arbitration and its execute batches, with the
/// deletion fences they leave.
#[async_trait]
pub trait BatchClauses: Send + Sync {
    /// The mark phase's arbitration, unlocked: protection of each key by an
    /// unexpired pin row or a row in `tables`.
    async fn arbitrate(
        &self,
        keys: &[Key],
        tables: &[BoundLivenessTable],
        now: Timestamp,
    ) -> Result<Vec<Option<ProtectReason>>>;

    /// Opens an execute-phase batch over `keys`: a transaction holding each
    /// key's exclusive lock (taken in key order).
    async fn begin_batch(&self, keys: &[Key]) -> Result<Box<dyn FleetBatch>>;

    /// Clears the deletion fences of `keys` (see [`FleetBatch::fence`]):
    /// called once every large-tier delete of those keys has finished.
    async fn unfence(&self, keys: &[Key]) -> Result<()>;

    /// Up to `limit` fenced keys whose fence is older than `grace` by the
    /// database's clock: deletes a sweeper started and never confirmed
    /// (it crashed, or lost its session). The next sweep finishes them.
    async fn stale_fences(&self, grace: Duration, limit: usize) -> Result<Vec<Key>>;
}

/// Fleet GC policies (ADR-045), one row per namespace and node in the
/// shared database.
#[async_trait]
pub trait PolicyClauses: Send + Sync {
    /// Records `owner`'s GC policy for `ns` in the shared database
    /// (ADR-045), or with `None` removes `owner`'s row. One statement: a
    /// changed policy replaces the node's old row atomically (the new one
    /// is in force the instant the old one is gone). Never touches another
    /// owner's row.
    async fn set_gc_policy(
        &self,
        ns: &Namespace,
        owner: &str,
        policy: Option<FleetPolicy>,
    ) -> Result<()>;

    /// Every node's policy rows, in namespace then owner order.
    async fn gc_policies(&self) -> Result<Vec<PolicyRow>>;
}

/// Held while a sweep runs.
///
/// # Contract
///
/// `release` returns once the lock is free for other sweepers; dropping a
/// guard without `release` must still free it (possibly asynchronously).
#[async_trait]
pub trait SweepLockGuard: Send {
    /// Releases the lock and waits until it is free.
    async fn release(self: Box<Self>) -> Result<()> {
        Ok(())
    }

    /// Whether the lock is still held. A session lock ends with its session
    /// (an idle timeout, a proxy cutting idle connections, a failover)
    /// without telling its holder; a sweep asks at every batch boundary and
    /// stops when it is gone, so two sweepers never run at once for long.
    async fn held(&mut self) -> Result<bool> {
        Ok(true)
    }
}

/// The fleet sweep lock (a PostgreSQL advisory lock).
#[async_trait]
pub trait SweepLockClause: Send + Sync {
    /// Takes the lock without waiting; `None` if another sweeper holds it.
    async fn try_lock(&self) -> Result<Option<Box<dyn SweepLockGuard>>>;
}
