use std::fmt;
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;

use std::ops::Range;

use crate::{
    BlobReader, Digest, GcSeam, InstanceLock, Key, Namespace, PinIntent, RangeRequest, ReadOptions,
    Result, SizedRead,
};

/// Milliseconds since the Unix epoch. Engines stamp `created_at` with it;
/// the GC window compares `visible_after` against an injectable clock in it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The wall clock now.
    pub fn now() -> Self {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(d.as_millis() as i64)
    }

    /// This instant plus `d` (saturating).
    pub fn plus(self, d: std::time::Duration) -> Self {
        Timestamp(
            self.0
                .saturating_add(d.as_millis().min(i64::MAX as u128) as i64),
        )
    }
}

/// Which tier holds an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// The small-blob tier (a database or memory).
    Kv,
    /// The large-blob tier (files, large objects, object stores).
    Large,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Kv => "kv",
            Tier::Large => "large",
        })
    }
}

/// What an engine knows about one stored entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    /// Content length in bytes.
    pub size: u64,
    /// When the entry was published.
    pub created_at: Timestamp,
}

/// What the facade reports about an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stat {
    /// Content length in bytes.
    pub size: u64,
    /// The tier holding it.
    pub tier: Tier,
    /// When the entry was published.
    pub created_at: Timestamp,
}

/// Where an engine keeps its data, so the facade can tell whether two
/// engines share one database instance (fleet validity, ADR-012 §4).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Instance {
    /// Process memory; never shared with another process.
    Process,
    /// A path on a file system (a database file or a directory).
    Path(PathBuf),
    /// A PostgreSQL database: the cluster's `system_identifier` plus the
    /// database name (and the schema the engine's tables live in).
    Postgres {
        /// `pg_control_system().system_identifier` as text.
        system_identifier: String,
        /// `current_database()`.
        database: String,
        /// The schema holding the engine's tables.
        schema: String,
    },
    /// Anything else, described by a URL-like string.
    Other(String),
}

impl Instance {
    /// Whether two instances are the same PostgreSQL cluster and database
    /// (schemas may differ). `false` for non-PostgreSQL instances.
    pub fn same_database(&self, other: &Instance) -> bool {
        match (self, other) {
            (
                Instance::Postgres {
                    system_identifier: a,
                    database: da,
                    ..
                },
                Instance::Postgres {
                    system_identifier: b,
                    database: db,
                    ..
                },
            ) => a == b && da == db,
            _ => false,
        }
    }
}

/// How an engine's data can be shared between store instances on several
/// nodes — the input to the fleet-validity predicate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sharing {
    /// Lives in one process (`mem`): never fleet-valid.
    ProcessLocal,
    /// A file system that is shared only if the deployment says so
    /// (`local`): `shared_media` is the operator's declaration.
    DeclaredMedia {
        /// The shared-media declaration (ADR-008 §3).
        shared_media: bool,
    },
    /// A database server reached over the network; shared with every
    /// instance on the same [`Instance`].
    DatabaseServer,
    /// A single-node embedded database file (`sqlite`).
    EmbeddedFile,
    /// A service every node reaches by the same address and sees the same
    /// way (an object store: S3, GCS, Azure): shared by nature, no
    /// declaration needed (ADR-019).
    SharedService,
}

/// Everything an engine declares about itself, in one answer: the facade
/// judges configurations from this alone and never names engine types.
/// What an engine cannot do is absent here (`None`), never a method that
/// fails at run time.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// Short engine name for messages: `"mem"`, `"sqlite"`, `"local"`, ...
    pub kind: &'static str,
    /// Where its data lives.
    pub instance: Instance,
    /// How it can be shared between nodes.
    pub sharing: Sharing,
    /// Whether an acknowledged write survives a process crash.
    pub durable: bool,
    /// The engine-state seam, if this engine is a seam member (ADR-012
    /// §5). `mem` and `local` have none.
    pub seam: Option<GcSeam>,
}

/// Whether a publish created the entry or found it already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PublishOutcome {
    /// The entry is new.
    Inserted,
    /// An entry with this key already existed; nothing was written.
    AlreadyPresent,
}

