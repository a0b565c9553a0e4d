//! Shared PostgreSQL plumbing for the `postgres` and `pg-lo` engines:
//! pool creation, schema-name validation, instance identity, the
//! migration runner, the shared `gc_window` clauses and small helpers.
//!
//! Everything here is schema-qualified: the engines never rely on
//! `search_path`, which is per connection and not reliable across a pool.

use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, Row, SqlStr};
use store_types::{
    Digest, Error, ErrorKind, Instance, Key, Namespace, PinGeneration, PinIntent, Result, Timestamp,
};

pub use crate::error::{db_err, db_err_in};

pub use crate::window::PgWindow;

/// Default pool size of [`connect_pool`].
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16;

/// Name of the per-schema migration bookkeeping table.
pub const SCHEMA_VERSION_TABLE: &str = "schema_version";

/// Migration component of the shared `gc_window` table.
pub const GC_WINDOW_COMPONENT: &str = "gc_window";

/// Migration steps of the shared `gc_window` component (`{schema}` is
/// replaced by the quoted schema name). Both engines use exactly these
/// steps, so a schema shared by a `postgres` and a `pg-lo` engine holds one
/// table. Every GC host (postgres or pg-lo) runs this component, so every
/// GC host has the GC clock `{schema}.gc_now()` (below).
///
/// 1. the `gc_window` table;
/// 2. the GC clock: the function `{schema}.gc_now()` and its one-row test
///    hook table `{schema}.gc_clock`;
/// 3. `{schema}.gc_now_statement()`: the same clock at the current
///    statement, for times written late in a long transaction (a pg-lo pin
///    row at the end of an upload, a fence after the lock wait).
///
/// # The GC clock
///
/// `{schema}.gc_now()` is unix milliseconds (the unit of [`Timestamp`]) by
/// **the database's** clock. On the SQL hosts every GC expiry and
/// visibility judgement uses it, never a node's clock: pin rows are written
/// (`expires_at = gc_now() + ttl`) and judged (`expires_at > gc_now()`) by
/// it, window rows are due when `visible_after <= gc_now()`, and the
/// collector stages by it (`WindowClauses::now`). Nodes of a fleet may
/// disagree about the time by any amount; the database cannot disagree
/// with itself.
///
/// It reads `now()`, the **transaction start** time (the function is
/// `STABLE`): inside a sweep's locked batch that is when the batch began, a
/// little before it arbitrates, which errs on the safe side (pins look
/// unexpired slightly longer, window rows become due slightly later).
///
/// `{schema}.gc_clock (one, offset_ms, frozen_at_ms)` is a one-row **test
/// hook** and must stay empty in production. With a row, `gc_now()` is
/// `coalesce(frozen_at_ms, now_ms)` plus `offset_ms`: it moves (or stops)
/// *the database's* clock, which every node sees alike — unlike a node's
/// clock skew, it models the passing of the one time (the `testing`
/// feature's `set_db_clock` and `advance_db_clock`).
pub const GC_WINDOW_STEPS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS {schema}.gc_window (
        ns text COLLATE \"C\" NOT NULL,
        digest bytea NOT NULL CHECK (octet_length(digest) = 32),
        size bigint NOT NULL,
        visible_after bigint NOT NULL,
        PRIMARY KEY (ns, digest)
    );
    CREATE INDEX IF NOT EXISTS gc_window_due ON {schema}.gc_window (visible_after)",
    // `gc_clock` is a TEST HOOK and must stay empty in production: a row
    // moves (or stops) the clock every node's GC decisions are judged by.
    "CREATE TABLE IF NOT EXISTS {schema}.gc_clock (
        one boolean PRIMARY KEY DEFAULT true CHECK (one),
        offset_ms bigint NOT NULL DEFAULT 0,
        frozen_at_ms bigint
    );
    COMMENT ON TABLE {schema}.gc_clock IS
        'Blobpool test hook: moves the database clock of gc_now(). Must stay empty in production.';
    CREATE OR REPLACE FUNCTION {schema}.gc_now() RETURNS bigint
        LANGUAGE sql STABLE PARALLEL SAFE
    AS $gc_now$
        SELECT coalesce(
                   (SELECT c.frozen_at_ms FROM {schema}.gc_clock c),
                   pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.now()) * 1000)::bigint
               )
               + coalesce((SELECT c.offset_ms FROM {schema}.gc_clock c), 0)
    $gc_now$;
    COMMENT ON FUNCTION {schema}.gc_now() IS
        'Blobpool GC clock: unix milliseconds by the database clock (plus the gc_clock test hook).'",
    // 3. The same clock read at the current *statement* (not the
    // transaction's start), for times written late in a long transaction.
    "CREATE OR REPLACE FUNCTION {schema}.gc_now_statement() RETURNS bigint
        LANGUAGE sql STABLE PARALLEL SAFE
    AS $gc_now_statement$
        SELECT coalesce(
                   (SELECT c.frozen_at_ms FROM {schema}.gc_clock c),
                   pg_catalog.floor(
                       pg_catalog.date_part('epoch', pg_catalog.statement_timestamp()) * 1000
                   )::bigint
               )
               + coalesce((SELECT c.offset_ms FROM {schema}.gc_clock c), 0)
    $gc_now_statement$;
    COMMENT ON FUNCTION {schema}.gc_now_statement() IS
        'Blobpool GC clock at the current statement (gc_now() is at the transaction start).'",
];

