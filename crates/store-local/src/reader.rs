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
//! - Otherwise an async read-ahead task sending owned chunks of
//!   [`STREAM_CHUNK`] bytes ([`BlobReader::from_chunks`]: read as bytes,
//!   or taken as they are by a consumer that forwards them, TUNING.md
//!   §response-chunks). At most [`READ_AHEAD_CHUNKS`] chunks of one read
//!   are **alive** at once — in the channel, in the consumer's hands, in
//!   an HTTP server's write queue — because each carries a permit of the
//!   read's budget that its last `Bytes` handle returns when dropped
//!   (ADR-057): a reader whose consumer stalls (a slow or stopped HTTP
//!   client) holds at most half a [`CHUNK_SIZE`] of buffers, the open file and
//!   no blocking-pool thread. The task waits for a permit in async code,
//!   then reads the next chunk inline when every byte of it is in the
//!   page cache (`preadv2(RWF_NOWAIT)`, on the roots where inline reads
//!   are on), else in a short blocking call (`spawn_blocking`) that reads
//!   only as many chunks as there are permits free and returns. For a
//!   whole-entry read each chunk is hashed before it is handed over (the
//!   `digest` of [`BlobReader::Chunks`]).
//! - The read-ahead task reads nothing until its consumer says how it
//!   takes the bytes ([`Demand`], ADR-084): at the first poll it streams
//!   as above; a consumer that keeps every byte anyway
//!   (`Chunks::collect`: `Blob::bytes`, `BlobReader::into_bytes`) gets
//!   the span read and hashed in one blocking call and sent as one buffer
//!   ([`read_rest`]), with no hand-off per chunk and no copy.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;

use bytes::Bytes;
use store_types::{BlobReader, Demand, Digest, Key, RangeRequest, Result, CHUNK_SIZE};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::cache::{release, OpenFile};
use crate::error::{blocking, io_err, is_absent};
use crate::Inner;

/// Chunks of one streamed read alive at once, wherever they are (the
/// read's budget of permits, ADR-057): one being sent while the next is
/// read.
pub(crate) const READ_AHEAD_CHUNKS: usize = 2;

/// A streamed read's chunk: its [`READ_AHEAD_CHUNKS`] live chunks add up
/// to half a [`CHUNK_SIZE`] (32 KiB each), so 600 stalled GETs stay under
/// 100 MiB of server memory (ADR-057).
pub(crate) const STREAM_CHUNK: usize = CHUNK_SIZE / (2 * READ_AHEAD_CHUNKS);

/// Most chunks one blocking call reads: with a consumer that keeps up,
/// the call returns at this bound rather than at an exhausted budget.
const MAX_CHUNKS_PER_CALL: usize = 16;