/// Operations every engine offers, whatever its tier.
///
/// # Contract
///
/// - Entries are immutable: once published, the bytes under a key never
///   change (except through corruption, which the facade detects).
/// - Every method is safe to call concurrently.
/// - Absent keys are values (`None`, `false`), never errors.
/// - `read_range` is only called with `start <= end <= size`; the facade
///   checks the range against [`Engine::meta`] first.
/// - `delete_many` is idempotent: deleting an absent key yields `None`.
/// - Methods never block the async runtime: blocking I/O goes through
///   `spawn_blocking` or a dedicated thread.
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// What this engine is and can do.
    fn capabilities(&self) -> Capabilities;

    /// Size and creation time, or `None` if absent.
    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>>;

    /// Presence of each digest in `ns`, index-aligned, in one round trip.
    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>>;

    /// Reads the entry as `options` say — the whole of it, or the span a
    /// [`RangeRequest`] plans once the size is known — and answers its
    /// size with the read, in one call; `None` if absent.
    /// [`Error::InvalidRange`](crate::Error::InvalidRange) (naming the
    /// size) when a requested range is not within the entry.
    ///
    /// Engines follow [`ReadOptions::plan`]: its whole-read path (which may
    /// hash, and may answer from an in-memory copy unless
    /// [`ReadOptions::from_storage`]) for [`ReadPlan::Whole`](crate::ReadPlan::Whole), its range
    /// path for [`ReadPlan::Span`](crate::ReadPlan::Span). An engine whose calls each cost a
    /// hand-off answers both the size and the bytes in one (`local`: one
    /// blocking call, or none for a page-cached read). Conveniences over
    /// this one entry point are in [`EngineExt`].
    ///
    /// Cancel-safe: it only reads.
    async fn read(&self, key: &Key, options: &ReadOptions) -> Result<Option<SizedRead>>;

    /// Deletes entries, returning the freed size of each (`None` if absent).
    async fn delete_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<Option<u64>>>;

    /// Namespaces holding at least one entry.
    async fn namespaces(&self) -> Result<Vec<Namespace>>;

    /// Up to `limit` entries of `ns` with digest strictly greater than
    /// `after`, in ascending digest order, with their sizes.
    async fn scan(
        &self,
        ns: &Namespace,
        after: Option<Digest>,
        limit: usize,
    ) -> Result<Vec<(Digest, u64)>>;

    /// The entry's BLAKE3 outboard ([`crate::outboard`], ADR-032): exactly
    /// the bytes published with it, or `None` when the entry is absent or
    /// has none (kv engines keep none; the facade hands none over for large
    /// entries of at most 1 MiB, TUNING.md §small-outboards; an entry stored before outboards
    /// has none until [`Engine::store_outboard`] gives it one).
    ///
    /// The facade validates what this returns against the key's digest
    /// before trusting it, so an engine never needs to check it; a corrupt
    /// outboard fails range reads with `Error::Verification`.
    ///
    /// Cancel-safe: it only reads.
    async fn read_outboard(&self, key: &Key) -> Result<Option<Bytes>> {
        let _ = key;
        Ok(None)
    }

    /// Gives an existing entry that has no outboard the one the facade
    /// computed for it (the lazy path for entries stored before outboards,
    /// and `blobpool verify`). The facade has checked `outboard` against the
    /// entry's digest.
    ///
    /// # Contract
    ///
    /// - Atomic: a reader sees no outboard or the whole of it, never part.
    /// - A no-op when the entry is absent or already has an outboard, and
    ///   on engines that keep none (the default).
    /// - Deleting the entry deletes the outboard with it; an outboard left
    ///   by a crash without its entry is removed by [`Engine::maintain`]
    ///   and is never visible (reads look for the entry first).
    ///
    /// Cancel-safe: dropping the future leaves either no outboard or the
    /// whole one (plus, at worst, a temporary file maintenance removes).
    async fn store_outboard(&self, key: &Key, outboard: Bytes) -> Result<()> {
        let _ = (key, outboard);
        Ok(())
    }

    /// The sweep's maintenance step: removes leftovers of interrupted puts
    /// that no live put still owns (stage files, stage objects past their
    /// grace period). Returns how many were removed. Must never touch a
    /// stage a live put is writing.
    async fn maintain(&self, now: Timestamp) -> Result<u64> {
        let _ = now;
        Ok(0)
    }

    /// Takes the exclusive **instance lock** on this engine's data, for a
    /// non-fleet store that keeps it for its lifetime (the facade calls it
    /// in `build()` unless the store is a declared fleet member).
    ///
    /// A non-fleet store's GC protection (its in-process pins, the delete
    /// gate) is invisible to any other store instance, so a second,
    /// undeclared instance on the same data — another process, or a second
    /// store in this one — could delete entries the first one still pins.
    /// The lock makes that second open fail at once.
    ///
    /// # Contract
    ///
    /// - `Ok(Some(lock))`: the data is now held by the caller until `lock`
    ///   drops; no other call (in this or another process) gets a lock on
    ///   the same data meanwhile.
    /// - `Err(Error::InstanceLocked { .. })` when another holder has it,
    ///   naming the holder as well as the engine can (pid, host, since
    ///   when). Fails at once; never waits for the holder.
    /// - `Ok(None)` (the default) when the engine cannot or need not lock:
    ///   process-local data (`mem`), or data whose exclusive use cannot be
    ///   proven from here (an object-store bucket).
    /// - The lock is never stolen by a later caller, and must not depend on
    ///   the holder releasing it cleanly: it ends when the holding process
    ///   (or database session) does.
    async fn lock_instance(&self) -> Result<Option<InstanceLock>> {
        Ok(None)
    }
}

