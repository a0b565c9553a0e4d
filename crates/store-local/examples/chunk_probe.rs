//! What a streamed, verified GET of a cached entry costs per chunk, read
//! three ways (ADR-057): `pread` into a reused buffer, hash, write to a
//! socket (one copy from the page cache, one into the socket); a
//! read-only mapping per chunk, hashed and written from the mapping, then
//! unmapped (only the copy into the socket); one mapping of the whole
//! file, chunks hashed and written from it.
//!
//! Each round times every mode over the same file, interleaved, so the
//! ratios compare like with like on a busy machine; a loopback TCP
//! connection drained by a second thread is the sink (as a client would).
//!
//! ```sh
//! cargo run --release -p store-local --example chunk_probe -- [rounds]
//! ```

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// A read-only shared mapping of `len` bytes of `file` at `offset` (page
/// aligned), unmapped on drop.
struct Map {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Map {
    fn new(file: &File, offset: usize, len: usize) -> Map {
        // SAFETY: a fresh read-only mapping of an open file; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED, "mmap");
        Map { ptr, len }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` readable bytes at `ptr` while the mapping lives;
        // nobody truncates the probe's file.
        unsafe { std::slice::from_raw_parts(self.ptr.cast(), self.len) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

fn pread(file: &File, buf: &mut [u8], offset: usize) {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, offset as u64).unwrap();
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Copy,
    MapChunk,
    MapWhole,
}

fn one_pass(mode: Mode, file: &File, size: usize, chunk: usize, sink: &mut TcpStream) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; chunk];
    let whole = (mode == Mode::MapWhole).then(|| Map::new(file, 0, size));
    let mut pos = 0;
    while pos < size {
        let n = chunk.min(size - pos);
        match mode {
            Mode::Copy => {
                pread(file, &mut buf[..n], pos);
                h.update(&buf[..n]);
                sink.write_all(&buf[..n]).unwrap();
            }
            Mode::MapChunk => {
                let m = Map::new(file, pos, n);
                h.update(m.bytes());
                sink.write_all(m.bytes()).unwrap();
            }
            Mode::MapWhole => {
                let b = &whole.as_ref().unwrap().bytes()[pos..pos + n];
                h.update(b);
                sink.write_all(b).unwrap();
            }
        }
        pos += n;
    }
    *h.finalize().as_bytes()
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut c, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 256 * KIB];
        while c.read(&mut buf).is_ok_and(|n| n > 0) {}
    });
    let mut sink = TcpStream::connect(addr).unwrap();
    for (size, passes) in [(MIB, 256), (64 * MIB, 4)] {
        let path = dir.path().join(format!("f{size}"));
        let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        let want = *blake3::hash(&data).as_bytes();
        for chunk in [64 * KIB, 128 * KIB, 256 * KIB] {
            let modes = [Mode::Copy, Mode::MapChunk, Mode::MapWhole];
            let mut ratios: Vec<[f64; 2]> = Vec::new();
            for _ in 0..rounds {
                let mut t = [0f64; 3];
                for (i, &mode) in modes.iter().enumerate() {
                    let start = Instant::now();
                    for _ in 0..passes {
                        assert_eq!(one_pass(mode, &file, size, chunk, &mut sink), want);
                    }
                    t[i] = start.elapsed().as_secs_f64() / passes as f64;
                }
                ratios.push([t[0] / t[1], t[0] / t[2]]);
                println!(
                    "{:>3} MiB, {:>3} KiB chunks: copy {:7.1} µs, map per chunk {:7.1} µs, \
                     map whole {:7.1} µs",
                    size / MIB,
                    chunk / KIB,
                    t[0] * 1e6,
                    t[1] * 1e6,
                    t[2] * 1e6
                );
            }
            let (mut a, mut b): (Vec<f64>, Vec<f64>) = ratios.iter().map(|r| (r[0], r[1])).unzip();
            a.sort_by(f64::total_cmp);
            b.sort_by(f64::total_cmp);
            println!(
                "  speed-up over copy (median; rounds): map per chunk {:.2}× ({:.2}–{:.2}), \
                 map whole {:.2}× ({:.2}–{:.2})",
                a[a.len() / 2],
                a[0],
                a[a.len() - 1],
                b[b.len() / 2],
                b[0],
                b[b.len() - 1]
            );
        }
    }
}
