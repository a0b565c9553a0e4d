//! Named references (`PgRefs`): compare-and-swap under concurrency,
//! listing, batch lookups, the sticky namespace mark, the migration and the
//! references as a fleet liveness table.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use common::{key_of, ns, OpenEngine, TestSchema};
use store_pg::plumbing::{migrate, schema_version};
use store_pg::testing::set_db_clock;
use store_postgres::{REFS_COMPONENT, REFS_STEPS};
use store_types::{
    Author, Digest, Engine, Error, KvEngine, ProtectReason, RefExpect, RefName, RefStore, Replace,
    Timestamp,
};

fn name(s: &str) -> RefName {
    RefName::new(s).unwrap()
}

fn d(s: &str) -> Digest {
    Digest::of(s.as_bytes())
}

async fn refs(s: &TestSchema) -> Arc<dyn RefStore> {
    s.engine()
        .await
        .refs()
        .expect("the postgres engine holds references")
}

fn conflict(r: store_types::Result<Option<Digest>>) -> Option<Digest> {
    match r {
        Err(Error::RefConflict { current, .. }) => current,
        other => panic!("expected RefConflict, got {other:?}"),
    }
}

#[tokio::test]
async fn compare_and_swap_semantics() {
    let s = TestSchema::new();
    let r = refs(&s).await;
    let (a, n) = (ns("a"), name("builds/app.tar"));
    let (x, y, z) = (d("x"), d("y"), d("z"));

    assert_eq!(r.get(&a, &n).await.unwrap(), None);
    // A digest expectation on an absent reference fails, changing nothing.
    assert_eq!(conflict(r.set(&a, &n, x, RefExpect::Digest(y)).await), None);
    assert_eq!(r.get(&a, &n).await.unwrap(), None);
    assert!(!r.uses_refs(&a).await.unwrap());

    assert_eq!(r.set(&a, &n, x, RefExpect::Absent).await.unwrap(), None);
    assert_eq!(r.get(&a, &n).await.unwrap(), Some(x));
    assert_eq!(conflict(r.set(&a, &n, y, RefExpect::Absent).await), Some(x));
    assert_eq!(
        conflict(r.set(&a, &n, y, RefExpect::Digest(z)).await),
        Some(x)
    );
    assert_eq!(r.get(&a, &n).await.unwrap(), Some(x));
    assert_eq!(
        r.set(&a, &n, y, RefExpect::Digest(x)).await.unwrap(),
        Some(x)
    );
    assert_eq!(r.set(&a, &n, z, RefExpect::Any).await.unwrap(), Some(y));
    // Setting the same digest again is a (successful) no-op swap.
    assert_eq!(
        r.set(&a, &n, z, RefExpect::Digest(z)).await.unwrap(),
        Some(z)
    );

    // Namespaces are separate.
    let b = ns("b");
    assert_eq!(r.get(&b, &n).await.unwrap(), None);
    assert_eq!(r.set(&b, &n, x, RefExpect::Absent).await.unwrap(), None);
    assert_eq!(r.get(&a, &n).await.unwrap(), Some(z));

    // Deletes.
    assert_eq!(
        conflict(
            r.delete(&a, &n, RefExpect::Digest(x), Author::LIBRARY)
                .await
        ),
        Some(z)
    );
    assert_eq!(
        conflict(r.delete(&a, &n, RefExpect::Absent, Author::LIBRARY).await),
        Some(z)
    );
    assert_eq!(r.get(&a, &n).await.unwrap(), Some(z));
    assert_eq!(
        r.delete(&a, &n, RefExpect::Digest(z), Author::LIBRARY)
            .await
            .unwrap(),
        Some(z)
    );
    assert_eq!(r.get(&a, &n).await.unwrap(), None);
    assert_eq!(
        r.delete(&a, &n, RefExpect::Any, Author::LIBRARY)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        r.delete(&a, &n, RefExpect::Absent, Author::LIBRARY)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        conflict(
            r.delete(&a, &n, RefExpect::Digest(z), Author::LIBRARY)
                .await
        ),
        None
    );
    assert_eq!(
        r.delete(&b, &n, RefExpect::Any, Author::LIBRARY)
            .await
            .unwrap(),
        Some(x)
    );
    // The message names the reference and what it holds.
    r.set(&a, &n, x, RefExpect::Any).await.unwrap();
    let msg = r
        .set(&a, &n, y, RefExpect::Absent)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("builds/app.tar") && msg.contains(&x.to_hex()),
        "{msg}"
    );
}

