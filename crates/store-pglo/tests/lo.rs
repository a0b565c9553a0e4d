//! The large-object engine against a real PostgreSQL.

mod common;

use common::{blob, key_of, ns, put, read_all, OpenEngine, TestSchema};
use store_pglo::PgLoEngine;
use store_types::EngineExt as _;
use store_types::{
    Digest, Engine, Error, Instance, Key, LargeEngine, PublishOutcome, Sharing, StagedWrite,
    CHUNK_SIZE,
};

#[tokio::test]
async fn put_read_and_ranges_across_chunks() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(1, 3 * CHUNK_SIZE + 12_345);
    let k = key_of("big", &data);
    assert_eq!(
        put(&e, "big", &data, 100_000).await,
        PublishOutcome::Inserted
    );
    let m = e.meta(&k).await.unwrap().unwrap();
    assert_eq!(m.size, data.len() as u64);
    let r = e.read_whole(&k).await.unwrap().unwrap();
    assert_eq!(r.len(), data.len() as u64);
    assert_eq!(read_all(r).await.unwrap(), data);
    let n = data.len() as u64;
    let c = CHUNK_SIZE as u64;
    for (a, b) in [
        (0, 0),
        (0, 1),
        (c - 1, 2 * c + 1),
        (n - 1, n),
        (n, n),
        (5, n),
        (c, 2 * c),
    ] {
        let r = e.read_exact(&k, a..b).await.unwrap().unwrap();
        assert_eq!(r.len(), b - a);
        assert_eq!(
            read_all(r).await.unwrap(),
            &data[a as usize..b as usize],
            "{a}..{b}"
        );
    }
    let absent = key_of("big", b"absent");
    assert!(e.read_whole(&absent).await.unwrap().is_none());
    assert!(e.read_exact(&absent, 0..0).await.unwrap().is_none());
    assert!(e.meta(&absent).await.unwrap().is_none());
}

#[tokio::test]
async fn empty_and_single_chunk_entries() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let empty = bytes::Bytes::new();
    assert_eq!(put(&e, "a", &empty, 1).await, PublishOutcome::Inserted);
    let k = key_of("a", b"");
    assert_eq!(e.meta(&k).await.unwrap().unwrap().size, 0);
    assert!(read_all(e.read_whole(&k).await.unwrap().unwrap())
        .await
        .unwrap()
        .is_empty());
    // One chunk larger than the lowrite piece size is split.
    let data = blob(2, 2_500_000);
    assert_eq!(
        put(&e, "a", &data, data.len()).await,
        PublishOutcome::Inserted
    );
    let got = read_all(e.read_whole(&key_of("a", &data)).await.unwrap().unwrap())
        .await
        .unwrap();
    assert_eq!(got, data);
}

#[tokio::test]
async fn duplicate_publish_discards_the_new_large_object() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(3, 50_000);
    let k = key_of("a", &data);
    assert_eq!(put(&e, "a", &data, 8192).await, PublishOutcome::Inserted);
    let mut stage = e.open_stage(&k.namespace).await.unwrap();
    let oid = stage.oid();
    stage.write(data.clone()).await.unwrap();
    assert_eq!(
        Box::new(stage).publish(&k).await.unwrap(),
        PublishOutcome::AlreadyPresent
    );
    assert_eq!(e.referenced_oids().await.unwrap().len(), 1);
    assert_eq!(e.large_objects_exist(&[oid]).await.unwrap(), [false]);
}

