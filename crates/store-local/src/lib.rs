//! Local file-system large engine for Blobpool.
//!
//! [`LocalEngine`] stores each entry as one file under a root directory and
//! implements [`store_types::Engine`] and [`store_types::LargeEngine`].
//!
//! # Layout
//!
//! ```text
//! <root>/
//!   .blobpool.lock                        the instance lock (non-fleet stores)
//!   .stage/<pid>-<salt>-<counter>.stage   in-progress puts (flock-held)
//!   <namespace>/<2 hex>/<64 hex digest>   published content
//!   <namespace>/<2 hex>/<64 hex digest>.obao   its BLAKE3 outboard (ADR-032)
//! ```
//!
//! The two-hex fan-out directory is the first byte of the digest. Paths
//! are only ever built from validated [`store_types::Namespace`] and
//! [`store_types::Digest`] values. Directory listings skip every name that
//! is not a valid namespace, fan-out or digest (junk is ignored, never
//! reported or deleted). Fan-out and namespace directories are never
//! removed (an empty one simply holds no entries), so a publish never
//! races a directory removal.
//!
//! # Instance lock
//!
//! A non-fleet store holds the root exclusively (`Engine::lock_instance`):
//! an exclusive `flock` on `<root>/.blobpool.lock`, taken when the store is
//! built and released when it drops or its process dies; the file names
//! the holder (pid, host, since when) and is never deleted. A second
//! non-fleet store on the same root — in another process or this one —
//! fails to build. Fleet stores (declared shared media) do not lock.
//! Names starting with `.` are never namespaces, so the lock file and the
//! stage directory never collide with entries and listings skip them.
//!
//! # Puts
//!
//! A stage is a uniquely named file in `.stage/`, written in batches of
//! buffered chunks (at least 256 KiB), each batch one short blocking call
//! started without waiting for it, so the caller hashes chunk *n + 1*
//! while chunk *n* is written; at most about 1 MiB waits behind a batch in
//! progress. No thread is held between batches: a put whose uploader
//! stalls holds no blocking-pool thread while it waits (see "Threads"
//! below). Publishing, in one blocking call:
//!
//! 1. what is still buffered is written; if the content path already holds a usable
//!    entry the stage is removed and the outcome is `AlreadyPresent` (no
//!    fsync spent). "Usable" is decided by **opening** the path and
//!    `fstat`ing the descriptor — a regular file (or a symlink to one) of
//!    exactly the stage's size — never by a `stat`, which on NFS may
//!    answer from a stale attribute cache for an entry another node has
//!    deleted;
//! 2. with `fsync` on, the stage file is `fdatasync`ed;
//! 3. the fan-out directories are created and the stage is
//!    **hard-linked** to the content path. `link(2)` never replaces an
//!    existing name, so two concurrent publishes of one key yield exactly
//!    one `Inserted` (the loser sees `AlreadyExists`, opens the existing
//!    file and checks it as in step 1 → `AlreadyPresent`). A name that
//!    vanishes between the two is linked again; a name holding something
//!    unusable (a truncated file, a dangling symlink) is replaced by
//!    renaming the stage over it (`Inserted`, with a warning), and one that
//!    cannot be replaced (a directory) fails the publish — a put never
//!    claims a deduplication onto something a read could not serve.
//!    The stage name is then unlinked. Hard links are required: [`LocalEngine::open`]
//!    probes for them and refuses a root that lacks them;
//!
//!    3a. Before the link, the entry's outboard (handed over by the facade,
//!    [`store_types::StagedWrite::set_outboard`]) is written to a stage
//!    file of its own, `fdatasync`ed (with `fsync` on; on a second thread
//!    while step 2 syncs the entry's bytes, so the two cost about one) and
//!    **renamed** to
//!    `<digest>.obao` beside the content path. Its name precedes the
//!    entry's in the same directory, and step 4's one directory fsync makes
//!    both durable: a crash leaves no entry, an outboard without its entry
//!    (invisible: every read looks for the entry first; `maintain` removes
//!    it after [`ORPHAN_OUTBOARD_GRACE`]), or the entry with its outboard —
//!    never the entry without it (entries of at most 1 MiB are handed no
//!    outboard and keep none, TUNING.md §small-outboards). A publish that deduplicates onto an
//!    entry without an outboard (stored before outboards) gives it this one;
//! 4. with `fsync` on, the fan-out directory is fsynced, and — once per
//!    process for each directory not yet known durable — its parents too.
//!
//! A delete removes the entry's name, then its outboard's. The one window
//! that can leave a visible entry without its outboard is a re-put of the
//! same content racing that delete (its outboard renamed in between the
//! two unlinks); such an entry (over 1 MiB) gets its outboard again on its
//! first range read (the facade's lazy path,
//! [`store_types::Engine::store_outboard`]).
//! An outboard is never *wrong*: it is a function of the content, and the
//! facade validates it against the digest before use.
//!
//! A stage that is dropped or aborted, or whose write fails, removes its
//! file (on a blocking thread; a drop does not wait for it). Each live stage holds an exclusive `flock` on its file; at open
//! (and in [`store_types::Engine::maintain`]), every stage file whose lock
//! the cleanup can take is an orphan of a crashed put and is removed, while
//! stages of other live engine instances on the same root (another
//! process, another node on shared media, or a second instance in this
//! process) are left alone. The probe opens each stage file read-write (an
//! exclusive lock on NFS needs a writable descriptor). Only a successful
//! lock means "orphan" and only "would block" means "held"; any other
//! failure (`ENOLCK`, `EBADF`, `EINVAL`, `EIO`, an open error) means
//! "unknown" and the file is kept, with a warning. This needs `flock` to
//! work across every node using the root (it does locally and on Linux NFS
//! clients with working locks, see below).
//!
//! # NFS and other shared media
//!
//! A root shared by several nodes (`shared_media: true`) is supported on
//! NFSv4 (NFSv3 only with a working NLM lock manager, `lockd`/`statd`;
//! not tested) when:
//!
//! - **byte-range locks work across clients**: a Linux NFS client emulates
//!   `flock` with whole-file `fcntl` locks held on the server. Mounts with
//!   `nolock` or `local_lock=flock`/`all` make locks node-local: another
//!   node's cleanup then takes the lock of a live stage and removes it, and
//!   that put fails (loudly, at the link). Not supported. Where locking
//!   fails outright, no stage is ever removed: orphans accumulate (a
//!   warning names them) until removed by hand while no put runs;
//! - **close-to-open consistency** holds (no `nocto`): the dedup check
//!   relies on `open(2)` revalidating cached attributes. Attribute caching
//!   (`actimeo`, `acregmin`…) is otherwise harmless to puts; `meta`,
//!   `has_many` and scans use `stat` and may answer from the cache for up
//!   to `acregmax`/`acdirmax` seconds (a just-deleted entry may still look
//!   present there, its read then finds it gone);
//! - **hard links** are supported and `link(2)` is atomic on the server
//!   (it fails with `EEXIST` rather than replacing): it is the no-clobber
//!   publish;
//! - **durability**: `fsync` reaches stable storage only if the server
//!   commits before replying — the `sync` export option (an `async`
//!   export acknowledges writes a server crash can lose, whatever
//!   [`LocalOptions::fsync`] says).
//!
//! SMB/CIFS and FUSE file systems without these guarantees are not
//! supported as shared media.
//!
//! # Reads
//!
//! A read of more than one chunk streams (ADR-085): its consumer's polls
//! read (and, for a whole-entry read, hash) it in 64 KiB chunks, inline
//! when the bytes are in the page cache, else in short blocking calls, one
//! chunk alive at once (ADR-057, ADR-086). Reads of at most one chunk are
//! read in one go and returned from memory, and every read's descriptor
//! is kept in the **open-file cache**
//! (TUNING.md §local-small-reads, [`LocalOptions::open_files`]): the next small read of the
//! entry runs in the calling task — `fstat` of the descriptor, then
//! `preadv2(…, RWF_NOWAIT)`, which copies the bytes only if all are in the
//! page cache and otherwise fails at once, sending the read to the
//! blocking pool (one `pread`, no open). Every delete drops the keys'
//! cached descriptors in every engine on the root before it returns.
//! A ranged [`store_types::Engine::read`] answers the size and the
//! span's bytes in that one step.
//!
//! # Threads
//!
//! Every file-system call that may wait for the disk runs on tokio's
//! blocking pool (`spawn_blocking`), and each such call is short: open, stat, one
//! chunk's read, one batch's write, a publish. Nothing ever waits for a
//! client on a blocking thread: a reader whose consumer stalls (a slow or
//! stopped HTTP client) waits in async code with its few live
//! chunks, and a stage whose uploader stalls holds only its file and
//! buffered bytes. So however many streaming clients stall, the blocking
//! pool stays free for the work that needs it (SQLite reads, stats,
//! other streams' chunks). The two calls made on the runtime's threads —
//! `fstat` of a cached descriptor and `preadv2` with `RWF_NOWAIT` — cannot
//! wait for the disk: the inode is in memory while the descriptor is open,
//! and `RWF_NOWAIT` answers `EAGAIN` for any byte not in the page cache
//! (`O_NOATIME` keeps the read from dirtying the inode). They run only on
//! Linux and on a root whose file system is not a network or FUSE one
//! (`statfs` at open); a file system that refuses `RWF_NOWAIT` turns them
//! off for the engine. A descriptor whose last holder is such a read is
//! closed on the blocking pool.
//!
//! # Durability
//!
//! With [`LocalOptions::fsync`] (the default) an acknowledged publish
//! survives a crash or power loss and the descriptor says `durable: true`.
//! With `fsync: false` nothing is fsynced: the like-for-like setting for
//! comparisons with peers that never fsync, **not crash-safe** (a crash
//! may leave acknowledged entries missing or truncated, which reads report
//! as verification failures), and the descriptor says `durable: false`.
//! Deletes are fsynced too when `fsync` is on — including one that finds
//! the entry already gone, whose fan-out directory is fsynced as well (the
//! unlink it saw may be another process's, not yet durable). An open that
//! creates the root, or parents of it, fsyncs each new directory's parent.
//! The crash model (feature `crash-model`, module `crash`, ADR-029) checks
//! these at every durability point.
//!
//! `local` is not a GC seam member: its delete-window staging is
//! in-process (its `Capabilities::seam` is `None`).