/// The database's clock at this *statement* (not at the transaction's
/// start): `gc_now()` moved on by the time the transaction has run so far.
/// For times written late in a long transaction (a fence after the lock
/// wait, a pin row at the end of a pg-lo upload), so they do not start in
/// the past.
pub const GC_NOW_STATEMENT: &str = "{schema}.gc_now_statement()";

/// Turns the 1-based `WITH ORDINALITY` indexes a batched `EXISTS` query
/// returned into an index-aligned mask over `len` keys.
pub fn ordinal_mask(hits: Vec<i64>, len: usize) -> Vec<bool> {
    let mut out = vec![false; len];
    for i in hits {
        if let Some(slot) = usize::try_from(i - 1).ok().and_then(|i| out.get_mut(i)) {
            *slot = true;
        }
    }
    out
}

/// A duration in milliseconds for binding next to the GC clock
/// (`{schema}.gc_now() + $n`), clamped so the sum cannot overflow `bigint`.
pub fn duration_ms(d: std::time::Duration) -> i64 {
    const MAX: i64 = i64::MAX / 4;
    i64::try_from(d.as_millis()).map_or(MAX, |ms| ms.min(MAX))
}

/// Opens a connection pool (at most [`DEFAULT_MAX_CONNECTIONS`]).
///
/// Use the engines' `from_pool` constructors for other pool settings.
pub async fn connect_pool(url: &str) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(DEFAULT_MAX_CONNECTIONS)
        .connect(url)
        .await
        .map_err(|e| db_err_in("postgres: connect", e))
}

/// Checks a schema name against `[a-z_][a-z0-9_]{0,62}` (and rejects the
/// reserved `pg_` prefix); anything else is [`Error::Config`].
pub fn validate_schema(schema: &str) -> Result<()> {
    let b = schema.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_');
    if !ok {
        return Err(Error::Config(format!(
            "invalid PostgreSQL schema name {schema:?}: expected [a-z_][a-z0-9_]{{0,62}}"
        )));
    }
    if schema.starts_with("pg_") {
        return Err(Error::Config(format!(
            "invalid PostgreSQL schema name {schema:?}: the pg_ prefix is reserved"
        )));
    }
    Ok(())
}

/// The schema name as a quoted identifier (call [`validate_schema`] first).
pub fn quote_schema(schema: &str) -> String {
    format!("\"{schema}\"")
}

/// Builds a statement from `template`, replacing `{schema}` by the quoted
/// schema name. The schema is validated, so the result is injection-free.
pub fn sql(schema: &str, template: &str) -> SqlStr {
    use sqlx::SqlSafeStr;
    let text: std::sync::Arc<str> = template.replace("{schema}", &quote_schema(schema)).into();
    AssertSqlSafe(text).into_sql_str()
}

/// Whether `e` is a database error with SQLSTATE `code`.
pub fn has_sqlstate(e: &sqlx::Error, code: &str) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .is_some_and(|c| c == code)
}

/// A stable 64-bit key (for advisory locks) from text parts: the first
/// eight bytes of the BLAKE3 hash of the NUL-joined parts. Stable across
/// processes, platforms and releases.
pub fn stable_key(parts: &[&str]) -> i64 {
    let joined = parts.join("\0");
    let d = Digest::of(joined.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d.as_bytes()[..8]);
    i64::from_le_bytes(b)
}