#[tokio::test]
async fn abort_drop_and_unpublished_stages_leave_nothing() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(4, 10_000);
    let k = key_of("a", &data);

    let mut s1 = e.open_stage(&k.namespace).await.unwrap();
    s1.write(data.clone()).await.unwrap();
    let oid1 = s1.oid();
    // Invisible before publish, even to other sessions.
    assert_eq!(e.large_objects_exist(&[oid1]).await.unwrap(), [false]);
    assert!(e.meta(&k).await.unwrap().is_none());
    Box::new(s1).abort().await.unwrap();

    let mut s2 = e.open_stage(&k.namespace).await.unwrap();
    s2.write(data.clone()).await.unwrap();
    let oid2 = s2.oid();
    drop(s2);

    let mut s3 = e.stage(&k.namespace).await.unwrap();
    s3.write(data.clone()).await.unwrap();
    let err = s3
        .publish(&Key::new(ns("other"), k.digest))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::KeyInvalid(_)), "{err:?}");

    assert!(e.meta(&k).await.unwrap().is_none());
    // The dropped stage's rollback is sent when its connection is reused;
    // either way the object never committed.
    assert_eq!(
        e.large_objects_exist(&[oid1, oid2]).await.unwrap(),
        [false, false]
    );
    assert!(e
        .orphan_large_objects(&[oid1, oid2])
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_puts_make_one_entry() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(5, 300_000);
    let k = key_of("a", &data);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (e, data, k) = (e.clone(), data.clone(), k.clone());
            tokio::spawn(async move {
                let mut st = e.open_stage(&k.namespace).await.unwrap();
                let oid = st.oid();
                for piece in data.chunks(65_536) {
                    st.write(data.slice_ref(piece)).await.unwrap();
                }
                (Box::new(st).publish(&k).await.unwrap(), oid)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    let inserted = outcomes
        .iter()
        .filter(|o| o.0 == PublishOutcome::Inserted)
        .count();
    assert_eq!(inserted, 1);
    let oids: Vec<u32> = outcomes.iter().map(|o| o.1).collect();
    let live = e.large_objects_exist(&oids).await.unwrap();
    assert_eq!(
        live.iter().filter(|b| **b).count(),
        1,
        "only the winner's LO survives"
    );
    assert!(e.orphan_large_objects(&oids).await.unwrap().is_empty());
    assert_eq!(e.scan(&k.namespace, None, 10).await.unwrap().len(), 1);
    assert_eq!(
        read_all(e.read_whole(&k).await.unwrap().unwrap())
            .await
            .unwrap(),
        data
    );
}

#[tokio::test]
async fn a_connection_killed_mid_put_leaves_nothing() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let data = blob(6, 600_000);
    let k = key_of("a", &data);
    let mut st = e.open_stage(&k.namespace).await.unwrap();
    st.write(data.slice(..200_000)).await.unwrap();
    let (pid, oid) = (st.backend_pid(), st.oid());

    let admin = s.pool().await;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(killed);

    let result = async {
        st.write(data.slice(200_000..)).await?;
        Box::new(st).publish(&k).await
    }
    .await;
    assert!(matches!(result, Err(Error::Backend(_))), "{result:?}");
    let err = result.unwrap_err();
    assert_eq!(
        err.kind(),
        store_types::ErrorKind::ConnectionLost,
        "{err:?}"
    );
    assert!(err.is_transient());
    assert!(
        std::error::Error::source(&err).is_some(),
        "the sqlx error is kept"
    );
    assert!(e.meta(&k).await.unwrap().is_none(), "no companion row");
    assert_eq!(
        e.large_objects_exist(&[oid]).await.unwrap(),
        [false],
        "no orphan LO"
    );
    // The engine recovers: the pool replaces the dead connection.
    assert_eq!(put(&e, "a", &data, 65_536).await, PublishOutcome::Inserted);
}

#[tokio::test]
async fn delete_many_unlinks_and_is_idempotent() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let (d1, d2) = (blob(7, 1000), blob(8, 2000));
    put(&e, "n1", &d1, 300).await;
    put(&e, "n1", &d2, 300).await;
    put(&e, "n2", &d1, 300).await;
    let oids = e.referenced_oids().await.unwrap();
    assert_eq!(oids.len(), 3);
    let (k1, k2) = (key_of("n1", &d1), key_of("n1", &d2));
    let absent = Digest::of(b"absent");
    assert_eq!(
        e.has_many(&ns("n1"), &[k1.digest, absent, k2.digest])
            .await
            .unwrap(),
        [true, false, true]
    );
    let names: Vec<String> = e
        .namespaces()
        .await
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(names, ["n1", "n2"]);
    let freed = e
        .delete_many(&ns("n1"), &[k1.digest, absent, k2.digest, k1.digest])
        .await
        .unwrap();
    assert_eq!(freed, [Some(1000), None, Some(2000), None]);
    assert_eq!(
        e.delete_many(&ns("n1"), &[k1.digest]).await.unwrap(),
        [None]
    );
    assert_eq!(
        e.large_objects_exist(&oids)
            .await
            .unwrap()
            .iter()
            .filter(|b| **b)
            .count(),
        1
    );
    assert!(e.orphan_large_objects(&oids).await.unwrap().is_empty());
    let names: Vec<String> = e
        .namespaces()
        .await
        .unwrap()
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(names, ["n2"]);
    // A reader opened before a delete fails rather than reading other bytes.
    let big = blob(9, 3 * CHUNK_SIZE);
    put(&e, "n2", &big, CHUNK_SIZE).await;
    let kb = key_of("n2", &big);
    let mut r = e
        .read_whole(&kb)
        .await
        .unwrap()
        .unwrap()
        .into_stream()
        .reader;
    let mut first = vec![0u8; 10];
    tokio::io::AsyncReadExt::read_exact(&mut r, &mut first)
        .await
        .unwrap();
    e.delete_many(&ns("n2"), &[kb.digest]).await.unwrap();
    let mut rest = Vec::new();
    assert!(tokio::io::AsyncReadExt::read_to_end(&mut r, &mut rest)
        .await
        .is_err());
}

