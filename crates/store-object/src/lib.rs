//! Object-store large engine for Blobpool.
//!
//! [`ObjectEngine`] keeps each large entry as one object in any
//! [`object_store::ObjectStore`] — Amazon S3 and S3-compatible servers
//! (feature `s3`), the local file system, process memory, or any store an
//! embedder builds (GCS, Azure, a wrapper) — and implements
//! [`store_types::Engine`] and [`store_types::LargeEngine`].
//!
//! # Layout
//!
//! ```text
//! <prefix>/
//!   .stage/<millis>-<salt>-<counter>   staged large puts (multipart uploads)
//!   <namespace>/<2 hex>/<64 hex>       published content
//!   <namespace>/<2 hex>/<64 hex>.obao  its BLAKE3 outboard (ADR-032)
//! ```
//!
//! The fan-out segment is the digest's first byte. Names are only ever
//! built from validated [`store_types::Namespace`] and
//! [`store_types::Digest`] values; listings skip every name that is not a
//! valid namespace, fan-out or digest. `.stage` can never collide with a
//! namespace (namespaces cannot start with `.`). Size and creation time
//! come from the object's metadata (HEAD or listing: `size`,
//! `last_modified`).
//!
//! # Puts
//!
//! Content addressing needs the digest before the final name, and the
//! facade usually tells a stage its key only at
//! [`store_types::StagedWrite::publish`]. So:
//!
//! - **Small bodies** (at most [`ObjectOptions::multipart_threshold`]
//!   bytes) are buffered and written at publish straight to the final name
//!   with one conditional `PUT` ([`object_store::PutMode::Create`]):
//!   `AlreadyExists` means `AlreadyPresent`. Nothing is staged.
//! - **Larger bodies** stream into a multipart upload under a unique
//!   `.stage/` name as they arrive (parts of
//!   [`ObjectOptions::part_size`], at most
//!   [`ObjectOptions::upload_concurrency`] in flight: memory stays bounded
//!   and the upload overlaps the facade's hashing). Publishing completes
//!   the upload, copies the stage to the final name with a server-side
//!   **copy-if-not-exists** (`AlreadyExists` → `AlreadyPresent`), then
//!   deletes the stage object.
//! - **Larger bodies with an expected digest**
//!   ([`store_types::LargeEngine::stage_expecting`]: the caller supplied
//!   the digest, and publishes only under it after verifying the bytes)
//!   stream into a multipart upload straight to the final name. Publishing
//!   looks first (one HEAD: an existing entry aborts the upload and means
//!   `AlreadyPresent`), then completes the upload, which makes the object
//!   appear; a verification failure aborts the upload. No stage object, no
//!   copy: about twice the put throughput where the copy costs as much as
//!   the upload. object_store 0.14 cannot complete a multipart upload
//!   conditionally, so across instances two racing publishers may both
//!   complete (both `Inserted`, one entry with the same bytes). An upload
//!   in progress is never an object: S3 (and GCS, Azure) show nothing
//!   until completion, `LocalFileSystem` writes a `<name>#<n>` file it
//!   never lists and renames into place, `InMemory` keeps the parts in the
//!   upload. [`ObjectOptions::direct_expected_puts`] turns this off.
//!
//! Every publish first writes the entry's outboard object (when the facade
//! handed one over, [`store_types::StagedWrite::set_outboard`]: entries
//! over 1 MiB, TUNING.md §small-outboards), and only once that write has succeeded makes the
//! entry's name appear: a visible entry given one always has it, and a crash in between leaves an
//! outboard without its entry, which is invisible (reads look for the
//! entry first) and is overwritten by the next put of that content. Not
//! yet removed by maintenance: such leftovers cost 0.4 % of the put that
//! failed. A delete removes the entry, then its outboard.
//!
//! Either way the final name appears atomically and complete, or not at
//! all; two concurrent publishes of one key (in this process or on two
//! nodes) both succeed, one `Inserted` and one `AlreadyPresent`, leaving
//! one entry. Within one engine instance, publishes of one key are also
//! serialised by a per-key lock: a publish that had to wait looks first
//! (one HEAD) and skips its write when the entry is there, and the
//! one-`Inserted` answer does not depend on the server's conditional
//! checks being atomic (moto's are not; S3's are).
//!
//! Whether the backend really honours conditional puts and
//! copy-if-not-exists is probed when the engine opens (a few requests
//! under `.stage/`, see [`ObjectOptions::probe_conditional`]). Where a
//! backend lacks one, the engine falls back to *HEAD, then unconditional
//! put/copy*: still one entry with the right bytes (content addressing
//! makes the overwrite identical), but two racing publishes may both
//! report `Inserted` (ADR-019). The fallback is logged at open and visible
//! in [`ObjectEngine::capabilities`].
//!
//! A stage that is aborted or dropped aborts its multipart upload. A
//! publish that fails after the upload completed deletes the stage object;
//! if that delete fails too, the object is left for
//! [`ObjectEngine::reap_stale_stages`], which also runs when an engine
//! opens: stage objects older than [`ObjectOptions::staging_grace`] belong
//! to crashed or failed puts (a live stage object exists only between the
//! upload's completion and the end of its publishing copy). Multipart
//! uploads interrupted by a crash (staged or direct) are not objects and
//! are invisible to listings: on S3 an `AbortIncompleteMultipartUpload`
//! lifecycle rule removes them. A failed completion of a direct upload
//! deletes nothing: an object it may have created unseen is a complete,
//! correct entry.
//!
//! # Reads
//!
//! A read is one `GET` (a ranged `GET` for `read_range`); a task reads
//! ahead up to a few [`store_types::CHUNK_SIZE`] chunks so the facade's
//! verification overlaps the transfer. Entries of at most one chunk are
//! returned from memory. `has_many` asks concurrently, and lists a fan-out
//! prefix instead of issuing HEADs where many digests share it.
//!
//! # Failures
//!
//! Whole operations (reads, listings, `has_many`, `delete_many`) are
//! retried by `store-layers`' `RetryLayer` when the engine is wrapped in
//! it, as the binary wraps every engine (ADR-064). The steps inside a
//! stage that no layer can repeat — starting a multipart upload, the
//! publishing conditional put or copy and its lookups, the outboard
//! write, removing the stage object — and the probes at open are retried
//! here, under [`ObjectOptions::retry`] ([`RetryPolicy`], the same
//! policy), for errors that may be transient. Both sit above the
//! backend's own retries (object_store's HTTP client retries 5xx, 429 and
//! connection errors of idempotent requests). Repeating a conditional
//! request whose first attempt succeeded unseen yields `AlreadyExists`,
//! i.e. `AlreadyPresent`: the entry is there either way.
//!
//! `object` is not a GC seam member (its `Capabilities::seam` is `None`): its delete
//! window lives in the facade, like `local`'s. In fleet mode it is shared
//! by nature ([`Sharing::SharedService`] for S3 and other services) and
//! the facade commits the pin row before calling the plain publish
//! (ADR-012 §4, ADR-019).

