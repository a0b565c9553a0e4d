//! Named references at the engine level (issue 13, ADR-024): the
//! [`RefStore`] a composite's kv engine answers `KvEngine::refs` with.
//!
//! Every case runs against any kv engine that holds references
//! (`refs_suite!` is invoked only for those) and fails where
//! `KvEngine::refs` is `None`: a case that cannot run never passes. The
//! cases name no engine.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use store_types::{
    Author, Digest, Error, Namespace, RefEntry, RefExpect, RefName, RefStore, Replace,
};
use tokio::sync::Barrier;

use crate::harness::{ns, Harness, Spec};

/// The composite's references; fails the case when its kv engine holds
/// none. The harness is returned to keep the storage alive.
async fn open(spec: Spec, case: &str) -> (Harness, Arc<dyn RefStore>) {
    let h = Harness::open(spec).await;
    let refs = h.kv_refs().unwrap_or_else(|| {
        panic!(
            "refs::{case} on {}: its kv engine holds no references (KvEngine::refs \
             is None); invoke refs_suite! only for composites whose kv engine does",
            spec.name
        )
    });
    (h, refs)
}

fn name(s: &str) -> RefName {
    RefName::new(s).expect("valid reference name")
}

fn other_ns() -> Namespace {
    Namespace::new("contract-other").expect("valid")
}

fn d(i: u64) -> Digest {
    Digest::of(&i.to_le_bytes())
}

/// Asserts `r` is a [`Error::RefConflict`] naming `n` and `current`.
#[track_caller]
fn assert_conflict<T: std::fmt::Debug>(
    r: store_types::Result<T>,
    n: &RefName,
    current: Option<Digest>,
) {
    match r {
        Err(Error::RefConflict { name, current: c }) => {
            assert_eq!(name, n.as_str());
            assert_eq!(c, current, "conflict must report the current digest");
        }
        other => panic!("expected RefConflict on {n}, got {other:?}"),
    }
}

async fn names(refs: &dyn RefStore, ns: &Namespace, prefix: &str) -> Vec<String> {
    refs.list(ns, prefix, None, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string())
        .collect()
}

/// set / get / delete round trip; namespaces are independent.
pub async fn refs_set_get_delete(spec: Spec) {
    let (_h, refs) = open(spec, "refs_set_get_delete").await;
    let (n, x, y) = (name("builds/2026-12-01/app.tar"), d(1), d(2));
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), None);
    assert_eq!(
        refs.set(&ns(), &n, x, RefExpect::Absent).await.unwrap(),
        None
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(x));
    assert_eq!(refs.get(&other_ns(), &n).await.unwrap(), None);
    // Setting what it holds is allowed and returns it.
    assert_eq!(
        refs.set(&ns(), &n, x, RefExpect::Any).await.unwrap(),
        Some(x)
    );
    assert_eq!(
        refs.set(&ns(), &n, y, RefExpect::Any).await.unwrap(),
        Some(x)
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(y));
    // The same name in another namespace is another reference.
    assert_eq!(
        refs.set(&other_ns(), &n, x, RefExpect::Absent)
            .await
            .unwrap(),
        None
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(y));
    assert_eq!(
        refs.delete(&ns(), &n, RefExpect::Any, Author::LIBRARY)
            .await
            .unwrap(),
        Some(y)
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), None);
    assert_eq!(refs.get(&other_ns(), &n).await.unwrap(), Some(x));
    // Deleting what is not there: `None`, when the expectation allows it.
    assert_eq!(
        refs.delete(&ns(), &n, RefExpect::Any, Author::LIBRARY)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        refs.delete(&ns(), &n, RefExpect::Absent, Author::LIBRARY)
            .await
            .unwrap(),
        None
    );
    assert!(refs.list(&ns(), "", None, 10).await.unwrap().is_empty());
    assert_eq!(
        refs.list(&other_ns(), "", None, 10).await.unwrap(),
        vec![RefEntry {
            name: n.clone(),
            digest: x
        }]
    );
}