#[tokio::test]
async fn scan_pages_in_digest_order() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let mut digests = Vec::new();
    for i in 0..12u64 {
        let d = blob(100 + i, 10 + i as usize);
        put(&e, "s", &d, 4).await;
        digests.push(Digest::of(&d));
    }
    digests.sort();
    let mut seen = Vec::new();
    let mut after = None;
    while let Some(last) = {
        let page = e.scan(&ns("s"), after, 5).await.unwrap();
        let last = page.last().map(|p| p.0);
        seen.extend(page);
        last
    } {
        after = Some(last);
    }
    assert_eq!(seen.iter().map(|p| p.0).collect::<Vec<_>>(), digests);
}

#[tokio::test]
async fn descriptor_and_invalid_schemas() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let d = e.capabilities();
    assert_eq!(d.kind, "pg-lo");
    assert_eq!(d.sharing, Sharing::DatabaseServer);
    assert!(d.durable);
    assert!(matches!(&d.instance, Instance::Postgres { schema, .. } if schema == &s.name));
    for bad in ["", "X", "a;b", "pg_temp"] {
        let err = PgLoEngine::connect(&s.url, bad).await.unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{bad:?}: {err:?}");
    }
}

#[tokio::test]
async fn corrupt_one_byte_changes_the_content() {
    let s = TestSchema::new();
    let e = s.engine().await;
    for data in [blob(10, 70_000), bytes::Bytes::new()] {
        let k = key_of("c", &data);
        put(&e, "c", &data, 9000).await;
        e.corrupt_one_byte(&k).await.unwrap();
        let got = read_all(e.read_whole(&k).await.unwrap().unwrap())
            .await
            .unwrap();
        assert_ne!(got, data);
        assert_ne!(Digest::of(&got), k.digest);
    }
    assert_eq!(
        e.corrupt_one_byte(&key_of("c", b"absent")).await,
        Err(Error::Missing)
    );
}

#[tokio::test]
async fn single_chunk_reads_are_one_statement_and_stay_race_safe() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let c = CHUNK_SIZE;
    // Whole reads at and around the one-statement limit, ranges likewise.
    for (i, len) in [1usize, 1000, c - 1, c, c + 1].into_iter().enumerate() {
        let data = blob(200 + i as u64, len);
        put(&e, "r", &data, 100_000).await;
        let k = key_of("r", &data);
        let r = e.read_whole(&k).await.unwrap().unwrap();
        assert_eq!(r.len(), len as u64);
        assert_eq!(read_all(r).await.unwrap(), data, "whole read of {len}");
        let n = len as u64;
        for (a, b) in [(0, n), (n / 2, n), (0, n.min(c as u64)), (n, n)] {
            let r = e.read_exact(&k, a..b).await.unwrap().unwrap();
            assert_eq!(r.len(), b - a);
            assert_eq!(
                read_all(r).await.unwrap(),
                &data[a as usize..b as usize],
                "{len}: {a}..{b}"
            );
        }
    }

    // A deleted entry is absent to both paths (the facade's `meta` may
    // have seen it just before): never another object's bytes.
    let data = blob(300, 5000);
    put(&e, "r", &data, 5000).await;
    let k = key_of("r", &data);
    e.delete_many(&ns("r"), &[k.digest]).await.unwrap();
    assert!(e.read_whole(&k).await.unwrap().is_none());
    assert!(e.read_exact(&k, 10..20).await.unwrap().is_none());

    // A large object shorter than its recorded size fails the read after
    // yielding what it has, as the streamed path does.
    let data = blob(301, 4000);
    put(&e, "r", &data, 4000).await;
    let k = key_of("r", &data);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE \"{}\".lo_entries SET size = size + 96 WHERE ns = 'r' AND digest = $1",
        e.schema()
    )))
    .bind(&k.digest.as_bytes()[..])
    .execute(e.pool())
    .await
    .unwrap();
    let r = e.read_whole(&k).await.unwrap().unwrap();
    assert_eq!(r.len(), 4096);
    let err = read_all(r).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    let r = e.read_exact(&k, 3000..4096).await.unwrap().unwrap();
    assert_eq!(r.len(), 1096);
    assert!(read_all(r).await.is_err());
    let r = e.read_exact(&k, 3000..4000).await.unwrap().unwrap();
    assert_eq!(read_all(r).await.unwrap(), &data[3000..4000]);
}
