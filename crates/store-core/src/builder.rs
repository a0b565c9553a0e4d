use std::sync::Arc;
use std::time::Duration;

use store_gc::{Clock, Collector, GcConfig, InProcessWindow, SystemClock};
use store_types::{
    Capabilities, Error, GcSeam, InstanceLock, KvEngine, LargeEngine, Result, Sharing,
    WindowClauses,
};

use crate::fleet;
use crate::store::{Inner, Store};

/// Default kv/large threshold: 64 KiB (ADR-014). Entries of at most this
/// many bytes live in the kv tier.
pub const DEFAULT_THRESHOLD: u64 = 64 * 1024;

/// Largest accepted threshold: 16 MiB. A put buffers up to the threshold
/// in memory before it knows which tier it goes to, and kv engines hold an
/// entry as one row.
pub const MAX_THRESHOLD: u64 = 16 * 1024 * 1024;

/// Default delete window: 1 hour.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

/// Default fleet pin-row lifetime: 15 minutes.
pub const DEFAULT_PIN_TTL: Duration = Duration::from_secs(900);

/// How the store dispatches entries (SPEC §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One process-local kv engine, no large tier, any size, ephemeral.
    MemOnly,
    /// One kv engine, no large tier; puts over `threshold` are rejected at
    /// put time with [`Error::TooLarge`] (ADR-012 §6.2).
    KvOnly {
        /// Largest accepted entry, in bytes.
        threshold: u64,
    },
    /// Entries of at most `threshold` bytes go to the kv engine, larger
    /// ones to the large engine.
    DualTier {
        /// Largest kv entry, in bytes.
        threshold: u64,
    },
}

impl Mode {
    /// The tier boundary, if any.
    pub fn threshold(&self) -> Option<u64> {
        match self {
            Mode::MemOnly => None,
            Mode::KvOnly { threshold } | Mode::DualTier { threshold } => Some(*threshold),
        }
    }
}

/// Builds a [`Store`]; see [`Store::builder`].
pub struct StoreBuilder {
    kv: Option<Arc<dyn KvEngine>>,
    large: Option<Arc<dyn LargeEngine>>,
    mode: Option<Mode>,
    fleet: bool,
    window: Duration,
    pin_ttl: Duration,
    clock: Arc<dyn Clock>,
    owner: Option<String>,
    outboard_cache_bytes: usize,
    outboards_at_put: bool,
}

impl Default for StoreBuilder {
    fn default() -> Self {
        StoreBuilder {
            kv: None,
            large: None,
            mode: None,
            fleet: false,
            window: DEFAULT_WINDOW,
            pin_ttl: DEFAULT_PIN_TTL,
            clock: Arc::new(SystemClock),
            owner: None,
            outboard_cache_bytes: crate::verified::DEFAULT_OUTBOARD_CACHE_BYTES,
            outboards_at_put: true,
        }
    }
}

impl std::fmt::Debug for StoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreBuilder")
            .field("kv", &self.kv.as_ref().map(|e| e.capabilities().kind))
            .field("large", &self.large.as_ref().map(|e| e.capabilities().kind))
            .field("mode", &self.mode)
            .field("fleet", &self.fleet)
            .field("window", &self.window)
            .finish()
    }
}

impl StoreBuilder {
    /// The kv engine (required).
    pub fn kv(self, engine: impl KvEngine) -> Self {
        self.kv_shared(Arc::new(engine))
    }

    /// The kv engine, already shared.
    pub fn kv_shared(mut self, engine: Arc<dyn KvEngine>) -> Self {
        self.kv = Some(engine);
        self
    }

    /// The large engine (dual-tier only).
    pub fn large(self, engine: impl LargeEngine) -> Self {
        self.large_shared(Arc::new(engine))
    }

    /// The large engine, already shared.
    pub fn large_shared(mut self, engine: Arc<dyn LargeEngine>) -> Self {
        self.large = Some(engine);
        self
    }