/// The fleet per-key lock id of `key` in the GC host `host_schema`
/// (ADR-012 §4): `stable_key(["blobpool/key", host_schema, ns, digest_hex])`.
///
/// Every fleet put takes it shared (`pg_advisory_xact_lock_shared`) in the
/// transaction that commits its pin row; a fleet sweep's execute batch
/// takes it exclusive before re-arbitrating and deleting. Advisory locks
/// are per database, so the id only needs to be unique within the host
/// database; a hash collision between two keys only adds contention.
pub fn key_lock(host_schema: &str, key: &Key) -> i64 {
    stable_key(&[
        "blobpool/key",
        host_schema,
        key.namespace.as_str(),
        &key.digest.to_hex(),
    ])
}

/// Takes `key`'s fleet lock shared for the rest of the transaction on
/// `conn` (see [`key_lock`]).
pub async fn lock_key_shared(conn: &mut PgConnection, host_schema: &str, key: &Key) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(key_lock(host_schema, key))
        .execute(conn)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// Upserts the pin row of `pin` for `key` into `<host_schema>.gc_pins` on
/// `conn`, expiring `pin.ttl` after `<host_schema>.gc_now_statement()` —
/// the database's clock (see [`GC_WINDOW_STEPS`]); `pin.now`, the putter's
/// clock, is not used. An existing row of the same owner keeps the later
/// expiry. Returns the row's generation (`pin_id`, ADR-054): a fresh one
/// from the host's sequence when the row is new or was already expired by
/// that clock, the row's own when this only extends an unexpired row.
///
/// The caller must hold `key`'s fleet lock shared
/// ([`lock_key_shared`]) on `conn`, taken in an earlier statement: the
/// expiry this statement judges is then read after any sweep batch that
/// deleted the entry has committed, so a row such a batch judged expired
/// never keeps its generation.
pub async fn upsert_pin(
    conn: &mut PgConnection,
    host_schema: &str,
    key: &Key,
    pin: &PinIntent,
) -> Result<PinGeneration> {
    validate_schema(host_schema)?;
    // The row's life starts at this statement, not at the transaction's
    // start: a pg-lo publish commits its pin at the end of a transaction
    // that began when the upload did. `EXCLUDED.pin_id` is the column
    // default the proposed row drew (a fresh `nextval`).
    sqlx::query_scalar(sql(
        host_schema,
        &PIN_UPSERT.replace("{now}", GC_NOW_STATEMENT),
    ))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .bind(&pin.owner)
    .bind(duration_ms(pin.ttl))
    .fetch_one(conn)
    .await
    .map_err(db_err)
}

/// The pin-row upsert every fleet pin writer shares (`{now}`: the clock
/// expression, `{schema}`: the host schema; `$1..$4`: ns, digest, owner,
/// ttl in ms): insert, or extend to the later expiry keeping the row's
/// generation while it is unexpired by `{now}`, taking a fresh one
/// otherwise; returns the generation.
pub const PIN_UPSERT: &str = "INSERT INTO {schema}.gc_pins AS p (ns, digest, owner, expires_at)
     VALUES ($1, $2, $3, {now} + $4)
     ON CONFLICT (ns, digest, owner)
     DO UPDATE SET expires_at = GREATEST(p.expires_at, EXCLUDED.expires_at),
                   pin_id = CASE WHEN p.expires_at > {now} THEN p.pin_id
                                 ELSE EXCLUDED.pin_id END
     RETURNING pin_id";

/// The engine's [`Instance`]: the cluster's `system_identifier`, the
/// database and the schema.
///
/// When `pg_control_system()` is not permitted for the role, the cluster is
/// identified by `inet_server_addr():inet_server_port()` instead (`local:`
/// and the port for Unix-socket connections). That fallback identifies the
/// server by the address the client reached it on, so two clients reaching
/// one server through different addresses see different identities (a
/// false "different instance", never a false "same instance" on one host).
pub async fn instance_identity(pool: &PgPool, schema: &str) -> Result<Instance> {
    let database: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(pool)
        .await
        .map_err(db_err)?;
    let sysid: std::result::Result<String, sqlx::Error> =
        sqlx::query_scalar("SELECT system_identifier::text FROM pg_control_system()")
            .fetch_one(pool)
            .await;
    let system_identifier = match sysid {
        Ok(id) => id,
        Err(e) => {
            tracing::debug!("pg_control_system() unavailable ({e}); using the server address");
            sqlx::query_scalar(
                "SELECT coalesce(host(inet_server_addr()), 'local') || ':' \
                 || coalesce(inet_server_port()::text, current_setting('port'))",
            )
            .fetch_one(pool)
            .await
            .map_err(db_err)?
        }
    };
    Ok(Instance::Postgres {
        system_identifier,
        database,
        schema: schema.to_string(),
    })
}

