//! The crash model of the SQLite engine (feature `crash-model`, tests only;
//! ADR-029 "## SQLite").
//!
//! [`CrashModel`] registers a SQLite VFS that wraps the default `unix` VFS.
//! Every file SQLite opens through it is passed through to `unix`
//! unchanged, and the files whose durability matters (the main database,
//! its `-wal`, a rollback `-journal`, a super-journal) are also recorded:
//!
//! - per file (per inode, so a delete and re-create is a new file), the
//!   bytes made durable by its last completed `xSync`, and the writes and
//!   truncations done since, in order;
//! - per directory, which names are durable: a name created or deleted
//!   becomes durable only with a directory sync. The `unix` VFS syncs the
//!   directory on the first `xSync` of a WAL or journal it opened with
//!   `SQLITE_OPEN_CREATE` (`UNIXFILE_DIRSYNC` in `os_unix.c`) and in
//!   `xDelete(.., syncDir=1)`; the model mirrors exactly those two. (It
//!   never syncs the directory for a new main database file: that name
//!   becomes durable with the first WAL's directory sync.)
//!
//! # Durability points
//!
//! Each `xSync` of a recorded file is a durability point reported to the
//! shared [`CrashSwitch`] (`"sqlite: sync wal"`, ...), and so are the
//! directory sync that follows the first sync of a new WAL or journal
//! (`"sqlite: dir sync (new wal)"`) and a delete with a directory sync
//! (`"sqlite: delete + dir sync"`). When the switch refuses a point the
//! process has "crashed": that sync does not happen, and from then on every
//! write, truncation, sync, delete and creation of a recorded file is
//! refused with an `SQLITE_IOERR_*` code (and not applied to the file), so
//! the engine fails its writes. Reads still work.
//!
//! # Restore
//!
//! After the engine is dropped (every file it opened through the model is
//! closed), [`CrashModel::restore`] rewrites the recorded files as the
//! machine would find them after the crash ([`Loss`]):
//!
//! - [`Loss::ProcessCrash`]: the process died, the OS kept every completed
//!   write, truncation and unlink. The files stay as they are (the model
//!   checks that its record of them matches the disk byte for byte).
//! - [`Loss::PowerLoss`]: only what was durable survives: the durable names
//!   of each directory (a created but not dir-synced file disappears, a
//!   deleted but not dir-synced one comes back with its durable bytes), and
//!   for each file its durable bytes, on which each later write (seeded, in
//!   order) is either lost, applied whole, torn (each 512-byte sector of it
//!   new or old), turned to garbage (each sector new or random bytes), or
//!   lost while the file still grew to cover it with random bytes; each
//!   later truncation is applied or lost. That is the failure model SQLite
//!   is designed for (<https://sqlite.org/atomiccommit.html> §2, with the
//!   `unix` VFS's `SQLITE_IOCAP_POWERSAFE_OVERWRITE`): unsynced writes
//!   reach the disk in any order or not at all, possibly torn at any
//!   sector, new file space may hold garbage, bytes outside a written range
//!   never change, and a sync is a barrier. WAL frames carry cumulative
//!   checksums and salts, so a torn or garbage frame ends the log.
//!
//! Not modelled: the `-shm` wal-index (opened by `unix` itself, not through
//! `xOpen`; it is not durable data and the first connection after a crash
//! rebuilds it from the WAL, which the model relies on and the tests
//! exercise), temporary files, bit rot of durable bytes, a lying `fsync`,
//! file-system metadata other than names and sizes, and files outside the
//! VFS (the engine's `.lock` file is an `flock`, released with the
//! process).
//!
//! # Safety
//!
//! The VFS is a thin `unsafe` shim over `rusqlite::ffi`. Each
//! `extern "C"` function documents what SQLite guarantees about its
//! arguments; the model's own state lives in safe Rust behind one mutex,
//! which also serializes every recorded write, truncation, sync and delete
//! (so the order the model records is the order the OS saw).

#![deny(unsafe_op_in_unsafe_fn)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString, OsStr, OsString};
use std::fmt;
use std::mem::size_of;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rusqlite::ffi;
use store_types::crash::CrashSwitch;
use store_types::{Error, ErrorKind, Result};

