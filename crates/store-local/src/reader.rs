//! Reads: none, one or a few hand-offs.
//!
//! - **Inline** (TUNING.md §local-small-reads): a read of at most one chunk of an entry whose
//!   descriptor is in the open-file cache (`cache.rs`) is done in the
//!   calling task — `fstat` of the open descriptor, then
//!   `preadv2(…, RWF_NOWAIT)`, which copies the bytes only if every one
//!   of them is in the page cache and fails with `EAGAIN` rather than
//!   wait for the disk. Linux only, and only on a root on local media
//!   (see [`Inline`]).
//! - **Inline, not yet cached** (Linux ≥ 5.12, TUNING.md
//!   §local-uncached-reads): a read of at most one chunk whose descriptor
//!   is not cached first tries `openat2(…, RESOLVE_CACHED)`, which opens
//!   the file only if every path component is in the dentry cache and
//!   otherwise fails with `EAGAIN` rather than wait for the disk; then
//!   `fstat` of the new descriptor and the same `RWF_NOWAIT` read. A
//!   descriptor so opened goes into the open-file cache; any miss goes to
//!   the blocking pool below as before.
//! - **One blocking call** for a read of at most one chunk otherwise, and
//!   for a whole entry of at most [`WHOLE_READ_MAX`] (hashed in the
//!   same call, so a verified get does not hash it again and takes the
//!   buffer without a copy): `pread` of the cached descriptor when the
//!   inline read would have waited (or hashes), else open, `fstat`,
//!   `pread` (the descriptor then goes into the cache).
//! - Otherwise a streamed read (`stream.rs`, ADR-085) of owned chunks of
//!   [`STREAM_CHUNK`] bytes ([`BlobReader::from_pull`]: read as bytes, or
//!   taken as they are by a consumer that forwards them, TUNING.md
//!   §response-chunks), from the cached descriptor when there is one
//!   (else one opened, and cached, in one blocking call). Each chunk is
//!   read when the consumer polls for it, in the consumer's task: inline
//!   when every byte of it is in the page cache, else in a short blocking
//!   call the poll awaits. At most [`LIVE_CHUNKS`] chunk of one read is
//!   **alive** at once — in the consumer's hands, in an HTTP server's
//!   write queue — because each carries a permit of the read's budget
//!   that its last `Bytes` handle returns when dropped (ADR-057,
//!   ADR-086): a reader whose consumer stalls (a slow or stopped HTTP client) holds at
//!   most half a [`CHUNK_SIZE`] of buffers, the open file and no
//!   blocking-pool thread. For a whole-entry read each chunk is hashed as
//!   it is read (the `digest` of [`BlobReader::Chunks`]). A consumer that
//!   keeps every byte anyway (`Chunks::collect`: `Blob::bytes`,
//!   `BlobReader::into_bytes`, ADR-084) gets the span read and hashed in
//!   one blocking call, as one buffer.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use store_types::{BlobReader, Digest, Key, RangeRequest, Result, CHUNK_SIZE};

use crate::cache::{release, OpenFile};
use crate::error::{blocking, io_err, is_absent};
use crate::Inner;

/// Chunks of one streamed read alive at once, wherever they are (the
/// read's budget of permits, ADR-057): one. The next chunk is read when
/// the consumer has let go of the last one — written it into the socket —
/// which costs a page-cached read nothing, as it is read in the
/// consumer's task anyway (ADR-085, ADR-086).
pub(crate) const LIVE_CHUNKS: usize = 1;

/// A streamed read's chunk, 64 KiB: its [`LIVE_CHUNKS`] live chunks add
/// up to half a [`CHUNK_SIZE`], so 600 stalled GETs stay under 100 MiB of
/// server memory (ADR-057). One chunk of 64 KiB per step costs ~15 %
/// less server CPU per 1 MiB GET than two of 32 KiB (median of seven
/// alternated runs each), and less than one of 128 KiB (ADR-086).
pub(crate) const STREAM_CHUNK: usize = CHUNK_SIZE / 2;

