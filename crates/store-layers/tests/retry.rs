//! The retry layer over a fault layer over `store-mem`: transient failures
//! of repeatable operations are retried until they succeed or the attempts
//! are spent, permanent ones never, a stage's operations never (even when
//! the failure came after the operation applied), the backoff stays within
//! its bounds, and a dropped retrying call starts no further attempt.

use std::io::ErrorKind;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use store_layers::{FaultLayer, FaultPlan, LayerStack, Op, RetryLayer, RetryPolicy, Rule};
use store_mem::MemEngine;
use store_types::{Digest, EngineExt as _, Key, KvEngine, Namespace, PublishOutcome};

fn key(data: &[u8]) -> Key {
    Key::new(Namespace::new("retry").unwrap(), Digest::of(data))
}

fn fast(attempts: u32) -> RetryPolicy {
    RetryPolicy {
        attempts,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(4),
    }
}

/// The stack under test: faults inside, retries outside (each attempt
/// passes the fault layer).
fn stack(plan: FaultPlan, policy: RetryPolicy) -> (FaultLayer, LayerStack) {
    let faults = FaultLayer::new(plan);
    let stack = LayerStack::new()
        .layer(faults.clone())
        .layer(RetryLayer::new(policy));
    (faults, stack)
}

fn kv(plan: FaultPlan, policy: RetryPolicy) -> (FaultLayer, Arc<dyn KvEngine>) {
    let (faults, stack) = stack(plan, policy);
    (faults, stack.kv(Arc::new(MemEngine::new())))
}

const TRANSIENT: ErrorKind = ErrorKind::ConnectionReset;

#[tokio::test]
async fn transient_failures_then_success_are_retried() {
    let data = b"retried".as_slice();
    let k = key(data);
    for op in [Op::Meta, Op::Read, Op::Scan, Op::HasMany, Op::Put] {
        let plan = FaultPlan::new(1)
            .rule(Rule::on(op).nth(1).fail(TRANSIENT))
            .rule(Rule::on(op).nth(2).fail(TRANSIENT));
        let (faults, e) = kv(plan, fast(3));
        let outcome = e.put(&k, Bytes::from_static(data)).await.unwrap();
        assert_eq!(outcome, PublishOutcome::Inserted, "{op}");
        assert!(e.meta(&k).await.unwrap().is_some(), "{op}");
        let got = e.read_whole(&k).await.unwrap().unwrap();
        assert_eq!(got.into_bytes(1 << 20).await.unwrap(), data, "{op}");
        assert_eq!(e.scan(&k.namespace, None, 10).await.unwrap().len(), 1);
        assert_eq!(e.has_many(&k.namespace, &[k.digest]).await.unwrap(), [true]);
        assert_eq!(faults.injections().len(), 2, "{op}: both faults fired");
    }
}

#[tokio::test]
async fn attempts_are_bounded_and_permanent_errors_are_not_retried() {
    let k = key(b"absent");
    let (faults, e) = kv(
        FaultPlan::new(2).rule(Rule::on(Op::Meta).fail(TRANSIENT)),
        fast(4),
    );
    assert!(e.meta(&k).await.unwrap_err().is_transient());
    assert_eq!(
        faults.injections().len(),
        4,
        "exactly the policy's attempts"
    );

    let (faults, e) = kv(
        FaultPlan::new(3).rule(Rule::on(Op::Meta).fail(ErrorKind::PermissionDenied)),
        fast(4),
    );
    assert!(!e.meta(&k).await.unwrap_err().is_transient());
    assert_eq!(faults.injections().len(), 1, "a permanent error is final");

    let (faults, e) = kv(
        FaultPlan::new(4).rule(Rule::on(Op::Meta).fail(TRANSIENT)),
        RetryPolicy::none(),
    );
    assert!(e.meta(&k).await.is_err());
    assert_eq!(faults.injections().len(), 1, "RetryPolicy::none tries once");
}

/// A kv put whose acknowledgement was lost applied: the retry finds the
/// entry and answers `AlreadyPresent` (content addressing makes it safe).
#[tokio::test]
async fn a_put_whose_answer_was_lost_is_retried_into_already_present() {
    let data = b"lost ack".as_slice();
    let (faults, e) = kv(
        FaultPlan::new(5).rule(Rule::on(Op::Put).nth(1).fail_after(TRANSIENT)),
        fast(3),
    );
    let outcome = e.put(&key(data), Bytes::from_static(data)).await.unwrap();
    assert_eq!(outcome, PublishOutcome::AlreadyPresent);
    assert_eq!(faults.injections().len(), 1);
}

/// A stage's write, publish and abort, and `lock_instance`, are never
/// repeated: a write that failed after it applied would be written twice.
#[tokio::test]
async fn operations_that_may_have_applied_are_not_retried() {
    let data = b"written once".as_slice();
    for op in [
        Op::Write,
        Op::Publish,
        Op::Abort,
        Op::LockInstance,
        Op::Maintain,
    ] {
        let (faults, stack) = stack(
            FaultPlan::new(6).rule(Rule::on(op).fail_after(TRANSIENT)),
            fast(5),
        );
        let mem = MemEngine::new();
        let large = stack.large(Arc::new(mem.clone()));
        let failed = match op {
            Op::LockInstance => large.lock_instance().await.is_err(),
            Op::Maintain => large.maintain(store_types::Timestamp::now()).await.is_err(),
            _ => {
                let mut stage = large.stage(&key(data).namespace).await.unwrap();
                let wrote = stage.write(Bytes::from_static(data)).await;
                match op {
                    Op::Write => wrote.is_err(),
                    Op::Publish => stage.publish(&key(data)).await.is_err(),
                    _ => stage.into_plain().abort().await.is_err(),
                }
            }
        };
        assert!(failed, "{op}: the fault surfaced");
        assert_eq!(faults.injections().len(), 1, "{op}: ran once");
        assert!(!RetryLayer::repeats(op), "{op}");
    }
}

/// With every pause doubling from 10 ms and capped at 20 ms (jitter below
/// twice that), five retries pause between 90 and 180 ms; uncapped they
/// would take at least 310 ms.
#[tokio::test]
async fn the_backoff_doubles_up_to_its_cap() {
    let policy = RetryPolicy {
        attempts: 6,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
    };
    let (faults, e) = kv(
        FaultPlan::new(7).rule(Rule::on(Op::Meta).fail(TRANSIENT)),
        policy,
    );
    let started = Instant::now();
    assert!(e.meta(&key(b"x")).await.is_err());
    let took = started.elapsed();
    assert_eq!(faults.injections().len(), 6);
    assert!(took >= Duration::from_millis(90), "{took:?}");
    assert!(took < Duration::from_millis(300), "{took:?}");
}

/// Dropping a retrying call during its pause starts no further attempt.
#[tokio::test]
async fn a_dropped_retrying_call_stops_retrying() {
    let policy = RetryPolicy {
        attempts: 5,
        initial_backoff: Duration::from_millis(200),
        max_backoff: Duration::from_millis(200),
    };
    let (faults, e) = kv(
        FaultPlan::new(8).rule(Rule::on(Op::Meta).fail(TRANSIENT)),
        policy,
    );
    let k = key(b"y");
    let call = tokio::time::timeout(Duration::from_millis(50), e.meta(&k)).await;
    assert!(call.is_err(), "still pausing when dropped");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(faults.injections().len(), 1, "no attempt after the drop");
}
