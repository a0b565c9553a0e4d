use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use store_gc::{
    Clock, Collector, LivenessSource, Pin, ProtectCallback, SourceId, SweepOptions, SweepReport,
};
use store_types::{
    Digest, Engine, Error, KvEngine, LargeEngine, LivenessTable, Namespace, PinIntent, ReadOptions,
    Result, Stat, Tier,
};

use crate::blob::Blob;
use crate::builder::{Mode, StoreBuilder};
use crate::fleet::FleetState;
use crate::Key;

pub(crate) struct Inner {
    pub kv: Arc<dyn KvEngine>,
    pub large: Option<Arc<dyn LargeEngine>>,
    pub mode: Mode,
    pub gc: Arc<Collector>,
    pub fleet: Option<FleetState>,
    pub clock: Arc<dyn Clock>,
    pub owner: String,
    /// The engines' instance locks (non-fleet), released when the last
    /// clone of the store drops.
    pub _instance_locks: Vec<store_types::InstanceLock>,
    /// GC policies per namespace (ADR-024).
    pub policies: std::sync::Mutex<crate::refs::PolicyState>,
    /// Serialises policy changes (their registrations are async).
    pub policy_lock: tokio::sync::Mutex<()>,
    /// Serialises quarantines, the one removal that ignores pins (ADR-046).
    pub quarantine_lock: Arc<tokio::sync::Mutex<()>>,
    /// Validated outboards for verified range reads (ADR-032).
    pub outboards: crate::verified::OutboardCache,
    /// Whether large puts build and publish outboards
    /// ([`crate::StoreBuilder::outboards_at_put`]).
    pub outboards_at_put: bool,
    /// Cache reads noted since their last write (ADR-048).
    pub cache_access: crate::cache::AccessLog,
    /// Non-fleet: cache keys remembered from the index (ADR-048).
    pub cache_keys: crate::cache::KeyCache,
}

/// A liveness source: an in-process callback (non-fleet) or a named table
/// in the shared database (fleet, ADR-012 §6.6). Both register through
/// [`Gc::register_liveness_source`].
#[derive(Clone)]
pub enum Liveness {
    /// A batched in-process probe.
    Callback(Arc<dyn LivenessSource>),
    /// A table reference in the fleet's PostgreSQL database.
    Table(LivenessTable),
}

impl fmt::Debug for Liveness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Liveness::Callback(_) => f.write_str("Liveness::Callback(..)"),
            Liveness::Table(t) => write!(f, "Liveness::Table({t:?})"),
        }
    }
}

impl From<Arc<dyn LivenessSource>> for Liveness {
    fn from(s: Arc<dyn LivenessSource>) -> Self {
        Liveness::Callback(s)
    }
}

impl<T: LivenessSource> From<Arc<T>> for Liveness {
    fn from(s: Arc<T>) -> Self {
        Liveness::Callback(s)
    }
}

impl From<LivenessTable> for Liveness {
    fn from(t: LivenessTable) -> Self {
        Liveness::Table(t)
    }
}

/// A content-addressed blob store over one kv engine and, in dual-tier
/// mode, one large engine. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("kv", &self.inner.kv.capabilities().kind)
            .field(
                "large",
                &self.inner.large.as_ref().map(|l| l.capabilities().kind),
            )
            .field("mode", &self.inner.mode)
            .field("fleet", &self.inner.fleet.is_some())
            .finish()
    }
}

impl Store {
    /// Starts a [`StoreBuilder`].
    pub fn builder() -> StoreBuilder {
        StoreBuilder::default()
    }

    pub(crate) fn from_inner(inner: Inner) -> Self {
        Store {
            inner: Arc::new(inner),
        }
    }

    /// The dispatch mode.
    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// Whether this instance was built with `fleet: true` ([`Gc::is_fleet`]).
    pub(crate) fn is_fleet(&self) -> bool {
        self.inner.fleet.is_some()
    }

    /// This instance's owner name (written into fleet pin rows).
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The engines in fall-through order: kv, then large.
    pub(crate) fn tiers(&self) -> impl Iterator<Item = (Tier, &dyn Engine)> {
        let kv: &dyn Engine = self.inner.kv.as_ref();
        std::iter::once((Tier::Kv, kv)).chain(
            self.inner
                .large
                .as_ref()
                .map(|l| (Tier::Large, l.as_ref() as &dyn Engine)),
        )
    }

    /// A verified streaming read of the entry, or `None` when absent.
    ///
    /// Cancel-safe: it only reads; dropping the future leaves nothing behind.
    pub async fn get(&self, key: &Key) -> Result<Option<Blob>> {
        for (tier, engine) in self.tiers() {
            if let Some(r) = engine.read(key, &ReadOptions::whole()).await? {
                return Ok(Some(Blob::verified(r.reader, tier, key.digest)));
            }
        }
        Ok(None)
    }

