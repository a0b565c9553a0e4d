//! The one conversion from rusqlite's errors into [`store_types::Error`]
//! ([`sql_err`]), and the `.sql()?` shorthand for it ([`SqlResultExt`]).

use rusqlite::ErrorCode;
use store_types::{Error, ErrorKind, Result};

/// Maps a rusqlite error onto the shared error family, keeping it as the
/// source: media failures (I/O, full disk, unopenable or read-only file,
/// permissions) become [`Error::Io`], everything else (SQL errors,
/// constraint violations, busy or corrupt databases) [`Error::Backend`].
/// The kind comes from the primary result code (`SQLITE_FULL` is
/// [`ErrorKind::NoSpace`], `SQLITE_BUSY`/`SQLITE_LOCKED` the transient
/// [`ErrorKind::Contended`], `SQLITE_CORRUPT` [`ErrorKind::InvalidData`],
/// `SQLITE_PERM`/`SQLITE_READONLY` [`ErrorKind::PermissionDenied`], …).
pub(crate) fn sql_err(e: rusqlite::Error) -> Error {
    let (media, kind) = match e.sqlite_error_code() {
        Some(code) => match code {
            ErrorCode::DiskFull => (true, ErrorKind::NoSpace),
            ErrorCode::ReadOnly | ErrorCode::PermissionDenied => {
                (true, ErrorKind::PermissionDenied)
            }
            ErrorCode::SystemIoFailure | ErrorCode::CannotOpen => (true, ErrorKind::Other),
            ErrorCode::NoLargeFileSupport => (true, ErrorKind::Unsupported),
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::SchemaChanged => (false, ErrorKind::Contended),
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => (false, ErrorKind::InvalidData),
            ErrorCode::OperationInterrupted => (false, ErrorKind::Interrupted),
            _ => (false, ErrorKind::Other),
        },
        None => match &e {
            rusqlite::Error::QueryReturnedNoRows => (false, ErrorKind::NotFound),
            rusqlite::Error::FromSqlConversionFailure(..)
            | rusqlite::Error::IntegralValueOutOfRange(..)
            | rusqlite::Error::Utf8Error(..)
            | rusqlite::Error::InvalidColumnType(..) => (false, ErrorKind::InvalidData),
            _ => (false, ErrorKind::Other),
        },
    };
    let err = if media {
        Error::io(kind, "sqlite")
    } else {
        Error::backend(kind, "sqlite")
    };
    err.with_source(e)
}

/// `.sql()?` instead of `.map_err(sql_err)?` on rusqlite results.
pub(crate) trait SqlResultExt<T> {
    /// Converts the error with [`sql_err`].
    fn sql(self) -> Result<T>;
}

impl<T> SqlResultExt<T> for rusqlite::Result<T> {
    fn sql(self) -> Result<T> {
        self.map_err(sql_err)
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    use super::*;
    use crate::sql::to_u64;

    #[test]
    fn a_read_only_database_is_a_permission_error_keeping_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ro.sqlite");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x INTEGER)")
            .unwrap();
        let ro =
            Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        let err = ro
            .execute("INSERT INTO t VALUES (1)", [])
            .map_err(sql_err)
            .unwrap_err();
        assert!(matches!(err, Error::Io(_)), "{err:?}");
        assert_eq!(err.kind(), ErrorKind::PermissionDenied);
        assert!(!err.is_transient());
        let source = std::error::Error::source(&err).expect("the rusqlite error is kept");
        let source = source
            .downcast_ref::<rusqlite::Error>()
            .expect("a rusqlite::Error");
        assert_eq!(source.sqlite_error_code(), Some(ErrorCode::ReadOnly));
        assert_eq!(err.to_string(), "sqlite: permission denied");
    }

    #[test]
    fn busy_is_transient_and_decoding_failures_are_invalid_data() {
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        let e = sql_err(busy);
        assert!(matches!(e, Error::Backend(_)) && e.is_transient(), "{e:?}");
        assert_eq!(e.kind(), ErrorKind::Contended);
        let full = sql_err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        ));
        assert!(matches!(full, Error::Io(_)), "{full:?}");
        assert_eq!(full.kind(), ErrorKind::NoSpace);
        let e = to_u64(-3).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert_eq!(
            std::error::Error::source(&e).unwrap().to_string(),
            "-3 is negative"
        );
    }
}
