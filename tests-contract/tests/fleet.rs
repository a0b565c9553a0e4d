//! Fleet mode on real PostgreSQL: the construction matrix, several
//! instances (and processes) over one schema, crash windows by fault
//! injection, renewal, and the GC model on a two-instance fleet.

#[path = "fleet_support/faults.rs"]
mod faults;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use store_core::{Error, GcAbortCause, Key, Mode, ProtectCallback, Store, SweepOptions};
use store_local::{LocalEngine, LocalOptions};
use store_mem::MemEngine;
use store_object::s3_testing::TestBucket;
use store_object::{ObjectEngine, ObjectOptions};
use store_pglo::PgLoEngine;
use store_sqlite::{SqliteEngine, SqliteOptions};
use store_types::{Digest, KvEngine};
use tests_contract::data::content;
use tests_contract::fleet::{FleetEnv, FleetLarge, SkewedClock};
use tests_contract::ns_named;
use tests_contract::{ObjectBackend, THRESHOLD};
use tokio::sync::Notify;

/// This file's namespace (the `fleet-sweeper` binary uses it too).
const NS: &str = "fleet";

const MIN: Duration = Duration::from_secs(60);

async fn sweep(s: &Store) -> store_core::SweepReport {
    s.gc().sweep(SweepOptions::default()).await.expect("sweep")
}

fn config_err(res: Result<Store, Error>, clause: &str) {
    match res {
        Err(Error::Config(msg)) => assert!(msg.contains(clause), "{msg:?} should say {clause:?}"),
        other => panic!("expected Config({clause:?}), got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn construction_matrix() {
    let env = FleetEnv::new(FleetLarge::None, MIN, MIN).await;
    let pg = || async { Arc::new(env.kv().await) as Arc<dyn KvEngine> };
    let shared = LocalOptions {
        shared_media: true,
        fsync: true,
        ..LocalOptions::default()
    };
    let unshared = LocalOptions {
        shared_media: false,
        fsync: true,
        ..LocalOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();

    // Valid: kv-only, same-database pg-lo, declared shared local.
    env.builder("a", pg().await, None)
        .build()
        .await
        .expect("kv-only postgres fleet");
    let lo = PgLoEngine::connect(&env.pg.url, &env.pg.lo_schema)
        .await
        .unwrap();
    env.builder("b", pg().await, Some(Arc::new(lo)))
        .build()
        .await
        .expect("postgres + pg-lo");
    let local = LocalEngine::open(dir.path().join("s"), shared)
        .await
        .unwrap();
    env.builder("c", pg().await, Some(Arc::new(local)))
        .build()
        .await
        .expect("postgres + shared local");
    // An object store is shared by nature (ADR-019): valid, no declaration.
    let bucket = TestBucket::create().await;
    let object = bucket.engine("matrix", ObjectBackend::S3.options()).await;
    env.builder("l", pg().await, Some(Arc::new(object)))
        .build()
        .await
        .expect("postgres + object store (S3)");

    // Invalid, each with its own clause.
    let sqlite = SqliteEngine::open(dir.path().join("kv.sqlite"), SqliteOptions::default())
        .await
        .unwrap();
    config_err(
        env.builder("d", Arc::new(sqlite), None).build().await,
        "hosts fleet GC state",
    );
    config_err(
        env.builder("e", Arc::new(MemEngine::new()), None)
            .build()
            .await,
        "in-memory engine `mem` as the kv tier",
    );
    config_err(
        env.builder("f", Arc::new(MemEngine::new()), None)
            .mode(Mode::MemOnly)
            .build()
            .await,
        "in-memory engine `mem` as the kv tier",
    );
    config_err(
        env.builder("g", pg().await, Some(Arc::new(MemEngine::new())))
            .build()
            .await,
        "in-memory engine `mem` as the large tier",
    );
    let local = LocalEngine::open(dir.path().join("u"), unshared)
        .await
        .unwrap();
    config_err(
        env.builder("h", pg().await, Some(Arc::new(local)))
            .build()
            .await,
        "declared on shared media",
    );
    // ... but not an in-process object store, nor an undeclared directory.
    let in_memory = ObjectEngine::from_url("memory://", ObjectOptions::default())
        .await
        .unwrap();
    config_err(
        env.builder("m", pg().await, Some(Arc::new(in_memory)))
            .build()
            .await,
        "in-memory engine `object` as the large tier",
    );
    let file_url = format!("file://{}", dir.path().join("objects").display());
    let file = ObjectEngine::from_url(&file_url, ObjectOptions::default())
        .await
        .unwrap();
    config_err(
        env.builder("n", pg().await, Some(Arc::new(file)))
            .build()
            .await,
        "declared on shared media",
    );
    config_err(
        env.builder("i", pg().await, None)
            .pin_ttl(Duration::ZERO)
            .build()
            .await,
        "pin_ttl",
    );

    // pg-lo on another database: invalid with fleet, valid without.
    let other_db = format!("bp_other_{:016x}", rand::random::<u64>());
    let mut c = env.conn().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {other_db}")))
        .execute(&mut c)
        .await
        .unwrap();
    let other_url = match env.pg.url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{other_db}"),
        None => panic!("DATABASE_URL needs a database name"),
    };
    {
        let lo = Arc::new(PgLoEngine::connect(&other_url, "bp_lo").await.unwrap());
        config_err(
            env.builder("j", pg().await, Some(lo.clone())).build().await,
            "same PostgreSQL instance and database",
        );
        env.builder("k", pg().await, Some(lo.clone()))
            .fleet(false)
            .build()
            .await
            .expect("cross-database pg-lo is valid without fleet");
        lo.pool().close().await;
    }
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {other_db} WITH (FORCE)"
    )))
    .execute(&mut c)
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_registration_forms() {
    let env = FleetEnv::new(FleetLarge::None, MIN, MIN).await;
    let node = env.node("a", &ns_named(NS)).await;
    struct Never;
    #[async_trait]
    impl store_core::LivenessSource for Never {
        async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>, store_types::Error> {
            Ok(vec![false; keys.len()])
        }
    }
    assert!(matches!(
        node.gc().register_liveness_source(ns_named(NS), Arc::new(Never)).await,
        Err(Error::Config(m)) if m.contains("in-process callbacks")
    ));
    let missing = store_core::LivenessTable::new(&env.pg.kv_schema, "no_such_table", "digest");
    assert!(matches!(
        node.gc()
            .register_liveness_source(ns_named(NS), missing)
            .await,
        Err(Error::Config(_))
    ));
    let bad_col = store_core::LivenessTable::new(&env.pg.kv_schema, "refs", "nope");
    assert!(matches!(
        node.gc()
            .register_liveness_source(ns_named(NS), bad_col)
            .await,
        Err(Error::Config(_))
    ));
    // The table form is refused by a non-fleet store.
    let plain = Store::builder().kv(MemEngine::new()).build().await.unwrap();
    assert!(matches!(
        plain
            .gc()
            .register_liveness_source(ns_named(NS), env.refs())
            .await,
        Err(Error::Config(_))
    ));
}

