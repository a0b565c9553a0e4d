//! HTTP server vs library throughput, measured in the same run on the same
//! store.
//!
//! One embedded-default store (SQLite kv tier + local-file large tier,
//! dual-tier at 64 KiB, fsync on) lives in a temporary directory. It is
//! served in-process on `127.0.0.1:0` by the real store-http router
//! (`store_http::serve`, the code path of `blobpool serve`), on a
//! runtime of its own as a separate server process would have. Each
//! workload then runs in interleaved rounds — library, HTTP, HTTP, library,
//! ... — and the medians are compared:
//!
//! - put 4 KiB, 16 concurrent clients, fresh random content every put;
//! - get 4 KiB, 16 concurrent clients, whole body read (the store verifies
//!   the digest on both paths);
//! - put 64 MiB, 2 concurrent clients, bodies generated on the fly as
//!   1 MiB chunks and streamed with a known `Content-Length`;
//! - get 64 MiB, 2 concurrent clients, streamed and discarded.
//!
//! HTTP clients share one keep-alive `reqwest::Client`; library clients are
//! tokio tasks calling `Store::put` / `Store::get`. Both sides hold their
//! pins (receipts / pin tokens) until the timed window ends, then release
//! them; the 64 MiB entries are deleted between windows (untimed) so the
//! page cache does not grow. No sweep runs.
//!
//! ```sh
//! cargo run --release -p blobpool --example http_load            # ~2 min
//! cargo run --release -p blobpool --example http_load -- --quick # ~15 s
//! cargo run --release -p blobpool --example http_load -- --only get-64m
//! ```

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::StatusCode;
use store_core::{Digest, Key, Mode, Namespace, PutReceipt, Store};
use store_local::{LocalEngine, LocalOptions};
use store_ops::{Ops, OpsConfig, PutResponse};
use store_sqlite::{SqliteEngine, SqliteOptions};
use tokio::io::AsyncReadExt;
use tokio_util::io::StreamReader;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;
/// The embedded default's kv/large boundary.
const THRESHOLD: u64 = 64 * KIB as u64;
const SMALL: usize = 4 * KIB;
const LARGE: u64 = 64 * MIB as u64;
/// Chunk of the generated 64 MiB bodies.
const GEN_CHUNK: usize = MIB;
/// Read buffer of library-side streamed gets (the server's response chunk).
const READ_BUF: usize = 256 * KIB;
/// Entries the 4 KiB gets cycle through.
const SMALL_POOL: usize = 1024;
const NAMESPACE: &str = "load";