/// Largest whole-entry read done in one call — read and handed over as
/// one buffer — rather than streamed: what a streamed read may hold at
/// once anyway ([`LIVE_CHUNKS`] × [`STREAM_CHUNK`]), so a reader
/// whose consumer stalls holds no more memory either way (ADR-057; it was
/// 1 MiB, held whole by a stalled HTTP client).
pub(crate) const WHOLE_READ_MAX: u64 = (LIVE_CHUNKS * STREAM_CHUNK) as u64;

/// What a read wants of an entry.
#[derive(Clone, Debug)]
pub(crate) enum Want {
    /// All of it (hashed on the way when streamed).
    Whole,
    /// What the request's span is once the size is known.
    Sized(RangeRequest),
}

impl Want {
    /// The bytes to read of an entry of `size` bytes.
    fn span(&self, size: u64) -> Result<Range<u64>> {
        match self {
            Want::Whole => Ok(0..size),
            Want::Sized(req) => req.span(size),
        }
    }

    /// Whether a streamed read of an entry of `size` bytes is of all of
    /// it (and so is hashed as it streams).
    fn whole(&self, size: u64) -> bool {
        match self {
            Want::Whole => true,
            Want::Sized(req) => req.reads_whole(size),
        }
    }
}

/// Whether `span` of an entry of `size` bytes is read in one blocking call
/// rather than streamed: at most one chunk, or a whole entry of at most
/// [`WHOLE_READ_MAX`] bytes (hashed there too).
fn read_at_once(want: &Want, size: u64, span: &Range<u64>) -> bool {
    let len = span.end - span.start;
    len <= CHUNK_SIZE as u64 || (len <= WHOLE_READ_MAX && want.whole(size))
}

/// Reads `span` of `file` for a read done at once ([`read_at_once`]): a
/// span of more than one chunk is a whole entry, hashed here, on the
/// blocking thread, so a verified read does not hash it again.
fn read_span(file: &File, want: &Want, size: u64, span: &Range<u64>) -> io::Result<BlobReader> {
    let len = (span.end - span.start) as usize;
    let bytes = pread_exact(file, span.start, len)?;
    if len <= CHUNK_SIZE {
        return Ok(BlobReader::from_bytes(bytes));
    }
    debug_assert!(want.whole(size) && span.start == 0);
    let digest = Digest::from(blake3::hash(&bytes));
    Ok(BlobReader::hashed_bytes(bytes, digest))
}

/// What a read found: the entry's size, the span it reads, the reader.
pub(crate) type Found = (u64, Range<u64>, BlobReader);

/// Whether the inline path may run on a root (see the module docs), and
/// which way each inline attempt went (counted for tests).
#[derive(Default)]
pub(crate) struct Inline {
    /// Inline reads are on: Linux, a root on local media, an open-file
    /// cache. Cleared for good when the file system refuses `RWF_NOWAIT`.
    pub(crate) on: std::sync::atomic::AtomicBool,
    /// Uncached reads may try an inline `openat2(RESOLVE_CACHED)`. Cleared
    /// for good when the kernel refuses it (before Linux 5.12).
    pub(crate) open_on: std::sync::atomic::AtomicBool,
    /// Reads whose file was opened inline and read inline.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) opened_inline: std::sync::atomic::AtomicU64,
    /// Test hook: every inline attempt behaves as if it had hit `EAGAIN`.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) force_would_block: std::sync::atomic::AtomicBool,
    /// Reads served inline.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) served: std::sync::atomic::AtomicU64,
    /// Reads of a cached descriptor that went to the blocking pool.
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fell_back: std::sync::atomic::AtomicU64,
}

impl Inline {
    /// The inline state of a root: on only where `wanted` (an open-file
    /// cache exists) and the root is on local media.
    pub(crate) fn new(root: &Path, wanted: bool) -> Self {
        let me = Inline::default();
        let on = wanted && local_media(root);
        me.on.store(on, std::sync::atomic::Ordering::Relaxed);
        me.open_on.store(on, std::sync::atomic::Ordering::Relaxed);
        me
    }

