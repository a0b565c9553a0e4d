//! The fault-injection layer: a seeded [`FaultPlan`] of rules, each
//! failing or delaying chosen calls of chosen operations, or faulting the
//! bytes of a stage or a read at an offset.
//!
//! Reproducible: each rule draws from its own ChaCha8 stream, seeded from
//! the plan's seed and the rule's position, once per call it matches. The
//! same seed and the same sequence of calls of a rule's operations give
//! the same faults, however calls of *other* operations interleave.
//!
//! Every fault is an error the engine contract allows — a media error
//! ([`store_types::Error::Io`], built from an [`io::ErrorKind`]) where the
//! engine could fail, or a delay. Nothing here panics.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use store_types::{
    Error, JointStagedWrite, Key, PinIntent, PublishOutcome, Result, Stage, StagedWrite, Tier,
};

use crate::layer::{Call, EngineLayer, Next, Reply};
use crate::reader::{wrap_reader, ReadHook, ReadStep};
use crate::Op;

/// When a rule fires, counting the calls of its operations (1-based).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum When {
    /// Every matching call.
    Always,
    /// Only the `n`th matching call.
    Nth(u64),
    /// The `n`th matching call and every later one.
    From(u64),
    /// Each matching call with probability `p` (0 to 1), drawn from the
    /// rule's seeded stream.
    Probability(f64),
}

/// What a rule does when it fires.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Fault {
    /// Fails the call with a media error of this kind without reaching the
    /// engine.
    Fail(io::ErrorKind),
    /// Runs the call, then answers with a media error of this kind instead
    /// of its result (a lost acknowledgement: the operation may have taken
    /// effect).
    FailAfter(io::ErrorKind),
    /// Delays the call by this long, then runs it.
    Delay(Duration),
    /// Delays the call by a duration drawn uniformly from `0..=max`.
    Jitter(Duration),
    /// On a `stage`/`stage_expecting`: the stage's write that would cross
    /// byte `offset` fails without writing (and every later write).
    WriteFailsAt {
        /// The first byte that cannot be written.
        offset: u64,
        /// The error's kind.
        kind: io::ErrorKind,
    },
    /// On a `stage`/`stage_expecting`: the write crossing byte `offset`
    /// writes the bytes before it, then fails (a short write surfaced as
    /// an error, as `write_all` does); later writes fail too.
    ShortWriteAt {
        /// Where the written prefix ends.
        offset: u64,
        /// The error's kind.
        kind: io::ErrorKind,
    },
    /// On a `read`/`read_range`: the stream yields `offset` bytes, then
    /// fails.
    ReadFailsAt {
        /// Bytes yielded before the failure.
        offset: u64,
        /// The error's kind.
        kind: io::ErrorKind,
    },
    /// On a `read`/`read_range`: the stream ends (EOF) after `offset`
    /// bytes, shorter than its declared length.
    ReadTruncatedAt {
        /// Bytes yielded before the early end.
        offset: u64,
    },
}

/// One rule of a [`FaultPlan`]: which operations, when, and what fault.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    ops: Vec<Op>,
    tier: Option<Tier>,
    when: When,
    fault: Fault,
}

/// A [`Rule`] being built: its operations and trigger, awaiting a fault.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleBuilder {
    ops: Vec<Op>,
    tier: Option<Tier>,
    when: When,
}

impl Rule {
    /// A rule for calls of `op` (every call, until a trigger is chosen).
    pub fn on(op: Op) -> RuleBuilder {
        Self::on_any(&[op])
    }

    /// A rule for calls of any of `ops`.
    pub fn on_any(ops: &[Op]) -> RuleBuilder {
        RuleBuilder {
            ops: ops.to_vec(),
            tier: None,
            when: When::Always,
        }
    }

    /// A rule for opening stages (`stage` and `stage_expecting`), where
    /// the byte-offset write faults apply.
    pub fn stages() -> RuleBuilder {
        Self::on_any(&[Op::Stage, Op::StageExpecting])
    }