/// 16 writers each move one reference forward 8 times by compare-and-swap
/// (re-reading after each conflict): every successful swap must have
/// started from a different digest (no two writers overwrote the same
/// value — no lost update), and the swaps form one chain ending at the
/// final value.
#[tokio::test]
async fn concurrent_cas_writers_lose_no_update() {
    let s = TestSchema::new();
    let r = refs(&s).await;
    let (a, n) = (ns("a"), name("counter"));
    let start = d("start");
    r.set(&a, &n, start, RefExpect::Absent).await.unwrap();
    const WRITERS: usize = 16;
    const SWAPS: usize = 8;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let (r, a, n) = (r.clone(), a.clone(), n.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = Vec::new();
            let mut conflicts = 0usize;
            let mut seen = r.get(&a, &n).await.unwrap().unwrap();
            while done.len() < SWAPS {
                let next = d(&format!("{w}/{}", done.len()));
                match r.set(&a, &n, next, RefExpect::Digest(seen)).await {
                    Ok(prev) => {
                        assert_eq!(prev, Some(seen));
                        done.push((seen, next));
                        seen = next;
                    }
                    Err(Error::RefConflict { current, .. }) => {
                        conflicts += 1;
                        seen = current.expect("the reference is never deleted");
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            (done, conflicts)
        }));
    }
    let mut swaps = Vec::new();
    let mut conflicts = 0;
    for t in tasks {
        let (done, c) = t.await.unwrap();
        swaps.extend(done);
        conflicts += c;
    }
    assert_eq!(swaps.len(), WRITERS * SWAPS);
    let froms: HashSet<Digest> = swaps.iter().map(|(f, _)| *f).collect();
    assert_eq!(froms.len(), swaps.len(), "two swaps started from one value");
    // Follow the chain from the start: it covers every swap.
    let next: std::collections::HashMap<Digest, Digest> = swaps.iter().copied().collect();
    let mut at = start;
    let mut steps = 0;
    while let Some(n) = next.get(&at) {
        at = *n;
        steps += 1;
    }
    assert_eq!(steps, WRITERS * SWAPS);
    assert_eq!(r.get(&a, &n).await.unwrap(), Some(at));
    assert!(conflicts > 0, "the writers never raced");
}

/// 16 concurrent create-only sets of one name: exactly one wins, every
/// loser is told the winner's digest; then the same race on a deleted name.
#[tokio::test]
async fn racing_creates_have_exactly_one_winner() {
    let s = TestSchema::new();
    let r = refs(&s).await;
    let a = ns("a");
    for round in 0..3 {
        let n = name(&format!("race/{round}"));
        if round == 2 {
            // A reference that existed and was deleted races like a new one.
            r.set(&a, &n, d("before"), RefExpect::Absent).await.unwrap();
            r.delete(&a, &n, RefExpect::Any, Author::LIBRARY)
                .await
                .unwrap();
        }
        let barrier = Arc::new(tokio::sync::Barrier::new(16));
        let mut tasks = Vec::new();
        for w in 0..16 {
            let (r, a, n, barrier) = (r.clone(), a.clone(), n.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let mine = d(&format!("{round}/{w}"));
                barrier.wait().await;
                (mine, r.set(&a, &n, mine, RefExpect::Absent).await)
            }));
        }
        let mut winners = Vec::new();
        let mut losers = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                (mine, Ok(None)) => winners.push(mine),
                (_, Err(Error::RefConflict { current, .. })) => losers.push(current),
                (_, other) => panic!("{other:?}"),
            }
        }
        assert_eq!(winners.len(), 1, "round {round}");
        let won = winners[0];
        assert_eq!(r.get(&a, &n).await.unwrap(), Some(won));
        assert!(losers.iter().all(|l| *l == Some(won)), "{losers:?}");
    }
}

