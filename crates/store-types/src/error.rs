use std::borrow::Cow;
use std::fmt;
use std::path::Path;

use crate::failure::{Context, ErrorKind, Failure};
use crate::{Digest, Key};

/// Result alias over [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an entry is protected from deletion (ADR-012 §6.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtectReason {
    /// A live pin (in-process guard, or an unexpired fleet pin row).
    Pinned,
    /// A registered liveness source reports the key as referenced.
    Live,
    /// The embedder's protect callback names the key.
    ProtectCallback,
}

impl fmt::Display for ProtectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProtectReason::Pinned => "pinned",
            ProtectReason::Live => "live",
            ProtectReason::ProtectCallback => "protect_callback",
        })
    }
}

/// The one error family of the facade and the engine traits (SPEC §3).
///
/// There is deliberately no `GcAborted`: an aborted sweep is data in its
/// report (ADR-012 §1).
/// Media and backend failures ([`Error::Io`], [`Error::Backend`]) carry a
/// [`Failure`]: the operation, the key or path, a stable [`ErrorKind`] and
/// the source error, reachable through [`std::error::Error::source`] (and
/// printed with [`Report`](crate::Report)). [`Error::is_transient`] is the one place retry
/// decisions are made.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The addressed entry does not exist (`read_range`, `delete`).
    #[error("no such entry")]
    Missing,
    /// Media failure: file system, cursor, staged-put I/O. The
    /// [`Failure`] names the operation, the key or path, a stable
    /// [`ErrorKind`] and the source error.
    #[error(transparent)]
    Io(Failure),
    /// Content does not hash to the expected digest (put or get).
    #[error("verification failed: expected {expected}, content hashes to {actual}")]
    Verification {
        /// The digest the content should have.
        expected: Digest,
        /// What the content actually hashes to.
        actual: Digest,
    },
    /// A malformed digest, namespace or key.
    #[error("invalid key: {0}")]
    KeyInvalid(String),
    /// A direct delete of a protected key.
    #[error("refusing to delete {key}: it is protected ({reason})")]
    GcRefuse {
        /// The key the caller tried to delete.
        key: Key,
        /// What protects it.
        reason: ProtectReason,
    },
    /// A put larger than the store accepts (kv-only threshold).
    #[error("blob too large: limit {limit} bytes, got at least {got}")]
    TooLarge {
        /// The accepted maximum, in bytes.
        limit: u64,
        /// The size seen (declared, or read so far).
        got: u64,
    },
    /// The declared length disagrees with the body.
    #[error("declared length {declared} does not match body length {actual}")]
    LengthMismatch {
        /// What the caller said.
        declared: u64,
        /// What the body held (at least this many bytes when longer).
        actual: u64,
    },
    /// A byte range outside the entry.
    #[error("invalid range {start}..{end} for an entry of {size} bytes")]
    InvalidRange {
        /// Requested start (inclusive).
        start: u64,
        /// Requested end (exclusive).
        end: u64,
        /// The entry's size.
        size: u64,
    },
    /// An invalid store construction (including every fleet-validity clause).
    #[error("configuration error: {0}")]
    Config(String),
    /// An engine failure that is not media I/O (SQL errors, lost
    /// connections, a stopped worker), with the same [`Failure`] detail as
    /// [`Error::Io`].
    #[error(transparent)]
    Backend(Failure),
    /// The data is held by another non-fleet store instance (the instance
    /// lock, see [`Engine::lock_instance`](crate::Engine::lock_instance)):
    /// a second undeclared instance could not see its pins.
    #[error(
        "{resource} is in use by another Blobpool instance ({holder}); a non-fleet store \
         opens its data exclusively"
    )]
    InstanceLocked {
        /// What is locked (`"the SQLite database /data/kv.sqlite"`).
        resource: String,
        /// Who holds it, as far as known (`"pid 1234 on host a since
        /// 2026-12-01T20:05:03Z"`).
        holder: String,
    },
    /// A reference update's precondition failed (compare-and-swap): the
    /// reference holds `current` (`None`: it does not exist).
    #[error("reference {name:?} changed: it now points at {}", match current { Some(d) => d.to_string(), None => "nothing".to_string() })]
    RefConflict {
        /// The reference name.
        name: String,
        /// What it holds now.
        current: Option<crate::Digest>,
    },
    /// A writer without the right to replace another writer's reference or
    /// cache key tried to (issue 39, ADR-052): `name` holds `current`,
    /// set by someone else (or, `write_once`, in a write-once namespace).
    #[error(
        "{name:?} already points at {current}{}",
        if *write_once {
            " in a write-once namespace: only removing it (scope `delete`) lets it change"
        } else {
            ", set by another identity: replacing or removing it needs the `delete` scope"
        }
    )]
    NotOwner {
        /// The reference or cache key.
        name: String,
        /// What it holds (unchanged).
        current: crate::Digest,
        /// Whether the namespace is write-once (nobody but `delete` replaces).
        write_once: bool,
    },
    /// A put receipt handed to an operation in another namespace than the
    /// entry it pins (a cache key of `namespace` cannot be protected by a
    /// pin on `receipt`; issue 39).
    #[error("the receipt pins {receipt}, not an entry of namespace {namespace}")]
    ReceiptMismatch {
        /// The namespace the operation is in.
        namespace: String,
        /// The key the receipt pins.
        receipt: Key,
    },
    /// A sweep failed after it had already committed work: earlier batches
    /// deleted, rescued or staged entries before `cause` stopped it. The
    /// counts are exact for the committed batches (nothing of the failing
    /// batch was deleted unless its delete had started: see `cause`).
    #[error(
        "sweep failed after it deleted {deleted} entries ({bytes_freed} bytes), rescued \
         {rescued}, found {vanished} vanished and staged {staged}"
    )]
    SweepIncomplete {
        /// What stopped the sweep (also its [`source`](std::error::Error::source)).
        #[source]
        cause: Box<Error>,
        /// Entries deleted by committed batches.
        deleted: u64,
        /// Bytes those deletes freed.
        bytes_freed: u64,
        /// Due candidates rescued by committed batches.
        rescued: u64,
        /// Due candidates found already gone.
        vanished: u64,
        /// Candidates staged by the mark phase so far.
        staged: u64,
    },
}