    /// The dispatch mode. Default: `DualTier` with [`DEFAULT_THRESHOLD`]
    /// when a large engine is set, else `KvOnly` with it.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Fleet admission (ADR-012 §3): never inferred. Default `false`.
    pub fn fleet(mut self, fleet: bool) -> Self {
        self.fleet = fleet;
        self
    }

    /// The delete-window length. Default one hour.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = window;
        self
    }

    /// Fleet pin-row lifetime. Default 15 minutes. Ignored without fleet.
    pub fn pin_ttl(mut self, ttl: Duration) -> Self {
        self.pin_ttl = ttl;
        self
    }

    /// The GC clock (tests inject a [`store_gc::ManualClock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The memory budget of the cache of validated outboards that verified
    /// range reads use (ADR-032). Default 64 MiB; 0 disables the cache
    /// (every range read then loads and checks the entry's outboard).
    pub fn outboard_cache_bytes(mut self, bytes: usize) -> Self {
        self.outboard_cache_bytes = bytes;
        self
    }

    /// Whether a large put builds the entry's BLAKE3 outboard while it
    /// streams and publishes it with the entry (ADR-032; entries over
    /// [`crate::OUTBOARD_KEPT_ABOVE`] only, TUNING.md §small-outboards). Default `true`.
    /// `false` hashes with a plain BLAKE3 hasher and publishes no outboard:
    /// such entries get theirs lazily, on their first range read (one
    /// verified whole read). For stores whose large entries are only ever
    /// read whole, and for measuring the outboard's cost.
    pub fn outboards_at_put(mut self, on: bool) -> Self {
        self.outboards_at_put = on;
        self
    }

    /// The owner name this instance writes into fleet pin rows. Default: a
    /// random name per instance.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Validates the configuration, prepares GC state and opens the store.
    ///
    /// A non-fleet store takes the **instance lock** of each engine
    /// ([`Engine::lock_instance`](store_types::Engine::lock_instance))
    /// before it writes anything, and holds it until its last clone drops:
    /// a second non-fleet store on the same data, in this or another
    /// process, fails here with [`Error::InstanceLocked`] naming the
    /// holder. Fleet members (`fleet(true)`) are declared and do not lock.
    pub async fn build(self) -> Result<Store> {
        let kv = self
            .kv
            .ok_or_else(|| Error::Config("a kv engine is required".into()))?;
        let kv_caps = kv.capabilities();
        let large_caps = self.large.as_ref().map(|l| l.capabilities());
        let mode = check_mode(self.mode, &kv_caps, large_caps.as_ref())?;
        let kv_seam = kv_caps.seam.clone();
        let large_seam = large_caps.as_ref().and_then(|l| l.seam.clone());
        if self.fleet && self.pin_ttl.is_zero() {
            return Err(Error::Config(
                "fleet pin_ttl must be greater than zero".into(),
            ));
        }
        let fleet_state = if self.fleet {
            Some(fleet::validate(
                mode,
                &kv_caps,
                large_caps.as_ref(),
                self.pin_ttl,
            )?)
        } else {
            None
        };
        let instance_locks = if self.fleet {
            Vec::new()
        } else {
            lock_instances(kv.as_ref(), self.large.as_deref()).await?
        };
        let window_host = window_host(kv_seam.as_ref(), large_seam.as_ref()).await?;
        // ADR-081: the kv engine's deletes unstage in the same transaction
        // when it is the window host (it is whenever it has a window) and
        // the sweep is not a fleet's (a fleet batch commits its own).
        let window_deletes = match (&kv_seam, self.fleet) {
            (Some(seam), false) if seam.window.is_some() => seam.window_deletes.clone(),
            _ => None,
        };
        let mut tiers: Vec<Arc<dyn store_types::Engine>> = vec![kv.clone()];
        if let Some(l) = &self.large {
            tiers.push(l.clone());
        }
        let gc = Collector::new(
            tiers,
            GcConfig {
                window: self.window,
                clock: self.clock.clone(),
                window_host,
                window_deletes,
                shared_lock: fleet_state.as_ref().map(|f| f.lock.clone()),
                fleet_pins: fleet_state.as_ref().map(|f| f.pins.clone()),
                refs: kv.refs(),
                cache: kv.cache(),
            },
        );
        Ok(Store::from_inner(Inner {
            kv,
            large: self.large,
            mode,
            gc,
            fleet: fleet_state,
            clock: self.clock,
            owner: self.owner.unwrap_or_else(fleet::random_owner),
            _instance_locks: instance_locks,
            policies: Default::default(),
            policy_lock: Default::default(),
            quarantine_lock: Default::default(),
            outboards: crate::verified::OutboardCache::new(self.outboard_cache_bytes),
            outboards_at_put: self.outboards_at_put,
            cache_access: Default::default(),
            cache_keys: Default::default(),
        }))
    }
}

