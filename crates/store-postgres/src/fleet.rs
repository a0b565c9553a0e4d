//! Fleet-mode clauses of the GC host (ADR-012 §3, §4, §6.6): pinned puts,
//! liveness-table binding, SQL arbitration and the locked execute batch.
//!
//! # The per-key lock protocol
//!
//! Fleet GC safety rests on one advisory lock per key in the database
//! hosting `gc_pins`, with id [`key_lock`]`(host_schema, key)`:
//!
//! - every fleet put takes it **shared** (`pg_advisory_xact_lock_shared`)
//!   in the transaction that commits its pin row (as that transaction's
//!   first statement for the kv put and the pin-first step; pg-lo takes it
//!   in its staging transaction just before the companion row);
//! - a sweep's execute batch takes it **exclusive**
//!   (`pg_advisory_xact_lock`) for every candidate, in ascending id order
//!   (sorted, de-duplicated, one statement), as the first statement of its
//!   transaction, and re-arbitrates in a **new** statement. The batch runs
//!   at `READ COMMITTED`, so that statement's snapshot is taken after the
//!   locks are held: a pin committed before the batch locked is seen, and a
//!   pin that tries to commit later waits for the batch to end.
//!
//! # Statements
//!
//! Arbitration is one statement per call, over
//! `unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS k(ns, digest, i)`:
//!
//! ```sql
//! SELECT k.i,
//!        EXISTS (SELECT 1 FROM "host".gc_pins p
//!                WHERE p.ns = k.ns AND p.digest = k.digest
//!                  AND p.expires_at > "host".gc_now()),               -- the database's clock
//!        (false
//!         OR (k.ns = $3 AND EXISTS (SELECT 1 FROM "s"."t" t
//!                                   WHERE t."digest" = k.digest            -- bytea
//!                                      -- or = encode(k.digest, 'hex')     -- text
//!                                     AND t."ns" = k.ns)))                 -- if any
//! FROM unnest(...) WITH ORDINALITY AS k(ns, digest, i)
//! ```
//!
//! with one `OR` term per bound table whose namespace occurs among the
//! keys (`$3`, `$4`, … are those namespaces). Pin expiry is judged by the
//! host's clock `gc_now()` (the database's, see
//! [`GC_WINDOW_STEPS`](store_pg::plumbing::GC_WINDOW_STEPS)), never by a
//! node's. Identifiers are validated
//! (`[A-Za-z_][A-Za-z0-9_]{0,62}`) and double-quoted, so they match the
//! catalog names exactly (case-sensitive).

use std::collections::{BTreeSet, HashMap, HashSet};

use async_trait::async_trait;
use bytes::Bytes;
use sqlx::postgres::{PgConnection, PgPool, Postgres};
use sqlx::{AssertSqlSafe, Row, SqlSafeStr, Transaction};
use store_pg::fence::{fence_backoff, fence_timeout, is_fenced, FENCE_WAIT};
use store_pg::plumbing::{
    db_err, digest_col, digest_params, key_lock, lock_key_shared, now_ms, quote_schema, size_col,
    sql, to_i64, upsert_pin,
};
use store_types::{
    BoundLivenessTable, Digest, Error, FleetBatch, Instance, Key, LivenessTable, Namespace,
    PinGeneration, PinIntent, ProtectReason, PublishOutcome, Result, Timestamp,
};

use crate::fence;

/// How fleet transactions begin: the lock protocol needs each statement's
/// fresh snapshot, whatever the server's `default_transaction_isolation`.
const BEGIN_READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Checks an identifier of a liveness table reference against
/// `[A-Za-z_][A-Za-z0-9_]{0,62}`; anything else is [`Error::Config`].
pub(crate) fn validate_ident(what: &str, name: &str) -> Result<()> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "invalid liveness-table {what} {name:?}: expected [A-Za-z_][A-Za-z0-9_]{{0,62}}"
        )))
    }
}

fn quote(name: &str) -> String {
    format!("\"{name}\"")
}