/// What a crash does to what was written but not made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The process died; the OS kept every completed write (nothing is
    /// lost but what the process never wrote).
    ProcessCrash,
    /// The machine lost power: only durable bytes and names survive; the
    /// fate of each later write is drawn from `seed` (see the module docs).
    PowerLoss {
        /// Seed of the draws; one seed gives one outcome.
        seed: u64,
    },
}

/// A crash model: a SQLite VFS recording what is durable, and the restore
/// that rewrites the files after a crash (see the module docs).
///
/// Cheap to clone; clones share the VFS and its record. Open an engine on
/// it with `SqliteOptions { vfs: Some(model.vfs_name().into()), .. }` and
/// keep the model alive while opening.
#[derive(Clone)]
pub struct CrashModel {
    shared: Arc<Shared>,
}

impl fmt::Debug for CrashModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CrashModel")
            .field("vfs", &self.shared.reg.name)
            .field("open_files", &self.open_files())
            .finish_non_exhaustive()
    }
}

/// What [`CrashModel::restore`] did, one line per file, for messages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// `"<file>: <fate>"` lines, in path order.
    pub lines: Vec<String>,
}

impl fmt::Display for RestoreReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.lines.join("; "))
    }
}

/// State shared by the VFS callbacks and the [`CrashModel`] handles.
struct Shared {
    reg: &'static Registration,
    switch: CrashSwitch,
    state: Mutex<State>,
    open_files: AtomicUsize,
}

/// The registered VFS. Leaked on purpose: SQLite may hold a pointer to a
/// VFS it found before it was unregistered, so it must never be freed; it
/// reaches the model through a `Weak` that dies with the last handle.
struct Registration {
    name: CString,
    /// The `unix` VFS (static inside SQLite).
    inner: *mut ffi::sqlite3_vfs,
    shared: Mutex<Weak<Shared>>,
    /// Filled last; `pAppData` points at this `Registration`.
    vfs: Mutex<Option<Box<ffi::sqlite3_vfs>>>,
}