    pub(crate) fn on(&self) -> bool {
        self.on.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn count(&self, served: bool) {
        #[cfg(any(test, feature = "testing"))]
        {
            let c = if served {
                &self.served
            } else {
                &self.fell_back
            };
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let _ = served;
    }
}

/// Opens a read of `want` of `key`'s entry, or `None` when it is absent.
///
/// A span of at most [`CHUNK_SIZE`] bytes is read at once: inline when
/// the entry's descriptor is cached and its bytes are in the page cache,
/// else in one blocking call (the cached descriptor's `pread`, or open,
/// `fstat`, `pread`, caching the descriptor). So is a whole entry of at
/// most [`WHOLE_READ_MAX`] bytes, always in the blocking call, which
/// hashes it too ([`read_at_once`]). A longer span is streamed from the
/// cached descriptor (or one opened, and cached, in one blocking call),
/// each chunk read as the consumer polls for it (`stream.rs`, ADR-085); a
/// streamed whole-entry read carries the digest of the bytes it yields.
pub(crate) async fn open_entry(inner: &Arc<Inner>, key: &Key, want: Want) -> Result<Option<Found>> {
    let opened = match inner.open_files.get(key) {
        Some(file) => cached_read(inner, key, file, &want).await?,
        None => {
            let path = inner.content_path(key);
            if let Some(found) = uncached_inline_read(inner, key, &path, &want) {
                return Ok(Some(found));
            }
            let (cache, k, w) = (inner.clone(), key.clone(), want.clone());
            match blocking(move || open_blocking(&cache, &k, &path, &w)).await? {
                Some(opened) => opened,
                None => return Ok(None),
            }
        }
    };
    Ok(Some(match opened {
        Opened::Inline { size, span, reader } => (size, span, reader),
        Opened::Streaming { file, size, span } => {
            let reader = crate::stream::open(inner, key, file, want.whole(size), span.clone());
            (size, span, reader)
        }
    }))
}

/// A read through a cached descriptor: inline when it can be, else one
/// blocking `pread` of the same descriptor; a span longer than a read at
/// once ([`read_at_once`]) is left to stream from the descriptor.
async fn cached_read(
    inner: &Arc<Inner>,
    key: &Key,
    file: Arc<OpenFile>,
    want: &Want,
) -> Result<Opened> {
    let inline = inner.inline.on();
    let size = if inline {
        // `fstat` of an open descriptor on local media reads the in-memory
        // inode: it does not wait for the disk.
        match file.file.metadata() {
            Ok(m) => Some(m.len()),
            Err(_) => None,
        }
    } else {
        None
    };
    let spanned = match size {
        Some(size) => match want.span(size) {
            Ok(span) if !read_at_once(want, size, &span) => {
                return Ok(Opened::Streaming { file, size, span });
            }
            Ok(span) => Some((size, span)),
            Err(e) => {
                release(file);
                return Err(e);
            }
        },
        None => None,
    };
    if let Some((size, span)) = &spanned {
        if let Some(bytes) = cached_inline(inner, &file.file, span) {
            release(file);
            let reader = BlobReader::from_bytes(bytes);
            let (size, span) = (*size, span.clone());
            return Ok(Opened::Inline { size, span, reader });
        }
    }
    let (want, key, inner) = (want.clone(), key.clone(), inner.clone());
    // The descriptor is dropped in here, on the blocking thread, unless
    // the span streams from it.
    blocking(move || {
        let size = match spanned {
            Some((size, _)) => size,
            None => file
                .file
                .metadata()
                .map_err(|e| io_err("stat", &inner.content_path(&key), e))?
                .len(),
        };
        let span = want.span(size)?;
        if !read_at_once(&want, size, &span) {
            return Ok(Opened::Streaming { file, size, span });
        }
        let reader = read_span(&file.file, &want, size, &span)
            .map_err(|e| io_err("reading", &inner.content_path(&key), e))?;
        Ok(Opened::Inline { size, span, reader })
    })
    .await
}

/// `span` of a cached descriptor's file read in the calling task, when it
/// is at most one chunk (a longer whole read is hashed, which is not for a
/// runtime worker) and all in the page cache.
fn cached_inline(inner: &Inner, file: &File, span: &Range<u64>) -> Option<Bytes> {
    if span.end - span.start > CHUNK_SIZE as u64 {
        return None;
    }
    match read_nowait(inner, file, span.start, (span.end - span.start) as usize) {
        Nowait::Read(bytes) => {
            inner.inline.count(true);
            return Some(bytes);
        }
        Nowait::WouldBlock => {}
        Nowait::Unsupported => inner
            .inline
            .on
            .store(false, std::sync::atomic::Ordering::Relaxed),
    }
    inner.inline.count(false);
    None
}

/// A read of at most one chunk of an entry whose descriptor is not
/// cached, done in the calling task when nothing in it can wait for the
/// disk: `openat2(RESOLVE_CACHED)` (the path's dentries and the inode are
/// in memory), `fstat` of the new descriptor, `preadv2(RWF_NOWAIT)`. The
/// descriptor then goes into the open-file cache (unless a delete ran
/// since the epoch was loaded, as on the blocking path). `None` on any
/// miss, absence or error: the blocking path then does the read and
/// reports what it finds.
fn uncached_inline_read(inner: &Arc<Inner>, key: &Key, path: &Path, want: &Want) -> Option<Found> {
    use std::sync::atomic::Ordering::Relaxed;
    if !inner.inline.on() || !inner.inline.open_on.load(Relaxed) {
        return None;
    }
    let seen = inner.open_files.epoch();
    let file = match open_cached(path) {
        OpenCached::Opened(f) => f,
        OpenCached::WouldBlock => return None,
        OpenCached::Unsupported => {
            inner.inline.open_on.store(false, Relaxed);
            return None;
        }
    };
    let give_up = |file: File| {
        close_off_runtime(file);
        None
    };
    let size = match file.metadata() {
        Ok(m) if m.is_file() => m.len(),
        _ => return give_up(file),
    };
    let span = match want.span(size) {
        Ok(span)
            if read_at_once(want, size, &span) && span.end - span.start <= CHUNK_SIZE as u64 =>
        {
            span
        }
        _ => return give_up(file),
    };
    match read_nowait(inner, &file, span.start, (span.end - span.start) as usize) {
        Nowait::Read(bytes) => {
            #[cfg(any(test, feature = "testing"))]
            inner.inline.opened_inline.fetch_add(1, Relaxed);
            if inner.open_files.enabled() {
                release(inner.open_files.offer(key, file, seen));
            } else {
                close_off_runtime(file);
            }
            Some((size, span, BlobReader::from_bytes(bytes)))
        }
        Nowait::WouldBlock => give_up(file),
        Nowait::Unsupported => {
            inner.inline.on.store(false, Relaxed);
            give_up(file)
        }
    }
}

/// What [`open_cached`] did.
enum OpenCached {
    /// The file, opened read-only without waiting for the disk.
    Opened(File),
    /// Opening would have waited (a path component not in the dentry
    /// cache), or failed: the blocking path opens and reports.
    WouldBlock,
    /// The kernel has no `openat2` or no `RESOLVE_CACHED`.
    Unsupported,
}

/// `openat2(path, O_RDONLY | O_NOATIME | O_CLOEXEC, RESOLVE_CACHED)`:
/// opens only from the dentry cache, never waiting for the disk.
#[cfg(target_os = "linux")]
fn open_cached(path: &Path) -> OpenCached {
    use std::os::fd::FromRawFd;
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return OpenCached::WouldBlock;
    };
    // SAFETY: `open_how` is plain data; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOATIME) as u64;
    how.resolve = libc::RESOLVE_CACHED;
    // SAFETY: a NUL-terminated path, a valid `open_how` and its size; the
    // call only returns a new descriptor or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd >= 0 {
        // SAFETY: a descriptor the call just opened, owned by nobody else.
        return OpenCached::Opened(unsafe { File::from_raw_fd(fd as i32) });
    }
    match io::Error::last_os_error().raw_os_error() {
        // No openat2 (before 5.6), or no RESOLVE_CACHED (before 5.12).
        Some(libc::ENOSYS) | Some(libc::EINVAL) | Some(libc::E2BIG) => OpenCached::Unsupported,
        // EAGAIN (not all cached), ENOENT, EPERM (O_NOATIME on a file the
        // process does not own), ...: the blocking path decides.
        _ => OpenCached::WouldBlock,
    }
}

