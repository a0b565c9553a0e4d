//! Migrations and the GC seam row of pg-lo.

mod common;

use common::{blob, key_of, put, read_all, OpenEngine, TestSchema};
use store_pg::plumbing::schema_version;
use store_pglo::{PGLO_COMPONENT, PGLO_STEPS};
use store_types::EngineExt as _;
use store_types::{Engine, PublishOutcome, StagedCandidate, Timestamp};

#[tokio::test]
async fn gc_seam_is_window_only() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let seam = e.capabilities().seam.expect("pg-lo is a seam member");
    assert!(seam.pins.is_none() && seam.sweep_lock.is_none());
    assert!(seam.schema.gc_tables().await.unwrap().is_empty());
    seam.schema.ensure_gc_schema().await.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    assert_eq!(
        seam.schema.gc_tables().await.unwrap(),
        ["gc_clock", "gc_window"]
    );
    let w = seam.window.unwrap();
    let k = key_of("n", b"x");
    let c = StagedCandidate {
        key: k.clone(),
        size: 1,
        visible_after: Timestamp(5),
    };
    w.stage(std::slice::from_ref(&c)).await.unwrap();
    // Due by the database's clock (the `now` argument is not used).
    let pool = e.pool();
    store_pg::testing::set_db_clock(pool, &s.name, Timestamp(4))
        .await
        .unwrap();
    assert!(w.take_due(Timestamp(5), None, 10).await.unwrap().is_empty());
    assert_eq!(w.now().await.unwrap(), Some(Timestamp(4)));
    store_pg::testing::set_db_clock(pool, &s.name, Timestamp(5))
        .await
        .unwrap();
    assert_eq!(w.take_due(Timestamp(0), None, 10).await.unwrap(), [c]);
    w.unstage(&[k]).await.unwrap();
    assert_eq!(w.staged_count().await.unwrap(), 0);
}

#[tokio::test]
async fn sharing_a_schema_with_the_kv_engine() {
    let s = TestSchema::new();
    let lo = s.engine().await;
    let kv = store_postgres::PostgresEngine::connect(&s.url, &s.name)
        .await
        .unwrap();
    lo.capabilities()
        .seam
        .unwrap()
        .schema
        .ensure_gc_schema()
        .await
        .unwrap();
    kv.capabilities()
        .seam
        .unwrap()
        .schema
        .ensure_gc_schema()
        .await
        .unwrap();
    assert_eq!(
        lo.capabilities()
            .seam
            .unwrap()
            .schema
            .gc_tables()
            .await
            .unwrap(),
        [
            "gc_clock",
            "gc_deleting",
            "gc_liveness",
            "gc_pins",
            "gc_policies",
            "gc_window"
        ]
    );
    assert!(lo
        .capabilities()
        .instance
        .same_database(&kv.capabilities().instance));
    assert_eq!(lo.capabilities().instance, kv.capabilities().instance);
}

#[tokio::test]
async fn reconnecting_is_idempotent() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(1, 5000);
    put(&e, "a", &data, 1000).await;
    let (a, b) = tokio::join!(s.engine(), s.engine());
    drop((a, b));
    let again = s.engine().await;
    assert_eq!(
        put(&again, "a", &data, 1000).await,
        PublishOutcome::AlreadyPresent
    );
    let pool = s.pool().await;
    let v = schema_version(&pool, &s.name, PGLO_COMPONENT)
        .await
        .unwrap();
    assert_eq!(v, PGLO_STEPS.len() as u32);
}

#[tokio::test]
async fn an_older_schema_is_migrated_not_recreated() {
    let s = TestSchema::new();
    let pool = s.pool().await;
    let q = format!("\"{}\"", s.name);
    let data = blob(2, 40_000);
    let k = key_of("old", &data);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {q};
         CREATE TABLE {q}.schema_version (component text PRIMARY KEY, version integer NOT NULL);
         INSERT INTO {q}.schema_version VALUES ('pglo', 1);
         {};",
        PGLO_STEPS[0].replace("{schema}", &q)
    )))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {q}.lo_entries VALUES ($1, $2, lo_from_bytea(0, $3), $4, 77)"
    )))
    .bind("old")
    .bind(&k.digest.as_bytes()[..])
    .bind(&data[..])
    .bind(data.len() as i64)
    .execute(&pool)
    .await
    .unwrap();

    let e = s.engine().await;
    assert_eq!(
        schema_version(&pool, &s.name, PGLO_COMPONENT)
            .await
            .unwrap(),
        PGLO_STEPS.len() as u32
    );
    let idx: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT to_regclass('{q}.lo_entries_oid')::text"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(idx.is_some(), "v2 index created");
    let m = e.meta(&k).await.unwrap().unwrap();
    assert_eq!((m.size, m.created_at.0), (40_000, 77));
    assert_eq!(
        read_all(e.read_whole(&k).await.unwrap().unwrap())
            .await
            .unwrap(),
        data
    );
    // v3: the old entry has no outboard until one is stored (the lazy path).
    assert_eq!(e.read_outboard(&k).await.unwrap(), None);
    let ob = store_types::outboard::compute(&data).1;
    e.store_outboard(&k, ob.clone()).await.unwrap();
    assert_eq!(e.read_outboard(&k).await.unwrap(), Some(ob));
}
