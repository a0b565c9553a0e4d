//! Fleet-mode clauses (ADR-012 §3, §4, §6.6): pinned puts, liveness-table
//! binding, SQL arbitration and the per-key lock protocol of the sweep's
//! execute batch.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{blob, key_of, ns, read_all, OpenEngine, TestSchema};
use sqlx::AssertSqlSafe;
use store_pg::plumbing::key_lock;
use store_pg::testing::set_db_clock;
use store_postgres::PostgresEngine;
use store_types::EngineExt as _;
use store_types::{
    Author, Digest, Engine, Error, ErrorKind, Instance, Key, KvEngine, LivenessTable, PinClauses,
    PinIntent, PinProof, ProtectReason, PublishOutcome, RefExpect, RefName, Timestamp,
};

/// The database's GC clock in these tests (pin rows are written and
/// judged by it, never by the `now` of a `PinIntent`).
const NOW: Timestamp = Timestamp(1_000_000);

/// An engine on `s` with its GC tables, the schema's GC clock stopped at
/// [`NOW`].
async fn fleet(s: &TestSchema) -> (PostgresEngine, Arc<dyn PinClauses>) {
    let e = s.engine().await;
    let seam = e.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    set_clock(&e, NOW).await;
    (e, seam.pins.unwrap())
}

/// Stops the schema's GC clock at `t`.
async fn set_clock(e: &PostgresEngine, t: Timestamp) {
    set_db_clock(e.pool(), e.schema(), t).await.unwrap();
}

fn intent(p: &dyn PinClauses, owner: &str, now: Timestamp, ttl_ms: u64) -> PinIntent {
    PinIntent {
        owner: owner.to_string(),
        now,
        ttl: Duration::from_millis(ttl_ms),
        host: p.pin_host(),
    }
}

/// `(owner, expires_at)` of every pin row of `key`, by owner.
async fn pin_rows(e: &PostgresEngine, key: &Key) -> Vec<(String, i64)> {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT owner, expires_at FROM \"{}\".gc_pins WHERE ns = $1 AND digest = $2 ORDER BY owner",
        e.schema()
    )))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .fetch_all(e.pool())
    .await
    .unwrap()
}

async fn exec(e: &PostgresEngine, stmt: &str) {
    let stmt = stmt.replace("{s}", &format!("\"{}\"", e.schema()));
    sqlx::raw_sql(AssertSqlSafe(stmt))
        .execute(e.pool())
        .await
        .unwrap();
}

#[tokio::test]
async fn pin_host_is_the_engine_identity() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    assert_eq!(p.pin_host(), e.capabilities().instance);
    assert!(matches!(p.pin_host(), Instance::Postgres { schema, .. } if schema == s.name));
}

#[tokio::test]
async fn put_pinned_commits_entry_and_pin_and_a_dedup_hit_still_pins() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let data = blob(1, 5000);
    let k = key_of("n", &data);

    let out = p
        .put_pinned(&k, data.clone(), &intent(&*p, "a", NOW, 1000))
        .await
        .unwrap();
    assert_eq!(out, PublishOutcome::Inserted);
    assert_eq!(
        read_all(e.read_whole(&k).await.unwrap().unwrap())
            .await
            .unwrap(),
        data
    );
    assert_eq!(e.meta(&k).await.unwrap().unwrap().size, 5000);
    assert_eq!(pin_rows(&e, &k).await, [("a".to_string(), NOW.0 + 1000)]);

    // Dedup hit (another owner): AlreadyPresent, and its pin commits.
    let out = p
        .put_pinned(&k, data.clone(), &intent(&*p, "b", NOW, 3000))
        .await
        .unwrap();
    assert_eq!(out, PublishOutcome::AlreadyPresent);
    // Same owner again with an earlier expiry keeps the later one; a
    // later expiry extends.
    p.put_pinned(&k, data.clone(), &intent(&*p, "a", NOW, 10))
        .await
        .unwrap();
    p.put_pinned(&k, data.clone(), &intent(&*p, "b", NOW, 5000))
        .await
        .unwrap();
    assert_eq!(
        pin_rows(&e, &k).await,
        [
            ("a".to_string(), NOW.0 + 1000),
            ("b".to_string(), NOW.0 + 5000)
        ]
    );
    assert_eq!(e.scan(&k.namespace, None, 10).await.unwrap().len(), 1);

    // A dedup hit against an entry written by the plain put also pins.
    let other = Bytes::from_static(b"plain");
    let k2 = key_of("n", &other);
    e.put(&k2, other.clone()).await.unwrap();
    let out = p
        .put_pinned(&k2, other, &intent(&*p, "c", NOW, 100))
        .await
        .unwrap();
    assert_eq!(out, PublishOutcome::AlreadyPresent);
    assert_eq!(pin_rows(&e, &k2).await, [("c".to_string(), NOW.0 + 100)]);
}

