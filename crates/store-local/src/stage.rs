//! Staged writes. Chunks are queued (bounded) and written by a writer
//! call on the blocking pool that drains the queue and **returns when it is
//! empty**, never waiting for more; the next chunk starts a new call. The
//! publish is one last blocking call. So a put whose uploader stalls holds
//! no blocking thread, only its file and its queued bytes.

use std::fs::{self, File, TryLockError};
use std::io::{ErrorKind, IoSlice, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{Error, Key, Namespace, PublishOutcome, Result, StagedWrite};
use tokio::sync::Notify;

use crate::error::{blocking, io_err, is_absent};
use crate::fsio::fsync_dir;
use crate::seam::Seam;
use crate::Inner;

/// Bytes queued before a writer call is started: callers that send small
/// chunks are coalesced into writes of at least this size (a running
/// writer call takes whatever is queued).
const WRITE_BUFFER: usize = 256 * 1024;

/// Most bytes queued for the writer; beyond it `write` waits (in async
/// code) for the writer call to take them. With the facade's 256 KiB
/// chunks that is 1 MiB of buffering per stage: enough to keep the writer
/// busy while the caller hashes, small enough to stay bounded.
const MAX_QUEUED: usize = 4 * WRITE_BUFFER;

/// How often stage creation retries after losing a name to a concurrent
/// orphan sweep (each retry uses a fresh name).
const CREATE_ATTEMPTS: usize = 8;

/// A stage file. Holds the file's `flock` (released when the file closes)
/// and removes the file on drop unless it was published — so every way a
/// stage can end (abort, drop, write error, panic) leaves nothing behind.
/// It is dropped on a blocking thread (see [`LocalStage`]'s `Drop`).
struct StageFile {
    file: File,
    path: PathBuf,
    /// The engine's seam (a dead process removes nothing).
    seam: Seam,
    /// Set once the stage name has been unlinked by a publish.
    gone: bool,
}

impl Drop for StageFile {
    fn drop(&mut self) {
        if !self.gone {
            if let Err(e) = self.seam.remove_file(&self.path) {
                if !is_absent(&e) && self.seam.alive().is_ok() {
                    tracing::warn!(path = %self.path.display(), error = %e,
                        "could not remove stage file; it will be removed at next open");
                }
            }
        }
    }
}

/// The error of a write or publish once the stage file is gone.
fn stage_gone() -> Error {
    Error::io(store_types::ErrorKind::NotFound, "use stage file")
        .with_source("the stage file is already gone (published, discarded or failed earlier)")
}

/// Creates and locks a fresh stage file.
///
/// The orphan sweep of a concurrently opening instance may take the lock
/// of a just-created file before its creator does and remove it. The
/// creator then either fails to lock (`WouldBlock`) or locks an unlinked
/// inode (detected by comparing inode numbers); both retry under a new
/// name.
fn create_stage_file(inner: &Inner) -> Result<StageFile> {
    let mut last = None;
    for _ in 0..CREATE_ATTEMPTS {
        let path = inner.stage_dir.join(inner.next_stage_name());
        let file = match inner.seam.create_new(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err("creating stage file", &path, e)),
        };
        let stage = StageFile {
            file,
            path,
            seam: inner.seam.clone(),
            gone: false,
        };
        match stage.file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                last = Some("stage file locked by an orphan sweep");
                continue;
            }
            // No locking on this file system: stages are unprotected from
            // a concurrent open's sweep, as without the lock protocol.
            Err(TryLockError::Error(_)) => return Ok(stage),
        }
        if still_linked(&stage)? {
            return Ok(stage);
        }
        last = Some("stage file removed by an orphan sweep");
    }
    Err(
        Error::io(store_types::ErrorKind::Unavailable, "create stage file")
            .with_path(&inner.stage_dir)
            .with_source(last.unwrap_or("every attempted name collided")),
    )
}

/// Whether the stage's path still names the stage's open file.
fn still_linked(stage: &StageFile) -> Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let open = stage
            .file
            .metadata()
            .map_err(|e| io_err("stat", &stage.path, e))?;
        match fs::symlink_metadata(&stage.path) {
            Ok(m) => Ok(m.ino() == open.ino() && m.dev() == open.dev()),
            Err(e) if is_absent(&e) => Ok(false),
            Err(e) => Err(io_err("stat", &stage.path, e)),
        }
    }
    #[cfg(not(unix))]
    {
        Ok(stage.path.exists())
    }
}

