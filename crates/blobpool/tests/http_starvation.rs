//! Issue 12, item 4 ("No starvation"): streaming clients that stall — a
//! reader that stops reading its response, an uploader that stops sending
//! its body — hold no thread of tokio's blocking pool while they wait, so
//! health, HEAD and kv GETs (SQLite reads run on that pool) keep being
//! answered however many of them stall.
//!
//! The server runs in its own runtime with a deliberately small blocking
//! pool (8 threads) and faces 32 stalled readers and 32 stalled uploaders:
//! a reader or stage that parked a blocking thread while waiting for its
//! client would take the whole pool and time the probes out.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use store_core::{Mode, Store};
use store_local::{LocalEngine, LocalOptions};
use store_ops::{Ops, OpsConfig};
use store_sqlite::{SqliteEngine, SqliteOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::oneshot;

/// The server's blocking pool: far fewer threads than stalled clients.
const BLOCKING_THREADS: usize = 8;
const STALLED_READERS: usize = 32;
const STALLED_UPLOADERS: usize = 32;
/// Size of the large blob the stalled readers GET, and declared by the
/// stalled uploaders.
const LARGE: usize = 4 << 20;
/// What each stalled uploader sends before stopping.
const SENT: usize = 64 << 10;
/// The kv tier holds entries up to this size.
const THRESHOLD: u64 = 1024;
/// A generous bound for each probe.
const PROBE_BOUND: Duration = Duration::from_secs(10);

/// A server over sqlite (kv) + local (large) in a temporary directory,
/// running on a runtime of its own with a small blocking pool.
struct Server {
    addr: SocketAddr,
    large: LocalEngine,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .max_blocking_threads(BLOCKING_THREADS)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let kv = SqliteEngine::open(root.join("kv.sqlite"), SqliteOptions::default())
                    .await
                    .unwrap();
                let large = LocalEngine::open(
                    root.join("large"),
                    LocalOptions {
                        shared_media: false,
                        fsync: false,
                        ..LocalOptions::default()
                    },
                )
                .await
                .unwrap();
                let store = Store::builder()
                    .kv(kv)
                    .large(large.clone())
                    .mode(Mode::DualTier {
                        threshold: THRESHOLD,
                    })
                    .build()
                    .await
                    .unwrap();
                let ops = Ops::new(store, OpsConfig::default()).unwrap();
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                ready_tx
                    .send((listener.local_addr().unwrap(), large))
                    .unwrap();
                store_http::serve(listener, ops, async move {
                    let _ = shutdown_rx.await;
                })
                .await
                .unwrap();
            });
            // Dropping the runtime does not wait for blocking threads that
            // an old-style reader or writer would still park.
            rt.shutdown_timeout(Duration::from_secs(5));
        });
        let (addr, large) = ready_rx.recv().unwrap();
        Server {
            addr,
            large,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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

/// Puts `body` into `ns`; its digest.
async fn put(http: &reqwest::Client, s: &Server, ns: &str, body: Vec<u8>) -> String {
    let resp = http
        .put(s.url(&format!("/v1/blobs/{ns}")))
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "put failed: {}", resp.status());
    let v: serde_json::Value = resp.json().await.unwrap();
    v["digest"].as_str().unwrap().to_string()
}

/// Reads until the end of the response's header block; the status line.
async fn read_head(c: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = c.read(&mut byte).await.unwrap();
        assert_eq!(n, 1, "connection closed in the header block");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    head.lines().next().unwrap_or_default().to_string()
}

/// A reader that GETs `path`, reads the response head, then stops
/// reading. Its receive buffer is kept small so the server's response
/// backs up at once instead of filling loopback buffers.
async fn stalled_reader(addr: SocketAddr, path: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut c = socket.connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    let status = read_head(&mut c).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    c
}

