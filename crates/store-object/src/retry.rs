//! Retry with backoff for transient request failures, and the mapping of
//! object_store errors onto the engine error.

use std::future::Future;
use std::time::Duration;

use object_store::path::Path;
use store_types::{Error, ErrorKind};

use crate::Inner;

/// How often, and how patiently, a request that failed transiently is
/// repeated.
///
/// Transient means [`ErrorKind::is_transient`] of the error's kind (see
/// [`kind_of`]): lost connections, timeouts and otherwise unclassified
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

/// The stable kind of an object_store error. `Generic` errors are judged
/// by their source chain: an I/O error by its kind, an HTTP client error
/// (with the `s3` feature) by whether it failed to connect, timed out or
/// could not decode; anything else there is
/// [`ErrorKind::Unavailable`] (a server error the client's own retries
/// did not overcome).
pub(crate) fn kind_of(e: &object_store::Error) -> ErrorKind {
    use object_store::Error as E;
    match e {
        E::NotFound { .. } => ErrorKind::NotFound,
        E::AlreadyExists { .. } => ErrorKind::AlreadyExists,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => ErrorKind::PermissionDenied,
        E::NotSupported { .. } | E::NotImplemented { .. } => ErrorKind::Unsupported,
        E::InvalidPath { .. } => ErrorKind::InvalidData,
        E::JoinError { .. } => ErrorKind::Interrupted,
        E::Generic { .. } => generic_kind(e),
        _ => ErrorKind::Other,
    }
}

fn generic_kind(e: &object_store::Error) -> ErrorKind {
    let chain = std::iter::successors(std::error::Error::source(e), |s| s.source());
    for cause in chain {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return match ErrorKind::from(io.kind()) {
                ErrorKind::Other => ErrorKind::Unavailable,
                k => k,
            };
        }
        #[cfg(feature = "s3")]
        if let Some(http) = cause.downcast_ref::<object_store::client::HttpError>() {
            use object_store::client::HttpErrorKind as H;
            return match http.kind() {
                H::Connect | H::Request | H::Interrupted => ErrorKind::ConnectionLost,
                H::Timeout => ErrorKind::TimedOut,
                H::Decode => ErrorKind::InvalidData,
                _ => ErrorKind::Unavailable,
            };
        }
    }
    ErrorKind::Unavailable
}

/// Whether `e` may go away if the request is repeated: its
/// [`kind_of`] is transient.
pub(crate) fn is_transient(e: &object_store::Error) -> bool {
    kind_of(e).is_transient()
}

/// Whether `e` says the operation is not available on this store.
pub(crate) fn unsupported(e: &object_store::Error) -> bool {
    matches!(
        e,
        object_store::Error::NotSupported { .. } | object_store::Error::NotImplemented { .. }
    )
}

/// The engine error for a failed request: an [`Error::Backend`] of `op` on
/// the object at `path`, classified by [`kind_of`], keeping `e` as its
/// source.
pub(crate) fn backend_err(op: &'static str, path: &Path, e: object_store::Error) -> Error {
    Error::backend(kind_of(&e), op)
        .with_target(format!("object-store path {path}"))
        .with_source(e)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(source: impl std::error::Error + Send + Sync + 'static) -> object_store::Error {
        object_store::Error::Generic {
            store: "test",
            source: Box::new(source),
        }
    }

    #[test]
    fn retry_decisions_follow_the_kind() {
        let full = generic(std::io::Error::from(std::io::ErrorKind::StorageFull));
        assert_eq!(kind_of(&full), ErrorKind::NoSpace);
        assert!(!is_transient(&full), "a full disk is not retried");
        let reset = generic(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(kind_of(&reset), ErrorKind::ConnectionLost);
        assert!(is_transient(&reset));
        let server = generic(std::io::Error::other("HTTP 503"));
        assert!(
            is_transient(&server),
            "an unclassified server failure is retried"
        );
        let missing = object_store::Error::NotFound {
            path: "a".into(),
            source: "gone".into(),
        };
        assert!(!is_transient(&missing));
        let denied = object_store::Error::PermissionDenied {
            path: "a".into(),
            source: "no".into(),
        };
        let e = backend_err("reading", &Path::from("ns/ab/x"), denied);
        assert_eq!(e.kind(), ErrorKind::PermissionDenied);
        assert_eq!(
            e.to_string(),
            "reading object-store path ns/ab/x: permission denied"
        );
        assert!(std::error::Error::source(&e).is_some());
    }
}
