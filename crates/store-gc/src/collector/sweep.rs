//! The sweep: its owned task, the sweep lock, and its phases in order.
//!
//! # How a sweep flows
//!
//! ```text
//! Gc::sweep() (store-core) ──── first trims every cache namespace
//!  │                (Store::trim_caches, ADR-048: pending reads written,
//!  │                then keys outside their bounds removed; fleet: the
//!  │                gc_policies cache rows' loosest bounds)
//!  ├─ Collector::sweep: spawns the pass as a task owning everything below; the
//!  │                caller awaits its handle (dropping the caller stops the
//!  │                task at the next batch boundary, never inside a batch)
//!  ├─ in-process sweep mutex (try) ── busy → aborted: SweeperLock
//!  ├─ fleet: pg_try_advisory_lock ── busy → aborted: SweeperLock
//!  ├─ sources: in-process callbacks; fleet: every gc_liveness row (any node's)
//!  │    and the namespaces the gc_policies rows sweep (keep on any node wins)
//!  │    none ──────────────────────────────── aborted: NoLivenessSources
//!  │    (re-read before every batch below; references and cache keys are
//!  │     consulted in every swept namespace: non-fleet probed, fleet bound
//!  │     into the SQL)
//!  ├─ protect_keys() fails ───────────────── aborted: ProtectFailed
//!  ├─ fleet: finish stale fences (older than FENCE_GRACE by gc_now()):
//!  │    delete large copies again, clear fences → resumed_deletes
//!  ├─ now = window host's clock (SQL: gc_now(); else the process clock)
//!  ├─ EXECUTE due window (visible_after ≤ now), per batch of ≤ SweepOptions::batch:
//!  │    non-fleet: gate unpinned keys (busy keys: retried after the other delete)
//!  │               → probe sources + protect set
//!  │               → delete (kv, then large; awaited) → unstage → release gate
//!  │               (kv = window host, ADR-081: each kv delete chunk unstages
//!  │                what it deleted in its own transaction; the rest after)
//!  │    fleet:     BEGIN; advisory xact lock per key (exclusive)
//!  │               → arbitrate in SQL (pins unexpired by gc_now(), liveness tables)
//!  │               → delete kv rows + FENCE doomed keys (gc_deleting) → unstage → COMMIT
//!  │               → delete large entries (fenced, no locks) → clear fences
//!  │    protected → rescued (unstaged); protected but gone → vanished
//!  ├─ MARK: per swept namespace, per tier, scan pages
//!  │    → skip staged and copies an earlier tier holds → arbitrate
//!  │    → stage garbage with visible_after = now + window
//!  ├─ maintenance: fleet → reap expired pin rows; every engine → Engine::maintain
//!  │    (local: stage files no live put holds; object: stage objects past their grace)
//!  └─ SweepReport { aborted, total, namespaces, unswept_namespaces, reaped_pins,
//!                   reaped_stages, resumed_deletes, duration }
//!     a failure after committed batches: Err(SweepIncomplete { cause, counts })
//! ```
//!
//! The window host is one per instance: the kv engine when SQL-backed, else
//! pg-lo, else in process (ADR-012 §5).
//!
//! A sweep logs at info: this pass's `sweep finished` line (store-gc's
//! target) with its counts, store-core's `sweep` line (target
//! `store_core::gc`, with the store's owner), and one `cache trim` line
//! per cache namespace that lost keys; the server adds one more, the
//! `blobpool::gc` line of a scheduled sweep or the `blobpool::audit` line
//! of `POST /v1/sweep`. A failed pass warns on the first two instead.
//!
//! The names: [`Collector::sweep`], [`SweepOptions::batch`],
//! [`GcAbortCause`], [`FENCE_GRACE`],
//! [`SweepReport`], [`store_types::Engine::maintain`],
//! [`store_types::Error::SweepIncomplete`].

use super::*;

impl Collector {
    /// One GC pass (ADR-012 §1, §5, §6.7): lock, abort checks, execute the
    /// due window, mark new garbage, maintenance, report. `Err` only for
    /// operational failure; deliberate no-ops are `Ok` with `aborted` set.
    ///
    /// Cancel-safe: the pass runs in a task of its own. Dropping this
    /// future (a client disconnecting, a `timeout`, a `select!`) asks the
    /// task to stop at the next batch boundary; a batch in progress keeps
    /// its protection (gate, or locked batch and fences) until every media
    /// delete of that batch has finished, then the task releases the sweep
    /// locks and ends.
    pub async fn sweep(self: &Arc<Self>, opts: &SweepOptions) -> Result<SweepReport> {
        let stop = Arc::new(AtomicBool::new(false));
        let _stop_on_drop = StopOnDrop(Arc::clone(&stop));
        let this = Arc::clone(self);
        let opts = opts.clone();
        join(tokio::spawn(
            async move { this.sweep_owned(&opts, &stop).await },
        ))
        .await
    }

