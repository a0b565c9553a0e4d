//! The GC protocol on one node (issue 3): aborts, exact-count scenarios,
//! direct-delete refusals, restart durability and concurrency.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use store_core::{Error, GcAbortCause, Key, Mode, Pin, SweepOptions, SweepReport};
use store_types::{Digest, Namespace, ProtectReason};
use tokio::sync::Notify;

use crate::data::content;
use crate::harness::{ns, Harness, Opts, Spec, THRESHOLD};
use crate::support::{LiveSet, Protector};

async fn sweep(h: &Harness) -> SweepReport {
    h.store
        .gc()
        .sweep(SweepOptions::default())
        .await
        .expect("sweep")
}

/// Size of a scenario blob: "big" blobs go to the large tier where the
/// mode has one.
fn size_of(h: &Harness, big: bool) -> usize {
    match (big, h.spec.mode()) {
        (true, Mode::DualTier { .. } | Mode::MemOnly) => THRESHOLD as usize * 2 + 7,
        (true, Mode::KvOnly { .. }) => THRESHOLD as usize,
        (false, _) => 321,
    }
}

/// Zero registered sources: the sweep aborts and deletes nothing, even
/// due candidates.
pub async fn sweep_without_sources_aborts(spec: Spec) {
    let h = Harness::open_with(
        spec,
        Opts {
            window: Duration::ZERO,
        },
    )
    .await;
    let r = h.store.put(&ns(), &b"orphan"[..]).await.unwrap();
    let key = r.key().clone();
    drop(r);
    let live = LiveSet::new();
    let id = h
        .store
        .gc()
        .register_liveness_source(ns(), Arc::new(live))
        .await
        .unwrap();
    assert_eq!(sweep(&h).await.total.staged, 1);
    assert!(h.store.gc().deregister_liveness_source(id).await.unwrap());
    assert!(!h.store.gc().deregister_liveness_source(id).await.unwrap());
    let rep = sweep(&h).await;
    assert_eq!(rep.aborted, Some(GcAbortCause::NoLivenessSources));
    assert_eq!(rep.total, Default::default());
    assert!(h.store.has(&key).await.unwrap());
}

/// A namespace without a source is never swept, while others are.
pub async fn namespace_without_source_never_swept(spec: Spec) {
    let h = Harness::open_with(
        spec,
        Opts {
            window: Duration::ZERO,
        },
    )
    .await;
    let other = Namespace::new("unwatched").unwrap();
    let a = h.store.put(&ns(), &b"watched"[..]).await.unwrap();
    let b = h.store.put(&other, &b"unwatched"[..]).await.unwrap();
    let (ka, kb) = (a.key().clone(), b.key().clone());
    drop((a, b));
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(LiveSet::new()))
        .await
        .unwrap();
    let r1 = sweep(&h).await;
    let r2 = sweep(&h).await;
    assert_eq!(r1.unswept_namespaces, vec![other.clone()]);
    assert_eq!((r1.total.staged, r2.total.deleted), (1, 1));
    assert!(!r1.namespaces.contains_key(&other));
    assert!(!h.store.has(&ka).await.unwrap());
    assert!(
        h.store.has(&kb).await.unwrap(),
        "unwatched namespace untouched"
    );
}

/// A failing protect callback aborts the sweep before anything is deleted.
pub async fn protect_failure_aborts(spec: Spec) {
    let h = Harness::open_with(
        spec,
        Opts {
            window: Duration::ZERO,
        },
    )
    .await;
    let r = h.store.put(&ns(), &b"x"[..]).await.unwrap();
    let key = r.key().clone();
    drop(r);
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(LiveSet::new()))
        .await
        .unwrap();
    let protector = Protector::default();
    h.store.gc().set_protect(Some(Arc::new(protector.clone())));
    assert_eq!(sweep(&h).await.total.staged, 1);
    protector.fail(true);
    let rep = sweep(&h).await;
    assert_eq!(rep.aborted, Some(GcAbortCause::ProtectFailed));
    // The report carries the callback's error, cause and all.
    let protect_error = rep.protect_error.as_ref().expect("the callback's error");
    assert_eq!(protect_error.kind(), store_types::ErrorKind::Unavailable);
    assert!(
        store_types::Report::new(protect_error)
            .to_string()
            .contains("policy service unavailable"),
        "{protect_error:?}"
    );
    assert_eq!(rep.total.deleted, 0);
    assert!(h.store.has(&key).await.unwrap());
    assert_eq!(h.store.gc().window().staged_count().await.unwrap(), 1);
    // Direct deletes are refused with an error too, which keeps its cause.
    let refused = h.store.delete(&key).await.unwrap_err();
    assert!(matches!(refused, Error::Backend(_)), "{refused:?}");
    assert!(
        store_types::Report::new(&refused)
            .to_string()
            .contains("policy service unavailable"),
        "{refused:?}"
    );
    protector.fail(false);
    assert_eq!(sweep(&h).await.total.deleted, 1);
}

