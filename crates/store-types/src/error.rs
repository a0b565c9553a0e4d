use std::fmt;

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
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The addressed entry does not exist (`read_range`, `delete`).
    #[error("no such entry")]
    Missing,
    /// Media failure: file system, cursor, staged-put I/O.
    #[error("i/o error: {0}")]
    Io(String),
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
    /// An engine failure that is not media I/O (SQL errors, lost connections).
    #[error("backend error: {0}")]
    Backend(String),
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
    /// A sweep failed after it had already committed work: earlier batches
    /// deleted, rescued or staged entries before `cause` stopped it. The
    /// counts are exact for the committed batches (nothing of the failing
    /// batch was deleted unless its delete had started: see `cause`).
    #[error(
        "sweep failed after it deleted {deleted} entries ({bytes_freed} bytes), rescued \
         {rescued}, found {vanished} vanished and staged {staged}: {cause}"
    )]
    SweepIncomplete {
        /// What stopped the sweep.
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

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        // A verifying reader smuggles typed errors through io::Error.
        if e.get_ref().is_some_and(|inner| inner.is::<Error>()) {
            let inner = e.into_inner().expect("checked above");
            return *inner.downcast::<Error>().expect("checked above");
        }
        Error::Io(e.to_string())
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        let kind = match &e {
            Error::Missing => std::io::ErrorKind::NotFound,
            Error::Verification { .. } | Error::LengthMismatch { .. } => {
                std::io::ErrorKind::InvalidData
            }
            Error::KeyInvalid(_) | Error::InvalidRange { .. } => std::io::ErrorKind::InvalidInput,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_survive_an_io_round_trip() {
        let e = Error::Verification {
            expected: Digest::of(b"a"),
            actual: Digest::of(b"b"),
        };
        let io: std::io::Error = e.clone().into();
        assert_eq!(io.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(Error::from(io), e);
        let plain = std::io::Error::other("disk on fire");
        assert!(matches!(Error::from(plain), Error::Io(m) if m.contains("disk on fire")));
    }
}
