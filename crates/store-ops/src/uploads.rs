//! Resumable upload sessions (issue 15, ADR-034): open a session, append
//! chunks at the committed offset, ask for the offset after an interruption,
//! finish with the expected digest — the container registry's protocol.
//!
//! # Spool
//!
//! Each session lives in the node's **upload directory**
//! ([`UploadConfig::dir`]) as three files:
//!
//! ```text
//! <dir>/.node              this node's id (random, made once)
//! <dir>/<id>.meta          namespace, owner, creation time (JSON; written
//!                          once, fsynced and renamed into place: the
//!                          session exists once this name is durable)
//! <dir>/<id>.data          the bytes received so far
//! <dir>/<id>.offset        the committed offset (16 bytes: the offset and
//!                          its complement, so a torn write is detected)
//! ```
//!
//! An append writes the chunk at the committed offset, `fdatasync`s the
//! data, then writes and syncs the offset file; only then does the offset
//! advance and the request get its answer. A crash or a dropped request
//! leaves bytes beyond the committed offset, which the next append (and a
//! restart) truncate away: the committed offset only ever names synced
//! bytes. A request whose body breaks part-way commits the bytes it did
//! receive (they are the upload's next bytes), then answers
//! `incomplete_body`: a client resumes from the offset `HEAD` reports.
//!
//! # Hashing
//!
//! Each session keeps a BLAKE3 hasher over its committed bytes, updated on
//! the blocking pool as each chunk is written and stored back only when
//! the offset commits (a dropped or failed append leaves it at the
//! committed bytes). A finish whose digest does not match answers
//! `verification` (HTTP 422) from that state at once, without reading the
//! spool file again (issue 30: a client retrying a wrong digest used to
//! cost a full re-read per request). A matching finish streams the spool
//! file once through the store's ordinary put (which hashes again, builds
//! the outboard and publishes). The hasher is not persisted: after a
//! restart a session's first finish reads its bytes once to rebuild it.
//!
//! # Limits and expiry
//!
//! Sessions count against caps of their own, total and per owner
//! ([`UploadConfig::max_sessions`], [`UploadConfig::max_sessions_per_owner`]):
//! at a cap, opening one is refused (`too_many_uploads`, HTTP 503 with a
//! retry delay); no session is ever dropped to make room. The bytes they
//! hold are capped too, in all and per owner ([`UploadConfig::max_bytes`],
//! [`UploadConfig::max_bytes_per_owner`]): an append is reserved buffer by
//! buffer before it is written, and one that would pass a cap commits what
//! it wrote before and fails with `upload_quota` (HTTP 507). A session to
//! which no bytes were committed for [`UploadConfig::idle_timeout`] is
//! reaped with its files (status probes, empty chunks and failed finishes
//! do not keep it alive: a client cannot hold a session open for free). One request
//! at a time per session: a second concurrent one gets `upload_busy`.
//!
//! # Fleet
//!
//! Sessions are per node. A session id starts with the id of the node that
//! opened it; another node answers `upload_elsewhere` (HTTP 409) naming it,
//! rather than `missing`. Two nodes must not share one upload directory.
//!
//! # How a resumable upload flows
//!
//! ```text
//! POST /v1/uploads/{ns} (Content-Type: application/json) → Ops::uploads().open:
//!   caps (total, per owner) →
//!   <dir>/<id>.{data,offset} created, .meta fsynced + renamed
//! PATCH {location} (Content-Range a-…) → Ops::uploads().append: claim the session
//!   (upload_busy if another request holds it) → a == committed offset? (416)
//!   → truncate data to the offset (drops a dead request's tail) → per
//!   APPEND_CHUNK buffer: reserve its bytes (upload_max_bytes*, 507
//!   upload_quota) → write at the offset + extend a copy of the session's
//!   BLAKE3 (blocking pool) → fdatasync data → write + sync the offset file
//!   → offset, hasher and reservation commit together, idle deadline
//!   renewed → 204 Upload-Offset (a broken body commits what arrived)
//! HEAD {location} → the committed offset (does not keep the session alive)
//! PUT {location}?digest=d → Ops::uploads().finish: append the last chunk → the
//!   session's BLAKE3 ≠ d? → 422 at once (no spool read; after a restart the
//!   hash is rebuilt once) → Store::put(spool file, len = offset, expect = d)
//!   — the ordinary put: hash + outboard + publish, or Verification (422,
//!   nothing published, session kept) → mint the token → remove the
//!   session's files
//! reaper (every ¼ idle timeout): idle sessions not held by a request → files
//!   removed (finish, abort and reaping alike: files first, then the session
//!   answers `missing`, in one blocking call holding its claim); startup:
//!   sessions reloaded, data cut back to the committed offset
//! ```
//!
//! The names: [`crate::UploadOps::open`], [`crate::UploadOps::append`],
//! [`crate::UploadOps::finish`], `APPEND_CHUNK`, [`UploadConfig::dir`].

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind as IoKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use store_core::{Digest, Error, Namespace};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::OwnedMutexGuard;

use crate::error::{ErrorCode, OpsError};

/// Default [`UploadConfig::idle_timeout`]: one hour.
pub const DEFAULT_UPLOAD_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default [`UploadConfig::max_sessions`].
pub const DEFAULT_MAX_UPLOADS: usize = 256;
/// Default [`UploadConfig::max_sessions_per_owner`].
pub const DEFAULT_MAX_UPLOADS_PER_OWNER: usize = 16;
/// Default [`UploadConfig::max_bytes`]: 128 GiB held by all sessions.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 128 << 30;
/// Default [`UploadConfig::max_bytes_per_owner`]: 32 GiB per identity.
pub const DEFAULT_MAX_UPLOAD_BYTES_PER_OWNER: u64 = 32 << 30;
/// How long a client refused at an upload cap is asked to wait.
pub const UPLOAD_CAP_RETRY_AFTER: Duration = Duration::from_secs(5);