#[tokio::test]
async fn put_pinned_is_atomic() {
    // Without gc_pins the pin upsert fails, and the entry must not commit.
    let s = TestSchema::new();
    let e = s.engine().await;
    let p = e.capabilities().seam.unwrap().pins.unwrap();
    let data = blob(2, 100);
    let k = key_of("n", &data);
    let err = p
        .put_pinned(&k, data, &intent(&*p, "a", NOW, 1000))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err:?}");
    assert!(e.meta(&k).await.unwrap().is_none(), "entry rolled back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_put_pinned_of_one_key_inserts_once_and_pins_all() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let data = blob(3, 2000);
    let k = key_of("n", &data);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (p, data, k) = (p.clone(), data.clone(), k.clone());
            tokio::spawn(async move {
                let pin = intent(&*p, &format!("o{i}"), NOW, 1000);
                p.put_pinned(&k, data, &pin).await.unwrap()
            })
        })
        .collect();
    let mut inserted = 0;
    for t in tasks {
        if t.await.unwrap() == PublishOutcome::Inserted {
            inserted += 1;
        }
    }
    assert_eq!(inserted, 1);
    assert_eq!(pin_rows(&e, &k).await.len(), 8);
}

#[tokio::test]
async fn pins_for_another_host_are_refused() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let k = key_of("n", b"x");
    let Instance::Postgres {
        system_identifier,
        database,
        ..
    } = p.pin_host()
    else {
        panic!("postgres host");
    };
    let hosts = [
        Instance::Postgres {
            system_identifier: system_identifier.clone(),
            database: database.clone(),
            schema: "elsewhere".into(),
        },
        Instance::Postgres {
            system_identifier,
            database: format!("{database}_other"),
            schema: s.name.clone(),
        },
        Instance::Process,
    ];
    for host in hosts {
        let pin = PinIntent {
            host,
            ..intent(&*p, "a", NOW, 1000)
        };
        let err = p
            .put_pinned(&k, Bytes::from_static(b"x"), &pin)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
        let err = p.pin_first(&k, &pin).await.unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err:?}");
    }
    assert!(e.meta(&k).await.unwrap().is_none());
    assert!(pin_rows(&e, &k).await.is_empty());
}

#[tokio::test]
async fn pin_first_commits_a_pin_row() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let k = key_of("n", b"large");
    p.pin_first(&k, &intent(&*p, "a", NOW, 1000)).await.unwrap();
    assert_eq!(pin_rows(&e, &k).await, [("a".to_string(), NOW.0 + 1000)]);
    assert_eq!(
        p.pin_check(std::slice::from_ref(&k), NOW).await.unwrap(),
        [true]
    );
    p.pin_first(&k, &intent(&*p, "a", NOW, 10)).await.unwrap();
    assert_eq!(pin_rows(&e, &k).await, [("a".to_string(), NOW.0 + 1000)]);
    assert!(e.meta(&k).await.unwrap().is_none(), "pin only, no entry");
}

