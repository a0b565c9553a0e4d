//! Fault injection through an [`ObjectStore`] wrapper: whatever request
//! fails, nothing half-published becomes visible, and staging leftovers
//! are reaped.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use store_types::{Digest, Engine, EngineExt as _, Key, PublishOutcome};

use super::fault::{FaultStore, Op, Rule};
use super::{content, ns, put, put_with, read, small_options, Backend};
use crate::{ObjectEngine, ObjectOptions, RetryPolicy};

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
    }
}

async fn faulty(b: &Backend) -> (FaultStore, ObjectEngine) {
    let f = FaultStore::new(b.store());
    let e = b
        .engine_over(
            Arc::new(f.clone()) as Arc<dyn ObjectStore>,
            ObjectOptions {
                retry: fast_retry(),
                ..small_options()
            },
        )
        .await;
    (f, e)
}

/// The entry of `data` is either absent or complete and intact.
async fn absent_or_whole(e: &ObjectEngine, data: &[u8]) -> bool {
    let key = Key::new(ns("ns"), Digest::of(data));
    match read(e, &key, None).await.unwrap() {
        None => false,
        Some(got) => {
            assert_eq!(got, data, "a visible entry is always complete");
            true
        }
    }
}

#[tokio::test]
async fn failed_copy_after_upload_publishes_nothing_and_cleans_the_stage() {
    for b in Backend::all() {
        let (f, e) = faulty(&b).await;
        let data = content(200_000, 1);
        f.arm(Rule::fail(Op::Copy, 1));
        assert!(put_with(&e, "ns", &data, 16 << 10).await.is_err());
        f.disarm();
        assert!(!absent_or_whole(&e, &data).await, "nothing visible");
        assert_eq!(e.stage_object_count().await.unwrap(), 0, "stage removed");
        // A later put of the same bytes inserts normally.
        assert_eq!(put(&e, "ns", &data).await.1, PublishOutcome::Inserted);
    }
}

