use async_trait::async_trait;
use store_types::Key;

/// The embedder's statement of which keys it references, asked in batches
/// so that a sweep never materialises the whole reference set.
///
/// # Contract
///
/// `probe` answers index-aligned: `true` means the key is referenced.
/// An error fails the sweep (as an operational error) for the batch being
/// probed; nothing in that batch is deleted.
#[async_trait]
pub trait LivenessSource: Send + Sync + 'static {
    /// Whether each key is referenced.
    async fn probe(&self, keys: &[Key]) -> Result<Vec<bool>, String>;
}

/// One embedder hook naming protected keys, consulted once at the start of
/// each sweep (before anything is deleted) and at each direct delete.
///
/// # Contract
///
/// If it fails, the sweep deletes nothing and reports
/// [`GcAbortCause::ProtectFailed`](crate::GcAbortCause::ProtectFailed); a
/// direct delete is refused with an error.
#[async_trait]
pub trait ProtectCallback: Send + Sync + 'static {
    /// The keys that must not be deleted right now.
    async fn protected_keys(&self) -> Result<Vec<Key>, String>;
}

/// Handle returned by a registration, used to deregister.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId(pub(crate) u64);
