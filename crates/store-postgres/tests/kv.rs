//! The kv engine against a real PostgreSQL.

mod common;

use common::{blob, key_of, ns, read_all, OpenEngine, TestSchema};
use store_postgres::PostgresEngine;
use store_types::EngineExt as _;
use store_types::{Digest, Engine, Error, Instance, Key, KvEngine, PublishOutcome, Sharing};

#[tokio::test]
async fn put_read_meta_and_range() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(1, 10_000);
    let k = key_of("a", &data);
    assert_eq!(
        e.put(&k, data.clone()).await.unwrap(),
        PublishOutcome::Inserted
    );
    assert_eq!(
        e.put(&k, data.clone()).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
    let m = e.meta(&k).await.unwrap().unwrap();
    assert_eq!(m.size, 10_000);
    assert!(m.created_at.0 > 0);
    let r = e.read_whole(&k).await.unwrap().unwrap();
    assert_eq!(r.len(), 10_000);
    assert_eq!(read_all(r).await.unwrap(), data);
    for (a, b) in [
        (0u64, 0u64),
        (0, 1),
        (3, 9_999),
        (9_999, 10_000),
        (10_000, 10_000),
        (0, 10_000),
    ] {
        let r = e.read_exact(&k, a..b).await.unwrap().unwrap();
        assert_eq!(r.len(), b - a);
        assert_eq!(
            read_all(r).await.unwrap(),
            &data[a as usize..b as usize],
            "{a}..{b}"
        );
    }
    let absent = key_of("a", b"absent");
    assert!(e.meta(&absent).await.unwrap().is_none());
    assert!(e.read_whole(&absent).await.unwrap().is_none());
    assert!(e.read_exact(&absent, 0..0).await.unwrap().is_none());
    // Same digest, other namespace: independent.
    assert!(e
        .meta(&Key::new(ns("b"), k.digest))
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn empty_content() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let k = key_of("a", b"");
    assert_eq!(
        e.put(&k, bytes::Bytes::new()).await.unwrap(),
        PublishOutcome::Inserted
    );
    assert_eq!(e.meta(&k).await.unwrap().unwrap().size, 0);
    assert!(read_all(e.read_whole(&k).await.unwrap().unwrap())
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn has_many_delete_many_scan_namespaces() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let mut digests = Vec::new();
    for i in 0..30u64 {
        let data = blob(i, 100 + i as usize);
        let k = key_of("n1", &data);
        e.put(&k, data).await.unwrap();
        digests.push(k.digest);
    }
    e.put(&key_of("n2", b"x"), "x".into()).await.unwrap();
    e.put(&key_of("n0.z-y_x", b"y"), "y".into()).await.unwrap();

    let absent = Digest::of(b"nope");
    let probe = vec![digests[3], absent, digests[3], digests[29]];
    assert_eq!(
        e.has_many(&ns("n1"), &probe).await.unwrap(),
        [true, false, true, true]
    );
    assert_eq!(e.has_many(&ns("n2"), &probe).await.unwrap(), [false; 4]);
    assert!(e.has_many(&ns("n1"), &[]).await.unwrap().is_empty());

    let names: Vec<String> = e
        .namespaces()
        .await
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(names, ["n0.z-y_x", "n1", "n2"]);

    // Keyset scan in pages of 7 sees every digest once, ascending.
    let mut sorted = digests.clone();
    sorted.sort();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = e.scan(&ns("n1"), after, 7).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 7);
        after = Some(page.last().unwrap().0);
        seen.extend(page);
    }
    assert_eq!(seen.iter().map(|p| p.0).collect::<Vec<_>>(), sorted);
    let d0 = digests[0];
    let size0 = seen.iter().find(|p| p.0 == d0).unwrap().1;
    assert_eq!(size0, 100);

    let freed = e.delete_many(&ns("n1"), &[d0, absent, d0]).await.unwrap();
    assert_eq!(freed, [Some(100), None, None]);
    assert_eq!(e.delete_many(&ns("n1"), &[d0]).await.unwrap(), [None]);
    assert_eq!(e.has_many(&ns("n1"), &[d0]).await.unwrap(), [false]);
    e.delete_many(&ns("n2"), &[Digest::of(b"x")]).await.unwrap();
    let names: Vec<String> = e
        .namespaces()
        .await
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(names, ["n0.z-y_x", "n1"]);
}

#[tokio::test]
async fn concurrent_identical_puts_yield_one_insert() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(7, 4096);
    let k = key_of("a", &data);
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (e, k, d) = (e.clone(), k.clone(), data.clone());
            tokio::spawn(async move { e.put(&k, d).await.unwrap() })
        })
        .collect();
    let mut inserted = 0;
    for t in tasks {
        if t.await.unwrap() == PublishOutcome::Inserted {
            inserted += 1;
        }
    }
    assert_eq!(inserted, 1);
    // A second engine on the same schema sees it too.
    let other = s.engine().await;
    assert_eq!(
        other.put(&k, data).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
}

#[tokio::test]
async fn descriptor_names_the_cluster_database_and_schema() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let d = e.capabilities();
    assert_eq!(d.kind, "postgres");
    assert_eq!(d.sharing, Sharing::DatabaseServer);
    assert!(d.durable);
    let Instance::Postgres {
        system_identifier,
        database,
        schema,
    } = &d.instance
    else {
        panic!("unexpected instance {:?}", d.instance);
    };
    assert!(!system_identifier.is_empty());
    assert_eq!(schema, &s.name);
    let pool = s.pool().await;
    let db: String = sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(database, &db);
    let other = TestSchema::new();
    let e2 = other.engine().await;
    assert!(d.instance.same_database(&e2.capabilities().instance));
    assert_ne!(d.instance, e2.capabilities().instance);
}

#[tokio::test]
async fn invalid_schema_names_are_config_errors() {
    let url = store_pg::testing::database_url();
    for bad in [
        "",
        "Bad",
        "1x",
        "a-b",
        "x\"; drop table y; --",
        "pg_catalog",
    ] {
        let err = PostgresEngine::connect(&url, bad).await.unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{bad:?}: {err:?}");
    }
}

#[tokio::test]
async fn gc_seam_has_every_family() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let seam = e.capabilities().seam.expect("postgres is a seam member");
    assert!(seam.window.is_some() && seam.pins.is_some() && seam.sweep_lock.is_some());
}

#[tokio::test]
async fn corrupt_one_byte_changes_the_content() {
    let s = TestSchema::new();
    let e = s.engine().await;
    for data in [blob(3, 5000), bytes::Bytes::new()] {
        let k = key_of("a", &data);
        e.put(&k, data.clone()).await.unwrap();
        e.corrupt_one_byte(&k).await.unwrap();
        let got = read_all(e.read_whole(&k).await.unwrap().unwrap())
            .await
            .unwrap();
        assert_ne!(got, data);
        assert_ne!(Digest::of(&got), k.digest);
    }
    assert_eq!(
        e.corrupt_one_byte(&key_of("a", b"absent")).await,
        Err(Error::Missing)
    );
}