// SAFETY: `inner` points at SQLite's static `unix` VFS, which SQLite
// allows to be used from any thread (SQLITE_THREADSAFE=1); the rest is
// behind mutexes.
unsafe impl Send for Registration {}
unsafe impl Sync for Registration {}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(vfs) = lock(&self.reg.vfs).as_mut() {
            // SAFETY: the VFS was registered by `CrashModel::new` and is
            // never freed; unregistering only unlinks it from SQLite's list.
            unsafe { ffi::sqlite3_vfs_unregister(&mut **vfs) };
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl CrashModel {
    /// Registers a new crash-model VFS reporting its durability points to
    /// `switch`.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] if SQLite has no `unix` VFS or refuses the
    /// registration.
    pub fn new(switch: CrashSwitch) -> Result<Self> {
        // SAFETY: sqlite3_vfs_find accepts NULL (the default VFS) or a name.
        let inner = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
        if inner.is_null() {
            return Err(Error::backend(
                ErrorKind::Unsupported,
                "crash model: find the unix VFS",
            ));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let name = CString::new(format!("blobpool-crash-{}-{id}", std::process::id()))
            .expect("no NUL in the VFS name");
        let reg: &'static Registration = Box::leak(Box::new(Registration {
            name,
            inner,
            shared: Mutex::new(Weak::new()),
            vfs: Mutex::new(None),
        }));
        // SAFETY: `inner` is SQLite's static unix VFS.
        let inner_ref = unsafe { &*inner };
        let vfs = Box::new(ffi::sqlite3_vfs {
            iVersion: inner_ref.iVersion.min(3),
            szOsFile: c_int::try_from(INNER_OFFSET).expect("small") + inner_ref.szOsFile,
            mxPathname: inner_ref.mxPathname,
            pNext: ptr::null_mut(),
            zName: reg.name.as_ptr(),
            pAppData: reg as *const Registration as *mut c_void,
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: inner_ref.xDlOpen.map(|_| x_dl_open as _),
            xDlError: inner_ref.xDlError.map(|_| x_dl_error as _),
            xDlSym: inner_ref.xDlSym.map(|_| x_dl_sym as _),
            xDlClose: inner_ref.xDlClose.map(|_| x_dl_close as _),
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        });
        let shared = Arc::new(Shared {
            reg,
            switch,
            state: Mutex::new(State::default()),
            open_files: AtomicUsize::new(0),
        });
        *lock(&reg.shared) = Arc::downgrade(&shared);
        let mut slot = lock(&reg.vfs);
        let vfs = slot.insert(vfs);
        // SAFETY: `vfs` is a complete sqlite3_vfs that lives forever (the
        // Registration is leaked); 0 = not the default VFS.
        let rc = unsafe { ffi::sqlite3_vfs_register(&mut **vfs, 0) };
        if rc != ffi::SQLITE_OK {
            *slot = None;
            return Err(
                Error::backend(ErrorKind::Other, "crash model: register the VFS")
                    .with_source(format!("sqlite3_vfs_register returned {rc}")),
            );
        }
        drop(slot);
        Ok(CrashModel { shared })
    }

    /// The name the VFS is registered under (for `SqliteOptions::vfs`).
    pub fn vfs_name(&self) -> &str {
        self.shared.reg.name.to_str().expect("ASCII VFS name")
    }

    /// The switch the durability points are reported to.
    pub fn switch(&self) -> &CrashSwitch {
        &self.shared.switch
    }

    /// Files currently open through the VFS.
    pub fn open_files(&self) -> usize {
        self.shared.open_files.load(Ordering::SeqCst)
    }

    /// Waits (blocking, up to `timeout`) until every file opened through
    /// the VFS is closed: the engine's writer thread and read connections
    /// are gone.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] if files are still open after `timeout`.
    pub fn wait_closed(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.open_files() > 0 {
            if Instant::now() >= deadline {
                return Err(Error::backend(
                    ErrorKind::TimedOut,
                    "crash model: wait for files to close",
                )
                .with_source(format!(
                    "{} files still open after {timeout:?}",
                    self.open_files()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Rewrites the recorded files as a crash with `loss` leaves them (see
    /// the module docs), then forgets the record: the files on disk are the
    /// durable state of the next life, and the model can be used again.
    /// Call it after the engine is dropped; it waits (blocking, up to 30 s)
    /// for the engine's connections to close. It does not reset the
    /// [`CrashSwitch`] (another engine's model may share it).
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] if files stay open, or if the model's record of
    /// a file disagrees with the disk (a bug of the model);
    /// [`Error::Io`] if a file cannot be rewritten.
    pub fn restore(&self, loss: Loss) -> Result<RestoreReport> {
        self.wait_closed(Duration::from_secs(30))?;
        let mut state = lock(&self.shared.state);
        let mut rng = StdRng::seed_from_u64(match loss {
            Loss::ProcessCrash => 0,
            Loss::PowerLoss { seed } => seed,
        });
        let mut report = RestoreReport::default();
        for (dir_path, dir) in &state.dirs {
            let mut names: Vec<&OsString> = dir.live.keys().chain(dir.durable.keys()).collect();
            names.sort();
            names.dedup();
            for name in names {
                let path = dir_path.join(name);
                // The model's view of the disk must be the disk.
                if let Some(&id) = dir.live.get(name) {
                    let inode = &state.inodes[id];
                    let expect = inode.volatile();
                    let found = std::fs::read(&path)
                        .map_err(|e| Error::from_io("crash model: read", e).with_path(&path))?;
                    if found != expect {
                        return Err(Error::backend(
                            ErrorKind::InvalidData,
                            "crash model: compare its record with the disk",
                        )
                        .with_path(&path)
                        .with_source(format!(
                            "recorded {} bytes, found {} bytes",
                            expect.len(),
                            found.len()
                        )));
                    }
                }
                let (fate, content) = match loss {
                    Loss::ProcessCrash => match dir.live.get(name) {
                        Some(&id) => ("kept".to_owned(), Some(state.inodes[id].volatile())),
                        None => ("deleted".to_owned(), None),
                    },
                    Loss::PowerLoss { .. } => match dir.durable.get(name) {
                        Some(&id) => {
                            let (bytes, fates) = state.inodes[id].after_power_loss(&mut rng);
                            (fates, Some(bytes))
                        }
                        None => ("name not durable: gone".to_owned(), None),
                    },
                };
                match content {
                    Some(bytes) => {
                        report.lines.push(format!(
                            "{}: {} bytes, {fate}",
                            path.display(),
                            bytes.len()
                        ));
                        std::fs::write(&path, &bytes).map_err(|e| {
                            Error::from_io("crash model: write", e).with_path(&path)
                        })?;
                    }
                    None => {
                        report.lines.push(format!("{}: {fate}", path.display()));
                        match std::fs::remove_file(&path) {
                            Ok(()) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => {
                                return Err(
                                    Error::from_io("crash model: remove", e).with_path(&path)
                                )
                            }
                        }
                    }
                }
            }
        }
        *state = State::default();
        Ok(report)
    }
}

// ---------------------------------------------------------------------------
// The record: inodes and directories.

/// A write or truncation not yet made durable.
#[derive(Clone, Debug)]
enum Op {
    Write { offset: usize, data: Vec<u8> },
    Truncate(usize),
}

impl Op {
    fn apply(&self, file: &mut Vec<u8>) {
        match self {
            Op::Write { offset, data } => {
                let end = offset + data.len();
                if file.len() < end {
                    file.resize(end, 0);
                }
                file[*offset..end].copy_from_slice(data);
            }
            Op::Truncate(len) => file.resize(*len, 0),
        }
    }
}

/// One file's content: durable bytes and the operations since.
#[derive(Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    pending: Vec<Op>,
}

/// Sector size of the torn-write model.
const SECTOR: usize = 512;

impl Inode {
    /// The content the OS holds (every completed operation applied).
    fn volatile(&self) -> Vec<u8> {
        let mut file = self.durable.clone();
        for op in &self.pending {
            op.apply(&mut file);
        }
        file
    }

    /// `xSync` completed: everything written so far is durable.
    fn sync(&mut self) {
        for op in std::mem::take(&mut self.pending) {
            op.apply(&mut self.durable);
        }
    }

    /// The content after a power loss, and a description of the fates.
    fn after_power_loss(&self, rng: &mut StdRng) -> (Vec<u8>, String) {
        let mut file = self.durable.clone();
        let mut counts = [0usize; 5];
        for op in &self.pending {
            match op {
                Op::Truncate(_) => {
                    if rng.random_bool(0.5) {
                        op.apply(&mut file);
                        counts[1] += 1;
                    } else {
                        counts[0] += 1;
                    }
                }
                Op::Write { offset, data } => {
                    let end = offset + data.len();
                    let fate = rng.random_range(0..5);
                    counts[fate] += 1;
                    match fate {
                        // Lost.
                        0 => {}
                        // Applied whole.
                        1 => op.apply(&mut file),
                        // Torn / garbage, sector by sector.
                        2 | 3 => {
                            if file.len() < end {
                                file.resize(end, 0);
                            }
                            for start in (*offset..end).step_by(SECTOR) {
                                let stop = (start + SECTOR).min(end);
                                let new = &data[start - offset..stop - offset];
                                if rng.random_bool(0.5) {
                                    file[start..stop].copy_from_slice(new);
                                } else if fate == 3 {
                                    rng.fill(&mut file[start..stop]);
                                }
                            }
                        }
                        // Lost, but the file grew over it: garbage there.
                        _ => {
                            if file.len() < end {
                                let old = file.len().max(*offset);
                                file.resize(end, 0);
                                rng.fill(&mut file[old..end]);
                            }
                        }
                    }
                }
            }
        }
        let fates = format!(
            "{} durable bytes, {} later ops: {} lost, {} applied, {} torn, {} garbage, \
             {} grown-garbage",
            self.durable.len(),
            self.pending.len(),
            counts[0],
            counts[1],
            counts[2],
            counts[3],
            counts[4]
        );
        (file, fates)
    }
}

/// One directory's names: what the OS shows and what a dir sync made
/// durable.
#[derive(Debug, Default)]
struct Dir {
    live: BTreeMap<OsString, usize>,
    durable: BTreeMap<OsString, usize>,
}

#[derive(Debug, Default)]
struct State {
    inodes: Vec<Inode>,
    dirs: BTreeMap<PathBuf, Dir>,
}

impl State {
    fn new_inode(&mut self, durable: Vec<u8>) -> usize {
        self.inodes.push(Inode {
            durable,
            pending: Vec::new(),
        });
        self.inodes.len() - 1
    }

    /// The inode `path` names, adopting a file found on disk (the files
    /// present when the model first sees them are durable: they are what
    /// a previous restore or a clean shutdown left). `None`: no such file.
    fn lookup(&mut self, dir: &Path, name: &OsStr) -> std::io::Result<Option<usize>> {
        if let Some(&id) = self.dirs.get(dir).and_then(|d| d.live.get(name)) {
            return Ok(Some(id));
        }
        match std::fs::read(dir.join(name)) {
            Ok(bytes) => {
                let id = self.new_inode(bytes);
                let d = self.dirs.entry(dir.to_owned()).or_default();
                d.live.insert(name.to_owned(), id);
                d.durable.insert(name.to_owned(), id);
                Ok(Some(id))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn dir_sync(&mut self, dir: &Path) {
        let d = self.dirs.entry(dir.to_owned()).or_default();
        d.durable = d.live.clone();
    }
}

/// The recorded kinds of file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Db,
    Wal,
    Journal,
    SuperJournal,
}

impl Kind {
    fn of(flags: c_int) -> Option<Kind> {
        if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
            Some(Kind::Db)
        } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
            Some(Kind::Wal)
        } else if flags & ffi::SQLITE_OPEN_MAIN_JOURNAL != 0 {
            Some(Kind::Journal)
        } else if flags & ffi::SQLITE_OPEN_SUPER_JOURNAL != 0 {
            Some(Kind::SuperJournal)
        } else {
            None
        }
    }

    fn sync_label(self) -> &'static str {
        match self {
            Kind::Db => "sqlite: sync db",
            Kind::Wal => "sqlite: sync wal",
            Kind::Journal => "sqlite: sync journal",
            Kind::SuperJournal => "sqlite: sync super-journal",
        }
    }

    fn dir_sync_label(self) -> &'static str {
        match self {
            Kind::Db => "sqlite: dir sync (new db)",
            Kind::Wal => "sqlite: dir sync (new wal)",
            Kind::Journal => "sqlite: dir sync (new journal)",
            Kind::SuperJournal => "sqlite: dir sync (new super-journal)",
        }
    }

    /// Whether `unix` syncs the directory on the first `xSync` of a file
    /// of this kind opened with `SQLITE_OPEN_CREATE` (`isNewJrnl`).
    fn dir_synced_on_first_sync(self) -> bool {
        self != Kind::Db
    }
}

/// A recorded file handle's identity.
struct Track {
    inode: usize,
    dir: PathBuf,
    kind: Kind,
    /// Mirrors `UNIXFILE_DIRSYNC`: the next successful sync also syncs
    /// the directory.
    dirsync_pending: bool,
}

/// Our `sqlite3_file`: SQLite allocates `szOsFile` bytes; this header is
/// followed (at [`INNER_OFFSET`]) by the `unix` VFS's own file object.
#[repr(C)]
struct ModelFile {
    base: ffi::sqlite3_file,
    shared: Option<Arc<Shared>>,
    track: Option<Track>,
}

/// Where the wrapped `unix` file starts inside a [`ModelFile`] allocation
/// (16-byte aligned; SQLite's allocations are 8-byte aligned, which is all
/// `unixFile` needs).
const INNER_OFFSET: usize = (size_of::<ModelFile>() + 15) & !15;

fn path_of(z: *const c_char) -> Option<PathBuf> {
    if z.is_null() {
        return None;
    }
    // SAFETY: SQLite passes NUL-terminated file names (or NULL).
    let bytes = unsafe { CStr::from_ptr(z) }.to_bytes();
    Some(PathBuf::from(OsStr::from_bytes(bytes)))
}

fn split(path: &Path) -> Option<(PathBuf, OsString)> {
    Some((path.parent()?.to_owned(), path.file_name()?.to_owned()))
}

/// The registration behind `vfs`.
///
/// # Safety
///
/// `vfs` must be a VFS registered by [`CrashModel::new`].
unsafe fn registration<'a>(vfs: *mut ffi::sqlite3_vfs) -> &'a Registration {
    // SAFETY: pAppData of our VFS points at its leaked Registration.
    unsafe { &*((*vfs).pAppData as *const Registration) }
}

/// The inner (`unix`) file of one of our files, and its methods.
///
/// # Safety
///
/// `file` must have been opened successfully by [`x_open`].
unsafe fn inner_of<'a>(
    file: *mut ffi::sqlite3_file,
) -> (*mut ffi::sqlite3_file, &'a ffi::sqlite3_io_methods) {
    // SAFETY: the inner file lives at INNER_OFFSET of the allocation
    // SQLite made of szOsFile bytes; a successful x_open set its pMethods.
    unsafe {
        let inner = (file as *mut u8).add(INNER_OFFSET) as *mut ffi::sqlite3_file;
        (inner, &*(*inner).pMethods)
    }
}

// ---------------------------------------------------------------------------
// The VFS methods.

/// `xOpen`.
///
/// # Safety
///
/// Called by SQLite with our VFS, a file name (or NULL), `file` pointing at
/// `szOsFile` writable bytes, and `out_flags` NULL or writable.
unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    // SAFETY: see the function's contract.
    let reg = unsafe { registration(vfs) };
    let mf = file as *mut ModelFile;
    // SAFETY: `file` has room for a ModelFile header; pMethods must be NULL
    // if the open fails, so SQLite does not call xClose.
    unsafe {
        ptr::addr_of_mut!((*mf).base).write(ffi::sqlite3_file {
            pMethods: ptr::null(),
        })
    };
    let Some(shared) = lock(&reg.shared).upgrade() else {
        return ffi::SQLITE_CANTOPEN;
    };
    // SAFETY: INNER_OFFSET + the unix szOsFile is inside the allocation.
    let inner_file = unsafe { (file as *mut u8).add(INNER_OFFSET) } as *mut ffi::sqlite3_file;
    let path = path_of(z_name);
    let recorded = Kind::of(flags).zip(path.as_deref().and_then(split));
    let mut state = lock(&shared.state);
    let (track, known) = match &recorded {
        None => (None, None),
        Some((kind, (dir, name))) => {
            let known = match state.lookup(dir, name) {
                Ok(id) => id,
                Err(_) => return ffi::SQLITE_CANTOPEN,
            };
            if known.is_none() && shared.switch.crashed() {
                // A dead process creates no files.
                return ffi::SQLITE_CANTOPEN;
            }
            let track = Track {
                inode: known.unwrap_or(usize::MAX),
                dir: dir.clone(),
                kind: *kind,
                dirsync_pending: flags & ffi::SQLITE_OPEN_CREATE != 0
                    && kind.dir_synced_on_first_sync(),
            };
            (Some(track), known)
        }
    };
    // SAFETY: the unix VFS is static and its xOpen gets the same
    // arguments SQLite gave us, with its own file object.
    let rc =
        unsafe { crate::vfs_forward::open_unix(reg.inner, z_name, inner_file, flags, out_flags) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    let track = track.map(|mut t| {
        if known.is_none() {
            // Created by this open: a new inode, its name not yet durable.
            let id = state.new_inode(Vec::new());
            let (_, (dir, name)) = recorded.as_ref().expect("recorded");
            state
                .dirs
                .entry(dir.clone())
                .or_default()
                .live
                .insert(name.clone(), id);
            t.inode = id;
        }
        t
    });
    drop(state);
    shared.open_files.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `mf` has room for the header; the fields are written once
    // here and dropped in x_close.
    unsafe {
        ptr::addr_of_mut!((*mf).shared).write(Some(shared));
        ptr::addr_of_mut!((*mf).track).write(track);
        (*mf).base.pMethods = &IO_METHODS;
    }
    ffi::SQLITE_OK
}

/// `xDelete`.
///
/// # Safety
///
/// Called by SQLite with our VFS and a NUL-terminated name.
unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    z_name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    // SAFETY: see the function's contract.
    let reg = unsafe { registration(vfs) };
    // SAFETY: the unix VFS is static.
    let forward =
        || unsafe { (*reg.inner).xDelete.expect("unix xDelete")(reg.inner, z_name, sync_dir) };
    let shared = lock(&reg.shared).upgrade();
    let (Some(shared), Some((dir, name))) = (shared, path_of(z_name).as_deref().and_then(split))
    else {
        return forward();
    };
    let mut state = lock(&shared.state);
    if !state.dirs.contains_key(&dir) {
        return forward();
    }
    if shared.switch.crashed() {
        return ffi::SQLITE_IOERR_DELETE;
    }
    // Adopt a file the model has not opened yet, so a power loss can
    // bring it back.
    if state.lookup(&dir, &name).is_err() {
        return ffi::SQLITE_IOERR_DELETE;
    }
    if sync_dir != 0 && shared.switch.point("sqlite: delete + dir sync").is_err() {
        return ffi::SQLITE_IOERR_DELETE;
    }
    let rc = forward();
    if rc == ffi::SQLITE_OK {
        if let Some(d) = state.dirs.get_mut(&dir) {
            d.live.remove(&name);
        }
        if sync_dir != 0 {
            state.dir_sync(&dir);
        }
    }
    rc
}