mod engine;
mod error;
mod reader;
mod registration;
mod stage;
#[cfg(any(test, feature = "testing"))]
mod testing;
#[cfg(all(feature = "s3", any(test, feature = "testing")))]
pub use testing::s3 as s3_testing;
#[cfg(test)]
mod tests;
mod url;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{CopyMode, CopyOptions, ObjectStore, PutMode, PutOptions};
use store_types::{Digest, Error, Instance, Key, Namespace, Result, Sharing, Timestamp};

pub use object_store;
pub use registration::REGISTRATION;
pub use store_types::RetryPolicy;
pub use url::{backend_from_url, Backend};

/// Name of the stage "directory" under the prefix.
const STAGE_DIR: &str = ".stage";

/// Options of an [`ObjectEngine`].
#[derive(Clone, Debug)]
pub struct ObjectOptions {
    /// Where the engine's objects live inside the store (may be the root).
    /// [`ObjectEngine::from_url`] appends it to the URL's path.
    pub prefix: Path,
    /// A URL-like name of the bucket and prefix, e.g.
    /// `s3://bucket/prefix`: the [`Instance::Other`] the descriptor
    /// reports. [`ObjectEngine::from_url`] fills it in when empty.
    pub instance_label: String,
    /// How the store is shared between nodes. `None`: derived —
    /// [`Sharing::SharedService`] for S3 and for stores passed to
    /// [`ObjectEngine::new`], [`Sharing::ProcessLocal`] for `memory://`,
    /// undeclared [`Sharing::DeclaredMedia`] for `file://`.
    pub sharing: Option<Sharing>,
    /// Whether an acknowledged put survives a crash. `None`: derived —
    /// `false` for `memory://`, `true` otherwise (`file://` stores fsync).
    pub durable: Option<bool>,
    /// Whether the store lists in lexicographic order (S3, GCS, Azure,
    /// memory do; the local file system does not), which lets scans and
    /// `has_many` stop listing early. `None`: derived from the URL scheme;
    /// `false` for [`ObjectEngine::new`].
    pub ordered_listing: Option<bool>,
    /// Stage objects older than this are abandoned and reaped (at open and
    /// by [`ObjectEngine::reap_stale_stages`]). It must exceed the longest
    /// publishing copy. Default one hour.
    pub staging_grace: Duration,
    /// Bodies up to this many bytes are buffered and written with one
    /// conditional put at publish; larger ones stream into a multipart
    /// upload under a stage name. Default 8 MiB.
    pub multipart_threshold: usize,
    /// Multipart part size. S3 needs at least 5 MiB (except for the last
    /// part). Default 8 MiB.
    pub part_size: usize,
    /// Parts uploaded concurrently per stage. Memory per stage is about
    /// `part_size * (upload_concurrency + 1)`. Default 4.
    pub upload_concurrency: usize,
    /// Requests in flight for one `has_many` / `delete_many` call.
    /// Default 16.
    pub request_concurrency: usize,
    /// `has_many` lists a fan-out prefix instead of issuing HEADs when at
    /// least this many of the asked digests share it. Default 16: on AWS a
    /// LIST is billed like 12.5 HEADs; latency alone favours listing from
    /// about 3 per fan-out (ADR-019 §7).
    pub list_min_group: usize,
    /// Retry policy for the transient failures of a stage's steps and of
    /// the probes at open (see "Failures" above).
    pub retry: RetryPolicy,
    /// Probe, at open, whether the store honours conditional puts and
    /// copy-if-not-exists (a few requests under `.stage/`). When `false`,
    /// both are assumed to work. Default `true`.
    pub probe_conditional: bool,
    /// Large puts whose digest the caller supplies up front
    /// ([`store_types::LargeEngine::stage_expecting`]) upload straight to
    /// the final name and complete the upload at publish, instead of
    /// staging and copying. Turn off only for a store whose multipart
    /// uploads become visible before completion (none of object_store's
    /// backends do). Default `true`.
    pub direct_expected_puts: bool,
}