mod cache;
#[cfg(feature = "crash-model")]
pub mod crash;
mod engine;
mod error;
mod fsio;
mod reader;
mod registration;
mod seam;
mod stage;
mod stream;
#[cfg(any(test, feature = "testing"))]
mod testing;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use registration::REGISTRATION;
use store_types::{Error, Key, Namespace, Result};

use crate::seam::Seam;

/// Name of the stage directory under the root. It can never collide with
/// a namespace, which cannot start with `.`.
const STAGE_DIR: &str = ".stage";

/// Name of the instance lock file under the root (see the crate docs).
const LOCK_FILE: &str = ".blobpool.lock";

/// Extension of stage files.
const STAGE_EXT: &str = "stage";

/// Extension of an entry's outboard file, beside the entry.
const OUTBOARD_EXT: &str = "obao";

/// How old an outboard without its entry must be before
/// [`store_types::Engine::maintain`] removes it: a publish renames the
/// outboard in a moment before it links the entry, and a live publish's
/// outboard must never be taken. Measured against the file's mtime, so it
/// also absorbs clock skew between the nodes of a shared root.
pub const ORPHAN_OUTBOARD_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The outboard file of the entry at `content`: `<content>.obao`.
pub(crate) fn outboard_path(content: &Path) -> PathBuf {
    let mut name = content.as_os_str().to_owned();
    name.push(".");
    name.push(OUTBOARD_EXT);
    PathBuf::from(name)
}

