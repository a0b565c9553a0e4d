//! Fleet mode: the joint publish of large object + companion row + pin row
//! (ADR-012 §4), on a GC host (`postgres` engine) in the same database.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{blob, key_of, put, read_all, OpenEngine, TestSchema};
use sqlx::AssertSqlSafe;
use store_pglo::PgLoEngine;
use store_postgres::PostgresEngine;
use store_types::{
    Engine, EngineExt, Error, Instance, JointStagedWrite, Key, LargeEngine, Namespace, PinClauses,
    PinIntent, PublishOutcome, Stage, StagedWrite, Timestamp,
};

/// The GC host's clock in these tests (pin rows are written and judged by
/// the database's clock).
const NOW: Timestamp = Timestamp(1_000_000);

/// A GC host (`postgres` engine with its gc tables) on `s`, its GC clock
/// stopped at [`NOW`].
async fn host(s: &TestSchema) -> (PostgresEngine, Arc<dyn PinClauses>) {
    let h = PostgresEngine::connect(&s.url, &s.name).await.unwrap();
    let seam = h.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    store_pg::testing::set_db_clock(h.pool(), &s.name, NOW)
        .await
        .unwrap();
    (h, seam.pins.unwrap())
}

fn intent(host: Instance, owner: &str) -> PinIntent {
    PinIntent {
        owner: owner.to_string(),
        now: NOW,
        ttl: Duration::from_millis(1000),
        host,
    }
}

async fn pin_owners(h: &PostgresEngine, key: &Key) -> Vec<String> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT owner FROM \"{}\".gc_pins WHERE ns = $1 AND digest = $2 ORDER BY owner",
        h.schema()
    )))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .fetch_all(h.pool())
    .await
    .unwrap()
}

/// A stage holding `data`, with its OID.
async fn staged(
    e: &PgLoEngine,
    key: &Key,
    data: &bytes::Bytes,
) -> (Box<dyn JointStagedWrite>, u32) {
    let mut st = e.open_stage(&key.namespace).await.unwrap();
    let oid = st.oid();
    st.write(data.clone()).await.unwrap();
    (Box::new(st), oid)
}

#[tokio::test]
async fn pglo_publishes_jointly() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let stage = e.stage(&Namespace::new("a").unwrap()).await.unwrap();
    assert!(matches!(stage, Stage::Joint(_)), "{stage:?}");
    stage.abort().await.unwrap();
}

#[tokio::test]
async fn publish_pinned_commits_object_row_and_pin_together() {
    let (s, hs) = (TestSchema::new(), TestSchema::new());
    let e = s.engine().await;
    let (h, pins) = host(&hs).await;
    let data = blob(1, 300_000);
    let k = key_of("a", &data);

    let (st, oid) = staged(&e, &k, &data).await;
    let out = st
        .publish_pinned(&k, &intent(pins.pin_host(), "n1"))
        .await
        .unwrap();
    assert_eq!(out, PublishOutcome::Inserted);
    assert_eq!(e.referenced_oids().await.unwrap(), [oid]);
    assert_eq!(e.large_objects_exist(&[oid]).await.unwrap(), [true]);
    assert_eq!(
        read_all(e.read_whole(&k).await.unwrap().unwrap())
            .await
            .unwrap(),
        data
    );
    assert_eq!(pin_owners(&h, &k).await, ["n1"]);
    assert_eq!(
        pins.pin_check(std::slice::from_ref(&k), NOW).await.unwrap(),
        [true]
    );

    // Dedup hit: AlreadyPresent, the pin still commits, no orphan LO.
    let (st, oid2) = staged(&e, &k, &data).await;
    let out = st
        .publish_pinned(&k, &intent(pins.pin_host(), "n2"))
        .await
        .unwrap();
    assert_eq!(out, PublishOutcome::AlreadyPresent);
    assert_eq!(pin_owners(&h, &k).await, ["n1", "n2"]);
    assert_eq!(e.large_objects_exist(&[oid2]).await.unwrap(), [false]);
    assert!(e
        .orphan_large_objects(&[oid, oid2])
        .await
        .unwrap()
        .is_empty());
    assert_eq!(e.referenced_oids().await.unwrap(), [oid]);

    // Also against an entry published without a pin.
    let other = blob(2, 10_000);
    let k2 = key_of("a", &other);
    assert_eq!(put(&e, "a", &other, 4096).await, PublishOutcome::Inserted);
    let (st, oid3) = staged(&e, &k2, &other).await;
    let out = st
        .publish_pinned(&k2, &intent(pins.pin_host(), "n3"))
        .await
        .unwrap();
    assert_eq!(out, PublishOutcome::AlreadyPresent);
    assert_eq!(pin_owners(&h, &k2).await, ["n3"]);
    assert_eq!(e.large_objects_exist(&[oid3]).await.unwrap(), [false]);
}

