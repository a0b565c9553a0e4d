//! Blobpool's shared vocabulary.
//!
//! Every engine crate and the `store-core` facade depend on this crate and
//! on nothing else of the workspace. It holds:
//!
//! - the addressing types: [`Digest`], [`Namespace`], [`Key`];
//! - the entry metadata: [`Stat`], [`EntryMeta`], [`Tier`], [`Timestamp`];
//! - the one error enum, [`Error`], shared by the facade and the engines,
//!   with the [`Failure`] detail ([`ErrorKind`], operation, context, source)
//!   of media and backend failures and [`Report`] to print a cause chain;
//! - the engine traits: [`Engine`], [`KvEngine`], [`LargeEngine`],
//!   [`StagedWrite`];
//! - the engine descriptor ([`Capabilities`]) the facade judges
//!   configurations by, without naming engine types;
//! - the engine-state seam of ADR-012 §5 ([`GcSeam`] and its clause traits);
//! - named references ([`RefStore`], [`RefName`]) and cache keys
//!   ([`CacheIndex`]) a kv engine may hold;
//! - the engine-registration vocabulary ([`registry`]: the
//!   `EngineFactory` each engine crate exports, ADR-027);
//! - the crash switch ([`crash::CrashSwitch`]) the engines' crash models
//!   report durability points to (tests only);
//! - the on-media layout helpers of the path-based engines ([`layout`]:
//!   fan-out names and stage-name salts);
//! - BLAKE3 outboards ([`outboard`]): computed while a put streams,
//!   validated against the digest, used to verify range reads (ADR-032);
//! - the instance lock ([`InstanceLock`]) a non-fleet store holds its data
//!   with, and the lock-file mechanism of the file-based engines.
//!
//! Architecture invariant: nothing here names a concrete engine.

pub mod buffer;
mod cache;
mod chunks;
pub mod crash;
mod digest;
mod engine;
mod error;
mod failure;
mod fleet;
mod instance_lock;
mod key;
pub mod layout;
pub mod outboard;
mod read;
mod refs;
pub mod registry;
mod retry;
mod seam;

pub use cache::{CacheBounds, CacheEntry, CacheIndex, CachePage, CacheTrim, CacheUsage};
pub use chunks::{Chunks, Demand, Gather, Pull};
pub use digest::{Digest, DIGEST_HEX_LEN};
pub use engine::{
    Capabilities, Engine, EngineExt, EntryMeta, Instance, JointStagedWrite, KvEngine, LargeEngine,
    PublishOutcome, Sharing, Stage, StagedWrite, Stat, Tier, Timestamp,
};
pub use error::{Error, ProtectReason, Result};
pub use failure::{Context, ErrorKind, Failure, Report, Source};
pub use fleet::{
    fleet_cache_namespaces, fleet_swept_namespaces, BoundLivenessTable, FleetBatch, FleetPolicy,
    LivenessTable, PinGeneration, PinIntent, PinProof, PolicyRow,
};
pub use instance_lock::InstanceLock;
pub use key::{Key, Namespace, NAMESPACE_MAX_LEN};
pub use read::{BlobReader, RangeRequest, ReadOptions, ReadPlan, SizedRead, StreamParts};
pub use refs::{
    ref_conflict, Author, RefEntry, RefExpect, RefName, RefStore, Replace, REF_NAME_MAX_LEN,
};
pub use retry::RetryPolicy;
pub use seam::{
    BatchClauses, GcSchema, GcSeam, LivenessClauses, PinClauses, PinRows, PolicyClauses,
    StagedCandidate, SweepLockClause, SweepLockGuard, WindowClauses, WindowDeletes,
};

/// Default chunk size used when streaming blobs between tiers (128 KiB):
/// also the most of a response's bytes a streamed read holds for a client
/// that stopped reading (ADR-057; it was 256 KiB, and a stalled GET held
/// about a megabyte).
pub const CHUNK_SIZE: usize = 128 * 1024;
