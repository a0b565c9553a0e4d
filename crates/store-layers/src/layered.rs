//! The forwarding base: an engine wrapped in one layer implements every
//! engine trait the inner engine does, forwarding every method.
//!
//! Each trait impl here is under `#[deny(clippy::missing_trait_methods)]`:
//! a method with a default body (`maintain`, `lock_instance`, `refs`,
//! `cache`, `stage_expecting`, the outboard hooks) that the wrapper did not
//! write would otherwise silently replace the inner engine's override.
//! Stages keep their kind ([`Stage::map`]): a joint stage stays joint.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{
    Capabilities, Digest, Engine, EntryMeta, InstanceLock, JointStagedWrite, Key, KvEngine,
    LargeEngine, Namespace, PinIntent, PublishOutcome, ReadOptions, RefStore, Result, SizedRead,
    Stage, StagedWrite, Tier, Timestamp, WindowDeletes,
};

use crate::layer::{wrong_reply, Call, EngineLayer, Reply};

/// An engine wrapped in one [`EngineLayer`].
///
/// `Layered<E>` implements [`Engine`] for any engine `E` (including
/// `dyn KvEngine` and `dyn LargeEngine`), [`KvEngine`] when `E` is one and
/// [`LargeEngine`] when `E` is one; the stages it opens are wrapped too,
/// so the layer sees their writes, publish and abort. Layers compose by
/// nesting: `Layered::new(Arc::new(Layered::new(inner, a)), b)` runs `b`
/// outside `a` (see [`crate::LayerStack`] for the builder form).
///
/// Cancel safety: each method is exactly as cancel-safe as the inner
/// engine's, provided the layers keep the [`EngineLayer`] contract (a
/// dropped call drops the inner call with it); `capabilities`, `refs` and
/// `cache` pass through without the layer (but the seam's
/// `window_deletes` in `capabilities` run through it: ADR-081).
pub struct Layered<E: ?Sized> {
    inner: Arc<E>,
    layer: Arc<dyn EngineLayer>,
    kind: &'static str,
    tier: Option<Tier>,
}

impl<E: Engine + ?Sized> Layered<E> {
    /// Wraps `inner` in `layer`.
    pub fn new(inner: Arc<E>, layer: impl EngineLayer) -> Self {
        Self::with_shared(inner, Arc::new(layer), None)
    }

    /// Wraps `inner` in a shared `layer`, telling it which tier `inner`
    /// serves (reported in every [`Call`]).
    pub fn with_shared(inner: Arc<E>, layer: Arc<dyn EngineLayer>, tier: Option<Tier>) -> Self {
        let kind = inner.capabilities().kind;
        Layered {
            inner,
            layer,
            kind,
            tier,
        }
    }

    /// The wrapped engine.
    pub fn inner(&self) -> &Arc<E> {
        &self.inner
    }

    fn call(&self, op: crate::Op) -> Call<'static> {
        Call::new(op, self.kind, self.tier)
    }
}

impl<E: ?Sized> std::fmt::Debug for Layered<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layered")
            .field("engine", &self.kind)
            .field("tier", &self.tier)
            .finish_non_exhaustive()
    }
}