    pub(super) async fn sweep_owned(
        &self,
        opts: &SweepOptions,
        stop: &AtomicBool,
    ) -> Result<SweepReport> {
        let started = Instant::now();
        let batch = opts.batch.max(1);
        let Ok(_local) = self.sweep_lock.try_lock() else {
            return Ok(SweepReport::aborted(
                GcAbortCause::SweeperLock,
                started.elapsed(),
            ));
        };
        let shared = match &self.cfg.shared_lock {
            Some(lock) => match lock.try_lock().await? {
                Some(guard) => Some(guard),
                None => {
                    return Ok(SweepReport::aborted(
                        GcAbortCause::SweeperLock,
                        started.elapsed(),
                    ))
                }
            },
            None => None,
        };
        let mut cp = Checkpoint { stop, lock: shared };
        let result = self.sweep_locked(started, batch, &mut cp).await;
        // Release explicitly so the next sweeper (on any node) finds the
        // lock free as soon as this call returns. A failed release (its
        // session died, which frees the lock anyway) never replaces the
        // pass's own outcome.
        if let Some(guard) = cp.lock {
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %Report::new(&e), "releasing the fleet sweep lock failed (the lock ends with its session)");
            }
        }
        match &result {
            Ok(r) => tracing::info!(
                deleted = r.total.deleted,
                bytes_freed = r.total.bytes_freed,
                staged = r.total.staged,
                rescued = r.total.rescued,
                vanished = r.total.vanished,
                resumed_deletes = r.resumed_deletes,
                aborted = ?r.aborted,
                ms = r.duration.as_millis() as u64,
                "sweep finished"
            ),
            Err(e) => tracing::warn!(error = %Report::new(e), "sweep failed"),
        }
        result
    }

    pub(super) async fn sweep_locked(
        &self,
        started: Instant,
        batch: usize,
        cp: &mut Checkpoint<'_>,
    ) -> Result<SweepReport> {
        let snap = self.snapshot().await?;
        if snap.is_empty() {
            return Ok(SweepReport::aborted(
                GcAbortCause::NoLivenessSources,
                started.elapsed(),
            ));
        }
        let protected = match self.protected_set().await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %Report::new(&e), "the protect callback failed; the sweep deletes nothing");
                let mut report =
                    SweepReport::aborted(GcAbortCause::ProtectFailed, started.elapsed());
                report.protect_error = Some(e);
                return Ok(report);
            }
        };
        let mut report = SweepReport::default();
        match self.sweep_phases(&protected, batch, cp, &mut report).await {
            Ok(()) => {
                report.finish(started.elapsed());
                Ok(report)
            }
            Err(cause) => {
                report.finish(started.elapsed());
                Err(incomplete(cause, &report))
            }
        }
    }

    pub(super) async fn sweep_phases(
        &self,
        protected: &HashSet<Key>,
        batch: usize,
        cp: &mut Checkpoint<'_>,
        report: &mut SweepReport,
    ) -> Result<()> {
        if let Some(pins) = &self.cfg.fleet_pins {
            // A fence that cannot be finished (an undeletable object, a
            // media error) must not stop every sweep of the fleet: it stays
            // and is retried by the next sweep.
            if let Err(e) = self
                .finish_stale_fences(pins.as_ref(), batch, cp, report)
                .await
            {
                tracing::warn!(error = %Report::new(&e), "finishing a crashed sweeper's deletes failed; its fences stay for the next sweep");
            }
        }
        let now = self.now().await?;
        self.execute_due(protected, now, batch, cp, report).await?;
        let now = self.now().await?;
        self.mark(protected, batch, cp, report).await?;
        if let Some(pins) = &self.cfg.fleet_pins {
            report.reaped_pins = pins.reap_expired(now).await?;
        }
        for tier in &self.tiers {
            report.reaped_stages += tier.maintain(now).await?;
        }
        Ok(())
    }
}
