//! Named references ([`RefStore`], ADR-024) in the `refs` and
//! `ref_namespaces` tables (schema v3).
//!
//! # Writes
//!
//! `set`, `delete` and `mark_uses_refs` are jobs of the group-committing
//! writer thread, like
//! puts: `set` and `delete` read the reference's current digest and owner,
//! check the precondition, then the author's right to change the row
//! (issue 39: [`Author::check`]), and write, all inside the writer's
//! transaction (and the job's own savepoint), so the compare-and-swap is
//! atomic: the writer is the only write connection of this engine, and
//! `BEGIN IMMEDIATE` keeps other processes' writers out for the whole
//! transaction. They answer after the commit, so the durability is the
//! writer's (`synchronous` setting), as for puts. A failed precondition or
//! a refused author writes nothing and is not counted as a failed write
//! ([`crate::SqliteStats::writes_failed`]): it is an answer, not an error
//! of the database.
//!
//! `owner` (schema v5) is the name of the author that wrote the row's
//! digest (NULL: the library, and every row older than v5). A set of the
//! digest the row holds keeps it; a new row or a replace stores the
//! author's.
//!
//! # Reads
//!
//! `get`, `list`, `referenced`, `ref_namespaces` and `uses_refs` run on the
//! reader pool. `list` walks the primary key in name order (`BINARY`
//! collation: byte order) with a range condition for the prefix
//! (`name >= prefix AND name < successor(prefix)`), never `LIKE`, which
//! would treat `_` and `%` as wildcards and fold ASCII case. `referenced`
//! asks the `(namespace, digest)` index through the engine's one batched
//! existence query ([`sql::present_in`], as `has_many` does).
//!
//! # Cancellation
//!
//! Every method is cancel-safe. A write job is queued the first time the
//! future is polled and then runs to its commit whether or not anyone still
//! waits, so a dropped `set`/`delete` either committed whole or never
//! started; a dropped read returns its connection to the pool when its
//! blocking closure ends.

use rusqlite::{Connection, OptionalExtension};
use store_types::{
    ref_conflict, Author, Digest, Error, Namespace, RefEntry, RefExpect, RefName, RefStore,
    Replace, Result,
};

use crate::error::SqlResultExt;
use crate::sql::{self, digest_at, namespace_at, to_i64};
use crate::SqliteEngine;

const GET: &str = "SELECT digest FROM refs WHERE namespace = ?1 AND name = ?2";
const GET_OWNED: &str = "SELECT digest, owner FROM refs WHERE namespace = ?1 AND name = ?2";
/// `?5` is the owner: the job has read the row in the same transaction and
/// passes the row's own owner when the digest does not change.
const UPSERT: &str = "INSERT INTO refs (namespace, name, digest, updated_at, owner)
                      VALUES (?1, ?2, ?3, ?4, ?5)
                      ON CONFLICT (namespace, name)
                      DO UPDATE SET digest = excluded.digest, updated_at = excluded.updated_at,
                                    owner = excluded.owner";
const MARK_NAMESPACE: &str =
    "INSERT OR IGNORE INTO ref_namespaces (namespace, since) VALUES (?1, ?2)";
const DELETE: &str = "DELETE FROM refs WHERE namespace = ?1 AND name = ?2";
/// `?2` is the inclusive lower bound (the prefix), `?3` the exclusive one
/// (`after`, or `''` which every name sorts after).
const LIST_FROM: &str = "SELECT name, digest FROM refs
                         WHERE namespace = ?1 AND name >= ?2 AND name > ?3
                         ORDER BY name LIMIT ?4";
/// [`LIST_FROM`] with `?5` the prefix's successor as exclusive upper bound.
const LIST_RANGE: &str = "SELECT name, digest FROM refs
                          WHERE namespace = ?1 AND name >= ?2 AND name > ?3 AND name < ?5
                          ORDER BY name LIMIT ?4";
const REF_NAMESPACES: &str = "SELECT namespace FROM ref_namespaces ORDER BY namespace";
const USES_REFS: &str = "SELECT 1 FROM ref_namespaces WHERE namespace = ?1";

/// The [`RefStore`] of a [`SqliteEngine`] (returned by `KvEngine::refs`).
pub(crate) struct SqliteRefs {
    engine: SqliteEngine,
}

impl SqliteRefs {
    pub(crate) fn new(engine: SqliteEngine) -> Self {
        SqliteRefs { engine }
    }
}

/// The digest `name` holds, read on `conn`.
fn current(conn: &Connection, ns: &str, name: &str) -> Result<Option<Digest>> {
    let mut stmt = conn.prepare_cached(GET).sql()?;
    let mut rows = stmt.query((ns, name)).sql()?;
    match rows.next().sql()? {
        Some(row) => Ok(Some(digest_at(row, 0)?)),
        None => Ok(None),
    }
}

/// The digest `name` holds and its owner, read on `conn`.
fn current_owned(
    conn: &Connection,
    ns: &str,
    name: &str,
) -> Result<Option<(Digest, Option<String>)>> {
    let mut stmt = conn.prepare_cached(GET_OWNED).sql()?;
    let mut rows = stmt.query((ns, name)).sql()?;
    match rows.next().sql()? {
        Some(row) => Ok(Some((digest_at(row, 0)?, row.get(1).sql()?))),
        None => Ok(None),
    }
}

