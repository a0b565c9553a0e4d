use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::AsyncRead;

use crate::{Chunks, Digest, GcSeam, InstanceLock, Key, Namespace, PinIntent, Result};

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

/// A streaming read of (part of) an entry. Engines return raw bytes; the
/// facade adds verification.
pub struct BlobReader {
    /// Number of bytes the reader yields.
    pub len: u64,
    /// The bytes.
    pub reader: Pin<Box<dyn AsyncRead + Send>>,
    /// The BLAKE3 digest of the bytes `reader` yields, computed by the
    /// engine as it produced them (typically on the thread that reads
    /// ahead, overlapping the hashing with the consumer's copying), or
    /// `None` when the engine does not hash (the facade then hashes every
    /// byte itself on a verified read).
    ///
    /// # Contract
    ///
    /// When present, the engine has hashed **exactly** the bytes `reader`
    /// yields, in the order it yields them — no more, no fewer, none it did
    /// not hash — and sends `Digest` of all of them once it has produced the
    /// last one (it may arrive before `reader` reports EOF). On a verified
    /// read the facade then does not hash: it counts the bytes, awaits this
    /// digest after EOF and compares it with the key's digest; a mismatch,
    /// or a byte count other than `len`, fails the read with
    /// [`Error::Verification`](crate::Error::Verification). If the sender
    /// is dropped without sending (the engine stopped early), the read
    /// fails with [`Error::Io`](crate::Error::Io) unless `reader` already
    /// failed. Ranged reads are verified by the facade with the entry's
    /// outboard (ADR-032); engines need not hash them.
    pub yielded_digest: Option<tokio::sync::oneshot::Receiver<Digest>>,
    /// The very bytes `reader` yields, when the engine holds them in memory
    /// anyway (a `Bytes` handle: no copy): the facade may take them instead
    /// of reading `reader` (a whole verified `Blob::bytes` then hashes them
    /// in place). `None` for streamed reads, and it must be `None` for any
    /// reader that wraps another one to observe or change its bytes (a
    /// layer's hook would otherwise be bypassed). With a
    /// [`BlobReader::yielded_digest`] as well, the digest must arrive
    /// without `reader` being polled (as [`BlobReader::hashed_bytes`] sends
    /// it up front): a facade that takes these bytes awaits it directly.
    pub in_memory: Option<Bytes>,
    /// The very bytes `reader` yields, as owned chunks, when the engine
    /// produces owned buffers anyway (a read-ahead task's chunks): a
    /// consumer that forwards chunks — an HTTP response body — takes them
    /// here instead of copying them out of `reader` (ADR-044). Both views
    /// read from one position ([`Chunks`]). `None` for other reads, and it
    /// must be `None` for any reader that wraps another one to observe or
    /// change its bytes, as for [`BlobReader::in_memory`].
    pub chunks: Option<Chunks>,
}

impl BlobReader {
    /// A reader over bytes already in memory (no engine digest: the facade
    /// hashes them when verifying).
    pub fn from_bytes(bytes: Bytes) -> Self {
        BlobReader {
            len: bytes.len() as u64,
            reader: Box::pin(std::io::Cursor::new(bytes.clone())),
            yielded_digest: None,
            in_memory: Some(bytes),
            chunks: None,
        }
    }

    /// A streamed read of `len` bytes that arrive as owned chunks on `rx`
    /// (an `Err` item ends the read with it; a channel closed early ends
    /// it with `UnexpectedEof`), readable through `reader` and takeable
    /// through [`BlobReader::chunks`]. `yielded_digest` as for the field.
    pub fn from_chunks(
        len: u64,
        rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
        yielded_digest: Option<tokio::sync::oneshot::Receiver<Digest>>,
    ) -> Self {
        let chunks = Chunks::new(len, rx);
        BlobReader {
            len,
            reader: Box::pin(chunks.reader()),
            yielded_digest,
            in_memory: None,
            chunks: Some(chunks),
        }
    }

    /// A reader over bytes in memory that the engine has already hashed:
    /// `digest` must be the BLAKE3 digest of exactly `bytes` (the
    /// [`BlobReader::yielded_digest`] contract). A verified read then does
    /// not hash them again, and a whole read into memory takes `bytes`
    /// without a copy.
    pub fn hashed_bytes(bytes: Bytes, digest: Digest) -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The receiver is alive: it is returned below.
        let _ = tx.send(digest);
        BlobReader {
            yielded_digest: Some(rx),
            ..BlobReader::from_bytes(bytes)
        }
    }
}

impl fmt::Debug for BlobReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlobReader")
            .field("len", &self.len)
            .field("yielded_digest", &self.yielded_digest.is_some())
            .field("chunks", &self.chunks.is_some())
            .finish()
    }
}

/// A verified range read as the facade asks for it in one engine call
/// ([`Engine::read_range_sized`]): the bytes wanted, and how to widen them
/// to what verification needs once the entry's size is known — the whole
/// entry when it is at most [`RangeRequest::whole_max`] bytes, else the
/// 16 KiB chunk groups covering the range
/// ([`crate::outboard::covering_groups`], ADR-032).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeRequest {
    /// The bytes the caller wants.
    pub range: Range<u64>,
    /// Entries of at most this many bytes are read whole (and verified
    /// whole by the facade).
    pub whole_max: u64,
}

impl RangeRequest {
    /// A request for `range`, reading entries of at most `whole_max`
    /// bytes whole.
    pub fn new(range: Range<u64>, whole_max: u64) -> Self {
        RangeRequest { range, whole_max }
    }