/// The mode asked for (dual-tier with a large engine, else kv-only, at
/// the default threshold, when none was), checked against the engines.
fn check_mode(mode: Option<Mode>, kv: &Capabilities, large: Option<&Capabilities>) -> Result<Mode> {
    let mode = mode.unwrap_or(match large {
        Some(_) => Mode::DualTier {
            threshold: DEFAULT_THRESHOLD,
        },
        None => Mode::KvOnly {
            threshold: DEFAULT_THRESHOLD,
        },
    });
    match mode {
        Mode::MemOnly => {
            if large.is_some() {
                return Err(Error::Config(
                    "mem-only mode has no large tier; use dual-tier to add one".into(),
                ));
            }
            if kv.sharing != Sharing::ProcessLocal {
                return Err(Error::Config(format!(
                    "mem-only mode needs an in-memory kv engine, got `{}`",
                    kv.kind
                )));
            }
        }
        Mode::KvOnly { threshold } => {
            check_threshold(threshold)?;
            if large.is_some() {
                return Err(Error::Config(
                    "kv-only mode has no large tier; use dual-tier to add one".into(),
                ));
            }
        }
        Mode::DualTier { threshold } => {
            check_threshold(threshold)?;
            if large.is_none() {
                return Err(Error::Config("dual-tier mode needs a large engine".into()));
            }
        }
    }
    Ok(mode)
}

/// The instance locks of a non-fleet store: its pins are in-process,
/// invisible to any other instance, so it holds its data exclusively,
/// taken before anything writes. (A fleet is declared and shares its GC
/// state in PostgreSQL, so fleet members do not lock.)
async fn lock_instances(
    kv: &dyn KvEngine,
    large: Option<&dyn LargeEngine>,
) -> Result<Vec<InstanceLock>> {
    let mut locks = Vec::new();
    if let Some(lock) = kv.lock_instance().await? {
        locks.push(lock);
    }
    if let Some(l) = large {
        if let Some(lock) = l.lock_instance().await? {
            locks.push(lock);
        }
    }
    for lock in &locks {
        tracing::debug!(lock = lock.describe(), "instance lock taken");
    }
    Ok(locks)
}

/// The one-window-host rule (ADR-012 §5): the kv engine when it is
/// SQL-backed, otherwise the large engine when it is, otherwise
/// in-process. Only the host's schema is ensured, so an instance never has
/// two window tables.
async fn window_host(
    kv: Option<&GcSeam>,
    large: Option<&GcSeam>,
) -> Result<Arc<dyn WindowClauses>> {
    for seam in [kv, large].into_iter().flatten() {
        if let Some(window) = &seam.window {
            seam.schema.ensure_gc_schema().await?;
            return Ok(window.clone());
        }
    }
    Ok(Arc::new(InProcessWindow::new()))
}

