//! The no-wait read VFS (ADR-055): a reader connection runs a query on the
//! calling task's thread when, and only when, every page the query reads is
//! already in memory.
//!
//! SQLite cannot be asked "answer only if the pages are cached", but its
//! VFS does every file read, so the VFS can. This one wraps SQLite's `unix`
//! VFS and forwards everything to it, except a read made while the calling
//! thread is inside [`attempt`]. Such a read goes through
//! `preadv2(RWF_NOWAIT)` on the `unix` file's own descriptor, and the
//! kernel answers from the page cache or not at all. A read that would have
//! waited for the disk fails the query with `SQLITE_IOERR_READ` and marks
//! the attempt *blocked*. That covers `EAGAIN`, any other error, a file the
//! VFS has no descriptor for, and a file system without `RWF_NOWAIT`. The
//! caller then runs the same query on the blocking pool, where reads are
//! plain `unix` reads. A busy handler that would sleep marks the attempt
//! blocked too ([`busy`]).
//!
//! A failed read inside a read transaction leaves SQLite's pager as it was
//! (the page is dropped, the read lock released with the statement), so
//! the connection stays usable; the reader pool rolls back any transaction
//! left open anyway.
//!
//! The descriptor is the `unix` VFS's own (`unixFile.h`, the fourth field;
//! stable since SQLite 3.7). It is used only after `fstat` shows it is the
//! file SQLite named (same device and inode); otherwise the file has no
//! descriptor here and every attempt on it is blocked. The VFS never opens
//! or closes a descriptor of its own, since closing any descriptor of a
//! file drops the process's POSIX locks on it.
//!
//! Linux only (`preadv2`); elsewhere there is no VFS and every read takes
//! the blocking pool.

use std::cell::Cell;

/// What the calling thread is doing, for the VFS's reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reads forward to `unix`: they may wait.
    Wait,
    /// Inside [`attempt`]: reads must not wait.
    NoWait,
    /// Inside [`attempt`], and a read would have waited.
    Blocked,
}

thread_local! {
    static MODE: Cell<Mode> = const { Cell::new(Mode::Wait) };
}

/// Puts the thread back in [`Mode::Wait`], even if the attempt panics.
struct Reset;

impl Drop for Reset {
    fn drop(&mut self) {
        MODE.with(|m| m.set(Mode::Wait));
    }
}

/// Runs `f` with the VFS's reads in no-wait mode; `None` when one of them
/// (or a busy wait) would have blocked, in which case `f`'s result is an
/// error caused by that and is dropped.
pub(crate) fn attempt<T>(f: impl FnOnce() -> T) -> Option<T> {
    MODE.with(|m| m.set(Mode::NoWait));
    let reset = Reset;
    let out = f();
    let blocked = MODE.with(|m| m.get()) == Mode::Blocked;
    drop(reset);
    (!blocked).then_some(out)
}

/// Marks the current attempt blocked; true if the thread is in one.
fn block() -> bool {
    MODE.with(|m| {
        let inside = m.get() != Mode::Wait;
        if inside {
            m.set(Mode::Blocked);
        }
        inside
    })
}

/// The reader connections' busy handler: inside an attempt it gives up at
/// once (and blocks the attempt); otherwise it sleeps with SQLite's own
/// back-off until `timeout` has been spent.
pub(crate) fn busy(count: i32, timeout: std::time::Duration) -> bool {
    const DELAYS_MS: [u64; 12] = [1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100];
    if block() {
        return false;
    }
    let i = usize::try_from(count).unwrap_or(0);
    let delay = DELAYS_MS[i.min(DELAYS_MS.len() - 1)];
    let spent: u64 = DELAYS_MS.iter().take(i).sum::<u64>()
        + i.saturating_sub(DELAYS_MS.len()) as u64 * DELAYS_MS[DELAYS_MS.len() - 1];
    if u128::from(spent + delay) > timeout.as_millis() {
        return false;
    }
    std::thread::sleep(std::time::Duration::from_millis(delay));
    true
}

#[cfg(target_os = "linux")]
pub(crate) use vfs::name;