/// Creates the schema if missing (serialised by an advisory lock, so
/// concurrent engines do not race on the catalog).
pub async fn create_schema(pool: &PgPool, schema: &str) -> Result<()> {
    validate_schema(schema)?;
    let mut tx = pool.begin().await.map_err(db_err)?;
    lock_migrations(&mut tx, schema).await?;
    sqlx::raw_sql(sql(
        schema,
        "CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.schema_version (
             component text PRIMARY KEY,
             version integer NOT NULL
         )",
    ))
    .execute(&mut *tx)
    .await
    .map_err(db_err)?;
    tx.commit().await.map_err(db_err)
}

async fn lock_migrations(tx: &mut sqlx::PgConnection, schema: &str) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(stable_key(&["blobpool/migrate", schema]))
        .execute(tx)
        .await
        .map_err(db_err)?;
    Ok(())
}

/// The applied version of `component` in `schema` (0 when never migrated).
pub async fn schema_version(pool: &PgPool, schema: &str, component: &str) -> Result<u32> {
    let v: Option<i32> = sqlx::query_scalar(sql(
        schema,
        "SELECT version FROM {schema}.schema_version WHERE component = $1",
    ))
    .bind(component)
    .fetch_optional(pool)
    .await
    .map_err(db_err)?;
    Ok(v.unwrap_or(0).max(0) as u32)
}

/// Brings `component` in `schema` to version `steps.len()`.
///
/// Creates the schema and its `schema_version(component text primary key,
/// version integer)` table if missing. Step `i` (0-based) takes the
/// component from version `i` to `i + 1`; each step is one transaction
/// holding a per-schema advisory lock, re-reads the version under the lock
/// and is skipped when already applied, so concurrent runners and reruns
/// are harmless. Steps may hold several statements (`;`-separated) and use
/// `{schema}` for the quoted schema name. A component at a version newer
/// than `steps.len()` is [`Error::Config`]. Returns the final version.
pub async fn migrate(pool: &PgPool, schema: &str, component: &str, steps: &[&str]) -> Result<u32> {
    create_schema(pool, schema).await?;
    let target = steps.len() as u32;
    let current = schema_version(pool, schema, component).await?;
    if current > target {
        return Err(Error::Config(format!(
            "schema {schema} has {component} at version {current}, newer than this build's {target}"
        )));
    }
    for (i, step) in steps.iter().enumerate().skip(current as usize) {
        let version = i as u32 + 1;
        let mut tx = pool.begin().await.map_err(db_err)?;
        lock_migrations(&mut tx, schema).await?;
        let now: Option<i32> = sqlx::query_scalar(sql(
            schema,
            "SELECT version FROM {schema}.schema_version WHERE component = $1 FOR UPDATE",
        ))
        .bind(component)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_err)?;
        if now.unwrap_or(0) as u32 >= version {
            tx.commit().await.map_err(db_err)?;
            continue;
        }
        sqlx::raw_sql(sql(schema, step))
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        sqlx::query(sql(
            schema,
            "INSERT INTO {schema}.schema_version (component, version) VALUES ($1, $2)
             ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version",
        ))
        .bind(component)
        .bind(version as i32)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        tracing::debug!(schema, component, version, "applied migration step");
    }
    Ok(target)
}

/// Names of the `gc_*` tables in `schema`, sorted.
pub async fn gc_tables(pool: &PgPool, schema: &str) -> Result<Vec<String>> {
    let mut names: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c
         JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname LIKE 'gc\\_%'",
    )
    .bind(schema)
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    names.sort();
    Ok(names)
}

/// The wall clock in unix milliseconds.
pub fn now_ms() -> i64 {
    Timestamp::now().0
}

/// Decodes a 32-byte `bytea` digest column.
pub fn digest_col(row: &PgRow, idx: usize) -> Result<Digest> {
    let raw: Vec<u8> = row.try_get(idx).map_err(db_err)?;
    let bytes: [u8; 32] = raw.try_into().map_err(|v: Vec<u8>| {
        Error::backend(ErrorKind::InvalidData, "postgres: decode stored digest")
            .with_source(format!("{} bytes, expected 32", v.len()))
    })?;
    Ok(Digest::from_bytes(bytes))
}

