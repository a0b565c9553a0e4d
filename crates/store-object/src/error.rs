//! The one conversion from object_store's errors into
//! [`store_types::Error`]: the stable kind of a failure ([`kind_of`]), the
//! retry decision taken from it ([`is_transient`]) and the engine error for
//! a failed request ([`backend_err`]).

use object_store::path::Path;
use store_types::{Error, ErrorKind};

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

impl crate::Inner {
    /// Runs the request `f` under the engine's [`crate::RetryPolicy`],
    /// repeating it while it fails [`is_transient`]ly.
    pub(crate) async fn retry<T, F, Fut>(
        &self,
        op: &str,
        path: &Path,
        f: F,
    ) -> object_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        let log = |e: &object_store::Error, pause| {
            tracing::debug!(op, path = %path, error = %e, ?pause,
                "transient object store failure; retrying");
        };
        self.options.retry.run(f, is_transient, log).await
    }
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
