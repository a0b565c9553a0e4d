//! Named references (ADR-024): [`PgRefs`], the [`RefStore`] of a
//! [`PostgresEngine`](crate::PostgresEngine), and the migration component
//! creating its tables in the engine's schema.
//!
//! # Tables
//!
//! | table | columns | key |
//! |---|---|---|
//! | `ref_names` | `namespace text, name text, digest bytea(32), updated_at timestamptz, owner text` (v2) | `(namespace, name)`; index `(namespace, digest)` |
//! | `ref_namespaces` | `namespace text, since timestamptz` | `namespace` |
//!
//! Text columns use `COLLATE "C"`, so `list` pages in byte order. The
//! digest is a 32-byte `bytea`, like `entries.digest`.
//!
//! The tables are not called `refs`: the engine's schema is also where a
//! fleet's embedders keep their own reference tables (the fleet docs and
//! tests use `<kv schema>.refs (ns, digest)`), and an engine-owned table
//! must not collide with them. The migration uses plain `CREATE TABLE`, so
//! a foreign table of the same name fails the connect loudly instead of
//! being taken for the engine's.
//!
//! # Fleet liveness
//!
//! [`RefStore::liveness_table`] answers
//! `LivenessTable::new(schema, "ref_names", "digest").with_namespace_column("namespace")`:
//! registered per namespace on a fleet store, every node's sweep reads the
//! rows in its locked arbitration statement (under `READ COMMITTED`, after
//! its key locks), so a reference committed through any node before that
//! statement protects its entry.
//!
//! # Compare-and-swap
//!
//! `set` and `delete` run in one `READ COMMITTED` transaction: the
//! reference row is read `FOR UPDATE` (writers of one reference queue on
//! its row lock and each sees the previous writer's committed digest), the
//! precondition is checked, and the row is updated, inserted or deleted. An
//! absent row cannot be locked, so the insert is `ON CONFLICT DO NOTHING`:
//! a racing insert that committed first makes it insert nothing, and the
//! transaction is retried — now finding (and locking) the winner's row, so
//! of concurrent `RefExpect::Absent` creates exactly one succeeds. A
//! transaction dropped before its commit rolls back: every method is
//! cancel-safe.
//!
//! # Owners
//!
//! `owner` (issue 39, ADR-052; step 2 of the component) is the name of the
//! [`Author`] that wrote the row's digest, NULL for the embedding
//! application — and for every row older than the step, which only an
//! author with `Replace::Any` may then replace or remove. The row read
//! `FOR UPDATE` carries it: after the precondition, [`Author::check`]
//! decides under the same row lock whether the author may replace or
//! remove the row (refused: [`Error::NotOwner`], nothing written). A set of
//! the digest the row holds keeps its owner; an insert or a replace stores
//! the author's name.
//!
//! `set` does not mark the namespace in `ref_namespaces`; the facade calls
//! `mark_uses_refs` after a committed set whose caller may change the
//! namespace's policy (ADR-045).
//!
//! # Fleet guard
//!
//! With a [`PinProof`] (a fleet store's set: the node's owner name and the
//! generation its own pin returned), `set` first takes the entry's fleet
//! key lock **shared** in its transaction (the lock every fleet put takes
//! and a sweep's execute batch takes exclusive), then requires that the
//! key is not fenced for deletion (`gc_deleting`) and that the owner's
//! `gc_pins` row on it **still has the proof's generation** (`pin_id`) and
//! is unexpired by `gc_now_statement()` (ADR-045 §7 as revised by
//! ADR-054). Holding the shared lock, no batch can delete the entry until
//! the commit. Every pin writer gives the row a new generation when it
//! finds it expired (judged under the same key lock), so an unchanged,
//! unexpired generation proves the set's own pin held without a gap since
//! it was taken: no batch deleted the entry meanwhile. An unexpired row of
//! the owner alone would not: after the pin lapsed and a sweep deleted the
//! entry, a retry's pin (or another put's) re-creates the row, and the
//! stalled set would commit a reference to a deleted entry. A set that
//! fails the check writes nothing and answers a `TimedOut` error (retry:
//! the retry pins the entry again, or finds it missing).

use async_trait::async_trait;
use sqlx::postgres::{PgPool, Postgres};
use sqlx::{Row, Transaction};
use store_pg::plumbing::{db_err, digest_col, lock_key_shared, named_in, namespace_col, sql};
use store_types::{
    ref_conflict, Author, Digest, Error, Key, LivenessTable, Namespace, PinProof, RefEntry,
    RefExpect, RefName, RefStore, Result,
};

/// Migration component of the reference tables.
pub const REFS_COMPONENT: &str = "refs";

/// Name of the reference table (see the module docs for why not `refs`).
pub const REFS_TABLE: &str = "ref_names";