impl Default for ObjectOptions {
    fn default() -> Self {
        ObjectOptions {
            prefix: Path::default(),
            instance_label: String::new(),
            sharing: None,
            durable: None,
            ordered_listing: None,
            staging_grace: Duration::from_secs(3600),
            multipart_threshold: 8 << 20,
            part_size: 8 << 20,
            upload_concurrency: 4,
            request_concurrency: 16,
            list_min_group: 16,
            retry: RetryPolicy::default(),
            probe_conditional: true,
            direct_expected_puts: true,
        }
    }
}

/// What the store was found to support when the engine opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// `PUT` with `PutMode::Create` refuses an existing name.
    pub conditional_put: bool,
    /// `copy_if_not_exists` refuses an existing destination.
    pub copy_if_not_exists: bool,
}

/// A large engine storing one object per entry in an object store.
///
/// Cloning is cheap and shares the instance.
#[derive(Clone)]
pub struct ObjectEngine {
    inner: Arc<Inner>,
}

/// State shared by the engine and its stages.
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) prefix: Path,
    pub(crate) options: ObjectOptions,
    pub(crate) instance: Instance,
    pub(crate) sharing: Sharing,
    pub(crate) durable: bool,
    pub(crate) ordered: bool,
    pub(crate) caps: Capabilities,
    /// Distinguishes this instance's stage names from other instances'.
    salt: u64,
    next_stage: AtomicU64,
    /// Per-key locks serialising this instance's publishes of one key.
    pub(crate) publishing: stage::KeyLocks,
}

