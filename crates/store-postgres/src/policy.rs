//! GC policies as fleet state (ADR-045): one row per (namespace, node) in
//! the GC host's `gc_policies`, read by every node's sweep.
//!
//! | table | columns | key |
//! |---|---|---|
//! | `gc_policies` | `ns text, owner text, policy text, set_at bigint` | `(ns, owner)` |
//!
//! A node writes and removes only rows of its own owner name; `keep` on any
//! row of a namespace wins for the whole fleet
//! ([`store_types::fleet_swept_namespaces`]). `set_at` is the database's
//! clock (`gc_now()`), for operators.
//!
//! Before this table, a policy was a registration of the engine's
//! references table in `gc_liveness` under the node's (random) owner name.
//! The migration removes those registrations: references now protect in
//! every swept namespace without one, and a registration left by a node
//! that no longer exists would otherwise keep sweeping its namespace. A
//! node re-records its configured policies when it starts.

use sqlx::postgres::PgPool;
use sqlx::Row;
use store_pg::plumbing::{db_err, namespace_col, sql};
use store_types::{Error, ErrorKind, FleetPolicy, Namespace, PolicyRow, Result};

/// Migration component of `gc_policies` (on the pin host).
pub const GC_POLICY_COMPONENT: &str = "gc_policy";

/// Migration steps of [`GC_POLICY_COMPONENT`].
///
/// - v1: `gc_policies`; the references-table registrations of the old
///   policy layer (`ref_names`, see [`crate::refs::REFS_TABLE`]) are
///   removed from `gc_liveness`.
/// - v2: the `cache` policy's spellings are allowed (ADR-048).
pub const GC_POLICY_STEPS: &[&str] = &["CREATE TABLE IF NOT EXISTS {schema}.gc_policies (
        ns text COLLATE \"C\" NOT NULL,
        owner text NOT NULL,
        policy text NOT NULL CHECK (policy IN ('refs', 'unreferenced', 'keep')),
        set_at bigint NOT NULL,
        PRIMARY KEY (ns, owner)
    );
    DELETE FROM {schema}.gc_liveness
     WHERE table_schema = (SELECT nspname FROM pg_namespace WHERE oid = '{schema}'::regnamespace)
       AND table_name = 'ref_names' AND digest_column = 'digest'
       AND namespace_column = 'namespace'",
    // v2: cache policies (ADR-048), spelled `cache[ max_bytes=N][ max_age_ms=N]`.
    "ALTER TABLE {schema}.gc_policies DROP CONSTRAINT IF EXISTS gc_policies_policy_check;
    ALTER TABLE {schema}.gc_policies ADD CONSTRAINT gc_policies_policy_check
        CHECK (policy IN ('refs', 'unreferenced', 'keep') OR policy ~ '^cache( max_bytes=[0-9]+)?( max_age_ms=[0-9]+)?$')"];

/// Upserts (`Some`) or removes (`None`) `owner`'s row for `ns`.
pub(crate) async fn set(
    pool: &PgPool,
    host_schema: &str,
    ns: &Namespace,
    owner: &str,
    policy: Option<FleetPolicy>,
) -> Result<()> {
    match policy {
        Some(p) => sqlx::query(sql(
            host_schema,
            "INSERT INTO {schema}.gc_policies (ns, owner, policy, set_at)
             VALUES ($1, $2, $3, {schema}.gc_now())
             ON CONFLICT (ns, owner)
             DO UPDATE SET policy = EXCLUDED.policy, set_at = EXCLUDED.set_at",
        ))
        .bind(ns.as_str())
        .bind(owner)
        .bind(p.spelling()),
        None => sqlx::query(sql(
            host_schema,
            "DELETE FROM {schema}.gc_policies WHERE ns = $1 AND owner = $2",
        ))
        .bind(ns.as_str())
        .bind(owner),
    }
    .execute(pool)
    .await
    .map_err(db_err)?;
    Ok(())
}

/// Every row, in namespace then owner order.
pub(crate) async fn all(pool: &PgPool, host_schema: &str) -> Result<Vec<PolicyRow>> {
    let rows = sqlx::query(sql(
        host_schema,
        "SELECT ns, owner, policy FROM {schema}.gc_policies ORDER BY ns, owner",
    ))
    .fetch_all(pool)
    .await
    .map_err(db_err)?;
    rows.iter()
        .map(|r| {
            let text: String = r.try_get(2).map_err(db_err)?;
            let policy = FleetPolicy::parse(&text).ok_or_else(|| {
                Error::backend(ErrorKind::InvalidData, "postgres: read gc_policies")
                    .with_source(format!("unknown policy {text:?}"))
            })?;
            Ok(PolicyRow {
                namespace: namespace_col(r, 0)?,
                owner: r.try_get(1).map_err(db_err)?,
                policy,
            })
        })
        .collect()
}