#[tokio::test]
async fn publish_pinned_in_the_engines_own_schema() {
    // The GC host may share the pg-lo schema (one gc_window, one gc_pins).
    let s = TestSchema::new();
    let e = s.engine().await;
    let (h, pins) = host(&s).await;
    let data = blob(3, 5000);
    let k = key_of("a", &data);
    let (st, oid) = staged(&e, &k, &data).await;
    let out = st
        .publish_pinned(&k, &intent(pins.pin_host(), "n1"))
        .await
        .unwrap();
    assert_eq!(out, PublishOutcome::Inserted);
    assert_eq!(e.large_objects_exist(&[oid]).await.unwrap(), [true]);
    assert_eq!(pin_owners(&h, &k).await, ["n1"]);
}

#[tokio::test]
async fn publish_pinned_to_a_host_on_another_database_is_config() {
    let (s, hs) = (TestSchema::new(), TestSchema::new());
    let e = s.engine().await;
    let (h, pins) = host(&hs).await;
    let Instance::Postgres {
        system_identifier,
        database,
        schema,
    } = pins.pin_host()
    else {
        panic!("postgres host");
    };
    let data = blob(4, 5000);
    let k = key_of("a", &data);
    let elsewhere = [
        Instance::Postgres {
            system_identifier: system_identifier.clone(),
            database: format!("{database}_other"),
            schema: schema.clone(),
        },
        Instance::Postgres {
            system_identifier: format!("{system_identifier}0"),
            database,
            schema,
        },
        Instance::Process,
    ];
    for other in elsewhere {
        let (st, oid) = staged(&e, &k, &data).await;
        let err = st
            .publish_pinned(&k, &intent(other.clone(), "n1"))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{other:?}: {err:?}");
        assert_eq!(e.large_objects_exist(&[oid]).await.unwrap(), [false]);
    }
    assert!(e.meta(&k).await.unwrap().is_none());
    assert!(pin_owners(&h, &k).await.is_empty());
}

#[tokio::test]
async fn a_failed_pin_rolls_the_whole_publish_back() {
    // The host schema exists but has no gc_pins: the pin upsert fails.
    let (s, hs) = (TestSchema::new(), TestSchema::new());
    let e = s.engine().await;
    let h = PostgresEngine::connect(&hs.url, &hs.name).await.unwrap();
    let data = blob(5, 5000);
    let k = key_of("a", &data);
    let (st, oid) = staged(&e, &k, &data).await;
    let err = st
        .publish_pinned(&k, &intent(h.capabilities().instance, "n1"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err:?}");
    assert!(e.meta(&k).await.unwrap().is_none());
    assert_eq!(e.large_objects_exist(&[oid]).await.unwrap(), [false]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_pinned_waits_for_a_sweep_batch_on_its_key() {
    let (s, hs) = (TestSchema::new(), TestSchema::new());
    let e = s.engine().await;
    let (h, pins) = host(&hs).await;
    let data = blob(6, 5000);
    let k = key_of("a", &data);

    let batch = pins.begin_batch(std::slice::from_ref(&k)).await.unwrap();
    let (st, oid) = staged(&e, &k, &data).await;
    let publish = {
        let (k, pin) = (k.clone(), intent(pins.pin_host(), "n1"));
        tokio::spawn(async move { st.publish_pinned(&k, &pin).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!publish.is_finished(), "must wait for the batch's lock");
    assert!(e.meta(&k).await.unwrap().is_none());
    assert!(pin_owners(&h, &k).await.is_empty());

    batch.commit().await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), publish)
        .await
        .expect("publish proceeds after the batch commits")
        .unwrap()
        .unwrap();
    assert_eq!(out, PublishOutcome::Inserted);
    assert_eq!(e.large_objects_exist(&[oid]).await.unwrap(), [true]);
    assert_eq!(pin_owners(&h, &k).await, ["n1"]);
}