impl ObjectEngine {
    /// Opens an engine over `store`.
    ///
    /// Lists the stage prefix (so an unreachable store or a missing bucket
    /// fails here), reaps stage objects older than
    /// [`ObjectOptions::staging_grace`], and probes conditional-write
    /// support unless [`ObjectOptions::probe_conditional`] is off.
    pub async fn new(store: Arc<dyn ObjectStore>, options: ObjectOptions) -> Result<Self> {
        let instance = Instance::Other(options.instance_label.clone());
        let sharing = options.sharing.unwrap_or(Sharing::SharedService);
        let durable = options.durable.unwrap_or(true);
        let ordered = options.ordered_listing.unwrap_or(false);
        Self::open(store, options, instance, sharing, durable, ordered).await
    }

    /// Opens an engine from a URL: `memory://`, `file:///absolute/dir`
    /// (created if missing; objects are fsynced), or — with feature `s3` —
    /// `s3://bucket/prefix`, configured from the `AWS_*` environment
    /// variables (`AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, `AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, ...). See
    /// [`backend_from_url`].
    pub async fn from_url(url: &str, options: ObjectOptions) -> Result<Self> {
        Self::from_url_with(url, options, std::iter::empty::<(&str, &str)>()).await
    }

    /// Like [`ObjectEngine::from_url`], with object_store configuration
    /// keys (e.g. `aws_endpoint`, `aws_allow_http`) applied over the
    /// environment's.
    pub async fn from_url_with<I, K, V>(
        url: &str,
        options: ObjectOptions,
        config: I,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: Into<String>,
    {
        let b = backend_from_url(url, config)?;
        let mut options = options;
        let prefix = join_paths(&b.prefix, &options.prefix);
        if options.instance_label.is_empty() {
            options.instance_label = b.label.clone();
        }
        options.prefix = prefix;
        let sharing = options.sharing.unwrap_or(b.sharing);
        let durable = options.durable.unwrap_or(b.durable);
        let ordered = options.ordered_listing.unwrap_or(b.ordered_listing);
        let instance = match b.instance {
            Instance::Other(_) => Instance::Other(options.instance_label.clone()),
            other => other,
        };
        Self::open(b.store, options, instance, sharing, durable, ordered).await
    }

    async fn open(
        store: Arc<dyn ObjectStore>,
        options: ObjectOptions,
        instance: Instance,
        sharing: Sharing,
        durable: bool,
        ordered: bool,
    ) -> Result<Self> {
        if options.part_size == 0 || options.upload_concurrency == 0 {
            return Err(Error::Config(
                "object engine: part_size and upload_concurrency must be positive".into(),
            ));
        }
        let mut inner = Inner {
            store,
            prefix: options.prefix.clone(),
            options,
            instance,
            sharing,
            durable,
            ordered,
            caps: Capabilities {
                conditional_put: true,
                copy_if_not_exists: true,
            },
            salt: store_types::layout::random_salt(),
            next_stage: AtomicU64::new(0),
            publishing: stage::KeyLocks::default(),
        };
        let reaped = inner.reap_stale_stages(inner.options.staging_grace).await?;
        if reaped > 0 {
            tracing::info!(store = %inner.store, prefix = %inner.prefix, reaped,
                "removed abandoned stage objects");
        }
        if inner.options.probe_conditional {
            inner.caps = inner.probe().await?;
            if !inner.caps.conditional_put || !inner.caps.copy_if_not_exists {
                tracing::warn!(store = %inner.store, caps = ?inner.caps,
                    "object store lacks conditional writes; publishes fall back to \
                     HEAD-then-write (racing publishes may both report Inserted)");
            }
        }
        Ok(ObjectEngine {
            inner: Arc::new(inner),
        })
    }

    /// The underlying store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    /// The prefix all objects live under.
    pub fn prefix(&self) -> &Path {
        &self.inner.prefix
    }

    /// The options the engine was opened with (prefix and label resolved).
    pub fn options(&self) -> &ObjectOptions {
        &self.inner.options
    }

    /// What the store was found to support at open.
    pub fn capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    /// The object name of `key`'s content.
    pub fn content_path(&self, key: &Key) -> Path {
        self.inner.content_path(key)
    }

    /// Deletes stage objects last modified more than `older_than` ago;
    /// returns how many. Stage objects of live puts are younger than any
    /// sensible grace period (one exists only between a multipart upload's
    /// completion and the end of its publishing copy), so this is safe to
    /// run at any time from any node. The engine runs it at open with
    /// [`ObjectOptions::staging_grace`]; long-running processes should call
    /// it periodically (for instance after each GC sweep).
    pub async fn reap_stale_stages(&self, older_than: Duration) -> Result<u64> {
        self.inner.reap_stale_stages(older_than).await
    }
}

impl fmt::Debug for ObjectEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectEngine")
            .field("store", &format_args!("{}", self.inner.store))
            .field("prefix", &self.inner.prefix)
            .field("instance", &self.inner.instance)
            .field("caps", &self.inner.caps)
            .finish()
    }
}

