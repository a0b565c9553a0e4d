//! Payloads: incompressible bytes, made unique per put without copying the
//! body (a counter is stamped into the first bytes of a reused buffer).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// One KiB.
pub const KIB: usize = 1024;
/// One MiB.
pub const MIB: usize = 1024 * 1024;

/// The put/get sizes of SPEC §10.
pub const SIZES: [usize; 4] = [KIB, 64 * KIB, MIB, 64 * MIB];

/// A short human name for a byte size (`1 KiB`, `64 MiB`, ...).
pub fn size_name(size: usize) -> String {
    if size >= MIB && size.is_multiple_of(MIB) {
        format!("{} MiB", size / MIB)
    } else if size >= KIB && size.is_multiple_of(KIB) {
        format!("{} KiB", size / KIB)
    } else {
        format!("{size} B")
    }
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A per-process salt, so that two runs against one database never produce
/// the same content.
fn salt() -> u64 {
    static SALT: OnceLock<u64> = OnceLock::new();
    *SALT.get_or_init(store_types::layout::random_salt)
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A process-wide unique number.
pub fn unique() -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// Fills `buf` with pseudo-random (incompressible) bytes from `seed`.
pub fn fill_random(buf: &mut [u8], seed: u64) {
    let mut s = splitmix(seed ^ salt());
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        s = splitmix(s);
        c.copy_from_slice(&s.to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let last = splitmix(s).to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// Stamps a process-unique 16-byte tag into the start of `buf` (fewer bytes
/// when `buf` is shorter).
pub fn stamp(buf: &mut [u8]) {
    let mut tag = [0u8; 16];
    tag[..8].copy_from_slice(&unique().to_le_bytes());
    tag[8..].copy_from_slice(&salt().to_le_bytes());
    let n = buf.len().min(16);
    buf[..n].copy_from_slice(&tag[..n]);
}

/// A fresh unique random body of `size` bytes.
pub fn unique_body(size: usize) -> Vec<u8> {
    let mut v = vec![0u8; size];
    fill_random(&mut v, unique());
    stamp(&mut v);
    v
}

/// `len` fresh random bytes, the first 8 a process-unique number (fewer
/// when `len` is shorter).
pub fn random_bytes(len: usize) -> bytes::Bytes {
    let mut v = vec![0u8; len];
    fill_random(&mut v, unique());
    let n = len.min(8);
    v[..n].copy_from_slice(&unique().to_le_bytes()[..n]);
    bytes::Bytes::from(v)
}

/// A reusable body of one size whose content changes at every
/// [`Payload::fresh`] (so no put is ever deduplicated) at the cost of
/// rewriting 16 bytes, not the body.
#[derive(Clone)]
pub struct Payload {
    buf: Vec<u8>,
}

impl Payload {
    /// A random body of `size` bytes.
    pub fn new(size: usize) -> Self {
        Payload {
            buf: unique_body(size),
        }
    }

    /// Makes the content new and returns it.
    pub fn fresh(&mut self) -> &[u8] {
        stamp(&mut self.buf);
        &self.buf
    }

    /// The current content.
    pub fn current(&self) -> &[u8] {
        &self.buf
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// A [`Payload`] handed out as [`Bytes`](bytes::Bytes), for APIs that take
/// the body by value (iroh-blobs' `add_bytes`) and so are called without a
/// copy on their fastest path: the buffer of the previous put is stamped
/// and handed out again once the callee has let go of it, and copied from
/// the template only when the callee still holds it (an entry it keeps in
/// memory, e.g. iroh-blobs' inline ones).
pub struct BytesPayload {
    template: Payload,
    last: Option<bytes::Bytes>,
}

impl BytesPayload {
    /// A random body of `size` bytes.
    pub fn new(size: usize) -> Self {
        BytesPayload {
            template: Payload::new(size),
            last: None,
        }
    }

    /// Makes the content new and returns it.
    pub fn fresh(&mut self) -> bytes::Bytes {
        let mut buf = match self.last.take().map(bytes::Bytes::try_into_mut) {
            Some(Ok(reused)) => reused,
            _ => bytes::BytesMut::from(self.template.current()),
        };
        stamp(&mut buf);
        let b = buf.freeze();
        self.last = Some(b.clone());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_never_repeat() {
        let mut p = Payload::new(4096);
        let a = blake3::hash(p.fresh());
        let b = blake3::hash(p.fresh());
        assert_ne!(a, b);
        let mut small = Payload::new(8);
        let c = small.fresh().to_vec();
        assert_ne!(c, small.fresh());
    }

    #[test]
    fn bytes_payloads_never_repeat_nor_change_a_held_body() {
        let mut p = BytesPayload::new(4096);
        let held = p.fresh();
        let copy = held.to_vec();
        let next = p.fresh();
        assert_eq!(held, copy, "a body still held is never rewritten");
        assert_ne!(next, held);
        drop(held);
        drop(next);
        let again = p.fresh();
        assert_ne!(again, copy);
    }

    #[test]
    fn names() {
        assert_eq!(size_name(KIB), "1 KiB");
        assert_eq!(size_name(64 * MIB), "64 MiB");
        assert_eq!(size_name(100), "100 B");
    }
}
