//! Small SQL helpers shared by the reader and writer sides: error mapping,
//! row decoding and the bucketed `IN (...)` lists used by the batched
//! presence queries.

use std::collections::HashSet;

use rusqlite::{Connection, ErrorCode, Row};
use store_types::{Digest, Error, ErrorKind, Namespace, Result};

/// Most digests bound into one `IN (...)` statement.
///
/// Lists are padded up to the next power of two (repeating the last digest,
/// which set membership ignores), so at most 11 distinct statement texts per
/// query exist and every one of them stays in the prepared-statement cache.
pub(crate) const IN_CHUNK: usize = 1024;

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

/// Converts a stored length or count (an SQLite INTEGER) to `u64`.
pub(crate) fn to_u64(v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| {
        Error::backend(ErrorKind::InvalidData, "sqlite: decode stored size")
            .with_source(format!("{v} is negative"))
    })
}

/// Converts a length, count or limit to an SQLite INTEGER (saturating).
pub(crate) fn to_i64(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

/// Reads column `idx` of `row` as a 32-byte digest.
pub(crate) fn digest_at(row: &Row<'_>, idx: usize) -> Result<Digest> {
    let blob = row.get_ref(idx).sql()?.as_blob().map_err(|e| {
        Error::backend(ErrorKind::InvalidData, "sqlite: decode stored digest").with_source(e)
    })?;
    let bytes: [u8; 32] = blob.try_into().map_err(|_| {
        Error::backend(ErrorKind::InvalidData, "sqlite: decode stored digest")
            .with_source(format!("{} bytes, expected 32", blob.len()))
    })?;
    Ok(Digest::from_bytes(bytes))
}

/// Reads column `idx` of `row` as a namespace.
pub(crate) fn namespace_at(row: &Row<'_>, idx: usize) -> Result<Namespace> {
    let s: String = row.get(idx).sql()?;
    Namespace::new(s).map_err(|e| {
        Error::backend(ErrorKind::InvalidData, "sqlite: decode stored namespace").with_source(e)
    })
}

/// `?2, ?3, ..., ?{n+1}`: the placeholder list for `n` digests following
/// the namespace parameter `?1`.
fn placeholders(n: usize) -> String {
    let mut s = String::with_capacity(n * 6);
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push('?');
        s.push_str(&(i + 2).to_string());
    }
    s
}

/// Which of `digests` appear in `table` under `ns`, index-aligned.
/// `table` is a table name, optionally followed by its namespace column
/// (`"refs.namespace"`; default `ns`).
///
/// Runs one `SELECT digest FROM {table} WHERE {ns column} = ?1 AND digest IN (...)`
/// per [`IN_CHUNK`] digests (so exactly one statement for the usual call of
/// up to 1024 digests), inside one read transaction so every chunk sees the
/// same snapshot.
pub(crate) fn present_in(
    conn: &Connection,
    table: &str,
    ns: &str,
    digests: &[Digest],
) -> Result<Vec<bool>> {
    if digests.is_empty() {
        return Ok(Vec::new());
    }
    let multi = digests.len() > IN_CHUNK;
    if multi {
        conn.prepare_cached("BEGIN").sql()?.execute([]).sql()?;
    }
    let found = present_chunks(conn, table, ns, digests);
    if multi {
        // A read transaction: ending it cannot lose anything.
        let _ = conn
            .prepare_cached("COMMIT")
            .and_then(|mut s| s.execute([]));
    }
    let found = found?;
    Ok(digests
        .iter()
        .map(|d| found.contains(d.as_bytes()))
        .collect())
}

fn present_chunks(
    conn: &Connection,
    table: &str,
    ns: &str,
    digests: &[Digest],
) -> Result<HashSet<[u8; 32]>> {
    let mut found = HashSet::with_capacity(digests.len());
    for chunk in digests.chunks(IN_CHUNK) {
        let bucket = chunk.len().next_power_of_two();
        let mut stmt = conn.prepare_cached(&present_sql(table, bucket)).sql()?;
        stmt.raw_bind_parameter(1, ns).sql()?;
        let last = chunk[chunk.len() - 1];
        for i in 0..bucket {
            let d = chunk.get(i).unwrap_or(&last);
            stmt.raw_bind_parameter(i + 2, &d.as_bytes()[..]).sql()?;
        }
        let mut rows = stmt.raw_query();
        while let Some(row) = rows.next().sql()? {
            found.insert(*digest_at(row, 0)?.as_bytes());
        }
    }
    Ok(found)
}

/// The statement [`present_in`] runs for `n` digests (`table` as there).
pub(crate) fn present_sql(table: &str, n: usize) -> String {
    let (table, ns_col) = table.split_once('.').unwrap_or((table, "ns"));
    format!(
        "SELECT digest FROM {table} WHERE {ns_col} = ?1 AND digest IN ({})",
        placeholders(n)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn placeholders_number_from_two() {
        assert_eq!(placeholders(1), "?2");
        assert_eq!(placeholders(3), "?2,?3,?4");
    }
}
