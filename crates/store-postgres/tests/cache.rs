//! Cache keys (`PgCacheKeys`): preconditions and owners under concurrency
//! and the migration of keys written before owners (issue 39); the generic
//! semantics are covered by the contract suite (`cases/cache.rs`).

mod common;

use std::sync::Arc;

use common::{ns, OpenEngine, TestSchema};
use store_pg::plumbing::{migrate, schema_version};
use store_postgres::{CACHE_COMPONENT, CACHE_STEPS};
use store_types::{
    Author, CacheIndex, Digest, Error, KvEngine, RefExpect, RefName, Replace, Timestamp,
};

fn key(s: &str) -> RefName {
    RefName::new(s).unwrap()
}

fn d(s: &str) -> Digest {
    Digest::of(s.as_bytes())
}

async fn cache(s: &TestSchema) -> Arc<dyn CacheIndex> {
    s.engine()
        .await
        .cache()
        .expect("the postgres engine holds cache keys")
}

const NOW: Timestamp = Timestamp(0);

/// Of concurrent create-only records of one key, exactly one creates it;
/// the others see the winner's digest.
#[tokio::test]
async fn concurrent_creates_of_one_key_admit_one() {
    let s = TestSchema::new();
    let c = cache(&s).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (c, barrier) = (c.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let me = format!("w{i}");
            let author = Author {
                name: Some(&me),
                may: Replace::Own,
            };
            barrier.wait().await;
            let got = c
                .record(
                    &ns("c"),
                    &key("k"),
                    d(&format!("v{i}")),
                    1,
                    NOW,
                    RefExpect::Absent,
                    author,
                )
                .await;
            (i, got)
        }));
    }
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (i, Ok(None)) => winners.push(i),
            (_, Err(Error::RefConflict { current, .. })) => seen.push(current),
            (i, other) => panic!("{i}: {other:?}"),
        }
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let won = d(&format!("v{}", winners[0]));
    assert!(seen.iter().all(|c| *c == Some(won)), "{seen:?}");
    assert_eq!(c.lookup(&ns("c"), &key("k")).await.unwrap(), Some(won));
}

/// Concurrent replaces by the owner and by another writer: the check runs
/// under the row lock, so only the owner's land.
#[tokio::test]
async fn owner_checks_hold_under_concurrency() {
    let s = TestSchema::new();
    let c = cache(&s).await;
    let w0 = Author {
        name: Some("w0"),
        may: Replace::Own,
    };
    c.record(
        &ns("c"),
        &key("k"),
        d("start"),
        1,
        NOW,
        RefExpect::Absent,
        w0,
    )
    .await
    .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (c, barrier) = (c.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let me = format!("w{}", i % 2);
            let author = Author {
                name: Some(&me),
                may: Replace::Own,
            };
            barrier.wait().await;
            let got = c
                .record(
                    &ns("c"),
                    &key("k"),
                    d(&format!("v{i}")),
                    1,
                    NOW,
                    RefExpect::Any,
                    author,
                )
                .await;
            (i, got)
        }));
    }
    for t in tasks {
        match t.await.unwrap() {
            (i, Ok(Some(_))) => assert_eq!(i % 2, 0, "only w0 may replace"),
            (i, Err(Error::NotOwner { .. })) => assert_eq!(i % 2, 1),
            (i, other) => panic!("{i}: {other:?}"),
        }
    }
    let now = c.lookup(&ns("c"), &key("k")).await.unwrap().unwrap();
    assert!((0..16).step_by(2).any(|i| now == d(&format!("v{i}"))));
}

/// A schema whose `cache` component is at v1 (before owners) keeps its
/// keys through the v2 step, and they are the library's.
#[tokio::test]
async fn a_v1_cache_component_gains_owners_and_its_keys_are_the_librarys() {
    assert_eq!(CACHE_STEPS.len(), 2);
    let s = TestSchema::new();
    let pool = s.pool().await;
    migrate(&pool, &s.name, CACHE_COMPONENT, &CACHE_STEPS[..1])
        .await
        .unwrap();
    let (x, y) = (d("x"), d("y"));
    // A key as the previous release wrote it (no owner column).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".cache_keys (namespace, key, digest, size, accessed_at)
         VALUES ('c', 'old', $1, 3, 5)",
        s.name
    )))
    .bind(&x.as_bytes()[..])
    .execute(&pool)
    .await
    .unwrap();

    let c = cache(&s).await;
    assert_eq!(
        schema_version(&pool, &s.name, CACHE_COMPONENT)
            .await
            .unwrap(),
        2
    );
    let (n, k) = (ns("c"), key("old"));
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(x));
    let row = || async {
        sqlx::query_as::<_, (Option<String>, i64)>(sqlx::AssertSqlSafe(format!(
            "SELECT owner, accessed_at FROM \"{}\".cache_keys WHERE key = 'old'",
            s.name
        )))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(row().await, (None, 5));
    let own = Author {
        name: Some("a"),
        may: Replace::Own,
    };
    let once = Author {
        name: Some("a"),
        may: Replace::Nothing,
    };
    let any = Author {
        name: Some("admin"),
        may: Replace::Any,
    };
    let err = c
        .record(&n, &k, y, 1, NOW, RefExpect::Any, own)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::NotOwner { current, write_once: false, .. } if current == x),
        "{err:?}"
    );
    // The same digest: allowed, the owner stays, the access time moves on
    // (the database's clock).
    assert_eq!(
        c.record(&n, &k, x, 3, NOW, RefExpect::Digest(x), once)
            .await
            .unwrap(),
        Some(x)
    );
    let (owner, accessed) = row().await;
    assert_eq!(owner, None);
    assert!(accessed > 5);
    let err = c
        .record(&n, &k, y, 1, NOW, RefExpect::Any, once)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotOwner {
                write_once: true,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        c.record(&n, &k, y, 1, NOW, RefExpect::Any, any)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(row().await.0.as_deref(), Some("admin"));
    assert_eq!(c.lookup(&n, &k).await.unwrap(), Some(y));
}