/// Run lengths.
struct Plan {
    rounds: usize,
    small_window: Duration,
    large_window: Duration,
    warmup: Duration,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Plan {
                rounds: 1,
                small_window: Duration::from_millis(700),
                large_window: Duration::from_millis(1500),
                warmup: Duration::from_millis(200),
            }
        } else {
            Plan {
                rounds: 3,
                small_window: Duration::from_secs(3),
                large_window: Duration::from_secs(5),
                warmup: Duration::from_millis(500),
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Workload {
    SmallPut,
    SmallGet,
    LargePut,
    LargeGet,
}

impl Workload {
    const ALL: [Workload; 4] = [
        Workload::SmallPut,
        Workload::SmallGet,
        Workload::LargePut,
        Workload::LargeGet,
    ];

    fn label(self) -> &'static str {
        match self {
            Workload::SmallPut => "put 4 KiB, 16 clients",
            Workload::SmallGet => "get 4 KiB (verified), 16 clients",
            Workload::LargePut => "put 64 MiB (streamed), 2 clients",
            Workload::LargeGet => "get 64 MiB (verified, streamed), 2 clients",
        }
    }

    fn clients(self) -> usize {
        match self {
            Workload::SmallPut | Workload::SmallGet => 16,
            Workload::LargePut | Workload::LargeGet => 2,
        }
    }

    fn is_large(self) -> bool {
        matches!(self, Workload::LargePut | Workload::LargeGet)
    }

    /// The `--only` name.
    fn name(self) -> &'static str {
        match self {
            Workload::SmallPut => "put-4k",
            Workload::SmallGet => "get-4k",
            Workload::LargePut => "put-64m",
            Workload::LargeGet => "get-64m",
        }
    }

    fn window(self, plan: &Plan) -> Duration {
        if self.is_large() {
            plan.large_window
        } else {
            plan.small_window
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Library,
    Http,
}

/// Pins held during a window, released after it.
#[derive(Default)]
struct Held {
    receipts: Vec<PutReceipt>,
    tokens: Vec<String>,
    /// 64 MiB entries written in the window, deleted after it.
    large: Vec<Key>,
}

/// Everything a client needs; cheap to clone into tasks.
#[derive(Clone)]
struct Ctx {
    store: Store,
    /// The kv engine, for its group-commit counters.
    kv: SqliteEngine,
    ops: Ops,
    http: reqwest::Client,
    base: String,
    ns: Namespace,
    small_keys: Arc<Vec<Key>>,
    large_keys: Arc<Vec<Key>>,
    /// Random bytes the 64 MiB bodies are made of (each chunk is a fresh
    /// copy, stamped with the blob's sequence number and the chunk index).
    block: Bytes,
    held: Arc<Mutex<Held>>,
}

/// Sequence numbers making every generated body unique.
static SEQ: AtomicU64 = AtomicU64::new(1);

fn next_seq() -> u64 {
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// `len` pseudo-random bytes (xorshift64*) from `seed`.
fn random_bytes(len: usize, seed: u64) -> BytesMut {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = BytesMut::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A fresh 4 KiB body.
fn small_body() -> Bytes {
    random_bytes(SMALL, next_seq()).freeze()
}

/// A fresh 64 MiB body, generated chunk by chunk as it is consumed.
fn large_body(block: &Bytes) -> impl Stream<Item = io::Result<Bytes>> + Send + 'static {
    let block = block.clone();
    let seq = next_seq();
    let chunks = LARGE / GEN_CHUNK as u64;
    futures::stream::iter(0..chunks).map(move |i| {
        let mut c = BytesMut::from(&block[..]);
        c[..8].copy_from_slice(&seq.to_le_bytes());
        c[8..16].copy_from_slice(&i.to_le_bytes());
        Ok(c.freeze())
    })
}

impl Ctx {
    fn blob_url(&self, key: &Key) -> String {
        format!("{}/v1/blobs/{}/{}", self.base, key.namespace, key.digest)
    }

    /// One operation; returns the payload bytes moved.
    async fn op(&self, w: Workload, side: Side, worker: usize, iter: u64) -> Res<u64> {
        match (w, side) {
            (Workload::SmallPut, Side::Library) => {
                let body = small_body();
                let r = self
                    .store
                    .put_opts(
                        &self.ns,
                        &body[..],
                        store_core::PutOptions {
                            len: Some(SMALL as u64),
                            ..Default::default()
                        },
                    )
                    .await?;
                if r.deduplicated {
                    return Err("a fresh 4 KiB put deduplicated".into());
                }
                self.held.lock().unwrap().receipts.push(r);
                Ok(SMALL as u64)
            }
            (Workload::SmallPut, Side::Http) => {
                let resp = self
                    .http
                    .put(format!("{}/v1/blobs/{}", self.base, self.ns))
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .body(small_body())
                    .send()
                    .await?;
                let p = put_answer(resp).await?;
                self.held.lock().unwrap().tokens.extend(p.token);
                Ok(SMALL as u64)
            }
            (Workload::SmallGet, Side::Library) => {
                let key = self.small_key(w, worker, iter);
                let blob = self.store.get(key).await?.ok_or("4 KiB entry missing")?;
                let n = blob.bytes().await?.len() as u64;
                expect_len(n, SMALL as u64)
            }
            (Workload::SmallGet, Side::Http) => {
                let key = self.small_key(w, worker, iter);
                let resp = self.http.get(self.blob_url(key)).send().await?;
                if resp.status() != StatusCode::OK {
                    return Err(format!("get: {}", resp.status()).into());
                }
                let n = resp.bytes().await?.len() as u64;
                expect_len(n, SMALL as u64)
            }
            (Workload::LargePut, Side::Library) => {
                let reader = StreamReader::new(large_body(&self.block));
                let r = self
                    .store
                    .put_opts(
                        &self.ns,
                        reader,
                        store_core::PutOptions {
                            len: Some(LARGE),
                            ..Default::default()
                        },
                    )
                    .await?;
                if r.deduplicated {
                    return Err("a fresh 64 MiB put deduplicated".into());
                }
                let mut held = self.held.lock().unwrap();
                held.large.push(r.key().clone());
                held.receipts.push(r);
                Ok(LARGE)
            }
            (Workload::LargePut, Side::Http) => {
                let resp = self
                    .http
                    .put(format!("{}/v1/blobs/{}", self.base, self.ns))
                    .header(CONTENT_TYPE, "application/octet-stream")
                    .header(CONTENT_LENGTH, LARGE)
                    .body(reqwest::Body::wrap_stream(large_body(&self.block)))
                    .send()
                    .await?;
                let p = put_answer(resp).await?;
                let key = Key::new(self.ns.clone(), Digest::parse(&p.digest)?);
                let mut held = self.held.lock().unwrap();
                held.large.push(key);
                held.tokens.extend(p.token);
                Ok(LARGE)
            }
            (Workload::LargeGet, Side::Library) => {
                let key = &self.large_keys[worker % self.large_keys.len()];
                let mut blob = self.store.get(key).await?.ok_or("64 MiB entry missing")?;
                let mut buf = vec![0u8; READ_BUF];
                let mut n = 0u64;
                loop {
                    let got = blob.read(&mut buf).await?;
                    if got == 0 {
                        break;
                    }
                    n += got as u64;
                }
                expect_len(n, LARGE)
            }
            (Workload::LargeGet, Side::Http) => {
                let key = &self.large_keys[worker % self.large_keys.len()];
                let resp = self.http.get(self.blob_url(key)).send().await?;
                if resp.status() != StatusCode::OK {
                    return Err(format!("get: {}", resp.status()).into());
                }
                let mut s = resp.bytes_stream();
                let mut n = 0u64;
                while let Some(c) = s.next().await {
                    n += c?.len() as u64;
                }
                expect_len(n, LARGE)
            }
        }
    }

    fn small_key(&self, w: Workload, worker: usize, iter: u64) -> &Key {
        let i = (iter as usize)
            .wrapping_mul(w.clients())
            .wrapping_add(worker);
        &self.small_keys[i % self.small_keys.len()]
    }

    /// Releases what a window pinned and deletes the 64 MiB entries it
    /// wrote (untimed).
    async fn release(&self) -> Res<()> {
        let held = std::mem::take(&mut *self.held.lock().unwrap());
        drop(held.receipts);
        let open = store_ops::auth::Identity::open();
        for t in &held.tokens {
            self.ops.release_token(&open, t)?;
        }
        for k in &held.large {
            self.store.delete(k).await?;
        }
        Ok(())
    }
}

async fn put_answer(resp: reqwest::Response) -> Res<PutResponse> {
    let status = resp.status();
    let body = resp.bytes().await?;
    if status != StatusCode::CREATED {
        return Err(format!("put: {status}: {}", String::from_utf8_lossy(&body)).into());
    }
    Ok(serde_json::from_slice(&body)?)
}

fn expect_len(got: u64, want: u64) -> Res<u64> {
    if got == want {
        Ok(got)
    } else {
        Err(format!("read {got} bytes, expected {want}").into())
    }
}

/// One timed window.
#[derive(Clone, Copy, Debug)]
struct Sample {
    ops: u64,
    bytes: u64,
    secs: f64,
    /// Process CPU seconds (all threads: clients, server, blocking pool).
    cpu: Option<f64>,
    /// SQLite writer: transactions committed and writes they carried.
    commits: u64,
    writes: u64,
}

impl Sample {
    fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.secs
    }
    fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / MIB as f64 / self.secs
    }
    /// The workload's figure: ops/s for 4 KiB, MiB/s for 64 MiB.
    fn rate(&self, w: Workload) -> f64 {
        if w.is_large() {
            self.mib_per_s()
        } else {
            self.ops_per_s()
        }
    }
    /// Writes per SQLite transaction (group commit), if any committed.
    fn writes_per_commit(&self) -> Option<f64> {
        (self.commits > 0).then(|| self.writes as f64 / self.commits as f64)
    }
    /// Process CPU milliseconds per operation.
    fn cpu_ms_per_op(&self) -> Option<f64> {
        self.cpu.map(|c| c * 1000.0 / self.ops.max(1) as f64)
    }
}

/// utime + stime of this process, seconds (Linux only).
fn process_cpu() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // USER_HZ is 100 on every Linux ABI in use.
    Some((utime + stime) / 100.0)
}

