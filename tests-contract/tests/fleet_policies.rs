//! GC policies as fleet state (issue 30, ADR-045), on real PostgreSQL:
//! references protect in every swept namespace, `keep` set on any node
//! wins for every node, a restarted node leaves nothing sweeping behind, a
//! reference set through a node without the policy does not make a `keep`
//! namespace swept, a policy change removes only the changing node's row,
//! and a fleet reference set re-checks its pin under the key's lock.

use std::sync::Arc;
use std::time::Duration;

use store_core::{GcPolicy, Key, Namespace, Store, SweepOptions, SweepReport};
use store_types::{Author, KvEngine, PinProof, RefExpect, RefName};
use tests_contract::data::content;
use tests_contract::fleet::{FleetEnv, FleetLarge};

const WINDOW: Duration = Duration::ZERO;
const TTL: Duration = Duration::from_secs(30);

fn ns(s: &str) -> Namespace {
    Namespace::new(format!("fleet-policies-{s}")).unwrap()
}

fn name(s: &str) -> RefName {
    RefName::new(s).unwrap()
}

/// A fleet node named `owner` with no liveness source.
async fn bare_node(env: &FleetEnv, owner: &str) -> Store {
    let kv: Arc<dyn KvEngine> = Arc::new(env.kv().await);
    env.builder(owner, kv, env.large_engine().await)
        .build()
        .await
        .expect("build fleet node")
}

async fn put(s: &Store, n: &Namespace, seed: u64) -> Key {
    s.put(n, &content(seed, 100)[..])
        .await
        .expect("put")
        .key()
        .clone()
}

/// A sweep; one with nothing to sweep at all ends early
/// (`NoLivenessSources`), which counts as every namespace unswept.
async fn sweep(s: &Store) -> SweepReport {
    let r = s.gc().sweep(SweepOptions::default()).await.expect("sweep");
    assert!(
        matches!(
            r.aborted,
            None | Some(store_core::GcAbortCause::NoLivenessSources)
        ),
        "{r:?}"
    );
    r
}

fn unswept(r: &SweepReport, n: &Namespace) -> bool {
    r.aborted == Some(store_core::GcAbortCause::NoLivenessSources)
        || r.unswept_namespaces.contains(n)
}

/// Two sweeps after every pin row expired (window zero: stage, delete).
async fn two_sweeps(env: &FleetEnv, s: &Store) -> (SweepReport, SweepReport) {
    env.advance(TTL + Duration::from_secs(1)).await;
    (sweep(s).await, sweep(s).await)
}

fn deleted(r: &SweepReport, n: &Namespace) -> u64 {
    r.namespaces.get(n).map_or(0, |c| c.deleted)
}

/// The proof a set holding node `owner`'s current pin on `key` presents:
/// the generation of its pin row (ADR-054), as the facade's pin returns it.
async fn proof<'a>(env: &FleetEnv, key: &Key, owner: &'a str) -> PinProof<'a> {
    let mut c = env.conn().await;
    let generation = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT pin_id FROM \"{}\".gc_pins WHERE ns = $1 AND digest = $2 AND owner = $3",
        env.pg.kv_schema
    )))
    .bind(key.namespace.as_str())
    .bind(&key.digest.as_bytes()[..])
    .bind(owner)
    .fetch_one(&mut c)
    .await
    .expect("a pin row of the owner");
    PinProof { owner, generation }
}

