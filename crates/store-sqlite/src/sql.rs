//! Small SQL helpers shared by the reader and writer sides: row decoding and the bucketed `IN (...)` lists used by the batched
//! presence queries.

use std::collections::HashSet;

use rusqlite::{Connection, Row};
use store_types::{Digest, Error, ErrorKind, Namespace, Result};

use crate::error::SqlResultExt;

/// Most digests bound into one `IN (...)` statement.
///
/// Lists are padded up to the next power of two (repeating the last digest,
/// which set membership ignores), so at most 11 distinct statement texts per
/// query exist and every one of them stays in the prepared-statement cache.
pub(crate) const IN_CHUNK: usize = 1024;

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

/// What the query-plan tests share: a database on the current schema and
/// a statement's plan.
#[cfg(test)]
pub(crate) mod plans {
    use rusqlite::Connection;

    /// A writer connection on a new database with the current schema (the
    /// directory goes when the returned guard does).
    pub(crate) fn fresh() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::schema::open_writer(
            &dir.path().join("db.sqlite"),
            crate::Durability::Full,
            None,
        )
        .unwrap();
        (dir, conn)
    }

    /// `sql`'s `EXPLAIN QUERY PLAN`, its steps joined by ` | `.
    /// Parameters stay unbound (NULL): the plan does not depend on them.
    pub(crate) fn plan(conn: &Connection, sql: &str) -> String {
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let mut rows = stmt.raw_query();
        let mut out = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            out.push(row.get::<_, String>(3).unwrap());
        }
        out.join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_number_from_two() {
        assert_eq!(placeholders(1), "?2");
        assert_eq!(placeholders(3), "?2,?3,?4");
    }
}
