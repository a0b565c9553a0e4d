//! The instance lock (issue 11, item 4): a non-fleet store holds its data
//! exclusively, so a second, undeclared instance on the same data — which
//! could not see the first one's in-process pins — fails to build, naming
//! the holder. Fleet members are declared and do not lock.

use std::sync::Arc;
use std::time::Duration;

use store_core::{Error, Mode, Store};
use store_local::{LocalEngine, LocalOptions};
use store_mem::MemEngine;
use store_pglo::PgLoEngine;
use store_postgres::PostgresEngine;
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{KvEngine, LargeEngine};
use tests_contract::fleet::{FleetEnv, FleetLarge};
use tests_contract::pg::PgSchemas;
use tests_contract::{ns, THRESHOLD};

const MIN: Duration = Duration::from_secs(60);

/// Fresh engines on `dir`'s `kv.sqlite` and `large/`, as a new process
/// (or a second store in this one) would open them.
async fn sqlite_local(dir: &std::path::Path) -> (Arc<dyn KvEngine>, Arc<dyn LargeEngine>) {
    let kv = SqliteEngine::open(dir.join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    let large = LocalEngine::open(dir.join("large"), LocalOptions::default())
        .await
        .unwrap();
    (Arc::new(kv), Arc::new(large))
}

async fn build(kv: Arc<dyn KvEngine>, large: Option<Arc<dyn LargeEngine>>) -> Result<Store, Error> {
    let mut b = Store::builder().kv_shared(kv);
    if let Some(l) = large {
        b = b.large_shared(l).mode(Mode::DualTier {
            threshold: THRESHOLD,
        });
    }
    b.build().await
}

/// Asserts `r` is `InstanceLocked` on a resource containing `resource`,
/// held by this process (`this_process`, e.g. `pid 1234 on host a`).
#[track_caller]
fn locked_by_us(r: Result<Store, Error>, resource: &str, this_process: &str) {
    match r {
        Err(e @ Error::InstanceLocked { .. }) => {
            let Error::InstanceLocked {
                resource: ref res,
                ref holder,
            } = e
            else {
                unreachable!()
            };
            assert!(res.contains(resource), "{res:?} should name {resource:?}");
            assert!(
                holder.contains(this_process),
                "{holder:?} should name {this_process:?}"
            );
            let text = e.to_string();
            assert!(
                text.contains("is in use by another Blobpool instance"),
                "{text}"
            );
        }
        other => panic!("expected InstanceLocked on {resource}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_non_fleet_sqlite_local_store_is_refused_until_the_first_drops() {
    let dir = tempfile::tempdir().unwrap();
    let me = format!("pid {} ", std::process::id());
    let (kv, large) = sqlite_local(dir.path()).await;
    let first = build(kv, Some(large)).await.expect("first store");
    let key = first
        .put(&ns(), &b"held by the first store"[..])
        .await
        .unwrap()
        .key()
        .clone();

    // The same data again: the kv file is locked first.
    let (kv, large) = sqlite_local(dir.path()).await;
    locked_by_us(build(kv, Some(large)).await, "kv.sqlite", &me);
    // Another kv tier on the same large root: the root is locked too.
    locked_by_us(
        build(
            Arc::new(MemEngine::new()),
            Some(sqlite_local(dir.path()).await.1),
        )
        .await,
        "local large tier",
        &me,
    );
    // A clone keeps the lock; the last drop releases it.
    let clone = first.clone();
    drop(first);
    let (kv, large) = sqlite_local(dir.path()).await;
    locked_by_us(build(kv, Some(large)).await, "kv.sqlite", &me);
    drop(clone);

    let (kv, large) = sqlite_local(dir.path()).await;
    let again = build(kv, Some(large))
        .await
        .expect("the lock is released with the last clone");
    assert!(again.has(&key).await.unwrap());
    // The lock files stay (never deleted).
    assert!(dir.path().join("kv.sqlite.lock").is_file());
    assert!(dir.path().join("large/.blobpool.lock").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_engine_shared_by_two_non_fleet_stores_is_refused() {
    // Sharing one engine value between two stores is the same mistake:
    // each store would keep its own pins and delete what the other pins.
    let dir = tempfile::tempdir().unwrap();
    let (kv, large) = sqlite_local(dir.path()).await;
    let _first = build(kv.clone(), Some(large.clone())).await.unwrap();
    locked_by_us(
        build(kv, Some(large)).await,
        "kv.sqlite",
        &format!("pid {} ", std::process::id()),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_non_fleet_postgres_store_is_refused_until_the_first_drops() {
    let pg = PgSchemas::create().await;
    let me = format!("blobpool pid {} ", std::process::id());
    let kv = || async {
        Arc::new(
            PostgresEngine::connect(&pg.url, &pg.kv_schema)
                .await
                .unwrap(),
        ) as Arc<dyn KvEngine>
    };
    let lo = || async {
        Arc::new(PgLoEngine::connect(&pg.url, &pg.kv_schema).await.unwrap()) as Arc<dyn LargeEngine>
    };
    // postgres + pg-lo in ONE schema: each engine has its own lock id, so
    // one store takes both.
    let first = build(kv().await, Some(lo().await))
        .await
        .expect("postgres + pg-lo on one schema");
    let key = first
        .put(&ns(), &b"held by the first store"[..])
        .await
        .unwrap()
        .key()
        .clone();
    locked_by_us(
        build(kv().await, None).await,
        &format!("PostgreSQL schema {}", pg.kv_schema),
        &me,
    );
    locked_by_us(
        build(Arc::new(MemEngine::new()), Some(lo().await)).await,
        &format!("large-object tier in schema {}", pg.kv_schema),
        &me,
    );
    // Another schema of the same database is other data.
    let other = build(
        Arc::new(
            PostgresEngine::connect(&pg.url, &pg.lo_schema)
                .await
                .unwrap(),
        ),
        None,
    )
    .await
    .expect("another schema is not locked");
    drop(other);

    drop(first);
    let again = build(kv().await, Some(lo().await))
        .await
        .expect("released when the first store dropped");
    assert!(again.has(&key).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_members_on_one_schema_and_directory_do_not_lock() {
    let env = FleetEnv::new(FleetLarge::SharedLocal, MIN, MIN).await;
    let a = env.node("a", &ns()).await;
    let b = env.node("b", &ns()).await;
    let put = a
        .put(&ns(), &vec![7u8; THRESHOLD as usize + 1][..])
        .await
        .unwrap();
    assert!(b.has(put.key()).await.unwrap());
    // Declared members never take the instance lock.
    assert!(!env.dir.path().join(".blobpool.lock").exists());
    let c = env.node("c", &ns()).await;
    assert!(c.has(put.key()).await.unwrap());
}
