//! The migration runner: idempotent, and upgrades older schemas in place.

mod common;

use common::{blob, key_of, read_all, OpenEngine, TestSchema};
use store_pg::plumbing::{migrate, schema_version};
use store_postgres::{KV_COMPONENT, KV_STEPS};
use store_types::EngineExt as _;
use store_types::{Engine, Error, KvEngine, PublishOutcome};

async fn content_storage(pool: &sqlx::PgPool, schema: &str) -> String {
    sqlx::query_scalar(
        "SELECT a.attstorage::text FROM pg_attribute a
         JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = 'entries' AND a.attname = 'content'",
    )
    .bind(schema)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn reconnecting_is_idempotent() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(1, 100);
    let k = key_of("a", &data);
    e.put(&k, data.clone()).await.unwrap();
    let pool = s.pool().await;
    assert_eq!(
        schema_version(&pool, &s.name, KV_COMPONENT).await.unwrap(),
        KV_STEPS.len() as u32
    );
    // Reconnect (sequentially and concurrently): nothing is recreated.
    let again = s.engine().await;
    let (a, b) = tokio::join!(s.engine(), s.engine());
    drop((a, b));
    assert_eq!(
        again.put(&k, data).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
    assert_eq!(
        schema_version(&pool, &s.name, KV_COMPONENT).await.unwrap(),
        KV_STEPS.len() as u32
    );
    let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\".schema_version",
        s.name
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows, 3,
        "only the kv, refs and cache components before ensure_gc_schema"
    );
    // Running the steps directly again is a no-op too.
    migrate(&pool, &s.name, KV_COMPONENT, KV_STEPS)
        .await
        .unwrap();
    assert_eq!(content_storage(&pool, &s.name).await, "e");
}

#[tokio::test]
async fn an_older_schema_is_migrated_not_recreated() {
    let s = TestSchema::new();
    let pool = s.pool().await;
    let data = blob(9, 3000);
    let k = key_of("old", &data);
    // A v1 schema as an older release left it: entries, default storage.
    let q = format!("\"{}\"", s.name);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {q};
         CREATE TABLE {q}.schema_version (component text PRIMARY KEY, version integer NOT NULL);
         INSERT INTO {q}.schema_version VALUES ('kv', 1);
         {};",
        KV_STEPS[0].replace("{schema}", &q)
    )))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {q}.entries VALUES ($1, $2, $3, 1234, $4)"
    )))
    .bind("old")
    .bind(&k.digest.as_bytes()[..])
    .bind(data.len() as i64)
    .bind(&data[..])
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(content_storage(&pool, &s.name).await, "x");

    let e = s.engine().await;
    assert_eq!(
        schema_version(&pool, &s.name, KV_COMPONENT).await.unwrap(),
        2
    );
    assert_eq!(content_storage(&pool, &s.name).await, "e");
    let m = e.meta(&k).await.unwrap().unwrap();
    assert_eq!((m.size, m.created_at.0), (3000, 1234));
    assert_eq!(
        read_all(e.read_whole(&k).await.unwrap().unwrap())
            .await
            .unwrap(),
        data
    );
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let s = TestSchema::new();
    let pool = s.pool().await;
    migrate(
        &pool,
        &s.name,
        "demo",
        &["CREATE TABLE {schema}.demo (x int)", "SELECT 1"],
    )
    .await
    .unwrap();
    let err = migrate(
        &pool,
        &s.name,
        "demo",
        &["CREATE TABLE {schema}.demo (x int)"],
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}

#[tokio::test]
async fn a_failing_step_rolls_back_and_keeps_the_old_version() {
    let s = TestSchema::new();
    let pool = s.pool().await;
    let steps = [
        "CREATE TABLE {schema}.a (x int)",
        "CREATE TABLE {schema}.b (x int); SELECT 1/0",
    ];
    assert!(migrate(&pool, &s.name, "demo", &steps).await.is_err());
    assert_eq!(schema_version(&pool, &s.name, "demo").await.unwrap(), 1);
    let b: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT to_regclass('\"{}\".b')::text",
        s.name
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(b.is_none(), "step 2 must have rolled back");
}