/// Largest whole-entry read done in one call — read and handed over as
/// one buffer — rather than streamed: what a streamed read may hold at
/// once anyway ([`READ_AHEAD_CHUNKS`] × [`STREAM_CHUNK`]), so a reader
/// whose consumer stalls holds no more memory either way (ADR-057; it was
/// 1 MiB, held whole by a stalled HTTP client).
pub(crate) const WHOLE_READ_MAX: u64 = (READ_AHEAD_CHUNKS * STREAM_CHUNK) as u64;

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

    fn on(&self) -> bool {
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
/// hashes it too ([`read_at_once`]). A longer span is opened in
/// one blocking call and streamed by a read-ahead task ([`read_ahead`]),
/// in short blocking calls that never wait for the consumer, until the
/// span is done or the reader is dropped. A streamed whole-entry read
/// carries the task's digest of the bytes it yields.
pub(crate) async fn open_entry(inner: &Arc<Inner>, key: &Key, want: Want) -> Result<Option<Found>> {
    let cached = inner.open_files.get(key);
    let was_cached = cached.is_some();
    if let Some(file) = cached {
        // `None`: longer than a chunk, streamed below.
        if let Some(found) = cached_read(inner, key, file, &want).await? {
            return Ok(Some(found));
        }
    }
    let path = inner.content_path(key);
    // A cached descriptor that could not answer means a long span: opening
    // it again inline would only be closed again.
    if !was_cached {
        if let Some(found) = uncached_inline_read(inner, key, &path, &want) {
            return Ok(Some(found));
        }
    }
    let (cache, k, w) = (inner.clone(), key.clone(), want.clone());
    let opening = path.clone();
    let Some(opened) = blocking(move || open_blocking(&cache, &k, &opening, &w)).await? else {
        return Ok(None);
    };
    let (file, size, span) = match opened {
        Opened::Inline { size, span, reader } => return Ok(Some((size, span, reader))),
        Opened::Streaming { file, size, span } => (file, size, span),
    };
    let len = span.end - span.start;
    let (tx, rx) = mpsc::channel(READ_AHEAD_CHUNKS);
    let (recycle, recycled) = std_mpsc::channel();
    let (digest_tx, digest_rx) = want.whole(size).then(oneshot::channel).unzip();
    let state = ReadAhead {
        inner: inner.clone(),
        file,
        path,
        pos: span.start,
        remaining: len,
        budget: Arc::new(Semaphore::new(READ_AHEAD_CHUNKS)),
        recycle,
        recycled,
        hash: digest_tx.map(|d| (Box::new(blake3::Hasher::new()), d)),
    };
    let (reader, demand) = BlobReader::from_chunks_on_demand(len, rx, digest_rx);
    tokio::spawn(read_ahead(state, tx, demand));
    Ok(Some((size, span, reader)))
}

/// A read through a cached descriptor: `None` when the span is longer than
/// a chunk (the caller streams it). Inline when it can be; else one
/// blocking `pread` of the same descriptor.
async fn cached_read(
    inner: &Arc<Inner>,
    key: &Key,
    file: Arc<OpenFile>,
    want: &Want,
) -> Result<Option<Found>> {
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
                release(file);
                return Ok(None);
            }
            Ok(span) => Some((size, span)),
            Err(e) => {
                release(file);
                return Err(e);
            }
        },
        None => None,
    };
    // Inline only for at most one chunk: a longer whole read is hashed,
    // which is not for a runtime worker.
    let inline_span = spanned
        .as_ref()
        .filter(|(_, span)| span.end - span.start <= CHUNK_SIZE as u64);
    if let Some((size, span)) = inline_span {
        match read_nowait(
            inner,
            &file.file,
            span.start,
            (span.end - span.start) as usize,
        ) {
            Nowait::Read(bytes) => {
                inner.inline.count(true);
                release(file);
                return Ok(Some((*size, span.clone(), BlobReader::from_bytes(bytes))));
            }
            Nowait::WouldBlock => {}
            Nowait::Unsupported => inner
                .inline
                .on
                .store(false, std::sync::atomic::Ordering::Relaxed),
        }
        inner.inline.count(false);
    }
    let (want, key, inner) = (want.clone(), key.clone(), inner.clone());
    // The descriptor is dropped in here, on the blocking thread.
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
            return Ok(None);
        }
        let reader = read_span(&file.file, &want, size, &span)
            .map_err(|e| io_err("reading", &inner.content_path(&key), e))?;
        Ok(Some((size, span, reader)))
    })
    .await
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
fn pread_nowait_into(
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
fn pread_nowait_into(
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

/// What the opening blocking call of a read found.
enum Opened {
    /// The span was read at once ([`read_at_once`]).
    Inline {
        size: u64,
        span: Range<u64>,
        reader: BlobReader,
    },
    /// The span (not read at once) is to be read from `file` (by
    /// position: `pread`).
    Streaming {
        file: File,
        size: u64,
        span: Range<u64>,
    },
}

/// The blocking half of opening a read: open, `fstat`, and for a span read
/// at once ([`read_at_once`]) `pread` it (caching the descriptor, unless a delete
/// ran meanwhile: the epoch is loaded before the open, see `cache.rs`).
/// `None` when there is no such file.
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
    Ok(Some(Opened::Streaming { file, size, span }))
}

/// What the read-ahead task carries from one read to the next.
struct ReadAhead {
    inner: Arc<Inner>,
    file: File,
    path: PathBuf,
    /// Where the next chunk starts in the file.
    pos: u64,
    /// Bytes still to read.
    remaining: u64,
    /// The read's live-chunk budget ([`READ_AHEAD_CHUNKS`] permits): a
    /// chunk is read only with a permit, which its buffer keeps until the
    /// last `Bytes` handle on it is dropped ([`Recycled`]).
    budget: Arc<Semaphore>,
    /// Where a sent chunk's buffer goes back once its last `Bytes` handle
    /// is dropped ([`Recycled`]).
    recycle: std_mpsc::Sender<Vec<u8>>,
    /// Buffers handed back.
    recycled: std_mpsc::Receiver<Vec<u8>>,
    /// For a whole-file read: the hash of the bytes sent so far, and where
    /// its digest goes at the end.
    hash: Option<(Box<blake3::Hasher>, oneshot::Sender<Digest>)>,
}

/// A slot in the channel to the reader and a permit of the read's budget:
/// what sending one chunk takes.
type Room = (mpsc::OwnedPermit<io::Result<Bytes>>, OwnedSemaphorePermit);

/// The read-ahead task behind a streamed [`open_entry`]: an async task
/// that waits for a permit of the read's budget — for the consumer (or
/// the socket it writes to) to let go of a chunk — and then reads the
/// next chunk: inline when it is all in the page cache ([`read_inline`]),
/// else in one blocking call ([`read_some`]) that reads as many
/// [`STREAM_CHUNK`] chunks as there are permits free.
///
/// No thread ever waits for the consumer: the waiting is done here, in
/// async code. A reader whose consumer stalls thus holds no blocking
/// thread, only its live chunks ([`READ_AHEAD_CHUNKS`]). The task ends
/// when the range is read, a read fails (the error is the last thing
/// sent) or the reader is dropped (the file is then closed on a blocking
/// thread).
async fn read_ahead(
    mut state: ReadAhead,
    mut tx: mpsc::Sender<io::Result<Bytes>>,
    demand: oneshot::Receiver<Demand>,
) {
    match demand.await {
        Ok(Demand::Stream) => {}
        Ok(Demand::Collect) => {
            // Detached: the reader awaits its end on the channel.
            drop(tokio::task::spawn_blocking(move || read_rest(state, tx)));
            return;
        }
        Err(_) => {
            close_off_runtime(state.file);
            return; // Reader dropped unpolled.
        }
    }
    loop {
        let budget = state.budget.clone();
        let live = tokio::select! {
            live = budget.acquire_owned() => live,
            () = tx.closed() => {
                close_off_runtime(state.file);
                return; // Reader dropped.
            }
        };
        // The semaphore is never closed.
        let Ok(live) = live else { return };
        let Ok(slot) = tx.reserve_owned().await else {
            close_off_runtime(state.file);
            return; // Reader dropped.
        };
        let room = match read_inline(&mut state, (slot, live)) {
            Ok(Some(t)) => {
                tx = t;
                continue;
            }
            Ok(None) => {
                close_off_runtime(state.file);
                return; // Done.
            }
            Err(room) => room,
        };
        match tokio::task::spawn_blocking(move || read_some(state, room)).await {
            Ok(Some((s, t))) => (state, tx) = (s, t),
            // Done, failed (the error is sent) or reader dropped; a panic
            // drops the sender early, which the reader reports.
            Ok(None) | Err(_) => return,
        }
    }
}

/// The next chunk read in the task itself when inline reads are on and
/// every byte of it is in the page cache (`preadv2(RWF_NOWAIT)`), then
/// hashed (for a whole-file read: 64 KiB, ~15 µs) and sent: `Ok` as
/// [`send_chunk`] answers. `Err(room)` when it would have waited: the
/// blocking call reads it.
fn read_inline(
    state: &mut ReadAhead,
    room: Room,
) -> std::result::Result<Option<mpsc::Sender<io::Result<Bytes>>>, Room> {
    if !state.inner.inline.on() {
        return Err(room);
    }
    let n = state.remaining.min(STREAM_CHUNK as u64) as usize;
    let spare = state.recycled.try_recv().ok();
    match pread_nowait_into(&state.inner, &state.file, state.pos, n, spare) {
        Ok(buf) => Ok(send_chunk(state, room, Ok(buf))),
        Err(spare) => {
            if let Some(buf) = spare {
                // Back in the queue, for the blocking call.
                let _ = state.recycle.send(buf);
            }
            Err(room)
        }
    }
}

/// One blocking call of [`read_ahead`]: reads chunks — the first into
/// `room`, each further one only if a slot and a permit are free at once —
/// hashing each (for a whole-file read) right after reading it. Returns
/// the state and the sender when more is to be read; `None` when done
/// (digest sent), failed (error sent) or the reader is gone. The file is
/// closed here, on the blocking thread, when done.
///
/// Chunks are `Vec`s sent as `Bytes` that hand their buffer back through
/// `recycled` once the consumer drops them — copied out by the byte view,
/// or written to a socket by a consumer that took them whole (TUNING.md
/// §response-chunks); they are read into again, so a read allocates only
/// the few buffers in flight at once, and fresh ones are read into
/// without zero-filling them first ([`pread_fill`]).
fn read_some(
    mut state: ReadAhead,
    mut room: Room,
) -> Option<(ReadAhead, mpsc::Sender<io::Result<Bytes>>)> {
    let mut chunks_left = MAX_CHUNKS_PER_CALL;
    loop {
        let n = state.remaining.min(STREAM_CHUNK as u64) as usize;
        let spare = state.recycled.try_recv().ok();
        let read = pread_fill(&state.file, state.pos, n, spare);
        let tx = send_chunk(&mut state, room, read)?;
        chunks_left -= 1;
        if chunks_left == 0 {
            return Some((state, tx));
        }
        let Ok(live) = state.budget.clone().try_acquire_owned() else {
            return Some((state, tx));
        };
        room = match tx.try_reserve_owned() {
            Ok(slot) => (slot, live),
            Err(mpsc::error::TrySendError::Full(tx)) => return Some((state, tx)),
            Err(mpsc::error::TrySendError::Closed(_)) => return None,
        };
    }
}

/// A read whose consumer keeps every byte ([`Demand::Collect`]), in one
/// blocking call: the rest of the span read into one buffer, hashed (on
/// every core when large, `digest_of`) for a whole-file read, and sent as
/// one chunk, outside the live-chunk budget — the consumer holds all of it
/// anyway. The file is closed here.
fn read_rest(mut state: ReadAhead, tx: mpsc::Sender<io::Result<Bytes>>) {
    // An entry too large for memory fails the read rather than the process.
    let room = |n: usize| {
        let mut buf = Vec::new();
        buf.try_reserve_exact(n).ok().map(|()| (n, buf))
    };
    let read = usize::try_from(state.remaining)
        .ok()
        .and_then(room)
        .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "entry larger than memory"))
        .and_then(|(n, buf)| pread_fill(&state.file, state.pos, n, Some(buf)));
    let buf = match read {
        Ok(buf) => buf,
        Err(e) => {
            let e = io::Error::new(e.kind(), format!("reading {}: {e}", state.path.display()));
            let _ = tx.try_send(Err(e));
            return;
        }
    };
    let digest = state
        .hash
        .take()
        .map(|(_, to)| (store_types::outboard::digest_of(&buf), to));
    // The channel is empty: nothing was sent before the demand.
    if tx.try_send(Ok(Bytes::from(buf))).is_ok() {
        if let Some((digest, to)) = digest {
            let _ = to.send(digest);
        }
    }
}