/// A second sweep while one runs reports SweeperLock.
pub async fn concurrent_sweep_reports_lock(spec: Spec) {
    let h = Arc::new(Harness::open(spec).await);
    let r = h.store.put(&ns(), &b"held"[..]).await.unwrap();
    drop(r);
    let gate = Arc::new((Notify::new(), Notify::new()));
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(LiveSet::gated(gate.clone())))
        .await
        .unwrap();
    let first = {
        let h = h.clone();
        tokio::spawn(async move { sweep(&h).await })
    };
    gate.0.notified().await; // the first sweep is inside its probe
    let second = sweep(&h).await;
    assert_eq!(second.aborted, Some(GcAbortCause::SweeperLock));
    assert_eq!(second.total, Default::default());
    gate.1.notify_one();
    let first = first.await.unwrap();
    assert_eq!(first.aborted, None);
    assert_eq!(first.total.staged, 1);
}

/// Direct delete refuses pinned, live and protect-named keys, naming the
/// reason, and deletes nothing.
pub async fn direct_delete_refusals(spec: Spec) {
    let h = Harness::open(spec).await;
    let live = LiveSet::new();
    let protector = Protector::default();
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(live.clone()))
        .await
        .unwrap();
    h.store.gc().set_protect(Some(Arc::new(protector.clone())));
    for big in [false, true] {
        let data = content(if big { 21 } else { 20 }, size_of(&h, big));
        let r = h.store.put(&ns(), &data[..]).await.unwrap();
        let key = r.key().clone();
        let refuse = |res: Result<(), Error>, want: ProtectReason| match res {
            Err(Error::GcRefuse { key: k, reason }) => {
                assert_eq!((k, reason), (key.clone(), want))
            }
            other => panic!("expected refusal ({want}), got {other:?}"),
        };
        refuse(h.store.delete(&key).await, ProtectReason::Pinned);
        drop(r);
        live.set(&key, true);
        refuse(h.store.delete(&key).await, ProtectReason::Live);
        live.set(&key, false);
        protector.set(&key, true);
        refuse(h.store.delete(&key).await, ProtectReason::ProtectCallback);
        assert!(h.store.has(&key).await.unwrap());
        protector.set(&key, false);
        h.store.delete(&key).await.unwrap();
        assert!(!h.store.has(&key).await.unwrap());
    }
}

