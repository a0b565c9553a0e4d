//! Retry with backoff for transient request failures (judged by
//! [`crate::error::is_transient`]).

use std::future::Future;
use std::time::Duration;

use object_store::path::Path;

use crate::error::is_transient;
use crate::Inner;

/// How often, and how patiently, a request that failed transiently is
/// repeated.
///
/// Transient means [`store_types::ErrorKind::is_transient`] of the error's kind (see
/// `kind_of` in `error.rs`): lost connections, timeouts and otherwise unclassified
/// `Generic` failures (HTTP 5xx after the client's own retries), and
/// `JoinError`. Answers — `NotFound`, `AlreadyExists`, preconditions — and
/// configuration, permission or full-disk errors are never retried.
///
/// Only whole requests are repeated: a `GET` body that fails mid-stream
/// fails the read, and a multipart part upload relies on the store
/// client's retries (the stage fails, and the facade's put with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total (1 = no retry). Default 3.
    pub attempts: u32,
    /// Backoff before the first retry; doubled for each further one (with
    /// jitter). Default 50 ms.
    pub initial_backoff: Duration,
    /// Upper bound of one backoff. Default 2 s.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// No retries at all.
    pub fn none() -> Self {
        RetryPolicy {
            attempts: 1,
            ..Self::default()
        }
    }

    /// The pause before retry number `n` (1-based), with ±25 % jitter.
    fn backoff(&self, n: u32) -> Duration {
        let base = self
            .initial_backoff
            .saturating_mul(1u32 << (n - 1).min(16))
            .min(self.max_backoff);
        let jitter = (jitter_source() % 51) as f64 / 100.0 + 0.75; // 0.75..=1.25
        base.mul_f64(jitter)
    }
}

fn jitter_source() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(store_types::Timestamp::now().0 as u64);
    h.finish()
}

impl Inner {
    /// Runs `f` until it succeeds, fails permanently, or the policy's
    /// attempts are spent.
    pub(crate) async fn retry<T, F, Fut>(
        &self,
        op: &str,
        path: &Path,
        mut f: F,
    ) -> object_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let policy = self.options.retry;
        let mut attempt = 1;
        loop {
            match f().await {
                Err(e) if is_transient(&e) && attempt < policy.attempts.max(1) => {
                    let pause = policy.backoff(attempt);
                    tracing::debug!(op, path = %path, attempt, error = %e, ?pause,
                        "transient object store failure; retrying");
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                r => return r,
            }
        }
    }
}
