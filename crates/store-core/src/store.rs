use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use store_gc::{
    Collector, LivenessSource, Pin, ProtectCallback, SourceId, SweepOptions, SweepReport,
};
use store_types::{
    Digest, Engine, Error, KvEngine, LargeEngine, Namespace, Result, Stat, Tier, WindowClauses,
};

use crate::blob::Blob;
use crate::builder::{Mode, StoreBuilder};
use crate::fleet::FleetState;
use crate::Key;

pub(crate) struct Inner {
    pub kv: Arc<dyn KvEngine>,
    pub large: Option<Arc<dyn LargeEngine>>,
    pub mode: Mode,
    pub gc: Collector,
    #[allow(dead_code)] // read by the fleet put path
    pub fleet: Option<FleetState>,
    pub owner: String,
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
            .field("kv", &self.inner.kv.descriptor().kind)
            .field(
                "large",
                &self.inner.large.as_ref().map(|l| l.descriptor().kind),
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

    /// Whether this instance was built with `fleet: true`.
    pub fn is_fleet(&self) -> bool {
        self.inner.fleet.is_some()
    }

    /// This instance's owner name (written into fleet pin rows).
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The engines in fall-through order: kv, then large.
    fn tiers(&self) -> impl Iterator<Item = (Tier, &dyn Engine)> {
        let kv: &dyn Engine = self.inner.kv.as_ref();
        std::iter::once((Tier::Kv, kv)).chain(
            self.inner
                .large
                .as_ref()
                .map(|l| (Tier::Large, l.as_ref() as &dyn Engine)),
        )
    }

    /// A verified streaming read of the entry, or `None` when absent.
    pub async fn get(&self, key: &Key) -> Result<Option<Blob>> {
        for (tier, engine) in self.tiers() {
            if let Some(r) = engine.read(key).await? {
                return Ok(Some(Blob::verified(r, tier, key.digest)));
            }
        }
        Ok(None)
    }

    /// Reads `range` of the entry (unverified, see [`Blob`]).
    /// [`Error::Missing`] when absent, [`Error::InvalidRange`] when the
    /// range is not within the entry.
    pub async fn read_range(&self, key: &Key, range: Range<u64>) -> Result<Blob> {
        for (tier, engine) in self.tiers() {
            let Some(meta) = engine.meta(key).await? else {
                continue;
            };
            if range.start > range.end || range.end > meta.size {
                return Err(Error::InvalidRange {
                    start: range.start,
                    end: range.end,
                    size: meta.size,
                });
            }
            return match engine.read_range(key, range).await? {
                Some(r) => Ok(Blob::unverified(r, tier)),
                // Deleted between the two calls.
                None => Err(Error::Missing),
            };
        }
        Err(Error::Missing)
    }

    /// Size, tier and creation time, or `None` when absent.
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
    pub async fn has(&self, key: &Key) -> Result<bool> {
        Ok(self
            .has_many(&key.namespace, std::slice::from_ref(&key.digest))
            .await?[0])
    }

    /// Presence of each digest in `ns`, index-aligned; one round trip per
    /// tier (the large tier is asked only about kv misses).
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
    /// absent.
    pub async fn delete(&self, key: &Key) -> Result<()> {
        self.inner.gc.delete(key).await.map(|_| ())
    }

    /// Pins an existing entry; `None` when absent. (Pin first, then look:
    /// an entry seen here cannot be deleted while the pin lives.)
    pub async fn pin(&self, key: &Key) -> Result<Option<Pin>> {
        let pin = self.inner.gc.pins().pin(key.clone()).await;
        Ok(if self.has(key).await? {
            Some(pin)
        } else {
            None
        })
    }

    /// Registers an in-process liveness source for `ns`. A namespace with
    /// no source is never swept.
    pub fn register_liveness_source(
        &self,
        ns: Namespace,
        source: Arc<dyn LivenessSource>,
    ) -> SourceId {
        self.inner.gc.register_liveness_source(ns, source)
    }

    /// Removes a liveness source; `false` if unknown.
    pub fn deregister_liveness_source(&self, id: SourceId) -> bool {
        self.inner.gc.deregister_liveness_source(id)
    }

    /// Installs the protect callback (replacing any previous one).
    pub fn set_protect(&self, callback: Arc<dyn ProtectCallback>) {
        self.inner.gc.set_protect(Some(callback));
    }

    /// Removes the protect callback.
    pub fn clear_protect(&self) {
        self.inner.gc.set_protect(None);
    }

    /// One GC pass. `Err` only for operational failure; a deliberate no-op
    /// is `Ok` with [`SweepReport::aborted`] set.
    pub async fn sweep(&self, opts: SweepOptions) -> Result<SweepReport> {
        self.inner.gc.sweep(&opts).await
    }

    /// The instance's delete window (its one window host).
    pub fn window(&self) -> &Arc<dyn WindowClauses> {
        self.inner.gc.window()
    }

    /// Number of live in-process pins on `key`.
    pub fn pin_count(&self, key: &Key) -> usize {
        self.inner.gc.pins().count(key)
    }
}