/// Appends `chunks` to the stage file: one `writev` per call where the
/// kernel takes it all (small chunks are not copied to be coalesced).
fn write_chunks(stage: &StageFile, chunks: &[Bytes]) -> Result<()> {
    stage
        .seam
        .alive()
        .map_err(|e| io_err("writing stage file", &stage.path, e))?;
    let mut slices: Vec<IoSlice<'_>> = chunks.iter().map(|c| IoSlice::new(c)).collect();
    let mut bufs = &mut slices[..];
    IoSlice::advance_slices(&mut bufs, 0); // Skips empty leading slices.
    let mut out = &stage.file;
    while !bufs.is_empty() {
        match out.write_vectored(bufs) {
            Ok(0) => {
                return Err(io_err(
                    "writing stage file",
                    &stage.path,
                    ErrorKind::WriteZero.into(),
                ))
            }
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(io_err("writing stage file", &stage.path, e)),
        }
    }
    Ok(())
}

/// How often a publish links again after finding the name taken and then
/// gone (deleted in between, e.g. by a sweep on another node).
const LINK_ATTEMPTS: usize = 3;

/// What the content path holds, judged from an opened descriptor: `open(2)`
/// revalidates NFS's caches (close-to-open), a `stat` may answer from a
/// stale attribute cache that a deleted entry still exists.
#[derive(Debug)]
enum Existing {
    /// Nothing openable (or a dangling symlink).
    Absent,
    /// A regular file (or a symlink to one) of the expected size: a
    /// publish may deduplicate onto it.
    Usable,
    /// Something a read could not serve the entry from (wrong size, not a
    /// regular file); why.
    Unusable(String),
}

