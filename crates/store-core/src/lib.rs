//! Blobpool's facade: one [`Store`] over a kv engine and an optional large
//! engine, with the put pipeline, tier dispatch, verified reads and GC.
//!
//! ```no_run
//! # async fn demo(kv: impl store_types::KvEngine, large: impl store_types::LargeEngine)
//! # -> Result<(), store_types::Error> {
//! use store_core::{Mode, PutOptions, Store};
//! use store_types::{Key, Namespace};
//!
//! let store = Store::builder()
//!     .kv(kv)
//!     .large(large)
//!     .mode(Mode::DualTier { threshold: 64 * 1024 })
//!     .build()
//!     .await?;
//! let ns = Namespace::new("docs")?;
//! let receipt = store.put(&ns, &b"hello"[..]).await?;
//! // Checked against a declared length (or an expected digest):
//! let len = Some(5);
//! store.put_opts(&ns, &b"hello"[..], PutOptions { len, ..Default::default() }).await?;
//! let blob = store.get(&Key::new(ns, receipt.digest)).await?.expect("just stored");
//! assert_eq!(&blob.bytes().await?[..], b"hello");
//! # Ok(()) }
//! ```
//!
//! Architecture invariant: this crate names no engine. It judges
//! configurations from the engines' [`store_types::Capabilities`] only.

mod blob;
mod builder;
mod cache;
mod fleet;
mod inspect;
mod put;
mod refs;
mod store;
mod verified;

pub use blob::Blob;
pub use builder::{
    Mode, StoreBuilder, DEFAULT_PIN_TTL, DEFAULT_THRESHOLD, DEFAULT_WINDOW, MAX_THRESHOLD,
};
pub use cache::{
    Cache, CacheTrimmer, ACCESS_FLUSH_EVERY, ACCESS_FLUSH_KEYS, ACCESS_RESOLUTION,
    ACCESS_REWRITE_AFTER, KEY_CACHE_ENTRIES,
};
pub use inspect::{
    CorruptEntry, EntryInfo, EntryPage, QuarantineOutcome, TierStats, VerifyEvent, VerifyOptions,
    VerifySummary, MAX_LIST_LIMIT,
};
pub use put::{PutOptions, PutReceipt};
pub use refs::{GcPolicy, Refs, SetRefOptions, SetRefOutcome};
pub use store::{Gc, Liveness, Store};
pub use store_types::{CacheBounds, CacheTrim, CacheUsage};
pub use verified::{DEFAULT_OUTBOARD_CACHE_BYTES, OUTBOARD_KEPT_ABOVE, WHOLE_VERIFY_MAX};

pub use store_gc::{
    Clock, GcAbortCause, LivenessSource, ManualClock, NamespaceCounts, Pin, ProtectCallback,
    ProtectedCounts, SourceId, SweepOptions, SweepReport, SystemClock, FENCE_GRACE,
};
pub use store_types::{
    Author, Digest, Error, Key, LivenessTable, Namespace, RefEntry, RefExpect, RefName, Replace,
    Result, Stat, Tier, Timestamp,
};