/// Compare-and-swap on `set`: a failed precondition reports the current
/// digest and changes nothing.
pub async fn refs_compare_and_swap(spec: Spec) {
    let (_h, refs) = open(spec, "refs_compare_and_swap").await;
    let (n, old, new, wrong) = (name("tip"), d(1), d(2), d(3));
    refs.set(&ns(), &n, old, RefExpect::Absent).await.unwrap();

    assert_conflict(
        refs.set(&ns(), &n, new, RefExpect::Absent).await,
        &n,
        Some(old),
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(old));
    assert_conflict(
        refs.set(&ns(), &n, new, RefExpect::Digest(wrong)).await,
        &n,
        Some(old),
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(old));
    assert_eq!(
        refs.referenced(&ns(), &[old, new]).await.unwrap(),
        [true, false]
    );

    assert_eq!(
        refs.set(&ns(), &n, new, RefExpect::Digest(old))
            .await
            .unwrap(),
        Some(old)
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(new));
    assert_eq!(
        refs.referenced(&ns(), &[old, new]).await.unwrap(),
        [false, true]
    );
    // The old expectation is stale now.
    assert_conflict(
        refs.set(&ns(), &n, wrong, RefExpect::Digest(old)).await,
        &n,
        Some(new),
    );

    // Expecting a digest of a reference that does not exist: conflict with
    // `None`, and nothing is created — not even the namespace mark.
    let fresh = Namespace::new("contract-cas-fresh").unwrap();
    let m = name("nothing-here");
    assert_conflict(
        refs.set(&fresh, &m, new, RefExpect::Digest(old)).await,
        &m,
        None,
    );
    assert_eq!(refs.get(&fresh, &m).await.unwrap(), None);
    assert!(!refs.uses_refs(&fresh).await.unwrap());
    assert!(!refs.ref_namespaces().await.unwrap().contains(&fresh));
}

/// Compare-and-swap on `delete`.
pub async fn refs_delete_with_expectation(spec: Spec) {
    let (_h, refs) = open(spec, "refs_delete_with_expectation").await;
    let (n, x, wrong) = (name("release"), d(10), d(11));
    refs.set(&ns(), &n, x, RefExpect::Any).await.unwrap();
    assert_conflict(
        refs.delete(&ns(), &n, RefExpect::Digest(wrong), Author::LIBRARY)
            .await,
        &n,
        Some(x),
    );
    assert_conflict(
        refs.delete(&ns(), &n, RefExpect::Absent, Author::LIBRARY)
            .await,
        &n,
        Some(x),
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(x));
    assert_eq!(refs.referenced(&ns(), &[x]).await.unwrap(), [true]);

    assert_eq!(
        refs.delete(&ns(), &n, RefExpect::Digest(x), Author::LIBRARY)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), None);
    assert_eq!(refs.referenced(&ns(), &[x]).await.unwrap(), [false]);
    assert_conflict(
        refs.delete(&ns(), &n, RefExpect::Digest(x), Author::LIBRARY)
            .await,
        &n,
        None,
    );
}