#[tokio::test]
async fn bind_liveness_table_checks_the_catalog() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    exec(
        &e,
        "CREATE TABLE {s}.refs_b (d bytea NOT NULL);
         CREATE TABLE {s}.refs_t (digest_hex text, nsc text);
         CREATE TABLE {s}.\"Refs_V\" (d varchar(64), nsc varchar(64), n int);
         CREATE VIEW {s}.refs_view AS SELECT d FROM {s}.refs_b;",
    )
    .await;
    let sch = s.name.as_str();
    let n = ns("n1");

    let b = p
        .bind_liveness_table(&n, &LivenessTable::new(sch, "refs_b", "d"))
        .await
        .unwrap();
    assert!(!b.digest_is_text);
    assert_eq!(b.namespace, n);
    assert_eq!(b.table, LivenessTable::new(sch, "refs_b", "d"));

    let t = LivenessTable::new(sch, "refs_t", "digest_hex").with_namespace_column("nsc");
    let bt = p.bind_liveness_table(&n, &t).await.unwrap();
    assert!(bt.digest_is_text);
    assert_eq!(bt.table, t);
    let bt = p
        .bind_liveness_table(&n, &LivenessTable::new(sch, "refs_t", "digest_hex"))
        .await
        .unwrap();
    assert!(bt.digest_is_text);

    let v = LivenessTable::new(sch, "Refs_V", "d").with_namespace_column("nsc");
    assert!(p.bind_liveness_table(&n, &v).await.unwrap().digest_is_text);
    let view = LivenessTable::new(sch, "refs_view", "d");
    assert!(
        !p.bind_liveness_table(&n, &view)
            .await
            .unwrap()
            .digest_is_text
    );

    let bad = [
        (LivenessTable::new(sch, "nope", "d"), "does not exist"),
        (
            LivenessTable::new("no_such_schema", "refs_b", "d"),
            "does not exist",
        ),
        (LivenessTable::new(sch, "refs_v", "d"), "does not exist"), // case-sensitive
        (
            LivenessTable::new(sch, "refs_b", "digest"),
            "no digest column",
        ),
        (
            LivenessTable::new(sch, "refs_t", "digest_hex").with_namespace_column("ns"),
            "no namespace column",
        ),
        (
            LivenessTable::new(sch, "Refs_V", "n"),
            "expected bytea or text",
        ),
        (
            LivenessTable::new(sch, "refs_b", "d").with_namespace_column("d"),
            "expected text",
        ),
        (LivenessTable::new(sch, "refs-b", "d"), "invalid"),
        (
            LivenessTable::new(sch, "refs_b\"; DROP TABLE x; --", "d"),
            "invalid",
        ),
        (LivenessTable::new("", "refs_b", "d"), "invalid"),
        (LivenessTable::new(sch, "refs_b", "1d"), "invalid"),
        (LivenessTable::new(sch, "x".repeat(64), "d"), "invalid"),
        (
            LivenessTable::new(sch, "refs_t", "digest_hex").with_namespace_column("a b"),
            "invalid",
        ),
    ];
    for (table, want) in bad {
        match p.bind_liveness_table(&n, &table).await {
            Err(Error::Config(msg)) => assert!(msg.contains(want), "{table:?}: {msg}"),
            other => panic!("{table:?}: expected Config({want}), got {other:?}"),
        }
    }
    // Never created or altered.
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname ILIKE '%refs%'",
    )
    .bind(sch)
    .fetch_one(e.pool())
    .await
    .unwrap();
    assert_eq!(tables, 4);
}

