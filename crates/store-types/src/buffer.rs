//! Buffers for whole entries held in memory (TUNING.md §puts-hashed-while-read).
//!
//! An entry the facade or an in-memory engine keeps whole (a kv-path put,
//! the mem engine's published stage) needs fresh memory the size of the
//! entry. On Linux every 4 KiB page of it costs a page fault on first
//! touch — on a VM several times more than on bare metal (a third of a
//! 64 MiB put's time, TUNING.md §multi-core-hashing). [`entry_buffer`] allocates large buffers
//! 2 MiB-aligned and advises the kernel to back them with transparent huge
//! pages (`madvise(MADV_HUGEPAGE)`; honoured when
//! `/sys/kernel/mm/transparent_hugepage/enabled` is `always` or
//! `madvise`), so a 64 MiB entry faults 32 times instead of 16 384.

use bytes::BytesMut;

/// Huge page size on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Entries at least this long get a huge-page-backed buffer: below it the
/// up to 2 MiB of address space skipped for alignment (never touched, so
/// never resident) is not worth it.
pub const HUGE_BUFFER_MIN: usize = 4 << 20;

/// An empty buffer with room for `len` bytes, allocated once.
///
/// From [`HUGE_BUFFER_MIN`] on (Linux), the buffer starts on a 2 MiB
/// boundary and its whole 2 MiB pages are advised as huge pages; the
/// tail past the last whole huge page stays in ordinary pages, so the
/// resident size is the entry's, not rounded up. The allocation is up to
/// 2 MiB larger than `len` (address space only: the skipped head is never
/// written). Elsewhere, and below the bound, it is
/// `BytesMut::with_capacity(len)`.
pub fn entry_buffer(len: usize) -> BytesMut {
    if len < HUGE_BUFFER_MIN || !cfg!(target_os = "linux") {
        return BytesMut::with_capacity(len);
    }
    let Some(room) = len.checked_add(HUGE_PAGE) else {
        return BytesMut::with_capacity(len);
    };
    let mut whole = BytesMut::with_capacity(room);
    let skip = whole.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
    // The aligned part, same allocation (no byte is copied or touched); the
    // skipped head is dropped as a handle, the memory stays allocated with
    // the rest until the last handle goes.
    let buf = whole.split_off(skip);
    drop(whole);
    advise_huge(&buf, len - len % HUGE_PAGE);
    buf
}

#[cfg(target_os = "linux")]
fn advise_huge(buf: &BytesMut, len: usize) {
    debug_assert!(buf.capacity() >= len);
    if len == 0 || !(buf.as_ptr() as usize).is_multiple_of(HUGE_PAGE) {
        return;
    }
    // SAFETY: the range is inside `buf`'s allocation (capacity ≥ len) and
    // starts on a page boundary. MADV_HUGEPAGE only sets an attribute of
    // the mapping; it never changes the memory's contents or validity, so
    // no Rust reference is affected. Failure (e.g. THP compiled out) only
    // means ordinary pages, so the result is ignored.
    unsafe {
        libc::madvise(buf.as_ptr() as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_buf: &BytesMut, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_are_aligned_and_hold_their_length() {
        let len = 8 * HUGE_PAGE + 123;
        let mut b = entry_buffer(len);
        assert!(b.capacity() >= len);
        assert!(b.is_empty());
        if cfg!(target_os = "linux") {
            assert!((b.as_ptr() as usize).is_multiple_of(HUGE_PAGE));
        }
        let before = b.as_ptr();
        b.extend_from_slice(&vec![7u8; len]);
        assert_eq!(b.as_ptr(), before, "filled without reallocating");
        assert!(b.iter().all(|&x| x == 7));
        let frozen = b.freeze();
        assert_eq!(frozen.len(), len);
    }

    #[test]
    fn small_buffers_are_plain() {
        let b = entry_buffer(1000);
        assert!(b.capacity() >= 1000);
        assert!(b.capacity() < HUGE_BUFFER_MIN);
    }
}