/// Item 1: `keep` plus an application liveness table (the env's
/// `<schema>.refs`, empty) sweeps the namespace; the entry a named
/// reference points at must survive. Before the fix the references table
/// was consulted only where a `refs`/`unreferenced` policy registered it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_protects_under_keep_with_a_liveness_table() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("keep-table");
    let a = env.node("a", &n).await; // registers the application table
    a.set_gc_policy(n.clone(), GcPolicy::Keep).await.unwrap();
    let held = put(&a, &n, 1).await;
    let loose = put(&a, &n, 2).await;
    a.refs()
        .unwrap()
        .set(&n, &name("held"), held.digest, RefExpect::Absent)
        .await
        .unwrap();
    let (_, second) = two_sweeps(&env, &a).await;
    assert_eq!(deleted(&second, &n), 1, "{second:?}");
    assert!(a.has(&held).await.unwrap(), "referenced entry deleted");
    assert!(!a.has(&loose).await.unwrap(), "garbage kept");
}

/// Item 2: `keep` set on one node wins over another node's `refs`: no
/// node sweeps the namespace. Before the fix B's policy registered the
/// references table in the shared database and every node swept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_on_any_node_wins_for_every_node() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("keep-wins");
    let (a, b) = (bare_node(&env, "a").await, bare_node(&env, "b").await);
    b.set_gc_policy(n.clone(), GcPolicy::Refs).await.unwrap();
    a.set_gc_policy(n.clone(), GcPolicy::Keep).await.unwrap();
    let loose = put(&b, &n, 3).await;
    for node in [&a, &b] {
        let (first, _) = two_sweeps(&env, node).await;
        assert!(unswept(&first, &n), "{first:?}");
        assert_eq!(node.effective_gc_policy(&n).await.unwrap(), GcPolicy::Keep);
    }
    assert!(b.has(&loose).await.unwrap(), "swept under keep");
    // A drops its keep (its configuration no longer names the namespace):
    // B's refs is in force again, on every node.
    assert_eq!(a.retain_gc_policies(&[]).await.unwrap(), vec![n.clone()]);
    assert_eq!(a.effective_gc_policy(&n).await.unwrap(), GcPolicy::Refs);
    let (_, second) = two_sweeps(&env, &a).await;
    assert_eq!(deleted(&second, &n), 1, "{second:?}");
}

/// Item 2: a node restarted under its stable name that now says `keep`
/// leaves no registration of its old policy sweeping the namespace (its row
/// is replaced). Before the fix the old instance's registration (under its
/// random owner) stayed in the shared database and kept sweeping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_leaves_nothing_sweeping_behind() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("restart");
    {
        let before = bare_node(&env, "node-1").await;
        before
            .set_gc_policy(n.clone(), GcPolicy::Unreferenced)
            .await
            .unwrap();
    }
    let after = bare_node(&env, "node-1").await;
    after
        .set_gc_policy(n.clone(), GcPolicy::Keep)
        .await
        .unwrap();
    let kept = put(&after, &n, 4).await;
    let (first, _) = two_sweeps(&env, &after).await;
    assert!(unswept(&first, &n), "{first:?}");
    assert!(after.has(&kept).await.unwrap(), "swept under keep");
}

/// Item 2: a reference set through a node that has no policy for a
/// namespace another node keeps does not make it swept anywhere. Before
/// the fix the set registered the references table for the namespace on
/// the setting node, so every node swept the other entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_through_a_node_without_the_policy_keeps_keep() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("keep-then-ref");
    let (a, c) = (bare_node(&env, "a").await, bare_node(&env, "c").await);
    a.set_gc_policy(n.clone(), GcPolicy::Keep).await.unwrap();
    let held = put(&c, &n, 5).await;
    let other = put(&c, &n, 6).await;
    let out = c
        .refs()
        .unwrap()
        .set_with(
            &n,
            &name("held"),
            held.digest,
            RefExpect::Absent,
            store_core::SetRefOptions::default(),
        )
        .await
        .unwrap();
    assert!(!out.adopted, "keep is in force: nothing switched");
    for node in [&a, &c] {
        let (first, _) = two_sweeps(&env, node).await;
        assert!(unswept(&first, &n), "{first:?}");
    }
    assert!(
        c.has(&other).await.unwrap(),
        "unreferenced entry swept under keep"
    );
    // Without the keep, the mark the reference left is the implicit refs.
    a.retain_gc_policies(&[]).await.unwrap();
    assert_eq!(c.effective_gc_policy(&n).await.unwrap(), GcPolicy::Refs);
    let (_, second) = two_sweeps(&env, &a).await;
    assert_eq!(deleted(&second, &n), 1, "{second:?}");
    assert!(a.has(&held).await.unwrap() && !a.has(&other).await.unwrap());
}

