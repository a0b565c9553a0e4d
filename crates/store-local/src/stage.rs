//! Staged writes: a dedicated blocking writer per stage, fed through a
//! bounded channel, that also performs the publish.

use std::fs::{self, File, TryLockError};
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{Error, Key, Namespace, PublishOutcome, Result, StagedWrite};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::fsio::{fsync_dir, io_err, is_absent};
use crate::Inner;

/// Chunks in flight between the caller and the writer. With the facade's
/// 256 KiB chunks that is 1 MiB of buffering per stage: enough to keep the
/// writer busy while the caller hashes, small enough to stay bounded.
const CHANNEL_CHUNKS: usize = 4;

/// Coalescing buffer for callers that send small chunks; chunks at least
/// this large bypass it.
const WRITE_BUFFER: usize = 256 * 1024;

/// How often stage creation retries after losing a name to a concurrent
/// orphan sweep (each retry uses a fresh name).
const CREATE_ATTEMPTS: usize = 8;

/// A message to the writer.
enum Cmd {
    /// Append these bytes.
    Chunk(Bytes),
    /// Make the stage durable and publish it under this key.
    Publish(Key),
}

/// What the writer thread ends with: `Some` after a publish, `None` when
/// the stage was abandoned (its file is then already removed).
type WriterResult = Result<Option<PublishOutcome>>;

/// A stage file owned by its writer. Holds the file's `flock` (released
/// when the file closes) and removes the file on drop unless it was
/// published — so every way a stage can end (abort, drop, writer error,
/// panic) leaves nothing behind.
struct StageFile {
    file: File,
    path: PathBuf,
    /// Set once the stage name has been unlinked by a publish.
    gone: bool,
}

impl Drop for StageFile {
    fn drop(&mut self) {
        if !self.gone {
            if let Err(e) = fs::remove_file(&self.path) {
                if !is_absent(&e) {
                    tracing::warn!(path = %self.path.display(), error = %e,
                        "could not remove stage file; it will be removed at next open");
                }
            }
        }
    }
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
        let file = match File::create_new(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_err("creating stage file", &path, e)),
        };
        let stage = StageFile {
            file,
            path,
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
    Err(Error::Io(format!(
        "could not create a stage file in {}: {}",
        inner.stage_dir.display(),
        last.unwrap_or("name collisions")
    )))
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

/// The writer thread: appends chunks until told to publish or until the
/// channel closes (stage abandoned).
fn run_writer(
    inner: Arc<Inner>,
    ready: oneshot::Sender<Result<()>>,
    mut rx: mpsc::Receiver<Cmd>,
) -> WriterResult {
    let stage = match create_stage_file(&inner) {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e.clone()));
            return Err(e);
        }
    };
    if ready.send(Ok(())).is_err() {
        return Ok(None); // The caller went away before the stage existed.
    }
    let mut out = BufWriter::with_capacity(WRITE_BUFFER, &stage.file);
    let mut written = 0u64;
    while let Some(cmd) = rx.blocking_recv() {
        match cmd {
            Cmd::Chunk(bytes) => {
                out.write_all(&bytes)
                    .map_err(|e| io_err("writing stage file", &stage.path, e))?;
                written += bytes.len() as u64;
            }
            Cmd::Publish(key) => {
                out.flush()
                    .map_err(|e| io_err("writing stage file", &stage.path, e))?;
                drop(out);
                return publish(&inner, stage, written, &key).map(Some);
            }
        }
    }
    Ok(None)
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