/// `clients` tasks run `w` on `side` until `window` has passed; the window
/// ends when the last in-flight operation does.
async fn run_window(ctx: &Ctx, w: Workload, side: Side, window: Duration) -> Res<Sample> {
    let cpu0 = process_cpu();
    let kv0 = ctx.kv.stats();
    let start = Instant::now();
    let deadline = start + window;
    let mut tasks = Vec::new();
    for worker in 0..w.clients() {
        let ctx = ctx.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ops, mut bytes) = (0u64, 0u64);
            while Instant::now() < deadline {
                bytes += ctx.op(w, side, worker, ops).await?;
                ops += 1;
            }
            Ok::<_, BoxError>((ops, bytes))
        }));
    }
    let (mut ops, mut bytes) = (0, 0);
    for t in tasks {
        let (o, b) = t.await??;
        ops += o;
        bytes += b;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = match (cpu0, process_cpu()) {
        (Some(a), Some(b)) => Some(b - a),
        _ => None,
    };
    let kv1 = ctx.kv.stats();
    ctx.release().await?;
    Ok(Sample {
        ops,
        bytes,
        secs,
        cpu,
        commits: kv1.commits - kv0.commits,
        writes: kv1.writes_committed - kv0.writes_committed,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn fmt_rate(w: Workload, s: f64, mib: f64) -> String {
    if w.is_large() {
        format!(
            "{s:.0} MiB/s ({:.1} ops/s)",
            s / (LARGE as f64 / MIB as f64)
        )
    } else {
        format!("{} ops/s ({mib:.1} MiB/s)", fmt_count(s))
    }
}

fn fmt_count(x: f64) -> String {
    if x >= 10_000.0 {
        format!("{:.1}k", x / 1000.0)
    } else {
        format!("{x:.0}")
    }
}

/// Results of one workload.
struct Row {
    w: Workload,
    lib: Vec<Sample>,
    http: Vec<Sample>,
}

impl Row {
    fn med(&self, side: Side, f: impl Fn(&Sample) -> f64) -> f64 {
        let v = match side {
            Side::Library => &self.lib,
            Side::Http => &self.http,
        };
        median(v.iter().map(f).collect())
    }
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

async fn open_store(dir: &std::path::Path) -> Res<(Store, SqliteEngine)> {
    let kv = SqliteEngine::open(dir.join("kv.sqlite"), SqliteOptions::default()).await?;
    let large = LocalEngine::open(
        dir.join("large"),
        LocalOptions {
            shared_media: false,
            fsync: true,
            ..LocalOptions::default()
        },
    )
    .await?;
    let store = Store::builder()
        .kv(kv.clone())
        .large(large)
        .mode(Mode::DualTier {
            threshold: THRESHOLD,
        })
        .build()
        .await?;
    Ok((store, kv))
}

#[tokio::main]
async fn main() -> Res<()> {
    let usage = "usage: http_load [--quick] [--only put-4k|get-4k|put-64m|get-64m]...";
    let mut quick = false;
    let mut only: Vec<Workload> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--only" => {
                let name = args.next().ok_or(usage)?;
                let w = Workload::ALL
                    .into_iter()
                    .find(|w| w.name() == name)
                    .ok_or(usage)?;
                only.push(w);
            }
            "-h" | "--help" => {
                println!("{usage}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}; {usage}").into()),
        }
    }
    if only.is_empty() {
        only = Workload::ALL.to_vec();
    }
    let plan = Plan::new(quick);
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load_start = loadavg();
    let t0 = Instant::now();

    let dir = tempfile::tempdir()?;
    let (store, kv) = open_store(dir.path()).await?;
    let ops = Ops::new(store.clone(), OpsConfig::default())?;

    // The server: its own runtime (default worker count, like `#[tokio::main]`
    // in `blobpool serve`) on its own threads, the real router.
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server_ops = ops.clone();
    let server = std::thread::Builder::new()
        .name("http-server".into())
        .spawn(move || -> io::Result<()> {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("server-worker")
                .build()?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
                let _ = addr_tx.send(listener.local_addr()?);
                store_http::serve(listener, server_ops, async move {
                    let _ = stop_rx.await;
                })
                .await
            })
        })?;
    let addr = addr_rx.await.map_err(|_| "the server failed to start")?;
    let base = format!("http://{addr}");

    let ns = Namespace::new(NAMESPACE)?;
    let block = random_bytes(GEN_CHUNK, 0xb10b).freeze();
    // Fixtures for the gets (their pins dropped at once).
    let mut small_keys = Vec::with_capacity(SMALL_POOL);
    for _ in 0..SMALL_POOL {
        let body = small_body();
        let r = store
            .put_opts(
                &ns,
                &body[..],
                store_core::PutOptions {
                    len: Some(SMALL as u64),
                    ..Default::default()
                },
            )
            .await?;
        small_keys.push(r.key().clone());
    }
    let mut large_keys = Vec::new();
    for _ in 0..Workload::LargeGet.clients() {
        let r = store
            .put_opts(
                &ns,
                StreamReader::new(large_body(&block)),
                store_core::PutOptions {
                    len: Some(LARGE),
                    ..Default::default()
                },
            )
            .await?;
        large_keys.push(r.key().clone());
    }
    let ctx = Ctx {
        store: store.clone(),
        kv,
        ops: ops.clone(),
        http: reqwest::Client::builder().build()?,
        base,
        ns,
        small_keys: Arc::new(small_keys),
        large_keys: Arc::new(large_keys),
        block,
        held: Arc::default(),
    };

    eprintln!(
        "http_load: {} round(s); server on {addr}; store in {}",
        plan.rounds,
        dir.path().display()
    );
    let mut rows = Vec::new();
    for w in only {
        for side in [Side::Library, Side::Http] {
            run_window(&ctx, w, side, plan.warmup).await?;
        }
        let mut row = Row {
            w,
            lib: Vec::new(),
            http: Vec::new(),
        };
        for round in 0..plan.rounds {
            let order = if round % 2 == 0 {
                [Side::Library, Side::Http]
            } else {
                [Side::Http, Side::Library]
            };
            for side in order {
                let s = run_window(&ctx, w, side, w.window(&plan)).await?;
                eprintln!(
                    "  {:<44} round {} {:<7} {}",
                    w.label(),
                    round + 1,
                    format!("{side:?}"),
                    fmt_rate(w, s.rate(w), s.mib_per_s())
                );
                match side {
                    Side::Library => row.lib.push(s),
                    Side::Http => row.http.push(s),
                }
            }
        }
        rows.push(row);
    }

    let _ = stop_tx.send(());
    tokio::task::spawn_blocking(move || server.join())
        .await?
        .map_err(|_| "the server thread panicked")??;
    let elapsed = t0.elapsed().as_secs_f64();

    println!("| Workload | Library | HTTP | HTTP/library |");
    println!("|---|---|---|---:|");
    for r in &rows {
        let w = r.w;
        let lib = r.med(Side::Library, |s| s.rate(w));
        let http = r.med(Side::Http, |s| s.rate(w));
        let ratios: Vec<f64> = r
            .lib
            .iter()
            .zip(&r.http)
            .map(|(l, h)| h.rate(w) / l.rate(w))
            .collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(0.0, f64::max);
        let spread = if ratios.len() > 1 {
            format!(" (rounds {lo:.2}–{hi:.2})")
        } else {
            String::new()
        };
        println!(
            "| {} | {} | {} | **{:.2}×**{spread} |",
            w.label(),
            fmt_rate(w, lib, r.med(Side::Library, Sample::mib_per_s)),
            fmt_rate(w, http, r.med(Side::Http, Sample::mib_per_s)),
            http / lib
        );
    }
    println!();
    println!(
        "Diagnostics (medians): process CPU per operation, all threads (clients, server, \
         store); for puts, SQLite writes per group commit."
    );
    println!();
    println!(
        "| Workload | CPU/op library | CPU/op HTTP | writes/commit library | writes/commit HTTP |"
    );
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        let cpu = |side| {
            let v = match side {
                Side::Library => &r.lib,
                Side::Http => &r.http,
            };
            let ms: Vec<f64> = v.iter().filter_map(Sample::cpu_ms_per_op).collect();
            if ms.is_empty() {
                "—".to_string()
            } else {
                format!("{:.3} ms", median(ms))
            }
        };
        let per_commit = |side| {
            let v = match side {
                Side::Library => &r.lib,
                Side::Http => &r.http,
            };
            let x: Vec<f64> = v.iter().filter_map(Sample::writes_per_commit).collect();
            if x.is_empty() || r.w == Workload::SmallGet || r.w == Workload::LargeGet {
                "—".to_string()
            } else {
                format!("{:.1}", median(x))
            }
        };
        println!(
            "| {} | {} | {} | {} | {} |",
            r.w.label(),
            cpu(Side::Library),
            cpu(Side::Http),
            per_commit(Side::Library),
            per_commit(Side::Http)
        );
    }
    println!();
    println!(
        "Machine: {nproc} CPUs (`nproc`), {}. Load average (1 min) at start / end: {} / {}. \
         {} interleaved round(s) per workload ({:.1} s windows for 4 KiB, {:.1} s for 64 MiB, \
         order alternating), medians; total run {:.0} s.",
        cpu_model(),
        load_start,
        loadavg(),
        plan.rounds,
        plan.small_window.as_secs_f64(),
        plan.large_window.as_secs_f64(),
        elapsed
    );
    println!(
        "Client and server ran on the same {nproc}-core machine: the HTTP load generator \
         (reqwest) competes with the server for CPU, so the ratios are a lower bound on \
         what a remote client would see."
    );
    Ok(())
}