/// A protect callback that parks the sweep holding the lock.
struct Park(Arc<(Notify, Notify)>);

#[async_trait]
impl ProtectCallback for Park {
    async fn protected_keys(&self) -> Result<Vec<Key>, store_types::Error> {
        self.0 .0.notify_one();
        self.0 .1.notified().await;
        Ok(Vec::new())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sweeps_exactly_one_runs() {
    let env = FleetEnv::new(FleetLarge::PgLo, Duration::ZERO, MIN).await;
    let nodes = [
        env.node("a", &ns_named(NS)).await,
        env.node("b", &ns_named(NS)).await,
        env.node("c", &ns_named(NS)).await,
    ];
    drop(nodes[0].put(&ns_named(NS), &b"x"[..]).await.unwrap());
    let gate = Arc::new((Notify::new(), Notify::new()));
    nodes[0]
        .gc()
        .set_protect(Some(Arc::new(Park(gate.clone()))));
    let a = nodes[0].clone();
    let first = tokio::spawn(async move { a.gc().sweep(SweepOptions::default()).await });
    gate.0.notified().await; // node a holds the fleet lock
    for n in &nodes[1..] {
        let r = sweep(n).await;
        assert_eq!(r.aborted, Some(GcAbortCause::SweeperLock));
        assert_eq!(r.total, Default::default());
    }
    gate.1.notify_one();
    let r = first.await.unwrap().unwrap();
    assert_eq!(r.aborted, None);
    nodes[0].gc().set_protect(None);
    // The lock is free again for any node.
    assert_eq!(sweep(&nodes[2]).await.aborted, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_exactly_one_sweeps() {
    let env = FleetEnv::new(FleetLarge::None, MIN, MIN).await;
    drop(env.node("setup", &ns_named(NS)).await); // creates tables
    let bin = env!("CARGO_BIN_EXE_fleet-sweeper");
    let spawn = || {
        std::process::Command::new(bin)
            .args([&env.pg.url, &env.pg.kv_schema, "3000"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn fleet-sweeper")
    };
    let p1 = spawn();
    let p2 = spawn();
    let out = |p: std::process::Child| {
        let o = p.wait_with_output().unwrap();
        assert!(o.status.success(), "fleet-sweeper failed");
        String::from_utf8(o.stdout).unwrap()
    };
    let (o1, o2) = (out(p1), out(p2));
    let mut results: Vec<&str> = [&o1, &o2]
        .iter()
        .map(|o| {
            o.lines()
                .find(|l| l.starts_with("aborted="))
                .expect("result line")
        })
        .collect();
    results.sort();
    assert_eq!(
        results,
        vec!["aborted=SweeperLock", "aborted=none"],
        "{o1}\n{o2}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interleaved_puts_and_sweeps_never_lose_protected_entries() {
    for large in [FleetLarge::SharedLocal, FleetLarge::PgLo] {
        interleaved_puts_and_sweeps(large).await;
    }
}

/// Two nodes over postgres (kv, pins, sweep lock) + one S3 bucket (large
/// tier, pin row first, then the publishing copy): the invariant holds
/// under interleaved puts and sweeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_fleet_interleaved_puts_and_sweeps() {
    interleaved_puts_and_sweeps(FleetLarge::Object).await;
}

/// Two nodes putting one large blob at once through the shared bucket:
/// all puts succeed, one entry with the right bytes, a pin row per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn object_store_fleet_racing_puts_of_one_blob() {
    let env = FleetEnv::new(FleetLarge::Object, MIN, MIN).await;
    let (a, b) = (
        env.node("a", &ns_named(NS)).await,
        env.node("b", &ns_named(NS)).await,
    );
    for round in 0..4u64 {
        let data = Arc::new(content(200 + round, THRESHOLD as usize * 5));
        let puts = [a.clone(), b.clone(), a.clone(), b.clone()].map(|n| {
            let data = data.clone();
            tokio::spawn(async move { n.put(&ns_named(NS), &data[..]).await })
        });
        let mut fresh = 0;
        let mut key = None;
        for p in puts {
            let r = p.await.unwrap().unwrap();
            fresh += usize::from(!r.deduplicated);
            key = Some(r.key().clone());
        }
        let key = key.unwrap();
        // At most one write per node (each serialises its publishes of a
        // key); across nodes the server's conditional write decides — one
        // on S3, occasionally two on moto, whose If-None-Match check on
        // CompleteMultipartUpload is not atomic. Every put succeeds and
        // there is one entry either way.
        assert!((1..=2).contains(&fresh), "round {round}: {fresh} writes");
        assert_eq!(env.pin_rows(&key).await, 2, "one pin row per node");
        let got = b.get(&key).await.unwrap().unwrap().bytes().await.unwrap();
        assert_eq!(got, &data[..]);
    }
    let engine = env.object_engine().await;
    assert_eq!(engine.stage_object_count().await.unwrap(), 0);
}

async fn interleaved_puts_and_sweeps(large: FleetLarge) {
    let ttl = Duration::from_secs(30);
    let env = FleetEnv::new(large, Duration::ZERO, ttl).await;
    let (a, b) = (
        env.node("a", &ns_named(NS)).await,
        env.node("b", &ns_named(NS)).await,
    );
    let items: Vec<Vec<u8>> = (0..6)
        .map(|i| {
            content(
                70 + i,
                if i % 2 == 0 {
                    100
                } else {
                    THRESHOLD as usize * 3
                },
            )
        })
        .collect();
    let keys: Vec<Key> = items
        .iter()
        .map(|d| Key::new(ns_named(NS), Digest::of(d)))
        .collect();
    let mut pinned_until = [0i64; 6];
    let mut referenced = [false; 6];
    let mut known_present = [false; 6];
    let mut rng: u64 = 0x5EED_0001;
    for step in 0..60 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let i = (rng % 6) as usize;
        let now = || env.clock_now();
        match (rng >> 8) % 5 {
            0 | 1 => {
                let node = if rng & 1 == 0 { &a } else { &b };
                drop(node.put(&ns_named(NS), &items[i][..]).await.unwrap());
                pinned_until[i] = now() + ttl.as_millis() as i64;
            }
            2 => {
                referenced[i] = !referenced[i];
                env.set_ref(&keys[i], referenced[i]).await;
            }
            3 => env.advance(Duration::from_secs(rng % 20)).await,
            _ => {
                let sweeper = if rng & 2 == 0 { &b } else { &a };
                assert_eq!(sweep(sweeper).await.aborted, None);
            }
        }
        for j in 0..6 {
            let present = a.has(&keys[j]).await.unwrap();
            assert_eq!(present, b.has(&keys[j]).await.unwrap(), "nodes agree");
            if known_present[j] && (pinned_until[j] > now() || referenced[j]) {
                assert!(present, "step {step}: protected item {j} lost");
            }
            known_present[j] = present;
        }
    }
    // Unreferenced entries go by the second sweep past pin expiry.
    for (j, k) in keys.iter().enumerate() {
        if referenced[j] {
            env.set_ref(k, false).await;
        }
    }
    env.advance(ttl + Duration::from_secs(1)).await;
    sweep(&b).await;
    sweep(&a).await;
    for k in &keys {
        assert!(!a.has(k).await.unwrap(), "{k} should be collected");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_entries_and_expired_pins_need_a_re_put() {
    let ttl = Duration::from_secs(60);
    let env = FleetEnv::new(FleetLarge::SharedLocal, Duration::ZERO, ttl).await;
    let (a, b) = (
        env.node("a", &ns_named(NS)).await,
        env.node("b", &ns_named(NS)).await,
    );
    let data = content(80, THRESHOLD as usize * 2);
    let r = a.put(&ns_named(NS), &data[..]).await.unwrap();
    let key = r.key().clone();
    drop(r);
    env.advance(Duration::from_secs(40)).await;
    assert!(
        a.gc().renew_pin(&key).await.unwrap(),
        "renewal before expiry"
    );
    assert!(
        !b.gc().renew_pin(&key).await.unwrap(),
        "node b owns no row for this key"
    );
    env.advance(Duration::from_secs(40)).await; // 80 s after the put, 40 after renewal
    sweep(&b).await;
    sweep(&b).await;
    assert!(a.has(&key).await.unwrap(), "renewed pin keeps the entry");
    env.advance(Duration::from_secs(30)).await; // the renewed row expired
    assert!(
        !a.gc().renew_pin(&key).await.unwrap(),
        "an expired row is not revived"
    );
    sweep(&b).await;
    sweep(&b).await;
    assert!(!a.has(&key).await.unwrap(), "unpinned, unreferenced: swept");
    // The backstop: re-put restores it (and pins it again).
    let again = a.put(&ns_named(NS), &data[..]).await.unwrap();
    assert!(!again.deduplicated);
    assert!(a.has(&key).await.unwrap());
    assert_eq!(env.pin_rows(&key).await, 1);
}

/// A node whose clock is `skew_ms` off the fleet's shared clock.
async fn skewed_node(env: &FleetEnv, owner: &str, skew_ms: i64) -> Store {
    let clock = SkewedClock::new(env.clock.clone(), skew_ms);
    env.node_with_clock(owner, &ns_named(NS), Arc::new(clock))
        .await
}

const SIX_HOURS_MS: i64 = 6 * 3600 * 1000;

/// Issue 11, item 5: a pin row lives `pin_ttl` by the database's clock,
/// whatever the putter's and the sweeper's clocks say. A putter 6 h behind
/// used to write rows born expired (with window 0 the entry went at once);
/// one 6 h ahead, rows that outlived their TTL by 6 h.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_expiry_ignores_a_skewed_putter_clock() {
    for skew_ms in [SIX_HOURS_MS, -SIX_HOURS_MS] {
        let ttl = MIN;
        let env = FleetEnv::new(FleetLarge::PgLo, Duration::ZERO, ttl).await;
        let a = skewed_node(&env, "a", skew_ms).await;
        let b = env.node("b", &ns_named(NS)).await;
        // One kv entry (put_pinned), one large object (joint publish).
        let mut receipts = Vec::new();
        for (seed, len) in [(110, 100), (111, THRESHOLD as usize * 2)] {
            let data = content(seed + skew_ms.unsigned_abs() % 7, len);
            receipts.push(a.put(&ns_named(NS), &data[..]).await.unwrap());
        }
        let keys: Vec<Key> = receipts.iter().map(|r| r.key().clone()).collect();
        let present = |n: &'static str| {
            let (b, keys) = (&b, &keys);
            async move {
                for k in keys {
                    assert!(b.has(k).await.unwrap(), "skew {skew_ms} ms, {n}: {k} lost");
                }
            }
        };
        for _ in 0..2 {
            assert_eq!(sweep(&b).await.aborted, None);
        }
        present("pinned, two sweeps").await;
        // Only the database's clock moves: the nodes' clocks do not matter.
        env.advance_db_clock(ttl - Duration::from_secs(1)).await;
        for _ in 0..2 {
            sweep(&b).await;
        }
        present("a second before the TTL").await;
        env.advance_db_clock(Duration::from_secs(2)).await;
        drop(receipts);
        let mut deleted = 0;
        for _ in 0..2 {
            deleted += sweep(&b).await.total.deleted;
        }
        assert_eq!(deleted, 2, "skew {skew_ms} ms: collected after the TTL");
        for k in &keys {
            assert!(!a.has(k).await.unwrap(), "skew {skew_ms} ms: {k} collected");
        }
    }
}

/// The window is judged by the database's clock too: a candidate is due
/// exactly `window` after it was staged by that clock, whichever node
/// (right or 6 h off either way) staged it and whichever executes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_ignores_skewed_node_clocks() {
    for skew_ms in [SIX_HOURS_MS, -SIX_HOURS_MS] {
        for skewed_stages in [true, false] {
            window_case(skew_ms, skewed_stages).await;
        }
    }
}

async fn window_case(skew_ms: i64, skewed_stages: bool) {
    let (window, ttl) = (MIN, Duration::from_secs(1));
    let env = FleetEnv::new(FleetLarge::None, window, ttl).await;
    let skewed = skewed_node(&env, "skewed", skew_ms).await;
    let right = env.node("right", &ns_named(NS)).await;
    let (stager, executor) = if skewed_stages {
        (&skewed, &right)
    } else {
        (&right, &skewed)
    };
    let at = format!("skew {skew_ms} ms, skewed node stages: {skewed_stages}");
    let data = content(120, 100);
    let key = stager
        .put(&ns_named(NS), &data[..])
        .await
        .unwrap()
        .key()
        .clone();
    env.advance(ttl + Duration::from_secs(1)).await; // the pin row expired
    assert_eq!(sweep(stager).await.total.staged, 1, "{at}: staged");
    for n in [executor, stager] {
        assert_eq!(sweep(n).await.total.deleted, 0, "{at}: due at once");
    }
    env.advance(window - Duration::from_secs(1)).await;
    for n in [executor, stager] {
        assert_eq!(sweep(n).await.total.deleted, 0, "{at}: due early");
    }
    assert!(right.has(&key).await.unwrap(), "{at}");
    env.advance(Duration::from_secs(1)).await;
    assert_eq!(sweep(executor).await.total.deleted, 1, "{at}: due on time");
    assert!(!right.has(&key).await.unwrap(), "{at}");
}

#[test]
fn fleet_gc_model_two_instances() {
    faults::run_fleet_model();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_pin_commit_and_rename() {
    faults::crash_between_pin_and_rename().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_between_stage_write_and_pin_commit() {
    faults::crash_between_stage_and_pin().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_inside_the_joint_transaction() {
    faults::fault_inside_joint_transaction().await;
}

/// Outboards on every fleet-valid large tier (ADR-032): an entry one node
/// put carries its outboard for every node — another node's engine reads
/// the very outboard bao-tree computes, and that node's range reads verify
/// with it (a flip inside the covering groups fails, one outside does not
/// matter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outboards_are_shared_by_the_fleet() {
    for large in [
        FleetLarge::SharedLocal,
        FleetLarge::Object,
        FleetLarge::PgLo,
    ] {
        let env = FleetEnv::new(large, MIN, MIN).await;
        let (a, b) = (
            env.node("a", &ns_named(NS)).await,
            env.node("b", &ns_named(NS)).await,
        );
        // Over 1 MiB, so that an outboard is kept (TUNING.md §small-outboards).
        let data = content(300, 70 * 16_384 + 5);
        let key = a.put(&ns_named(NS), &data[..]).await.unwrap().key().clone();
        let want = store_types::outboard::compute(&data).1;
        let engine = env.large_engine().await.expect("a large tier");
        assert_eq!(
            engine.read_outboard(&key).await.unwrap(),
            Some(want),
            "{large:?}: the outboard is published with the entry, for every node"
        );
        let range = b.read_range(&key, 50_000..60_000).await.unwrap();
        assert_eq!(&range.bytes().await.unwrap()[..], &data[50_000..60_000]);
    }
}