/// Decodes a namespace column.
pub fn namespace_col(row: &PgRow, idx: usize) -> Result<Namespace> {
    let raw: String = row.try_get(idx).map_err(db_err)?;
    Namespace::new(raw).map_err(|e| {
        Error::backend(ErrorKind::InvalidData, "postgres: decode stored namespace").with_source(e)
    })
}

/// Decodes a non-negative `bigint` size column.
pub fn size_col(row: &PgRow, idx: usize) -> Result<u64> {
    let raw: i64 = row.try_get(idx).map_err(db_err)?;
    u64::try_from(raw).map_err(|_| {
        Error::backend(ErrorKind::InvalidData, "postgres: decode stored size")
            .with_source(format!("{raw} is negative"))
    })
}

/// Converts a size or offset to `bigint`.
pub fn to_i64(v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| {
        Error::backend(ErrorKind::InvalidData, "postgres: encode size")
            .with_source(format!("{v} does not fit a bigint"))
    })
}

/// Digests as `bytea[]` parameter values.
pub fn digest_params(digests: &[Digest]) -> Vec<&[u8]> {
    digests.iter().map(|d| &d.as_bytes()[..]).collect()
}

/// `SELECT e.digest FROM <schema>.<table> e JOIN unnest($2::bytea[]) …`:
/// which of the digests `$2` are rows of `table` (columns `ns`, `digest`,
/// key `(ns, digest)`) under the namespace `$1`. `{schema}` is left for
/// [`sql`] to fill in.
///
/// Batch lookups join against `unnest` of the array instead of testing
/// `digest = ANY($2)`. sqlx prepares each statement once per connection,
/// and after five executions PostgreSQL may keep a *generic* plan, made
/// without the array's contents. For `= ANY($2)` planned while the table
/// was small, that plan reads the whole namespace and tests each row
/// against the array, one linear search per row (804 ms for 1000 digests
/// in a 50,000-entry namespace, against 6 ms with an index). Every plan of
/// the join keeps the digest a join key: it probes the primary key once
/// per digest (what PostgreSQL picks, generic or custom, for any table of
/// more than a few hundred rows), or at worst hashes one side, which is
/// linear in the namespace and never multiplies by the array's length.
/// The same holds for the `DELETE … USING unnest(…)` of the batch deletes.
pub fn present_sql(table: &str) -> String {
    format!(
        "SELECT e.digest FROM {{schema}}.{table} e \
         JOIN unnest($2::bytea[]) AS q(d) ON e.ns = $1 AND e.digest = q.d"
    )
}

/// Size and creation time of `key`'s row in `<schema>.<table>` (columns
/// `ns`, `digest`, `size`, `created_at`), or `None`. Cancel-safe: it only
/// reads.
pub async fn entry_meta(
    pool: &PgPool,
    schema: &str,
    table: &str,
    key: &store_types::Key,
) -> Result<Option<store_types::EntryMeta>> {
    let query =
        format!("SELECT size, created_at FROM {{schema}}.{table} WHERE ns = $1 AND digest = $2");
    let row = sqlx::query(sql(schema, &query))
        .bind(key.namespace.as_str())
        .bind(&key.digest.as_bytes()[..])
        .fetch_optional(pool)
        .await
        .map_err(db_err)?;
    row.map(|r| {
        Ok(store_types::EntryMeta {
            size: size_col(&r, 0)?,
            created_at: store_types::Timestamp(r.try_get(1).map_err(db_err)?),
        })
    })
    .transpose()
}

/// Presence of each of `digests` under `ns` in `<schema>.<table>`,
/// index-aligned, in one statement ([`present_sql`]).
pub async fn present_many(
    pool: &PgPool,
    schema: &str,
    table: &str,
    ns: &Namespace,
    digests: &[Digest],
) -> Result<Vec<bool>> {
    if digests.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(sql(schema, &present_sql(table)))
        .bind(ns.as_str())
        .bind(digest_params(digests))
        .fetch_all(pool)
        .await
        .map_err(db_err)?;
    let found = rows
        .iter()
        .map(|r| digest_col(r, 0))
        .collect::<Result<std::collections::HashSet<_>>>()?;
    Ok(aligned(digests, &found))
}