    /// Reads `range` of the entry, verified: every byte it yields has been
    /// checked against the key's digest before it is yielded (ADR-032).
    /// [`Error::Missing`] when absent, [`Error::InvalidRange`] when the
    /// range is not within the entry.
    ///
    /// Entries up to 64 KiB are verified whole and sliced. Larger ones are
    /// verified 16 KiB chunk group by group against their outboard, checked
    /// against the digest and cached: the engine's for entries over 1 MiB
    /// (computed from one verified whole read for an entry that has none,
    /// and handed to the engine to keep); computed from one whole read, and
    /// only cached, up to 1 MiB (TUNING.md §small-outboards). A corrupt group the range touches
    /// fails the read with [`Error::Verification`] (inside the `io::Error`
    /// of the read that reached it) before any of its bytes are yielded;
    /// corruption outside the covering groups is not read and does not fail
    /// it (up to 1 MiB, only once the outboard is cached).
    ///
    /// Cancel-safe: it only reads (and, for an entry over 1 MiB without an
    /// outboard, asks the engine to keep one, which is atomic); dropping the
    /// future leaves nothing behind.
    pub async fn read_range(&self, key: &Key, range: Range<u64>) -> Result<Blob> {
        // One engine call answers the size and opens the read of what
        // verification needs (TUNING.md §local-small-reads): the whole entry up to 64 KiB, else
        // the chunk groups covering the range.
        let request =
            store_types::RangeRequest::new(range.clone(), crate::verified::WHOLE_VERIFY_MAX);
        for (tier, engine) in self.tiers() {
            let options = ReadOptions::range(request.clone());
            let Some(read) = engine.read(key, &options).await? else {
                continue;
            };
            let reader = if request.reads_whole(read.size) {
                crate::verified::small_range(read.reader, key, range).await?
            } else {
                let hashes = crate::verified::group_hashes(
                    &self.inner.outboards,
                    engine,
                    tier,
                    key,
                    read.size,
                )
                .await?;
                crate::verified::GroupVerifier::over(
                    read.reader.into_stream().reader,
                    hashes,
                    range,
                )
            };
            return Ok(Blob::range_verified(reader, tier));
        }
        Err(Error::Missing)
    }

    /// The entry's validated BLAKE3 outboard ([`store_types::outboard`]:
    /// bao-tree's post-order encoding, 16 KiB chunk groups), or `None` when
    /// absent. Loaded from the engine and checked against the digest, or
    /// computed from a verified whole read (kv entries, large entries of at
    /// most 1 MiB — TUNING.md §small-outboards — and entries stored before outboards) — what
    /// a bao stream for clients is encoded with.
    ///
    /// Cancel-safe: it only reads (see [`Store::read_range`]).
    pub async fn outboard(
        &self,
        key: &Key,
    ) -> Result<Option<Arc<store_types::outboard::GroupHashes>>> {
        for (tier, engine) in self.tiers() {
            let Some(meta) = engine.meta(key).await? else {
                continue;
            };
            return match crate::verified::group_hashes(
                &self.inner.outboards,
                engine,
                tier,
                key,
                meta.size,
            )
            .await
            {
                Ok(h) => Ok(Some(h)),
                Err(Error::Missing) => Ok(None),
                Err(e) => Err(e),
            };
        }
        Ok(None)
    }

    /// Size, tier and creation time, or `None` when absent.
    ///
    /// Cancel-safe: it only reads; dropping the future leaves nothing behind.
    pub async fn stat(&self, key: &Key) -> Result<Option<Stat>> {
        for (tier, engine) in self.tiers() {
            if let Some(m) = engine.meta(key).await? {
                return Ok(Some(Stat {
                    size: m.size,
                    tier,
                    created_at: m.created_at,
                }));
            }
        }
        Ok(None)
    }

    /// Whether the entry exists.
    ///
    /// Cancel-safe: it only reads; dropping the future leaves nothing behind.
    pub async fn has(&self, key: &Key) -> Result<bool> {
        Ok(self
            .has_many(&key.namespace, std::slice::from_ref(&key.digest))
            .await?[0])
    }

    /// Presence of each digest in `ns`, index-aligned; one round trip per
    /// tier (the large tier is asked only about kv misses).
    ///
    /// Cancel-safe: it only reads; dropping the future leaves nothing behind.
    pub async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>> {
        let mut present = vec![false; digests.len()];
        for (_, engine) in self.tiers() {
            let missing: Vec<usize> = (0..digests.len()).filter(|i| !present[*i]).collect();
            if missing.is_empty() {
                break;
            }
            let ask: Vec<Digest> = missing.iter().map(|i| digests[*i]).collect();
            let answer = engine.has_many(ns, &ask).await?;
            for (i, a) in missing.into_iter().zip(answer) {
                present[i] = a;
            }
        }
        Ok(present)
    }

