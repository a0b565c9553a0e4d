//! Issue 13: `Store::verify` over the PostgreSQL kv engine and the pg-lo
//! large engine. One byte of a kv row's `content` and one byte of a large
//! object are flipped directly in the database; verify reports both as
//! corrupt, quarantines them (raw bytes saved, entries removed from the
//! served set, the large object unlinked) and a re-put heals them.
//!
//! Needs PostgreSQL at `DATABASE_URL` (default
//! postgres://postgres@127.0.0.1:5432/test); the test fails, never skips,
//! when it is unreachable. It works in a fresh schema dropped (with its
//! large objects) by a guard, also when the test fails.

mod common;

use common::bytes_of;
use sqlx::postgres::types::Oid;
use store_core::{Mode, Store, VerifyOptions};
use store_pg::plumbing::sql;
use store_pg::testing::TestSchema;
use store_pglo::PgLoEngine;
use store_postgres::PostgresEngine;
use store_types::{Digest, Error, Key, Namespace, Tier};

const THRESHOLD: u64 = 1024;

async fn open(schema: &TestSchema) -> Store {
    let kv = PostgresEngine::connect(&schema.url, &schema.name)
        .await
        .unwrap_or_else(|e| panic!("{}", store_pg::testing::unreachable_msg(&schema.url, &e)));
    let large = PgLoEngine::connect(&schema.url, &schema.name)
        .await
        .unwrap();
    Store::builder()
        .kv(kv)
        .large(large)
        .mode(Mode::DualTier {
            threshold: THRESHOLD,
        })
        .build()
        .await
        .unwrap()
}

/// `data` with the byte at `at` flipped, as written into the database.
fn flipped(data: &[u8], at: usize) -> Vec<u8> {
    let mut v = data.to_vec();
    v[at] ^= 0x5a;
    v
}

/// The pg-lo oid holding `key`, if any.
async fn lo_oid(pool: &sqlx::PgPool, schema: &str, key: &Key) -> Option<Oid> {
    sqlx::query_scalar(sql(
        schema,
        "SELECT oid FROM {schema}.lo_entries WHERE ns = $1 AND digest = $2",
    ))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .fetch_optional(pool)
    .await
    .unwrap()
}

/// Whether the kv table holds a row for `key`.
async fn kv_row(pool: &sqlx::PgPool, schema: &str, key: &Key) -> bool {
    let n: i64 = sqlx::query_scalar(sql(
        schema,
        "SELECT count(*) FROM {schema}.entries WHERE ns = $1 AND digest = $2",
    ))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .fetch_one(pool)
    .await
    .unwrap();
    n == 1
}

