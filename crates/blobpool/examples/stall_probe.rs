//! How the server fares while many streaming clients stall (issue 12,
//! item 4 "No starvation").
//!
//! Starts the HTTP server in-process (`store_http::serve`, default
//! runtime, default limits) over the embedded default store (SQLite kv
//! tier + local-file large tier, dual-tier at 64 KiB, fsync off) in a
//! temporary directory, then opens:
//!
//! - `--readers` stalled readers: each GETs a 4 MiB large-tier entry,
//!   reads the response head and stops reading (with a 4 KiB receive
//!   buffer, so the response backs up at once);
//! - `--uploaders` stalled uploaders: each PUTs with `Content-Length`
//!   4 MiB, sends 64 KiB and stops.
//!
//! It measures the latency of health, HEAD (large entry) and kv GET
//! requests (p50/p99/max over `--requests` of each, one keep-alive client,
//! sequential) before and during the stall, the process RSS (`VmRSS`)
//! before, during and after (once the stalled clients are closed and their
//! stages removed), and how many connections the stall holds. Uploads are
//! cut by the server's body read timeout (30 s by default), so the
//! measurement runs right after the stall is set up.
//!
//! ```sh
//! cargo run --release -p blobpool --example stall_probe -- --readers 1000 --uploaders 1000
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use store_core::{Mode, Store};
use store_local::{LocalEngine, LocalOptions};
use store_ops::{Ops, OpsConfig};
use store_sqlite::{SqliteEngine, SqliteOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// The embedded default's kv/large boundary.
const THRESHOLD: u64 = 64 * KIB as u64;
/// The large entry the readers GET, and what the uploaders declare.
const LARGE: usize = 4 * MIB;
/// What each uploader sends before it stalls.
const SENT: usize = 64 * KIB;
/// The kv entry of the kv GETs.
const SMALL: usize = 4 * KIB;
/// One request's bound; slower counts as an error.
const REQUEST_BOUND: Duration = Duration::from_secs(10);
/// Stalled clients opened at once.
const OPEN_BATCH: usize = 100;

struct Args {
    readers: usize,
    uploaders: usize,
    requests: usize,
}

fn args() -> Result<Args, BoxError> {
    let mut a = Args {
        readers: 1000,
        uploaders: 1000,
        requests: 200,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || -> Result<usize, BoxError> {
            Ok(it.next().ok_or(format!("{flag} needs a value"))?.parse()?)
        };
        match flag.as_str() {
            "--readers" => a.readers = value()?,
            "--uploaders" => a.uploaders = value()?,
            "--requests" => a.requests = value()?,
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: stall_probe [--readers N] \
                     [--uploaders N] [--requests N]"
                )
                .into())
            }
        }
    }
    Ok(a)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; (soft, hard) after.
fn raise_nofile() -> std::io::Result<(libc::rlim_t, libc::rlim_t)> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if rl.rlim_cur < rl.rlim_max {
        rl.rlim_cur = rl.rlim_max;
        // SAFETY: `rl` is a valid rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((rl.rlim_cur, rl.rlim_max))
}

/// This process's resident set size, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Deterministic pseudo-random content.
fn content(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed ^ 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Reads until the end of the response's header block; the status line.
async fn read_head(c: &mut TcpStream) -> Result<String, BoxError> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if c.read(&mut byte).await? == 0 {
            return Err("connection closed in the header block".into());
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    Ok(head.lines().next().unwrap_or_default().to_string())
}

async fn stalled_reader(addr: SocketAddr, path: String) -> Result<TcpStream, BoxError> {
    let socket = TcpSocket::new_v4()?;
    socket.set_recv_buffer_size(4096)?;
    let mut c = socket.connect(addr).await?;
    c.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await?;
    let status = read_head(&mut c).await?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("reader got {status}").into());
    }
    Ok(c)
}

async fn stalled_uploader(addr: SocketAddr, body: &[u8]) -> Result<TcpStream, BoxError> {
    let mut c = TcpStream::connect(addr).await?;
    let head = format!("PUT /v1/blobs/up HTTP/1.1\r\nhost: x\r\ncontent-length: {LARGE}\r\n\r\n");
    c.write_all(head.as_bytes()).await?;
    c.write_all(body).await?;
    Ok(c)
}

