//! The accept loop of [`serve_router`](super::serve_router): one task per
//! accepted connection under the connection cap, the `503` answer beyond
//! it, accept errors (skipped, or logged at most once per
//! [`LOG_INTERVAL`] and backed off), the periodic memory trim, and the
//! shutdown drain.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

use super::conn::{connection, Shared};
use super::overload::reject;
use super::ACCEPT_BACKOFF;

/// At most one accept-error (or overload) log line per this interval.
const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// How often the accept loop considers returning freed memory.
const TRIM_EVERY: Duration = Duration::from_secs(10);

/// Connections that must have closed since the last trim for the next one:
/// a burst of clients (a flood, a stall the timeouts ended) leaves its
/// buffers in the allocator's free lists, which glibc does not give back
/// to the system by itself.
const TRIM_AFTER_CLOSED: usize = 256;

/// Returns the allocator's free memory to the system (glibc's
/// `malloc_trim`; a no-op elsewhere). Runs on the blocking pool: it walks
/// the heap.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only releases free memory; it takes no
    // pointers and is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The accept loop's state: the connection tasks, the tasks answering
/// connections beyond the cap, the permits bounding both, the rate-limited
/// logs and the count of connections closed since the last memory trim.
pub(super) struct AcceptLoop {
    shared: Arc<Shared>,
    /// Set to `true` when shutdown is requested; every connection watches
    /// it.
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    permits: Arc<Semaphore>,
    reject_permits: Arc<Semaphore>,
    conns: JoinSet<()>,
    rejects: JoinSet<()>,
    accept_log: RateLimited,
    overload_log: RateLimited,
    closed_since_trim: usize,
}