impl Inner {
    /// `<prefix>/<ns>`.
    pub(crate) fn ns_path(&self, ns: &Namespace) -> Path {
        self.prefix.clone().join(ns.as_str())
    }

    /// `<prefix>/<ns>/<2 hex>`.
    pub(crate) fn fan_path(&self, ns: &Namespace, fan: u8) -> Path {
        self.ns_path(ns)
            .join(store_types::layout::fan_name(fan).as_str())
    }

    /// `<prefix>/<ns>/<2 hex>/<digest hex>`.
    pub(crate) fn digest_path(&self, ns: &Namespace, digest: &Digest) -> Path {
        self.fan_path(ns, digest.as_bytes()[0])
            .join(digest.to_hex().as_str())
    }

    pub(crate) fn content_path(&self, key: &Key) -> Path {
        self.digest_path(&key.namespace, &key.digest)
    }

    /// `<prefix>/<ns>/<2 hex>/<digest hex>.obao`: the entry's outboard.
    pub(crate) fn outboard_path(&self, key: &Key) -> Path {
        self.fan_path(&key.namespace, key.digest.as_bytes()[0])
            .join(format!("{}.obao", key.digest.to_hex()).as_str())
    }

    /// Writes an outboard object (unconditionally: an outboard is a
    /// function of the content, so any existing one that is valid has the
    /// same bytes, and an invalid one is repaired).
    pub(crate) async fn put_outboard(&self, key: &Key, outboard: &bytes::Bytes) -> Result<()> {
        let path = self.outboard_path(key);
        let payload = object_store::PutPayload::from_bytes(outboard.clone());
        self.retry("publishing outboard", &path, || {
            self.store
                .put_opts(&path, payload.clone(), PutOptions::default())
        })
        .await
        .map_err(|e| crate::error::backend_err("publishing outboard", &path, e))?;
        Ok(())
    }

    /// `<prefix>/.stage`.
    pub(crate) fn stage_dir(&self) -> Path {
        self.prefix.clone().join(STAGE_DIR)
    }

    /// A fresh, never-before-used stage object name.
    pub(crate) fn next_stage_path(&self) -> Path {
        let n = self.next_stage.fetch_add(1, Ordering::Relaxed);
        let name = format!("{}-{:016x}-{n}", Timestamp::now().0, self.salt);
        self.stage_dir().join(name.as_str())
    }

