//! The retry layer: an engine operation that failed transiently
//! ([`Error::is_transient`]) is started again after a backoff
//! ([`RetryPolicy`]: exponential, with jitter, a bounded number of
//! attempts), as OpenDAL's `RetryLayer` does; ADR-064.
//!
//! Only operations whose repetition cannot do harm are repeated
//! ([`RetryLayer::repeats`]): the reads, `delete_many` (deleting twice
//! deletes once; a delete whose answer was lost reports the entry as not
//! freed on the retry), a kv `put` and opening a stage (content-addressed:
//! a put whose first attempt applied unseen answers `AlreadyPresent` on
//! the retry, and the facade then checks the stored copy). A stage's
//! writes, publish and abort are never repeated (the chunk or the stage
//! is gone), nor `lock_instance` (a lock taken unseen would refuse its
//! own retry) and `maintain` (the next sweep runs it again). References
//! and cache rows are not engine operations: they are never retried.
//! A read is repeated only until it answers: the stream it opens is not
//! replayed.
//!
//! Cancel safety: dropping a retrying call drops the attempt in flight
//! or the pause, so no attempt starts after the drop; each attempt is as
//! cancel-safe as the inner engine's operation.

use store_types::{Error, RetryPolicy};

use crate::layer::{Call, EngineLayer, Next, Rerun};
use crate::Op;

/// Repeats engine operations that failed transiently; see the module
/// docs for which.
#[derive(Clone, Copy, Debug, Default)]
pub struct RetryLayer {
    policy: RetryPolicy,
}

impl RetryLayer {
    /// A layer retrying as `policy` says.
    pub fn new(policy: RetryPolicy) -> Self {
        RetryLayer { policy }
    }

    /// Whether the layer repeats `op` after a transient failure.
    pub fn repeats(op: Op) -> bool {
        matches!(
            op,
            Op::Meta
                | Op::HasMany
                | Op::Read
                | Op::Namespaces
                | Op::Scan
                | Op::DeleteMany
                | Op::Put
                | Op::Stage
                | Op::StageExpecting
        )
    }
}

impl EngineLayer for RetryLayer {
    fn around_repeatable<'a>(&'a self, call: Call<'a>, rerun: Rerun<'a>) -> Next<'a> {
        if !Self::repeats(call.op) || self.policy.attempts <= 1 {
            return rerun();
        }
        Box::pin(
            self.policy
                .run(rerun, Error::is_transient, move |e: &Error, pause| {
                    tracing::debug!(op = %call.op, engine = call.engine, error = %e, ?pause,
                    "transient engine failure; retrying");
                }),
        )
    }
}
