//! The detail of media and backend failures: a stable [`ErrorKind`], the
//! operation, its [`Context`] and the source error, and [`Report`], which
//! prints an error with its cause chain.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(doc)]
use crate::Error;
use crate::Key;

/// A stable classification of a media or backend failure, modelled on
/// OpenDAL's `ErrorKind` and [`std::io::ErrorKind`]: what an operator (or a
/// retry loop, through [`ErrorKind::is_transient`]) needs to know without
/// reading the message. New kinds may be added; match with a wildcard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file, object, row or table the operation needed does not exist
    /// (`ENOENT`, object store `NotFound`).
    NotFound,
    /// Something the operation creates already exists (`EEXIST`, an object
    /// store precondition on create).
    AlreadyExists,
    /// The process may not do this: `EACCES`, `EPERM`, a read-only file
    /// system or database (`EROFS`, `SQLITE_READONLY`), SQLSTATE `42501`,
    /// rejected credentials.
    PermissionDenied,
    /// The medium is full: `ENOSPC`, `EDQUOT`, `SQLITE_FULL`, SQLSTATE
    /// `53100`.
    NoSpace,
    /// A path component that should be a directory is not (`ENOTDIR`).
    NotADirectory,
    /// A path that should be a file is a directory (`EISDIR`).
    IsADirectory,
    /// The connection to the backend broke or could not be made: connection
    /// reset, aborted or refused, a broken pipe, an unreachable network, a
    /// closed pool. Transient.
    ConnectionLost,
    /// The backend did not answer in time (`ETIMEDOUT`, a pool or statement
    /// timeout). Transient.
    TimedOut,
    /// The backend cannot serve right now but may shortly: rate-limited,
    /// overloaded, shutting down, `EAGAIN`/`EBUSY`. Transient.
    Unavailable,
    /// Concurrent work won a race: `SQLITE_BUSY`/`SQLITE_LOCKED`, a
    /// serialization failure (`40001`), a deadlock (`40P01`), a lock that
    /// is not available (`55P03`). Transient: retrying the operation may
    /// succeed.
    Contended,
    /// The operation was interrupted before it finished (`EINTR`, a
    /// cancelled statement). Transient.
    Interrupted,
    /// Stored or received data is malformed: a corrupt database
    /// (`SQLITE_CORRUPT`), a value that does not decode, a file shorter
    /// than its recorded size.
    InvalidData,
    /// The medium or backend does not support the operation (no file
    /// locks, no `fsync` on a directory, an unsupported feature).
    Unsupported,
    /// Anything else: a failed worker task, an unclassified backend error.
    Other,
}

impl ErrorKind {
    /// Whether retrying the same operation may succeed without anyone
    /// intervening: [`ConnectionLost`](ErrorKind::ConnectionLost),
    /// [`TimedOut`](ErrorKind::TimedOut),
    /// [`Unavailable`](ErrorKind::Unavailable),
    /// [`Contended`](ErrorKind::Contended) and
    /// [`Interrupted`](ErrorKind::Interrupted). Everything else (a full
    /// disk, a permission, corrupt data, a missing file) needs a fix first.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorKind::ConnectionLost
                | ErrorKind::TimedOut
                | ErrorKind::Unavailable
                | ErrorKind::Contended
                | ErrorKind::Interrupted
        )
    }

    /// A stable lower-case description (`"no space left"`), also the
    /// kind's `Display`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not found",
            ErrorKind::AlreadyExists => "already exists",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::NoSpace => "no space left",
            ErrorKind::NotADirectory => "not a directory",
            ErrorKind::IsADirectory => "is a directory",
            ErrorKind::ConnectionLost => "connection lost",
            ErrorKind::TimedOut => "timed out",
            ErrorKind::Unavailable => "temporarily unavailable",
            ErrorKind::Contended => "contended by concurrent work",
            ErrorKind::Interrupted => "interrupted",
            ErrorKind::InvalidData => "invalid data",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Other => "error",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<std::io::ErrorKind> for ErrorKind {
    /// Classifies an I/O error kind. [`std::io::Error::kind`] already
    /// decodes the OS error number (`ENOSPC` is `StorageFull`, `EDQUOT`
    /// `QuotaExceeded`, `EROFS` `ReadOnlyFilesystem`, …), so this covers
    /// raw OS errors too.
    fn from(k: std::io::ErrorKind) -> Self {
        use std::io::ErrorKind as Io;
        match k {
            Io::NotFound => ErrorKind::NotFound,
            Io::AlreadyExists => ErrorKind::AlreadyExists,
            Io::PermissionDenied | Io::ReadOnlyFilesystem => ErrorKind::PermissionDenied,
            Io::StorageFull | Io::QuotaExceeded => ErrorKind::NoSpace,
            Io::NotADirectory => ErrorKind::NotADirectory,
            Io::IsADirectory => ErrorKind::IsADirectory,
            Io::ConnectionReset
            | Io::ConnectionAborted
            | Io::ConnectionRefused
            | Io::BrokenPipe
            | Io::NotConnected
            | Io::HostUnreachable
            | Io::NetworkUnreachable
            | Io::NetworkDown => ErrorKind::ConnectionLost,
            Io::TimedOut => ErrorKind::TimedOut,
            Io::WouldBlock | Io::ResourceBusy => ErrorKind::Unavailable,
            Io::Deadlock => ErrorKind::Contended,
            Io::Interrupted => ErrorKind::Interrupted,
            Io::InvalidData | Io::UnexpectedEof => ErrorKind::InvalidData,
            Io::Unsupported => ErrorKind::Unsupported,
            _ => ErrorKind::Other,
        }
    }
}

