//! The ops layer's error: a stable machine-readable code plus a message.

use std::fmt;
use std::time::Duration;

use store_types::{Error, ErrorKind, ProtectReason, Report};

use crate::payload::{ErrorBody, ErrorDetail};
use crate::tokens::TokenCapReached;

/// How long a put refused with [`ErrorCode::TooManyTokens`] is told to wait
/// before retrying (`Retry-After: 1` over HTTP). Slots free as soon as
/// putters release their tokens, which well-behaved clients do right after
/// recording their reference.
pub const TOKEN_CAP_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a request that failed transiently ([`Error::is_transient`]: a
/// lost connection, a timeout, a busy backend) is told to wait before
/// retrying ([`ErrorCode::Unavailable`], `Retry-After: 1` over HTTP).
pub const TRANSIENT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A stable error code. The wire spelling ([`ErrorCode::as_str`]) never
/// changes meaning; new codes may be added (callers must treat unknown
/// codes like `internal`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// A malformed digest, namespace or key (`400`).
    KeyInvalid,
    /// Content does not hash to the expected digest (`422` on put).
    Verification,
    /// The blob exceeds the store's or the server's size limit (`413`).
    TooLarge,
    /// The declared length disagrees with the body (`400`).
    LengthMismatch,
    /// The addressed entry (or token) does not exist (`404`).
    Missing,
    /// A direct delete of a protected key (`409`).
    GcRefuse,
    /// A byte range outside the entry (`416`).
    InvalidRange,
    /// A malformed request: bad JSON, wrong field types, bad headers (`400`).
    BadRequest,
    /// A request listing more items than the documented limit (`413`).
    TooMany,
    /// The pin-token cap is reached (ADR-018): the put was refused before
    /// anything was stored (`503`, with a retry delay). No existing token
    /// is ever evicted to make room.
    TooManyTokens,
    /// The request body ended early or the client went away (`400`).
    IncompleteBody,
    /// No such route (`404`).
    NotFound,
    /// The route exists but not for this method (`405`).
    MethodNotAllowed,
    /// No valid credentials, and the anonymous identity may not do this
    /// (`401`, with `WWW-Authenticate: Bearer`).
    Unauthorized,
    /// The authenticated identity lacks the scope, or the pin token
    /// belongs to another identity (`403`).
    Forbidden,
    /// A JSON route without `Content-Type: application/json` (`415`).
    UnsupportedMediaType,
    /// The `Host` is not one the server answers for (`421`).
    HostNotAllowed,
    /// The server is at its connection cap (`503`, with a retry delay).
    Overloaded,
    /// A reference update's precondition (`If-Match` / `If-None-Match`)
    /// failed (`412`); the message names the current digest.
    RefConflict,
    /// The store's medium is full ([`ErrorKind::NoSpace`]: a full disk or
    /// quota, a full database) (`507`). Like `internal`, its message never
    /// reaches clients.
    InsufficientStorage,
    /// A transient media or backend failure ([`Error::is_transient`]: a
    /// lost connection, a timeout, a busy backend): the same request may
    /// succeed shortly (`503`, with a retry delay). Like `internal`, its
    /// message never reaches clients.
    Unavailable,
    /// A resumable upload's chunk does not start at the session's committed
    /// offset (`416`); the detail (`size`) is the committed offset, which
    /// HTTP puts in `Upload-Offset`.
    UploadOffset,
    /// The upload session was opened on another node of the fleet
    /// (`409`): sessions live on the node that opened them.
    UploadElsewhere,
    /// Another request is working on the upload session (`409`).
    UploadBusy,
    /// The upload-session cap is reached (`503`, with a retry delay); no
    /// session is ever dropped to make room.
    TooManyUploads,
    /// Open upload sessions hold as many bytes as allowed, in all or for
    /// this identity (`507`): finish or abort a session; nothing is ever
    /// dropped to make room.
    UploadQuota,
    /// Anything else: media or backend failure, misconfiguration (`500`).
    /// Its message never reaches clients: they get the request id, the
    /// server log has the cause.
    Internal,
}

impl ErrorCode {
    /// Every code, for documentation and metrics.
    pub const ALL: [ErrorCode; 27] = [
        ErrorCode::KeyInvalid,
        ErrorCode::Verification,
        ErrorCode::TooLarge,
        ErrorCode::LengthMismatch,
        ErrorCode::Missing,
        ErrorCode::GcRefuse,
        ErrorCode::InvalidRange,
        ErrorCode::BadRequest,
        ErrorCode::TooMany,
        ErrorCode::TooManyTokens,
        ErrorCode::IncompleteBody,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::HostNotAllowed,
        ErrorCode::Overloaded,
        ErrorCode::RefConflict,
        ErrorCode::InsufficientStorage,
        ErrorCode::Unavailable,
        ErrorCode::UploadOffset,
        ErrorCode::UploadElsewhere,
        ErrorCode::UploadBusy,
        ErrorCode::TooManyUploads,
        ErrorCode::UploadQuota,
        ErrorCode::Internal,
    ];

