//! The layer trait: what a layer sees of each call and how it wraps it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use store_types::{
    Digest, EntryMeta, Error, InstanceLock, Namespace, PublishOutcome, Result, SizedRead, Stage,
    Tier,
};

/// A boxed, sendable future borrowing for `'a`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The rest of a call, below a layer: the inner engine (through the layers
/// beneath) doing the operation. A layer's [`EngineLayer::around`] gets one
/// and decides whether, when and how it runs.
pub type Next<'a> = BoxFuture<'a, Result<Reply>>;

/// A call the base can start again: each invocation runs the operation
/// afresh through the layers beneath. The base offers one for every
/// engine operation (`meta` to `stage_expecting`), never for a stage's
/// (a written chunk or a published stage cannot be had back).
pub type Rerun<'a> = &'a (dyn Fn() -> Next<'a> + Send + Sync);

/// An engine operation a layer can see. The synchronous, side-effect-free
/// methods (`capabilities`, `refs`, `cache`) are not
/// operations: the forwarding base passes them straight through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Op {
    /// [`Engine::meta`](store_types::Engine::meta).
    Meta,
    /// [`Engine::has_many`](store_types::Engine::has_many).
    HasMany,
    /// [`Engine::read`](store_types::Engine::read): sizing the entry and
    /// opening the stream of the whole or of the planned span.
    Read,
    /// [`Engine::delete_many`](store_types::Engine::delete_many).
    DeleteMany,
    /// [`Engine::namespaces`](store_types::Engine::namespaces).
    Namespaces,
    /// [`Engine::scan`](store_types::Engine::scan).
    Scan,
    /// [`Engine::maintain`](store_types::Engine::maintain).
    Maintain,
    /// [`Engine::lock_instance`](store_types::Engine::lock_instance).
    LockInstance,
    /// [`KvEngine::put`](store_types::KvEngine::put).
    Put,
    /// [`LargeEngine::stage`](store_types::LargeEngine::stage).
    Stage,
    /// [`LargeEngine::stage_expecting`](store_types::LargeEngine::stage_expecting).
    StageExpecting,
    /// [`StagedWrite::write`](store_types::StagedWrite::write).
    Write,
    /// [`StagedWrite::publish`](store_types::StagedWrite::publish).
    Publish,
    /// [`JointStagedWrite::publish_pinned`](store_types::JointStagedWrite::publish_pinned).
    PublishPinned,
    /// [`StagedWrite::abort`](store_types::StagedWrite::abort).
    Abort,
}

impl Op {
    /// Every operation, in declaration order.
    pub const ALL: [Op; 15] = [
        Op::Meta,
        Op::HasMany,
        Op::Read,
        Op::DeleteMany,
        Op::Namespaces,
        Op::Scan,
        Op::Maintain,
        Op::LockInstance,
        Op::Put,
        Op::Stage,
        Op::StageExpecting,
        Op::Write,
        Op::Publish,
        Op::PublishPinned,
        Op::Abort,
    ];

    /// The operation's stable snake_case name (metric labels, span fields).
    pub fn name(self) -> &'static str {
        match self {
            Op::Meta => "meta",
            Op::HasMany => "has_many",
            Op::Read => "read",
            Op::DeleteMany => "delete_many",
            Op::Namespaces => "namespaces",
            Op::Scan => "scan",
            Op::Maintain => "maintain",
            Op::LockInstance => "lock_instance",
            Op::Put => "put",
            Op::Stage => "stage",
            Op::StageExpecting => "stage_expecting",
            Op::Write => "write",
            Op::Publish => "publish",
            Op::PublishPinned => "publish_pinned",
            Op::Abort => "abort",
        }
    }

    /// The index of this operation in [`Op::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a layer knows about one call, before it runs.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Call<'a> {
    /// The operation.
    pub op: Op,
    /// The wrapped engine's kind (`Capabilities::kind`: `"sqlite"`, ...).
    pub engine: &'static str,
    /// The tier the engine serves, when the wrapper was told
    /// ([`crate::LayerStack::kv`] and [`crate::LayerStack::large`] say).
    pub tier: Option<Tier>,
    /// The namespace addressed (every operation but `namespaces`,
    /// `maintain` and `lock_instance`; a stage's operations carry the
    /// namespace it was opened for).
    pub ns: Option<&'a Namespace>,
    /// The one digest addressed: the key's for `meta`, `read`, `put`,
    /// `publish`; the expected one for
    /// `stage_expecting` and the stage it opened; `scan`'s `after`.
    pub digest: Option<&'a Digest>,
    /// The digests of `has_many` and `delete_many` (empty otherwise).
    pub digests: &'a [Digest],
    /// `write`: how many bytes the stage held before this chunk; a ranged
    /// `read`: the requested range's start. 0 otherwise.
    pub offset: u64,
    /// `write` and `put`: the chunk's or entry's length; a ranged `read`:
    /// the requested range's length; `scan`: the limit. 0 otherwise.
    pub len: u64,
}