macro_rules! forward_vfs {
    ($name:ident, $field:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty, $fallback:expr) => {
        /// Forwarded to the `unix` VFS.
        ///
        /// # Safety
        ///
        /// Called by SQLite with our VFS and the arguments of the method.
        unsafe extern "C" fn $name(vfs: *mut ffi::sqlite3_vfs, $($arg: $ty),*) -> $ret {
            // SAFETY: see the function's contract; the unix VFS is static
            // and gets the same arguments.
            unsafe {
                let reg = registration(vfs);
                match (*reg.inner).$field {
                    Some(f) => f(reg.inner, $($arg),*),
                    None => $fallback,
                }
            }
        }
    };
}

forward_vfs!(x_access, xAccess, (z: *const c_char, flags: c_int, out: *mut c_int) -> c_int,
    ffi::SQLITE_IOERR);
forward_vfs!(x_full_pathname, xFullPathname,
    (z: *const c_char, n: c_int, out: *mut c_char) -> c_int, ffi::SQLITE_IOERR);
forward_vfs!(x_dl_open, xDlOpen, (z: *const c_char) -> *mut c_void, ptr::null_mut());
forward_vfs!(x_dl_error, xDlError, (n: c_int, out: *mut c_char) -> (), ());
forward_vfs!(x_dl_sym, xDlSym,
    (h: *mut c_void, z: *const c_char) -> Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>,
    None);