/// Bytes read from a request body per write.
const APPEND_CHUNK: usize = 1 << 20;

/// Where and how resumable upload sessions are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadConfig {
    /// The node's upload directory (created if missing). Sessions survive
    /// a restart as long as this directory does.
    pub dir: PathBuf,
    /// A session with no request for this long is reaped. Default
    /// [`DEFAULT_UPLOAD_IDLE_TIMEOUT`]; zero is refused.
    pub idle_timeout: Duration,
    /// Most open sessions. Default [`DEFAULT_MAX_UPLOADS`]; zero is refused.
    pub max_sessions: usize,
    /// Most open sessions of one owner (identity). Default
    /// [`DEFAULT_MAX_UPLOADS_PER_OWNER`]; zero is refused.
    pub max_sessions_per_owner: usize,
    /// Most bytes all open sessions may hold (committed and being
    /// written). Default [`DEFAULT_MAX_UPLOAD_BYTES`]; zero is refused.
    pub max_bytes: u64,
    /// Most bytes one owner's open sessions may hold. Default
    /// [`DEFAULT_MAX_UPLOAD_BYTES_PER_OWNER`]; zero is refused.
    pub max_bytes_per_owner: u64,
    /// Whether acknowledged chunks are fsynced. Default `true`; `false`
    /// lets a machine crash lose acknowledged chunks (a restart then
    /// reports the smaller offset, or drops the session).
    pub fsync: bool,
}

impl UploadConfig {
    /// The defaults, spooling in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        UploadConfig {
            dir: dir.into(),
            idle_timeout: DEFAULT_UPLOAD_IDLE_TIMEOUT,
            max_sessions: DEFAULT_MAX_UPLOADS,
            max_sessions_per_owner: DEFAULT_MAX_UPLOADS_PER_OWNER,
            max_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_bytes_per_owner: DEFAULT_MAX_UPLOAD_BYTES_PER_OWNER,
            fsync: true,
        }
    }
}

/// Where a session stands: the answer to open, append and status.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UploadStatus {
    /// The session id (starts with the id of the node holding it).
    pub id: String,
    /// The namespace the upload will be stored in.
    pub namespace: String,
    /// Bytes committed so far: the next append must start here.
    pub offset: u64,
    /// The session's URL path.
    pub location: String,
}

/// What the session's metadata file holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    namespace: String,
    owner: String,
    /// Unix milliseconds.
    created_at: i64,
}

/// One open session.
pub(crate) struct Session {
    pub(crate) id: String,
    pub(crate) ns: Namespace,
    pub(crate) owner: String,
    /// The committed offset.
    offset: AtomicU64,
    last_active: Mutex<Instant>,
    /// Held by the one request working on the session (and by its blocking
    /// writes, so a dropped request's last write ends before the next
    /// request truncates).
    io: Arc<tokio::sync::Mutex<()>>,
    /// Set once finished, aborted or reaped.
    gone: AtomicBool,
    /// BLAKE3 over the committed bytes; `None` after a restart until the
    /// first finish rebuilds it (see the module docs).
    hasher: Mutex<Option<blake3::Hasher>>,
}

impl Session {
    pub(crate) fn offset(&self) -> u64 {
        self.offset.load(Ordering::SeqCst)
    }

    fn touch(&self) {
        *lock(&self.last_active) = Instant::now();
    }

    pub(crate) fn status(&self) -> UploadStatus {
        UploadStatus {
            id: self.id.clone(),
            namespace: self.ns.to_string(),
            offset: self.offset(),
            location: format!("/v1/uploads/{}/{}", self.ns, self.id),
        }
    }
}

/// Whether `id` has the shape of a session id (`<node>-<32 hex>`:
/// lowercase hex digits and dashes, at most 64 characters), checked before
/// an id from a request reaches an answer or a log line.
pub fn is_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b) || b == b'-')
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The node's upload sessions.
pub(crate) struct Uploads {
    cfg: UploadConfig,
    node: String,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// See [`Uploads::spool_reads`].
    spool_reads: AtomicU64,
    /// Bytes held by open sessions (committed, plus reserved by appends
    /// in flight), in all and per owner. Shared with the reservations of
    /// appends in flight (see [`Reservation`]).
    usage: Arc<Mutex<Usage>>,
    /// Test hook: the commit step sets the flag, then waits on the lock
    /// (held by a test to drop the request inside the step).
    #[cfg(test)]
    commit_pause: Arc<(std::sync::Mutex<()>, AtomicBool)>,
}

/// See [`Uploads::usage`].
#[derive(Default)]
struct Usage {
    total: u64,
    per_owner: HashMap<String, u64>,
}

impl Usage {
    fn add(&mut self, owner: &str, n: u64) {
        self.total += n;
        *self.per_owner.entry(owner.to_string()).or_insert(0) += n;
    }

    fn sub(&mut self, owner: &str, n: u64) {
        self.total = self.total.saturating_sub(n);
        if let Some(o) = self.per_owner.get_mut(owner) {
            *o = o.saturating_sub(n);
            if *o == 0 {
                self.per_owner.remove(owner);
            }
        }
    }
}

