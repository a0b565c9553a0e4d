//! An engine wrapper that holds a delete in flight, for the GC-edge cases:
//! cancellation, fenced fleet deletes, busy keys.
//!
//! [`hooked_kv`] and [`hooked_large`] wrap an engine in the forwarding
//! base of `store-layers` (everything reaches the engine unchanged) with
//! one layer, [`DeleteHookLayer`]: its `delete_many` runs the inner delete
//! in a **detached task** — as engines that delete on the blocking pool or
//! through in-flight requests do — so dropping the caller's future never
//! stops a delete that has started.
//! Once [`DeleteHook::arm`]ed, the next `delete_many` announces itself
//! ([`DeleteHook::entered`]), runs the hook's `on_enter` action, and waits
//! for [`DeleteHook::release`] before deleting; [`DeleteHook::fail_deletes`]
//! makes them fail without deleting (a sweeper that died mid-way).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use store_layers::{Call, EngineLayer, Layered, Next, Op, Reply};
use store_types::{Engine, Error, KvEngine, LargeEngine};
use tokio::sync::Semaphore;

type OnEnter = Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Controls the deletes of an engine wrapped by [`hooked_kv`] or [`hooked_large`].
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

/// Wraps a kv engine so that `hook` controls its deletes.
pub fn hooked_kv(engine: Arc<dyn KvEngine>, hook: Arc<DeleteHook>) -> Arc<dyn KvEngine> {
    let layer = DeleteHookLayer {
        hook,
        engine: engine.clone(),
    };
    Arc::new(Layered::new(engine, layer))
}

/// Wraps a large engine so that `hook` controls its deletes.
pub fn hooked_large(engine: Arc<dyn LargeEngine>, hook: Arc<DeleteHook>) -> Arc<dyn LargeEngine> {
    let layer = DeleteHookLayer {
        hook,
        engine: engine.clone(),
    };
    Arc::new(Layered::new(engine, layer))
}

/// The layer behind [`hooked_kv`] and [`hooked_large`]: every operation
/// but `delete_many` passes through; `delete_many` runs detached on the
/// layer's own handle to the wrapped engine, after the hook's hold (the
/// layer answers it itself and never runs the base's `next`).
pub struct DeleteHookLayer {
    hook: Arc<DeleteHook>,
    engine: Arc<dyn Engine>,
}

impl EngineLayer for DeleteHookLayer {
    fn around<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> Next<'a> {
        if call.op != Op::DeleteMany {
            return next;
        }
        drop(next);
        let hook = self.hook.clone();
        let inner = self.engine.clone();
        let ns = call.ns.cloned();
        let digests = call.digests.to_vec();
        Box::pin(async move {
            let ns =
                ns.ok_or_else(|| Error::from(std::io::Error::other("delete without a namespace")))?;
            if hook.fail.load(Ordering::SeqCst) {
                return Err(Error::from(std::io::Error::other(
                    "injected: the sweeper died before deleting",
                )));
            }
            let armed = hook.armed.swap(false, Ordering::SeqCst);
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
            let freed = task
                .await
                .map_err(|e| Error::from(std::io::Error::other(format!("delete task: {e}"))))??;
            Ok(Reply::Freed(freed))
        })
    }
}
