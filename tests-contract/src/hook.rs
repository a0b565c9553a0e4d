//! An engine wrapper that holds a delete in flight, for the GC-edge cases:
//! cancellation, fenced fleet deletes, busy keys.
//!
//! [`Hooked`] forwards everything to the engine it wraps. Its
//! `delete_many` runs the inner delete in a **detached task** — as engines
//! that delete on the blocking pool or through in-flight requests do — so
//! dropping the caller's future never stops a delete that has started.
//! Once [`DeleteHook::arm`]ed, the next `delete_many` announces itself
//! ([`DeleteHook::entered`]), runs the hook's `on_enter` action, and waits
//! for [`DeleteHook::release`] before deleting; [`DeleteHook::fail_deletes`]
//! makes them fail without deleting (a sweeper that died mid-way).

use std::future::Future;
use std::ops::Range;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{
    BlobReader, Digest, Engine, EngineDescriptor, EntryMeta, Error, GcSeam, InstanceLock, Key,
    KvEngine, LargeEngine, Namespace, PublishOutcome, Result, StagedWrite, Timestamp,
};
use tokio::sync::Semaphore;

type OnEnter = Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Controls a [`Hooked`] engine's deletes.
pub struct DeleteHook {
    armed: AtomicBool,
    fail: AtomicBool,
    entered: Semaphore,
    release: Semaphore,
    on_enter: Mutex<Option<Arc<OnEnter>>>,
}

impl DeleteHook {
    /// A disarmed hook.
    pub fn new() -> Arc<Self> {
        Arc::new(DeleteHook {
            armed: AtomicBool::new(false),
            fail: AtomicBool::new(false),
            entered: Semaphore::new(0),
            release: Semaphore::new(0),
            on_enter: Mutex::new(None),
        })
    }

    /// Holds the next `delete_many` until [`DeleteHook::release`].
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Makes every `delete_many` fail without deleting anything while `on`
    /// (a sweeper that cannot delete: it died, or its media refuse).
    pub fn fail_deletes(&self, on: bool) {
        self.fail.store(on, Ordering::SeqCst);
    }

    /// Runs `f` inside the held delete, before it waits for release.
    pub fn on_enter<F, Fut>(&self, f: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let boxed: OnEnter = Box::new(move || Box::pin(f()));
        *self.on_enter.lock().unwrap() = Some(Arc::new(boxed));
    }

    /// Waits until an armed delete has started (and run `on_enter`).
    pub async fn entered(&self) {
        self.entered.acquire().await.expect("open").forget();
    }

    /// Lets the held delete go on.
    pub fn release(&self) {
        self.release.add_permits(1);
    }
}

/// An engine whose deletes a [`DeleteHook`] controls.
pub struct Hooked<E: ?Sized>(pub Arc<E>, pub Arc<DeleteHook>);

async fn hooked_delete(
    hook: Arc<DeleteHook>,
    inner: Arc<dyn Engine>,
    ns: &Namespace,
    digests: &[Digest],
) -> Result<Vec<Option<u64>>> {
    if hook.fail.load(Ordering::SeqCst) {
        return Err(Error::io(store_types::ErrorKind::Other, "injected delete")
            .with_source("injected: the sweeper died before deleting"));
    }
    let armed = hook.armed.swap(false, Ordering::SeqCst);
    let ns = ns.clone();
    let digests = digests.to_vec();
    let task = tokio::spawn(async move {
        if armed {
            let action = hook.on_enter.lock().unwrap().clone();
            if let Some(action) = action {
                action().await;
            }
            hook.entered.add_permits(1);
            hook.release.acquire().await.expect("open").forget();
        }
        inner.delete_many(&ns, &digests).await
    });
    task.await.expect("delete task")
}

macro_rules! hooked_engine {
    ($dyn:ty) => {
        #[async_trait]
        impl Engine for Hooked<$dyn> {
            fn descriptor(&self) -> EngineDescriptor {
                self.0.descriptor()
            }
            async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>> {
                self.0.meta(key).await
            }
            async fn has_many(&self, ns: &Namespace, d: &[Digest]) -> Result<Vec<bool>> {
                self.0.has_many(ns, d).await
            }
            async fn read(&self, key: &Key) -> Result<Option<BlobReader>> {
                self.0.read(key).await
            }
            async fn read_range(&self, key: &Key, r: Range<u64>) -> Result<Option<BlobReader>> {
                self.0.read_range(key, r).await
            }
            async fn delete_many(&self, ns: &Namespace, d: &[Digest]) -> Result<Vec<Option<u64>>> {
                let inner: Arc<dyn Engine> = self.0.clone();
                hooked_delete(self.1.clone(), inner, ns, d).await
            }
            async fn namespaces(&self) -> Result<Vec<Namespace>> {
                self.0.namespaces().await
            }
            async fn scan(
                &self,
                ns: &Namespace,
                after: Option<Digest>,
                limit: usize,
            ) -> Result<Vec<(Digest, u64)>> {
                self.0.scan(ns, after, limit).await
            }
            fn gc_seam(&self) -> Option<GcSeam> {
                self.0.gc_seam()
            }
            async fn maintain(&self, now: Timestamp) -> Result<u64> {
                self.0.maintain(now).await
            }
            async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
                self.0.lock_instance().await
            }
        }
    };
}

hooked_engine!(dyn KvEngine);
hooked_engine!(dyn LargeEngine);

#[async_trait]
impl KvEngine for Hooked<dyn KvEngine> {
    async fn put(&self, key: &Key, bytes: Bytes) -> Result<PublishOutcome> {
        self.0.put(key, bytes).await
    }

    fn refs(&self) -> Option<Arc<dyn store_types::RefStore>> {
        self.0.refs()
    }
}

#[async_trait]
impl LargeEngine for Hooked<dyn LargeEngine> {
    async fn stage(&self, ns: &Namespace) -> Result<Box<dyn StagedWrite>> {
        self.0.stage(ns).await
    }
    async fn stage_expecting(
        &self,
        ns: &Namespace,
        expected: &Digest,
    ) -> Result<Box<dyn StagedWrite>> {
        self.0.stage_expecting(ns, expected).await
    }
    fn joint_pin_publish(&self) -> bool {
        self.0.joint_pin_publish()
    }
}
