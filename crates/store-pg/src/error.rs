//! The one converter from sqlx errors to the shared error family: every
//! PostgreSQL failure becomes an [`Error::Backend`] with a stable
//! [`ErrorKind`] read from the SQLSTATE (or the sqlx variant) and the sqlx
//! error as its source.

use std::borrow::Cow;

use store_types::{Error, ErrorKind};

/// Maps a sqlx error onto [`Error::Backend`] (operation `"postgres"`),
/// keeping it as the source. See [`db_err_in`] to name the operation.
pub fn db_err(e: sqlx::Error) -> Error {
    db_err_in("postgres", e)
}

/// [`db_err`] for a named operation (`"postgres: connect"`).
pub fn db_err_in(operation: impl Into<Cow<'static, str>>, e: sqlx::Error) -> Error {
    Error::backend(kind_of(&e), operation).with_source(e)
}

/// The kind of a sqlx error: lost connections (I/O, TLS, a closed pool, a
/// crashed worker, SQLSTATE class `08`, an administrator's shutdown) are
/// [`ErrorKind::ConnectionLost`], a pool timeout is
/// [`ErrorKind::TimedOut`], serialization failures and deadlocks
/// [`ErrorKind::Contended`]: all transient. A full disk (`53100`) is
/// [`ErrorKind::NoSpace`], missing privileges (`42501`, class `28`, a
/// read-only transaction) [`ErrorKind::PermissionDenied`].
pub(crate) fn kind_of(e: &sqlx::Error) -> ErrorKind {
    match e {
        sqlx::Error::Database(db) => db.code().map_or(ErrorKind::Other, |c| sqlstate_kind(&c)),
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => ErrorKind::TimedOut,
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorKind::ConnectionLost,
        sqlx::Error::PoolTimedOut => ErrorKind::TimedOut,
        sqlx::Error::RowNotFound => ErrorKind::NotFound,
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => ErrorKind::InvalidData,
        _ => ErrorKind::Other,
    }
}

/// The kind of a SQLSTATE (PostgreSQL's error codes, appendix A).
fn sqlstate_kind(code: &str) -> ErrorKind {
    match code {
        "53100" => ErrorKind::NoSpace,
        // Out of memory, too many connections, configuration limit.
        "53200" | "53300" | "53400" => ErrorKind::Unavailable,
        "57014" => ErrorKind::Interrupted,
        "57P01" | "57P02" => ErrorKind::ConnectionLost,
        "57P03" => ErrorKind::Unavailable,
        "40001" | "40P01" | "55P03" => ErrorKind::Contended,
        "42501" | "25006" => ErrorKind::PermissionDenied,
        "23505" => ErrorKind::AlreadyExists,
        "42P01" | "3F000" | "42883" => ErrorKind::NotFound,
        "0A000" => ErrorKind::Unsupported,
        "XX001" | "XX002" => ErrorKind::InvalidData,
        _ => match code.get(..2) {
            Some("08") => ErrorKind::ConnectionLost,
            Some("28") => ErrorKind::PermissionDenied,
            Some("22") => ErrorKind::InvalidData,
            _ => ErrorKind::Other,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_map_to_stable_kinds() {
        for (code, kind) in [
            ("53100", ErrorKind::NoSpace),
            ("57014", ErrorKind::Interrupted),
            ("40001", ErrorKind::Contended),
            ("40P01", ErrorKind::Contended),
            ("42501", ErrorKind::PermissionDenied),
            ("28P01", ErrorKind::PermissionDenied),
            ("08006", ErrorKind::ConnectionLost),
            ("57P01", ErrorKind::ConnectionLost),
            ("22P02", ErrorKind::InvalidData),
            ("42601", ErrorKind::Other),
        ] {
            assert_eq!(sqlstate_kind(code), kind, "{code}");
        }
        assert!(sqlstate_kind("40001").is_transient());
        assert!(!sqlstate_kind("53100").is_transient());
    }

    #[test]
    fn lost_connections_are_transient_and_keep_their_source() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        let e = db_err(sqlx::Error::Io(reset));
        assert_eq!(e.kind(), ErrorKind::ConnectionLost);
        assert!(e.is_transient());
        let source = std::error::Error::source(&e).expect("the sqlx error is kept");
        assert!(source.downcast_ref::<sqlx::Error>().is_some(), "{source:?}");
        assert_eq!(
            db_err(sqlx::Error::PoolTimedOut).kind(),
            ErrorKind::TimedOut
        );
        assert!(db_err(sqlx::Error::PoolClosed).is_transient());
        assert!(!db_err(sqlx::Error::RowNotFound).is_transient());
    }
}