/// Listing: name (byte) order, pages with `after` + `limit`, prefixes
/// taken literally (`_`, `.`, `/` are no wildcards).
pub async fn refs_list_pagination_and_prefixes(spec: Spec) {
    let (_h, refs) = open(spec, "refs_list_pagination_and_prefixes").await;
    let all = [
        "a",
        "a.b",
        "a.c",
        "aXb",
        "a_",
        "a_b",
        "a_b/c",
        "ab",
        "b",
        "builds/1",
        "builds/2",
        "builds/10",
        "builds0",
        "builds_x",
        "Z",
        "_x",
        "-x",
        "0",
        "9/9",
        "z.z",
    ];
    let mut want: Vec<(String, Digest)> = Vec::new();
    for (i, n) in all.iter().enumerate() {
        let digest = d(100 + i as u64);
        refs.set(&ns(), &name(n), digest, RefExpect::Absent)
            .await
            .unwrap();
        want.push((n.to_string(), digest));
    }
    // Noise in another namespace must never show.
    refs.set(&other_ns(), &name("a_b"), d(1), RefExpect::Any)
        .await
        .unwrap();
    refs.set(&other_ns(), &name("aa"), d(1), RefExpect::Any)
        .await
        .unwrap();
    want.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));

    // Whole listing, then pages of 3.
    let listed: Vec<(String, Digest)> = refs
        .list(&ns(), "", None, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name.to_string(), e.digest))
        .collect();
    assert_eq!(listed, want);
    let mut paged = Vec::new();
    let mut after: Option<RefName> = None;
    loop {
        let page = refs.list(&ns(), "", after.as_ref(), 3).await.unwrap();
        assert!(page.len() <= 3);
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().name.clone());
        paged.extend(page.into_iter().map(|e| (e.name.to_string(), e.digest)));
    }
    assert_eq!(paged, want);
    assert!(refs.list(&ns(), "", None, 0).await.unwrap().is_empty());

    let with = |p: &str| -> Vec<String> {
        want.iter()
            .filter(|(n, _)| n.starts_with(p))
            .map(|(n, _)| n.clone())
            .collect()
    };
    for prefix in [
        "a", "a_", "a.", "a_b", "a_b/", "builds/", "builds/1", "builds", "Z", "z", "_", "-", "9/",
        "nothing", "%", "a%", "A", "b",
    ] {
        let expect = with(prefix);
        assert_eq!(
            names(&*refs, &ns(), prefix).await,
            expect,
            "prefix {prefix:?}"
        );
        // The same listing, a page of 2 at a time.
        let mut paged = Vec::new();
        let mut after: Option<RefName> = None;
        loop {
            let page = refs.list(&ns(), prefix, after.as_ref(), 2).await.unwrap();
            if page.is_empty() {
                break;
            }
            after = Some(page.last().unwrap().name.clone());
            paged.extend(page.into_iter().map(|e| e.name.to_string()));
        }
        assert_eq!(paged, expect, "paged prefix {prefix:?}");
    }
    // Sanity of the expectations themselves: literal `_` and `.`.
    assert_eq!(with("a_"), ["a_", "a_b", "a_b/c"]);
    assert_eq!(with("a."), ["a.b", "a.c"]);
    assert_eq!(with("builds/"), ["builds/1", "builds/10", "builds/2"]);

    // `after` below the prefix starts at the prefix; at or beyond its end,
    // nothing is left.
    assert_eq!(
        refs.list(&ns(), "builds/", Some(&name("a")), 10)
            .await
            .unwrap()
            .len(),
        3
    );
    let rest: Vec<String> = refs
        .list(&ns(), "builds/", Some(&name("builds/10")), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name.to_string())
        .collect();
    assert_eq!(rest, ["builds/2"]);
    assert!(refs
        .list(&ns(), "builds/", Some(&name("builds0")), 10)
        .await
        .unwrap()
        .is_empty());
    assert!(refs
        .list(&ns(), "", Some(&name("z.z")), 10)
        .await
        .unwrap()
        .is_empty());
}

/// `referenced` over more than 500 digests (engines may batch), index
/// aligned, per namespace, with duplicates in the question.
pub async fn refs_referenced_many(spec: Spec) {
    let (_h, refs) = open(spec, "refs_referenced_many").await;
    const N: u64 = 1234;
    let ask: Vec<Digest> = (0..N).map(d).collect();
    // Referenced positions straddle every chunk boundary an engine might
    // use (500, 512, 1000, 1024).
    let hits: BTreeSet<u64> = [
        0, 1, 255, 256, 499, 500, 501, 511, 512, 513, 777, 999, 1000, 1001, 1023, 1024, 1025, 1233,
    ]
    .into_iter()
    .collect();
    let sets = hits.iter().map(|&i| {
        let refs = refs.clone();
        async move {
            refs.set(&ns(), &name(&format!("r/{i}")), d(i), RefExpect::Absent)
                .await
                .unwrap();
        }
    });
    futures::future::join_all(sets).await;
    // Two names on one digest; a reference elsewhere does not count here.
    refs.set(&ns(), &name("again/0"), d(0), RefExpect::Absent)
        .await
        .unwrap();
    refs.set(&other_ns(), &name("r/2"), d(2), RefExpect::Absent)
        .await
        .unwrap();

    let got = refs.referenced(&ns(), &ask).await.unwrap();
    let want: Vec<bool> = (0..N).map(|i| hits.contains(&i)).collect();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "digest #{i}");
    }
    // Reversed and with duplicates: still index aligned.
    let mut twice: Vec<Digest> = ask.iter().rev().copied().collect();
    twice.extend_from_slice(&ask);
    let got = refs.referenced(&ns(), &twice).await.unwrap();
    let want2: Vec<bool> = want.iter().rev().chain(&want).copied().collect();
    assert_eq!(got, want2);
    assert_eq!(
        refs.referenced(&other_ns(), &[d(0), d(2)]).await.unwrap(),
        [false, true]
    );
    assert!(refs.referenced(&ns(), &[]).await.unwrap().is_empty());
}