/// Opens `n` stalled clients, `OPEN_BATCH` at a time; the streams opened
/// and the first error, if any.
async fn open_all<F, Fut>(n: usize, open: F) -> (Vec<TcpStream>, Option<String>)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<TcpStream, BoxError>> + Send + 'static,
{
    let mut streams = Vec::with_capacity(n);
    let mut first_error = None;
    let mut left = n;
    while left > 0 {
        let batch: Vec<_> = (0..left.min(OPEN_BATCH))
            .map(|_| tokio::spawn(open()))
            .collect();
        left -= batch.len();
        for h in batch {
            match h.await {
                Ok(Ok(s)) => streams.push(s),
                Ok(Err(e)) => {
                    first_error.get_or_insert_with(|| e.to_string());
                }
                Err(e) => {
                    first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }
    (streams, first_error)
}

/// How many of `streams` the server still holds open: nothing to read
/// (or, for `readers`, response bytes still coming) rather than an answer,
/// an end of stream or a reset.
fn still_open(streams: &[TcpStream], readers: bool) -> usize {
    let mut buf = [0u8; 1];
    streams
        .iter()
        .filter(|s| match s.try_read(&mut buf) {
            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
            Ok(n) => readers && n > 0,
        })
        .count()
}

/// Latencies of one kind of request.
struct Latency {
    name: &'static str,
    times: Vec<Duration>,
    errors: usize,
}

impl Latency {
    fn row(&mut self, phase: &str) -> String {
        self.times.sort();
        let q = |p: f64| -> String {
            if self.times.is_empty() {
                return "-".to_string();
            }
            let i = ((self.times.len() as f64 * p).ceil() as usize).clamp(1, self.times.len());
            fmt_ms(self.times[i - 1])
        };
        format!(
            "{:<8} {:<7} {:>9} {:>9} {:>9} {:>6} {:>7}",
            self.name,
            phase,
            q(0.50),
            q(0.99),
            q(1.0),
            self.times.len(),
            self.errors
        )
    }
}

fn fmt_ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// `requests` rounds of health, HEAD (large) and kv GET, sequential.
async fn measure(
    http: &reqwest::Client,
    base: &str,
    large: &str,
    small: &str,
    requests: usize,
) -> Vec<Latency> {
    let mut out: Vec<Latency> = ["health", "HEAD", "kv GET"]
        .into_iter()
        .map(|name| Latency {
            name,
            times: Vec::with_capacity(requests),
            errors: 0,
        })
        .collect();
    for _ in 0..requests {
        let reqs = [
            http.get(format!("{base}/health")),
            http.head(format!("{base}/v1/blobs/big/{large}")),
            http.get(format!("{base}/v1/blobs/small/{small}")),
        ];
        for (lat, req) in out.iter_mut().zip(reqs) {
            let t = Instant::now();
            let answer = tokio::time::timeout(REQUEST_BOUND, async {
                let resp = req.send().await?;
                let ok = resp.status().is_success();
                resp.bytes().await?;
                Ok::<_, reqwest::Error>(ok)
            })
            .await;
            match answer {
                Ok(Ok(true)) => lat.times.push(t.elapsed()),
                _ => lat.errors += 1,
            }
        }
    }
    out
}

async fn put(
    http: &reqwest::Client,
    base: &str,
    ns: &str,
    body: Vec<u8>,
) -> Result<String, BoxError> {
    let resp = http
        .put(format!("{base}/v1/blobs/{ns}"))
        .body(body)
        .send()
        .await?
        .error_for_status()?;
    let v: serde_json::Value = resp.json().await?;
    Ok(v["digest"].as_str().ok_or("no digest")?.to_string())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let a = args()?;
    let (soft, hard) = raise_nofile()?;
    let dir = tempfile::tempdir()?;
    let kv = SqliteEngine::open(dir.path().join("kv.sqlite"), SqliteOptions::default()).await?;
    let large = LocalEngine::open(
        dir.path().join("large"),
        LocalOptions {
            shared_media: false,
            fsync: false,
            ..LocalOptions::default()
        },
    )
    .await?;
    let store = Store::builder()
        .kv(kv)
        .large(large.clone())
        .mode(Mode::DualTier {
            threshold: THRESHOLD,
        })
        .build()
        .await?;
    let ops = Ops::new(store, OpsConfig::default())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let base = format!("http://{addr}");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(store_http::serve(listener, ops, async move {
        let _ = stop_rx.await;
    }));

    let http = reqwest::Client::new();
    let large_digest = put(&http, &base, "big", content(LARGE, 1)).await?;
    let small_digest = put(&http, &base, "small", content(SMALL, 2)).await?;
    let mut before = measure(&http, &base, &large_digest, &small_digest, a.requests).await;
    let fds_before = open_fds();
    let rss_before = rss_mib();

    let t = Instant::now();
    let path = format!("/v1/blobs/big/{large_digest}");
    let (readers, reader_err) = open_all(a.readers, || stalled_reader(addr, path.clone())).await;
    let body = std::sync::Arc::new(content(SENT, 3));
    let (uploaders, uploader_err) = open_all(a.uploaders, || {
        let body = body.clone();
        async move { stalled_uploader(addr, &body).await }
    })
    .await;
    // Every upload is staging once its stage file exists.
    let deadline = Instant::now() + Duration::from_secs(10);
    while large.stage_file_count()? < uploaders.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let setup = t.elapsed();
    let stages = large.stage_file_count()?;
    let mut during = measure(&http, &base, &large_digest, &small_digest, a.requests).await;
    let rss_during = rss_mib();
    let fds_during = open_fds();
    let (readers_open, uploaders_open) =
        (still_open(&readers, true), still_open(&uploaders, false));
    let stall_age = t.elapsed();

    drop(readers);
    drop(uploaders);
    let t_close = Instant::now();
    while large.stage_file_count()? > 0 && t_close.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stages_gone = t_close.elapsed();
    let stages_after = large.stage_file_count()?;
    // Let the server finish tearing the connections down.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut after = measure(&http, &base, &large_digest, &small_digest, a.requests).await;
    let rss_after = rss_mib();
    let fds_after = open_fds();
    // The server returns freed memory by itself at its next 10 s tick
    // after a burst of closed connections; give it that long.
    tokio::time::sleep(Duration::from_secs(12).saturating_sub(t_close.elapsed())).await;
    let rss_server_trim = rss_mib();
    // SAFETY: malloc_trim only returns free heap memory to the OS.
    unsafe {
        libc::malloc_trim(0);
    }
    let rss_trimmed = rss_mib();

    println!(
        "stall_probe: {} stalled readers (GET {} MiB, 4 KiB receive buffer), {} stalled \
         uploaders (PUT {} MiB declared, {} KiB sent); RLIMIT_NOFILE {soft}/{hard}; {} worker \
         threads (default runtime, default server limits)",
        a.readers,
        LARGE / MIB,
        a.uploaders,
        LARGE / MIB,
        SENT / KIB,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    if let Some(e) = reader_err {
        println!("  reader open error (first): {e}");
    }
    if let Some(e) = uploader_err {
        println!("  uploader open error (first): {e}");
    }
    println!(
        "stall set up in {setup:.1?}; measured {stall_age:.1?} after it began; stalled \
         connections held by the server at the end of the measurement: readers {readers_open}/{}, \
         uploaders {uploaders_open}/{}; stage files {stages}",
        a.readers, a.uploaders
    );
    println!(
        "after closing: stage files {stages_after} ({stages_gone:.1?} to clear); open fds \
         before {fds_before}, during {fds_during}, after {fds_after}"
    );
    println!();
    println!(
        "{:<8} {:<7} {:>9} {:>9} {:>9} {:>6} {:>7}",
        "request", "phase", "p50", "p99", "max", "n", "errors"
    );
    for i in 0..3 {
        println!("{}", before[i].row("before"));
        println!("{}", during[i].row("during"));
        println!("{}", after[i].row("after"));
    }
    println!();
    println!(
        "RSS: before {rss_before:.0} MiB, during {rss_during:.0} MiB, after {rss_after:.0} MiB, \
         12 s after closing (the server's own trim) {rss_server_trim:.0} MiB \
         (after a further malloc_trim {rss_trimmed:.0} MiB)"
    );

    let _ = stop_tx.send(());
    let _ = server.await;
    Ok(())
}