    /// A rule for opening reads (`read`, whole or ranged), where the
    /// byte-offset read faults apply.
    pub fn reads() -> RuleBuilder {
        Self::on_any(&[Op::Read])
    }
}

impl RuleBuilder {
    /// Matches only calls on engines serving `tier` (as the wrapper
    /// reports it: [`crate::LayerStack::kv`] / [`crate::LayerStack::large`]);
    /// without it a rule shared by both tiers counts the calls of both —
    /// a facade `get` reads the kv tier first, even for a large entry.
    pub fn tier(mut self, tier: Tier) -> Self {
        self.tier = Some(tier);
        self
    }

    /// Fires on matching calls as `when` says.
    pub fn when(mut self, when: When) -> Self {
        self.when = match when {
            When::Probability(p) => {
                When::Probability(if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) })
            }
            w => w,
        };
        self
    }

    /// Fires on the `n`th matching call only (1-based).
    pub fn nth(self, n: u64) -> Self {
        self.when(When::Nth(n))
    }

    /// Fires on each matching call with probability `p`.
    pub fn probability(self, p: f64) -> Self {
        self.when(When::Probability(p))
    }

    /// The rule with `fault`.
    pub fn fault(self, fault: Fault) -> Rule {
        Rule {
            ops: self.ops,
            tier: self.tier,
            when: self.when,
            fault,
        }
    }

    /// Fails without reaching the engine ([`Fault::Fail`]).
    pub fn fail(self, kind: io::ErrorKind) -> Rule {
        self.fault(Fault::Fail(kind))
    }

    /// Fails after the engine answered ([`Fault::FailAfter`]).
    pub fn fail_after(self, kind: io::ErrorKind) -> Rule {
        self.fault(Fault::FailAfter(kind))
    }

    /// Delays by `d` ([`Fault::Delay`]).
    pub fn delay(self, d: Duration) -> Rule {
        self.fault(Fault::Delay(d))
    }

    /// Delays by a seeded random duration up to `max` ([`Fault::Jitter`]).
    pub fn jitter(self, max: Duration) -> Rule {
        self.fault(Fault::Jitter(max))
    }

    /// [`Fault::WriteFailsAt`].
    pub fn write_fails_at(self, offset: u64, kind: io::ErrorKind) -> Rule {
        self.fault(Fault::WriteFailsAt { offset, kind })
    }

    /// [`Fault::ShortWriteAt`].
    pub fn short_write_at(self, offset: u64, kind: io::ErrorKind) -> Rule {
        self.fault(Fault::ShortWriteAt { offset, kind })
    }

    /// [`Fault::ReadFailsAt`].
    pub fn read_fails_at(self, offset: u64, kind: io::ErrorKind) -> Rule {
        self.fault(Fault::ReadFailsAt { offset, kind })
    }

    /// [`Fault::ReadTruncatedAt`].
    pub fn read_truncated_at(self, offset: u64) -> Rule {
        self.fault(Fault::ReadTruncatedAt { offset })
    }
}

/// A seeded list of [`Rule`]s. Rules are tried in order; every rule that
/// fires on a call applies (delays add up; the first error wins).
#[derive(Clone, Debug, PartialEq)]
pub struct FaultPlan {
    seed: u64,
    rules: Vec<Rule>,
}

impl FaultPlan {
    /// An empty plan with `seed` for its random draws.
    pub fn new(seed: u64) -> Self {
        FaultPlan {
            seed,
            rules: Vec::new(),
        }
    }

    /// A plan that injects nothing (the layer then only counts calls).
    pub fn none() -> Self {
        Self::new(0)
    }

    /// Adds `rule`.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }
}

/// One fault the layer injected.
#[derive(Clone, Debug, PartialEq)]
pub struct Injection {
    /// The index of the rule that fired.
    pub rule: usize,
    /// The operation it fired on.
    pub op: Op,
    /// Which matching call of the rule it was (1-based).
    pub call: u64,
    /// The fault (a drawn jitter as the [`Fault::Delay`] it became).
    pub fault: Fault,
}