/// Runs `$next` (a future of `Result<Reply>`, built afresh for each run)
/// through the layer as a repeatable call and unpacks the `$variant` reply.
macro_rules! through {
    ($self:ident, $call:expr, $variant:ident, $next:expr) => {{
        let call = $call;
        let op = call.op;
        let rerun = || Box::pin($next) as crate::layer::Next<'_>;
        let reply = $self.layer.around_repeatable(call, &rerun).await?;
        match reply {
            Reply::$variant(v) => Ok(v),
            other => Err(wrong_reply(op, &other)),
        }
    }};
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<E: Engine + ?Sized> Engine for Layered<E> {
    /// The inner engine's, with its seam's `window_deletes` (ADR-081)
    /// wrapped in the layer: a sweep's deletes through them are seen as
    /// [`Op::DeleteMany`](crate::Op::DeleteMany) calls, like
    /// `delete_many`'s.
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if let Some(seam) = caps.seam.as_mut() {
            seam.window_deletes = seam.window_deletes.take().map(|inner| {
                Arc::new(LayeredDeletes {
                    inner,
                    layer: self.layer.clone(),
                    kind: self.kind,
                    tier: self.tier,
                }) as Arc<dyn WindowDeletes>
            });
        }
        caps
    }

    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
        let mut call = self.call(crate::Op::Meta);
        call.ns = Some(&key.namespace);
        call.digest = Some(&key.digest);
        through!(self, call, Meta, async move {
            self.inner.meta(key).await.map(Reply::Meta)
        })
    }

    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let mut call = self.call(crate::Op::HasMany);
        call.ns = Some(ns);
        call.digests = digests;
        through!(self, call, Presence, async move {
            self.inner.has_many(ns, digests).await.map(Reply::Presence)
        })
    }

    /// Seen by layers as an [`Op::Read`](crate::Op::Read); a ranged read
    /// carries the requested range's start and length (the span it
    /// resolves to is known only once the inner engine has sized the
    /// entry).
    async fn read(&self, key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>> {
        let mut call = self.call(crate::Op::Read);
        call.ns = Some(&key.namespace);
        call.digest = Some(&key.digest);
        if let Some(request) = &options.range {
            call.offset = request.range.start;
            call.len = request.range.end.saturating_sub(request.range.start);
        }
        through!(self, call, Read, async move {
            self.inner.read(key, options).await.map(Reply::Read)
        })
    }

    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>> {
        let mut call = self.call(crate::Op::DeleteMany);
        call.ns = Some(ns);
        call.digests = digests;
        through!(self, call, Freed, async move {
            self.inner.delete_many(ns, digests).await.map(Reply::Freed)
        })
    }

    async fn namespaces(&self) -> Result<Vec<Namespace>> {
        through!(
            self,
            self.call(crate::Op::Namespaces),
            Namespaces,
            async move { self.inner.namespaces().await.map(Reply::Namespaces) }
        )
    }

    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>> {
        let mut call = self.call(crate::Op::Scan);
        call.ns = Some(ns);
        call.digest = after.as_ref();
        call.len = limit as u64;
        through!(self, call, Scan, async move {
            self.inner.scan(ns, after, limit).await.map(Reply::Scan)
        })
    }

    async fn maintain(&self, now: Timestamp) -> Result<u64> {
        through!(
            self,
            self.call(crate::Op::Maintain),
            Maintained,
            async move { self.inner.maintain(now).await.map(Reply::Maintained) }
        )
    }

    async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
        through!(self, self.call(crate::Op::LockInstance), Lock, async move {
            self.inner.lock_instance().await.map(Reply::Lock)
        })
    }

    // The outboard hooks (ADR-032) pass straight through, like `capabilities`:
    // the facade validates whatever they return against the digest, so a
    // layer has nothing to add to them yet (not yet layer operations).
    async fn read_outboard(&self, key: &Key) -> Result<Option<Bytes>> {
        self.inner.read_outboard(key).await
    }

    async fn store_outboard(&self, key: &Key, outboard: Bytes) -> Result<()> {
        self.inner.store_outboard(key, outboard).await
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<E: KvEngine + ?Sized> KvEngine for Layered<E> {
    async fn put(&self, key: &Key, bytes: Bytes) -> Result<PublishOutcome> {
        let mut call = self.call(crate::Op::Put);
        call.ns = Some(&key.namespace);
        call.digest = Some(&key.digest);
        call.len = bytes.len() as u64;
        through!(self, call, Published, {
            let bytes = bytes.clone();
            async move { self.inner.put(key, bytes).await.map(Reply::Published) }
        })
    }

    fn refs(&self) -> Option<Arc<dyn RefStore>> {
        self.inner.refs()
    }

    fn cache(&self) -> Option<Arc<dyn store_types::CacheIndex>> {
        self.inner.cache()
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<E: LargeEngine + ?Sized> LargeEngine for Layered<E> {
    async fn stage(&self, ns: &Namespace) -> Result<Stage> {
        let mut call = self.call(crate::Op::Stage);
        call.ns = Some(ns);
        let stage: Stage = through!(self, call, Stage, async move {
            self.inner.stage(ns).await.map(Reply::Stage)
        })?;
        Ok(self.wrap_stage(stage, ns, None))
    }

    async fn stage_expecting(&self, ns: &Namespace, digest: &Digest) -> Result<Stage> {
        let mut call = self.call(crate::Op::StageExpecting);
        call.ns = Some(ns);
        call.digest = Some(digest);
        let stage: Stage = through!(self, call, Stage, async move {
            self.inner
                .stage_expecting(ns, digest)
                .await
                .map(Reply::Stage)
        })?;
        Ok(self.wrap_stage(stage, ns, Some(*digest)))
    }
}

impl<E: Engine + ?Sized> Layered<E> {
    /// `stage` seen through the layer, keeping its kind.
    fn wrap_stage(&self, stage: Stage, ns: &Namespace, expected: Option<Digest>) -> Stage {
        stage.map(
            |inner| Box::new(self.layered_stage(inner, ns, expected)),
            |inner| Box::new(self.layered_stage(inner, ns, expected)),
        )
    }

    fn layered_stage<S: ?Sized>(
        &self,
        inner: Box<S>,
        ns: &Namespace,
        expected: Option<Digest>,
    ) -> LayeredStage<S> {
        LayeredStage {
            inner,
            layer: self.layer.clone(),
            kind: self.kind,
            tier: self.tier,
            ns: ns.clone(),
            expected,
            written: 0,
        }
    }
}

/// A stage opened through a [`Layered`] engine: every method goes through
/// the layer (as [`Op::Write`](crate::Op::Write), `Publish`,
/// `PublishPinned`, `Abort`) and then to the inner stage. Dropping it
/// drops the inner stage (the engine's own drop cleanup).
pub(crate) struct LayeredStage<S: ?Sized> {
    inner: Box<S>,
    layer: Arc<dyn EngineLayer>,
    kind: &'static str,
    tier: Option<Tier>,
    ns: Namespace,
    expected: Option<Digest>,
    written: u64,
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: StagedWrite + ?Sized> StagedWrite for LayeredStage<S> {
    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        self.inner.set_outboard(outboard).await
    }

    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        let len = chunk.len() as u64;
        let mut call = Call::new(crate::Op::Write, self.kind, self.tier);
        call.ns = Some(&self.ns);
        call.digest = self.expected.as_ref();
        call.offset = self.written;
        call.len = len;
        let inner = &mut self.inner;
        let reply = self
            .layer
            .around(
                call,
                Box::pin(async move { inner.write(chunk).await.map(|()| Reply::Done) }),
            )
            .await?;
        match reply {
            Reply::Done => {
                self.written += len;
                Ok(())
            }
            other => Err(wrong_reply(crate::Op::Write, &other)),
        }
    }

    async fn publish(self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        let reply = self
            .finish(crate::Op::Publish, Some(&key.digest), |inner| {
                Box::pin(async move { inner.publish(key).await.map(Reply::Published) })
            })
            .await?;
        published(crate::Op::Publish, reply)
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        let expected = self.expected;
        let reply = self
            .finish(crate::Op::Abort, expected.as_ref(), |inner| {
                Box::pin(async move { inner.abort().await.map(|()| Reply::Done) })
            })
            .await?;
        match reply {
            Reply::Done => Ok(()),
            other => Err(wrong_reply(crate::Op::Abort, &other)),
        }
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: JointStagedWrite + ?Sized> JointStagedWrite for LayeredStage<S> {
    async fn publish_pinned(self: Box<Self>, key: &Key, pin: &PinIntent) -> Result<PublishOutcome> {
        let reply = self
            .finish(crate::Op::PublishPinned, Some(&key.digest), |inner| {
                Box::pin(async move { inner.publish_pinned(key, pin).await.map(Reply::Published) })
            })
            .await?;
        published(crate::Op::PublishPinned, reply)
    }
}

impl<S: ?Sized> LayeredStage<S> {
    /// Runs the stage's last operation `op` (`run` on the inner stage)
    /// through the layer, addressing `digest`.
    async fn finish<'a>(
        self: Box<Self>,
        op: crate::Op,
        digest: Option<&'a Digest>,
        run: impl FnOnce(Box<S>) -> crate::layer::Next<'a>,
    ) -> Result<Reply>
    where
        S: 'a,
    {
        let LayeredStage {
            inner,
            layer,
            kind,
            tier,
            ns,
            ..
        } = *self;
        let mut call = Call::new(op, kind, tier);
        call.ns = Some(&ns);
        call.digest = digest;
        layer.around(call, run(inner)).await
    }
}

/// The outcome a publish answered, or the wrong-reply error.
fn published(op: crate::Op, reply: Reply) -> Result<PublishOutcome> {
    match reply {
        Reply::Published(outcome) => Ok(outcome),
        other => Err(wrong_reply(op, &other)),
    }
}

/// Layers applied in order, innermost first: `LayerStack::new().layer(a)
/// .layer(b)` wraps an engine in `a`, then the result in `b`, so `b` sees
/// each call first (as OpenDAL's `Operator::layer`). One stack can wrap
/// several engines; its layers are shared (`Arc`), so a metrics layer
/// added once counts both.
#[derive(Clone, Default)]
pub struct LayerStack {
    layers: Vec<Arc<dyn EngineLayer>>,
}

impl LayerStack {
    /// An empty stack (wrapping with it returns the engine unchanged).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `layer` outside the ones already added.
    pub fn layer(self, layer: impl EngineLayer) -> Self {
        self.layer_shared(Arc::new(layer))
    }

    /// Adds a shared `layer` outside the ones already added.
    pub fn layer_shared(mut self, layer: Arc<dyn EngineLayer>) -> Self {
        self.layers.push(layer);
        self
    }

    /// Whether the stack holds no layer.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Wraps a kv engine in every layer (calls report [`Tier::Kv`]).
    pub fn kv(&self, mut engine: Arc<dyn KvEngine>) -> Arc<dyn KvEngine> {
        for layer in &self.layers {
            engine = Arc::new(Layered::with_shared(engine, layer.clone(), Some(Tier::Kv)));
        }
        engine
    }

    /// Wraps a large engine in every layer (calls report [`Tier::Large`]).
    pub fn large(&self, mut engine: Arc<dyn LargeEngine>) -> Arc<dyn LargeEngine> {
        for layer in &self.layers {
            engine = Arc::new(Layered::with_shared(
                engine,
                layer.clone(),
                Some(Tier::Large),
            ));
        }
        engine
    }
}

impl std::fmt::Debug for LayerStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerStack")
            .field("layers", &self.layers.len())
            .finish()
    }
}

/// A seam's [`WindowDeletes`] behind a [`Layered`] engine's layer
/// (ADR-081): each call is an [`Op::DeleteMany`](crate::Op::DeleteMany)
/// of the engine, so the layer sees a sweep's deletes whichever way they
/// reach the engine.
struct LayeredDeletes {
    inner: Arc<dyn WindowDeletes>,
    layer: Arc<dyn EngineLayer>,
    kind: &'static str,
    tier: Option<Tier>,
}

#[async_trait]
impl WindowDeletes for LayeredDeletes {
    async fn delete_unstaging(
        &self,
        ns: &Namespace,
        digests: &[Digest],
    ) -> Result<Vec<Option<u64>>> {
        let mut call = Call::new(crate::Op::DeleteMany, self.kind, self.tier);
        call.ns = Some(ns);
        call.digests = digests;
        through!(self, call, Freed, async move {
            self.inner
                .delete_unstaging(ns, digests)
                .await
                .map(Reply::Freed)
        })
    }
}