/// A verified read of `key` to the end.
async fn read(store: &Store, key: &Key) -> store_types::Result<Vec<u8>> {
    let blob = store.get(key).await?.ok_or(Error::Missing)?;
    Ok(blob.bytes().await?.to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_bytes_in_a_postgres_row_and_a_large_object_are_quarantined_and_healed() {
    // Declared first: dropped last, after the store's pools, even on panic.
    let schema = TestSchema::new();
    let store = open(&schema).await;
    let pool = schema.pool().await;
    let ns = Namespace::new("docs").unwrap();

    let small = bytes_of(700, 1);
    let big = bytes_of(300_000, 2);
    let fine = bytes_of(500, 3);
    let mut receipts = Vec::new();
    for (data, tier) in [(&small, Tier::Kv), (&big, Tier::Large), (&fine, Tier::Kv)] {
        let r = store
            .put_opts(
                &ns,
                &data[..],
                store_core::PutOptions {
                    len: Some(data.len() as u64),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(r.tier, tier);
        assert!(!r.deduplicated);
        receipts.push(r);
    }
    let ks = Key::new(ns.clone(), Digest::of(&small));
    let kl = Key::new(ns.clone(), Digest::of(&big));
    let kf = Key::new(ns.clone(), Digest::of(&fine));
    // The big entry's pin is released; the small one stays pinned by its
    // receipt (quarantine removes a corrupt entry whatever protects it).
    receipts.remove(1);

    // Flip one byte of the kv row's content.
    let (at_small, at_big) = (345usize, 200_001usize);
    let n = sqlx::query(sql(
        &schema.name,
        "UPDATE {schema}.entries SET content = set_byte(content, $3, get_byte(content, $3) # 90)
         WHERE ns = $1 AND digest = $2",
    ))
    .bind(ks.namespace.as_str())
    .bind(&ks.digest.as_bytes()[..])
    .bind(at_small as i32)
    .execute(&pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(n, 1, "the kv row of the small entry");
    // Flip one byte of the large object, in place.
    let oid = lo_oid(&pool, &schema.name, &kl)
        .await
        .expect("the large entry's oid");
    sqlx::query("SELECT lo_put($1, $2, $3)")
        .bind(oid)
        .bind(at_big as i64)
        .bind(vec![big[at_big] ^ 0x5a])
        .execute(&pool)
        .await
        .unwrap();
    let bad_small = flipped(&small, at_small);
    let bad_big = flipped(&big, at_big);

    // Verified reads now fail for both; the sound entry still reads.
    for key in [&ks, &kl] {
        let r = read(&store, key).await;
        assert!(matches!(r, Err(Error::Verification { .. })), "{key}: {r:?}");
    }
    assert_eq!(read(&store, &kf).await.unwrap(), fine);

    // Report only: nothing removed.
    let sum = store.verify(&VerifyOptions::new()).await.unwrap();
    assert_eq!(
        (sum.checked, sum.ok, sum.corrupt, sum.missing, sum.failed),
        (3, 1, 2, 0, 0),
        "{sum:?}"
    );
    assert_eq!(sum.quarantined, 0);
    assert!(store.has(&ks).await.unwrap() && store.has(&kl).await.unwrap());

    // With a quarantine directory.
    let tmp = tempfile::tempdir().unwrap();
    let qdir = tmp.path().join("quarantine");
    let opts = VerifyOptions {
        quarantine_dir: Some(qdir.clone()),
        ..VerifyOptions::new()
    };
    let sum = store.verify(&opts).await.unwrap();
    assert_eq!(
        (sum.checked, sum.ok, sum.corrupt, sum.missing, sum.failed),
        (3, 1, 2, 0, 0),
        "{sum:?}"
    );
    assert_eq!(sum.quarantined, 2, "{sum:?}");
    assert_eq!(sum.bytes, (small.len() + big.len() + fine.len()) as u64);
    let mut seen = Vec::new();
    for c in &sum.corrupt_entries {
        let (tier, bad) = if c.digest == ks.digest {
            (Tier::Kv, &bad_small)
        } else {
            assert_eq!(c.digest, kl.digest, "{c:?}");
            (Tier::Large, &bad_big)
        };
        assert_eq!(c.namespace, ns);
        assert_eq!(c.tier, tier, "{c:?}");
        assert_eq!(c.actual, Some(Digest::of(bad)), "{c:?}");
        assert!(c.quarantine_error.is_none(), "{c:?}");
        let want = qdir.join("docs").join(format!("{}.corrupt", c.digest));
        assert_eq!(c.quarantined.as_deref(), Some(want.as_path()), "{c:?}");
        let raw = std::fs::read(&want).unwrap_or_else(|e| panic!("{}: {e}", want.display()));
        assert!(raw == bad[..], "{}: the corrupted bytes, exactly", c.digest);
        seen.push(tier);
    }
    seen.sort_by_key(|t| *t == Tier::Large);
    assert_eq!(seen, [Tier::Kv, Tier::Large]);

    // Gone from the served set and from the database (the large object
    // unlinked, not leaked); the pin on the small key stays.
    for key in [&ks, &kl] {
        assert!(!store.has(key).await.unwrap(), "{key}");
        assert!(store.get(key).await.unwrap().is_none(), "{key}");
    }
    assert!(!kv_row(&pool, &schema.name, &ks).await);
    assert!(lo_oid(&pool, &schema.name, &kl).await.is_none());
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_largeobject_metadata WHERE oid = $1)")
            .bind(oid)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(!exists, "the corrupt large object is unlinked");
    assert_eq!(store.gc().pin_count(&ks), 1, "pins stay");
    assert!(store.has(&kf).await.unwrap());
    let again = store.verify(&opts).await.unwrap();
    assert_eq!(
        (again.checked, again.ok, again.corrupt, again.quarantined),
        (1, 1, 0, 0),
        "{again:?}"
    );

    // A re-put of the right content heals: fresh entries, verified on read.
    for (data, key, tier) in [(&small, &ks, Tier::Kv), (&big, &kl, Tier::Large)] {
        let r = store
            .put_opts(
                &ns,
                &data[..],
                store_core::PutOptions {
                    len: Some(data.len() as u64),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!((r.digest, r.tier), (key.digest, tier));
        assert!(!r.deduplicated, "{key}: a fresh entry, not a dedup hit");
        let blob = store.get(key).await.unwrap().expect("healed");
        assert_eq!(blob.tier(), tier);
        assert!(blob.bytes().await.unwrap()[..] == data[..], "{key}");
    }
    let healed = store.verify(&opts).await.unwrap();
    assert_eq!(
        (healed.checked, healed.ok, healed.corrupt, healed.failed),
        (3, 3, 0, 0),
        "{healed:?}"
    );
    drop(receipts);
}