impl From<ErrorKind> for std::io::ErrorKind {
    fn from(k: ErrorKind) -> Self {
        use std::io::ErrorKind as Io;
        match k {
            ErrorKind::NotFound => Io::NotFound,
            ErrorKind::AlreadyExists => Io::AlreadyExists,
            ErrorKind::PermissionDenied => Io::PermissionDenied,
            ErrorKind::NoSpace => Io::StorageFull,
            ErrorKind::NotADirectory => Io::NotADirectory,
            ErrorKind::IsADirectory => Io::IsADirectory,
            ErrorKind::ConnectionLost => Io::ConnectionAborted,
            ErrorKind::TimedOut => Io::TimedOut,
            ErrorKind::Unavailable => Io::ResourceBusy,
            ErrorKind::Contended => Io::ResourceBusy,
            ErrorKind::Interrupted => Io::Interrupted,
            ErrorKind::InvalidData => Io::InvalidData,
            ErrorKind::Unsupported => Io::Unsupported,
            ErrorKind::Other => Io::Other,
        }
    }
}

/// What a [`Failure`] was about: the key, the path, or another named
/// target (`"table entries"`, `"bucket b"`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Context {
    /// A blob key.
    Key(Key),
    /// A file-system path.
    Path(PathBuf),
    /// Anything else, already worded (`"namespace ns1"`).
    Target(Cow<'static, str>),
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Context::Key(k) => write!(f, "{k}"),
            Context::Path(p) => write!(f, "{}", p.display()),
            Context::Target(t) => f.write_str(t),
        }
    }
}

/// The shared source type: `Arc` so that [`Error`] stays `Clone`.
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// The detail of a media or backend failure ([`Error::Io`],
/// [`Error::Backend`]): the operation (`"fsync stage file"`), what it was
/// about ([`Context`]), a stable [`ErrorKind`], and the source error.
///
/// `Display` is one line, `"{operation} {context}: {kind}"`; the cause is
/// not repeated there but reachable through
/// [`source`](std::error::Error::source) (print the chain with
/// [`Report`]). Two failures are equal when kind, operation, context and
/// the source's message are.
#[derive(Clone)]
pub struct Failure {
    kind: ErrorKind,
    operation: Cow<'static, str>,
    context: Option<Context>,
    source: Option<Source>,
}

impl Failure {
    /// A failure of `operation` (a short verb phrase, `"fsync stage
    /// file"`, `"sqlite: insert entry"`) classified as `kind`.
    pub fn new(kind: ErrorKind, operation: impl Into<Cow<'static, str>>) -> Self {
        Failure {
            kind,
            operation: operation.into(),
            context: None,
            source: None,
        }
    }

    /// The stable classification.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The operation that failed.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// What the operation was about, if recorded.
    pub fn context(&self) -> Option<&Context> {
        self.context.as_ref()
    }

    /// The key the operation was about, if that is the context.
    pub fn key(&self) -> Option<&Key> {
        match &self.context {
            Some(Context::Key(k)) => Some(k),
            _ => None,
        }
    }

    /// The path the operation was about, if that is the context.
    pub fn path(&self) -> Option<&Path> {
        match &self.context {
            Some(Context::Path(p)) => Some(p),
            _ => None,
        }
    }

    /// The source error, if any (also [`std::error::Error::source`]).
    pub fn source_error(&self) -> Option<&Source> {
        self.source.as_ref()
    }

    /// Replaces the context.
    pub fn with_context(mut self, context: Context) -> Self {
        self.context = Some(context);
        self
    }

    /// Sets the source: any error, or a plain message (`&str`, `String`)
    /// for a cause that has no error type of its own.
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    fn source_message(&self) -> Option<String> {
        self.source.as_ref().map(|s| s.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.operation)?;
        if let Some(c) = &self.context {
            write!(f, " {c}")?;
        }
        write!(f, ": {}", self.kind)
    }
}

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Failure");
        d.field("kind", &self.kind)
            .field("operation", &self.operation);
        if let Some(c) = &self.context {
            d.field("context", c);
        }
        if let Some(s) = &self.source {
            d.field("source", s);
        }
        d.finish()
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl PartialEq for Failure {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.operation == other.operation
            && self.context == other.context
            && self.source_message() == other.source_message()
    }
}

impl Eq for Failure {}

/// Renders an error with its whole cause chain.
///
/// `{}` prints it all on one line, the error and its causes joined by
/// `": "` (for log lines and fields: `error = %Report::new(&e)`); `{:#}`
/// prints the error on the first line and each cause on a line of its own,
/// `caused by: …` (for people: the CLI's failure message).
///
/// ```
/// use store_types::{Error, ErrorKind, Report};
/// let e = Error::io(ErrorKind::NoSpace, "fsync stage file")
///     .with_path("/data/.stage/x")
///     .with_source(std::io::Error::other("disk full"));
/// assert_eq!(
///     Report::new(&e).to_string(),
///     "fsync stage file /data/.stage/x: no space left: disk full"
/// );
/// assert_eq!(
///     format!("{:#}", Report::new(&e)),
///     "fsync stage file /data/.stage/x: no space left\ncaused by: disk full"
/// );
/// ```
pub struct Report<'a>(&'a (dyn std::error::Error + 'static));

impl<'a> Report<'a> {
    /// A report of `error` and its sources.
    pub fn new(error: &'a (dyn std::error::Error + 'static)) -> Self {
        Report(error)
    }

    /// The causes of the error, nearest first (not the error itself).
    pub fn causes(&self) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
        std::iter::successors(self.0.source(), |e| e.source())
    }
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let sep = if f.alternate() { "\ncaused by: " } else { ": " };
        for cause in self.causes() {
            write!(f, "{sep}{cause}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:#}")
    }
}