impl<'a> Call<'a> {
    /// A call of `op` on an engine of kind `engine`, addressing nothing yet.
    pub fn new(op: Op, engine: &'static str, tier: Option<Tier>) -> Self {
        Call {
            op,
            engine,
            tier,
            ns: None,
            digest: None,
            digests: &[],
            offset: 0,
            len: 0,
        }
    }
}

/// What an operation answered, type-erased so one [`EngineLayer::around`]
/// serves every operation. Each [`Op`] answers with exactly one variant;
/// the forwarding base turns any other answer from a layer into an error.
#[non_exhaustive]
pub enum Reply {
    /// `meta`.
    Meta(Option<EntryMeta>),
    /// `has_many`.
    Presence(Vec<bool>),
    /// `read`.
    Read(Option<SizedRead>),
    /// `delete_many`.
    Freed(Vec<Option<u64>>),
    /// `namespaces`.
    Namespaces(Vec<Namespace>),
    /// `scan`.
    Scan(Vec<(Digest, u64)>),
    /// `maintain`: how many leftovers were removed.
    Maintained(u64),
    /// `lock_instance`.
    Lock(Option<InstanceLock>),
    /// `put`, `publish`, `publish_pinned`.
    Published(PublishOutcome),
    /// `stage`, `stage_expecting`. A layer may wrap the stage (to fault
    /// its writes); the base still routes every later stage operation
    /// through the layer's `around`.
    Stage(Stage),
    /// `write`, `abort`.
    Done,
}

impl Reply {
    /// The variant's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Reply::Meta(_) => "meta",
            Reply::Presence(_) => "presence",
            Reply::Read(_) => "read",
            Reply::Freed(_) => "freed",
            Reply::Namespaces(_) => "namespaces",
            Reply::Scan(_) => "scan",
            Reply::Maintained(_) => "maintained",
            Reply::Lock(_) => "lock",
            Reply::Published(_) => "published",
            Reply::Stage(_) => "stage",
            Reply::Done => "done",
        }
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error the forwarding base returns when a layer answered `op` with
/// the wrong kind of [`Reply`] (a bug in that layer; never a panic).
pub(crate) fn wrong_reply(op: Op, reply: &Reply) -> Error {
    Error::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!(
            "engine layer answered {op} with a {} reply (a bug in the layer)",
            reply.name()
        ),
    ))
}

/// One layer around an engine: it sees every operation of the engine (and
/// of the stages it opens) and decides how the rest of the call runs.
///
/// A layer does not implement the engine traits itself: wrap an engine
/// with [`crate::Layered::new`] (or several layers with
/// [`crate::LayerStack`]) and the forwarding base implements them,
/// passing every method through — including the default-bodied ones — and
/// every operation through [`EngineLayer::around`].
///
/// # Contract
///
/// - `around` returns a future that either runs `next` to completion and
///   answers with its result (possibly after a delay, possibly observing
///   or replacing it — an error instead of a success models a lost
///   acknowledgement), or answers **without** running `next`, with an
///   error (an injected fault) or with a reply it obtained itself (e.g. by
///   running the operation detached on its own handle to the engine).
/// - Any reply must be the variant `call.op` answers with (see [`Reply`]);
///   the base turns a wrong variant into an error, never a panic.
/// - Errors must be ones the engine contract allows for that operation:
///   media and backend failures ([`Error::Io`], [`Error::Backend`]) and
///   the typed errors the inner engine itself produced. A layer never
///   panics, and never returns `Ok` for a write that did not happen.
/// - Dropping the future `around` returned must drop `next` (or whatever
///   runs the operation) with it, unless the layer documents that it
///   detaches the operation; the cancel-safety of each engine method is
///   then the inner engine's.
/// - `around` is called concurrently from many tasks; a layer keeps its
///   state behind atomics or short locks, never held across an `.await`
///   of `next`.
pub trait EngineLayer: Send + Sync + 'static {
    /// Runs (or replaces) one operation. The default runs `next` as is.
    fn around<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> Next<'a> {
        let _ = call;
        next
    }

    /// Runs (or replaces) an engine operation the base can start again
    /// ([`Rerun`]); the [`EngineLayer::around`] contract holds for each
    /// run. The default runs it once through `around`.
    fn around_repeatable<'a>(&'a self, call: Call<'a>, rerun: Rerun<'a>) -> Next<'a> {
        self.around(call, rerun())
    }
}

impl<L: EngineLayer + ?Sized> EngineLayer for Arc<L> {
    fn around<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> Next<'a> {
        (**self).around(call, next)
    }

    fn around_repeatable<'a>(&'a self, call: Call<'a>, rerun: Rerun<'a>) -> Next<'a> {
        (**self).around_repeatable(call, rerun)
    }
}