/// Opens whatever `target` names and checks it is a regular file of
/// `size` bytes (one open and one `fstat`).
fn existing_entry(target: &Path, size: u64) -> std::io::Result<Existing> {
    let file = match File::open(target) {
        Ok(f) => f,
        Err(e) if is_absent(&e) => return Ok(Existing::Absent),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    Ok(if !meta.is_file() {
        Existing::Unusable(format!("not a regular file ({:?})", meta.file_type()))
    } else if meta.len() != size {
        Existing::Unusable(format!("{} bytes, expected {size}", meta.len()))
    } else {
        Existing::Usable
    })
}

/// Writes `outboard` to a fresh (locked) stage file and syncs it (with
/// `fsync` on). A failure leaves only the stage file, which its drop (or
/// the orphan sweep) removes.
fn stage_outboard(inner: &Inner, outboard: &Bytes) -> Result<StageFile> {
    let tmp = create_stage_file(inner)?;
    write_chunks(&tmp, std::slice::from_ref(outboard))?;
    if inner.options.fsync {
        inner
            .seam
            .sync_data(&tmp.file, &tmp.path, "local: publish: fdatasync outboard")
            .map_err(|e| io_err("fsyncing outboard stage", &tmp.path, e))?;
    }
    Ok(tmp)
}

/// Renames a staged outboard to `dest`, the entry's outboard name. The
/// name's durability is the caller's: the fan-out directory fsync of the
/// publish that follows. A rename replaces whatever `dest` held — an
/// outboard is a function of the content, so an existing valid one has the
/// same bytes, and an invalid one is repaired.
fn rename_outboard(inner: &Inner, mut tmp: StageFile, dest: &Path) -> Result<()> {
    inner
        .seam
        .rename(&tmp.path, dest)
        .map_err(|e| io_err("publishing outboard to", dest, e))?;
    tmp.gone = true;
    Ok(())
}

/// [`stage_outboard`] then [`rename_outboard`].
pub(crate) fn place_outboard(inner: &Inner, outboard: &Bytes, dest: &Path) -> Result<()> {
    let tmp = stage_outboard(inner, outboard)?;
    rename_outboard(inner, tmp, dest)
}

/// Makes the stage's bytes durable (with `fsync`) and stages `outboard`
/// beside it, both at once: the entry's bytes and its outboard's are
/// synced together (the outboard's on a second thread), so two fdatasyncs
/// cost about one. Returns the staged outboard file.
fn sync_with_outboard(
    inner: &Inner,
    stage: &StageFile,
    outboard: Option<&Bytes>,
) -> Result<Option<StageFile>> {
    let fsync = inner.options.fsync;
    // The entry's bytes and its outboard's are synced at once (the
    // outboard's on a second thread): two fdatasyncs cost about one.
    let sync_stage = || -> Result<()> {
        if fsync {
            inner
                .seam
                .sync_data(&stage.file, &stage.path, "local: publish: fdatasync stage")
                .map_err(|e| io_err("fsyncing stage file", &stage.path, e))?;
        }
        Ok(())
    };
    match outboard {
        Some(ob) if fsync => std::thread::scope(|s| {
            let ob_thread = s.spawn(|| stage_outboard(inner, ob));
            let synced = sync_stage();
            let staged = ob_thread.join().unwrap_or_else(|_| {
                Err(Error::io(store_types::ErrorKind::Other, "stage outboard")
                    .with_source("the outboard's thread panicked"))
            });
            synced.and(staged.map(Some))
        }),
        Some(ob) => Ok(Some(stage_outboard(inner, ob)?)),
        None => {
            sync_stage()?;
            Ok(None)
        }
    }
}

/// Publishes a fully written stage of `size` bytes under `key` (steps 1–4
/// of the crate docs), with its outboard (step 3a) when given.
fn publish(
    inner: &Inner,
    mut stage: StageFile,
    size: u64,
    key: &Key,
    outboard: Option<Bytes>,
) -> Result<PublishOutcome> {
    let target = inner.content_path(key);
    let outboard_path = crate::outboard_path(&target);
    let fsync = inner.options.fsync;
    let fan_dir = inner.fan_dir(key);
    // The cheap pre-check, before any fsync is spent. An error here is no
    // verdict: the link below and the check after it decide.
    if let Ok(Existing::Usable) = existing_entry(&target, size) {
        // An entry stored before outboards gets this one (ADR-032).
        if let Some(ob) = outboard.filter(|_| !outboard_path.exists()) {
            place_outboard(inner, &ob, &outboard_path)?;
        }
        return already_present(inner, &fan_dir); // `stage` drops: removed.
    }
    let staged_outboard = sync_with_outboard(inner, &stage, outboard.as_ref())?;
    inner
        .seam
        .create_dir_all(&fan_dir)
        .map_err(|e| io_err("creating", &fan_dir, e))?;
    // The outboard's name first, the entry's second, one directory fsync
    // for both (step 4): whatever durable listing a crash leaves that holds
    // the entry holds its outboard too.
    if let Some(tmp) = staged_outboard {
        rename_outboard(inner, tmp, &outboard_path)?;
    }
    let mut attempt = 1;
    loop {
        let e = match inner.seam.hard_link(&stage.path, &target) {
            Ok(()) => break,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => e,
            Err(e) => return Err(io_err("publishing to", &target, e)),
        };
        // The name is taken (the server says so): deduplicate only onto a
        // usable entry.
        let why = match existing_entry(&target, size) {
            Ok(Existing::Usable) => return already_present(inner, &fan_dir),
            Ok(Existing::Absent) if attempt < LINK_ATTEMPTS => {
                attempt += 1;
                continue;
            }
            Ok(Existing::Absent) => format!("{e}, but it names nothing readable"),
            Ok(Existing::Unusable(why)) => why,
            Err(e) => return Err(io_err("checking existing entry", &target, e)),
        };
        return replace_unusable(inner, stage, key, &target, &fan_dir, &why);
    }
    // The entry is visible and complete. Unlinking the stage name is
    // housekeeping: if it fails, the orphan sweep at next open finishes it.
    match inner.seam.remove_file(&stage.path) {
        Ok(()) => stage.gone = true,
        Err(e) => tracing::warn!(path = %stage.path.display(), error = %e,
            "could not unlink a published stage name"),
    }
    if fsync {
        make_durable(inner, &fan_dir)?;
    }
    Ok(PublishOutcome::Inserted)
}

/// Publishes an (already synced) stage over an unusable name at `target` —
/// a truncated file, a dangling symlink — by renaming it into place. The
/// content is the key's, so replacing even a concurrently published copy
/// is harmless. Fails (loudly) where the name cannot be replaced, e.g. a
/// directory.
fn replace_unusable(
    inner: &Inner,
    mut stage: StageFile,
    key: &Key,
    target: &Path,
    fan_dir: &Path,
    why: &str,
) -> Result<PublishOutcome> {
    tracing::warn!(path = %target.display(), why,
        "an unusable file holds the entry's name; replacing it");
    inner.seam.rename(&stage.path, target).map_err(|e| {
        Error::from_io(
            format!("replace the unusable file ({why}) holding the entry's name"),
            e,
        )
        .with_path(target)
    })?;
    stage.gone = true;
    // A descriptor a read cached of the unusable file must not outlive its
    // name (TUNING.md §local-small-reads).
    inner.open_files.invalidate(std::slice::from_ref(key));
    if inner.options.fsync {
        make_durable(inner, fan_dir)?;
    }
    Ok(PublishOutcome::Inserted)
}

/// The outcome of publishing a key that already exists. With `fsync` on,
/// the existing name is made durable first: it may belong to a concurrent
/// publish that has linked (its data is already synced) but not yet
/// fsynced the directory, and `AlreadyPresent` must not promise an entry
/// a crash could still take away.
fn already_present(inner: &Inner, fan_dir: &Path) -> Result<PublishOutcome> {
    if inner.options.fsync {
        make_durable(inner, fan_dir)?;
    }
    Ok(PublishOutcome::AlreadyPresent)
}

/// Makes a new name in `fan_dir` durable, and the chain of directories
/// above it up to the root unless already known durable.
fn make_durable(inner: &Inner, fan_dir: &Path) -> Result<()> {
    fsync_dir(&inner.seam, fan_dir, "local: publish: fsync fan-out dir")?;
    let mut synced = Vec::new();
    let mut dir = fan_dir;
    while dir != inner.root && !inner.is_known_durable(dir) {
        let Some(parent) = dir.parent() else { break };
        fsync_dir(
            &inner.seam,
            parent,
            "local: publish: fsync new dir's parent",
        )?;
        synced.push(dir);
        dir = parent;
    }
    // Only now, so that a failure part-way leaves the chain to be redone.
    for dir in synced {
        inner.mark_durable(dir.to_path_buf());
    }
    Ok(())
}

/// An in-progress put into a [`crate::LocalEngine`].
///
/// [`StagedWrite::write`] queues the chunk and, once [`WRITE_BUFFER`]
/// bytes are queued and no writer call is running, starts one
/// ([`run_writer`]) and returns at once, so the caller hashes chunk
/// *n + 1* while chunk *n* is written. `write` waits only while
/// [`MAX_QUEUED`] bytes are queued, and then in async code. A publish
/// waits for the writer call to end, then writes what is left and
/// publishes in one blocking call.
pub(crate) struct LocalStage {
    inner: Arc<Inner>,
    ns: Namespace,
    shared: Arc<Shared>,
    /// Bytes accepted so far (queued or written).
    written: u64,
    /// The entry's outboard, once the facade has handed it over.
    outboard: Option<Bytes>,
}

/// What a stage shares with its writer call.
struct Shared {
    state: Mutex<QueueState>,
    /// Signalled whenever the writer call takes a batch or ends.
    progress: Notify,
}

struct QueueState {
    /// The stage file, while no writer call holds it.
    file: Option<StageFile>,
    /// Chunks waiting to be written, and their total size.
    queued: Vec<Bytes>,
    queued_len: usize,
    /// Whether a writer call is running (it holds the file).
    running: bool,
    /// The first write error; the file is then already removed.
    failed: Option<Error>,
    /// Set when the stage is dropped or aborted: a running writer call
    /// stops at its next batch and removes the file.
    abandoned: bool,
}

/// What [`LocalStage::enqueue`] did.
enum Queued {
    /// The queue is full; the chunk was left to the caller.
    Full,
    /// The chunk is queued; start a writer call with this file, if given.
    Done(Option<StageFile>),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writer call: writes queued chunks, batch by batch, until the queue
/// is empty (then hands the file back and returns), the stage is
/// abandoned or a write fails (then removes the file).
fn run_writer(shared: Arc<Shared>, stage: StageFile) {
    loop {
        let chunks = {
            let mut st = shared.lock();
            if st.abandoned {
                drop(st);
                drop(stage); // Removes the file, before `running` clears.
                shared.lock().running = false;
                shared.progress.notify_one();
                return;
            }
            if st.queued.is_empty() {
                st.file = Some(stage);
                st.running = false;
                drop(st);
                shared.progress.notify_one();
                return;
            }
            st.queued_len = 0;
            std::mem::take(&mut st.queued)
        };
        shared.progress.notify_one();
        if let Err(e) = write_chunks(&stage, &chunks) {
            drop(stage); // Removes the file.
            let mut st = shared.lock();
            st.failed = Some(e);
            st.running = false;
            drop(st);
            shared.progress.notify_one();
            return;
        }
    }
}

impl LocalStage {
    /// Creates (and locks) the stage file, in one blocking call.
    pub(crate) async fn open(inner: Arc<Inner>, ns: Namespace) -> Result<Self> {
        let creating = inner.clone();
        // A caller that goes away before this returns drops the file on the
        // blocking thread, which removes it.
        let file = blocking(move || create_stage_file(&creating)).await?;
        Ok(LocalStage {
            inner,
            ns,
            shared: Arc::new(Shared {
                state: Mutex::new(QueueState {
                    file: Some(file),
                    queued: Vec::new(),
                    queued_len: 0,
                    running: false,
                    failed: None,
                    abandoned: false,
                }),
                progress: Notify::new(),
            }),
            written: 0,
            outboard: None,
        })
    }

    /// Waits (in async code) until no writer call runs, then takes the file
    /// and what is still queued; the first write error instead, if any.
    async fn settle(&self) -> Result<(Option<StageFile>, Vec<Bytes>)> {
        loop {
            {
                let mut st = self.shared.lock();
                if let Some(e) = &st.failed {
                    return Err(e.clone());
                }
                if !st.running {
                    st.queued_len = 0;
                    return Ok((st.file.take(), std::mem::take(&mut st.queued)));
                }
            }
            self.shared.progress.notified().await;
        }
    }

    /// Queues `chunk` (taking it) unless the queue is full; says whether a
    /// writer call is to be started with the returned file.
    fn enqueue(&self, chunk: &mut Option<Bytes>) -> Result<Queued> {
        let mut st = self.shared.lock();
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let Some(c) = chunk.take().filter(|c| !c.is_empty()) else {
            return Ok(Queued::Done(None));
        };
        if st.queued_len >= MAX_QUEUED {
            *chunk = Some(c);
            return Ok(Queued::Full);
        }
        st.queued_len += c.len();
        st.queued.push(c);
        if st.running || st.queued_len < WRITE_BUFFER {
            return Ok(Queued::Done(None)); // Taken by the running call, or coalescing.
        }
        match st.file.take() {
            Some(file) => {
                st.running = true;
                Ok(Queued::Done(Some(file)))
            }
            None => Err(stage_gone()),
        }
    }

    /// Abandons the stage and waits until its file is removed.
    async fn discard(&self) {
        self.shared.lock().abandoned = true;
        if let Ok((Some(file), _)) = self.settle().await {
            let _ = blocking(move || {
                drop(file);
                Ok(())
            })
            .await;
        }
    }
}

impl Drop for LocalStage {
    /// Removes the file without waiting: a running writer call does so at
    /// its next batch; an idle file is dropped on a blocking thread (or
    /// here, without a runtime).
    fn drop(&mut self) {
        let file = {
            let mut st = self.shared.lock();
            st.abandoned = true;
            st.file.take()
        };
        if let Some(file) = file {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(move || drop(file))),
                Err(_) => drop(file),
            }
        }
    }
}