    /// Deletes the entry unless it is protected: [`Error::GcRefuse`] for a
    /// pinned, live or protect-callback-named key, [`Error::Missing`] when
    /// absent. Removes every tier's copy.
    ///
    /// Cancel-safe: the delete runs in a task that keeps its protection
    /// until every media delete has finished; dropping this future only
    /// stops waiting for the answer (the delete may still complete).
    pub async fn delete(&self, key: &Key) -> Result<()> {
        let r = self.inner.gc.delete(key).await.map(|_| ());
        if r.is_ok() {
            tracing::info!(target: "store_core::gc", %key, "direct delete");
        }
        r
    }

    /// [`Gc::pin`], also answering the generation of the pin row it
    /// committed (fleet; `None` non-fleet): the proof a fleet reference
    /// set presents to its guard (`store_types::PinProof`, ADR-054).
    pub(crate) async fn pin_proved(
        &self,
        key: &Key,
    ) -> Result<Option<(Pin, Option<store_types::PinGeneration>)>> {
        let pin = self.inner.gc.pins().pin(key.clone()).await;
        let generation = match self.pin_intent() {
            Some((intent, fleet)) => Some(fleet.pins.pin_first(key, &intent).await?),
            None => None,
        };
        Ok(if self.has(key).await? {
            Some((pin, generation))
        } else {
            None
        })
    }

    /// The pin row a fleet put commits.
    pub(crate) fn pin_intent(&self) -> Option<(PinIntent, &FleetState)> {
        self.inner.fleet.as_ref().map(|f| {
            (
                PinIntent {
                    owner: self.inner.owner.clone(),
                    now: self.inner.clock.now(),
                    ttl: f.ttl,
                    host: f.pins.pin_host(),
                },
                f,
            )
        })
    }

    /// The collector's controls: sweeps, pins, liveness sources.
    pub fn gc(&self) -> Gc<'_> {
        Gc {
            store: self,
            inner: &self.inner,
        }
    }
}

/// The collector's controls of a [`Store`] ([`Store::gc`]): what protects
/// entries (pins, liveness sources, the protect callback) and the sweep.
#[derive(Clone, Copy)]
pub struct Gc<'a> {
    store: &'a Store,
    inner: &'a Inner,
}

