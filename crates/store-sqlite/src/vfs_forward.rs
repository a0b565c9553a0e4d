//! Forwarding file methods for the VFS shims over SQLite's `unix` VFS (the
//! crash model's and the no-wait reader's): each shim file holds its
//! header, then the unix file; a method it does not change is passed to the
//! unix file unchanged.

/// Defines `unsafe extern "C" fn $name(file, args..) -> ret` that calls
/// the unix file's `$field` (or returns `$fallback` when it has none).
/// `$inner_of` maps one of the shim's files to `(unix file, its methods)`.
#[allow(unused_macros)]
macro_rules! forward_file {
    ($inner_of:path; $name:ident, $field:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty, $fallback:expr) => {
        /// Forwarded to the `unix` file.
        ///
        /// # Safety
        ///
        /// `file` was opened by the shim's `x_open`; the other arguments
        /// are the method's, passed on unchanged.
        unsafe extern "C" fn $name(file: *mut ffi::sqlite3_file, $($arg: $ty),*) -> $ret {
            // SAFETY: see the function's contract.
            unsafe {
                let (inner, m) = $inner_of(file);
                match m.$field {
                    Some(f) => f(inner, $($arg),*),
                    None => $fallback,
                }
            }
        }
    };
}

/// The methods every shim forwards: size, locks, file controls, sector
/// size, device characteristics, shared memory and memory mapping.
#[allow(unused_macros)]
macro_rules! forward_common_file_methods {
    ($inner_of:path) => {
        forward_file!($inner_of; f_file_size, xFileSize, (out: *mut ffi::sqlite3_int64) -> c_int,
            ffi::SQLITE_IOERR_FSTAT);
        forward_file!($inner_of; f_lock, xLock, (level: c_int) -> c_int, ffi::SQLITE_IOERR_LOCK);
        forward_file!($inner_of; f_unlock, xUnlock, (level: c_int) -> c_int,
            ffi::SQLITE_IOERR_UNLOCK);
        forward_file!($inner_of; f_check_reserved_lock, xCheckReservedLock,
            (out: *mut c_int) -> c_int, ffi::SQLITE_IOERR_CHECKRESERVEDLOCK);
        // File controls pass through. The one that can change a file's
        // size, SQLITE_FCNTL_SIZE_HINT, only does so with a chunk size set
        // (SQLITE_FCNTL_CHUNK_SIZE), which the engine never sets.
        forward_file!($inner_of; f_file_control, xFileControl,
            (op: c_int, arg: *mut c_void) -> c_int, ffi::SQLITE_NOTFOUND);
        forward_file!($inner_of; f_sector_size, xSectorSize, () -> c_int, 4096);
        forward_file!($inner_of; f_device_characteristics, xDeviceCharacteristics, () -> c_int, 0);
        forward_file!($inner_of; f_shm_map, xShmMap,
            (region: c_int, size: c_int, extend: c_int, out: *mut *mut c_void) -> c_int,
            ffi::SQLITE_IOERR_SHMMAP);
        forward_file!($inner_of; f_shm_lock, xShmLock,
            (offset: c_int, n: c_int, flags: c_int) -> c_int, ffi::SQLITE_IOERR_SHMLOCK);
        forward_file!($inner_of; f_shm_barrier, xShmBarrier, () -> (), ());
        forward_file!($inner_of; f_shm_unmap, xShmUnmap, (delete: c_int) -> c_int, ffi::SQLITE_OK);
        forward_file!($inner_of; f_fetch, xFetch,
            (off: ffi::sqlite3_int64, amt: c_int, out: *mut *mut c_void) -> c_int,
            {
                // `out` is writable (xFetch's contract); NULL = no mapping.
                *out = ptr::null_mut();
                ffi::SQLITE_OK
            });
        forward_file!($inner_of; f_unfetch, xUnfetch,
            (off: ffi::sqlite3_int64, p: *mut c_void) -> c_int, ffi::SQLITE_OK);
    };
}

/// Opens the `unix` file object `inner` through `inner_vfs` with SQLite's
/// arguments. A failed unix open may still have set `pMethods`; then its
/// `xClose` runs here, since SQLite calls no `xClose` on a shim file whose
/// own open failed.
///
/// # Safety
///
/// `inner_vfs` is the unix VFS; `inner` points at its `szOsFile` writable
/// bytes; the other arguments are SQLite's `xOpen` arguments.
#[allow(dead_code)]
pub(crate) unsafe fn open_unix(
    inner_vfs: *mut rusqlite::ffi::sqlite3_vfs,
    z_name: rusqlite::ffi::sqlite3_filename,
    inner: *mut rusqlite::ffi::sqlite3_file,
    flags: std::ffi::c_int,
    out_flags: *mut std::ffi::c_int,
) -> std::ffi::c_int {
    // SAFETY: see the function's contract.
    unsafe {
        let open = (*inner_vfs).xOpen.expect("unix xOpen");
        let rc = open(inner_vfs, z_name, inner, flags, out_flags);
        if rc != rusqlite::ffi::SQLITE_OK {
            if let Some(close) = (*inner).pMethods.as_ref().and_then(|m| m.xClose) {
                close(inner);
            }
        }
        rc
    }
}
