//! The one retry policy: how often, and how patiently, a request that
//! failed transiently is repeated. `store-layers`' `RetryLayer` applies it
//! to whole engine operations; an engine applies it to the steps inside a
//! stage that no layer can repeat (ADR-064).

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

/// Exponential backoff with jitter (backon's, as OpenDAL's `RetryLayer`):
/// the pause before retry `n` is drawn from `[b, 2b)`, `b` doubling from
/// [`initial_backoff`](RetryPolicy::initial_backoff) up to
/// [`max_backoff`](RetryPolicy::max_backoff). Only errors the caller
/// classes transient (for [`crate::Error`]: [`crate::Error::is_transient`])
/// are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in total (1 = no retry). Default 3.
    pub attempts: u32,
    /// Backoff before the first retry; doubled for each further one (with
    /// jitter). Default 50 ms.
    pub initial_backoff: Duration,
    /// Upper bound of one backoff before jitter (so a pause is under twice
    /// this). Default 2 s.
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

    /// Runs `f` until it succeeds, fails with an error `transient` does not
    /// accept, or the attempts are spent; `notify` hears of each retry (the
    /// error and the pause) before its pause. Dropping the future
    /// mid-backoff drops the pause: no attempt starts after that.
    pub async fn run<T, E, Fut>(
        &self,
        f: impl FnMut() -> Fut,
        transient: impl FnMut(&E) -> bool,
        notify: impl FnMut(&E, Duration),
    ) -> std::result::Result<T, E>
    where
        Fut: Future<Output = std::result::Result<T, E>>,
    {
        let backoff = ExponentialBuilder::new()
            .with_jitter()
            .with_min_delay(self.initial_backoff)
            .with_max_delay(self.max_backoff)
            .with_max_times(self.attempts.saturating_sub(1) as usize);
        f.retry(backoff).when(transient).notify(notify).await
    }
}