#[tokio::test]
async fn arbitrate_combines_pins_and_bound_tables() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let sch = s.name.as_str();
    exec(
        &e,
        "CREATE TABLE {s}.live_b (d bytea);
         CREATE TABLE {s}.live_t (h text);
         CREATE TABLE {s}.live_ns (h varchar(64), space text);",
    )
    .await;
    let d = |x: &[u8]| Digest::of(x);
    let (dp, de, da, db, dc, dd) = (d(b"p"), d(b"e"), d(b"a"), d(b"b"), d(b"c"), d(b"d"));
    for (table, val) in [("live_b", da), ("live_b", dp)] {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{sch}\".{table} VALUES ($1)"
        )))
        .bind(&val.as_bytes()[..])
        .execute(e.pool())
        .await
        .unwrap();
    }
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{sch}\".live_t VALUES ($1)"
    )))
    .bind(db.to_hex())
    .execute(e.pool())
    .await
    .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{sch}\".live_ns VALUES ($1, 'n2'), ($2, 'n3')"
    )))
    .bind(dc.to_hex())
    .bind(dd.to_hex())
    .execute(e.pool())
    .await
    .unwrap();

    let (n1, n2) = (ns("n1"), ns("n2"));
    let tables = vec![
        p.bind_liveness_table(&n1, &LivenessTable::new(sch, "live_b", "d"))
            .await
            .unwrap(),
        p.bind_liveness_table(&n1, &LivenessTable::new(sch, "live_t", "h"))
            .await
            .unwrap(),
        p.bind_liveness_table(
            &n2,
            &LivenessTable::new(sch, "live_ns", "h").with_namespace_column("space"),
        )
        .await
        .unwrap(),
    ];
    let key = |n: &str, d: Digest| Key::new(ns(n), d);
    p.pin_first(&key("n1", dp), &intent(&*p, "a", NOW, 1000))
        .await
        .unwrap();
    set_clock(&e, Timestamp(NOW.0 - 1000)).await;
    p.pin_first(&key("n1", de), &intent(&*p, "a", NOW, 1000))
        .await
        .unwrap(); // expires exactly at NOW: expired
    set_clock(&e, NOW).await;
    p.pin_first(&key("n2", dd), &intent(&*p, "a", NOW, 1000))
        .await
        .unwrap();

    use ProtectReason::{Live, Pinned};
    let cases = [
        (key("n1", dp), Some(Pinned)), // pinned and live: pinned wins
        (key("n1", de), None),         // expired pin only
        (key("n1", da), Some(Live)),   // bytea table
        (key("n2", da), None),         // live_b is bound to n1 only
        (key("n1", db), Some(Live)),   // text table
        (key("n2", dc), Some(Live)),   // ns-scoped table, matching ns
        (key("n1", dc), None),         // live_ns is bound to n2
        (key("n3", dd), None),         // bound to n2, not n3
        (key("n2", dd), Some(Pinned)), // ns column says n3, but pinned
        (key("n2", d(b"zz")), None),
        (key("n1", da), Some(Live)), // duplicates answer alike
    ];
    let keys: Vec<Key> = cases.iter().map(|c| c.0.clone()).collect();
    let want: Vec<_> = cases.iter().map(|c| c.1).collect();
    assert_eq!(p.arbitrate(&keys, &tables, NOW).await.unwrap(), want);
    // No tables: pins only.
    let pins_only: Vec<_> = want.iter().map(|w| w.filter(|r| *r == Pinned)).collect();
    assert_eq!(p.arbitrate(&keys, &[], NOW).await.unwrap(), pins_only);
    // Later, the pins have expired.
    set_clock(&e, Timestamp(NOW.0 + 1000)).await;
    assert_eq!(
        p.arbitrate(&keys[..1], &tables, NOW).await.unwrap(),
        [Some(Live)]
    );
    set_clock(&e, NOW).await;
    assert!(p.arbitrate(&[], &tables, NOW).await.unwrap().is_empty());
    // The batch answers with the same statement.
    let mut batch = p.begin_batch(&keys).await.unwrap();
    assert_eq!(batch.protected(&keys, &tables, NOW).await.unwrap(), want);
    batch.commit().await.unwrap();
}