fn validate_table(t: &LivenessTable) -> Result<()> {
    validate_ident("schema", &t.schema)?;
    validate_ident("table", &t.table)?;
    validate_ident("digest column", &t.digest_column)?;
    if let Some(c) = &t.namespace_column {
        validate_ident("namespace column", c)?;
    }
    Ok(())
}

/// Refuses a pin whose host is not this GC host (`host`): writing it here
/// would split the fleet's arbitration domain.
pub(crate) fn check_host(host: &Instance, pin: &PinIntent) -> Result<()> {
    let same_schema = matches!(
        (host, &pin.host),
        (Instance::Postgres { schema: a, .. }, Instance::Postgres { schema: b, .. }) if a == b
    );
    if host.same_database(&pin.host) && same_schema {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "pin addressed to {:?}, but this GC host is {host:?}",
            pin.host
        )))
    }
}

/// Begins a fleet put's `READ COMMITTED` transaction holding `key`'s
/// shared lock, once no deletion fence (`crate::fence`) stands on the key:
/// a fenced key is waited out with the transaction rolled back (a waiting
/// put holds no connection), for at most [`FENCE_WAIT`].
///
/// Cancel-safe: a transaction dropped before its commit rolls back.
async fn begin_unfenced(
    pool: &PgPool,
    schema: &str,
    key: &Key,
) -> Result<Transaction<'static, Postgres>> {
    let started = std::time::Instant::now();
    let mut attempt = 0;
    loop {
        let mut tx = pool
            .begin_with(BEGIN_READ_COMMITTED)
            .await
            .map_err(db_err)?;
        lock_key_shared(&mut tx, schema, key).await?;
        if !is_fenced(&mut tx, schema, key).await? {
            return Ok(tx);
        }
        tx.rollback().await.map_err(db_err)?;
        if started.elapsed() >= FENCE_WAIT {
            return Err(fence_timeout(key));
        }
        tokio::time::sleep(fence_backoff(attempt)).await;
        attempt += 1;
    }
}

/// A `READ COMMITTED` transaction holding `key`'s shared lock (taken as
/// its first statement; no fence wait): for the pin-row writers that do
/// not publish (`pin_commit`, `pin_renew`), so they judge a row's expiry
/// after any sweep batch on the key has committed (ADR-054).
pub(crate) async fn begin_key_locked(
    pool: &PgPool,
    schema: &str,
    key: &Key,
) -> Result<Transaction<'static, Postgres>> {
    let mut tx = pool
        .begin_with(BEGIN_READ_COMMITTED)
        .await
        .map_err(db_err)?;
    lock_key_shared(&mut tx, schema, key).await?;
    Ok(tx)
}

/// The fleet kv put: shared key lock, entry insert (if absent), pin upsert,
/// in one `READ COMMITTED` transaction, after any deletion fence on the key
/// has cleared ([`begin_unfenced`]).
pub(crate) async fn put_pinned(
    pool: &PgPool,
    schema: &str,
    key: &Key,
    bytes: Bytes,
    pin: &PinIntent,
) -> Result<PublishOutcome> {
    let mut tx = begin_unfenced(pool, schema, key).await?;
    let inserted = sqlx::query(sql(
        schema,
        "INSERT INTO {schema}.entries (ns, digest, size, created_at, content)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (ns, digest) DO NOTHING",
    ))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .bind(to_i64(bytes.len() as u64)?)
    .bind(now_ms())
    .bind(&bytes[..])
    .execute(&mut *tx)
    .await
    .map_err(db_err)?
    .rows_affected();
    upsert_pin(&mut tx, schema, key, pin).await?;
    tx.commit().await.map_err(db_err)?;
    Ok(if inserted > 0 {
        PublishOutcome::Inserted
    } else {
        PublishOutcome::AlreadyPresent
    })
}