/// Options of a [`LocalEngine`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalOptions {
    /// The operator's declaration that the root lives on media shared by
    /// every node of a fleet (ADR-008 §3). The engine cannot verify it; it
    /// is reported in the descriptor for the fleet-validity check.
    /// Default `false`.
    pub shared_media: bool,
    /// Whether publishes (and deletes) are fsynced. Default `true`.
    /// `false` is the like-for-like setting for comparisons with
    /// non-fsyncing peers and is **not crash-safe**.
    pub fsync: bool,
    /// How many entry files the open-file cache keeps open (TUNING.md §local-small-reads):
    /// small reads of a cached entry need no `open(2)` and, when their
    /// bytes are in the page cache, no hand-off to the blocking pool.
    /// Default [`DEFAULT_OPEN_FILES`]; `0` turns the cache off. Ignored
    /// (always off) with `shared_media`: another node's delete could not
    /// invalidate it. Registry setting `open_files`.
    pub open_files: usize,
}

/// Default [`LocalOptions::open_files`]: 256 descriptors (a quarter of the
/// common 1024 soft limit).
pub const DEFAULT_OPEN_FILES: usize = 256;

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            shared_media: false,
            fsync: true,
            open_files: DEFAULT_OPEN_FILES,
        }
    }
}

/// A large engine storing one file per entry under a root directory.
///
/// Cloning is cheap and shares the instance.
#[derive(Clone)]
pub struct LocalEngine {
    inner: Arc<Inner>,
}