impl AcceptLoop {
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        let limits = &shared.limits;
        let (stop_tx, stop_rx) = watch::channel(false);
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        let reject_permits = Arc::new(Semaphore::new((limits.max_connections / 8).clamp(16, 256)));
        AcceptLoop {
            shared,
            stop_tx,
            stop_rx,
            permits,
            reject_permits,
            conns: JoinSet::new(),
            rejects: JoinSet::new(),
            accept_log: RateLimited::new(LOG_INTERVAL),
            overload_log: RateLimited::new(LOG_INTERVAL),
            closed_since_trim: 0,
        }
    }

    /// Accepts connections until `shutdown` resolves; the listener is
    /// closed when this returns.
    pub(super) async fn run<F>(&mut self, listener: TcpListener, shutdown: F)
    where
        F: Future<Output = ()>,
    {
        let mut trim_tick = tokio::time::interval(TRIM_EVERY);
        trim_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = trim_tick.tick() => self.maybe_trim(),
                Some(done) = self.conns.join_next(), if !self.conns.is_empty() => {
                    self.closed(done);
                }
                Some(_) = self.rejects.join_next(), if !self.rejects.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, remote)) => self.accepted(stream, remote),
                    Err(e) => {
                        if self.accept_failed(&e) {
                            tokio::select! {
                                () = &mut shutdown => break,
                                () = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                            }
                        }
                    }
                },
            }
        }
    }

    /// Returns freed memory to the system when enough connections have
    /// closed since the last time.
    fn maybe_trim(&mut self) {
        if self.closed_since_trim >= TRIM_AFTER_CLOSED {
            self.closed_since_trim = 0;
            tokio::task::spawn_blocking(return_freed_memory);
        }
    }

    /// A connection task ended.
    fn closed(&mut self, done: Result<(), JoinError>) {
        self.closed_since_trim += 1;
        if let Err(e) = done {
            if e.is_panic() {
                tracing::error!("connection task panicked: {e}");
            }
        }
    }

    /// Serves an accepted connection under the cap, or answers it `503`.
    fn accepted(&mut self, stream: TcpStream, remote: SocketAddr) {
        let _ = stream.set_nodelay(true);
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.conns.spawn(connection(
                    stream,
                    remote,
                    permit,
                    self.shared.clone(),
                    self.stop_rx.clone(),
                ));
            }
            Err(_) => {
                if let Some(suppressed) = self.overload_log.ready() {
                    tracing::warn!(
                        "connection cap of {} reached: answering 503 overloaded \
                         ({suppressed} more since the last report)",
                        self.shared.limits.max_connections
                    );
                }
                // Bounded too: past it the socket is just closed.
                if let Ok(p) = self.reject_permits.clone().try_acquire_owned() {
                    self.rejects.spawn(reject(stream, self.shared.clone(), p));
                }
            }
        }
    }

    /// Logs a failed accept (rate-limited); `true` when the loop must back
    /// off for [`ACCEPT_BACKOFF`].
    fn accept_failed(&mut self, e: &io::Error) -> bool {
        let kind = classify_accept_error(e);
        if kind == AcceptError::Connection {
            tracing::debug!("accept: {e} (skipped)");
            return false;
        }
        if let Some(suppressed) = self.accept_log.ready() {
            if kind == AcceptError::Resources {
                tracing::error!(
                    "accept failed: {e}: out of file descriptors or memory; \
                     backing off ({suppressed} more since the last report; \
                     raise the open-files limit or max_connections)"
                );
            } else {
                tracing::error!(
                    "accept failed: {e}; backing off \
                     ({suppressed} more since the last report)"
                );
            }
        }
        true
    }

    /// Drain: no new connections, graceful shutdown of the open ones for
    /// at most the drain timeout, then the rest aborted.
    pub(super) async fn drain(mut self) {
        let drain_timeout = self.shared.limits.drain_timeout;
        let _ = self.stop_tx.send(true);
        let open = self.conns.len();
        if open > 0 {
            tracing::info!(
                "shutting down: draining {open} connection(s) for at most {drain_timeout:?}"
            );
        }
        let conns = &mut self.conns;
        let drained = tokio::time::timeout(drain_timeout, async {
            while conns.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if !drained {
            let left = self.conns.len();
            tracing::warn!(
                "drain timeout of {drain_timeout:?} reached: aborting {left} connection(s) \
                 (in-flight requests cancelled)"
            );
            // Aborts and waits, so the cancelled handlers have run their drops
            // (stage files removed) when this returns.
            self.conns.shutdown().await;
        }
        self.rejects.shutdown().await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AcceptError {
    /// Out of descriptors, buffers or memory: back off.
    Resources,
    /// Concerns only the connection being accepted: skip it.
    Connection,
    /// Anything else: log and back off (never spin).
    Other,
}

fn classify_accept_error(e: &io::Error) -> AcceptError {
    #[cfg(unix)]
    {
        if let Some(code) = e.raw_os_error() {
            match code {
                libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM => {
                    return AcceptError::Resources
                }
                libc::ECONNABORTED
                | libc::ECONNRESET
                | libc::ECONNREFUSED
                | libc::EINTR
                | libc::EAGAIN
                | libc::EPROTO
                | libc::EPERM
                | libc::ETIMEDOUT
                | libc::ENETDOWN
                | libc::ENETUNREACH
                | libc::EHOSTDOWN
                | libc::EHOSTUNREACH
                | libc::ENOPROTOOPT
                | libc::EOPNOTSUPP => return AcceptError::Connection,
                _ => {}
            }
        }
    }
    match e.kind() {
        io::ErrorKind::OutOfMemory => AcceptError::Resources,
        io::ErrorKind::ConnectionAborted
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::Interrupted
        | io::ErrorKind::WouldBlock
        | io::ErrorKind::TimedOut => AcceptError::Connection,
        _ => AcceptError::Other,
    }
}

/// One report per interval, counting what was suppressed in between.
struct RateLimited {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    fn new(every: Duration) -> Self {
        RateLimited {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(suppressed since the last report)` when a report is due.
    fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(t) if now.duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Raises the soft limit on open files (`RLIMIT_NOFILE`) to the hard
/// limit; returns `(soft limit now, hard limit)`. The server needs one
/// descriptor per connection plus the store's files; call it once at
/// start and log the figure. On macOS the soft limit is capped at
/// `OPEN_MAX` (10,240) when the hard limit is unlimited. Not supported
/// off Unix.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    #[cfg(unix)]
    {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `rl` is a valid, writable rlimit for the call.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let hard = rl.rlim_max;
        #[cfg(target_os = "macos")]
        let target = hard.min(10_240);
        #[cfg(not(target_os = "macos"))]
        let target = hard;
        if rl.rlim_cur < target {
            let wanted = libc::rlimit {
                rlim_cur: target,
                rlim_max: hard,
            };
            // SAFETY: `wanted` is a valid rlimit for the call.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) } != 0 {
                return Err(io::Error::last_os_error());
            }
            rl.rlim_cur = target;
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 everywhere
        Ok((rl.rlim_cur as u64, hard as u64))
    }
    #[cfg(not(unix))]
    {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "RLIMIT_NOFILE is a Unix limit",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_are_classified() {
        let e = |code| io::Error::from_raw_os_error(code);
        assert_eq!(
            classify_accept_error(&e(libc::EMFILE)),
            AcceptError::Resources
        );
        assert_eq!(
            classify_accept_error(&e(libc::ENFILE)),
            AcceptError::Resources
        );
        assert_eq!(
            classify_accept_error(&e(libc::ENOBUFS)),
            AcceptError::Resources
        );
        assert_eq!(
            classify_accept_error(&e(libc::ENOMEM)),
            AcceptError::Resources
        );
        assert_eq!(
            classify_accept_error(&e(libc::ECONNABORTED)),
            AcceptError::Connection
        );
        assert_eq!(classify_accept_error(&e(libc::EBADF)), AcceptError::Other);
    }

    #[test]
    fn rate_limited_reports_once_per_interval() {
        let mut r = RateLimited::new(Duration::from_secs(3600));
        assert_eq!(r.ready(), Some(0));
        assert_eq!(r.ready(), None);
        assert_eq!(r.ready(), None);
        r.last = Some(Instant::now() - Duration::from_secs(7200));
        assert_eq!(r.ready(), Some(2));
    }

    #[test]
    fn raise_nofile_limit_reaches_the_hard_limit() {
        let (soft, hard) = raise_nofile_limit().unwrap();
        assert!(soft > 0 && soft <= hard);
    }
}