struct RuleState {
    rule: Rule,
    calls: u64,
    rng: ChaCha8Rng,
}

struct State {
    seed: u64,
    rules: Vec<Mutex<RuleState>>,
    log: Mutex<Vec<Injection>>,
}

/// Injects the faults of a [`FaultPlan`]. Cheap to clone (clones share
/// the plan's counters and log): keep one to read
/// [`FaultLayer::injections`].
#[derive(Clone)]
pub struct FaultLayer {
    state: Arc<State>,
}

impl std::fmt::Debug for FaultLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultLayer")
            .field("seed", &self.state.seed)
            .field("rules", &self.state.rules.len())
            .finish()
    }
}

/// A salt per rule so each draws its own stream from one seed.
const RULE_SALT: u64 = 0x9E37_79B9_7F4A_7C15;

impl FaultLayer {
    /// A layer injecting `plan`'s faults.
    pub fn new(plan: FaultPlan) -> Self {
        let seed = plan.seed;
        let rules = plan
            .rules
            .into_iter()
            .enumerate()
            .map(|(i, rule)| {
                Mutex::new(RuleState {
                    rule,
                    calls: 0,
                    rng: ChaCha8Rng::seed_from_u64(seed ^ (i as u64 + 1).wrapping_mul(RULE_SALT)),
                })
            })
            .collect();
        FaultLayer {
            state: Arc::new(State {
                seed,
                rules,
                log: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Every fault injected so far, in the order the rules fired.
    pub fn injections(&self) -> Vec<Injection> {
        self.state
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The faults that fire on this call (deciding advances the rules'
    /// counters and streams).
    fn decide(&self, op: Op, tier: Option<Tier>) -> Vec<(usize, Fault)> {
        let mut fired = Vec::new();
        for (i, state) in self.state.rules.iter().enumerate() {
            let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
            if !s.rule.ops.contains(&op) || s.rule.tier.is_some_and(|t| Some(t) != tier) {
                continue;
            }
            s.calls += 1;
            let n = s.calls;
            let fires = match s.rule.when {
                When::Always => true,
                When::Nth(k) => n == k,
                When::From(k) => n >= k,
                When::Probability(p) => s.rng.random::<f64>() < p,
            };
            if !fires {
                continue;
            }
            let fault = match s.rule.fault.clone() {
                Fault::Jitter(max) => {
                    let nanos = max.as_nanos().min(u64::MAX as u128) as u64;
                    Fault::Delay(Duration::from_nanos(s.rng.random_range(0..=nanos)))
                }
                f => f,
            };
            drop(s);
            self.state
                .log
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Injection {
                    rule: i,
                    op,
                    call: n,
                    fault: fault.clone(),
                });
            fired.push((i, fault));
        }
        fired
    }

    fn error(&self, rule: usize, op: Op, kind: io::ErrorKind, what: &str) -> Error {
        Error::from(io::Error::new(
            kind,
            format!(
                "injected fault: {what} on {op} (rule {rule}, seed {})",
                self.state.seed
            ),
        ))
    }
}

impl EngineLayer for FaultLayer {
    fn around<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> Next<'a> {
        let fired = self.decide(call.op, call.tier);
        if fired.is_empty() {
            return next;
        }
        Box::pin(async move {
            let op = call.op;
            let mut after = None;
            let mut byte_faults = Vec::new();
            for (rule, fault) in fired {
                match fault {
                    Fault::Fail(kind) => return Err(self.error(rule, op, kind, "failure")),
                    Fault::FailAfter(kind) => {
                        after.get_or_insert((rule, kind));
                    }
                    Fault::Delay(d) => tokio::time::sleep(d).await,
                    Fault::Jitter(_) => {}
                    f => byte_faults.push((rule, f)),
                }
            }
            let mut reply = next.await?;
            if let Some((rule, kind)) = after {
                return Err(self.error(rule, op, kind, "failure after the engine answered"));
            }
            for (rule, fault) in byte_faults {
                reply = self.fault_bytes(rule, op, fault, reply);
            }
            Ok(reply)
        })
    }
}

impl FaultLayer {
    /// Applies a byte-offset fault to the stage or reader a call answered
    /// (a fault that does not fit the reply is ignored).
    fn fault_bytes(&self, rule: usize, op: Op, fault: Fault, reply: Reply) -> Reply {
        match (fault, reply) {
            (Fault::WriteFailsAt { offset, kind }, Reply::Stage(s)) => {
                let error = self.error(rule, op, kind, &format!("write failure at byte {offset}"));
                Reply::Stage(fault_stage(s, offset, false, error))
            }
            (Fault::ShortWriteAt { offset, kind }, Reply::Stage(s)) => {
                let error = self.error(
                    rule,
                    op,
                    kind,
                    &format!("short write ending at byte {offset}"),
                );
                Reply::Stage(fault_stage(s, offset, true, error))
            }
            (Fault::ReadFailsAt { offset, kind }, Reply::Read(Some(mut r))) => {
                let msg = format!(
                    "injected fault: read failure at byte {offset} on {op} (rule {rule}, seed {})",
                    self.state.seed
                );
                r.reader = wrap_reader(
                    r.reader,
                    ReadFault {
                        at: offset,
                        fail: Some((kind, msg)),
                    },
                );
                Reply::Read(Some(r))
            }
            (Fault::ReadTruncatedAt { offset }, Reply::Read(Some(mut r))) => {
                r.reader = wrap_reader(
                    r.reader,
                    ReadFault {
                        at: offset,
                        fail: None,
                    },
                );
                Reply::Read(Some(r))
            }
            (_, reply) => reply,
        }
    }
}

/// `stage` with its writes failing from byte `at` on, keeping its kind.
fn fault_stage(stage: Stage, at: u64, short: bool, error: Error) -> Stage {
    let joint_error = error.clone();
    stage.map(
        |inner| Box::new(FaultStage::new(inner, at, short, error)),
        |inner| Box::new(FaultStage::new(inner, at, short, joint_error)),
    )
}

/// A stage whose writes fail from byte `at` on.
struct FaultStage<S: ?Sized> {
    inner: Box<S>,
    at: u64,
    short: bool,
    error: Error,
    written: u64,
    broken: bool,
}

impl<S: ?Sized> FaultStage<S> {
    fn new(inner: Box<S>, at: u64, short: bool, error: Error) -> Self {
        FaultStage {
            inner,
            at,
            short,
            error,
            written: 0,
            broken: false,
        }
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: StagedWrite + ?Sized> StagedWrite for FaultStage<S> {
    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        self.inner.set_outboard(outboard).await
    }

    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        if self.broken {
            return Err(self.error.clone());
        }
        let len = chunk.len() as u64;
        if self.written + len <= self.at {
            self.inner.write(chunk).await?;
            self.written += len;
            return Ok(());
        }
        self.broken = true;
        if self.short {
            let keep = self.at.saturating_sub(self.written) as usize;
            if keep > 0 {
                self.inner.write(chunk.slice(..keep)).await?;
                self.written += keep as u64;
            }
        }
        Err(self.error.clone())
    }

    async fn publish(self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        self.inner.publish(key).await
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        self.inner.abort().await
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: JointStagedWrite + ?Sized> JointStagedWrite for FaultStage<S> {
    async fn publish_pinned(self: Box<Self>, key: &Key, pin: &PinIntent) -> Result<PublishOutcome> {
        self.inner.publish_pinned(key, pin).await
    }
}

/// A read hook that ends or fails the stream at byte `at`.
struct ReadFault {
    at: u64,
    fail: Option<(io::ErrorKind, String)>,
}

impl ReadHook for ReadFault {
    fn before(&mut self, offset: u64, want: usize) -> ReadStep {
        if offset < self.at {
            let left = (self.at - offset).min(usize::MAX as u64) as usize;
            return ReadStep::Forward(want.min(left));
        }
        match &self.fail {
            Some((kind, msg)) => ReadStep::Fail(io::Error::new(*kind, msg.clone())),
            None => ReadStep::Eof,
        }
    }
}