impl Error {
    /// An [`Error::Io`] of `operation` classified as `kind`; add the key or
    /// path and the source with the `with_*` builders.
    pub fn io(kind: ErrorKind, operation: impl Into<Cow<'static, str>>) -> Self {
        Error::Io(Failure::new(kind, operation))
    }

    /// An [`Error::Backend`] of `operation` classified as `kind`.
    pub fn backend(kind: ErrorKind, operation: impl Into<Cow<'static, str>>) -> Self {
        Error::Backend(Failure::new(kind, operation))
    }

    /// An [`Error::Io`] of `operation` caused by `e`, classified from its
    /// kind (and so from its OS error number) and keeping it as the source.
    /// A typed [`Error`] smuggled through `io::Error` (a verifying reader
    /// does that) comes back unchanged.
    pub fn from_io(operation: impl Into<Cow<'static, str>>, e: std::io::Error) -> Self {
        if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
            let inner = e.into_inner().expect("checked above");
            return *inner.downcast::<Error>().expect("checked above");
        }
        Error::Io(Failure::new(e.kind().into(), operation).with_source(e))
    }

    fn map_failure(mut self, f: impl FnOnce(Failure) -> Failure) -> Self {
        if let Error::Io(x) | Error::Backend(x) = &mut self {
            *x = f(std::mem::replace(x, Failure::new(ErrorKind::Other, "")));
        }
        self
    }

    /// Names the key the failed operation was about. Only
    /// [`Error::Io`] and [`Error::Backend`] carry context; other variants
    /// are returned unchanged.
    pub fn with_key(self, key: &Key) -> Self {
        self.map_failure(|f| f.with_context(Context::Key(key.clone())))
    }

    /// Names the path the failed operation was about (see
    /// [`Error::with_key`]).
    pub fn with_path(self, path: impl AsRef<Path>) -> Self {
        self.map_failure(|f| f.with_context(Context::Path(path.as_ref().to_path_buf())))
    }

    /// Names another target (`"namespace ns1"`, `"table entries"`) (see
    /// [`Error::with_key`]).
    pub fn with_target(self, target: impl Into<Cow<'static, str>>) -> Self {
        self.map_failure(|f| f.with_context(Context::Target(target.into())))
    }

    /// Sets the source error, or a plain message for a cause without an
    /// error type (see [`Error::with_key`] for the variants it applies to).
    pub fn with_source(self, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        let source = source.into();
        self.map_failure(|f| f.with_source(source))
    }

    /// The failure detail of [`Error::Io`] and [`Error::Backend`].
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            Error::Io(f) | Error::Backend(f) => Some(f),
            _ => None,
        }
    }

    /// The stable classification: the failure's kind for [`Error::Io`] and
    /// [`Error::Backend`], the cause's for [`Error::SweepIncomplete`],
    /// [`ErrorKind::NotFound`] for [`Error::Missing`],
    /// [`ErrorKind::InvalidData`] for [`Error::Verification`] and
    /// [`Error::LengthMismatch`], and [`ErrorKind::Other`] for the rest
    /// (which are answers about the request, not failures of the medium).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Io(f) | Error::Backend(f) => f.kind(),
            Error::SweepIncomplete { cause, .. } => cause.kind(),
            Error::Missing => ErrorKind::NotFound,
            Error::Verification { .. } | Error::LengthMismatch { .. } => ErrorKind::InvalidData,
            _ => ErrorKind::Other,
        }
    }

    /// Whether retrying the same operation may succeed without anyone
    /// intervening: [`Error::kind`] is transient (see
    /// [`ErrorKind::is_transient`]). The one place retry decisions are
    /// made: engines' retry loops and the server's `503` both read it.
    pub fn is_transient(&self) -> bool {
        self.kind().is_transient()
    }
}