#[tokio::test]
async fn stage_left_by_a_failed_copy_and_delete_is_reaped() {
    for b in Backend::all() {
        let (f, e) = faulty(&b).await;
        let data = content(200_000, 2);
        f.arm(Rule::fail(Op::Copy, 1));
        f.arm(Rule::fail(Op::Delete, 1));
        assert!(put_with(&e, "ns", &data, 16 << 10).await.is_err());
        f.disarm();
        assert!(!absent_or_whole(&e, &data).await, "nothing visible");
        assert_eq!(e.stage_object_count().await.unwrap(), 1, "the leftover");
        assert_eq!(
            e.reap_stale_stages(Duration::from_secs(60)).await.unwrap(),
            0
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A new instance opening after the grace period reaps it.
        let reopened = b
            .engine(ObjectOptions {
                staging_grace: Duration::from_millis(10),
                ..small_options()
            })
            .await;
        assert_eq!(reopened.stage_object_count().await.unwrap(), 0);
        assert!(!absent_or_whole(&reopened, &data).await);
    }
}

#[tokio::test]
async fn the_sweep_maintenance_step_reaps_stale_stages() {
    for b in Backend::all() {
        let f = FaultStore::new(b.store());
        let grace = Duration::from_millis(50);
        let e = b
            .engine_over(
                Arc::new(f.clone()) as Arc<dyn ObjectStore>,
                ObjectOptions {
                    retry: fast_retry(),
                    staging_grace: grace,
                    ..small_options()
                },
            )
            .await;
        let data = content(200_000, 3);
        f.arm(Rule::fail(Op::Copy, 1));
        f.arm(Rule::fail(Op::Delete, 1));
        assert!(put_with(&e, "ns", &data, 16 << 10).await.is_err());
        f.disarm();
        let now = store_types::Timestamp::now();
        assert_eq!(e.maintain(now).await.unwrap(), 0, "within the grace period");
        tokio::time::sleep(grace * 2).await;
        assert_eq!(e.maintain(now).await.unwrap(), 1, "past the grace period");
        assert_eq!(e.stage_object_count().await.unwrap(), 0);
    }
}

#[tokio::test]
async fn a_lost_publish_response_still_leaves_one_whole_entry() {
    for b in Backend::all() {
        let (f, e) = faulty(&b).await;
        for (i, (op, len)) in [
            (Op::Copy, 200_000),
            (Op::Put, 1000),
            (Op::Complete, 200_000),
        ]
        .into_iter()
        .enumerate()
        {
            let data = content(len, 3 + i as u64);
            f.arm(Rule::fail(op, 1).transient().after());
            let r = put_with(&e, "ns", &data, 16 << 10).await;
            let fired = f.fired();
            f.disarm();
            assert_eq!(fired, 1, "{op:?}");
            match op {
                // The retry finds the name taken: the entry is there.
                Op::Copy | Op::Put => {
                    assert_eq!(r.unwrap().1, PublishOutcome::AlreadyPresent, "{op:?}");
                    assert!(absent_or_whole(&e, &data).await, "{op:?}");
                }
                // A failed completion fails the put; its object is removed.
                _ => {
                    assert!(r.is_err(), "{op:?}: {r:?}");
                    assert!(!absent_or_whole(&e, &data).await, "{op:?}");
                }
            }
            assert_eq!(e.stage_object_count().await.unwrap(), 0, "{op:?}");
        }
    }
}

#[tokio::test]
async fn transient_failures_are_retried() {
    for b in Backend::all() {
        let (f, e) = faulty(&b).await;
        let small = content(1000, 4);
        let large = content(200_000, 5);
        for op in [Op::Put, Op::CreateUpload, Op::Copy, Op::Delete] {
            f.arm(Rule::fail(op, 1).transient());
            let data = if op == Op::Put { &small } else { &large };
            let (key, outcome) = put_with(&e, "ns", data, 16 << 10).await.unwrap();
            assert_eq!(f.fired(), 1, "{op:?} fault fired");
            f.disarm();
            assert_eq!(outcome, PublishOutcome::Inserted, "{op:?}");
            assert_eq!(e.stage_object_count().await.unwrap(), 0, "{op:?}");
            e.delete_many(&key.namespace, &[key.digest]).await.unwrap();
        }
        let (key, _) = put(&e, "ns", &large).await;
        // Whole engine operations are retried by store-layers' RetryLayer
        // (ADR-064), the stage's steps above by the engine itself.
        let layered = store_layers::LayerStack::new()
            .layer(store_layers::RetryLayer::new(fast_retry()))
            .large(Arc::new(e.clone()));
        for op in [Op::Get, Op::List] {
            f.arm(Rule::fail(op, 1).transient());
            let blob = layered.read_whole(&key).await.unwrap().unwrap();
            assert_eq!(blob.into_bytes(1 << 20).await.unwrap(), large);
            assert!(layered.meta(&key).await.unwrap().is_some());
            let listed = layered.scan(&key.namespace, None, 10).await.unwrap();
            assert_eq!(listed.len(), 1);
            f.disarm();
        }
        // Permanent failures are not retried.
        f.arm(Rule::fail(Op::Get, 1));
        assert!(layered.meta(&key).await.is_err());
        assert_eq!(f.requests(), 1);
        f.disarm();
    }
}

/// Fails request number n of a put, for every n, on small and multipart
/// bodies: the put fails or succeeds, the entry is absent or whole, and
/// after reaping no stage object is left.
#[tokio::test]
async fn failing_the_nth_request_of_a_put_never_shows_a_partial_entry() {
    for b in Backend::all() {
        let (f, e) = faulty(&b).await;
        for (len, seed) in [(1000usize, 10u64), (200_000, 20)] {
            // Count the requests of a clean put.
            f.disarm();
            put_with(&e, "ns", &content(len, seed), 16 << 10)
                .await
                .unwrap();
            let total = f.requests();
            assert!(total >= 1);
            for n in 1..=total + 1 {
                for transient in [false, true] {
                    let data = content(len, seed + 1 + (n as u64) * 2 + u64::from(transient));
                    let mut rule = Rule::any(n);
                    if transient {
                        rule = rule.transient();
                    }
                    f.arm(rule);
                    let r = put_with(&e, "ns", &data, 16 << 10).await;
                    f.disarm();
                    let visible = absent_or_whole(&e, &data).await;
                    if r.is_ok() {
                        assert!(visible, "n={n}: a successful put is visible");
                    }
                    e.reap_stale_stages(Duration::ZERO).await.unwrap();
                    assert_eq!(e.stage_object_count().await.unwrap(), 0, "n={n}");
                    // Whatever happened, the bytes can be put again.
                    put(&e, "ns", &data).await;
                    assert!(absent_or_whole(&e, &data).await);
                }
            }
        }
    }
}

#[tokio::test]
async fn failing_reads_fail_instead_of_returning_wrong_bytes() {
    for b in Backend::all() {
        let (f, e) = faulty(&b).await;
        let data = content(300_000, 30);
        let (key, _) = put(&e, "ns", &data).await;
        f.arm(Rule::fail(Op::Get, 1));
        assert!(read(&e, &key, None).await.is_err());
        f.disarm();
        assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
    }
}

#[tokio::test]
async fn stores_without_conditional_writes_fall_back_to_head_then_write() {
    for b in Backend::all() {
        let mut f = FaultStore::new(b.store());
        f.no_conditional = true;
        let e = b
            .engine_over(Arc::new(f) as Arc<dyn ObjectStore>, small_options())
            .await;
        assert_eq!(
            e.capabilities(),
            crate::Capabilities {
                conditional_put: false,
                copy_if_not_exists: false
            }
        );
        for len in [1000usize, 200_000] {
            let data = content(len, 40 + len as u64);
            let (key, outcome) = put(&e, "ns", &data).await;
            assert_eq!(outcome, PublishOutcome::Inserted);
            assert_eq!(put(&e, "ns", &data).await.1, PublishOutcome::AlreadyPresent);
            assert_eq!(read(&e, &key, None).await.unwrap().unwrap(), data);
        }
        assert_eq!(e.stage_object_count().await.unwrap(), 0);
    }
}