/// An [`Author`] moved into a writer job (which must be `'static`).
#[derive(Clone)]
pub(crate) struct OwnedAuthor {
    name: Option<String>,
    may: Replace,
}

impl OwnedAuthor {
    pub(crate) fn new(author: Author<'_>) -> Self {
        OwnedAuthor {
            name: author.name.map(str::to_owned),
            may: author.may,
        }
    }

    pub(crate) fn author(&self) -> Author<'_> {
        Author {
            name: self.name.as_deref(),
            may: self.may,
        }
    }

    /// Checks `expect`, then whether the author may change `row` (its
    /// digest and owner) to `new`; answers the owner the row has after the
    /// write (the row's own when `new` is the digest it holds).
    pub(crate) fn admit(
        &self,
        name: &RefName,
        row: Option<&(Digest, Option<String>)>,
        expect: RefExpect,
        new: Option<Digest>,
    ) -> Result<Option<String>> {
        let current = row.map(|r| r.0);
        if !expect.holds(current) {
            return Err(ref_conflict(name, current));
        }
        let author = self.author();
        author.check(name, row.map(|(d, o)| (*d, o.as_deref())), new)?;
        Ok(match row {
            Some((d, owner)) if Some(*d) == new => owner.clone(),
            _ => self.name.clone(),
        })
    }
}

/// The smallest string greater than every string starting with `prefix`,
/// or `None` when there is none (`prefix` empty or all `U+007F`).
///
/// Only for ASCII prefixes (names are ASCII): drops trailing `U+007F`
/// bytes, then increments the last byte, which stays ASCII.
fn successor(prefix: &str) -> Option<String> {
    debug_assert!(prefix.is_ascii());
    let mut bytes = prefix.as_bytes().to_vec();
    while bytes.last() == Some(&0x7f) {
        bytes.pop();
    }
    let last = bytes.last_mut()?;
    *last += 1;
    String::from_utf8(bytes).ok()
}

/// The table and namespace column [`sql::present_in`] reads references
/// from.
const REFS_BY_NAMESPACE: &str = "refs.namespace";

/// Outcome of a compare-and-swap job: the previous digest, or the answer
/// that refused it ([`Error::RefConflict`] or [`Error::NotOwner`]; nothing
/// written), which is not an error of the job.
type Cas = std::result::Result<Option<Digest>, Error>;

#[async_trait::async_trait]
impl RefStore for SqliteRefs {
    /// Checks `expect` and the author, and upserts the row, in one job of
    /// the writer's transaction; answers after the commit. (A SQLite kv
    /// engine never hosts a fleet: the pin proof is never given and is
    /// ignored.)
    async fn set_checked(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
        author: Author<'_>,
        _pin: Option<store_types::PinProof<'_>>,
    ) -> Result<Option<Digest>> {
        let (ns_s, name_c) = (ns.as_str().to_owned(), name.clone());
        let author = OwnedAuthor::new(author);
        let outcome: Cas = self
            .engine
            .inner
            .writer
            .submit(128, true, move |conn, now| {
                let row = current_owned(conn, &ns_s, name_c.as_str())?;
                let owner = match author.admit(&name_c, row.as_ref(), expect, Some(digest)) {
                    Ok(owner) => owner,
                    Err(refused) => return Ok(Err(refused)),
                };
                conn.prepare_cached(UPSERT)
                    .sql()?
                    .execute((
                        &ns_s,
                        name_c.as_str(),
                        &digest.as_bytes()[..],
                        now.0,
                        owner.as_deref(),
                    ))
                    .sql()?;
                Ok(Ok(row.map(|r| r.0)))
            })
            .await?;
        outcome
    }

    async fn get(&self, ns: &Namespace, name: &RefName) -> Result<Option<Digest>> {
        let (ns, name) = (ns.clone(), name.clone());
        self.engine
            .inner
            .readers
            .run_inline_first(move |conn| current(conn, ns.as_str(), name.as_str()))
            .await
    }