/// Item 3: a policy change on node B replaces B's row only; node A's row
/// stays and keeps its entries collected — and its referenced entries
/// protected — after B goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_touches_only_the_changing_nodes_row() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("own-row");
    let (a, b) = (bare_node(&env, "a").await, bare_node(&env, "b").await);
    a.set_gc_policy(n.clone(), GcPolicy::Refs).await.unwrap();
    b.set_gc_policy(n.clone(), GcPolicy::Unreferenced)
        .await
        .unwrap();
    b.set_gc_policy(n.clone(), GcPolicy::Refs).await.unwrap();
    let rows = |owner: &'static str| {
        let env = &env;
        let n = n.clone();
        async move {
            let mut c = env.conn().await;
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
                "SELECT policy FROM \"{}\".gc_policies WHERE ns = $1 AND owner = $2",
                env.pg.kv_schema
            )))
            .bind(n.as_str())
            .bind(owner)
            .fetch_all(&mut c)
            .await
            .unwrap()
        }
    };
    assert_eq!(rows("a").await, ["refs"]);
    assert_eq!(rows("b").await, ["refs"]);
    assert_eq!(b.retain_gc_policies(&[]).await.unwrap(), vec![n.clone()]);
    assert!(rows("b").await.is_empty());
    assert_eq!(rows("a").await, ["refs"], "A's row went with B's change");
    let held = put(&a, &n, 7).await;
    let loose = put(&a, &n, 8).await;
    a.refs()
        .unwrap()
        .set(&n, &name("held"), held.digest, RefExpect::Absent)
        .await
        .unwrap();
    let (_, second) = two_sweeps(&env, &a).await;
    assert_eq!(deleted(&second, &n), 1, "{second:?}");
    assert!(a.has(&held).await.unwrap() && !a.has(&loose).await.unwrap());
}

/// Item 6: a fleet reference write re-checks, in its transaction and under
/// the key's lock, that the setting node's pin still holds: a set delayed
/// past the pin TTL — after a sweep deleted the entry — fails and writes
/// nothing, where it used to return Ok for a deleted entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_set_delayed_past_its_pin_fails() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("late-set");
    let a = bare_node(&env, "a").await;
    a.set_gc_policy(n.clone(), GcPolicy::Unreferenced)
        .await
        .unwrap();
    let key = put(&a, &n, 9).await;
    // The facade's pin of a set: a pin row of node A's.
    let pin = a.gc().pin(&key).await.unwrap().expect("present");
    let a_pin = proof(&env, &key, "a").await;
    let backend = env.kv().await.refs().unwrap();
    // While the pin row holds, the guarded write commits.
    backend
        .set_checked(
            &n,
            &name("early"),
            key.digest,
            RefExpect::Any,
            Author::LIBRARY,
            Some(a_pin),
        )
        .await
        .expect("pinned set");
    backend
        .delete(&n, &name("early"), RefExpect::Any, Author::LIBRARY)
        .await
        .unwrap();
    // The set stalls past the TTL; the in-process pin is gone too (a
    // delayed write on another connection), and a sweep deletes the entry.
    drop(pin);
    let (_, second) = two_sweeps(&env, &a).await;
    assert_eq!(deleted(&second, &n), 1, "{second:?}");
    assert!(!a.has(&key).await.unwrap());
    let late = backend
        .set_checked(
            &n,
            &name("late"),
            key.digest,
            RefExpect::Any,
            Author::LIBRARY,
            Some(a_pin),
        )
        .await;
    assert!(late.is_err(), "a delayed set must not name a deleted entry");
    assert_eq!(backend.get(&n, &name("late")).await.unwrap(), None);
    // Another node's pin does not vouch for A's write (A's put pin
    // expires first).
    let key = put(&a, &n, 10).await;
    let a_put_pin = proof(&env, &key, "a").await;
    env.advance(TTL + Duration::from_secs(1)).await;
    let _b_pin = bare_node(&env, "b").await.gc().pin(&key).await.unwrap();
    assert!(backend
        .set_checked(
            &n,
            &name("other"),
            key.digest,
            RefExpect::Any,
            Author::LIBRARY,
            Some(a_put_pin),
        )
        .await
        .is_err());
}

