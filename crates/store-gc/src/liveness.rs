use async_trait::async_trait;
use store_types::{Key, Result};

/// The embedder's statement of which keys it references, asked in batches
/// so that a sweep never materialises the whole reference set.
///
/// # Contract
///
/// `probe` answers index-aligned: `true` means the key is referenced.
/// An error fails the sweep (as an operational error) for the batch being
/// probed; nothing in that batch is deleted. The error is the shared
/// [`store_types::Error`], so that its kind, context and cause reach the
/// sweep's caller: wrap a foreign error with
/// `Error::backend(kind, "query references").with_source(e)`.
#[async_trait]
pub trait LivenessSource: Send + Sync + 'static {
    /// Whether each key is referenced.
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>>;
}

/// One embedder hook naming protected keys, consulted once at the start of
/// each sweep (before anything is deleted) and at each direct delete.
///
/// # Contract
///
/// If it fails, the sweep deletes nothing and reports
/// [`GcAbortCause::ProtectFailed`](crate::GcAbortCause::ProtectFailed), with
/// the error in [`SweepReport::protect_error`](crate::SweepReport::protect_error);
/// a direct delete is refused with an error whose source is the callback's.
#[async_trait]
pub trait ProtectCallback: Send + Sync + 'static {
    /// The keys that must not be deleted right now.
    async fn protected_keys(&self) -> Result<Vec<Key>>;
}

/// Handle returned by a registration, used to deregister.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(pub(crate) u64);