/// Publishes a fully written stage of `size` bytes under `key` (steps 1–4
/// of the crate docs).
fn publish(inner: &Inner, mut stage: StageFile, size: u64, key: &Key) -> Result<PublishOutcome> {
    let target = inner.content_path(key);
    let fsync = inner.options.fsync;
    let fan_dir = inner.fan_dir(key);
    // The cheap pre-check, before any fsync is spent. An error here is no
    // verdict: the link below and the check after it decide.
    if let Ok(Existing::Usable) = existing_entry(&target, size) {
        return already_present(inner, &fan_dir); // `stage` drops: removed.
    }
    if fsync {
        stage
            .file
            .sync_data()
            .map_err(|e| io_err("fsyncing stage file", &stage.path, e))?;
    }
    fs::create_dir_all(&fan_dir).map_err(|e| io_err("creating", &fan_dir, e))?;
    let mut attempt = 1;
    loop {
        let e = match fs::hard_link(&stage.path, &target) {
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
        return replace_unusable(inner, stage, &target, &fan_dir, &why);
    }
    // The entry is visible and complete. Unlinking the stage name is
    // housekeeping: if it fails, the orphan sweep at next open finishes it.
    match fs::remove_file(&stage.path) {
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
    target: &Path,
    fan_dir: &Path,
    why: &str,
) -> Result<PublishOutcome> {
    tracing::warn!(path = %target.display(), why,
        "an unusable file holds the entry's name; replacing it");
    fs::rename(&stage.path, target).map_err(|e| {
        Error::Io(format!(
            "the entry's name {} is taken by something unusable ({why}) that could not be \
             replaced: {e}",
            target.display()
        ))
    })?;
    stage.gone = true;
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
    fsync_dir(fan_dir)?;
    let mut synced = Vec::new();
    let mut dir = fan_dir;
    while dir != inner.root && !inner.is_known_durable(dir) {
        let Some(parent) = dir.parent() else { break };
        fsync_dir(parent)?;
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
pub(crate) struct LocalStage {
    ns: Namespace,
    tx: Option<mpsc::Sender<Cmd>>,
    writer: Option<JoinHandle<WriterResult>>,
    /// The writer's error, once seen, returned by every later call.
    failed: Option<Error>,
}

impl LocalStage {
    /// Creates the stage file and starts its writer.
    pub(crate) async fn open(inner: Arc<Inner>, ns: Namespace) -> Result<Self> {
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let (ready_tx, ready_rx) = oneshot::channel();
        let writer = tokio::task::spawn_blocking(move || run_writer(inner, ready_tx, rx));
        match ready_rx.await {
            Ok(Ok(())) => Ok(LocalStage {
                ns,
                tx: Some(tx),
                writer: Some(writer),
                failed: None,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(join_error(writer.await)),
        }
    }

    /// Sends a command; if the writer is gone, returns why.
    async fn send(&mut self, cmd: Cmd) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let sent = match &self.tx {
            Some(tx) => tx.send(cmd).await.is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        self.tx = None;
        let e = match self.writer.take() {
            Some(w) => join_error(w.await),
            None => Error::Io("stage writer already finished".to_string()),
        };
        self.failed = Some(e.clone());
        Err(e)
    }

    /// Closes the channel and waits for the writer's result.
    async fn finish(&mut self) -> WriterResult {
        self.tx = None;
        match self.writer.take() {
            Some(w) => w
                .await
                .map_err(|e| Error::Io(format!("stage writer panicked: {e}")))?,
            None => Err(self
                .failed
                .clone()
                .unwrap_or_else(|| Error::Io("stage writer already finished".to_string()))),
        }
    }
}

/// The error that ended a writer which should still be running.
fn join_error(joined: std::result::Result<WriterResult, tokio::task::JoinError>) -> Error {
    match joined {
        Ok(Err(e)) => e,
        Ok(Ok(_)) => Error::Io("stage writer stopped unexpectedly".to_string()),
        Err(e) => Error::Io(format!("stage writer panicked: {e}")),
    }
}

#[async_trait]
impl StagedWrite for LocalStage {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        if chunk.is_empty() {
            return match &self.failed {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            };
        }
        self.send(Cmd::Chunk(chunk)).await
    }

    /// Publishes under `key`, whose namespace must be the one the stage
    /// was opened for ([`Error::KeyInvalid`] otherwise; the stage is
    /// discarded).
    async fn publish(mut self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        if key.namespace != self.ns {
            return Err(Error::KeyInvalid(format!(
                "stage opened for namespace {} cannot publish {key}",
                self.ns
            )));
        }
        self.send(Cmd::Publish(key.clone())).await?;
        match self.finish().await? {
            Some(outcome) => Ok(outcome),
            None => Err(Error::Io(
                "stage writer ended without publishing".to_string(),
            )),
        }
    }

    /// Discards the stage, waiting until its file is removed. Succeeds even
    /// if the writer had failed (its file is gone either way).
    async fn abort(mut self: Box<Self>) -> Result<()> {
        let _ = self.finish().await;
        Ok(())
    }
}