    /// Whether an entry of `size` bytes is read whole.
    pub fn reads_whole(&self, size: u64) -> bool {
        size <= self.whole_max
    }

    /// The bytes to read of an entry of `size` bytes: all of it when it is
    /// read whole, else the chunk groups covering the range.
    /// [`Error::InvalidRange`](crate::Error::InvalidRange) (naming `size`)
    /// unless `start <= end <= size`.
    pub fn span(&self, size: u64) -> crate::Result<Range<u64>> {
        let r = &self.range;
        if r.start > r.end || r.end > size {
            return Err(crate::Error::InvalidRange {
                start: r.start,
                end: r.end,
                size,
            });
        }
        if self.reads_whole(size) {
            return Ok(0..size);
        }
        Ok(crate::outboard::covering_groups(r, size))
    }
}

/// What [`Engine::read_range_sized`] answers: the entry's size and a read
/// of exactly [`RangeRequest::span`] of it.
#[derive(Debug)]
pub struct SizedRead {
    /// The entry's size in bytes.
    pub size: u64,
    /// The bytes `reader` yields: `request.span(size)`.
    pub span: Range<u64>,
    /// The read of `span`.
    pub reader: BlobReader,
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

/// An engine's self-description. The facade judges configurations from
/// this alone and never names engine types.
#[derive(Clone, Debug)]
pub struct EngineDescriptor {
    /// Short engine name for messages: `"mem"`, `"sqlite"`, `"local"`, ...
    pub kind: &'static str,
    /// Where its data lives.
    pub instance: Instance,
    /// How it can be shared between nodes.
    pub sharing: Sharing,
    /// Whether an acknowledged write survives a process crash.
    pub durable: bool,
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
    /// The engine's self-description.
    fn descriptor(&self) -> EngineDescriptor;

    /// Size and creation time, or `None` if absent.
    async fn meta(&self, key: &Key) -> Result<Option<EntryMeta>>;

    /// Presence of each digest in `ns`, index-aligned, in one round trip.
    async fn has_many(&self, ns: &Namespace, digests: &[Digest]) -> Result<Vec<bool>>;

    /// A streaming read of the whole entry, or `None` if absent.
    async fn read(&self, key: &Key) -> Result<Option<BlobReader>>;

    /// A streaming read of `range` (already validated against the size).
    async fn read_range(&self, key: &Key, range: Range<u64>) -> Result<Option<BlobReader>>;

    /// The entry's size and a read of `request.span(size)`, in one call
    /// (what the facade's verified [`range read`] needs, without a `meta`
    /// first), or `None` if absent. Unlike [`Engine::read_range`], the
    /// range is checked here: [`Error::InvalidRange`](crate::Error::InvalidRange)
    /// (naming the size) when it is not within the entry.
    ///
    /// The default is [`Engine::meta`], then [`Engine::read`] for an entry
    /// read whole or [`Engine::read_range`] of the span: two calls, which
    /// an engine whose calls each cost a hand-off answers in one (`local`:
    /// one blocking call, or none for a page-cached read, ADR-036). `None`
    /// from the second call (deleted in between) is `None`.
    ///
    /// Cancel-safe: it only reads.
    ///
    /// [`range read`]: Engine::read_range
    async fn read_range_sized(
        &self,
        key: &Key,
        request: &RangeRequest,
    ) -> Result<Option<SizedRead>> {
        let Some(meta) = self.meta(key).await? else {
            return Ok(None);
        };
        let span = request.span(meta.size)?;
        let reader = if request.reads_whole(meta.size) {
            self.read(key).await?
        } else {
            self.read_range(key, span.clone()).await?
        };
        Ok(reader.map(|reader| SizedRead {
            size: meta.size,
            span,
            reader,
        }))
    }

    /// A streaming read of the whole entry **from its storage**, never from
    /// an in-memory copy the engine may keep (the SQLite engine's hot-entry
    /// cache, ADR-037): what `verify` and `quarantine` read, so they judge
    /// the stored bytes. The default is [`Engine::read`] (an engine without
    /// a cache reads its storage anyway).
    async fn read_stored(&self, key: &Key) -> Result<Option<BlobReader>> {
        self.read(key).await
    }

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
    /// entries of at most 1 MiB, ADR-043; an entry stored before outboards
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

    /// The engine-state seam, if this engine is a seam member (ADR-012 §5).
    /// `mem` and `local` answer `None`.
    fn gc_seam(&self) -> Option<GcSeam> {
        None
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
    async fn stage(&self, ns: &Namespace) -> Result<Box<dyn StagedWrite>>;

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
    async fn stage_expecting(
        &self,
        ns: &Namespace,
        digest: &Digest,
    ) -> Result<Box<dyn StagedWrite>> {
        let _ = digest;
        self.stage(ns).await
    }

    /// Whether this engine's stages can commit a fleet pin row in their
    /// publishing transaction ([`StagedWrite::publish_pinned`]): true only
    /// for engines living in a database that can also hold `gc_pins`.
    fn joint_pin_publish(&self) -> bool {
        false
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

    /// Like [`StagedWrite::publish`], committing the pin row of `pin` (and
    /// taking the key's shared fleet lock) in the same transaction; a dedup
    /// hit still commits the pin. Only called on engines whose
    /// [`LargeEngine::joint_pin_publish`] is true; others refuse.
    async fn publish_pinned(self: Box<Self>, key: &Key, pin: &PinIntent) -> Result<PublishOutcome> {
        let _ = (key, pin);
        self.abort().await?;
        Err(crate::Error::Config(
            "this large engine cannot commit a pin row with its publish".into(),
        ))
    }
}