#[cfg(not(target_os = "linux"))]
fn open_cached(_path: &Path) -> OpenCached {
    OpenCached::Unsupported
}

/// What [`read_nowait`] did.
enum Nowait {
    /// All the bytes, from the page cache.
    Read(Bytes),
    /// Some byte is not in the page cache (or the file is shorter than
    /// expected): the blocking path reads (and reports) it.
    WouldBlock,
    /// The file system does not do `RWF_NOWAIT`.
    Unsupported,
}

/// `preadv2(fd, len bytes at offset, RWF_NOWAIT)`: the bytes only if all
/// of them are in the page cache, without ever waiting for the disk.
fn read_nowait(inner: &Inner, file: &File, offset: u64, len: usize) -> Nowait {
    match pread_nowait_into(inner, file, offset, len, None) {
        Ok(buf) => Nowait::Read(Bytes::from(buf)),
        Err(_) if !inner.inline.on() => Nowait::Unsupported,
        Err(_) => Nowait::WouldBlock,
    }
}

/// [`read_nowait`] into `spare` (when large enough) or a new buffer:
/// `Err` with the buffer back when some byte is not in the page cache, the
/// file is shorter, or the file system does not do `RWF_NOWAIT` (inline
/// reads are then turned off for the root).
#[cfg(target_os = "linux")]
pub(crate) fn pread_nowait_into(
    inner: &Inner,
    file: &File,
    offset: u64,
    len: usize,
    spare: Option<Vec<u8>>,
) -> std::result::Result<Vec<u8>, Option<Vec<u8>>> {
    use std::os::fd::AsRawFd;
    #[cfg(any(test, feature = "testing"))]
    if inner
        .inline
        .force_would_block
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        return Err(spare);
    }
    let Ok(offset) = libc::off_t::try_from(offset) else {
        return Err(spare);
    };
    let mut buf = spare
        .filter(|b| b.capacity() >= len)
        .unwrap_or_else(|| Vec::with_capacity(len));
    buf.clear();
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    // SAFETY: `iov` describes `len` bytes of `buf`'s spare capacity (its
    // capacity is at least `len`), which outlives the call; the kernel
    // writes at most `len` bytes there.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
    if n < 0 {
        if let Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) | Some(libc::EINVAL) =
            io::Error::last_os_error().raw_os_error()
        {
            inner
                .inline
                .on
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        return Err(Some(buf));
    }
    if n as usize != len {
        // Partly cached, or the file is shorter than it was: the blocking
        // read decides.
        return Err(Some(buf));
    }
    // SAFETY: the kernel initialised exactly `len` bytes (checked above).
    unsafe { buf.set_len(len) };
    Ok(buf)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn pread_nowait_into(
    _inner: &Inner,
    _file: &File,
    _offset: u64,
    _len: usize,
    spare: Option<Vec<u8>>,
) -> std::result::Result<Vec<u8>, Option<Vec<u8>>> {
    Err(spare)
}