forward_vfs!(x_dl_close, xDlClose, (h: *mut c_void) -> (), ());
forward_vfs!(x_randomness, xRandomness, (n: c_int, out: *mut c_char) -> c_int, 0);
forward_vfs!(x_sleep, xSleep, (us: c_int) -> c_int, 0);
forward_vfs!(x_current_time, xCurrentTime, (out: *mut f64) -> c_int, ffi::SQLITE_ERROR);
forward_vfs!(x_get_last_error, xGetLastError, (n: c_int, out: *mut c_char) -> c_int, 0);
forward_vfs!(x_current_time_int64, xCurrentTimeInt64, (out: *mut ffi::sqlite3_int64) -> c_int,
    ffi::SQLITE_ERROR);

// ---------------------------------------------------------------------------
// The file methods.

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(f_close),
    xRead: Some(f_read),
    xWrite: Some(f_write),
    xTruncate: Some(f_truncate),
    xSync: Some(f_sync),
    xFileSize: Some(f_file_size),
    xLock: Some(f_lock),
    xUnlock: Some(f_unlock),
    xCheckReservedLock: Some(f_check_reserved_lock),
    xFileControl: Some(f_file_control),
    xSectorSize: Some(f_sector_size),
    xDeviceCharacteristics: Some(f_device_characteristics),
    xShmMap: Some(f_shm_map),
    xShmLock: Some(f_shm_lock),
    xShmBarrier: Some(f_shm_barrier),
    xShmUnmap: Some(f_shm_unmap),
    xFetch: Some(f_fetch),
    xUnfetch: Some(f_unfetch),
};