/// Without `preadv2` there is no no-wait VFS.
#[cfg(not(target_os = "linux"))]
pub(crate) fn name() -> Option<&'static str> {
    None
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod vfs {
    use std::ffi::{c_char, c_int, c_void};
    use std::mem::size_of;
    use std::ptr;
    use std::sync::OnceLock;

    use rusqlite::ffi;

    use super::block;

    /// The registered name.
    const NAME: &std::ffi::CStr = c"blobpool-nowait";

    /// The VFS's name for `open_with_flags_and_vfs`, registering it on
    /// first use; `None` if SQLite has no `unix` VFS or refuses it.
    pub(crate) fn name() -> Option<&'static str> {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        let ok = *REGISTERED.get_or_init(|| {
            let ok = register();
            if !ok {
                tracing::warn!("sqlite: no no-wait VFS; every read takes the blocking pool");
            }
            ok
        });
        ok.then(|| NAME.to_str().expect("ASCII VFS name"))
    }

    fn register() -> bool {
        // SAFETY: sqlite3_vfs_find accepts a NUL-terminated name.
        let inner = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
        if inner.is_null() {
            return false;
        }
        // SAFETY: `inner` is SQLite's static unix VFS. Every method but
        // xOpen is the unix one, which ignores its VFS argument (ours
        // carries the same mxPathname); xOpen passes `inner` on.
        let vfs = unsafe {
            let mut vfs = ptr::read(inner);
            vfs.szOsFile = c_int::try_from(INNER_OFFSET).expect("small") + (*inner).szOsFile;
            vfs.pNext = ptr::null_mut();
            vfs.zName = NAME.as_ptr();
            vfs.pAppData = inner.cast();
            vfs.xOpen = Some(x_open);
            vfs
        };
        let vfs: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(vfs));
        // SAFETY: `vfs` is complete and lives forever; 0 = not the default.
        unsafe { ffi::sqlite3_vfs_register(vfs, 0) == ffi::SQLITE_OK }
    }

    /// Our `sqlite3_file`: this header, then (at [`INNER_OFFSET`]) the
    /// unix VFS's own file object.
    #[repr(C)]
    struct NoWaitFile {
        base: ffi::sqlite3_file,
        /// The unix file's descriptor, checked; -1 when not known.
        fd: c_int,
    }

    const INNER_OFFSET: usize = (size_of::<NoWaitFile>() + 15) & !15;

    /// The unix file inside one of ours, and its methods.
    ///
    /// # Safety
    ///
    /// `file` was opened successfully by [`x_open`] and not closed.
    unsafe fn inner_of<'a>(
        file: *mut ffi::sqlite3_file,
    ) -> (*mut ffi::sqlite3_file, &'a ffi::sqlite3_io_methods) {
        // SAFETY: see the contract; x_open left the unix file there.
        unsafe {
            let inner = (file as *mut u8).add(INNER_OFFSET) as *mut ffi::sqlite3_file;
            (inner, &*(*inner).pMethods)
        }
    }

    /// `xOpen`: the unix open, then the descriptor of a main database or
    /// WAL file (the files a read query reads).
    ///
    /// # Safety
    ///
    /// Called by SQLite with our VFS, a file name (or NULL), `file`
    /// pointing at `szOsFile` writable bytes and `out_flags` NULL or
    /// writable.
    unsafe extern "C" fn x_open(
        vfs: *mut ffi::sqlite3_vfs,
        z_name: ffi::sqlite3_filename,
        file: *mut ffi::sqlite3_file,
        flags: c_int,
        out_flags: *mut c_int,
    ) -> c_int {
        // SAFETY: see the contract; pAppData is the unix VFS (register).
        unsafe {
            let inner_vfs = (*vfs).pAppData as *mut ffi::sqlite3_vfs;
            let ours = file as *mut NoWaitFile;
            // pMethods stays NULL unless the open succeeds (no xClose).
            ptr::addr_of_mut!((*ours).base).write(ffi::sqlite3_file {
                pMethods: ptr::null(),
            });
            let inner = (file as *mut u8).add(INNER_OFFSET) as *mut ffi::sqlite3_file;
            let rc = crate::vfs_forward::open_unix(inner_vfs, z_name, inner, flags, out_flags);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
            let reads = flags & (ffi::SQLITE_OPEN_MAIN_DB | ffi::SQLITE_OPEN_WAL) != 0;
            let fd = if reads { unix_fd(inner, z_name) } else { -1 };
            ptr::addr_of_mut!((*ours).fd).write(fd);
            (*ours).base.pMethods = &IO_METHODS;
        }
        ffi::SQLITE_OK
    }

    /// The unix file's descriptor (`unixFile.h`), if `fstat` shows it is
    /// the file named `z_name`.
    ///
    /// # Safety
    ///
    /// `inner` is an open unix file; `z_name` NULL or NUL-terminated.
    unsafe fn unix_fd(inner: *mut ffi::sqlite3_file, z_name: *const c_char) -> c_int {
        if z_name.is_null() {
            return -1;
        }
        // SAFETY: a unixFile starts with three pointers (pMethod, pVfs,
        // pInode), then `int h`; the allocation is larger than that.
        let h = unsafe { *((inner as *const u8).add(3 * size_of::<usize>()) as *const c_int) };
        if h < 0 {
            return -1;
        }
        // SAFETY: both stat buffers are written by the calls; z_name is a
        // NUL-terminated path.
        let same = unsafe {
            let mut by_fd: libc::stat = std::mem::zeroed();
            let mut by_name: libc::stat = std::mem::zeroed();
            libc::fstat(h, &mut by_fd) == 0
                && libc::stat(z_name, &mut by_name) == 0
                && by_fd.st_dev == by_name.st_dev
                && by_fd.st_ino == by_name.st_ino
        };
        if same {
            h
        } else {
            -1
        }
    }

    /// `xRead`: forwarded, except inside an attempt (see the module).
    ///
    /// # Safety
    ///
    /// `file` was opened by [`x_open`]; `buf` has `amt` writable bytes.
    unsafe extern "C" fn f_read(
        file: *mut ffi::sqlite3_file,
        buf: *mut c_void,
        amt: c_int,
        off: ffi::sqlite3_int64,
    ) -> c_int {
        if super::MODE.with(|m| m.get()) != super::Mode::Wait {
            // SAFETY: see the contract.
            return unsafe { read_nowait((*(file as *mut NoWaitFile)).fd, buf, amt, off) };
        }
        // SAFETY: see the contract.
        unsafe {
            let (inner, m) = inner_of(file);
            m.xRead
                .map_or(ffi::SQLITE_IOERR_READ, |f| f(inner, buf, amt, off))
        }
    }

    /// Reads `amt` bytes at `off` from the page cache only; a short read at
    /// the end of the file zero-fills the rest, as the unix VFS does.
    ///
    /// # Safety
    ///
    /// `buf` has `amt` writable bytes.
    unsafe fn read_nowait(fd: c_int, buf: *mut c_void, amt: c_int, off: i64) -> c_int {
        let want = usize::try_from(amt).unwrap_or(0);
        let mut done = 0usize;
        while fd >= 0 && done < want {
            let iov = libc::iovec {
                // SAFETY: `done < want`, inside `buf`.
                iov_base: unsafe { buf.cast::<u8>().add(done) }.cast(),
                iov_len: want - done,
            };
            let at = off + done as i64;
            // SAFETY: one iovec over writable bytes of `buf`.
            let n = unsafe { libc::preadv2(fd, &iov, 1, at, libc::RWF_NOWAIT) };
            match n {
                0 => {
                    // SAFETY: the rest of `buf` is writable.
                    unsafe { ptr::write_bytes(buf.cast::<u8>().add(done), 0, want - done) };
                    return ffi::SQLITE_IOERR_SHORT_READ;
                }
                n if n > 0 => done += n as usize,
                _ if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) => {}
                _ => break,
            }
        }
        if done == want {
            return ffi::SQLITE_OK;
        }
        block();
        ffi::SQLITE_IOERR_READ
    }

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

    // xClose: the descriptor is the unix file's, closed by it.
    forward_file!(inner_of; f_close, xClose, () -> c_int, ffi::SQLITE_OK);
    forward_file!(inner_of; f_write, xWrite,
        (buf: *const c_void, amt: c_int, off: ffi::sqlite3_int64) -> c_int,
        ffi::SQLITE_IOERR_WRITE);
    forward_file!(inner_of; f_truncate, xTruncate, (size: ffi::sqlite3_int64) -> c_int,
        ffi::SQLITE_IOERR_TRUNCATE);
    forward_file!(inner_of; f_sync, xSync, (flags: c_int) -> c_int, ffi::SQLITE_IOERR_FSYNC);
    // Reader connections set mmap_size = 0, so SQLite never fetches a
    // mapped page (which could fault); xFetch is forwarded for the others.
    forward_common_file_methods!(inner_of);
}