impl Gc<'_> {
    /// Whether the store was built with `fleet: true`.
    pub fn is_fleet(&self) -> bool {
        self.inner.fleet.is_some()
    }

    /// The lifetime of this instance's fleet pin rows (`Some` in fleet
    /// mode only): what a token layer must not outlive (ADR-018).
    pub fn pin_ttl(&self) -> Option<std::time::Duration> {
        self.inner.fleet.as_ref().map(|f| f.ttl)
    }

    /// Pins an existing entry; `None` when absent. Pin first, then look:
    /// an entry seen here cannot be deleted while the pin lives.
    ///
    /// - Non-fleet: an in-process pin, ordered against this instance's
    ///   deletes by the delete gate.
    /// - Fleet: also commits a pin row under the key's shared lock (the
    ///   pin-first path puts use, waiting out a delete in flight), so every
    ///   node's sweep sees it. The row expires after `pin_ttl` unless
    ///   renewed with [`Gc::renew_pin`]; dropping the guard releases the
    ///   in-process pin only (ADR-016 §4).
    ///
    /// Cancel-safe: dropping the future releases the in-process pin; a pin
    /// row it committed expires after its TTL.
    pub async fn pin(&self, key: &Key) -> Result<Option<Pin>> {
        Ok(self.store.pin_proved(key).await?.map(|(pin, _)| pin))
    }

    /// Registers a liveness source for `ns`; a namespace with no source is
    /// never swept.
    ///
    /// - Non-fleet stores take in-process callbacks
    ///   ([`Liveness::Callback`], or any `Arc<impl LivenessSource>`).
    /// - Fleet stores take table references ([`Liveness::Table`]): the table
    ///   must exist in the shared database (checked here; the store never
    ///   creates or alters it). The registration is a row in the shared
    ///   database (ADR-012 §6.6), so every node's sweep consults it, and it
    ///   outlives this instance until deregistered (idempotent).
    ///   In-process callbacks are refused in fleet mode: another node's
    ///   sweep could not consult them (ADR-016).
    ///
    /// Cancel-safe: dropping the future either registers the source or not
    /// (a fleet registration is one idempotent statement).
    pub async fn register_liveness_source(
        &self,
        ns: Namespace,
        source: impl Into<Liveness>,
    ) -> Result<SourceId> {
        match (source.into(), &self.inner.fleet) {
            (Liveness::Callback(cb), None) => Ok(self.inner.gc.register_liveness_source(ns, cb)),
            (Liveness::Table(t), Some(_)) => {
                self.inner
                    .gc
                    .register_liveness_table(ns, t, &self.inner.owner)
                    .await
            }
            (Liveness::Callback(_), Some(_)) => Err(Error::Config(
                "a fleet store takes liveness tables, not in-process callbacks: another node's sweep could not consult the callback".into(),
            )),
            (Liveness::Table(_), None) => Err(Error::Config(
                "liveness tables are the fleet form; a non-fleet store takes in-process callbacks".into(),
            )),
        }
    }

    /// Removes every registration of a fleet liveness table for `ns` from
    /// the shared database, whichever nodes made them (the table stops
    /// protecting anything); `false` if it was not registered
    /// (and always `false` on a non-fleet store).
    ///
    /// Cancel-safe: one statement; the row is removed or not.
    pub async fn deregister_liveness_table(
        &self,
        ns: &Namespace,
        table: &LivenessTable,
    ) -> Result<bool> {
        self.inner
            .gc
            .deregister_liveness_table(ns, table, None)
            .await
    }

    /// Renews this instance's pin on `key` (the `blobs/have` renewal form).
    /// Fleet: extends the unexpired pin row of (key, owner); `false` when
    /// the row is gone (expired: the putter's backstop is to re-put).
    /// Non-fleet: in-process pins do not expire; `true` while one is held.
    ///
    /// Cancel-safe: one statement; the row is extended or not.
    pub async fn renew_pin(&self, key: &Key) -> Result<bool> {
        match &self.inner.fleet {
            Some(f) => {
                f.pins
                    .pin_renew(key, &self.inner.owner, self.inner.clock.now(), f.ttl)
                    .await
            }
            None => Ok(self.inner.gc.pins().count(key) > 0),
        }
    }

    /// Removes a liveness source registered through this instance (a fleet
    /// table's shared row included); `false` if unknown.
    ///
    /// Cancel-safe: the registration is removed or not.
    pub async fn deregister_liveness_source(&self, id: SourceId) -> Result<bool> {
        self.inner.gc.deregister_liveness_source(id).await
    }

    /// Installs the protect callback (replacing any previous one), or
    /// removes it (`None`).
    pub fn set_protect(&self, callback: Option<Arc<dyn ProtectCallback>>) {
        self.inner.gc.set_protect(callback);
    }

    /// One GC pass. `Err` only for operational failure; a deliberate no-op
    /// is `Ok` with [`SweepReport::aborted`] set.
    ///
    /// Cancel-safe: the pass runs in a task of its own; dropping this
    /// future stops it at the next batch boundary, after the batch in
    /// progress has finished its deletes under protection.
    pub async fn sweep(&self, opts: SweepOptions) -> Result<SweepReport> {
        // Cache namespaces lose the keys outside their bounds first, so
        // this sweep stages the entries nothing protects any more.
        let trims = self.store.trim_caches().await?;
        let mut r = self.inner.gc.sweep(&opts).await;
        if let Ok(rep) = &mut r {
            rep.cache_trims = trims.into_iter().filter(|(_, t)| t.keys > 0).collect();
        }
        match &r {
            // A sweep that deletes data says so, whoever called it.
            Ok(rep) => tracing::info!(
                target: "store_core::gc",
                owner = %self.inner.owner,
                aborted = ?rep.aborted,
                scanned = rep.total.scanned,
                staged = rep.total.staged,
                deleted = rep.total.deleted,
                rescued = rep.total.rescued,
                bytes_freed = rep.total.bytes_freed,
                cache_keys_evicted = rep.cache_trims.values().map(|t| t.keys).sum::<u64>(),
                cache_bytes_evicted = rep.cache_trims.values().map(|t| t.bytes).sum::<u64>(),
                unswept = rep.unswept_namespaces.len(),
                duration_ms = rep.duration.as_millis() as u64,
                "sweep"
            ),
            Err(e) => {
                tracing::warn!(target: "store_core::gc", owner = %self.inner.owner, "sweep failed: {}", store_types::Report::new(e))
            }
        }
        r
    }
}

/// Test support (feature `testing`): what the collector holds now.
#[cfg(feature = "testing")]
impl<'a> Gc<'a> {
    /// The instance's delete window (its one window host).
    pub fn window(&self) -> &'a Arc<dyn store_types::WindowClauses> {
        self.inner.gc.window()
    }

    /// Number of live in-process pins on `key`.
    pub fn pin_count(&self, key: &Key) -> usize {
        self.inner.gc.pins().count(key)
    }
}