/// Conveniences over [`Engine::read`], for every engine.
#[async_trait]
pub trait EngineExt: Engine {
    /// A read of the whole entry, or `None` if absent. Cancel-safe.
    async fn read_whole(&self, key: &Key) -> Result<Option<BlobReader>> {
        Ok(self
            .read(key, &ReadOptions::whole())
            .await?
            .map(|r| r.reader))
    }

    /// A read of the whole entry from its storage, never an in-memory copy
    /// ([`ReadOptions::from_storage`]). Cancel-safe.
    async fn read_stored(&self, key: &Key) -> Result<Option<BlobReader>> {
        Ok(self
            .read(key, &ReadOptions::stored())
            .await?
            .map(|r| r.reader))
    }

    /// A raw read of exactly `range`, or `None` if absent:
    /// [`Error::InvalidRange`](crate::Error::InvalidRange) unless
    /// `start <= end <= size`. Reads the covering span and gives up what is
    /// outside the range. Cancel-safe.
    async fn read_exact(&self, key: &Key, range: Range<u64>) -> Result<Option<BlobReader>> {
        let request = RangeRequest::new(range.clone(), 0);
        let Some(read) = self.read(key, &ReadOptions::range(request)).await? else {
            return Ok(None);
        };
        if read.span == range {
            return Ok(Some(read.reader));
        }
        let offset = range.start - read.span.start;
        let len = range.end - range.start;
        Ok(Some(read.reader.slice(offset, len).await?))
    }
}

impl<E: Engine + ?Sized> EngineExt for E {}

/// A small-blob engine: whole entries move as one buffer.
///
/// # Contract
///
/// `put` publishes atomically and durably (for durable engines) before it
/// returns; a concurrent put of the same key yields exactly one entry and
/// one `Inserted`.
#[async_trait]
pub trait KvEngine: Engine {
    /// Stores `bytes` under `key` (the caller has verified the digest).
    async fn put(&self, key: &Key, bytes: Bytes) -> Result<PublishOutcome>;

    /// The named references this engine's database holds (ADR-024), if it
    /// can hold them. Default: none.
    fn refs(&self) -> Option<std::sync::Arc<dyn crate::RefStore>> {
        None
    }

    /// The cache keys this engine's database holds (ADR-048), if it can
    /// hold them. Default: none.
    fn cache(&self) -> Option<std::sync::Arc<dyn crate::CacheIndex>> {
        None
    }
}

/// A large-blob engine: entries are streamed into a stage and published.
///
/// # Contract
///
/// - Nothing written to a stage is visible until [`StagedWrite::publish`].
/// - A stage dropped or aborted without publishing leaves nothing behind
///   (engines also clean orphaned stages when they open).
#[async_trait]
pub trait LargeEngine: Engine {
    /// Opens a stage for a new entry in `ns`.
    async fn stage(&self, ns: &Namespace) -> Result<Stage>;

    /// Opens a stage for a new entry in `ns` whose digest the caller
    /// already expects to be `digest`.
    ///
    /// The caller promises to publish the stage only under
    /// `Key(ns, digest)`, and only after verifying that the written bytes
    /// hash to `digest` (it aborts the stage otherwise). An engine may use
    /// that to write straight to the entry's final location instead of a
    /// staging area, as long as the [`LargeEngine`] contract still holds:
    /// nothing becomes visible before [`StagedWrite::publish`] (for object
    /// stores, where completing a multipart upload is what publishes, that
    /// completion happens in `publish`), and an aborted or dropped stage
    /// leaves nothing behind. The default is [`LargeEngine::stage`].
    async fn stage_expecting(&self, ns: &Namespace, digest: &Digest) -> Result<Stage> {
        let _ = digest;
        self.stage(ns).await
    }
}