/// Bytes an append reserved. Dropping it gives them back, so it is
/// dropped only where the bytes it covers are known not committed: by the
/// append itself before its commit step starts, or inside the step's
/// blocking call when the step fails before the in-memory offset moves.
/// The commit step owns it (it is moved into the blocking call, which runs
/// to its end even if the request is dropped) and hands the bytes to the
/// session with [`Reservation::keep`] in the same call that advances the
/// offset (issue 39: the append used to keep it in its own frame, so a
/// request dropped during the step gave back bytes the step then
/// committed, and the spool could grow past the caps).
struct Reservation {
    usage: Arc<Mutex<Usage>>,
    owner: String,
    /// The caps: all sessions, one owner.
    max_bytes: u64,
    max_bytes_per_owner: u64,
    bytes: u64,
}

impl Reservation {
    fn new(uploads: &Uploads, owner: &str) -> Self {
        Reservation {
            usage: uploads.usage.clone(),
            owner: owner.to_string(),
            max_bytes: uploads.cfg.max_bytes,
            max_bytes_per_owner: uploads.cfg.max_bytes_per_owner,
            bytes: 0,
        }
    }

    /// Reserves `n` more bytes, or `upload_quota` (nothing reserved).
    fn grow(&mut self, n: u64) -> Result<(), OpsError> {
        let mut u = lock(&self.usage);
        let owned = u.per_owner.get(&self.owner).copied().unwrap_or(0);
        let over = if u.total + n > self.max_bytes {
            Some(format!(
                "the server's upload sessions hold {} of {} bytes",
                u.total, self.max_bytes
            ))
        } else if owned + n > self.max_bytes_per_owner {
            Some(format!(
                "the upload sessions of {} hold {owned} of {} bytes",
                self.owner, self.max_bytes_per_owner
            ))
        } else {
            None
        };
        if let Some(why) = over {
            return Err(OpsError::new(
                ErrorCode::UploadQuota,
                format!("{why}: finish or abort a session (nothing is dropped to make room)"),
            ));
        }
        u.add(&self.owner, n);
        self.bytes += n;
        Ok(())
    }

    /// The bytes are committed: the session holds them from now on (they
    /// leave the count when it ends, with its offset).
    fn keep(mut self) {
        self.bytes = 0;
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes > 0 {
            lock(&self.usage).sub(&self.owner, self.bytes);
        }
    }
}

impl std::fmt::Debug for Uploads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Uploads")
            .field("dir", &self.cfg.dir)
            .field("node", &self.node)
            .field("sessions", &lock(&self.sessions).len())
            .finish()
    }
}

/// The session lock a request holds, shared with its blocking writes.
pub(crate) type SessionGuard = Arc<OwnedMutexGuard<()>>;

fn io_failure(op: &str, path: &Path, e: io::Error) -> OpsError {
    OpsError::from(Error::from_io(format!("uploads: {op}"), e).with_path(path))
}

/// `io_failure` for `map_err`.
fn fail<'a>(op: &'static str, p: &'a Path) -> impl FnOnce(io::Error) -> OpsError + 'a {
    move |e| io_failure(op, p, e)
}

fn join_failure(e: tokio::task::JoinError) -> OpsError {
    OpsError::new(ErrorCode::Internal, format!("uploads: blocking task: {e}"))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OpsError> + Send + 'static,
) -> Result<T, OpsError> {
    tokio::task::spawn_blocking(f).await.map_err(join_failure)?
}

/// `upload_offset` unless a chunk's `start` (when given) is the
/// session's `committed` offset.
fn check_start(session: &Session, start: Option<u64>, committed: u64) -> Result<(), OpsError> {
    match start {
        Some(start) if start != committed => Err(OpsError {
            size: Some(committed),
            ..OpsError::new(
                ErrorCode::UploadOffset,
                format!(
                    "the chunk starts at {start}, but upload session {} has {committed} \
                     bytes committed: resume at {committed}",
                    session.id
                ),
            )
        }),
        _ => Ok(()),
    }
}

/// Opens a session's data file for an append and cuts it back to the
/// `committed` offset (dropping whatever a dropped request wrote past it).
async fn open_data(
    path: &Path,
    guard: &SessionGuard,
    committed: u64,
) -> Result<Arc<File>, OpsError> {
    let p = path.to_path_buf();
    let g = guard.clone();
    blocking(move || {
        let _g = g;
        let f = OpenOptions::new()
            .write(true)
            .open(&p)
            .map_err(|e| io_failure("open data file", &p, e))?;
        // Drop whatever a dropped request wrote past the offset.
        f.set_len(committed)
            .map_err(|e| io_failure("truncate data file", &p, e))?;
        Ok(Arc::new(f))
    })
    .await
}

/// Fills one buffer of up to [`APPEND_CHUNK`] bytes from `body`: the
/// bytes, whether the body ended (or broke), and the error it broke with.
async fn read_chunk<R: AsyncRead + Unpin>(body: &mut R) -> (BytesMut, bool, Option<io::Error>) {
    let mut buf = BytesMut::with_capacity(APPEND_CHUNK);
    // Fill one buffer: full, end of body, or a broken body.
    let (eof, broken) = loop {
        match body.read_buf(&mut buf).await {
            Ok(0) => break (true, None),
            Ok(_) if buf.len() >= APPEND_CHUNK => break (false, None),
            Ok(_) => continue,
            Err(e) => break (true, Some(e)),
        }
    };
    (buf, eof, broken)
}

/// Writes `chunk` at `at` in the data file (not yet committed) and extends
/// the running hash with it.
async fn write_chunk(
    file: &Arc<File>,
    guard: &SessionGuard,
    path: &Path,
    at: u64,
    chunk: Bytes,
    mut hasher: Option<blake3::Hasher>,
) -> Result<Option<blake3::Hasher>, OpsError> {
    let (f, g, p) = (file.clone(), guard.clone(), path.to_path_buf());
    blocking(move || {
        let _g = g;
        f.write_all_at(&chunk, at)
            .map_err(|e| io_failure("write data file", &p, e))?;
        if let Some(h) = hasher.as_mut() {
            h.update(&chunk);
        }
        Ok(hasher)
    })
    .await
}