/// The pin-first step: shared key lock and pin upsert in one transaction,
/// after any deletion fence on the key has cleared (the caller publishes
/// next, and must never dedup onto an entry whose delete is in flight).
/// Returns the committed row's generation (ADR-054).
pub(crate) async fn pin_first(
    pool: &PgPool,
    schema: &str,
    key: &Key,
    pin: &PinIntent,
) -> Result<PinGeneration> {
    let mut tx = begin_unfenced(pool, schema, key).await?;
    let generation = upsert_pin(&mut tx, schema, key, pin).await?;
    tx.commit().await.map_err(db_err)?;
    Ok(generation)
}

/// `table` exists, is a table or view of a kind the arbitration can read,
/// and the role may `SELECT` from it.
async fn check_relation(pool: &PgPool, table: &LivenessTable, name: &str) -> Result<()> {
    let rel = sqlx::query(
        "SELECT c.relkind::text, has_table_privilege(c.oid, 'SELECT')
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2",
    )
    .bind(&table.schema)
    .bind(&table.table)
    .fetch_optional(pool)
    .await
    .map_err(db_err)?;
    let Some(rel) = rel else {
        return Err(Error::Config(format!(
            "liveness table {name} does not exist"
        )));
    };
    let kind: String = rel.try_get(0).map_err(db_err)?;
    let readable: bool = rel.try_get(1).map_err(db_err)?;
    if !matches!(kind.as_str(), "r" | "p" | "v" | "m" | "f") {
        return Err(Error::Config(format!(
            "liveness table {name} is not a table or view (relkind {kind})"
        )));
    }
    if !readable {
        return Err(Error::Config(format!(
            "liveness table {name} is not readable (no SELECT privilege)"
        )));
    }
    Ok(())
}