async fn not_done_after<T>(h: &tokio::task::JoinHandle<T>, ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    assert!(!h.is_finished(), "must still be waiting for the lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_blocks_a_put_pinned_on_its_key_until_commit() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let data = blob(4, 100);
    let k = key_of("n", &data);
    let free = key_of("n", b"free");

    let batch = p.begin_batch(std::slice::from_ref(&k)).await.unwrap();
    let put = {
        let (p, k, data) = (p.clone(), k.clone(), data.clone());
        tokio::spawn(async move { p.put_pinned(&k, data, &intent(&*p, "a", NOW, 1000)).await })
    };
    // Other keys are not blocked.
    tokio::time::timeout(
        Duration::from_secs(5),
        p.put_pinned(
            &free,
            Bytes::from_static(b"free"),
            &intent(&*p, "a", NOW, 1000),
        ),
    )
    .await
    .expect("an unlocked key is not blocked")
    .unwrap();
    not_done_after(&put, 200).await;
    assert!(pin_rows(&e, &k).await.is_empty());
    assert!(e.meta(&k).await.unwrap().is_none());

    batch.commit().await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), put)
        .await
        .expect("put proceeds after the batch commits")
        .unwrap()
        .unwrap();
    assert_eq!(out, PublishOutcome::Inserted);
    assert_eq!(pin_rows(&e, &k).await.len(), 1);

    // A dropped batch releases its locks as well.
    let k2 = key_of("n", b"second");
    let batch = p.begin_batch(std::slice::from_ref(&k2)).await.unwrap();
    let pin = {
        let (p, k2) = (p.clone(), k2.clone());
        tokio::spawn(async move { p.pin_first(&k2, &intent(&*p, "b", NOW, 1000)).await })
    };
    not_done_after(&pin, 200).await;
    drop(batch);
    tokio::time::timeout(Duration::from_secs(10), pin)
        .await
        .expect("pin_first proceeds after the batch is dropped")
        .unwrap()
        .unwrap();
    assert_eq!(pin_rows(&e, &k2).await.len(), 1);
}

#[tokio::test]
async fn a_batch_sees_pins_committed_before_it_locked() {
    let s = TestSchema::new();
    let (_e, p) = fleet(&s).await;
    let (a, b, c) = (key_of("n", b"a"), key_of("n", b"b"), key_of("n", b"c"));
    p.pin_first(&a, &intent(&*p, "x", NOW, 1000)).await.unwrap();
    p.put_pinned(&b, Bytes::from_static(b"b"), &intent(&*p, "x", NOW, 1000))
        .await
        .unwrap();
    let keys = [a, b, c];
    let mut batch = p.begin_batch(&keys).await.unwrap();
    assert_eq!(
        batch.protected(&keys, &[], NOW).await.unwrap(),
        [
            Some(ProtectReason::Pinned),
            Some(ProtectReason::Pinned),
            None
        ]
    );
    batch.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_waits_for_an_in_flight_pin_and_then_sees_it() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let k = key_of("n", b"in-flight");
    // A put in flight: holds the shared lock, pin row written, not yet
    // committed.
    let mut put_tx = e.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
        .bind(key_lock(e.schema(), &k))
        .execute(&mut *put_tx)
        .await
        .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO \"{}\".gc_pins VALUES ($1, $2, 'x', $3)",
        e.schema()
    )))
    .bind(k.namespace.as_str())
    .bind(&k.digest.as_bytes()[..])
    .bind(NOW.0 + 1000)
    .execute(&mut *put_tx)
    .await
    .unwrap();

    let batch = {
        let (p, k) = (p.clone(), k.clone());
        tokio::spawn(async move {
            let mut b = p.begin_batch(std::slice::from_ref(&k)).await.unwrap();
            let seen = b
                .protected(std::slice::from_ref(&k), &[], NOW)
                .await
                .unwrap();
            b.commit().await.unwrap();
            seen
        })
    };
    not_done_after(&batch, 200).await;
    put_tx.commit().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), batch)
        .await
        .expect("batch proceeds after the put commits")
        .unwrap();
    assert_eq!(seen, [Some(ProtectReason::Pinned)]);
}