/// Whether `root` is on media whose `fstat` and page-cache reads never
/// wait on a network: not NFS, SMB/CIFS, FUSE, Ceph, AFS, 9p, Lustre or a
/// cluster file system.
#[cfg(target_os = "linux")]
fn local_media(root: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(root.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid out-pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return false;
    }
    const REMOTE: [i64; 11] = [
        0x6969,      // NFS
        0xFF53_4D42, // CIFS
        0xFE53_4D42, // SMB2
        0x517B,      // SMB
        0x6573_5546, // FUSE
        0x00C3_6400, // Ceph
        0x5346_414F, // AFS
        0x0102_1997, // 9p
        0x0BD0_0BD0, // Lustre
        0x0116_1970, // GFS2
        0x7461_636F, // OCFS2
    ];
    #[allow(clippy::unnecessary_cast)]
    let kind = st.f_type as i64;
    !REMOTE.contains(&kind)
}

#[cfg(not(target_os = "linux"))]
fn local_media(_root: &Path) -> bool {
    false
}

/// How a read goes on once its entry's size is known.
enum Opened {
    /// The span was read at once ([`read_at_once`]).
    Inline {
        size: u64,
        span: Range<u64>,
        reader: BlobReader,
    },
    /// The span (not read at once) streams from `file` (by position:
    /// `pread`), the open-file cache's descriptor when it has one.
    Streaming {
        file: Arc<OpenFile>,
        size: u64,
        span: Range<u64>,
    },
}