/// The (base) type of each column of `table`.
async fn column_types(pool: &PgPool, table: &LivenessTable) -> Result<HashMap<String, String>> {
    let rows = sqlx::query(
        "SELECT a.attname::text, format_type(coalesce(nullif(ty.typbasetype, 0), ty.oid), NULL)
         FROM pg_attribute a
         JOIN pg_class c ON c.oid = a.attrelid
         JOIN pg_namespace n ON n.oid = c.relnamespace
         JOIN pg_type ty ON ty.oid = a.atttypid
         WHERE n.nspname = $1 AND c.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(&table.schema)
    .bind(&table.table)
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    let mut types = HashMap::with_capacity(rows.len());
    for r in &rows {
        let col: String = r.try_get(0).map_err(db_err)?;
        let ty: String = r.try_get(1).map_err(db_err)?;
        types.insert(col, ty);
    }
    Ok(types)
}

/// Checks the table reference against the catalog and binds it to `ns`.
///
/// Accepts tables, partitioned tables, views, materialized views and
/// foreign tables the role may `SELECT` from. The digest column must be
/// `bytea` or `text`/`varchar` (domains resolve to their base type); the
/// namespace column, if named, `text`/`varchar`.
pub(crate) async fn bind_liveness_table(
    pool: &PgPool,
    ns: &Namespace,
    table: &LivenessTable,
) -> Result<BoundLivenessTable> {
    validate_table(table)?;
    let name = format!("{}.{}", table.schema, table.table);
    check_relation(pool, table, &name).await?;
    let types = column_types(pool, table).await?;
    let is_text = |ty: &str| matches!(ty, "text" | "character varying");
    let digest_is_text = match types.get(&table.digest_column).map(String::as_str) {
        None => {
            return Err(Error::Config(format!(
                "liveness table {name} has no digest column {:?}",
                table.digest_column
            )))
        }
        Some("bytea") => false,
        Some(ty) if is_text(ty) => true,
        Some(ty) => {
            return Err(Error::Config(format!(
                "liveness table {name}: digest column {:?} is {ty}, expected bytea or text",
                table.digest_column
            )))
        }
    };
    if let Some(col) = &table.namespace_column {
        match types.get(col).map(String::as_str) {
            None => {
                return Err(Error::Config(format!(
                    "liveness table {name} has no namespace column {col:?}"
                )))
            }
            Some(ty) if is_text(ty) => {}
            Some(ty) => {
                return Err(Error::Config(format!(
                    "liveness table {name}: namespace column {col:?} is {ty}, expected text"
                )))
            }
        }
    }
    Ok(BoundLivenessTable {
        namespace: ns.clone(),
        table: table.clone(),
        digest_is_text,
    })
}

/// The arbitration statement over `keys` and the bound tables that apply
/// to them, with the namespace parameter of each table term (`$3`, …).
fn arbitrate_sql(
    host_schema: &str,
    keys: &[Key],
    tables: &[BoundLivenessTable],
) -> Result<(sqlx::SqlStr, Vec<String>)> {
    let key_ns: HashSet<&Namespace> = keys.iter().map(|k| &k.namespace).collect();
    let mut seen = HashSet::new();
    let mut live = String::from("false");
    let mut params = Vec::new();
    for b in tables {
        if !key_ns.contains(&b.namespace) || !seen.insert(b) {
            continue;
        }
        let t = &b.table;
        validate_table(t)?;
        let digest_expr = if b.digest_is_text {
            "encode(k.digest, 'hex')"
        } else {
            "k.digest"
        };
        let ns_clause = match &t.namespace_column {
            Some(c) => format!(" AND t.{} = k.ns", quote(c)),
            None => String::new(),
        };
        params.push(b.namespace.as_str().to_string());
        live.push_str(&format!(
            "\n OR (k.ns = ${p} AND EXISTS (SELECT 1 FROM {s}.{tb} t WHERE t.{d} = {digest_expr}{ns_clause}))",
            p = 2 + params.len(),
            s = quote(&t.schema),
            tb = quote(&t.table),
            d = quote(&t.digest_column),
        ));
    }
    let text = format!(
        "SELECT k.i,
                EXISTS (SELECT 1 FROM {host}.gc_pins p
                        WHERE p.ns = k.ns AND p.digest = k.digest
                          AND p.expires_at > {host}.gc_now()),
                ({live})
         FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS k(ns, digest, i)",
        host = quote_schema(host_schema),
    );
    Ok((AssertSqlSafe(text).into_sql_str(), params))
}

/// Runs the arbitration statement on `conn`; index-aligned answers. Pin
/// rows are judged by the host's clock, `expires_at > gc_now()` (the
/// database's, never a node's; inside a batch, its transaction start).
pub(crate) async fn arbitrate_on(
    conn: &mut PgConnection,
    host_schema: &str,
    keys: &[Key],
    tables: &[BoundLivenessTable],
) -> Result<Vec<Option<ProtectReason>>> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let (stmt, table_ns) = arbitrate_sql(host_schema, keys, tables)?;
    let ns: Vec<&str> = keys.iter().map(|k| k.namespace.as_str()).collect();
    let digests: Vec<&[u8]> = keys.iter().map(|k| &k.digest.as_bytes()[..]).collect();
    let mut q = sqlx::query(stmt).bind(ns).bind(digests);
    for n in table_ns {
        q = q.bind(n);
    }
    let rows = q.fetch_all(conn).await.map_err(db_err)?;
    let mut out = vec![None; keys.len()];
    for r in &rows {
        let i: i64 = r.try_get(0).map_err(db_err)?;
        let pinned: bool = r.try_get(1).map_err(db_err)?;
        let live: bool = r.try_get(2).map_err(db_err)?;
        let reason = if pinned {
            Some(ProtectReason::Pinned)
        } else if live {
            Some(ProtectReason::Live)
        } else {
            None
        };
        if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| out.get_mut(i)) {
            *slot = reason;
        }
    }
    Ok(out)
}