/// An uploader that declares `LARGE` bytes, sends `SENT`, then stops.
async fn stalled_uploader(addr: SocketAddr, ns: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let head = format!("PUT /v1/blobs/{ns} HTTP/1.1\r\nhost: x\r\ncontent-length: {LARGE}\r\n\r\n");
    c.write_all(head.as_bytes()).await.unwrap();
    c.write_all(&content(SENT, 99)).await.unwrap();
    c
}

/// Polls `f` until it holds or `bound` passes.
async fn eventually(bound: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs one probe request; its status and how long it took, or a failure
/// naming the probe.
async fn probe(what: &str, req: reqwest::RequestBuilder) -> (u16, Duration) {
    let t = Instant::now();
    let answer = tokio::time::timeout(PROBE_BOUND, async {
        let resp = req.send().await?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await?;
        Ok::<_, reqwest::Error>((status, body))
    })
    .await;
    match answer {
        Ok(Ok((status, _))) => (status, t.elapsed()),
        Ok(Err(e)) => panic!("{what} failed: {e}"),
        Err(_) => {
            panic!("{what} got no answer within {PROBE_BOUND:?}: stalled clients starve the server")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_readers_and_uploaders_do_not_starve_health_head_and_kv_gets() {
    let s = Server::start();
    // Each probe on a fresh connection: nothing reused from before the stall.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let large_digest = put(&http, &s, "big", content(LARGE, 1)).await;
    let small = content(100, 2);
    let small_digest = put(&http, &s, "small", small.clone()).await;

    // The stall: readers of the large blob, uploaders into the large tier.
    let large_path = format!("/v1/blobs/big/{large_digest}");
    let mut stalled = Vec::new();
    for _ in 0..STALLED_READERS {
        stalled.push(stalled_reader(s.addr, &large_path).await);
    }
    for _ in 0..STALLED_UPLOADERS {
        stalled.push(stalled_uploader(s.addr, "up").await);
    }
    // Every upload is staging (a large-tier put opens its stage at once).
    let staging = eventually(Duration::from_secs(5), || {
        s.large.stage_file_count().unwrap() == STALLED_UPLOADERS
    })
    .await;

    let mut slowest = Duration::ZERO;
    for round in 0..3 {
        let (status, t) = probe(
            &format!("health (round {round})"),
            http.get(s.url("/health")),
        )
        .await;
        assert_eq!(status, 200, "health");
        slowest = slowest.max(t);
        let (status, t) = probe(
            &format!("HEAD of the large blob (round {round})"),
            http.head(s.url(&large_path)),
        )
        .await;
        assert_eq!(status, 200, "HEAD");
        slowest = slowest.max(t);
        let (status, t) = probe(
            &format!("GET of a kv blob (round {round})"),
            http.get(s.url(&format!("/v1/blobs/small/{small_digest}"))),
        )
        .await;
        assert_eq!(status, 200, "kv GET");
        slowest = slowest.max(t);
    }
    eprintln!("slowest probe during the stall: {slowest:?}");
    let got = http
        .get(s.url(&format!("/v1/blobs/small/{small_digest}")))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(got, small);
    assert!(
        staging,
        "all {STALLED_UPLOADERS} uploads should have been staging, found {} stage files",
        s.large.stage_file_count().unwrap()
    );

    // The stalled clients go away: nothing is left half-written.
    drop(stalled);
    assert!(
        eventually(Duration::from_secs(10), || s
            .large
            .stage_file_count()
            .unwrap()
            == 0)
        .await,
        "stage files left: {}",
        s.large.stage_file_count().unwrap()
    );
    {
        use store_types::{Engine, Namespace};
        let up = Namespace::new("up").unwrap();
        assert!(
            s.large.scan(&up, None, 1).await.unwrap().is_empty(),
            "no upload was published"
        );
    }
    // And the large blob still reads whole (and verified).
    let resp = http.get(s.url(&large_path)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.bytes().await.unwrap();
    assert_eq!(blake3::hash(&body).to_hex().to_string(), large_digest);
}