fn check_threshold(threshold: u64) -> Result<()> {
    if threshold > MAX_THRESHOLD {
        return Err(Error::Config(format!(
            "threshold {threshold} exceeds the maximum of {MAX_THRESHOLD} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use async_trait::async_trait;
    use bytes::Bytes;
    use store_types::{
        Capabilities, Digest, Engine, EntryMeta, Instance, InstanceLock, Key, Namespace,
        PublishOutcome, ReadOptions, SizedRead,
    };

    use super::*;

    /// The shared state of a lockable test engine's "data".
    #[derive(Default)]
    struct Data {
        held: AtomicBool,
        lock_calls: AtomicUsize,
    }

    /// Releases `Data::held` when dropped.
    struct Held(Arc<Data>);

    impl Drop for Held {
        fn drop(&mut self) {
            self.0.held.store(false, Ordering::SeqCst);
        }
    }

    /// An empty kv engine whose data can be instance-locked.
    struct Lockable(Arc<Data>);

    #[async_trait]
    impl Engine for Lockable {
        fn capabilities(&self) -> Capabilities {
            Capabilities {
                kind: "lockable",
                instance: Instance::Other("test".into()),
                sharing: Sharing::EmbeddedFile,
                durable: false,
                seam: None,
            }
        }
        async fn meta(&self, _: &Key) -> Result<Option<EntryMeta>> {
            Ok(None)
        }
        async fn has_many(&self, _: &Namespace, d: &[Digest]) -> Result<Vec<bool>> {
            Ok(vec![false; d.len()])
        }
        async fn read(&self, _: &Key, _: &ReadOptions) -> Result<Option<SizedRead>> {
            Ok(None)
        }
        async fn delete_many(&self, _: &Namespace, d: &[Digest]) -> Result<Vec<Option<u64>>> {
            Ok(vec![None; d.len()])
        }
        async fn namespaces(&self) -> Result<Vec<Namespace>> {
            Ok(Vec::new())
        }
        async fn scan(
            &self,
            _: &Namespace,
            _: Option<Digest>,
            _: usize,
        ) -> Result<Vec<(Digest, u64)>> {
            Ok(Vec::new())
        }
        async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
            self.0.lock_calls.fetch_add(1, Ordering::SeqCst);
            if self.0.held.swap(true, Ordering::SeqCst) {
                return Err(Error::InstanceLocked {
                    resource: "the test data".into(),
                    holder: "pid 1 since 1970-01-01T00:00:00Z".into(),
                });
            }
            Ok(Some(InstanceLock::new(
                "the test data",
                Held(self.0.clone()),
            )))
        }
    }

    #[async_trait]
    impl KvEngine for Lockable {
        async fn put(&self, _: &Key, _: Bytes) -> Result<PublishOutcome> {
            Ok(PublishOutcome::Inserted)
        }
    }

    async fn build(data: &Arc<Data>) -> Result<Store> {
        Store::builder().kv(Lockable(data.clone())).build().await
    }

    #[tokio::test]
    async fn a_non_fleet_store_holds_the_instance_lock_until_its_last_clone_drops() {
        let data = Arc::new(Data::default());
        let first = build(&data).await.unwrap();
        assert!(data.held.load(Ordering::SeqCst));
        let second = build(&data).await;
        assert!(
            matches!(&second, Err(Error::InstanceLocked { holder, .. }) if holder.contains("pid 1")),
            "{second:?}"
        );
        let clone = first.clone();
        drop(first);
        assert!(data.held.load(Ordering::SeqCst), "a clone still holds it");
        drop(clone);
        assert!(
            !data.held.load(Ordering::SeqCst),
            "released with the last clone"
        );
        let third = build(&data).await.unwrap();
        assert!(data.held.load(Ordering::SeqCst));
        drop(third);
        assert_eq!(data.lock_calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_refused_lock_fails_the_build_naming_the_holder() {
        let data = Arc::new(Data::default());
        data.held.store(true, Ordering::SeqCst);
        let err = Store::builder()
            .kv(Lockable(data.clone()))
            .build()
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("the test data is in use by another Blobpool instance (pid 1 since"),
            "{text}"
        );
    }
}