/// One step of an exact-count scenario.
#[derive(Clone, Debug)]
pub enum Step {
    /// Put blob `name` (big → large tier where there is one); keep its pin.
    Put(&'static str, bool),
    /// Drop every pin held on `name`.
    Unpin(&'static str),
    /// Mark `name` referenced or not.
    Live(&'static str, bool),
    /// Name `name` in the protect callback or not.
    Protect(&'static str, bool),
    /// Move the GC clock forward.
    Advance(u64),
    /// Sweep and compare the report.
    Sweep(Expect),
    /// Assert presence.
    Present(&'static str, bool),
}

/// Expected report fields (totals; the scenario uses one namespace).
#[derive(Clone, Debug, Default)]
pub struct Expect {
    /// `scanned`.
    pub scanned: u64,
    /// `protected.pinned`.
    pub pinned: u64,
    /// `protected.live`.
    pub live: u64,
    /// `protected.protect_callback`.
    pub protect: u64,
    /// `staged`.
    pub staged: u64,
    /// Names deleted (count and bytes freed are derived).
    pub deleted: &'static [&'static str],
    /// `rescued`.
    pub rescued: u64,
}

/// Runs a scenario table with the given window.
pub async fn run_scenario(spec: Spec, window: Duration, steps: &[Step]) {
    let h = Harness::open_with(spec, Opts { window }).await;
    let live = LiveSet::new();
    let protector = Protector::default();
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(live.clone()))
        .await
        .unwrap();
    h.store.gc().set_protect(Some(Arc::new(protector.clone())));
    let mut pins: HashMap<&str, Vec<Pin>> = HashMap::new();
    let mut keys: HashMap<&str, (Key, u64)> = HashMap::new();
    for (i, step) in steps.iter().enumerate() {
        let at = format!("step {i} {step:?}");
        match step {
            Step::Put(name, big) => {
                let seed = blake3::hash(name.as_bytes()).as_bytes()[0] as u64 + 1000;
                let data = content(seed, size_of(&h, *big));
                let r = h.store.put(&ns(), &data[..]).await.unwrap();
                keys.insert(name, (r.key().clone(), r.size));
                pins.entry(name).or_default().push(r.pin);
            }
            Step::Unpin(name) => drop(pins.remove(name)),
            Step::Live(name, on) => live.set(&keys[name].0, *on),
            Step::Protect(name, on) => protector.set(&keys[name].0, *on),
            Step::Advance(secs) => h.advance(Duration::from_secs(*secs)).await,
            Step::Present(name, want) => {
                assert_eq!(h.store.has(&keys[name].0).await.unwrap(), *want, "{at}");
            }
            Step::Sweep(e) => {
                let rep = sweep(&h).await;
                let t = rep.total;
                assert_eq!(rep.aborted, None, "{at}");
                let freed: u64 = e.deleted.iter().map(|n| keys[n].1).sum();
                assert_eq!(
                    (
                        t.scanned,
                        t.protected.pinned,
                        t.protected.live,
                        t.protected.protect_callback,
                        t.staged,
                        t.deleted,
                        t.bytes_freed,
                        t.rescued,
                        t.vanished
                    ),
                    (
                        e.scanned,
                        e.pinned,
                        e.live,
                        e.protect,
                        e.staged,
                        e.deleted.len() as u64,
                        freed,
                        e.rescued,
                        0
                    ),
                    "{at}: (scanned, pinned, live, protect, staged, deleted, freed, rescued, vanished)"
                );
                assert_eq!(rep.namespaces.get(&ns()).copied().unwrap_or_default(), t);
                for name in e.deleted {
                    assert!(
                        !h.store.has(&keys[name].0).await.unwrap(),
                        "{at}: {name} deleted"
                    );
                }
            }
        }
    }
}

use Step::*;

/// Scenario: staging, the window, deletion after it, and protection by
/// every reason.
pub async fn scenario_window_lifecycle(spec: Spec) {
    run_scenario(
        spec,
        Duration::from_secs(60),
        &[
            Put("a", false),
            Put("b", true),
            Put("c", true),
            Put("d", false),
            Put("e", false),
            Unpin("b"),
            Unpin("c"),
            Unpin("d"),
            Unpin("e"),
            Live("b", true),
            Protect("e", true),
            Sweep(Expect {
                scanned: 5,
                pinned: 1,
                live: 1,
                protect: 1,
                staged: 2,
                ..Default::default()
            }),
            Advance(30),
            Sweep(Expect {
                scanned: 3,
                pinned: 1,
                live: 1,
                protect: 1,
                ..Default::default()
            }),
            Present("c", true),
            Advance(31),
            Sweep(Expect {
                scanned: 3,
                pinned: 1,
                live: 1,
                protect: 1,
                deleted: &["c", "d"],
                ..Default::default()
            }),
            Present("c", false),
            Present("d", false),
            Present("a", true),
        ],
    )
    .await
}

/// Scenario: a staged candidate that becomes live, pinned by a dedup put,
/// or protected before it is due is rescued, then collected once garbage.
pub async fn scenario_rescues(spec: Spec) {
    run_scenario(
        spec,
        Duration::from_secs(60),
        &[
            Put("a", false),
            Put("b", true),
            Put("c", false),
            Unpin("a"),
            Unpin("b"),
            Unpin("c"),
            Sweep(Expect {
                scanned: 3,
                staged: 3,
                ..Default::default()
            }),
            Live("a", true),
            Put("b", true), // dedup onto a staged candidate pins it
            Protect("c", true),
            Advance(61),
            Sweep(Expect {
                scanned: 3,
                pinned: 1,
                live: 1,
                protect: 1,
                rescued: 3,
                ..Default::default()
            }),
            Live("a", false),
            Unpin("b"),
            Protect("c", false),
            Sweep(Expect {
                scanned: 3,
                staged: 3,
                ..Default::default()
            }),
            Advance(61),
            Sweep(Expect {
                deleted: &["a", "b", "c"],
                ..Default::default()
            }),
        ],
    )
    .await
}

/// Scenario: with a zero window, garbage is gone by the second sweep.
pub async fn scenario_zero_window(spec: Spec) {
    run_scenario(
        spec,
        Duration::ZERO,
        &[
            Put("a", false),
            Put("b", true),
            Unpin("a"),
            Sweep(Expect {
                scanned: 2,
                pinned: 1,
                staged: 1,
                ..Default::default()
            }),
            Present("a", true),
            Sweep(Expect {
                scanned: 1,
                pinned: 1,
                deleted: &["a"],
                ..Default::default()
            }),
            Unpin("b"),
            Sweep(Expect {
                scanned: 1,
                staged: 1,
                ..Default::default()
            }),
            Sweep(Expect {
                deleted: &["b"],
                ..Default::default()
            }),
        ],
    )
    .await
}

/// Staged candidates survive a restart on a durable window host and are
/// re-arbitrated exactly as without it; an in-process window forgets them
/// and re-marks.
pub async fn window_survives_restart(spec: Spec) {
    let window = Duration::from_secs(60);
    let h = Harness::open_with(spec, Opts { window }).await;
    let live = LiveSet::new();
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(live.clone()))
        .await
        .unwrap();
    let mut keys = Vec::new();
    for (i, big) in [false, true, false].into_iter().enumerate() {
        let data = content(40 + i as u64, size_of(&h, big));
        keys.push(h.store.put(&ns(), &data[..]).await.unwrap().key().clone());
    }
    assert_eq!(sweep(&h).await.total.staged, 3);
    live.set(&keys[1], true);
    let h = h.reopen().await;
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(live.clone()))
        .await
        .unwrap();
    let staged = h.store.gc().window().staged_count().await.unwrap();
    h.advance(Duration::from_secs(61)).await;
    let rep = sweep(&h).await.total;
    if h.durable_window() {
        assert_eq!(staged, 3, "the durable window keeps staged rows");
        assert_eq!((rep.deleted, rep.rescued), (2, 1));
        assert_eq!((rep.scanned, rep.protected.live, rep.staged), (1, 1, 0));
        assert!(!h.store.has(&keys[0]).await.unwrap());
        assert!(!h.store.has(&keys[2]).await.unwrap());
    } else {
        assert_eq!(staged, 0, "an in-process window starts empty");
        assert_eq!((rep.deleted, rep.rescued), (0, 0));
        assert_eq!((rep.scanned, rep.protected.live, rep.staged), (3, 1, 2));
    }
    assert!(h.store.has(&keys[1]).await.unwrap());
}

/// Puts that dedup onto staged candidates while sweeps run on a
/// multi-threaded runtime: a pinned or referenced entry is never lost.
pub async fn concurrent_puts_and_sweeps(spec: Spec) {
    let h = Arc::new(
        Harness::open_with(
            spec,
            Opts {
                window: Duration::ZERO,
            },
        )
        .await,
    );
    let live = LiveSet::new();
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(live.clone()))
        .await
        .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = {
        let (h, stop) = (h.clone(), stop.clone());
        tokio::spawn(async move {
            let mut sweeps = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                assert_eq!(sweep(&h).await.aborted, None);
                sweeps += 1;
                tokio::task::yield_now().await;
            }
            sweeps
        })
    };
    let pool: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..8)
            .map(|i| {
                content(
                    500 + i,
                    if i % 3 == 0 {
                        size_of(&h, true)
                    } else {
                        64 + i as usize
                    },
                )
            })
            .collect(),
    );
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let (h, pool, live) = (h.clone(), pool.clone(), live.clone());
            tokio::spawn(async move {
                let mut state = w.wrapping_mul(0x9E37_79B9) + 1;
                for _ in 0..60 {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let data = &pool[(state % pool.len() as u64) as usize];
                    let r = h.store.put(&ns(), &data[..]).await.unwrap();
                    // While pinned, the entry must stay whole.
                    tokio::task::yield_now().await;
                    let got = h.store.get(r.key()).await.unwrap();
                    let got = got.unwrap_or_else(|| panic!("pinned entry {} lost", r.key()));
                    assert_eq!(got.bytes().await.unwrap(), &data[..]);
                    if state % 4 == 0 {
                        live.set(r.key(), true); // reference recorded before unpinning
                    }
                    drop(r);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let sweeps = sweeper.await.unwrap();
    assert!(sweeps > 0, "the sweeper ran while the puts did");
    for data in pool.iter() {
        let key = Key::new(ns(), Digest::of(data));
        if live.contains(&key) {
            assert!(h.store.has(&key).await.unwrap(), "referenced {key} lost");
        }
    }
    // Everything unreferenced goes within two sweeps.
    sweep(&h).await;
    sweep(&h).await;
    for data in pool.iter() {
        let key = Key::new(ns(), Digest::of(data));
        assert_eq!(
            h.store.has(&key).await.unwrap(),
            live.contains(&key),
            "{key}"
        );
    }
}

/// Puts a big blob (the hooked tier's), drops its pin, registers an empty
/// live set and stages it with a zero window: the next sweep deletes it.
async fn staged_big_blob(h: &Harness, seed: u64) -> (Vec<u8>, Key, LiveSet) {
    let data = content(seed, size_of(h, true));
    let r = h.store.put(&ns(), &data[..]).await.unwrap();
    let key = r.key().clone();
    drop(r);
    let live = LiveSet::new();
    h.store
        .gc()
        .register_liveness_source(ns(), Arc::new(live.clone()))
        .await
        .unwrap();
    assert_eq!(sweep(h).await.total.staged, 1, "the blob is staged");
    (data, key, live)
}

/// A hooked composite with a zero window and one big blob staged.
async fn hooked_with_staged_blob(
    spec: Spec,
    seed: u64,
) -> (Harness, Arc<crate::hook::DeleteHook>, Vec<u8>, Key, LiveSet) {
    let hook = crate::hook::DeleteHook::new();
    let opts = Opts {
        window: Duration::ZERO,
    };
    let h = Harness::open_hooked(spec, opts, hook.clone()).await;
    let (data, key, live) = staged_big_blob(&h, seed).await;
    (h, hook, data, key, live)
}

/// Re-puts `data` while a held delete of it is in flight, lets the delete
/// finish, and asserts the put's entry survived and verifies.
async fn reput_during_held_delete(h: &Harness, hook: &crate::hook::DeleteHook, data: &[u8]) {
    let store = h.store.clone();
    let bytes = data.to_vec();
    let reput = tokio::spawn(async move { store.put(&ns(), &bytes[..]).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    hook.release();
    let receipt = reput.await.unwrap().expect("re-put");
    let key = receipt.key().clone();
    // Let anything still running (a cancelled task's delete) finish.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let blob = h.store.get(&key).await.unwrap();
    let blob = blob.expect("the re-put entry must survive the cancelled delete");
    assert_eq!(&blob.bytes().await.unwrap()[..], data, "and verify");
    drop(receipt);
}

/// Issue 11 §1: a sweep cancelled (its future dropped) while a media
/// delete is in flight keeps the batch's protection until that delete has
/// finished: a put of the same bytes in that gap waits and then writes the
/// entry afresh — it never dedups onto the file being unlinked.
pub async fn cancelled_sweep_keeps_protection(spec: Spec) {
    let (h, hook, data, _key, _live) = hooked_with_staged_blob(spec, 1101).await;
    hook.arm();
    let store = h.store.clone();
    let sweeper = tokio::spawn(async move { store.gc().sweep(SweepOptions::default()).await });
    hook.entered().await;
    sweeper.abort();
    let _ = sweeper.await;
    reput_during_held_delete(&h, &hook, &data).await;
}

/// Issue 11 §1, the direct-delete form (an HTTP client disconnecting from
/// `DELETE /v1/blobs/…` drops the handler future the same way).
pub async fn cancelled_delete_keeps_protection(spec: Spec) {
    let hook = crate::hook::DeleteHook::new();
    let h = Harness::open_hooked(spec, Opts::default(), hook.clone()).await;
    let data = content(1102, size_of(&h, true));
    let r = h.store.put(&ns(), &data[..]).await.unwrap();
    let key = r.key().clone();
    drop(r);
    hook.arm();
    let store = h.store.clone();
    let k = key.clone();
    let deleter = tokio::spawn(async move { store.delete(&k).await });
    hook.entered().await;
    deleter.abort();
    let _ = deleter.await;
    reput_during_held_delete(&h, &hook, &data).await;
}

/// Exact counts: a due key held by a direct delete while the sweep reaches
/// it is neither skipped nor left staged: the sweep waits for the other
/// delete, then counts the key once (vanished: the direct delete took it).
pub async fn due_key_busy_under_direct_delete_counted_once(spec: Spec) {
    let (h, hook, _data, key, _live) = hooked_with_staged_blob(spec, 1103).await;
    hook.arm();
    let store = h.store.clone();
    let k = key.clone();
    let deleter = tokio::spawn(async move { store.delete(&k).await });
    hook.entered().await;
    let store = h.store.clone();
    let sweeper = tokio::spawn(async move { store.gc().sweep(SweepOptions::default()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    hook.release();
    deleter.await.unwrap().expect("direct delete");
    let rep = sweeper.await.unwrap().expect("sweep");
    let t = rep.total;
    assert_eq!(
        t.deleted + t.vanished + t.rescued,
        1,
        "the due key is counted exactly once: {rep:?}"
    );
    assert_eq!(t.vanished, 1, "{rep:?}");
    assert_eq!(h.store.gc().window().staged_count().await.unwrap(), 0);
    assert!(!h.store.has(&key).await.unwrap());
}

/// Exact counts: a due candidate that is protected again but whose entry
/// has already disappeared counts as vanished, not rescued.
pub async fn vanished_protected_due_key_counts_vanished(spec: Spec) {
    let h = Harness::open_with(
        spec,
        Opts {
            window: Duration::ZERO,
        },
    )
    .await;
    let (_data, key, live) = staged_big_blob(&h, 1104).await;
    // The entry goes behind the store's back (an operator, a crash between
    // an engine delete and the unstage).
    for engine in [Some(h.kv_engine()), h.large_engine()]
        .into_iter()
        .flatten()
    {
        engine
            .delete_many(&key.namespace, &[key.digest])
            .await
            .unwrap();
    }
    live.set(&key, true);
    let rep = sweep(&h).await;
    assert_eq!(rep.total.rescued, 0, "{rep:?}");
    assert_eq!(rep.total.vanished, 1, "{rep:?}");
    assert_eq!(h.store.gc().window().staged_count().await.unwrap(), 0);
}

/// A liveness source that answers "nothing live" and fails from its
/// `fail_from`-th probe on.
struct FailsLater {
    probes: std::sync::atomic::AtomicUsize,
    fail_from: usize,
}

#[async_trait::async_trait]
impl store_core::LivenessSource for FailsLater {
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>, store_types::Error> {
        let n = self
            .probes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n + 1 >= self.fail_from {
            return Err(store_types::Error::backend(
                store_types::ErrorKind::ConnectionLost,
                "query reference database",
            )
            .with_source("injected: the reference database went away"));
        }
        Ok(vec![false; keys.len()])
    }
}

/// Exact counts: a sweep that fails after committing batches reports what
/// those batches did together with the error.
pub async fn failure_after_committed_batches_reports_counts(spec: Spec) {
    let h = Harness::open_with(
        spec,
        Opts {
            window: Duration::ZERO,
        },
    )
    .await;
    for i in 0..3u8 {
        drop(h.store.put(&ns(), &[i; 9][..]).await.unwrap());
    }
    // Probes: mark (3 pages of 1) succeed, then execute batch 1 succeeds
    // and execute batch 2 fails.
    let src = Arc::new(FailsLater {
        probes: Default::default(),
        fail_from: 5,
    });
    h.store
        .gc()
        .register_liveness_source(ns(), src)
        .await
        .unwrap();
    let one = SweepOptions { batch: 1 };
    assert_eq!(
        h.store.gc().sweep(one.clone()).await.unwrap().total.staged,
        3
    );
    match h.store.gc().sweep(one).await {
        Err(Error::SweepIncomplete {
            cause,
            deleted,
            bytes_freed,
            ..
        }) => {
            assert_eq!(deleted, 1, "the committed batch is reported");
            assert_eq!(bytes_freed, 9);
            assert!(matches!(*cause, Error::Backend(_)), "{cause:?}");
            // The source's kind and message survive the sweep's wrapping.
            assert!(cause.is_transient(), "{cause:?}");
            let chain = store_types::Report::new(&*cause).to_string();
            assert!(
                chain.contains("the reference database went away"),
                "{chain}"
            );
        }
        other => panic!("expected SweepIncomplete, got {other:?}"),
    }
    assert_eq!(h.store.gc().window().staged_count().await.unwrap(), 2);
}