#[async_trait]
impl StagedWrite for LocalStage {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        let len = chunk.len();
        let mut chunk = Some(chunk);
        loop {
            let start = match self.enqueue(&mut chunk)? {
                Queued::Full => {
                    // A writer call is running (one starts whenever
                    // WRITE_BUFFER bytes are queued): wait for it to take
                    // the queue.
                    self.shared.progress.notified().await;
                    continue;
                }
                Queued::Done(start) => start,
            };
            self.written += len as u64;
            if let Some(file) = start {
                let shared = self.shared.clone();
                drop(tokio::task::spawn_blocking(move || {
                    run_writer(shared, file)
                }));
            }
            return Ok(());
        }
    }

    /// Keeps the outboard for the publish, which writes it beside the entry
    /// (`<digest>.obao`) before the entry's name appears.
    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        self.outboard = Some(outboard);
        Ok(())
    }

    /// Publishes under `key`, whose namespace must be the one the stage
    /// was opened for ([`Error::KeyInvalid`] otherwise; the stage is
    /// discarded).
    async fn publish(mut self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        if key.namespace != self.ns {
            self.discard().await;
            return Err(Error::KeyInvalid(format!(
                "stage opened for namespace {} cannot publish {key}",
                self.ns
            )));
        }
        let (Some(stage), chunks) = self.settle().await? else {
            return Err(stage_gone());
        };
        let (inner, written, key) = (self.inner.clone(), self.written, key.clone());
        let outboard = self.outboard.take();
        // Cancel-safe like the rest: the blocking call runs to its end
        // (published, or the file removed) whoever awaits it.
        blocking(move || {
            write_chunks(&stage, &chunks)?;
            publish(&inner, stage, written, &key, outboard)
        })
        .await
    }

    /// Discards the stage, waiting until its file is removed. Succeeds even
    /// if a write had failed (its file is gone either way).
    async fn abort(self: Box<Self>) -> Result<()> {
        self.discard().await;
        Ok(())
    }
}