/// `ref_namespaces` / `uses_refs`: a set marks nothing by itself (the
/// facade marks after a committed, privileged set, ADR-045);
/// `mark_uses_refs` marks the namespace for good.
pub async fn refs_namespaces_stay_marked(spec: Spec) {
    let (_h, refs) = open(spec, "refs_namespaces_stay_marked").await;
    assert!(refs.ref_namespaces().await.unwrap().is_empty());
    assert!(!refs.uses_refs(&ns()).await.unwrap());
    let n = name("only");
    refs.set(&ns(), &n, d(1), RefExpect::Absent).await.unwrap();
    assert!(!refs.uses_refs(&ns()).await.unwrap());
    assert!(refs.mark_uses_refs(&ns()).await.unwrap());
    assert!(!refs.mark_uses_refs(&ns()).await.unwrap(), "idempotent");
    assert!(refs.uses_refs(&ns()).await.unwrap());
    refs.delete(&ns(), &n, RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    assert!(refs.list(&ns(), "", None, 10).await.unwrap().is_empty());
    // Deleting the last reference does not exempt the namespace.
    assert!(refs.uses_refs(&ns()).await.unwrap());
    assert!(!refs.uses_refs(&other_ns()).await.unwrap());
    refs.set(&other_ns(), &n, d(1), RefExpect::Any)
        .await
        .unwrap();
    refs.mark_uses_refs(&other_ns()).await.unwrap();
    let mut got = refs.ref_namespaces().await.unwrap();
    got.sort();
    let mut want = vec![ns(), other_ns()];
    want.sort();
    assert_eq!(got, want);
}

/// Names are opaque bytes: no case folding, byte order.
pub async fn refs_names_are_opaque(spec: Spec) {
    let (_h, refs) = open(spec, "refs_names_are_opaque").await;
    let (upper, lower) = (name("A"), name("a"));
    refs.set(&ns(), &upper, d(1), RefExpect::Absent)
        .await
        .unwrap();
    // A different name: creating it is not a conflict.
    refs.set(&ns(), &lower, d(2), RefExpect::Absent)
        .await
        .unwrap();
    assert_eq!(refs.get(&ns(), &upper).await.unwrap(), Some(d(1)));
    assert_eq!(refs.get(&ns(), &lower).await.unwrap(), Some(d(2)));
    refs.set(&ns(), &name("B"), d(3), RefExpect::Absent)
        .await
        .unwrap();
    refs.set(&ns(), &name("Ab"), d(4), RefExpect::Absent)
        .await
        .unwrap();
    // Byte order: every upper-case letter sorts before every lower-case one.
    assert_eq!(names(&*refs, &ns(), "").await, ["A", "Ab", "B", "a"]);
    assert_eq!(names(&*refs, &ns(), "a").await, ["a"]);
    assert_eq!(names(&*refs, &ns(), "A").await, ["A", "Ab"]);
    assert_eq!(
        refs.delete(&ns(), &lower, RefExpect::Any, Author::LIBRARY)
            .await
            .unwrap(),
        Some(d(2))
    );
    assert_eq!(refs.get(&ns(), &upper).await.unwrap(), Some(d(1)));
}

/// One racer's round: the digest it set, or the conflict's current digest.
type Outcome = Result<Digest, Option<Digest>>;

/// Concurrency: 16 tasks race a compare-and-swap from the same digest each
/// round (exactly one wins, the others see the winner's digest), then
/// CAS-increment a counter with retries (no update is lost).
pub async fn refs_concurrent_compare_and_swap(spec: Spec) {
    let (_h, refs) = open(spec, "refs_concurrent_compare_and_swap").await;
    const TASKS: u64 = 16;
    const ROUNDS: u64 = 6;
    const INCREMENTS: u64 = 4;

    // Rounds: everyone reads, everyone swaps from what it read.
    let n = name("race");
    let start = d(1_000_000);
    refs.set(&ns(), &n, start, RefExpect::Absent).await.unwrap();
    let barrier = Arc::new(Barrier::new(TASKS as usize));
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (refs, barrier, n) = (refs.clone(), barrier.clone(), n.clone());
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                for round in 0..ROUNDS {
                    barrier.wait().await;
                    let seen = refs.get(&ns(), &n).await.unwrap().expect("present");
                    barrier.wait().await;
                    let mine = d(round * 1000 + t);
                    let r = refs.set(&ns(), &n, mine, RefExpect::Digest(seen)).await;
                    let outcome = match r {
                        Ok(prev) => {
                            assert_eq!(prev, Some(seen));
                            Ok(mine)
                        }
                        Err(Error::RefConflict { current, .. }) => Err(current),
                        Err(e) => panic!("unexpected error: {e}"),
                    };
                    outcomes.push((round, seen, outcome));
                }
                outcomes
            })
        })
        .collect();
    let mut per_round: HashMap<u64, Vec<(Digest, Outcome)>> = HashMap::new();
    for task in tasks {
        for (round, seen, outcome) in task.await.unwrap() {
            per_round.entry(round).or_default().push((seen, outcome));
        }
    }
    let mut expect_seen = start;
    for round in 0..ROUNDS {
        let outcomes = &per_round[&round];
        assert_eq!(outcomes.len() as u64, TASKS);
        assert!(
            outcomes.iter().all(|(seen, _)| *seen == expect_seen),
            "round {round}: every task read the previous winner"
        );
        let winners: Vec<Digest> = outcomes.iter().filter_map(|(_, o)| o.ok()).collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one CAS wins");
        let winner = winners[0];
        for (_, o) in outcomes {
            if let Err(current) = o {
                assert_eq!(
                    *current,
                    Some(winner),
                    "round {round}: losers see the winner"
                );
            }
        }
        expect_seen = winner;
    }
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(expect_seen));

    // Counter: CAS-increment with retries; no increment may be lost.
    let counter = name("counter");
    let index: Arc<HashMap<Digest, u64>> =
        Arc::new((0..=TASKS * INCREMENTS).map(|i| (d(i), i)).collect());
    refs.set(&ns(), &counter, d(0), RefExpect::Absent)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (refs, counter, index) = (refs.clone(), counter.clone(), index.clone());
            tokio::spawn(async move {
                let mut conflicts = 0u64;
                for _ in 0..INCREMENTS {
                    let mut cur = refs.get(&ns(), &counter).await.unwrap().expect("present");
                    loop {
                        let next = d(index[&cur] + 1);
                        match refs
                            .set(&ns(), &counter, next, RefExpect::Digest(cur))
                            .await
                        {
                            Ok(prev) => {
                                assert_eq!(prev, Some(cur));
                                break;
                            }
                            Err(Error::RefConflict {
                                current: Some(now), ..
                            }) => {
                                conflicts += 1;
                                cur = now;
                            }
                            Err(e) => panic!("unexpected error: {e}"),
                        }
                    }
                }
                conflicts
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        refs.get(&ns(), &counter).await.unwrap(),
        Some(d(TASKS * INCREMENTS)),
        "every increment counted once"
    );
    assert_eq!(
        refs.referenced(&ns(), &[d(TASKS * INCREMENTS - 1)])
            .await
            .unwrap(),
        [false]
    );
}

