//! `bench-mem [DIR]`: peak memory of a 1 GiB put and verified get into the
//! default dual-tier store (SQLite + durable local files).
//!
//! The body is generated while it streams (never whole in memory) and the
//! get streams into a sink, so everything the process holds beyond its
//! baseline is the store's own buffering. After a small warm-up put/get
//! (which starts the runtime's blocking threads), the kernel's peak-RSS
//! mark is reset (`/proc/self/clear_refs` ← 5) and the baseline RSS read;
//! the peak (`VmHWM`) after the put and after the get, minus that
//! baseline, is what the store added. Prints `key=value` lines.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bench::data::{fill_random, unique, unique_body, MIB};
use bench::fixtures::{composite_store, err, ns, BenchResult};
use store_core::DEFAULT_THRESHOLD;
use tokio::io::{AsyncRead, ReadBuf};

/// The body: 1 GiB.
const SIZE: u64 = 1 << 30;

/// Pseudo-random bytes generated on the fly from one 64 KiB block whose
/// first bytes change every pass.
struct Generated {
    remaining: u64,
    block: Vec<u8>,
    pos: usize,
}

impl Generated {
    fn new(len: u64) -> Self {
        let mut block = vec![0u8; 64 * 1024];
        fill_random(&mut block, unique());
        Generated {
            remaining: len,
            block,
            pos: 0,
        }
    }
}

impl AsyncRead for Generated {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.remaining > 0 && buf.remaining() > 0 {
            if this.pos == this.block.len() {
                this.pos = 0;
                let tag = unique().to_le_bytes();
                this.block[..8].copy_from_slice(&tag);
            }
            let n = (this.block.len() - this.pos)
                .min(buf.remaining())
                .min(usize::try_from(this.remaining).unwrap_or(usize::MAX));
            buf.put_slice(&this.block[this.pos..this.pos + n]);
            this.pos += n;
            this.remaining -= n as u64;
        }
        Poll::Ready(Ok(()))
    }
}

/// A field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Resets the peak-RSS mark; `false` where the kernel does not allow it.
fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

async fn probe(dir: &std::path::Path) -> BenchResult<()> {
    let store = composite_store(dir).await?;
    let ns = ns();
    // Warm-up: one large put and get, so runtime threads and pools exist.
    let warm = unique_body(4 * MIB);
    let r = store
        .put_opts(
            &ns,
            &warm[..],
            store_core::PutOptions {
                len: Some(warm.len() as u64),
                ..Default::default()
            },
        )
        .await
        .map_err(err)?;
    let mut blob = store
        .get(r.key())
        .await
        .map_err(err)?
        .ok_or("warm-up entry missing")?;
    tokio::io::copy(&mut blob, &mut tokio::io::sink())
        .await
        .map_err(err)?;
    drop((r, blob, warm));

    let resettable = reset_peak();
    let baseline = status_bytes("VmRSS:").ok_or("no VmRSS")?;
    let hwm_at_start = status_bytes("VmHWM:").ok_or("no VmHWM")?;
    let floor = if resettable { baseline } else { hwm_at_start };

    let t = Instant::now();
    let receipt = store
        .put_opts(
            &ns,
            Generated::new(SIZE),
            store_core::PutOptions {
                len: Some(SIZE),
                ..Default::default()
            },
        )
        .await
        .map_err(err)?;
    let put_secs = t.elapsed().as_secs_f64();
    let put_peak = status_bytes("VmHWM:").ok_or("no VmHWM")?;
    let key = receipt.key().clone();
    drop(receipt);

    if resettable {
        reset_peak();
    }
    let get_floor = if resettable {
        status_bytes("VmRSS:").ok_or("no VmRSS")?
    } else {
        floor
    };
    let t = Instant::now();
    let mut blob = store.get(&key).await.map_err(err)?.ok_or("entry missing")?;
    let n = tokio::io::copy(&mut blob, &mut tokio::io::sink())
        .await
        .map_err(err)?;
    let get_secs = t.elapsed().as_secs_f64();
    if n != SIZE {
        return Err(format!("read {n} bytes, expected {SIZE}"));
    }
    let get_peak = status_bytes("VmHWM:").ok_or("no VmHWM")?;

    let put_above = put_peak.saturating_sub(floor);
    let get_above = get_peak.saturating_sub(get_floor);
    println!("size_bytes={SIZE}");
    println!("peak_reset_supported={resettable}");
    println!("baseline_rss_bytes={baseline}");
    println!("put_peak_above_baseline_bytes={put_above}");
    println!("get_peak_above_baseline_bytes={get_above}");
    println!("peak_above_baseline_bytes={}", put_above.max(get_above));
    // The put holds the entry's outboard (ADR-032, 0.39 % of it) until it
    // publishes it with the entry: the limit counts it.
    println!(
        "limit_bytes={}",
        DEFAULT_THRESHOLD + 4 * MIB as u64 + store_types::outboard::outboard_len(SIZE)
    );
    println!("put_secs={put_secs:.3}");
    println!("get_secs={get_secs:.3}");
    Ok(())
}

fn main() -> std::process::ExitCode {
    let arg = std::env::args().nth(1);
    let tmp;
    let dir = match arg {
        Some(d) => std::path::PathBuf::from(d),
        None => {
            tmp = match tempfile::tempdir() {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("bench-mem: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            tmp.path().to_path_buf()
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(probe(&dir)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-mem: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
