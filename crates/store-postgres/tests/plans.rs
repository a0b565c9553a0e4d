//! Batch lookups keep index plans when the table grows under a cached
//! generic plan (sqlx prepares each statement once per connection, and
//! after five executions PostgreSQL may keep a generic plan made while the
//! table was tiny). Deterministic: plan shapes only, no timing.

mod common;

use common::{blob, key_of, ns, TestSchema};
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, Row};
use store_pg::plumbing::{present_sql, sql};
use store_postgres::PostgresEngine;
use store_types::{Digest, Engine, KvEngine};

/// The `EXPLAIN (FORMAT JSON)` document of `row` (a `json` value, sent as
/// its text).
fn json(row: &sqlx::postgres::PgRow) -> Value {
    let text: String = row.try_get_unchecked(0).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every plan node of an `EXPLAIN (FORMAT JSON)` result.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut out = vec![plan];
    if let Some(children) = plan.get("Plans").and_then(Value::as_array) {
        for c in children {
            out.extend(nodes(c));
        }
    }
    out
}

fn root(explain: &Value) -> &Value {
    &explain[0]["Plan"]
}

fn text<'a>(node: &'a Value, field: &str) -> &'a str {
    node.get(field).and_then(Value::as_str).unwrap_or("")
}

/// No node tests rows against the digest array one by one: digests are
/// matched only as index keys or hash/merge join keys.
fn assert_no_digest_filter(explain: &Value) {
    for n in nodes(root(explain)) {
        for field in ["Filter", "Join Filter"] {
            assert!(
                !text(n, field).contains("digest"),
                "{field} on the digest (a per-row array scan): {explain:#}"
            );
        }
    }
}

/// Some index scan of `entries` looks digests up by key.
fn assert_digest_index_probe(explain: &Value) {
    let probes = nodes(root(explain)).into_iter().any(|n| {
        matches!(
            text(n, "Node Type"),
            "Index Scan" | "Index Only Scan" | "Bitmap Index Scan"
        ) && text(n, "Index Cond").contains("digest")
    });
    assert!(probes, "no index probe by digest: {explain:#}");
    assert_no_digest_filter(explain);
}

/// `EXPLAIN (FORMAT JSON) EXECUTE stmt('g', digests)` on `conn`
/// (utility statements take no bind parameters: the digests are a
/// literal, `\x` hex in an array literal).
async fn explain_execute(conn: &mut sqlx::PgConnection, stmt: &str, digests: &[Digest]) -> Value {
    let array: Vec<String> = digests
        .iter()
        .map(|d| format!("\"\\\\x{}\"", d.to_hex()))
        .collect();
    let q = format!(
        "EXPLAIN (FORMAT JSON) EXECUTE {stmt}('g', '{{{}}}'::bytea[])",
        array.join(",")
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(q))
        .fetch_one(conn)
        .await
        .unwrap();
    json(&row)
}

fn probe_set(present: &[Digest], absent: usize) -> Vec<Digest> {
    let mut all = present.to_vec();
    all.extend((0..absent as u64).map(|i| Digest::of(format!("absent {i}").as_bytes())));
    all
}

#[tokio::test]
async fn has_many_keeps_an_index_plan_as_the_table_grows() {
    let s = TestSchema::new();
    // One connection: every has_many runs the same prepared statement.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&s.url)
        .await
        .expect("PostgreSQL at DATABASE_URL");
    let e = PostgresEngine::from_pool(pool.clone(), &s.name)
        .await
        .unwrap();

    // A tiny table: three entries.
    let mut present = Vec::new();
    for i in 0..3 {
        let data = blob(i, 100);
        let k = key_of("g", &data);
        e.put(&k, data).await.unwrap();
        present.push(k.digest);
    }
    let probe = probe_set(&present, 997);
    let mut expect = vec![false; probe.len()];
    expect[..3].fill(true);
    for _ in 0..8 {
        assert_eq!(e.has_many(&ns("g"), &probe).await.unwrap(), expect);
    }

    // Pin the engine's own statement to its generic plan, made now while
    // the table is tiny, as PostgreSQL may have done by itself.
    let has_many_sql = sql(&s.name, &present_sql("entries"));
    let mut conn = pool.acquire().await.unwrap();
    let name: String = sqlx::query_scalar(
        "SELECT name FROM pg_prepared_statements WHERE statement = $1 AND NOT from_sql",
    )
    .bind(has_many_sql.as_str())
    .fetch_one(&mut *conn)
    .await
    .expect("the engine's has_many statement is prepared on its connection");
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *conn)
        .await
        .unwrap();
    let tiny = explain_execute(&mut conn, &name, &probe).await;
    assert_no_digest_filter(&tiny);
    drop(conn);

    // The table grows to ~20k rows behind the cached plan's back.
    let mut other = sqlx::PgConnection::connect(&s.url).await.unwrap();
    let grown: Vec<Digest> = (0..20_000u64)
        .map(|i| Digest::of(format!("grown {i}").as_bytes()))
        .collect();
    sqlx::query(sql(
        &s.name,
        "INSERT INTO {schema}.entries (ns, digest, size, created_at, content)
         SELECT 'g', d, 1, 0, '\\x00'::bytea FROM unnest($1::bytea[]) AS t(d)",
    ))
    .bind(
        grown
            .iter()
            .map(|d| d.as_bytes().to_vec())
            .collect::<Vec<_>>(),
    )
    .execute(&mut other)
    .await
    .unwrap();
    let mut probe2 = present.clone();
    probe2.extend(grown.iter().step_by(40));
    probe2.extend(probe_set(&[], 497));
    let mut expect2 = vec![false; probe2.len()];
    expect2[..503].fill(true);
    for _ in 0..3 {
        assert_eq!(e.has_many(&ns("g"), &probe2).await.unwrap(), expect2);
    }

    // Whatever plan the engine's statement holds now (the one made while
    // tiny, or a re-plan after an autovacuum ANALYZE), digests are keys.
    let mut conn = pool.acquire().await.unwrap();
    assert_no_digest_filter(&explain_execute(&mut conn, &name, &probe2).await);
    sqlx::raw_sql("RESET plan_cache_mode")
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);

    // A generic plan made at the grown size probes the index once per
    // digest; so does the one of the window's `staged_many`, which shares
    // the statement shape.
    sqlx::raw_sql("ANALYZE").execute(&mut other).await.unwrap();
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut other)
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "PREPARE grown_has_many(text, bytea[]) AS {}",
        has_many_sql.as_str()
    )))
    .execute(&mut other)
    .await
    .unwrap();
    let grown_plan = explain_execute(&mut other, "grown_has_many", &probe2).await;
    assert_digest_index_probe(&grown_plan);
    other.close().await.unwrap();
}