#[tokio::test]
async fn batch_deletes_are_invisible_until_commit_and_roll_back_on_drop() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let w = e.capabilities().seam.unwrap().window.unwrap();
    let (x, y) = (blob(5, 300), blob(6, 700));
    let (kx, ky) = (key_of("n", &x), key_of("n", &y));
    let absent = key_of("n", b"absent");
    e.put(&kx, x).await.unwrap();
    e.put(&ky, y).await.unwrap();
    let staged: Vec<_> = [&kx, &ky]
        .iter()
        .map(|k| store_types::StagedCandidate {
            key: (*k).clone(),
            size: 1,
            visible_after: NOW,
        })
        .collect();
    w.stage(&staged).await.unwrap();
    let keys = [kx.clone(), ky.clone(), absent.clone()];
    let digests = [kx.digest, ky.digest, absent.digest, kx.digest];
    let n = ns("n");

    for commit in [false, true] {
        let mut batch = p.begin_batch(&keys).await.unwrap();
        assert_eq!(
            batch.protected(&keys, &[], NOW).await.unwrap(),
            [None, None, None]
        );
        assert_eq!(
            batch.delete_entries(&n, &digests).await.unwrap(),
            [Some(300), Some(700), None, None]
        );
        batch.unstage(&keys).await.unwrap();
        // Not visible outside the batch yet.
        assert_eq!(
            e.has_many(&n, &digests[..3]).await.unwrap(),
            [true, true, false]
        );
        assert_eq!(w.staged_count().await.unwrap(), 2);
        if commit {
            batch.commit().await.unwrap();
        } else {
            drop(batch);
            assert_eq!(
                e.has_many(&n, &digests[..3]).await.unwrap(),
                [true, true, false]
            );
            assert_eq!(w.staged_count().await.unwrap(), 2);
        }
    }
    assert_eq!(
        e.has_many(&n, &digests[..3]).await.unwrap(),
        [false, false, false]
    );
    assert_eq!(w.staged_count().await.unwrap(), 0);

    // A batch refuses to delete a key whose lock it does not hold.
    let mut batch = p.begin_batch(std::slice::from_ref(&kx)).await.unwrap();
    let err = batch.delete_entries(&n, &[ky.digest]).await.unwrap_err();
    assert!(matches!(err, Error::Backend(_)), "{err:?}");
    assert!(batch.delete_entries(&n, &[]).await.unwrap().is_empty());
    batch.unstage(&[]).await.unwrap();
    batch.commit().await.unwrap();
    // An empty batch is a plain transaction.
    p.begin_batch(&[]).await.unwrap().commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_batches_in_any_key_order_do_not_deadlock() {
    let s = TestSchema::new();
    let (_e, p) = fleet(&s).await;
    let keys: Vec<Key> = (0..6u8).map(|i| key_of("n", &[i])).collect();
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (p, mut ks) = (p.clone(), keys.clone());
            ks.rotate_left(t % keys.len());
            if t % 2 == 1 {
                ks.reverse();
            }
            tokio::spawn(async move {
                for _ in 0..5 {
                    let mut b = p.begin_batch(&ks).await.unwrap();
                    b.protected(&ks, &[], NOW).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    b.commit().await.unwrap();
                }
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(30), async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await
    .expect("no deadlock");
}

/// The generation (`pin_id`, ADR-054) of `owner`'s pin row on `key`.
async fn pin_generation(e: &PostgresEngine, key: &Key, owner: &str) -> Option<i64> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT pin_id FROM \"{}\".gc_pins WHERE ns = $1 AND digest = $2 AND owner = $3",
        e.schema()
    )))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .bind(owner)
    .fetch_optional(e.pool())
    .await
    .unwrap()
}

fn at(ms: i64) -> Timestamp {
    Timestamp(NOW.0 + ms)
}