impl From<std::io::Error> for Error {
    /// [`Error::from_io`] with the operation `"i/o"`: prefer `from_io` (or
    /// the builders) where the operation is known.
    fn from(e: std::io::Error) -> Self {
        Error::from_io("i/o", e)
    }
}

impl From<Error> for std::io::Error {
    /// Wraps the typed error (so [`Error::from_io`] gets it back), with the
    /// closest I/O kind.
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::Missing => std::io::ErrorKind::NotFound,
            Error::Verification { .. } | Error::LengthMismatch { .. } => {
                std::io::ErrorKind::InvalidData
            }
            Error::KeyInvalid(_) | Error::InvalidRange { .. } => std::io::ErrorKind::InvalidInput,
            Error::Io(f) | Error::Backend(f) => f.kind().into(),
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Report;
    use std::error::Error as _;

    #[test]
    fn typed_errors_survive_an_io_round_trip() {
        let e = Error::Verification {
            expected: Digest::of(b"a"),
            actual: Digest::of(b"b"),
        };
        let io: std::io::Error = e.clone().into();
        assert_eq!(io.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(Error::from(io), e);
        let full = Error::io(ErrorKind::NoSpace, "write").with_path("/x");
        let io: std::io::Error = full.clone().into();
        assert_eq!(io.kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(Error::from_io("other op", io), full);
        let plain = std::io::Error::other("disk on fire");
        let e = Error::from_io("write stage file", plain);
        assert_eq!(e.kind(), ErrorKind::Other);
        assert_eq!(e.source().unwrap().to_string(), "disk on fire");
    }

    #[test]
    fn os_errors_map_to_stable_kinds() {
        let cases = [
            (libc::ENOSPC, ErrorKind::NoSpace),
            (libc::EDQUOT, ErrorKind::NoSpace),
            (libc::EACCES, ErrorKind::PermissionDenied),
            (libc::EPERM, ErrorKind::PermissionDenied),
            (libc::EROFS, ErrorKind::PermissionDenied),
            (libc::ENOENT, ErrorKind::NotFound),
            (libc::EEXIST, ErrorKind::AlreadyExists),
            (libc::ENOTDIR, ErrorKind::NotADirectory),
            (libc::EISDIR, ErrorKind::IsADirectory),
            (libc::ECONNRESET, ErrorKind::ConnectionLost),
            (libc::ECONNABORTED, ErrorKind::ConnectionLost),
            (libc::ECONNREFUSED, ErrorKind::ConnectionLost),
            (libc::EPIPE, ErrorKind::ConnectionLost),
            (libc::ETIMEDOUT, ErrorKind::TimedOut),
            (libc::EAGAIN, ErrorKind::Unavailable),
            (libc::EBUSY, ErrorKind::Unavailable),
            (libc::EINTR, ErrorKind::Interrupted),
            (libc::ENOSYS, ErrorKind::Unsupported),
            (libc::EIO, ErrorKind::Other),
        ];
        for (errno, kind) in cases {
            let e = Error::from_io("op", std::io::Error::from_raw_os_error(errno));
            assert!(matches!(e, Error::Io(_)), "{errno}: {e:?}");
            assert_eq!(e.kind(), kind, "errno {errno}");
            let source = e.source().expect("the io error is kept");
            let io = source
                .downcast_ref::<std::io::Error>()
                .expect("an io::Error");
            assert_eq!(io.raw_os_error(), Some(errno));
        }
    }

    #[test]
    fn only_connection_timeout_contention_and_interruption_are_transient() {
        for k in [
            ErrorKind::ConnectionLost,
            ErrorKind::TimedOut,
            ErrorKind::Unavailable,
            ErrorKind::Contended,
            ErrorKind::Interrupted,
        ] {
            assert!(k.is_transient(), "{k:?}");
            assert!(Error::backend(k, "query").is_transient(), "{k:?}");
        }
        for k in [
            ErrorKind::NotFound,
            ErrorKind::AlreadyExists,
            ErrorKind::PermissionDenied,
            ErrorKind::NoSpace,
            ErrorKind::NotADirectory,
            ErrorKind::IsADirectory,
            ErrorKind::InvalidData,
            ErrorKind::Unsupported,
            ErrorKind::Other,
        ] {
            assert!(!k.is_transient(), "{k:?}");
            assert!(!Error::io(k, "write").is_transient(), "{k:?}");
        }
        assert!(!Error::Missing.is_transient());
        assert!(!Error::Config("x".into()).is_transient());
        let incomplete = |cause: Error| Error::SweepIncomplete {
            cause: Box::new(cause),
            deleted: 1,
            bytes_freed: 2,
            rescued: 0,
            vanished: 0,
            staged: 0,
        };
        assert!(incomplete(Error::backend(ErrorKind::ConnectionLost, "q")).is_transient());
        assert!(!incomplete(Error::io(ErrorKind::NoSpace, "w")).is_transient());
    }

    #[test]
    fn display_is_one_line_and_the_cause_is_in_the_chain() {
        let key = Key::new(crate::Namespace::new("ns").unwrap(), Digest::of(b"x"));
        let e = Error::from_io(
            "fsync stage file",
            std::io::Error::from_raw_os_error(libc::ENOSPC),
        )
        .with_key(&key);
        let shown = e.to_string();
        assert_eq!(shown, format!("fsync stage file {key}: no space left"));
        assert!(!shown.contains('\n'));
        assert!(
            !shown.contains("os error"),
            "the cause is not repeated: {shown}"
        );
        let failure = e.failure().unwrap();
        assert_eq!(failure.key(), Some(&key));
        assert_eq!(failure.operation(), "fsync stage file");
        let report = format!("{:#}", Report::new(&e));
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines.len(), 2, "{report}");
        assert_eq!(lines[0], shown);
        assert!(
            lines[1].starts_with("caused by: ") && lines[1].contains("os error"),
            "{report}"
        );
        let one = Report::new(&e).to_string();
        assert!(
            !one.contains('\n') && one.starts_with(&format!("{shown}: ")),
            "{one}"
        );
        assert!(one.contains("os error"), "{one}");

        // Nested: a sweep stopped by a failure keeps the whole chain.
        let sweep = Error::SweepIncomplete {
            cause: Box::new(
                Error::backend(ErrorKind::ConnectionLost, "postgres: delete batch")
                    .with_target("namespace ns")
                    .with_source("connection reset by peer"),
            ),
            deleted: 3,
            bytes_freed: 30,
            rescued: 0,
            vanished: 0,
            staged: 1,
        };
        let report = format!("{:#}", Report::new(&sweep));
        assert_eq!(report.lines().count(), 3, "{report}");
        assert!(report.ends_with(
            "caused by: postgres: delete batch namespace ns: connection lost\n\
             caused by: connection reset by peer"
        ));
    }

    #[test]
    fn failures_compare_by_kind_operation_context_and_message() {
        let a = Error::io(ErrorKind::NoSpace, "write").with_path("/a");
        assert_eq!(a, Error::io(ErrorKind::NoSpace, "write").with_path("/a"));
        assert_ne!(a, Error::io(ErrorKind::NoSpace, "write").with_path("/b"));
        assert_ne!(
            a,
            Error::io(ErrorKind::PermissionDenied, "write").with_path("/a")
        );
        assert_ne!(
            a,
            Error::backend(ErrorKind::NoSpace, "write").with_path("/a")
        );
        assert_ne!(a, a.clone().with_source("full"));
        assert_eq!(a.clone().with_source("full"), a.clone().with_source("full"));
        // Builders leave variants without a failure alone.
        assert_eq!(
            Error::Missing.with_path("/a").with_source("x"),
            Error::Missing
        );
    }
}
