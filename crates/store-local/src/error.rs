//! The one conversion from the file system's errors into
//! [`store_types::Error`]: an I/O failure naming its operation and path
//! ([`io_err`]), the "nothing there" test ([`is_absent`]), and a blocking
//! task that panicked or was cancelled ([`blocking`]).

use std::io::{self, ErrorKind};
use std::path::Path;

use store_types::ErrorKind as Kind;
use store_types::{Error, Result};

/// Runs `f` on the blocking pool; a panicked (or cancelled) task is an
/// [`Error::Io`] with the join error as its source.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T>
where
    F: FnOnce() -> Result<T> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::io(Kind::Other, "run blocking file-system task").with_source(e))?
}

/// An [`Error::Io`] naming the operation and the path, its kind taken from
/// `e`, which it keeps as its source.
pub(crate) fn io_err(op: &'static str, path: &Path, e: io::Error) -> Error {
    Error::from_io(op, e).with_path(path)
}

/// Whether `e` means "nothing there" (the path or one of its parents is
/// absent, or a parent is not a directory).
pub(crate) fn is_absent(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory)
}
