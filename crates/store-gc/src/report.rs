use std::collections::BTreeMap;
use std::time::Duration;

use store_types::{CacheTrim, Error, Namespace};

/// Why a sweep deliberately did nothing (ADR-012 §1). Data, not an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum GcAbortCause {
    /// The protect callback failed; nothing was deleted.
    ProtectFailed,
    /// Another sweeper holds the sweep lock.
    SweeperLock,
    /// No liveness source is registered; nothing was deleted.
    NoLivenessSources,
}

/// Protected entries seen by the mark phase, by reason. An entry protected
/// for several reasons counts once, under the first of pinned, live,
/// protect callback.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProtectedCounts {
    /// Held by a pin.
    pub pinned: u64,
    /// Referenced according to a liveness source.
    pub live: u64,
    /// Named by the protect callback.
    pub protect_callback: u64,
}

impl ProtectedCounts {
    /// Sum over all reasons.
    pub fn total(&self) -> u64 {
        self.pinned + self.live + self.protect_callback
    }

    fn add(&mut self, o: &ProtectedCounts) {
        self.pinned += o.pinned;
        self.live += o.live;
        self.protect_callback += o.protect_callback;
    }
}

/// Exact counts of one sweep, for one namespace or in total.
///
/// - `scanned`: unstaged entries the mark phase arbitrated;
/// - `protected`: of those, the protected ones (by reason);
/// - `staged`: of those, the garbage staged into the delete window;
/// - `deleted` / `bytes_freed`: due candidates deleted by the execute phase;
/// - `rescued`: due candidates unstaged because they were protected again
///   (or their namespace lost its last liveness source);
/// - `vanished`: due candidates whose entry was already gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamespaceCounts {
    /// Entries arbitrated by the mark phase.
    pub scanned: u64,
    /// Protected entries among `scanned`.
    pub protected: ProtectedCounts,
    /// Newly staged candidates.
    pub staged: u64,
    /// Deleted candidates.
    pub deleted: u64,
    /// Candidates unstaged because protected.
    pub rescued: u64,
    /// Candidates whose entry had already disappeared.
    pub vanished: u64,
    /// Bytes freed by `deleted`.
    pub bytes_freed: u64,
}

impl NamespaceCounts {
    pub(crate) fn add(&mut self, o: &NamespaceCounts) {
        self.scanned += o.scanned;
        self.protected.add(&o.protected);
        self.staged += o.staged;
        self.deleted += o.deleted;
        self.rescued += o.rescued;
        self.vanished += o.vanished;
        self.bytes_freed += o.bytes_freed;
    }
}

/// The result of one sweep. An aborted sweep is `Ok` with `aborted` set.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct SweepReport {
    /// Why the sweep did nothing, if it did nothing on purpose.
    pub aborted: Option<GcAbortCause>,
    /// The protect callback's error, with its cause, when `aborted` is
    /// [`GcAbortCause::ProtectFailed`] (not serialized).
    #[serde(skip)]
    pub protect_error: Option<Error>,
    /// Sum over `namespaces`.
    pub total: NamespaceCounts,
    /// Counts per namespace that had anything to count.
    pub namespaces: BTreeMap<Namespace, NamespaceCounts>,
    /// Namespaces holding entries but no liveness source: never swept.
    pub unswept_namespaces: Vec<Namespace>,
    /// Expired fleet pin rows removed by maintenance.
    pub reaped_pins: u64,
    /// Leftovers of interrupted puts (stage files or objects) removed by
    /// the engines' maintenance step.
    pub reaped_stages: u64,
    /// Large-tier deletes of a fleet sweeper that fenced its keys and never
    /// confirmed the delete (it crashed or lost its session), finished by
    /// this sweep (ADR-021).
    #[serde(default)]
    pub resumed_deletes: u64,
    /// What the cache trim that runs first evicted, per cache namespace
    /// it evicted from (ADR-069): keys and the sum of their sizes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cache_trims: BTreeMap<Namespace, CacheTrim>,
    /// Wall time of the sweep.
    #[serde(with = "duration_ms")]
    pub duration: Duration,
}

impl SweepReport {
    pub(crate) fn aborted(cause: GcAbortCause, duration: Duration) -> Self {
        SweepReport {
            aborted: Some(cause),
            duration,
            ..Default::default()
        }
    }

    pub(crate) fn ns(&mut self, ns: &Namespace) -> &mut NamespaceCounts {
        self.namespaces.entry(ns.clone()).or_default()
    }

    pub(crate) fn finish(&mut self, duration: Duration) {
        let mut total = NamespaceCounts::default();
        self.namespaces
            .retain(|_, c| *c != NamespaceCounts::default());
        for c in self.namespaces.values() {
            total.add(c);
        }
        self.total = total;
        self.duration = duration;
    }

    /// Entries arbitrated in this sweep (mark and execute phases).
    pub fn arbitrated(&self) -> u64 {
        self.total.scanned + self.total.deleted + self.total.rescued + self.total.vanished
    }
}

mod duration_ms {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let ms = <u64 as serde::Deserialize>::deserialize(d)?;
        Ok(Duration::from_millis(ms))
    }
}