/// For each of `digests`, whether `<schema>.<table>` has a row with
/// `namespace = ns` and that digest, index-aligned, in one statement: the
/// array is unnested and probed through the table's `(namespace, digest)`
/// index (see [`present_sql`] on why not `= ANY($2)`). The references'
/// `referenced` and the cache keys' `cached` both ask this.
pub async fn named_in(
    pool: &PgPool,
    schema: &str,
    table: &str,
    ns: &Namespace,
    digests: &[Digest],
) -> Result<Vec<bool>> {
    if digests.is_empty() {
        return Ok(Vec::new());
    }
    let hits: Vec<i64> = sqlx::query_scalar(sql(
        schema,
        &format!(
            "SELECT q.i FROM unnest($2::bytea[]) WITH ORDINALITY AS q(d, i)
             WHERE EXISTS (SELECT 1 FROM {{schema}}.{table} r
                           WHERE r.namespace = $1 AND r.digest = q.d)"
        ),
    ))
    .bind(ns.as_str())
    .bind(digest_params(digests))
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    Ok(ordinal_mask(hits, digests.len()))
}

/// The index of the first occurrence of each digest, for answering
/// index-aligned batch calls from a set of matched digests.
pub fn aligned(digests: &[Digest], matched: &std::collections::HashSet<Digest>) -> Vec<bool> {
    digests.iter().map(|d| matched.contains(d)).collect()
}

/// The namespaces holding rows in `<schema>.<table>` (a table with an
/// `ns` column): a loose index scan, one index probe per namespace.
pub async fn list_namespaces(pool: &PgPool, schema: &str, table: &str) -> Result<Vec<Namespace>> {
    let template = "WITH RECURSIVE n(ns) AS (
             SELECT min(ns) FROM {schema}.{table}
             UNION ALL
             SELECT (SELECT min(e.ns) FROM {schema}.{table} e WHERE e.ns > n.ns)
             FROM n WHERE n.ns IS NOT NULL
         )
         SELECT ns FROM n WHERE ns IS NOT NULL"
        .replace("{table}", table);
    let rows = sqlx::query(sql(schema, &template))
        .fetch_all(pool)
        .await
        .map_err(db_err)?;
    rows.iter().map(|r| namespace_col(r, 0)).collect()
}

/// Keyset pagination over `<schema>.<table>` (columns `ns`, `digest`,
/// `size`): up to `limit` digests of `ns` after `after`, ascending.
pub async fn scan_entries(
    pool: &PgPool,
    schema: &str,
    table: &str,
    ns: &Namespace,
    after: Option<Digest>,
    limit: usize,
) -> Result<Vec<(Digest, u64)>> {
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    // x'' sorts below every digest, so one statement serves the first page.
    let after = after.map(|a| a.as_bytes().to_vec()).unwrap_or_default();
    let template = "SELECT digest, size FROM {schema}.{table} WHERE ns = $1 AND digest > $2
         ORDER BY digest LIMIT $3"
        .replace("{table}", table);
    let rows = sqlx::query(sql(schema, &template))
        .bind(ns.as_str())
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .await
        .map_err(db_err)?;
    rows.iter()
        .map(|r| Ok((digest_col(r, 0)?, size_col(r, 1)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names() {
        for ok in ["a", "_", "blob_pool_1", &"x".repeat(63)] {
            validate_schema(ok).unwrap();
        }
        for bad in ["", "A", "1a", "a-b", "a b", "a\"b", "pg_x", &"x".repeat(64)] {
            assert!(
                matches!(validate_schema(bad), Err(Error::Config(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn stable_keys_are_stable() {
        assert_eq!(stable_key(&["a", "b"]), stable_key(&["a", "b"]));
        assert_ne!(stable_key(&["a", "b"]), stable_key(&["ab"]));
        // Pinned: the key must never change between releases.
        let d = Digest::of(b"blobpool/sweep-lock\0db\0s");
        let mut b = [0u8; 8];
        b.copy_from_slice(&d.as_bytes()[..8]);
        assert_eq!(
            stable_key(&["blobpool/sweep-lock", "db", "s"]),
            i64::from_le_bytes(b)
        );
    }

    #[test]
    fn key_locks_are_per_host_and_key() {
        let k = Key::new(Namespace::new("a").unwrap(), Digest::of(b"x"));
        let hex = k.digest.to_hex();
        assert_eq!(
            key_lock("s", &k),
            stable_key(&["blobpool/key", "s", "a", &hex])
        );
        assert_ne!(key_lock("s", &k), key_lock("t", &k));
        let other = Key::new(Namespace::new("b").unwrap(), k.digest);
        assert_ne!(key_lock("s", &k), key_lock("s", &other));
    }
}
