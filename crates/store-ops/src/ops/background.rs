//! Sweeps at a lower CPU priority (ADR-076): the collector's own work
//! runs on one thread of its own, `blobpool-sweep`, whose nice value is
//! [`SWEEP_NICE`], so on a loaded machine the scheduler runs requests
//! first and the sweep in what they leave. Blocking work the sweep starts
//! (its SQLite reads, file deletes) runs on that thread's own blocking
//! pool, whose threads inherit the nice value. The engines' own threads
//! (the SQLite writer) keep theirs.

use std::future::Future;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle};

/// The sweep thread's nice value: a scheduling weight of 15 against a
/// request thread's 1024, so a sweep gets under 2 % of a core that
/// requests also want, and all of one they leave idle.
pub const SWEEP_NICE: i32 = 19;

/// The sweep thread's runtime, started on first use; `None` if the thread
/// or its runtime could not be made (sweeps then run where they are
/// awaited, as before).
fn handle() -> Option<&'static Handle> {
    static SWEEPS: OnceLock<Option<Handle>> = OnceLock::new();
    SWEEPS
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("blobpool-sweep".into())
                .spawn(move || {
                    lower_priority();
                    let rt = Builder::new_current_thread().enable_all().build();
                    let rt = match rt {
                        Ok(rt) => rt,
                        Err(e) => {
                            tracing::warn!(
                                "sweeps run beside requests: no runtime of their own ({e})"
                            );
                            let _ = tx.send(None);
                            return;
                        }
                    };
                    let _ = tx.send(Some(rt.handle().clone()));
                    rt.block_on(std::future::pending::<()>());
                });
            if let Err(e) = spawned {
                tracing::warn!("sweeps run beside requests: no thread of their own ({e})");
                return None;
            }
            rx.recv().ok().flatten()
        })
        .as_ref()
}

/// Lowers the calling thread's priority to [`SWEEP_NICE`] (on Linux a nice
/// value is the thread's own; elsewhere this changes nothing).
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `gettid` and `setpriority` take plain integers and
        // touch no memory of ours.
        let rc = unsafe {
            let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
            libc::setpriority(libc::PRIO_PROCESS, tid, SWEEP_NICE)
        };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            tracing::warn!("the sweep thread keeps its priority: setpriority failed ({e})");
        }
    }
}

/// Runs `work` on the sweep thread and waits for it. Cancel-safe as
/// `work` is: dropped, the caller drops `work` too, at its next await on
/// the sweep thread, as if it had run here (a sweep stops at its next
/// batch boundary, ADR-021).
pub(crate) async fn on_sweep_thread<F>(work: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let Some(h) = handle() else {
        return work.await;
    };
    let task = h.spawn(work);
    let _abort = AbortOnDrop(task.abort_handle());
    match task.await {
        Ok(out) => out,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => unreachable!("only a dropped caller aborts the task: {e}"),
    }
}

/// Aborts the sweep thread's task when the caller stops waiting for it.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_sweep_thread_at_its_nice_value() {
        // SAFETY (here and below): as in `lower_priority`.
        let mine = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = mine();
        let (name, nice) = on_sweep_thread(async {
            let name = std::thread::current().name().map(str::to_string);
            let nice = unsafe {
                let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
                libc::getpriority(libc::PRIO_PROCESS, tid)
            };
            (name, nice)
        })
        .await;
        assert_eq!(name.as_deref(), Some("blobpool-sweep"));
        assert_eq!(nice, SWEEP_NICE);
        // The caller's own thread keeps its priority (whatever it was:
        // a test run under `nice` starts higher).
        assert_eq!(mine(), before);
    }

    #[tokio::test]
    async fn a_dropped_caller_drops_the_work() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let waiting = tokio::spawn(on_sweep_thread(async move {
            // Held until the work is dropped; never sent on.
            let _tx = tx;
            std::future::pending::<()>().await
        }));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        waiting.abort();
        let _ = waiting.await;
        // The sender went with the work: the receiver sees it closed.
        let closed = tokio::time::timeout(std::time::Duration::from_secs(10), rx).await;
        assert!(matches!(closed, Ok(Err(_))), "{closed:?}");
    }

    #[tokio::test]
    async fn a_panic_in_the_work_reaches_the_caller() {
        let caught = tokio::spawn(on_sweep_thread(async { panic!("boom") })).await;
        assert!(caught.unwrap_err().is_panic());
    }
}