/// ADR-054: a pin row keeps its generation while any writer extends it
/// unexpired, and takes a new one whenever a writer finds it expired by
/// the database's clock or re-creates it after a reap — every writer alike
/// (`pin_first`, `put_pinned`, `pin_commit`; `pin_renew` never revives).
#[tokio::test]
async fn pin_rows_keep_their_generation_only_while_unexpired() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let data = Bytes::from_static(b"generations");
    let k = key_of("n", &data);
    let ttl = Duration::from_millis(1000);
    let g1 = p.pin_first(&k, &intent(&*p, "a", NOW, 1000)).await.unwrap();
    assert_eq!(pin_generation(&e, &k, "a").await, Some(g1));

    // Extended while unexpired, by every writer: the same generation.
    set_clock(&e, at(900)).await;
    assert_eq!(
        p.pin_first(&k, &intent(&*p, "a", NOW, 1000)).await.unwrap(),
        g1
    );
    p.put_pinned(&k, data.clone(), &intent(&*p, "a", NOW, 1000))
        .await
        .unwrap();
    p.pin_commit(&k, "a", NOW, ttl).await.unwrap();
    assert!(p.pin_renew(&k, "a", NOW, ttl).await.unwrap());
    assert_eq!(pin_generation(&e, &k, "a").await, Some(g1));
    // Another owner's row has a generation of its own.
    let gb = p.pin_first(&k, &intent(&*p, "b", NOW, 1000)).await.unwrap();
    assert_ne!(gb, g1);

    // Expired (expires_at = 1900 is not > 1900): renewal refuses, and each
    // upserting writer starts a new generation.
    set_clock(&e, at(1900)).await;
    assert!(!p.pin_renew(&k, "a", NOW, ttl).await.unwrap());
    assert_eq!(pin_generation(&e, &k, "a").await, Some(g1));
    let g2 = p.pin_first(&k, &intent(&*p, "a", NOW, 1000)).await.unwrap();
    assert_ne!(g2, g1, "pin_first on an expired row");
    set_clock(&e, at(2900)).await;
    p.pin_commit(&k, "a", NOW, ttl).await.unwrap();
    let g3 = pin_generation(&e, &k, "a").await.unwrap();
    assert!(g3 != g2 && g3 != g1, "pin_commit on an expired row");
    set_clock(&e, at(3900)).await;
    p.put_pinned(&k, data.clone(), &intent(&*p, "a", NOW, 1000))
        .await
        .unwrap();
    let g4 = pin_generation(&e, &k, "a").await.unwrap();
    assert!(![g1, g2, g3].contains(&g4), "put_pinned on an expired row");

    // Reaped and re-created: a new generation too.
    set_clock(&e, at(4900)).await;
    assert!(p.reap_expired(NOW).await.unwrap() >= 1);
    assert_eq!(pin_generation(&e, &k, "a").await, None);
    let g5 = p.pin_first(&k, &intent(&*p, "a", NOW, 1000)).await.unwrap();
    assert!(![g1, g2, g3, g4].contains(&g5), "a re-created row");
}

