//! The batch queries both engines' entry tables share: presence,
//! metadata, namespaces and keyset scans.

use sqlx::postgres::PgPool;
use sqlx::Row;
use store_types::{Digest, Namespace, Result};

use super::{aligned, digest_col, digest_params, namespace_col, ordinal_mask, size_col, sql};
use crate::error::db_err;

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