    /// The wire spelling (`snake_case`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::KeyInvalid => "key_invalid",
            ErrorCode::Verification => "verification",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::LengthMismatch => "length_mismatch",
            ErrorCode::Missing => "missing",
            ErrorCode::GcRefuse => "gc_refuse",
            ErrorCode::InvalidRange => "invalid_range",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::TooMany => "too_many",
            ErrorCode::TooManyTokens => "too_many_tokens",
            ErrorCode::IncompleteBody => "incomplete_body",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::HostNotAllowed => "host_not_allowed",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::RefConflict => "ref_conflict",
            ErrorCode::InsufficientStorage => "insufficient_storage",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::UploadOffset => "upload_offset",
            ErrorCode::UploadElsewhere => "upload_elsewhere",
            ErrorCode::UploadBusy => "upload_busy",
            ErrorCode::TooManyUploads => "too_many_uploads",
            ErrorCode::UploadQuota => "upload_quota",
            ErrorCode::Internal => "internal",
        }
    }

    /// Parses a wire spelling; unknown spellings are `None`.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// The HTTP status this code maps to.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::KeyInvalid
            | ErrorCode::LengthMismatch
            | ErrorCode::BadRequest
            | ErrorCode::IncompleteBody => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::Missing | ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::GcRefuse | ErrorCode::UploadElsewhere | ErrorCode::UploadBusy => 409,
            ErrorCode::TooLarge | ErrorCode::TooMany => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::InvalidRange | ErrorCode::UploadOffset => 416,
            ErrorCode::HostNotAllowed => 421,
            ErrorCode::RefConflict => 412,
            ErrorCode::Verification => 422,
            ErrorCode::Internal => 500,
            ErrorCode::TooManyTokens
            | ErrorCode::Overloaded
            | ErrorCode::Unavailable
            | ErrorCode::TooManyUploads => 503,
            ErrorCode::InsufficientStorage | ErrorCode::UploadQuota => 507,
        }
    }

    /// Whether clients get only the request id instead of the message
    /// (which may name paths, pids or backend addresses): `internal`,
    /// `insufficient_storage` and `unavailable`, the media and backend
    /// failures.
    pub fn redacts_message(self) -> bool {
        matches!(
            self,
            ErrorCode::Internal | ErrorCode::InsufficientStorage | ErrorCode::Unavailable
        )
    }

    pub(crate) fn index(self) -> usize {
        ErrorCode::ALL
            .iter()
            .position(|c| *c == self)
            .expect("ALL lists every code")
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An ops-layer failure: a stable [`ErrorCode`], a human message and, for
/// some codes, structured detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpsError {
    /// The stable code.
    pub code: ErrorCode,
    /// A human-readable, one-line message.
    pub message: String,
    /// What protects the key (`gc_refuse` only).
    pub reason: Option<ProtectReason>,
    /// The entry's size (`invalid_range` only; HTTP puts it in
    /// `Content-Range: bytes */size`).
    pub size: Option<u64>,
    /// When the caller may retry (`too_many_tokens` only; HTTP puts it in
    /// `Retry-After`, in whole seconds rounded up).
    pub retry_after: Option<Duration>,
}

impl OpsError {
    /// An error with a code and message and no detail.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        OpsError {
            code,
            message: message.into(),
            reason: None,
            size: None,
            retry_after: None,
        }
    }

    /// A `bad_request` error.
    pub fn bad_request(message: impl Into<String>) -> Self {
        OpsError::new(ErrorCode::BadRequest, message)
    }

    /// The wire body `{"error": {"code", "message", "reason"?}}`.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.as_str().to_string(),
                message: self.message.clone(),
                reason: self.reason,
            },
        }
    }
}

impl fmt::Display for OpsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for OpsError {}

impl From<Error> for OpsError {
    /// The answers about the request keep their codes; media and backend
    /// failures are `insufficient_storage` when the medium is full,
    /// `unavailable` (with [`TRANSIENT_RETRY_AFTER`]) when transient, and
    /// `internal` otherwise. The message is one line with the whole cause
    /// chain (for the server log: see [`ErrorCode::redacts_message`]).
    fn from(e: Error) -> Self {
        let message = Report::new(&e).to_string();
        let mut out = OpsError::new(
            match &e {
                Error::Missing => ErrorCode::Missing,
                Error::Verification { .. } => ErrorCode::Verification,
                Error::KeyInvalid(_) => ErrorCode::KeyInvalid,
                Error::GcRefuse { .. } => ErrorCode::GcRefuse,
                Error::TooLarge { .. } => ErrorCode::TooLarge,
                Error::LengthMismatch { .. } => ErrorCode::LengthMismatch,
                Error::InvalidRange { .. } => ErrorCode::InvalidRange,
                Error::RefConflict { .. } => ErrorCode::RefConflict,
                Error::NotOwner { .. } => ErrorCode::Forbidden,
                Error::ReceiptMismatch { .. } => ErrorCode::BadRequest,
                _ if e.kind() == ErrorKind::NoSpace => ErrorCode::InsufficientStorage,
                _ if e.is_transient() => ErrorCode::Unavailable,
                _ => ErrorCode::Internal,
            },
            message,
        );
        if out.code == ErrorCode::Unavailable {
            out.retry_after = Some(TRANSIENT_RETRY_AFTER);
        }
        match e {
            Error::GcRefuse { reason, .. } => out.reason = Some(reason),
            Error::InvalidRange { size, .. } => out.size = Some(size),
            _ => {}
        }
        out
    }
}

