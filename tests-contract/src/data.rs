//! Deterministic test content and readers with controlled behaviour.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use store_types::Digest;
use tokio::io::{AsyncRead, ReadBuf};

/// `len` pseudo-random bytes determined by `seed` (xorshift64*).
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    fill_pattern(seed, 0, &mut out);
    out
}

/// Fills `buf` with the pattern of `seed` starting at byte `offset`.
fn fill_pattern(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut pos = 0usize;
    // Unaligned head, byte by byte.
    while pos < buf.len() && !(offset + pos as u64).is_multiple_of(8) {
        let at = offset + pos as u64;
        buf[pos] = mix(seed, at / 8).to_le_bytes()[(at % 8) as usize];
        pos += 1;
    }
    // Aligned words (the last may be partial).
    let word0 = (offset + pos as u64) / 8;
    for (i, chunk) in buf[pos..].chunks_mut(8).enumerate() {
        let word = mix(seed, word0 + i as u64).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

fn mix(seed: u64, n: u64) -> u64 {
    let mut x = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(n.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        | 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

/// An `AsyncRead` yielding the pattern of `seed` for `len` bytes without
/// holding it in memory, in reads of at most 64 KiB.
pub struct PatternReader {
    seed: u64,
    len: u64,
    pos: u64,
    fail_at: Option<u64>,
}

impl PatternReader {
    /// A reader of `len` bytes.
    pub fn new(seed: u64, len: u64) -> Self {
        PatternReader {
            seed,
            len,
            pos: 0,
            fail_at: None,
        }
    }

    /// A reader that returns an I/O error once `at` bytes were read.
    pub fn failing_at(seed: u64, len: u64, at: u64) -> Self {
        PatternReader {
            fail_at: Some(at),
            ..Self::new(seed, len)
        }
    }

    /// The digest of the whole pattern, computed by streaming it.
    pub fn digest(seed: u64, len: u64) -> Digest {
        let mut h = blake3::Hasher::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut pos = 0u64;
        while pos < len {
            let n = ((len - pos) as usize).min(buf.len());
            fill_pattern(seed, pos, &mut buf[..n]);
            h.update(&buf[..n]);
            pos += n as u64;
        }
        Digest::from(h.finalize())
    }
}

impl AsyncRead for PatternReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(at) = self.fail_at {
            if self.pos >= at {
                return Poll::Ready(Err(io::Error::other("client went away")));
            }
        }
        let mut n = ((self.len - self.pos) as usize)
            .min(buf.remaining())
            .min(1 << 16);
        if let Some(at) = self.fail_at {
            n = n.min((at - self.pos) as usize);
        }
        if n == 0 {
            return Poll::Ready(Ok(()));
        }
        let mut tmp = vec![0u8; n];
        fill_pattern(self.seed, self.pos, &mut tmp);
        buf.put_slice(&tmp);
        self.pos += n as u64;
        Poll::Ready(Ok(()))
    }
}

/// A reader that records whether anyone read from it.
#[derive(Clone, Default)]
pub struct Untouched(pub Arc<AtomicBool>);

impl Untouched {
    /// Whether a read happened.
    pub fn was_read(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

impl AsyncRead for Untouched {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.0.store(true, Ordering::SeqCst);
        buf.put_slice(&[0u8; 1]);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn pattern_reader_matches_content_and_digest() {
        for len in [0u64, 1, 7, 8, 9, 100_003, 200_000] {
            let mut parts = vec![0u8; len as usize];
            for start in (0..len as usize).step_by(13) {
                let end = (start + 13).min(len as usize);
                fill_pattern(7, start as u64, &mut parts[start..end]);
            }
            assert_eq!(parts, content(7, len as usize));
            let mut r = PatternReader::new(7, len);
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            assert_eq!(got, content(7, len as usize), "len {len}");
            assert_eq!(PatternReader::digest(7, len), Digest::of(&got));
        }
    }
}