/// Fsyncs a directory (its names).
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The offset file's 16 bytes.
fn encode_offset(offset: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&offset.to_le_bytes());
    b[8..].copy_from_slice(&(!offset).to_le_bytes());
    b
}

fn decode_offset(b: &[u8]) -> Option<u64> {
    let (a, c) = (b.get(..8)?, b.get(8..16)?);
    let a = u64::from_le_bytes(a.try_into().ok()?);
    let c = u64::from_le_bytes(c.try_into().ok()?);
    (a == !c).then_some(a)
}

impl Uploads {
    /// Opens (creating) the upload directory and loads the sessions a
    /// previous run left: each one's data is cut back to its committed
    /// offset; leftovers of sessions never fully opened, or damaged, are
    /// removed (logged). Blocking: called once, at startup.
    pub(crate) fn open(cfg: UploadConfig) -> Result<Self, Error> {
        if cfg.idle_timeout.is_zero()
            || cfg.max_sessions == 0
            || cfg.max_sessions_per_owner == 0
            || cfg.max_bytes == 0
            || cfg.max_bytes_per_owner == 0
        {
            return Err(Error::Config(
                "uploads: idle_timeout, max_sessions, max_sessions_per_owner, max_bytes and \
                 max_bytes_per_owner must be greater than zero"
                    .into(),
            ));
        }
        let dir = &cfg.dir;
        fs::create_dir_all(dir)
            .map_err(|e| Error::from_io("uploads: create directory", e).with_path(dir))?;
        let node_file = dir.join(".node");
        let node = match fs::read_to_string(&node_file) {
            Ok(s) if !s.trim().is_empty() => s.trim().to_string(),
            Ok(_) | Err(_) => {
                let node = format!("{:08x}", rand::random::<u32>());
                let tmp = dir.join(".node.tmp");
                let write = || -> io::Result<()> {
                    let mut f = File::create(&tmp)?;
                    f.write_all(node.as_bytes())?;
                    f.sync_all()?;
                    fs::rename(&tmp, &node_file)?;
                    sync_dir(dir)
                };
                write().map_err(|e| {
                    Error::from_io("uploads: write node id", e).with_path(&node_file)
                })?;
                node
            }
        };
        let uploads = Uploads {
            cfg,
            node,
            sessions: Mutex::new(HashMap::new()),
            spool_reads: AtomicU64::new(0),
            usage: Arc::new(Mutex::new(Usage::default())),
            #[cfg(test)]
            commit_pause: Default::default(),
        };
        uploads.load()?;
        Ok(uploads)
    }

    fn path(&self, id: &str, ext: &str) -> PathBuf {
        self.cfg.dir.join(format!("{id}.{ext}"))
    }

