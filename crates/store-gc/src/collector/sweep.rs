//! The sweep: its owned task, the sweep lock, and its phases in order.

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