    /// Checks `expect` and the author, and deletes the row, in one job of
    /// the writer's transaction; answers after the commit.
    async fn delete(
        &self,
        ns: &Namespace,
        name: &RefName,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>> {
        let (ns_s, name_c) = (ns.as_str().to_owned(), name.clone());
        let author = OwnedAuthor::new(author);
        let outcome: Cas = self
            .engine
            .inner
            .writer
            .submit(64, true, move |conn, _now| {
                let row = current_owned(conn, &ns_s, name_c.as_str())?;
                if let Err(refused) = author.admit(&name_c, row.as_ref(), expect, None) {
                    return Ok(Err(refused));
                }
                if row.is_some() {
                    conn.prepare_cached(DELETE)
                        .sql()?
                        .execute((&ns_s, name_c.as_str()))
                        .sql()?;
                }
                Ok(Ok(row.map(|r| r.0)))
            })
            .await?;
        outcome
    }

    async fn list(
        &self,
        ns: &Namespace,
        prefix: &str,
        after: Option<&RefName>,
        limit: usize,
    ) -> Result<Vec<RefEntry>> {
        // Names are ASCII: no name starts with a non-ASCII prefix.
        if limit == 0 || !prefix.is_ascii() {
            return Ok(Vec::new());
        }
        let ns = ns.clone();
        let prefix = prefix.to_owned();
        let after = after.map_or_else(String::new, |a| a.as_str().to_owned());
        self.engine
            .inner
            .readers
            .run(move |conn| {
                let upper = successor(&prefix);
                let mut stmt = conn
                    .prepare_cached(if upper.is_some() {
                        LIST_RANGE
                    } else {
                        LIST_FROM
                    })
                    .sql()?;
                stmt.raw_bind_parameter(1, ns.as_str()).sql()?;
                stmt.raw_bind_parameter(2, prefix.as_str()).sql()?;
                stmt.raw_bind_parameter(3, after.as_str()).sql()?;
                stmt.raw_bind_parameter(4, to_i64(limit)).sql()?;
                if let Some(upper) = &upper {
                    stmt.raw_bind_parameter(5, upper.as_str()).sql()?;
                }
                let mut rows = stmt.raw_query();
                let mut out = Vec::with_capacity(limit.min(1024));
                while let Some(row) = rows.next().sql()? {
                    let name: String = row.get(0).sql()?;
                    let name = RefName::new(name).map_err(|e| {
                        Error::backend(
                            store_types::ErrorKind::InvalidData,
                            "sqlite: decode stored reference name",
                        )
                        .with_source(e)
                    })?;
                    out.push(RefEntry {
                        name,
                        digest: digest_at(row, 1)?,
                    });
                }
                Ok(out)
            })
            .await
    }

    async fn referenced(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let ns = ns.clone();
        let digests = digests.to_vec();
        self.engine
            .inner
            .readers
            .run(move |conn| sql::present_in(conn, REFS_BY_NAMESPACE, ns.as_str(), &digests))
            .await
    }

    async fn ref_namespaces(&self) -> Result<Vec<Namespace>> {
        self.engine
            .inner
            .readers
            .run(|conn| {
                let mut stmt = conn.prepare_cached(REF_NAMESPACES).sql()?;
                let mut rows = stmt.query([]).sql()?;
                let mut out = Vec::new();
                while let Some(row) = rows.next().sql()? {
                    out.push(namespace_at(row, 0)?);
                }
                Ok(out)
            })
            .await
    }

    /// One job of the writer's transaction; answers after the commit.
    async fn mark_uses_refs(&self, ns: &Namespace) -> Result<bool> {
        let ns_s = ns.as_str().to_owned();
        self.engine
            .inner
            .writer
            .submit(64, true, move |conn, now| {
                let n = conn
                    .prepare_cached(MARK_NAMESPACE)
                    .sql()?
                    .execute((&ns_s, now.0))
                    .sql()?;
                Ok(n > 0)
            })
            .await
    }

    async fn uses_refs(&self, ns: &Namespace) -> Result<bool> {
        let ns = ns.clone();
        self.engine
            .inner
            .readers
            .run(move |conn| {
                conn.prepare_cached(USES_REFS)
                    .sql()?
                    .query_row([ns.as_str()], |_| Ok(()))
                    .optional()
                    .sql()
                    .map(|row| row.is_some())
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn successors_bound_every_extension() {
        assert_eq!(successor(""), None);
        assert_eq!(successor("a").as_deref(), Some("b"));
        assert_eq!(successor("builds/").as_deref(), Some("builds0"));
        assert_eq!(successor("a_").as_deref(), Some("a`"));
        assert_eq!(successor("a\u{7f}").as_deref(), Some("b"));
        assert_eq!(successor("\u{7f}\u{7f}"), None);
    }

    #[test]
    fn referenced_statements_number_from_two() {
        assert_eq!(
            sql::present_sql(REFS_BY_NAMESPACE, 2),
            "SELECT digest FROM refs WHERE namespace = ?1 AND digest IN (?2,?3)"
        );
    }

    /// Every statement is an index search, and listings come out of the
    /// primary key in name order (no sort).
    #[test]
    fn statements_use_the_indexes() {
        let (_dir, conn) = crate::sql::plans::fresh();
        let plan = crate::sql::plans::plan;
        for sql in [
            GET,
            GET_OWNED,
            DELETE,
            LIST_FROM,
            LIST_RANGE,
            USES_REFS,
            REF_NAMESPACES,
            sql::present_sql(REFS_BY_NAMESPACE, 4).as_str(),
        ] {
            let p = plan(&conn, sql);
            assert!(!p.contains("TEMP B-TREE"), "{sql}: {p}");
            if sql != REF_NAMESPACES {
                assert!(p.contains("SEARCH"), "{sql}: {p}");
            }
        }
        let p = plan(&conn, &sql::present_sql(REFS_BY_NAMESPACE, 4));
        assert!(p.contains("refs_by_digest"), "{p}");
    }
}