/// State shared by the engine, its stages and their blocking calls.
pub(crate) struct Inner {
    /// The canonical root.
    root: PathBuf,
    /// `<root>/.stage`.
    stage_dir: PathBuf,
    options: LocalOptions,
    /// Distinguishes this instance's stage names from other processes'.
    salt: u64,
    /// Next stage number.
    next_stage: AtomicU64,
    /// Directories whose own entry in their parent is known durable (only
    /// maintained with `fsync` on).
    durable_dirs: Mutex<HashSet<PathBuf>>,
    /// The file-system calls a crash model watches (plain `std::fs` calls
    /// without one).
    seam: Seam,
    /// The open-file cache (TUNING.md §local-small-reads; empty when off).
    open_files: Arc<cache::OpenFiles>,
    /// Whether small reads of cached entries may run inline.
    inline: reader::Inline,
}

impl LocalEngine {
    /// Opens (creating if needed) an engine rooted at `root`.
    ///
    /// Creates the root and its stage directory, checks that the file
    /// system supports hard links ([`Error::Config`] otherwise), and
    /// removes orphan stage files left by crashed puts (logging how many).
    /// Stage files held by live stages of other instances are kept.
    pub async fn open(root: impl AsRef<Path>, options: LocalOptions) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let inner =
            tokio::task::spawn_blocking(move || Inner::open(&root, options, Seam::default()))
                .await
                .map_err(|e| {
                    Error::io(store_types::ErrorKind::Other, "run local engine open task")
                        .with_source(e)
                })??;
        Ok(LocalEngine {
            inner: Arc::new(inner),
        })
    }

    /// Opens an engine like [`LocalEngine::open`], watched by the crash
    /// `model` (feature `crash-model`): the root as it is now (created if
    /// needed), or the directory given to [`crash::CrashModel::watching`],
    /// is the model's durable image; every durability point from here on —
    /// including those of this open — is reported to the model's switch;
    /// once the switch crashes, every file-system call of this engine that
    /// changes something fails. One engine per model at a time: attaching
    /// another makes the first one dead. See [`crash`] and ADR-029.
    ///
    /// Cancel-safe (the blocking part runs to its end).
    #[cfg(feature = "crash-model")]
    pub async fn open_with_crash_model(
        root: impl AsRef<Path>,
        options: LocalOptions,
        model: &crash::CrashModel,
    ) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let model = model.clone();
        let inner = tokio::task::spawn_blocking(move || {
            let attach = |root: &Path| model.attach(&model.watched_dir(root)?);
            let seam = Seam::with_model(
                attach(&root)
                    .map_err(|e| error::io_err("attaching the crash model to", &root, e))?,
            );
            Inner::open(&root, options, seam)
        })
        .await
        .map_err(|e| {
            Error::io(store_types::ErrorKind::Other, "run local engine open task").with_source(e)
        })??;
        Ok(LocalEngine {
            inner: Arc::new(inner),
        })
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The options the engine was opened with.
    pub fn options(&self) -> LocalOptions {
        self.inner.options
    }
}