/// Our header of an open file.
///
/// # Safety
///
/// `file` must have been opened successfully by [`x_open`] and not closed.
unsafe fn header<'a>(file: *mut ffi::sqlite3_file) -> (&'a Shared, Option<&'a mut Track>) {
    // SAFETY: x_open wrote both fields; SQLite does not call one file's
    // methods concurrently with its xClose.
    unsafe {
        let mf = &mut *(file as *mut ModelFile);
        (mf.shared.as_deref().expect("open file"), mf.track.as_mut())
    }
}

/// `xClose`.
///
/// # Safety
///
/// `file` was opened by [`x_open`]; SQLite calls this once.
unsafe extern "C" fn f_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: see the function's contract.
    unsafe {
        let (inner, m) = inner_of(file);
        let rc = m.xClose.map_or(ffi::SQLITE_OK, |f| f(inner));
        let mf = file as *mut ModelFile;
        ptr::drop_in_place(ptr::addr_of_mut!((*mf).track));
        let shared = ptr::addr_of_mut!((*mf).shared).read();
        if let Some(shared) = shared {
            shared.open_files.fetch_sub(1, Ordering::SeqCst);
        }
        (*mf).base.pMethods = ptr::null();
        rc
    }
}

/// `xWrite`: refused after the crash; recorded as pending otherwise.
///
/// # Safety
///
/// `file` was opened by [`x_open`]; `buf` holds `amt` readable bytes.
unsafe extern "C" fn f_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: see the function's contract.
    let (shared, track) = unsafe { header(file) };
    // SAFETY: as above.
    let (inner, m) = unsafe { inner_of(file) };
    let write = || unsafe { m.xWrite.expect("xWrite")(inner, buf, amt, offset) };
    let Some(track) = track else {
        return write();
    };
    let mut state = lock(&shared.state);
    if shared.switch.crashed() {
        return ffi::SQLITE_IOERR_WRITE;
    }
    let rc = write();
    if rc == ffi::SQLITE_OK {
        // SAFETY: `buf` holds `amt` bytes (SQLite's contract).
        let data = unsafe { std::slice::from_raw_parts(buf as *const u8, amt as usize) };
        state.inodes[track.inode].pending.push(Op::Write {
            offset: usize::try_from(offset).unwrap_or(usize::MAX),
            data: data.to_vec(),
        });
    }
    rc
}