/// Hands one chunk read at `state.pos` to the reader through `room`,
/// hashing it first for a whole-file read, and moves on: the sender when
/// more is to be read; `None` when that was the last chunk (digest sent)
/// or the read failed (error sent).
fn send_chunk(
    state: &mut ReadAhead,
    (slot, live): Room,
    read: io::Result<Vec<u8>>,
) -> Option<mpsc::Sender<io::Result<Bytes>>> {
    let buf = match read {
        Ok(buf) => buf,
        Err(e) => {
            let e = io::Error::new(e.kind(), format!("reading {}: {e}", state.path.display()));
            slot.send(Err(e));
            return None;
        }
    };
    if let Some((h, _)) = state.hash.as_mut() {
        h.update(&buf);
    }
    let n = buf.len() as u64;
    let tx = slot.send(Ok(Recycled::bytes(buf, &state.recycle, live)));
    state.pos += n;
    state.remaining -= n;
    if state.remaining > 0 {
        return Some(tx);
    }
    if let Some((h, digest)) = state.hash.take() {
        // The reader may be gone already; then nobody awaits it.
        let _ = digest.send(Digest::from(h.finalize()));
    }
    None
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
fn pread_fill(file: &File, offset: u64, n: usize, spare: Option<Vec<u8>>) -> io::Result<Vec<u8>> {
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

/// A streamed read's chunk buffer, sent back to the task for reuse when
/// the last `Bytes` handle on it is dropped, together with the permit of
/// the read's budget it holds (released right after the buffer is back,
/// so the task that the permit wakes finds it).
struct Recycled {
    buf: Vec<u8>,
    to: std_mpsc::Sender<Vec<u8>>,
    _live: OwnedSemaphorePermit,
}

impl Recycled {
    fn bytes(buf: Vec<u8>, to: &std_mpsc::Sender<Vec<u8>>, live: OwnedSemaphorePermit) -> Bytes {
        Bytes::from_owner(Recycled {
            buf,
            to: to.clone(),
            _live: live,
        })
    }
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        if buf.capacity() > 0 {
            // The task may have finished: then the buffer is freed.
            let _ = self.to.send(buf);
        }
    }
}