/// Issue 39 ("data loss, fleet"), ADR-054: a reference set stalled past its
/// pin's TTL must not be vouched for by a *later* pin of the same node.
///
/// The interleaving: node A's set pins the entry; the set stalls; the pin
/// row expires; another node's sweep finds the key unprotected and deletes
/// the entry; A's retry pins the key again — upserting the same
/// (key, owner) row with a fresh expiry — and finds the entry missing;
/// then the stalled first set runs. Its guard used to accept any
/// unexpired row of the owner, so it committed a reference to the deleted
/// entry and answered Ok. With the generation its own pin returned, it
/// fails and writes nothing.
#[tokio::test]
async fn a_stalled_set_is_not_vouched_for_by_a_retrys_pin() {
    let s = TestSchema::new();
    let (e, p) = fleet(&s).await;
    let refs = e.refs().expect("the postgres engine holds references");
    let data = Bytes::from_static(b"stalled set");
    let k = key_of("n", &data);
    let (n, early, late) = (
        k.namespace.clone(),
        RefName::new("early").unwrap(),
        RefName::new("late").unwrap(),
    );
    p.put_pinned(&k, data.clone(), &intent(&*p, "a", NOW, 1000))
        .await
        .unwrap();

    // A's set pins the entry (TTL 1 s) and keeps the proof of its pin.
    let first = p.pin_first(&k, &intent(&*p, "a", NOW, 1000)).await.unwrap();
    let proof = PinProof {
        owner: "a",
        generation: first,
    };
    // While that pin holds, the guarded write commits.
    refs.set_checked(
        &n,
        &early,
        k.digest,
        RefExpect::Any,
        Author::LIBRARY,
        Some(proof),
    )
    .await
    .expect("a set under its own unexpired pin commits");
    refs.delete(&n, &early, RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();

    // The set stalls past the TTL; another node's sweep batch finds the
    // key unprotected and deletes the entry (as the execute phase does).
    set_clock(&e, at(1001)).await;
    let mut batch = p.begin_batch(std::slice::from_ref(&k)).await.unwrap();
    assert_eq!(
        batch
            .protected(std::slice::from_ref(&k), &[], NOW)
            .await
            .unwrap(),
        [None],
        "the expired pin protects nothing"
    );
    batch.delete_entries(&n, &[k.digest]).await.unwrap();
    batch.commit().await.unwrap();
    assert!(e.meta(&k).await.unwrap().is_none());

    // A's retry pins again (the same row, a fresh expiry) and finds the
    // entry missing.
    let retry = p.pin_first(&k, &intent(&*p, "a", NOW, 1000)).await.unwrap();
    assert_eq!(pin_rows(&e, &k).await, [("a".to_string(), at(2001).0)]);
    assert_ne!(
        retry, first,
        "a re-pin of an expired row is a new generation"
    );
    assert!(e.meta(&k).await.unwrap().is_none());

    // The stalled first set runs now, with its own pin's proof.
    let stalled = refs
        .set_checked(
            &n,
            &late,
            k.digest,
            RefExpect::Any,
            Author::LIBRARY,
            Some(proof),
        )
        .await;
    assert!(
        matches!(&stalled, Err(err) if err.kind() == ErrorKind::TimedOut),
        "a set whose pin lapsed must fail, not name a deleted entry: {stalled:?}"
    );
    assert_eq!(refs.get(&n, &late).await.unwrap(), None, "nothing written");
}

/// ADR-054's migration step: `gc_pins` rows written before it get a
/// generation each, all distinct, and new rows draw after them.
#[tokio::test]
async fn the_generation_migration_numbers_existing_rows() {
    use store_pg::plumbing::{migrate, schema_version};
    use store_postgres::{GC_PINS_COMPONENT, GC_PINS_STEPS};
    let s = TestSchema::new();
    let e = s.engine().await;
    set_clock(&e, NOW).await;
    migrate(e.pool(), e.schema(), GC_PINS_COMPONENT, &GC_PINS_STEPS[..1])
        .await
        .unwrap();
    let (a, b) = (key_of("n", b"old-a"), key_of("n", b"old-b"));
    for (k, owner) in [(&a, "x"), (&a, "y"), (&b, "x")] {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{}\".gc_pins (ns, digest, owner, expires_at) VALUES ($1, $2, $3, $4)",
            e.schema()
        )))
        .bind(k.namespace.as_str())
        .bind(&k.digest.as_bytes()[..])
        .bind(owner)
        .bind(NOW.0 + 1000)
        .execute(e.pool())
        .await
        .unwrap();
    }
    let seam = e.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    assert_eq!(
        schema_version(e.pool(), e.schema(), GC_PINS_COMPONENT)
            .await
            .unwrap(),
        GC_PINS_STEPS.len() as u32
    );
    let old = [
        pin_generation(&e, &a, "x").await.unwrap(),
        pin_generation(&e, &a, "y").await.unwrap(),
        pin_generation(&e, &b, "x").await.unwrap(),
    ];
    assert!(old[0] != old[1] && old[1] != old[2] && old[0] != old[2]);
    let p = seam.pins.unwrap();
    // An unexpired old row keeps the generation the migration gave it.
    assert_eq!(
        p.pin_first(&a, &intent(&*p, "x", NOW, 1000)).await.unwrap(),
        old[0]
    );
    let fresh = p.pin_first(&b, &intent(&*p, "z", NOW, 1000)).await.unwrap();
    assert!(old.iter().all(|g| *g < fresh));
    // Reopening migrates nothing twice.
    seam.schema.ensure_gc_schema().await.unwrap();
    assert_eq!(pin_generation(&e, &a, "y").await, Some(old[1]));
}