/// Opens a sweep execute batch: a `READ COMMITTED` transaction whose first
/// statement takes every key's lock exclusive, in ascending id order.
pub(crate) async fn begin_batch(
    pool: &PgPool,
    schema: &str,
    keys: &[Key],
) -> Result<Box<dyn FleetBatch>> {
    let ids: BTreeSet<i64> = keys.iter().map(|k| key_lock(schema, k)).collect();
    let mut tx = pool
        .begin_with(BEGIN_READ_COMMITTED)
        .await
        .map_err(db_err)?;
    if !ids.is_empty() {
        // A function scan over the (sorted) array evaluates in array order.
        let sorted: Vec<i64> = ids.iter().copied().collect();
        sqlx::query("SELECT pg_advisory_xact_lock(id) FROM unnest($1::int8[]) AS t(id)")
            .bind(sorted)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
    }
    Ok(Box::new(PgFleetBatch {
        tx,
        schema: schema.to_string(),
        locked: ids,
    }))
}

/// A sweep execute batch holding its keys' exclusive locks. Dropping it
/// rolls the transaction back (sqlx sends the rollback when the connection
/// is next used or returned to the pool), releasing the locks.
struct PgFleetBatch {
    tx: Transaction<'static, Postgres>,
    schema: String,
    locked: BTreeSet<i64>,
}

#[async_trait]
impl FleetBatch for PgFleetBatch {
    async fn protected(
        &mut self,
        keys: &[Key],
        tables: &[BoundLivenessTable],
        _now: Timestamp,
    ) -> Result<Vec<Option<ProtectReason>>> {
        arbitrate_on(&mut self.tx, &self.schema, keys, tables).await
    }

    async fn delete_entries(
        &mut self,
        ns: &Namespace,
        digests: &[Digest],
    ) -> Result<Vec<Option<u64>>> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(d) = digests.iter().find(|d| {
            let id = key_lock(&self.schema, &Key::new(ns.clone(), **d));
            !self.locked.contains(&id)
        }) {
            return Err(Error::backend(
                store_types::ErrorKind::Other,
                "postgres: fleet batch delete",
            )
            .with_key(&Key::new(ns.clone(), *d))
            .with_source("its key lock is not held by this batch"));
        }
        let rows = sqlx::query(sql(
            &self.schema,
            "DELETE FROM {schema}.entries e USING unnest($2::bytea[]) AS q(d)
             WHERE e.ns = $1 AND e.digest = q.d
             RETURNING e.digest, e.size",
        ))
        .bind(ns.as_str())
        .bind(digest_params(digests))
        .fetch_all(&mut *self.tx)
        .await
        .map_err(db_err)?;
        let mut freed = HashMap::with_capacity(rows.len());
        for r in &rows {
            freed.insert(digest_col(r, 0)?, size_col(r, 1)?);
        }
        // A digest listed twice is freed once: the first occurrence.
        Ok(digests.iter().map(|d| freed.remove(d)).collect())
    }

    async fn unstage(&mut self, keys: &[Key]) -> Result<()> {
        if keys.is_empty() {
            return Ok(());
        }
        let ns: Vec<&str> = keys.iter().map(|k| k.namespace.as_str()).collect();
        let digests: Vec<&[u8]> = keys.iter().map(|k| &k.digest.as_bytes()[..]).collect();
        sqlx::query(sql(
            &self.schema,
            "DELETE FROM {schema}.gc_window w
             USING unnest($1::text[], $2::bytea[]) AS k(ns, digest)
             WHERE w.ns = k.ns AND w.digest = k.digest",
        ))
        .bind(ns)
        .bind(digests)
        .execute(&mut *self.tx)
        .await
        .map_err(db_err)?;
        Ok(())
    }

    async fn fence(&mut self, keys: &[Key]) -> Result<()> {
        fence::fence(&mut self.tx, &self.schema, keys).await
    }

    async fn fenced(&mut self, keys: &[Key]) -> Result<Vec<bool>> {
        fence::fenced_many(&mut self.tx, &self.schema, keys).await
    }

    async fn commit(self: Box<Self>) -> Result<()> {
        self.tx.commit().await.map_err(db_err)
    }
}