/// An in-progress large write.
#[async_trait]
pub trait StagedWrite: Send {
    /// Appends a chunk.
    async fn write(&mut self, chunk: Bytes) -> Result<()>;

    /// Hands the stage the entry's outboard, computed by the facade from
    /// the bytes written ([`crate::outboard`], ADR-032). Called at most once,
    /// after the last [`StagedWrite::write`] and before the publish.
    ///
    /// # Contract
    ///
    /// An engine that keeps outboards publishes this one **with** the
    /// entry: once the entry is visible, [`Engine::read_outboard`] returns
    /// exactly these bytes, and a crash at any point leaves either no entry
    /// or the entry with this outboard (an outboard without its entry is
    /// allowed: it is invisible, and maintenance removes it). When the key
    /// already exists (`AlreadyPresent`), the engine may give the existing
    /// entry this outboard if it has none. The default drops it: the facade
    /// then computes the outboard on the entry's first range read.
    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        let _ = outboard;
        Ok(())
    }

    /// Makes the staged bytes durable and visible under `key`. If the key
    /// already exists the stage is discarded and `AlreadyPresent` returned.
    async fn publish(self: Box<Self>, key: &Key) -> Result<PublishOutcome>;

    /// Discards the stage.
    async fn abort(self: Box<Self>) -> Result<()>;
}

/// A stage that can also commit a fleet pin row in its publishing
/// transaction: only engines living in a database that can hold `gc_pins`
/// open these ([`Stage::Joint`]).
#[async_trait]
pub trait JointStagedWrite: StagedWrite {
    /// Like [`StagedWrite::publish`], committing the pin row of `pin` (and
    /// taking the key's shared fleet lock) in the same transaction; a dedup
    /// hit still commits the pin.
    async fn publish_pinned(self: Box<Self>, key: &Key, pin: &PinIntent) -> Result<PublishOutcome>;
}

/// An open stage, as its engine can publish it: whether a publish can
/// commit a fleet pin row with it is the stage's type, not a flag.
pub enum Stage {
    /// Publishes the entry alone.
    Plain(Box<dyn StagedWrite>),
    /// Can also publish with a pin row ([`JointStagedWrite`]).
    Joint(Box<dyn JointStagedWrite>),
}

impl fmt::Debug for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Plain(_) => "Stage::Plain",
            Stage::Joint(_) => "Stage::Joint",
        })
    }
}

impl Stage {
    /// The stage wrapped (by a layer observing it), keeping its kind: a
    /// plain stage goes through `plain`, a joint one through `joint`.
    pub fn map(
        self,
        plain: impl FnOnce(Box<dyn StagedWrite>) -> Box<dyn StagedWrite>,
        joint: impl FnOnce(Box<dyn JointStagedWrite>) -> Box<dyn JointStagedWrite>,
    ) -> Stage {
        match self {
            Stage::Plain(s) => Stage::Plain(plain(s)),
            Stage::Joint(s) => Stage::Joint(joint(s)),
        }
    }

    /// The stage as a plain one (a joint stage publishes plainly too).
    pub fn into_plain(self) -> Box<dyn StagedWrite> {
        match self {
            Stage::Plain(s) => s,
            Stage::Joint(s) => s,
        }
    }

    fn as_plain(&mut self) -> &mut dyn StagedWrite {
        match self {
            Stage::Plain(s) => s.as_mut(),
            Stage::Joint(s) => s.as_mut(),
        }
    }

    /// [`StagedWrite::write`]. Cancel-safe as the engine's is.
    pub async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.as_plain().write(chunk).await
    }

    /// [`StagedWrite::set_outboard`].
    pub async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        self.as_plain().set_outboard(outboard).await
    }

    /// [`StagedWrite::publish`].
    pub async fn publish(self, key: &Key) -> Result<PublishOutcome> {
        self.into_plain().publish(key).await
    }

    /// [`StagedWrite::abort`].
    pub async fn abort(self) -> Result<()> {
        self.into_plain().abort().await
    }
}
