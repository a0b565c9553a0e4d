//! Issue 40, item 5 ("Memory per stalled connection"), ADR-057: a GET
//! whose client stopped reading holds at most one chunk of the response
//! (`CHUNK_SIZE`, 128 KiB) in the server, not a megabyte.
//!
//! Runs `blobpool serve` as its own process (the default store: SQLite kv
//! tier, local-file large tier), puts an 8 MiB entry, then opens
//! [`STALLED`] connections that each send a GET for it, read nothing and
//! keep a 4 KiB receive buffer, so every response backs up at once. Once
//! the server's resident set stops growing (its writes have stalled), the
//! growth per stalled connection must stay under [`BOUND_PER_GET`]. The
//! old read path (three 256 KiB chunks read ahead, one held back by the
//! body, hyper's ~400 KiB write queue, 1 MiB entries read whole) held
//! ~1.3 MiB per stalled GET. Nothing here is timed: the wait for the
//! stall only polls until the memory figure settles.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The entry the stalled clients GET: far more than any buffer on the way.
const ENTRY: usize = 8 << 20;
/// Stalled GETs.
const STALLED: usize = 150;
/// Most server memory one stalled GET may hold, the connection's own state
/// (hyper's buffers, the task, the read's file and hasher) included: one
/// 128 KiB chunk.
const BOUND_PER_GET: u64 = 128 << 10;
/// Issue 40's target: this many stalled GETs keep the whole server (its
/// memory before them included) under [`TARGET_RSS`].
const TARGET_STALLED: u64 = 600;
const TARGET_RSS: u64 = 100 << 20;

/// The resident set of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kib << 10
}

/// A client that GETs `path`, reads the response head (a 200), then
/// reads nothing more.
async fn stalled_get(addr: SocketAddr, path: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut c = socket.connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(c.read(&mut byte).await.unwrap(), 1, "closed in the head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    c
}

/// Polls the server's resident set until it has not moved by more than
/// 1 % over ten samples 100 ms apart (its stalled writes hold still);
/// that figure. Gives up after a minute with the last one.
async fn settled_rss(pid: u32) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut window = Vec::new();
    loop {
        window.push(rss(pid));
        if window.len() > 10 {
            window.remove(0);
            let (lo, hi) = (window.iter().min().unwrap(), window.iter().max().unwrap());
            if hi - lo <= hi / 100 || Instant::now() > deadline {
                return *hi;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_get_holds_at_most_a_chunk_of_server_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (server, base) = common::serve_child(dir.path());
    let pid = server.0.id();
    let addr: SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    let http = reqwest::Client::new();
    let data: Vec<u8> = (0..ENTRY).map(|i| (i * 31 % 253) as u8).collect();
    let resp = http
        .put(format!("{base}/v1/blobs/big"))
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let v: serde_json::Value = resp.json().await.unwrap();
    let path = format!("/v1/blobs/big/{}", v["digest"].as_str().unwrap());
    // Warm up: whole GETs, so what the first requests allocate for good
    // (runtime, pools, caches) is in the baseline.
    for _ in 0..3 {
        let got = http.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(got.bytes().await.unwrap().len(), ENTRY);
    }
    let before = settled_rss(pid).await;
    let mut stalled = Vec::new();
    for _ in 0..STALLED {
        stalled.push(stalled_get(addr, &path).await);
    }
    // Every client got its head (the server is writing its body); then
    // the server's memory settles: its writes stalled.
    let during = settled_rss(pid).await;
    let per_get = during.saturating_sub(before) / STALLED as u64;
    eprintln!(
        "server RSS: {} KiB before, {} KiB with {STALLED} stalled GETs of {} MiB: {} KiB each",
        before >> 10,
        during >> 10,
        ENTRY >> 20,
        per_get >> 10
    );
    // Every stalled client is still getting its response (bytes waiting,
    // nothing refused or cut): the memory is theirs.
    let mut buf = [0u8; 1];
    let waiting = stalled
        .iter()
        .filter(|s| matches!(s.try_read(&mut buf), Ok(1)))
        .count();
    assert_eq!(waiting, STALLED, "every stalled GET is still open");
    assert!(
        per_get <= BOUND_PER_GET,
        "a stalled GET holds {} KiB of server memory (bound {} KiB)",
        per_get >> 10,
        BOUND_PER_GET >> 10
    );
    let projected = before + per_get * TARGET_STALLED;
    assert!(
        projected <= TARGET_RSS,
        "{TARGET_STALLED} stalled GETs would hold {} MiB ({} KiB before them, {} KiB each); \
         the target is {} MiB",
        projected >> 20,
        before >> 10,
        per_get >> 10,
        TARGET_RSS >> 20
    );
    drop(stalled);
    drop(server);
}