/// A writer that may replace only its own references (`Replace::Own`, the
/// `write` scope).
fn writer(name: &'static str) -> Author<'static> {
    Author {
        name: Some(name),
        may: Replace::Own,
    }
}

/// Asserts `r` is an [`Error::NotOwner`] naming `n` and `current`.
#[track_caller]
fn assert_not_owner<T: std::fmt::Debug>(
    r: store_types::Result<T>,
    n: &RefName,
    current: Digest,
    write_once: bool,
) {
    match r {
        Err(Error::NotOwner {
            name,
            current: c,
            write_once: w,
        }) => {
            assert_eq!(name, n.as_str());
            assert_eq!(c, current, "the refusal reports the current digest");
            assert_eq!(w, write_once);
        }
        other => panic!("expected NotOwner on {n}, got {other:?}"),
    }
}

/// Owners (issue 39): a write-only author adds references but replaces or
/// removes only its own; re-setting the digest a reference holds is
/// allowed to anyone and keeps its owner; the precondition is judged
/// before the owner.
pub async fn refs_a_writer_replaces_only_its_own(spec: Spec) {
    let (_h, refs) = open(spec, "refs_a_writer_replaces_only_its_own").await;
    let (a, b) = (writer("a"), writer("b"));
    let (n, x, y, z) = (name("owned/app.tar"), d(1), d(2), d(3));
    assert_eq!(
        refs.set_checked(&ns(), &n, x, RefExpect::Absent, a, None)
            .await
            .unwrap(),
        None,
        "creating is always allowed"
    );
    // b can neither replace nor remove a's reference; nothing changes.
    assert_not_owner(
        refs.set_checked(&ns(), &n, y, RefExpect::Any, b, None)
            .await,
        &n,
        x,
        false,
    );
    assert_not_owner(
        refs.set_checked(&ns(), &n, y, RefExpect::Digest(x), b, None)
            .await,
        &n,
        x,
        false,
    );
    assert_not_owner(
        refs.delete(&ns(), &n, RefExpect::Any, b).await,
        &n,
        x,
        false,
    );
    assert_not_owner(
        refs.delete(&ns(), &n, RefExpect::Digest(x), b).await,
        &n,
        x,
        false,
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(x));
    assert_eq!(
        refs.referenced(&ns(), &[x, y]).await.unwrap(),
        [true, false]
    );
    // The precondition comes first: a failed one is a conflict, whoever
    // asks.
    assert_conflict(
        refs.set_checked(&ns(), &n, y, RefExpect::Absent, b, None)
            .await,
        &n,
        Some(x),
    );
    assert_conflict(
        refs.set_checked(&ns(), &n, y, RefExpect::Digest(z), b, None)
            .await,
        &n,
        Some(x),
    );
    assert_conflict(
        refs.delete(&ns(), &n, RefExpect::Digest(z), b).await,
        &n,
        Some(x),
    );
    // b may re-set the digest it holds; the reference stays a's.
    assert_eq!(
        refs.set_checked(&ns(), &n, x, RefExpect::Any, b, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(
        refs.set_checked(&ns(), &n, x, RefExpect::Digest(x), b, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_not_owner(
        refs.set_checked(&ns(), &n, y, RefExpect::Any, b, None)
            .await,
        &n,
        x,
        false,
    );
    // a replaces its own (still a's after b's re-set), then removes it.
    assert_eq!(
        refs.set_checked(&ns(), &n, y, RefExpect::Digest(x), a, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(y));
    assert_not_owner(
        refs.delete(&ns(), &n, RefExpect::Any, b).await,
        &n,
        y,
        false,
    );
    assert_eq!(
        refs.delete(&ns(), &n, RefExpect::Any, a).await.unwrap(),
        Some(y)
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), None);
    // Removing what is not there is refused to nobody.
    assert_eq!(
        refs.delete(&ns(), &n, RefExpect::Any, b).await.unwrap(),
        None
    );
    // Once gone, the name is free: b creates it and owns it.
    assert_eq!(
        refs.set_checked(&ns(), &n, z, RefExpect::Absent, b, None)
            .await
            .unwrap(),
        None
    );
    assert_not_owner(
        refs.set_checked(&ns(), &n, x, RefExpect::Any, a, None)
            .await,
        &n,
        z,
        false,
    );
    // Owners are per reference: a's other names are unaffected.
    let other = name("owned/other");
    refs.set_checked(&ns(), &other, x, RefExpect::Absent, a, None)
        .await
        .unwrap();
    assert_eq!(
        refs.set_checked(&ns(), &other, y, RefExpect::Any, a, None)
            .await
            .unwrap(),
        Some(x)
    );
}

/// `Replace::Any` (the `delete` scope) replaces and removes anyone's
/// reference, and the library's [`Author::LIBRARY`] does too; a replaced
/// reference belongs to whoever replaced it (the library's to nobody's
/// write scope). `Replace::Nothing` (write-once) creates and re-sets the
/// same digest but never replaces or removes, even what it created.
pub async fn refs_any_replaces_and_nothing_never_does(spec: Spec) {
    let (_h, refs) = open(spec, "refs_any_replaces_and_nothing_never_does").await;
    let a = writer("a");
    let admin = Author {
        name: Some("admin"),
        may: Replace::Any,
    };
    let once = Author {
        name: Some("a"),
        may: Replace::Nothing,
    };
    let (n, x, y, z) = (name("shared"), d(11), d(12), d(13));
    refs.set_checked(&ns(), &n, x, RefExpect::Absent, a, None)
        .await
        .unwrap();
    assert_eq!(
        refs.set_checked(&ns(), &n, y, RefExpect::Any, admin, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), Some(y));
    // Now admin's: a's write scope no longer replaces it.
    assert_not_owner(
        refs.set_checked(&ns(), &n, z, RefExpect::Any, a, None)
            .await,
        &n,
        y,
        false,
    );
    // The library replaces anything; its rows are nobody's write scope's.
    assert_eq!(
        refs.set(&ns(), &n, z, RefExpect::Digest(y)).await.unwrap(),
        Some(y)
    );
    assert_not_owner(
        refs.set_checked(&ns(), &n, x, RefExpect::Any, a, None)
            .await,
        &n,
        z,
        false,
    );
    assert_not_owner(
        refs.delete(&ns(), &n, RefExpect::Any, a).await,
        &n,
        z,
        false,
    );
    // An author without a name owns nothing either.
    let anonymous = Author {
        name: None,
        may: Replace::Own,
    };
    assert_not_owner(
        refs.set_checked(&ns(), &n, x, RefExpect::Any, anonymous, None)
            .await,
        &n,
        z,
        false,
    );
    assert_eq!(
        refs.delete(&ns(), &n, RefExpect::Digest(z), admin)
            .await
            .unwrap(),
        Some(z)
    );
    assert_eq!(refs.get(&ns(), &n).await.unwrap(), None);

    // Write-once: create, re-set the same digest, never replace.
    let w = name("release/1.0");
    assert_eq!(
        refs.set_checked(&ns(), &w, x, RefExpect::Any, once, None)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        refs.set_checked(&ns(), &w, x, RefExpect::Any, once, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_not_owner(
        refs.set_checked(&ns(), &w, y, RefExpect::Any, once, None)
            .await,
        &w,
        x,
        true,
    );
    assert_not_owner(
        refs.delete(&ns(), &w, RefExpect::Any, once).await,
        &w,
        x,
        true,
    );
    assert_eq!(refs.get(&ns(), &w).await.unwrap(), Some(x));
    // The same name's owner (a, by name) may replace it with `Own`.
    assert_eq!(
        refs.set_checked(&ns(), &w, y, RefExpect::Any, a, None)
            .await
            .unwrap(),
        Some(x)
    );
    assert_conflict(
        refs.set_checked(&ns(), &w, y, RefExpect::Absent, once, None)
            .await,
        &w,
        Some(y),
    );
}