impl fmt::Debug for LocalEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalEngine")
            .field("root", &self.inner.root)
            .field("options", &self.inner.options)
            .finish()
    }
}

impl Inner {
    /// The blocking part of [`LocalEngine::open`].
    fn open(root: &Path, options: LocalOptions, seam: Seam) -> Result<Self> {
        // How many directories (the root and missing parents) this open
        // creates: each one's name in its parent must be made durable.
        let created = root
            .ancestors()
            .take_while(|d| !d.as_os_str().is_empty() && std::fs::symlink_metadata(d).is_err())
            .count();
        seam.create_dir_all(root)
            .map_err(|e| error::io_err("creating", root, e))?;
        let root = root
            .canonicalize()
            .map_err(|e| error::io_err("resolving", root, e))?;
        if !root.is_dir() {
            return Err(Error::Config(format!(
                "local engine root {} is not a directory",
                root.display()
            )));
        }
        let stage_dir = root.join(STAGE_DIR);
        seam.create_dir_all(&stage_dir)
            .map_err(|e| error::io_err("creating", &stage_dir, e))?;
        let open_files = match options.shared_media {
            true => 0,
            false => options.open_files,
        };
        let inline = reader::Inline::new(&root, open_files > 0);
        let open_files = cache::OpenFiles::register(&root, open_files);
        let inner = Inner {
            root,
            stage_dir,
            options,
            salt: store_types::layout::random_salt(),
            next_stage: AtomicU64::new(0),
            durable_dirs: Mutex::new(HashSet::new()),
            seam,
            open_files,
            inline,
        };
        let removed = fsio::remove_orphan_stages(&inner.seam, &inner.stage_dir)?;
        if removed > 0 {
            tracing::info!(
                root = %inner.root.display(),
                removed,
                "removed orphan stage files left by interrupted puts"
            );
        } else {
            tracing::debug!(root = %inner.root.display(), "no orphan stage files");
        }
        fsio::probe_hard_links(&inner.seam, &inner.stage_dir, || inner.next_stage_name())?;
        if options.fsync {
            // The root and the stage directory may have just been created.
            let seam = &inner.seam;
            fsio::fsync_dir(seam, &inner.stage_dir, "local: open: fsync stage dir")?;
            fsio::fsync_dir(seam, &inner.root, "local: open: fsync root")?;
            // The root's parent always (the root may have been created by
            // someone else just now), and the parent of every directory
            // this open created, deepest first. Found by the crash model
            // (ADR-029, finding 1): with only the root's parent fsynced,
            // a crash could take away a new root with new parents, and
            // every acknowledged put in it.
            for parent in inner.root.ancestors().skip(1).take(created.max(1)) {
                fsio::fsync_dir(seam, parent, "local: open: fsync a new dir's parent")?;
            }
        }
        Ok(inner)
    }

    /// `<root>/<ns>`.
    fn ns_dir(&self, ns: &Namespace) -> PathBuf {
        self.root.join(ns.as_str())
    }

    /// `<root>/<ns>/<2 hex>`.
    fn fan_dir(&self, key: &Key) -> PathBuf {
        self.ns_dir(&key.namespace)
            .join(store_types::layout::fan_out(&key.digest))
    }

    /// `<root>/<ns>/<2 hex>/<digest hex>`.
    fn content_path(&self, key: &Key) -> PathBuf {
        self.fan_dir(key).join(key.digest.to_hex())
    }

    /// A fresh, never-before-used stage file name.
    fn next_stage_name(&self) -> String {
        let n = self.next_stage.fetch_add(1, Ordering::Relaxed);
        format!("{}-{:016x}-{n}.{STAGE_EXT}", std::process::id(), self.salt)
    }

    /// Whether `dir`'s entry in its parent is known durable.
    fn is_known_durable(&self, dir: &Path) -> bool {
        self.durable_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(dir)
    }

    /// Records that `dir`'s entry in its parent is durable.
    fn mark_durable(&self, dir: PathBuf) {
        self.durable_dirs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(dir);
    }
}