/// Migration steps of [`REFS_COMPONENT`].
///
/// - v1: `ref_names` with its `(namespace, digest)` index, and
///   `ref_namespaces`.
/// - v2: `ref_names.owner` (issue 39): the author that wrote the digest.
///   Existing rows get NULL, i.e. they are the library's: only
///   `Replace::Any` (the `delete` scope, or the library) may replace or
///   remove them. A nullable column without a default rewrites nothing.
pub const REFS_STEPS: &[&str] = &[
    "CREATE TABLE {schema}.ref_names (
        namespace text COLLATE \"C\" NOT NULL,
        name text COLLATE \"C\" NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (namespace, name)
    );
    CREATE INDEX ref_names_digest ON {schema}.ref_names (namespace, digest);
    CREATE TABLE {schema}.ref_namespaces (
        namespace text COLLATE \"C\" PRIMARY KEY,
        since timestamptz NOT NULL DEFAULT now()
    )",
    "ALTER TABLE {schema}.ref_names ADD COLUMN owner text COLLATE \"C\"",
];

/// How `set` and `delete` begin: the row-lock protocol needs each
/// statement's fresh snapshot, whatever the server's default isolation.
const BEGIN_READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Attempts of a `set` whose insert lost to a concurrent insert (each lost
/// race means the row now exists, so the next attempt locks it; more than
/// a few only happen when the reference is deleted and re-created
/// repeatedly in between).
const SET_ATTEMPTS: usize = 64;

/// The references of one PostgreSQL schema.
#[derive(Clone, Debug)]
pub struct PgRefs {
    pool: PgPool,
    schema: String,
}

impl PgRefs {
    /// References in `schema` (validated, migrated) through `pool`.
    pub fn new(pool: PgPool, schema: impl Into<String>) -> Self {
        PgRefs {
            pool,
            schema: schema.into(),
        }
    }

    fn sql(&self, template: &str) -> sqlx::SqlStr {
        sql(&self.schema, template)
    }

    /// The reference's digest and owner, its row locked until `tx` ends
    /// (nothing is locked when it does not exist).
    async fn current_for_update(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        ns: &Namespace,
        name: &RefName,
    ) -> Result<Option<(Digest, Option<String>)>> {
        let row = sqlx::query(self.sql(
            "SELECT digest, owner FROM {schema}.ref_names
             WHERE namespace = $1 AND name = $2 FOR UPDATE",
        ))
        .bind(ns.as_str())
        .bind(name.as_str())
        .fetch_optional(&mut **tx)
        .await
        .map_err(db_err)?;
        row.map(|r| Ok((digest_col(&r, 0)?, r.try_get(1).map_err(db_err)?)))
            .transpose()
    }

    /// One attempt of `set`: `Ok(None)` when a concurrent insert won the
    /// race for an absent row (the caller retries).
    async fn try_set(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
        author: Author<'_>,
        pin: Option<PinProof<'_>>,
    ) -> Result<Option<Option<Digest>>> {
        let mut tx = begin_read_committed(&self.pool).await?;
        if let Some(pin) = pin {
            let key = Key::new(ns.clone(), digest);
            if !self.entry_still_pinned(&mut tx, &key, pin).await? {
                tx.rollback().await.map_err(db_err)?;
                return Err(Error::backend(
                    store_types::ErrorKind::TimedOut,
                    "postgres: set reference",
                )
                .with_key(&key)
                .with_source(
                    "the entry's pin expired (or a sweep is deleting it) before the reference \
                     was committed: the set outlived the pin TTL; nothing was written — retry",
                ));
            }
        }
        let row = self.current_for_update(&mut tx, ns, name).await?;
        let current = row.as_ref().map(|r| r.0);
        let owner = match admit(author, name, row.as_ref(), expect, Some(digest)) {
            Ok(owner) => owner,
            Err(refused) => {
                // Roll back now rather than on drop: the row lock must not
                // outlive the call (a dropped transaction's rollback is
                // only sent when its connection is next used or returned).
                tx.rollback().await.map_err(db_err)?;
                return Err(refused);
            }
        };
        if current.is_some() {
            sqlx::query(self.sql(
                "UPDATE {schema}.ref_names SET digest = $3, updated_at = now(), owner = $4
                 WHERE namespace = $1 AND name = $2",
            ))
            .bind(ns.as_str())
            .bind(name.as_str())
            .bind(&digest.as_bytes()[..])
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        } else {
            let inserted = sqlx::query(self.sql(
                "INSERT INTO {schema}.ref_names (namespace, name, digest, owner)
                 VALUES ($1, $2, $3, $4)
                 ON CONFLICT (namespace, name) DO NOTHING",
            ))
            .bind(ns.as_str())
            .bind(name.as_str())
            .bind(&digest.as_bytes()[..])
            .bind(owner)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?
            .rows_affected();
            if inserted == 0 {
                tx.rollback().await.map_err(db_err)?;
                return Ok(None);
            }
        }
        tx.commit().await.map_err(db_err)?;
        Ok(Some(current))
    }

    /// The fleet guard (see the module docs): takes `key`'s lock shared
    /// for the rest of `tx`, then whether the key is unfenced and the
    /// proof's pin row on it — its owner's, still of its generation — is
    /// unexpired by the database's clock.
    async fn entry_still_pinned(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        key: &Key,
        pin: PinProof<'_>,
    ) -> Result<bool> {
        lock_key_shared(tx, &self.schema, key).await?;
        sqlx::query_scalar(self.sql(
            "SELECT NOT EXISTS (SELECT 1 FROM {schema}.gc_deleting WHERE ns = $1 AND digest = $2)
                AND EXISTS (SELECT 1 FROM {schema}.gc_pins
                            WHERE ns = $1 AND digest = $2 AND owner = $3 AND pin_id = $4
                              AND expires_at > {schema}.gc_now_statement())",
        ))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .bind(pin.owner)
        .bind(pin.generation)
        .fetch_one(&mut **tx)
        .await
        .map_err(db_err)
    }
}

/// Checks `expect` against the row (its digest and owner, read under its
/// lock), then whether `author` may change it to `new` (`None`: remove);
/// answers the owner the row has after the write: its own when `new` is
/// the digest it holds, else the author's name. The refusal is
/// [`Error::RefConflict`] or [`Error::NotOwner`].
pub(crate) fn admit(
    author: Author<'_>,
    name: &RefName,
    row: Option<&(Digest, Option<String>)>,
    expect: RefExpect,
    new: Option<Digest>,
) -> Result<Option<String>> {
    let current = row.map(|r| r.0);
    if !expect.holds(current) {
        return Err(ref_conflict(name, current));
    }
    author.check(name, row.map(|(d, o)| (*d, o.as_deref())), new)?;
    Ok(match row {
        Some((d, owner)) if Some(*d) == new => owner.clone(),
        _ => author.name.map(str::to_owned),
    })
}

/// The exclusive upper bound of the names starting with `prefix` (a
/// prefix of name characters, see [`could_prefix_a_name`]). Every name
/// character is ASCII below `{`, so incrementing the last one stays ASCII,
/// and every name sorts below `"\x7f"` (the bound of the empty prefix).
fn prefix_end(prefix: &str) -> String {
    let mut bytes = prefix.as_bytes().to_vec();
    match bytes.pop() {
        Some(last) if last < 0x7f => {
            bytes.push(last + 1);
            String::from_utf8(bytes).unwrap_or_else(|_| "\x7f".to_string())
        }
        _ => "\x7f".to_string(),
    }
}

/// Whether a name could start with `prefix` (only name characters).
fn could_prefix_a_name(prefix: &str) -> bool {
    prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
}

/// A `READ COMMITTED` transaction that the server ends by itself if its
/// client goes quiet inside it (a reference's `set`/`delete` or a cache
/// key's `record` dropped between its locked read and its commit holds
/// the row lock only until sqlx's queued rollback runs or, at worst, this
/// timeout).
pub(crate) async fn begin_read_committed(pool: &PgPool) -> Result<Transaction<'static, Postgres>> {
    let mut tx = pool
        .begin_with(BEGIN_READ_COMMITTED)
        .await
        .map_err(db_err)?;
    sqlx::query("SET LOCAL idle_in_transaction_session_timeout = '30s'")
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
    Ok(tx)
}