/// Racing deletes with a digest expectation: one deletes, the others are
/// told the reference is gone.
#[tokio::test]
async fn racing_deletes_have_exactly_one_winner() {
    let s = TestSchema::new();
    let r = refs(&s).await;
    let (a, n, x) = (ns("a"), name("gone"), d("x"));
    r.set(&a, &n, x, RefExpect::Any).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (r, a, n) = (r.clone(), a.clone(), n.clone());
        tasks.push(tokio::spawn(async move {
            r.delete(&a, &n, RefExpect::Digest(x), Author::LIBRARY)
                .await
        }));
    }
    let mut deleted = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(Some(held)) => {
                assert_eq!(held, x);
                deleted += 1;
            }
            Err(Error::RefConflict { current: None, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(deleted, 1);
}

#[tokio::test]
async fn list_pages_in_byte_order_by_prefix_range() {
    let s = TestSchema::new();
    let r = refs(&s).await;
    let (a, other) = (ns("a"), ns("b"));
    let names = [
        "a_b/1", "a_b/2", "a_b/3", "axb/1", "a-b", "a_", "a_b", "B", "Z/x", "a", "b", "a_c", "a.b",
        "_x",
    ];
    for (i, n) in names.iter().enumerate() {
        r.set(&a, &name(n), d(&format!("{i}")), RefExpect::Absent)
            .await
            .unwrap();
    }
    r.set(&other, &name("a_b/9"), d("o"), RefExpect::Absent)
        .await
        .unwrap();
    let mut sorted: Vec<&str> = names.to_vec();
    sorted.sort(); // byte order
    let all = r.list(&a, "", None, 100).await.unwrap();
    let got: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(got, sorted);
    assert_eq!(got[0], "B", "byte order: upper case first");
    for e in &all {
        let i = names.iter().position(|n| *n == e.name.as_str()).unwrap();
        assert_eq!(e.digest, d(&format!("{i}")));
    }

    // `_` is a character, not a wildcard: "a_b" does not match "axb/1".
    let pre = |v: Vec<store_types::RefEntry>| -> Vec<String> {
        v.into_iter().map(|e| e.name.to_string()).collect()
    };
    assert_eq!(
        pre(r.list(&a, "a_b", None, 100).await.unwrap()),
        ["a_b", "a_b/1", "a_b/2", "a_b/3"]
    );
    assert_eq!(
        pre(r.list(&a, "a_b/", None, 100).await.unwrap()),
        ["a_b/1", "a_b/2", "a_b/3"]
    );
    assert_eq!(
        pre(r.list(&a, "a_", None, 100).await.unwrap()),
        ["a_", "a_b", "a_b/1", "a_b/2", "a_b/3", "a_c"]
    );
    assert!(r.list(&a, "a%", None, 100).await.unwrap().is_empty());
    assert!(r.list(&a, "ü", None, 100).await.unwrap().is_empty());
    assert!(r.list(&a, "q", None, 100).await.unwrap().is_empty());
    assert!(r.list(&a, "", None, 0).await.unwrap().is_empty());

    // Pagination: pages of 2 with `after` reassemble the listing, under a
    // prefix and without.
    for prefix in ["", "a_", "a"] {
        let mut pages = Vec::new();
        let mut after: Option<RefName> = None;
        loop {
            let page = r.list(&a, prefix, after.as_ref(), 2).await.unwrap();
            assert!(page.len() <= 2);
            if page.is_empty() {
                break;
            }
            after = Some(page.last().unwrap().name.clone());
            pages.extend(page.into_iter().map(|e| e.name.to_string()));
        }
        let want: Vec<String> = sorted
            .iter()
            .filter(|n| n.starts_with(prefix))
            .map(|n| n.to_string())
            .collect();
        assert_eq!(pages, want, "prefix {prefix:?}");
    }
    // `after` below the prefix starts at the prefix; above it, after it.
    assert_eq!(
        pre(r.list(&a, "a_b/", Some(&name("B")), 1).await.unwrap()),
        ["a_b/1"]
    );
    assert_eq!(
        pre(r.list(&a, "a_b/", Some(&name("a_b/2")), 5).await.unwrap()),
        ["a_b/3"]
    );
    assert!(r
        .list(&a, "a_b/", Some(&name("b")), 5)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn referenced_answers_a_thousand_digests_in_one_call() {
    let s = TestSchema::new();
    let r = refs(&s).await;
    let (a, b) = (ns("a"), ns("b"));
    let digests: Vec<Digest> = (0..1000).map(|i| d(&format!("{i}"))).collect();
    // Every third digest referenced in `a` (two names for some), every
    // fifth only in `b`.
    for (i, dg) in digests.iter().enumerate() {
        if i % 3 == 0 {
            r.set(&a, &name(&format!("r/{i}")), *dg, RefExpect::Absent)
                .await
                .unwrap();
        }
        if i % 30 == 0 {
            r.set(&a, &name(&format!("again/{i}")), *dg, RefExpect::Absent)
                .await
                .unwrap();
        }
        if i % 5 == 0 {
            r.set(&b, &name(&format!("r/{i}")), *dg, RefExpect::Absent)
                .await
                .unwrap();
        }
    }
    let mut asked = digests.clone();
    asked.push(digests[3]); // a duplicate answers alike
    asked.push(d("never"));
    let got = r.referenced(&a, &asked).await.unwrap();
    assert_eq!(got.len(), asked.len());
    for (i, hit) in got.iter().enumerate().take(1000) {
        assert_eq!(*hit, i % 3 == 0, "digest {i}");
    }
    assert_eq!(&got[1000..], [true, false]);
    assert!(r.referenced(&a, &[]).await.unwrap().is_empty());
    // Moving a reference away un-references the old digest.
    r.set(
        &a,
        &name("r/0"),
        d("elsewhere"),
        RefExpect::Digest(digests[0]),
    )
    .await
    .unwrap();
    r.delete(&a, &name("again/0"), RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    r.delete(&a, &name("r/3"), RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    let got = r
        .referenced(&a, &[digests[0], digests[3], digests[6], d("elsewhere")])
        .await
        .unwrap();
    assert_eq!(got, [false, false, true, true]);
}

#[tokio::test]
async fn uses_refs_is_sticky_after_the_last_delete() {
    let s = TestSchema::new();
    let r = refs(&s).await;
    let (a, b, c) = (ns("a"), ns("b"), ns("c"));
    assert!(r.ref_namespaces().await.unwrap().is_empty());
    r.set(&b, &name("x"), d("x"), RefExpect::Any).await.unwrap();
    r.set(&a, &name("x"), d("x"), RefExpect::Any).await.unwrap();
    r.set(&a, &name("y"), d("y"), RefExpect::Any).await.unwrap();
    // A set marks nothing itself: the facade marks after a committed set
    // whose caller may change the policy (ADR-045).
    assert!(r.ref_namespaces().await.unwrap().is_empty());
    assert!(r.mark_uses_refs(&b).await.unwrap());
    assert!(r.mark_uses_refs(&a).await.unwrap());
    assert!(!r.mark_uses_refs(&a).await.unwrap(), "idempotent");
    assert!(r
        .set(&c, &name("x"), d("x"), RefExpect::Digest(d("q")))
        .await
        .is_err());
    assert_eq!(r.ref_namespaces().await.unwrap(), [a.clone(), b.clone()]);
    for n in ["x", "y"] {
        r.delete(&a, &name(n), RefExpect::Any, Author::LIBRARY)
            .await
            .unwrap();
    }
    r.delete(&b, &name("x"), RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    assert!(r.list(&a, "", None, 10).await.unwrap().is_empty());
    assert!(r.uses_refs(&a).await.unwrap());
    assert!(r.uses_refs(&b).await.unwrap());
    assert!(!r.uses_refs(&c).await.unwrap());
    assert_eq!(r.ref_namespaces().await.unwrap(), [a.clone(), b]);
    // And through a new engine on the schema.
    let again = refs(&s).await;
    assert!(again.uses_refs(&a).await.unwrap());
}

#[tokio::test]
async fn the_migration_is_idempotent_on_reopen() {
    let s = TestSchema::new();
    let pool = s.pool().await;
    let r = refs(&s).await;
    r.set(&ns("a"), &name("keep"), d("k"), RefExpect::Absent)
        .await
        .unwrap();
    r.mark_uses_refs(&ns("a")).await.unwrap();
    assert_eq!(
        schema_version(&pool, &s.name, REFS_COMPONENT)
            .await
            .unwrap(),
        REFS_STEPS.len() as u32
    );
    // Reopen, sequentially and concurrently: nothing recreated, data kept.
    let _again = s.engine().await;
    let (x, y) = tokio::join!(s.engine(), s.engine());
    drop((x, y));
    let r2 = refs(&s).await;
    assert_eq!(r2.get(&ns("a"), &name("keep")).await.unwrap(), Some(d("k")));
    assert!(r2.uses_refs(&ns("a")).await.unwrap());
    assert_eq!(
        schema_version(&pool, &s.name, REFS_COMPONENT)
            .await
            .unwrap(),
        REFS_STEPS.len() as u32
    );
    let columns: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT table_name::text, column_name::text, coalesce(collation_name::text, '')
         FROM information_schema.columns
         WHERE table_schema = $1 AND table_name IN ('ref_names', 'ref_namespaces')
         ORDER BY table_name, ordinal_position",
    )
    .bind(&s.name)
    .fetch_all(&pool)
    .await
    .unwrap();
    let want = [
        ("ref_names", "namespace", "C"),
        ("ref_names", "name", "C"),
        ("ref_names", "digest", ""),
        ("ref_names", "updated_at", ""),
        ("ref_names", "owner", "C"),
        ("ref_namespaces", "namespace", "C"),
        ("ref_namespaces", "since", ""),
    ];
    let got: Vec<(&str, &str, &str)> = columns
        .iter()
        .map(|(t, c, k)| (t.as_str(), c.as_str(), k.as_str()))
        .collect();
    assert_eq!(got, want);
    // The digest index exists.
    let idx: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT to_regclass('\"{}\".ref_names_digest')::text",
        s.name
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(idx.is_some());
}

/// A foreign table already named `ref_names` in the schema fails the
/// connect loudly instead of being taken for the engine's.
#[tokio::test]
async fn a_foreign_table_of_the_same_name_is_not_adopted() {
    let s = TestSchema::new();
    let pool = s.pool().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA \"{0}\"; CREATE TABLE \"{0}\".ref_names (x int)",
        s.name
    )))
    .execute(&pool)
    .await
    .unwrap();
    let err = store_postgres::PostgresEngine::connect(&s.url, &s.name)
        .await
        .unwrap_err();
    let report = store_types::Report::new(&err).to_string();
    assert!(report.contains("ref_names"), "{report}");
}

/// The references as a fleet liveness table: the GC host binds it (it
/// exists, bytea digest, text namespace) and its arbitration statement
/// reads it by namespace and digest.
#[tokio::test]
async fn the_liveness_table_binds_and_protects_by_namespace() {
    let s = TestSchema::new();
    let e = s.engine().await;
    let seam = e.capabilities().seam.unwrap();
    seam.schema.ensure_gc_schema().await.unwrap();
    set_db_clock(e.pool(), e.schema(), Timestamp(1_000_000))
        .await
        .unwrap();
    let pins = seam.pins.unwrap();
    let r = e.refs().unwrap();
    let table = r.liveness_table().expect("a fleet liveness table");
    assert_eq!(
        table,
        store_types::LivenessTable::new(&s.name, "ref_names", "digest")
            .with_namespace_column("namespace")
    );
    let a = ns("a");
    let bound = pins
        .register_liveness_table(&a, &table, "node-a")
        .await
        .unwrap();
    assert!(!bound.digest_is_text);
    assert_eq!(
        pins.liveness_tables().await.unwrap(),
        std::slice::from_ref(&bound)
    );

    let (ka, kb, kc) = (key_of("a", b"1"), key_of("b", b"1"), key_of("a", b"2"));
    // `b` references the same digest: the table is bound to `a` only, and
    // its rows count for their own namespace only.
    r.set(&ns("b"), &name("x"), kb.digest, RefExpect::Any)
        .await
        .unwrap();
    let keys = [ka.clone(), kb.clone(), kc.clone()];
    let tables = [bound.clone()];
    let now = Timestamp(0);
    assert_eq!(
        pins.arbitrate(&keys, &tables, now).await.unwrap(),
        [None, None, None]
    );
    r.set(&a, &name("x"), ka.digest, RefExpect::Any)
        .await
        .unwrap();
    assert_eq!(
        pins.arbitrate(&keys, &tables, now).await.unwrap(),
        [Some(ProtectReason::Live), None, None]
    );
    // Inside a locked batch too.
    let mut batch = pins.begin_batch(&keys).await.unwrap();
    assert_eq!(
        batch.protected(&keys, &tables, now).await.unwrap(),
        [Some(ProtectReason::Live), None, None]
    );
    batch.commit().await.unwrap();
    r.delete(&a, &name("x"), RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    assert_eq!(
        pins.arbitrate(&keys, &tables, now).await.unwrap(),
        [None, None, None]
    );
}

/// A schema whose `refs` component is at v1 (before owners) keeps its
/// references through the v2 step, and they are the library's: an author
/// that may replace only its own rows can neither replace nor remove them,
/// a write-once author can re-set the digest they hold, `Replace::Any`
/// replaces.
#[tokio::test]
async fn a_v1_refs_component_gains_owners_and_its_rows_are_the_librarys() {
    assert_eq!(REFS_STEPS.len(), 2);
    let s = TestSchema::new();
    let pool = s.pool().await;
    migrate(&pool, &s.name, REFS_COMPONENT, &REFS_STEPS[..1])
        .await
        .unwrap();
    let (x, y) = (d("x"), d("y"));
    // A row as the previous release wrote it (no owner column).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".ref_names (namespace, name, digest) VALUES ('a', 'old', $1)",
        s.name
    )))
    .bind(&x.as_bytes()[..])
    .execute(&pool)
    .await
    .unwrap();

    let r = refs(&s).await;
    assert_eq!(
        schema_version(&pool, &s.name, REFS_COMPONENT)
            .await
            .unwrap(),
        2
    );
    let (a, n) = (ns("a"), name("old"));
    assert_eq!(r.get(&a, &n).await.unwrap(), Some(x));
    let owner = || async {
        sqlx::query_scalar::<_, Option<String>>(sqlx::AssertSqlSafe(format!(
            "SELECT owner FROM \"{}\".ref_names WHERE name = 'old'",
            s.name
        )))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert_eq!(owner().await, None);
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
    let refused = |e: Error| matches!(e, Error::NotOwner { current, .. } if current == x);
    assert!(refused(
        r.set_checked(&a, &n, y, RefExpect::Any, own, None)
            .await
            .unwrap_err()
    ));
    assert!(refused(
        r.delete(&a, &n, RefExpect::Any, own).await.unwrap_err()
    ));
    assert_eq!(
        r.set_checked(&a, &n, x, RefExpect::Digest(x), once, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(owner().await, None, "the same digest keeps the owner");
    assert_eq!(
        r.set_checked(&a, &n, y, RefExpect::Any, any, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(owner().await.as_deref(), Some("admin"));
    assert_eq!(r.get(&a, &n).await.unwrap(), Some(y));
}

/// Concurrent writers of one reference by different authors: the owner
/// check runs under the row lock, so exactly the creator's replaces win
/// and the others are refused with the digest they saw under the lock.
#[tokio::test]
async fn owner_checks_hold_under_concurrency() {
    let s = TestSchema::new();
    let r = refs(&s).await;
    let (a, n) = (ns("a"), name("contested"));
    let first = Author {
        name: Some("w0"),
        may: Replace::Own,
    };
    r.set_checked(&a, &n, d("start"), RefExpect::Absent, first, None)
        .await
        .unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (r, a, n, barrier) = (r.clone(), a.clone(), n.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            let me = format!("w{}", i % 2);
            let author = Author {
                name: Some(&me),
                may: Replace::Own,
            };
            barrier.wait().await;
            let got = r
                .set_checked(&a, &n, d(&format!("v{i}")), RefExpect::Any, author, None)
                .await;
            (i, got)
        }));
    }
    let mut won = 0;
    for t in tasks {
        match t.await.unwrap() {
            (i, Ok(_)) => {
                assert_eq!(i % 2, 0, "only w0 may replace");
                won += 1;
            }
            (i, Err(Error::NotOwner { .. })) => assert_eq!(i % 2, 1),
            (i, Err(e)) => panic!("{i}: {e:?}"),
        }
    }
    assert_eq!(won, 8);
    let now = r.get(&a, &n).await.unwrap().unwrap();
    assert!((0..16).step_by(2).any(|i| now == d(&format!("v{i}"))));
}