    /// Loads every complete session; removes the rest.
    fn load(&self) -> Result<(), Error> {
        let dir = &self.cfg.dir;
        let listing =
            fs::read_dir(dir).map_err(|e| Error::from_io("uploads: list", e).with_path(dir))?;
        let mut ids = std::collections::BTreeSet::new();
        let mut leftovers = Vec::new();
        for entry in listing.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            match name.rsplit_once('.') {
                Some((id, "meta")) => {
                    ids.insert(id.to_string());
                }
                Some((id, "data" | "offset" | "tmp")) => leftovers.push((id.to_string(), name)),
                _ => {}
            }
        }
        let mut loaded = 0;
        for id in &ids {
            match self.load_one(id) {
                Ok(session) => {
                    loaded += 1;
                    lock(&self.usage).add(&session.owner, session.offset());
                    lock(&self.sessions).insert(id.clone(), Arc::new(session));
                }
                Err(why) => {
                    tracing::warn!(session = %id, "dropping a damaged upload session: {why}");
                    self.remove_files(id);
                }
            }
        }
        for (id, name) in leftovers {
            if !lock(&self.sessions).contains_key(&id) {
                let _ = fs::remove_file(dir.join(name));
            }
        }
        if loaded > 0 {
            tracing::info!(sessions = loaded, dir = %dir.display(), "resumed upload sessions");
        }
        Ok(())
    }

    fn load_one(&self, id: &str) -> Result<Session, Damaged> {
        let meta: Meta =
            serde_json::from_slice(&fs::read(self.path(id, "meta")).map_err(Damaged::MetaFile)?)
                .map_err(Damaged::MetaJson)?;
        let ns = Namespace::new(&meta.namespace).map_err(Damaged::Namespace)?;
        let offset =
            decode_offset(&fs::read(self.path(id, "offset")).map_err(Damaged::OffsetFile)?)
                .ok_or(Damaged::TornOffset)?;
        let data = OpenOptions::new()
            .write(true)
            .open(self.path(id, "data"))
            .map_err(Damaged::DataFile)?;
        let len = data.metadata().map_err(Damaged::DataFile)?.len();
        if len < offset {
            return Err(Damaged::Short { len, offset });
        }
        // Bytes past the committed offset were never acknowledged.
        data.set_len(offset).map_err(Damaged::DataFile)?;
        Ok(Session {
            id: id.to_string(),
            ns,
            owner: meta.owner,
            offset: AtomicU64::new(offset),
            last_active: Mutex::new(Instant::now()),
            io: Arc::new(tokio::sync::Mutex::new(())),
            gone: AtomicBool::new(false),
            hasher: Mutex::new(None),
        })
    }

    fn remove_files(&self, id: &str) {
        // The metadata first: without it, the rest is a leftover.
        for ext in ["meta", "data", "offset", "meta.tmp"] {
            match fs::remove_file(self.path(id, ext)) {
                Ok(()) => {}
                Err(e) if e.kind() == IoKind::NotFound => {}
                Err(e) => tracing::warn!(session = %id, "cannot remove upload file: {e}"),
            }
        }
    }

    /// Number of open sessions.
    pub(crate) fn len(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// Opens a session for `owner` in `ns`. Cancel-safe: the session
    /// exists once its metadata name is durable; a dropped call leaves at
    /// most files a restart removes (or a session that is reaped idle).
    pub(crate) async fn create(
        self: &Arc<Self>,
        owner: &str,
        ns: Namespace,
    ) -> Result<UploadStatus, OpsError> {
        let id = format!(
            "{}-{:016x}{:016x}",
            self.node,
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        let session = Arc::new(Session {
            id: id.clone(),
            ns: ns.clone(),
            owner: owner.to_string(),
            offset: AtomicU64::new(0),
            last_active: Mutex::new(Instant::now()),
            io: Arc::new(tokio::sync::Mutex::new(())),
            gone: AtomicBool::new(false),
            hasher: Mutex::new(Some(blake3::Hasher::new())),
        });
        {
            // Reserve under the lock, so two opens cannot both pass a cap.
            let mut sessions = lock(&self.sessions);
            let owned = sessions.values().filter(|s| s.owner == owner).count();
            let cap = if sessions.len() >= self.cfg.max_sessions {
                Some(format!(
                    "the server's {} upload sessions",
                    self.cfg.max_sessions
                ))
            } else if owned >= self.cfg.max_sessions_per_owner {
                Some(format!(
                    "{} upload sessions of {owner}",
                    self.cfg.max_sessions_per_owner
                ))
            } else {
                None
            };
            if let Some(cap) = cap {
                return Err(OpsError {
                    retry_after: Some(UPLOAD_CAP_RETRY_AFTER),
                    ..OpsError::new(
                        ErrorCode::TooManyUploads,
                        format!(
                            "{cap} are open; finish or abort one (idle sessions expire after \
                             {}s)",
                            self.cfg.idle_timeout.as_secs()
                        ),
                    )
                });
            }
            sessions.insert(id.clone(), session.clone());
        }
        let this = self.clone();
        let meta = Meta {
            namespace: ns.to_string(),
            owner: owner.to_string(),
            created_at: store_core::Timestamp::now().0,
        };
        let made = blocking(move || this.create_files(&id, &meta)).await;
        if let Err(e) = made {
            lock(&self.sessions).remove(&session.id);
            self.remove_files(&session.id);
            return Err(e);
        }
        Ok(session.status())
    }

    fn create_files(&self, id: &str, meta: &Meta) -> Result<(), OpsError> {
        let data = self.path(id, "data");
        File::create_new(&data).map_err(fail("create data file", &data))?;
        let offset = self.path(id, "offset");
        let mut f = File::create_new(&offset).map_err(fail("create offset file", &offset))?;
        f.write_all(&encode_offset(0))
            .and_then(|()| f.sync_all())
            .map_err(fail("write offset file", &offset))?;
        let tmp = self.path(id, "meta.tmp");
        let bytes = serde_json::to_vec(meta)
            .map_err(|e| OpsError::new(ErrorCode::Internal, e.to_string()))?;
        let mut f = File::create(&tmp).map_err(fail("create metadata", &tmp))?;
        f.write_all(&bytes)
            .and_then(|()| f.sync_all())
            .map_err(fail("write metadata", &tmp))?;
        let dest = self.path(id, "meta");
        fs::rename(&tmp, &dest).map_err(fail("publish metadata", &dest))?;
        sync_dir(&self.cfg.dir).map_err(fail("fsync", &self.cfg.dir))
    }

    /// The session `id` of `ns`, if `who` may use it (its owner, or an
    /// admin: `admin` says which).
    pub(crate) fn find(
        &self,
        ns: &str,
        id: &str,
        who: &str,
        admin: bool,
    ) -> Result<Arc<Session>, OpsError> {
        let found = lock(&self.sessions).get(id).cloned();
        let Some(session) = found.filter(|s| s.ns.as_str() == ns && !s.gone.load(Ordering::SeqCst))
        else {
            if let Some((node, _)) = id.split_once('-') {
                if node != self.node && !node.is_empty() {
                    return Err(OpsError::new(
                        ErrorCode::UploadElsewhere,
                        format!(
                            "upload session {id} was opened on node {node}, this is node {}: \
                             sessions live on the node that opened them; continue it there, \
                             or open a new one",
                            self.node
                        ),
                    ));
                }
            }
            return Err(OpsError::new(
                ErrorCode::Missing,
                format!("no upload session {id} in {ns} (finished, aborted or expired)"),
            ));
        };
        if session.owner != who && !admin {
            return Err(OpsError::new(
                ErrorCode::Forbidden,
                format!("upload session {id} belongs to another identity"),
            ));
        }
        Ok(session)
    }

    /// Takes the session for one request (`upload_busy` if another holds it).
    pub(crate) fn claim(&self, session: &Session) -> Result<SessionGuard, OpsError> {
        let guard = session.io.clone().try_lock_owned().map_err(|_| {
            OpsError::new(
                ErrorCode::UploadBusy,
                format!(
                    "upload session {} is busy with another request; retry when it ends",
                    session.id
                ),
            )
        })?;
        if session.gone.load(Ordering::SeqCst) {
            return Err(OpsError::new(
                ErrorCode::Missing,
                format!(
                    "no upload session {} (finished, aborted or expired)",
                    session.id
                ),
            ));
        }
        // Only bytes committed keep a session alive (append touches it):
        // neither a status probe nor an empty chunk does.
        Ok(Arc::new(guard))
    }

    /// Appends `body` at `start` (the committed offset; `None`: wherever it
    /// is), committing what arrives, and returns the new offset. At most
    /// `limit` bytes in all (`too_large` beyond; nothing past it is
    /// committed). A body that breaks commits what arrived, then fails with
    /// `incomplete_body`.
    ///
    /// Cancel-safe: the offset advances only after the bytes are synced;
    /// a call dropped before its commit step commits nothing of what it
    /// was writing, one dropped during it commits it whole (offset file,
    /// in-memory offset, hash and byte reservation in one blocking call).
    pub(crate) async fn append<R: AsyncRead + Unpin + Send>(
        &self,
        session: &Arc<Session>,
        guard: &SessionGuard,
        start: Option<u64>,
        mut body: R,
        limit: u64,
    ) -> Result<u64, OpsError> {
        let committed = session.offset();
        check_start(session, start, committed)?;
        let data_path = self.path(&session.id, "data");
        let file = open_data(&data_path, guard, committed).await?;
        let mut offset = committed;
        let mut failure = None;
        // The committed bytes' hash, extended chunk by chunk and stored
        // back only with the offset.
        let mut hasher = lock(&session.hasher).clone();
        // Given back if this append ends (or is dropped) before its commit
        // step takes it over.
        let mut reserved = Reservation::new(self, &session.owner);
        loop {
            let (buf, eof, broken) = read_chunk(&mut body).await;
            let end = offset + buf.len() as u64;
            if end > limit {
                failure = Some(OpsError::from(Error::TooLarge { limit, got: end }));
                break;
            }
            if let Err(e) = reserved.grow(buf.len() as u64) {
                failure = Some(e);
                break;
            }
            if !buf.is_empty() {
                let chunk = buf.freeze();
                hasher =
                    write_chunk(&file, guard, &data_path, offset, chunk, hasher.take()).await?;
                offset = end;
            }
            if let Some(e) = broken {
                failure = Some(OpsError::new(
                    ErrorCode::IncompleteBody,
                    format!("the chunk's body broke off: {e}"),
                ));
                break;
            }
            if eof {
                break;
            }
        }
        if offset > committed {
            self.commit(session, guard, &file, offset, hasher, reserved)
                .await?;
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(offset),
        }
    }

    /// Commits the bytes written up to `offset`: fsyncs the data (when
    /// configured), writes the offset file, and advances the in-memory
    /// offset and hash, handing the append's reservation (`reserved`) to
    /// the session.
    ///
    /// Cancel-safe: all of it happens in one blocking call, which owns the
    /// reservation and runs to its end even if this future is dropped; the
    /// reservation is given back only if the step fails before the offset
    /// moves (or never starts).
    async fn commit(
        &self,
        session: &Arc<Session>,
        guard: &SessionGuard,
        file: &Arc<File>,
        offset: u64,
        hasher: Option<blake3::Hasher>,
        reserved: Reservation,
    ) -> Result<(), OpsError> {
        let (f, g, s) = (file.clone(), guard.clone(), session.clone());
        let (offset_path, fsync) = (self.path(&session.id, "offset"), self.cfg.fsync);
        #[cfg(test)]
        let pause = self.commit_pause.clone();
        // The in-memory offset, hash and reservation advance in the
        // same blocking call as the offset file: it runs to its end even
        // if this request is dropped, so memory never falls behind the
        // file (the next append would cut the data back below the
        // offset on disk, and a restart would drop the session).
        blocking(move || {
            let _g = g;
            #[cfg(test)]
            {
                pause.1.store(true, Ordering::SeqCst);
                drop(lock(&pause.0));
            }
            if fsync {
                f.sync_data()
                    .map_err(|e| io_failure("fsync data file", &offset_path, e))?;
            }
            let of = OpenOptions::new()
                .write(true)
                .open(&offset_path)
                .map_err(|e| io_failure("open offset file", &offset_path, e))?;
            of.write_all_at(&encode_offset(offset), 0)
                .map_err(|e| io_failure("write offset file", &offset_path, e))?;
            if fsync {
                of.sync_data()
                    .map_err(|e| io_failure("fsync offset file", &offset_path, e))?;
            }
            *lock(&s.hasher) = hasher;
            s.offset.store(offset, Ordering::SeqCst);
            reserved.keep();
            s.touch();
            Ok(())
        })
        .await
    }

    /// The digest of the session's committed bytes, from its hasher; after
    /// a restart the first call reads the bytes once to rebuild it. The
    /// caller holds the session's claim `guard`.
    ///
    /// Cancel-safe: it only reads; a rebuilt hasher is stored whole or not.
    pub(crate) async fn digest(
        &self,
        session: &Arc<Session>,
        guard: &SessionGuard,
    ) -> Result<Digest, OpsError> {
        if let Some(h) = lock(&session.hasher).as_ref() {
            return Ok(Digest::from_bytes(*h.finalize().as_bytes()));
        }
        self.spool_reads.fetch_add(1, Ordering::Relaxed);
        let (p, s, g) = (
            self.path(&session.id, "data"),
            session.clone(),
            guard.clone(),
        );
        blocking(move || {
            let _g = g;
            let f = File::open(&p).map_err(|e| io_failure("open data file", &p, e))?;
            let mut h = blake3::Hasher::new();
            io::copy(&mut io::Read::take(f, s.offset()), &mut h)
                .map_err(|e| io_failure("read data file", &p, e))?;
            let d = Digest::from_bytes(*h.finalize().as_bytes());
            *lock(&s.hasher) = Some(h);
            Ok(d)
        })
        .await
    }

    /// How many times a session's spool file was read whole (a matching
    /// finish's put, or a hasher rebuilt after a restart): what a client
    /// retrying wrong digests must not drive up.
    pub(crate) fn spool_reads(&self) -> u64 {
        self.spool_reads.load(Ordering::Relaxed)
    }

    /// The session's data, for the finishing put: the first `offset` bytes.
    pub(crate) async fn reader(
        &self,
        session: &Session,
    ) -> Result<tokio::io::Take<tokio::fs::File>, OpsError> {
        self.spool_reads.fetch_add(1, Ordering::Relaxed);
        let p = self.path(&session.id, "data");
        let f = tokio::fs::File::open(&p)
            .await
            .map_err(|e| io_failure("open data file", &p, e))?;
        Ok(f.take(session.offset()))
    }

    /// Ends the session and removes its files (finish, abort, reaping) in
    /// one call on the blocking pool that holds the caller's claim `guard`
    /// to its end: the files go first, then the session stops answering
    /// (every lookup is `missing` from then on, never while a file is left)
    /// and leaves the table, and only then can a request waiting for the
    /// session claim it — and find it gone. Cancel-safe: once started, the
    /// removal runs to its end even if this future is dropped.
    pub(crate) async fn remove(
        self: &Arc<Self>,
        session: &Arc<Session>,
        guard: &SessionGuard,
    ) -> Result<(), OpsError> {
        let (this, session, guard) = (self.clone(), session.clone(), guard.clone());
        blocking(move || {
            this.remove_files(&session.id);
            session.gone.store(true, Ordering::SeqCst);
            if lock(&this.sessions).remove(&session.id).is_some() {
                lock(&this.usage).sub(&session.owner, session.offset());
            }
            drop(guard);
            Ok(())
        })
        .await
    }

    /// Reaps sessions idle longer than the idle timeout (skipping any a
    /// request holds); returns how many.
    pub(crate) async fn reap(self: &Arc<Self>) -> usize {
        let idle = self.cfg.idle_timeout;
        let expired: Vec<Arc<Session>> = lock(&self.sessions)
            .values()
            .filter(|s| lock(&s.last_active).elapsed() >= idle)
            .cloned()
            .collect();
        let mut n = 0;
        for s in expired {
            let Ok(guard) = s.io.clone().try_lock_owned() else {
                continue;
            };
            if self.remove(&s, &Arc::new(guard)).await.is_ok() {
                n += 1;
                tracing::info!(session = %s.id, "reaped an idle upload session");
            }
        }
        n
    }

    /// The reaping period: a quarter of the idle timeout, 50 ms to 60 s.
    pub(crate) fn reap_every(&self) -> Duration {
        (self.cfg.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(60))
    }
}

/// Why a spooled upload session cannot be resumed (it is dropped, with a
/// warning naming this).
#[derive(Debug, thiserror::Error)]
enum Damaged {
    #[error("metadata: {0}")]
    MetaFile(std::io::Error),
    #[error("metadata: {0}")]
    MetaJson(serde_json::Error),
    #[error("namespace: {0}")]
    Namespace(store_types::Error),
    #[error("offset file: {0}")]
    OffsetFile(std::io::Error),
    #[error("the offset file is torn")]
    TornOffset,
    #[error("data file: {0}")]
    DataFile(std::io::Error),
    #[error("{len} bytes of data, {offset} committed")]
    Short { len: u64, offset: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An append dropped inside its commit step: afterwards the offset in
    /// memory is the one on disk, a later append keeps the data file at
    /// least that long, and a reopen keeps the session with every committed
    /// byte. (The commit used to update memory after its blocking call, so
    /// a drop in between left the file ahead of memory; the next append cut
    /// the data below it and a restart dropped the session as damaged.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    // The std lock is held across awaits on purpose: it stops the commit
    // step on a blocking thread, not a task of this runtime.
    #[allow(clippy::await_holding_lock)]
    async fn an_append_dropped_in_its_commit_step_commits_whole() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = UploadConfig::new(dir.path());
        let uploads = Arc::new(Uploads::open(cfg.clone()).unwrap());
        let st = uploads
            .create("o", Namespace::new("up").unwrap())
            .await
            .unwrap();
        let session = uploads.find("up", &st.id, "o", false).unwrap();
        let claim = || async {
            loop {
                match uploads.claim(&session) {
                    Ok(g) => break g,
                    Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
        };
        let on_disk = || {
            decode_offset(&fs::read(dir.path().join(format!("{}.offset", st.id))).unwrap()).unwrap()
        };
        // Held: the next commit step stops inside its blocking call.
        let paused = lock(&uploads.commit_pause.0);
        let task = tokio::spawn({
            let (uploads, session, guard) = (uploads.clone(), session.clone(), claim().await);
            async move {
                let chunk = vec![7u8; 1000];
                uploads
                    .append(&session, &guard, None, &chunk[..], u64::MAX)
                    .await
            }
        });
        while !uploads.commit_pause.1.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        drop(paused);
        // The claim frees once the blocking call has ended.
        drop(claim().await);
        assert_eq!(on_disk(), 1000);
        assert_eq!(session.offset(), 1000, "memory behind the offset file");
        let guard = claim().await;
        uploads
            .append(&session, &guard, None, &[8u8; 24][..], u64::MAX)
            .await
            .unwrap();
        drop(guard);
        assert_eq!(on_disk(), 1024);
        drop((session, uploads));
        let again = Uploads::open(cfg).unwrap();
        let s = again.find("up", &st.id, "o", false).expect("session kept");
        assert_eq!(s.offset(), 1024);
    }

    /// Issue 39: appends dropped inside their commit step, again and again,
    /// against small byte caps. Every such step commits its bytes, so the
    /// reservation must stay counted: after each drop the bytes held (in
    /// all and per owner) are exactly the committed offsets on disk, never
    /// past a cap, and the next append past a cap is refused. (The
    /// reservation used to live in the append's frame: a drop during the
    /// step gave it back, the step then committed the bytes, and each drop
    /// let another buffer past the caps.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::await_holding_lock)] // as above: it stops a blocking thread
    async fn appends_dropped_in_their_commit_step_keep_the_spool_bounded() {
        const CHUNK: u64 = 1000;
        let dir = tempfile::tempdir().unwrap();
        let cfg = UploadConfig {
            max_bytes: 4500,
            max_bytes_per_owner: 3500,
            ..UploadConfig::new(dir.path())
        };
        let uploads = Arc::new(Uploads::open(cfg.clone()).unwrap());
        let ns = || Namespace::new("up").unwrap();
        let mut sessions = Vec::new();
        for owner in ["o", "p"] {
            let st = uploads.create(owner, ns()).await.unwrap();
            sessions.push(uploads.find("up", &st.id, owner, false).unwrap());
        }
        let claim = |s: Arc<Session>| {
            let uploads = uploads.clone();
            async move {
                loop {
                    match uploads.claim(&s) {
                        Ok(g) => break g,
                        Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
            }
        };
        let on_disk = |s: &Session| {
            decode_offset(&fs::read(dir.path().join(format!("{}.offset", s.id))).unwrap()).unwrap()
        };
        // The count equals the committed bytes on the spool and stays
        // within the caps.
        let settled = |sessions: &[Arc<Session>], why: &str| {
            let u = lock(&uploads.usage);
            let mut total = 0;
            for s in sessions {
                let (disk, len) = (
                    on_disk(s),
                    fs::metadata(dir.path().join(format!("{}.data", s.id)))
                        .unwrap()
                        .len(),
                );
                assert_eq!(s.offset(), disk, "{why}: memory and offset file");
                assert!(len >= disk, "{why}: data shorter than its offset");
                let held = u.per_owner.get(&s.owner).copied().unwrap_or(0);
                assert_eq!(held, disk, "{why}: bytes counted for {}", s.owner);
                assert!(disk <= cfg.max_bytes_per_owner, "{why}: per-owner cap");
                total += disk;
            }
            assert_eq!(u.total, total, "{why}: bytes counted in all");
            assert!(total <= cfg.max_bytes, "{why}: total cap");
            total
        };
        // One append of CHUNK bytes dropped inside its commit step: its
        // result if it ran to its end, or `None` when it was dropped there.
        let drop_mid_commit = |s: Arc<Session>| {
            let uploads = uploads.clone();
            async move {
                uploads.commit_pause.1.store(false, Ordering::SeqCst);
                let paused = lock(&uploads.commit_pause.0);
                let task = tokio::spawn({
                    let (uploads, s, guard) = (uploads.clone(), s.clone(), claim(s.clone()).await);
                    async move {
                        let chunk = vec![9u8; CHUNK as usize];
                        uploads.append(&s, &guard, None, &chunk[..], u64::MAX).await
                    }
                });
                while !uploads.commit_pause.1.load(Ordering::SeqCst) && !task.is_finished() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                let dropped = !task.is_finished();
                task.abort();
                let r = task.await;
                drop(paused);
                // The claim frees once the blocking step has ended.
                drop(claim(s).await);
                match r {
                    Ok(r) => Some(r),
                    Err(e) => {
                        assert!(e.is_cancelled() && dropped);
                        None
                    }
                }
            }
        };
        let (o, p) = (sessions[0].clone(), sessions[1].clone());
        // `o` reaches its cap (3 of 3.5 chunks) one dropped step at a time;
        // the fourth append is refused before it writes.
        for i in 1..=3 {
            assert!(drop_mid_commit(o.clone()).await.is_none(), "dropped");
            assert_eq!(settled(&sessions, &format!("drop {i}")), i * CHUNK);
        }
        let refused = drop_mid_commit(o.clone()).await.expect("refused at once");
        assert_eq!(refused.unwrap_err().code, ErrorCode::UploadQuota);
        assert_eq!(settled(&sessions, "o at its cap"), 3 * CHUNK);
        // `p` fills the rest of the server's cap (4 of 4.5 chunks).
        assert!(drop_mid_commit(p.clone()).await.is_none());
        assert_eq!(settled(&sessions, "p's drop"), 4 * CHUNK);
        let refused = drop_mid_commit(p.clone()).await.expect("refused at once");
        assert_eq!(refused.unwrap_err().code, ErrorCode::UploadQuota);
        assert_eq!(settled(&sessions, "the server at its cap"), 4 * CHUNK);
        // Ending a session gives back exactly what it held.
        let g = claim(o.clone()).await;
        uploads.remove(&o, &g).await.unwrap();
        drop(g);
        sessions.remove(0);
        assert_eq!(settled(&sessions, "o removed"), CHUNK);
        // And a restart counts what the spool holds.
        drop((o, p, sessions, uploads));
        let again = Uploads::open(cfg).unwrap();
        let u = lock(&again.usage);
        assert_eq!(
            (u.total, u.per_owner.get("p").copied()),
            (CHUNK, Some(CHUNK))
        );
    }

    #[test]
    fn offsets_round_trip_and_torn_ones_are_refused() {
        for n in [0, 1, 1 << 40, u64::MAX] {
            assert_eq!(decode_offset(&encode_offset(n)), Some(n));
        }
        let mut torn = encode_offset(77);
        torn[9] ^= 1;
        assert_eq!(decode_offset(&torn), None);
        assert_eq!(decode_offset(&torn[..8]), None);
    }
}