/// The blocking half of opening a read: open, `fstat`, and for a span read
/// at once ([`read_at_once`]) `pread` it; the descriptor goes into the
/// open-file cache either way, unless a delete ran meanwhile (the epoch is
/// loaded before the open, see `cache.rs`). `None` when there is no such
/// file.
fn open_blocking(inner: &Inner, key: &Key, path: &Path, want: &Want) -> Result<Option<Opened>> {
    let seen = inner.open_files.epoch();
    let Some((file, size)) = open_file(path)? else {
        return Ok(None);
    };
    let span = want.span(size)?;
    if read_at_once(want, size, &span) {
        let reader = read_span(&file, want, size, &span).map_err(|e| io_err("reading", path, e))?;
        if inner.open_files.enabled() {
            drop(inner.open_files.offer(key, file, seen));
        }
        return Ok(Some(Opened::Inline { size, span, reader }));
    }
    let file = inner.open_files.offer(key, file, seen);
    Ok(Some(Opened::Streaming { file, size, span }))
}

/// Closes `file` on a blocking thread (`close(2)` may wait on the server
/// on network file systems).
fn close_off_runtime(file: File) {
    drop(tokio::task::spawn_blocking(move || drop(file)));
}

/// Opens `path` and returns it with its size; `None` when there is no such
/// file (or the name is not a regular file).
fn open_file(path: &Path) -> Result<Option<(File, u64)>> {
    let file = match open_noatime(path) {
        Ok(f) => f,
        Err(e) if is_absent(&e) => return Ok(None),
        Err(e) => return Err(io_err("opening", path, e)),
    };
    let meta = file.metadata().map_err(|e| io_err("stat", path, e))?;
    if !meta.is_file() {
        return Ok(None);
    }
    Ok(Some((file, meta.len())))
}

/// Opens `path` read-only, without updating its access time where the
/// process may ask that (Linux `O_NOATIME`, for files it owns): a read
/// then never dirties the inode, inline or not.
fn open_noatime(path: &Path) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOATIME)
            .open(path)
        {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
            other => return other,
        }
    }
    File::open(path)
}

/// Reads exactly `n` bytes at `offset` (`pread`, no seek) into a buffer
/// that is not zero-filled first (the kernel writes every byte the result
/// holds); a file that ends early is an error.
pub(crate) fn pread_exact(file: &File, offset: u64, n: usize) -> io::Result<Bytes> {
    pread_fill(file, offset, n, None).map(Bytes::from)
}

/// Reads exactly `n` bytes at `offset` into `spare` (a buffer handed back
/// once the last `Bytes` of its chunk was dropped, used when it is large
/// enough) or a new buffer, neither zero-filled first: the kernel writes
/// into the spare capacity and every byte the result holds. A file that
/// ends early is an error.
pub(crate) fn pread_fill(
    file: &File,
    offset: u64,
    n: usize,
    spare: Option<Vec<u8>>,
) -> io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf = spare
        .filter(|b| b.capacity() >= n)
        .unwrap_or_else(|| Vec::with_capacity(n));
    buf.clear();
    while buf.len() < n {
        let done = buf.len();
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset out of range"))?;
        // SAFETY: the destination is the `n - done` bytes of spare capacity
        // of `buf` (its capacity is at least `n`), which outlives the
        // call; the kernel writes at most that many bytes there and
        // reports how many.
        let got = unsafe {
            libc::pread(
                file.as_raw_fd(),
                buf.as_mut_ptr().add(done).cast(),
                n - done,
                at,
            )
        };
        match got {
            0 => return Err(short_file(io::ErrorKind::UnexpectedEof.into())),
            g if g < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // SAFETY: the kernel initialised `g` more bytes after `done`.
            g => unsafe { buf.set_len(done + g as usize) },
        }
    }
    Ok(buf)
}

/// Names an early end of file as what it means here.
fn short_file(e: io::Error) -> io::Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        io::Error::new(e.kind(), "stored file is shorter than its recorded size")
    } else {
        e
    }
}