/// Issue 39 ("data loss, fleet"), ADR-054: node A's set pinned the entry
/// and stalled; its pin row expired and node B's sweep deleted the entry;
/// A's retry pinned the key again — the same (key, owner) row, unexpired
/// once more — and found the entry missing. The stalled first set must
/// still fail: the retry's pin does not prove that the first set's pin
/// held. (The guard used to accept any unexpired row of the owner, and
/// the stalled set committed a reference to the deleted entry.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_set_is_not_vouched_for_by_a_retrys_pin() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("stalled-set");
    let a = bare_node(&env, "a").await;
    let b = bare_node(&env, "b").await;
    b.set_gc_policy(n.clone(), GcPolicy::Unreferenced)
        .await
        .unwrap();
    let key = put(&a, &n, 12).await;
    // The first set's pin, held (in A's process) while its write stalls.
    let _first_pin = a.gc().pin(&key).await.unwrap().expect("present");
    let first = proof(&env, &key, "a").await;
    // The pin row expires; B's sweep finds the entry unprotected.
    let (_, second) = two_sweeps(&env, &b).await;
    assert_eq!(deleted(&second, &n), 1, "{second:?}");
    assert!(!a.has(&key).await.unwrap());
    // A's retry pins again and finds the entry missing.
    assert!(a.gc().pin(&key).await.unwrap().is_none());
    let retry = proof(&env, &key, "a").await;
    assert_ne!(retry.generation, first.generation);
    // The stalled first set runs now, with its own pin's proof.
    let backend = env.kv().await.refs().unwrap();
    let stalled = backend
        .set_checked(
            &n,
            &name("stalled"),
            key.digest,
            RefExpect::Any,
            Author::LIBRARY,
            Some(first),
        )
        .await;
    assert!(
        stalled.is_err(),
        "a set whose pin lapsed must not name a deleted entry: {stalled:?}"
    );
    assert_eq!(backend.get(&n, &name("stalled")).await.unwrap(), None);
}

/// Item 6: a key fenced for deletion refuses a guarded set even while
/// the setting node's pin row is unexpired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_set_on_a_fenced_key_fails() {
    let env = FleetEnv::new(FleetLarge::None, WINDOW, TTL).await;
    let n = ns("fenced");
    let a = bare_node(&env, "a").await;
    let key = put(&a, &n, 11).await;
    let _pin = a.gc().pin(&key).await.unwrap().expect("present");
    let a_pin = proof(&env, &key, "a").await;
    let mut c = env.conn().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".gc_deleting (ns, digest, fenced_at) VALUES ($1, $2, 0)",
        env.pg.kv_schema
    )))
    .bind(n.as_str())
    .bind(&key.digest.as_bytes()[..])
    .execute(&mut c)
    .await
    .unwrap();
    let backend = env.kv().await.refs().unwrap();
    assert!(backend
        .set_checked(
            &n,
            &name("x"),
            key.digest,
            RefExpect::Any,
            Author::LIBRARY,
            Some(a_pin),
        )
        .await
        .is_err());
    assert_eq!(backend.get(&n, &name("x")).await.unwrap(), None);
}