    /// See [`ObjectEngine::reap_stale_stages`].
    pub(crate) async fn reap_stale_stages(&self, older_than: Duration) -> Result<u64> {
        let dir = self.stage_dir();
        let cutoff = Timestamp::now().0 - older_than.as_millis().min(i64::MAX as u128) as i64;
        let stale: Vec<Path> = self
            .retry("listing stage objects", &dir, || {
                self.store
                    .list(Some(&dir))
                    .try_filter(|m| {
                        futures::future::ready(m.last_modified.timestamp_millis() <= cutoff)
                    })
                    .map_ok(|m| m.location)
                    .try_collect::<Vec<_>>()
            })
            .await
            .map_err(|e| error::backend_err("listing stage objects", &dir, e))?;
        if stale.is_empty() {
            return Ok(0);
        }
        let mut removed = 0;
        let results: Vec<_> = self
            .store
            .delete_stream(futures::stream::iter(stale.into_iter().map(Ok)).boxed())
            .collect()
            .await;
        for r in results {
            match r {
                Ok(_) => removed += 1,
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(error::backend_err("deleting a stage object", &dir, e)),
            }
        }
        Ok(removed)
    }

    /// Finds out whether the store honours `PutMode::Create` and
    /// `CopyMode::Create`, using two probe names under `.stage/` (removed
    /// again; if that fails they are reaped like any stage object).
    async fn probe(&self) -> Result<Capabilities> {
        let a = self.next_stage_path();
        let b = self.next_stage_path();
        let put = |mode: PutMode| {
            let a = a.clone();
            async move {
                self.retry("probing conditional put", &a, || {
                    self.store
                        .put_opts(&a, "probe".into(), PutOptions::from(mode.clone()))
                })
                .await
            }
        };
        let copy = || {
            self.retry("probing copy-if-not-exists", &b, || {
                self.store
                    .copy_opts(&a, &b, CopyOptions::new().with_mode(CopyMode::Create))
            })
        };
        let result = async {
            let conditional_put = match put(PutMode::Create).await {
                Ok(_) => match put(PutMode::Create).await {
                    Err(object_store::Error::AlreadyExists { .. }) => true,
                    Ok(_) => false, // silently ignored
                    Err(e) if error::unsupported(&e) => false,
                    Err(e) => return Err(error::backend_err("probing conditional put", &a, e)),
                },
                Err(e) if error::unsupported(&e) => {
                    put(PutMode::Overwrite)
                        .await
                        .map_err(|e| error::backend_err("probing the store", &a, e))?;
                    false
                }
                Err(e) => return Err(error::backend_err("probing conditional put", &a, e)),
            };
            let copy_if_not_exists = match copy().await {
                Ok(()) => match copy().await {
                    Err(object_store::Error::AlreadyExists { .. }) => true,
                    Ok(()) => false,
                    Err(e) if error::unsupported(&e) => false,
                    Err(e) => return Err(error::backend_err("probing copy-if-not-exists", &b, e)),
                },
                Err(e) if error::unsupported(&e) => false,
                Err(e) => return Err(error::backend_err("probing copy-if-not-exists", &b, e)),
            };
            Ok(Capabilities {
                conditional_put,
                copy_if_not_exists,
            })
        }
        .await;
        for p in [&a, &b] {
            self.delete_quietly(p).await;
        }
        result
    }

    /// Deletes `path`, logging (not returning) a failure: used for stage
    /// objects, which the reaper removes if this does not.
    pub(crate) async fn delete_quietly(&self, path: &Path) {
        match self
            .retry("deleting", path, || async {
                match object_store::ObjectStoreExt::delete(self.store.as_ref(), path).await {
                    Err(object_store::Error::NotFound { .. }) => Ok(()),
                    r => r,
                }
            })
            .await
        {
            Ok(()) => {}
            Err(e) => tracing::warn!(path = %path, error = %e,
                "could not delete a stage object; it will be reaped after the grace period"),
        }
    }
}

/// `a/b` for two object paths (either may be the root).
fn join_paths(a: &Path, b: &Path) -> Path {
    b.parts().fold(a.clone(), |acc, part| acc.join(part))
}