pub(crate) fn stored_name(name: String) -> Result<RefName> {
    RefName::new(name).map_err(|e| {
        Error::backend(
            store_types::ErrorKind::InvalidData,
            "postgres: decode stored reference name",
        )
        .with_source(e)
    })
}

#[async_trait]
impl RefStore for PgRefs {
    async fn set_checked(
        &self,
        ns: &Namespace,
        name: &RefName,
        digest: Digest,
        expect: RefExpect,
        author: Author<'_>,
        pin: Option<PinProof<'_>>,
    ) -> Result<Option<Digest>> {
        for _ in 0..SET_ATTEMPTS {
            if let Some(previous) = self.try_set(ns, name, digest, expect, author, pin).await? {
                return Ok(previous);
            }
        }
        Err(
            Error::backend(store_types::ErrorKind::Contended, "postgres: set reference")
                .with_target(format!("{ns}/{name}"))
                .with_source(format!(
                    "it kept changing under {SET_ATTEMPTS} attempts to set it"
                )),
        )
    }

    async fn get(&self, ns: &Namespace, name: &RefName) -> Result<Option<Digest>> {
        let row = sqlx::query(
            self.sql("SELECT digest FROM {schema}.ref_names WHERE namespace = $1 AND name = $2"),
        )
        .bind(ns.as_str())
        .bind(name.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(db_err)?;
        row.map(|r| digest_col(&r, 0)).transpose()
    }

    async fn delete(
        &self,
        ns: &Namespace,
        name: &RefName,
        expect: RefExpect,
        author: Author<'_>,
    ) -> Result<Option<Digest>> {
        let mut tx = begin_read_committed(&self.pool).await?;
        let row = self.current_for_update(&mut tx, ns, name).await?;
        let current = row.as_ref().map(|r| r.0);
        if let Err(refused) = admit(author, name, row.as_ref(), expect, None) {
            // Roll back now rather than on drop: the row lock must not
            // outlive the call (a dropped transaction's rollback is only
            // sent when its connection is next used or returned).
            tx.rollback().await.map_err(db_err)?;
            return Err(refused);
        }
        if current.is_none() {
            // Nothing locked, nothing to delete: the transaction only read.
            tx.rollback().await.map_err(db_err)?;
            return Ok(None);
        }
        sqlx::query(self.sql("DELETE FROM {schema}.ref_names WHERE namespace = $1 AND name = $2"))
            .bind(ns.as_str())
            .bind(name.as_str())
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(current)
    }

    async fn list(
        &self,
        ns: &Namespace,
        prefix: &str,
        after: Option<&RefName>,
        limit: usize,
    ) -> Result<Vec<RefEntry>> {
        if limit == 0 || !could_prefix_a_name(prefix) {
            return Ok(Vec::new());
        }
        // A range over the primary key (byte order under "C"), not LIKE:
        // `_` in a prefix is a name character, not a wildcard. Every bound
        // is a plain index condition (no `$n IS NULL OR …`), so even a
        // generic plan stops at the end of the prefix; B-tree keeps the
        // tighter of the two lower bounds at run time.
        let rows = sqlx::query(self.sql(
            "SELECT name, digest FROM {schema}.ref_names
             WHERE namespace = $1 AND name >= $2 AND name < $3 AND name > $4
             ORDER BY name LIMIT $5",
        ))
        .bind(ns.as_str())
        .bind(prefix)
        .bind(prefix_end(prefix))
        .bind(after.map_or("", RefName::as_str))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        rows.iter()
            .map(|r| {
                Ok(RefEntry {
                    name: stored_name(r.try_get(0).map_err(db_err)?)?,
                    digest: digest_col(r, 1)?,
                })
            })
            .collect()
    }

    async fn referenced(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        named_in(&self.pool, &self.schema, REFS_TABLE, ns, digests).await
    }

    async fn ref_namespaces(&self) -> Result<Vec<Namespace>> {
        let rows = sqlx::query(
            self.sql("SELECT namespace FROM {schema}.ref_namespaces ORDER BY namespace"),
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db_err)?;
        rows.iter().map(|r| namespace_col(r, 0)).collect()
    }

    async fn mark_uses_refs(&self, ns: &Namespace) -> Result<bool> {
        let n = sqlx::query(self.sql(
            "INSERT INTO {schema}.ref_namespaces (namespace) VALUES ($1)
             ON CONFLICT (namespace) DO NOTHING",
        ))
        .bind(ns.as_str())
        .execute(&self.pool)
        .await
        .map_err(db_err)?
        .rows_affected();
        Ok(n > 0)
    }

    async fn uses_refs(&self, ns: &Namespace) -> Result<bool> {
        sqlx::query_scalar(
            self.sql("SELECT EXISTS (SELECT 1 FROM {schema}.ref_namespaces WHERE namespace = $1)"),
        )
        .bind(ns.as_str())
        .fetch_one(&self.pool)
        .await
        .map_err(db_err)
    }

    fn liveness_table(&self) -> Option<LivenessTable> {
        Some(
            LivenessTable::new(&self.schema, REFS_TABLE, "digest")
                .with_namespace_column("namespace"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_bounds() {
        assert_eq!(prefix_end(""), "\x7f");
        assert_eq!(prefix_end("a"), "b");
        assert_eq!(prefix_end("builds/"), "builds0");
        assert_eq!(prefix_end("a_"), "a`");
        assert_eq!(prefix_end("z"), "{");
        assert!(could_prefix_a_name("builds/2026-12_a.b"));
        assert!(could_prefix_a_name(""));
        assert!(!could_prefix_a_name("a%"));
        assert!(!could_prefix_a_name("a\0"));
        assert!(!could_prefix_a_name("ü"));
    }
}