impl From<TokenCapReached> for OpsError {
    fn from(e: TokenCapReached) -> Self {
        OpsError {
            retry_after: Some(TOKEN_CAP_RETRY_AFTER),
            ..OpsError::new(ErrorCode::TooManyTokens, e.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use store_types::{Digest, Key, Namespace};

    #[test]
    fn codes_round_trip_and_map_to_statuses() {
        for c in ErrorCode::ALL {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(c));
            assert!((400..600).contains(&c.http_status()));
            assert_eq!(ErrorCode::ALL[c.index()], c);
        }
        assert_eq!(ErrorCode::parse("nope"), None);
    }

    #[test]
    fn store_errors_map_to_stable_codes() {
        let key = Key::new(Namespace::new("a").unwrap(), Digest::of(b"x"));
        let refuse = OpsError::from(Error::GcRefuse {
            key,
            reason: ProtectReason::Pinned,
        });
        assert_eq!(refuse.code, ErrorCode::GcRefuse);
        assert_eq!(refuse.reason, Some(ProtectReason::Pinned));
        assert_eq!(refuse.code.http_status(), 409);
        let range = OpsError::from(Error::InvalidRange {
            start: 5,
            end: 9,
            size: 3,
        });
        assert_eq!((range.code, range.size), (ErrorCode::InvalidRange, Some(3)));
        assert_eq!(
            OpsError::from(Error::io(ErrorKind::Other, "read")).code,
            ErrorCode::Internal
        );
        assert_eq!(
            OpsError::from(Error::TooLarge { limit: 1, got: 2 }).code,
            ErrorCode::TooLarge
        );
    }

    #[test]
    fn a_full_medium_is_507_and_a_transient_failure_a_retryable_503() {
        let full = OpsError::from(
            Error::from_io(
                "fsync stage file",
                std::io::Error::from(std::io::ErrorKind::StorageFull),
            )
            .with_path("/data/.stage/x"),
        );
        assert_eq!(full.code, ErrorCode::InsufficientStorage);
        assert_eq!(full.code.as_str(), "insufficient_storage");
        assert_eq!(full.code.http_status(), 507);
        assert_eq!(full.retry_after, None);
        assert!(full.code.redacts_message());
        assert!(
            full.message
                .starts_with("fsync stage file /data/.stage/x: no space left: "),
            "the log line has the cause: {full}"
        );

        for kind in [
            ErrorKind::ConnectionLost,
            ErrorKind::TimedOut,
            ErrorKind::Contended,
        ] {
            let e = OpsError::from(
                Error::backend(kind, "postgres").with_source("connection reset by peer"),
            );
            assert_eq!(e.code, ErrorCode::Unavailable, "{kind:?}");
            assert_eq!(e.code.http_status(), 503);
            assert_eq!(e.retry_after, Some(TRANSIENT_RETRY_AFTER));
            assert!(e.message.ends_with("connection reset by peer"), "{e}");
        }
        let denied = OpsError::from(Error::io(ErrorKind::PermissionDenied, "open"));
        assert_eq!(
            (denied.code, denied.retry_after),
            (ErrorCode::Internal, None)
        );
        // The kind of a sweep's cause decides too.
        let incomplete = OpsError::from(Error::SweepIncomplete {
            cause: Box::new(Error::io(ErrorKind::NoSpace, "write")),
            deleted: 1,
            bytes_freed: 1,
            rescued: 0,
            vanished: 0,
            staged: 0,
        });
        assert_eq!(incomplete.code, ErrorCode::InsufficientStorage);
    }

    #[test]
    fn a_full_token_registry_is_a_retryable_503() {
        let e = OpsError::from(TokenCapReached::Global { limit: 8 });
        assert_eq!(e.code, ErrorCode::TooManyTokens);
        assert_eq!(e.code.as_str(), "too_many_tokens");
        assert_eq!(e.code.http_status(), 503);
        assert_eq!(e.retry_after, Some(TOKEN_CAP_RETRY_AFTER));
        assert!(e.message.contains('8'), "{e}");
        assert_eq!(e.body().error.reason, None);
    }
}