/// `xTruncate`: refused after the crash; recorded as pending otherwise.
///
/// # Safety
///
/// `file` was opened by [`x_open`].
unsafe extern "C" fn f_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    // SAFETY: see the function's contract.
    let (shared, track) = unsafe { header(file) };
    // SAFETY: as above.
    let (inner, m) = unsafe { inner_of(file) };
    let truncate = || unsafe { m.xTruncate.expect("xTruncate")(inner, size) };
    let Some(track) = track else {
        return truncate();
    };
    let mut state = lock(&shared.state);
    if shared.switch.crashed() {
        return ffi::SQLITE_IOERR_TRUNCATE;
    }
    let rc = truncate();
    if rc == ffi::SQLITE_OK {
        let size = usize::try_from(size).unwrap_or(0);
        state.inodes[track.inode].pending.push(Op::Truncate(size));
    }
    rc
}

/// `xSync`: a durability point (two for the first sync of a new WAL or
/// journal: the file, then its directory).
///
/// # Safety
///
/// `file` was opened by [`x_open`].
unsafe extern "C" fn f_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: see the function's contract.
    let (shared, track) = unsafe { header(file) };
    // SAFETY: as above.
    let (inner, m) = unsafe { inner_of(file) };
    let sync = || unsafe { m.xSync.expect("xSync")(inner, flags) };
    let Some(track) = track else {
        return sync();
    };
    let mut state = lock(&shared.state);
    if shared.switch.point(track.kind.sync_label()).is_err() {
        return ffi::SQLITE_IOERR_FSYNC;
    }
    let rc = sync();
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    state.inodes[track.inode].sync();
    if track.dirsync_pending {
        track.dirsync_pending = false;
        if shared.switch.point(track.kind.dir_sync_label()).is_err() {
            return ffi::SQLITE_IOERR_FSYNC;
        }
        state.dir_sync(&track.dir);
    }
    ffi::SQLITE_OK
}

forward_file!(inner_of; f_read, xRead,
    (buf: *mut c_void, amt: c_int, off: ffi::sqlite3_int64) -> c_int, ffi::SQLITE_IOERR_READ);
forward_common_file_methods!(inner_of);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_makes_writes_durable_and_power_loss_keeps_only_those() {
        let mut inode = Inode::default();
        inode.pending.push(Op::Write {
            offset: 0,
            data: vec![1; 1000],
        });
        inode.sync();
        inode.pending.push(Op::Write {
            offset: 1000,
            data: vec![2; 1000],
        });
        assert_eq!(inode.durable, vec![1; 1000]);
        assert_eq!(inode.volatile().len(), 2000);
        let mut seen = std::collections::HashSet::new();
        for seed in 0..64 {
            let (bytes, _) = inode.after_power_loss(&mut StdRng::seed_from_u64(seed));
            assert_eq!(&bytes[..1000], &[1; 1000][..], "durable bytes never change");
            seen.insert(bytes.len());
        }
        assert_eq!(seen, [1000, 2000].into_iter().collect());
    }
}
