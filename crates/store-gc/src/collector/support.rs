//! Small pieces every step of the collector uses: retries and back-off,
//! batch checkpoints, task joins, the error of a sweep cut short.

use super::*;

/// ORs one liveness answer for `live.len()` keys of `ns` into `live`; a
/// failed or misaligned answer is an error naming `op`.
pub(super) fn or_into(
    live: &mut [bool],
    answer: Result<Vec<bool>>,
    op: &'static str,
    ns: &Namespace,
) -> Result<()> {
    let answer = answer.map_err(|e| {
        Error::backend(e.kind(), op)
            .with_target(format!("of namespace {ns}"))
            .with_source(e)
    })?;
    if answer.len() != live.len() {
        return Err(Error::backend(ErrorKind::InvalidData, op)
            .with_target(format!("of namespace {ns}"))
            .with_source(format!(
                "it answered {} values for {} keys",
                answer.len(),
                live.len()
            )));
    }
    for (l, a) in live.iter_mut().zip(answer) {
        *l |= a;
    }
    Ok(())
}

pub(super) async fn window_unstage(window: &dyn WindowClauses, keys: &[Key]) -> Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    window.unstage(keys).await
}

/// The error of a sweep that failed: `cause` as is when nothing was
/// committed before it, else [`Error::SweepIncomplete`] with the counts of
/// what was.
pub(super) fn incomplete(cause: Error, report: &SweepReport) -> Error {
    let t = &report.total;
    let did = t.deleted + t.rescued + t.vanished + t.staged + report.resumed_deletes;
    if did == 0 {
        return cause;
    }
    Error::SweepIncomplete {
        cause: Box::new(cause),
        deleted: t.deleted,
        bytes_freed: t.bytes_freed,
        rescued: t.rescued,
        vanished: t.vanished,
        staged: t.staged,
    }
}

/// How long a fleet direct delete waits for another delete of its key.
pub(super) const BUSY_WAIT: Duration = Duration::from_secs(30);

/// 2 ms doubling to 200 ms.
pub(super) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((2u64 << attempt.min(7)).min(200))
}

/// Runs `op` up to three times (50 ms, then 500 ms apart): the steps after a
/// fleet batch's commit, which hold their keys' fences, retry transient
/// failures ([`Error::is_transient`]) before they give up and leave the
/// fences to the next sweep; any other failure gives up at once.
pub(super) async fn retried<T, F, Fut>(mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut last = None;
    for pause in [
        Duration::from_millis(50),
        Duration::from_millis(500),
        Duration::ZERO,
    ] {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => {
                tracing::warn!(error = %Report::new(&e), "a fenced delete step failed; retrying");
                last = Some(e);
                tokio::time::sleep(pause).await;
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// Sets the stop flag of a sweep task when the caller's future is dropped.
pub(super) struct StopOnDrop(pub(super) Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What a sweep checks at every batch boundary: that its caller is still
/// waiting, and (fleet) that it still holds the sweep lock.
pub(super) struct Checkpoint<'a> {
    pub(super) stop: &'a AtomicBool,
    pub(super) lock: Option<Box<dyn store_types::SweepLockGuard>>,
}

impl Checkpoint<'_> {
    /// Stops the sweep (with an error) at a batch boundary once its caller
    /// has gone or its fleet sweep lock was lost.
    pub(super) async fn check(&mut self) -> Result<()> {
        if self.stop.load(Ordering::SeqCst) {
            return Err(Error::backend(ErrorKind::Interrupted, "sweep")
                .with_source("stopped at a batch boundary: its caller went away"));
        }
        if let Some(lock) = self.lock.as_mut() {
            if !lock.held().await? {
                return Err(Error::backend(ErrorKind::ConnectionLost, "sweep").with_source(
                    "stopped at a batch boundary: the fleet sweep lock was lost (its session ended)",
                ));
            }
        }
        Ok(())
    }
}

/// Awaits a GC task: its result, its panic re-raised, or an error when the
/// runtime is shutting down.
pub(super) async fn join<T>(task: tokio::task::JoinHandle<Result<T>>) -> Result<T> {
    match task.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Error::backend(ErrorKind::Interrupted, "run GC task").with_source(e)),
    }
}
