//! `bench-grpc [--quick] [--blobpool PATH]`: the Remote Execution API
//! over gRPC against the library and HTTP (issue 42, "Performance";
//! ADR-071).
//!
//! One `blobpool serve` (the release binary, the embedded default store
//! in a scratch directory, one cache namespace `cc`, loopback without
//! identities) and, in this process, the library's default composite
//! store (SQLite kv tier + local files, [`bench::fixtures::composite_store`]).
//! Alternating rounds (the order flips each round) of:
//!
//! 1. `FindMissingBlobs` of 10,000 digests, half present (256-byte blobs
//!    stored by `BatchUpdateBlobs` under their SHA-256 names, as Bazel
//!    stores them; asked by SHA-256 and again by BLAKE3), against the
//!    library's `Store::has_many` of the same blobs' BLAKE3 digests (the
//!    same bodies put into the in-process store): time per call, library
//!    ÷ gRPC (≥ 0.5× is the target: gRPC at most twice the library's time).
//! 2. ByteStream `Read` of a 64 MiB entry against an HTTP GET of the same
//!    entry (`/cache/cc/cas/<sha256>`), from the same server, each over
//!    one reused cleartext HTTP/2 connection (gRPC's own transport; the
//!    same GET over HTTP/1.1 is reported too): bytes per second, gRPC ÷
//!    HTTP (≥ 0.8× is the target). Bodies are counted, not kept.
//!
//! Prints Markdown on stdout: per ratio its median and lowest round, with
//! the machine's load average before and after.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use bench::data::random_bytes;
use bench::fixtures::{composite_store, err, BenchResult};
use bench::httpload::{self, Req};
use bench::serve::{require_built, Blobpool};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Method;
use sha2::{Digest as _, Sha256};
use store_core::Store;
use store_grpc::proto::build::bazel::remote::execution::v2 as re;
use store_grpc::proto::google::bytestream as bs;
use store_types::Digest;
use tonic::transport::Channel;

const NS: &str = "cc";
const SHA256: i32 = re::digest_function::Value::Sha256 as i32;
const BLAKE3: i32 = re::digest_function::Value::Blake3 as i32;
/// Digests per `FindMissingBlobs` / `has_many`; half are present.
const DIGESTS: usize = 10_000;
const SMALL: usize = 256;
const LARGE: usize = 64 << 20;
/// Blobs per `BatchUpdateBlobs` while filling (well under its 4 MiB cap).
const BATCH: usize = 1_000;

struct Opts {
    quick: bool,
    blobpool: PathBuf,
}

fn parse() -> Result<Opts, String> {
    let exe = std::env::current_exe().map_err(err)?;
    let mut o = Opts {
        quick: false,
        blobpool: exe.with_file_name("blobpool"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--blobpool" => {
                o.blobpool = PathBuf::from(args.next().ok_or("--blobpool needs a path")?)
            }
            _ => {
                return Err(format!(
                    "usage: bench-grpc [--quick] [--blobpool PATH] (got {a:?})"
                ))
            }
        }
    }
    Ok(o)
}

/// `blobpool serve` in a scratch directory; stopped on drop.
struct Server {
    bp: Blobpool,
    _dir: tempfile::TempDir,
}

async fn start(blobpool: &Path) -> BenchResult<Server> {
    require_built(&[blobpool], "cargo build --release -p blobpool")?;
    let dir = tempfile::Builder::new()
        .prefix("blobpool-bench-grpc-")
        .tempdir()
        .map_err(err)?;
    let settings = format!("[gc]\ninterval = \"off\"\n[gc.namespaces.{NS}]\npolicy = \"cache\"\n");
    let bp = Blobpool::start(Command::new(blobpool), blobpool, dir.path(), &settings)?;
    bp.wait().await?;
    Ok(Server { bp, _dir: dir })
}

type H2 = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

/// A cleartext HTTP/2 connection (prior knowledge), as gRPC's.
async fn http2(addr: SocketAddr) -> BenchResult<H2> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(err)?;
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .map_err(err)?;
    tokio::spawn(conn);
    Ok(sender)
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn re_digest(hash: String, size: usize) -> re::Digest {
    re::Digest {
        hash,
        size_bytes: size as i64,
    }
}

/// The 10,000 digests three ways: SHA-256 and BLAKE3 names for
/// `FindMissingBlobs`, and the library's BLAKE3 digests.
struct FindSet {
    sha: Vec<re::Digest>,
    blake: Vec<re::Digest>,
    lib: Vec<Digest>,
}

/// Stores `DIGESTS / 2` small blobs in the server (`BatchUpdateBlobs`,
/// SHA-256) and in `store`, interleaved with as many absent ones.
async fn fill_small(
    cas: &mut re::content_addressable_storage_client::ContentAddressableStorageClient<Channel>,
    store: &Store,
) -> BenchResult<FindSet> {
    let mut set = FindSet {
        sha: vec![],
        blake: vec![],
        lib: vec![],
    };
    let ns = bench::fixtures::ns();
    let mut batch = Vec::new();
    for i in 0..DIGESTS {
        let body = random_bytes(SMALL);
        let b3 = Digest::of(&body);
        set.sha.push(re_digest(sha256_hex(&body), SMALL));
        set.blake.push(re_digest(b3.to_hex(), SMALL));
        set.lib.push(b3);
        if i % 2 == 1 {
            continue; // absent
        }
        store.put_bytes(&ns, body.clone()).await.map_err(err)?;
        batch.push(re::batch_update_blobs_request::Request {
            digest: set.sha.last().cloned(),
            data: body,
            compressor: 0,
        });
        if batch.len() == BATCH || i + 2 >= DIGESTS {
            let req = re::BatchUpdateBlobsRequest {
                instance_name: NS.into(),
                requests: std::mem::take(&mut batch),
                digest_function: SHA256,
            };
            let r = cas.batch_update_blobs(req).await.map_err(err)?;
            let failed = (r.get_ref().responses.iter())
                .filter(|x| x.status.as_ref().is_some_and(|s| s.code != 0))
                .count();
            if failed > 0 {
                return Err(format!("BatchUpdateBlobs: {failed} blobs refused"));
            }
        }
    }
    Ok(set)
}

/// Seconds per `FindMissingBlobs` of `digests` (`calls` of them), checking
/// that half are missing.
async fn time_find(
    cas: &mut re::content_addressable_storage_client::ContentAddressableStorageClient<Channel>,
    digests: &[re::Digest],
    function: i32,
    calls: usize,
) -> BenchResult<f64> {
    let t = Instant::now();
    for _ in 0..calls {
        let req = re::FindMissingBlobsRequest {
            instance_name: NS.into(),
            blob_digests: digests.to_vec(),
            digest_function: function,
        };
        let missing = cas.find_missing_blobs(req).await.map_err(err)?;
        let n = missing.get_ref().missing_blob_digests.len();
        if n != digests.len() / 2 {
            return Err(format!(
                "FindMissingBlobs: {n} missing, not {}",
                digests.len() / 2
            ));
        }
    }
    Ok(t.elapsed().as_secs_f64() / calls as f64)
}

/// Seconds per library `has_many` of `digests`.
async fn time_has_many(store: &Store, digests: &[Digest], calls: usize) -> BenchResult<f64> {
    let ns = bench::fixtures::ns();
    let t = Instant::now();
    for _ in 0..calls {
        let found = store.has_many(&ns, digests).await.map_err(err)?;
        let n = found.iter().filter(|b| **b).count();
        if n != digests.len() / 2 {
            return Err(format!("has_many: {n} present, not {}", digests.len() / 2));
        }
    }
    Ok(t.elapsed().as_secs_f64() / calls as f64)
}

/// Bytes per second of ByteStream `Read`s of `name` (`reads` of them).
async fn time_read(
    bsc: &mut bs::byte_stream_client::ByteStreamClient<Channel>,
    name: &str,
    reads: usize,
) -> BenchResult<f64> {
    let t = Instant::now();
    for _ in 0..reads {
        let req = bs::ReadRequest {
            resource_name: name.into(),
            read_offset: 0,
            read_limit: 0,
        };
        let mut stream = bsc.read(req).await.map_err(err)?.into_inner();
        let mut len = 0;
        while let Some(m) = stream.message().await.map_err(err)? {
            len += m.data.len();
        }
        if len != LARGE {
            return Err(format!("ByteStream Read: {len} bytes, not {LARGE}"));
        }
    }
    Ok((LARGE * reads) as f64 / t.elapsed().as_secs_f64())
}

/// Bytes per second of HTTP/2 GETs of `path` (`reads` of them).
async fn time_get_h2(h2: &mut H2, addr: SocketAddr, path: &str, reads: usize) -> BenchResult<f64> {
    let t = Instant::now();
    for _ in 0..reads {
        let req = hyper::Request::get(format!("http://{addr}{path}"))
            .body(Empty::new())
            .map_err(err)?;
        h2.ready().await.map_err(err)?;
        let resp = h2.send_request(req).await.map_err(err)?;
        if resp.status() != 200 {
            return Err(format!("GET {path} over HTTP/2: {}", resp.status()));
        }
        let mut body = resp.into_body();
        let mut len = 0;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.map_err(err)?.into_data() {
                len += data.len();
            }
        }
        if len != LARGE {
            return Err(format!("GET {path} over HTTP/2: {len} bytes, not {LARGE}"));
        }
    }
    Ok((LARGE * reads) as f64 / t.elapsed().as_secs_f64())
}

/// Bytes per second of HTTP/1.1 GETs of `path` (`reads` of them).
async fn time_get_h1(
    h1: &mut httpload::Sender,
    addr: SocketAddr,
    path: &str,
    reads: usize,
) -> BenchResult<f64> {
    let req = Req::get(path, Some(LARGE as u64));
    let t = Instant::now();
    for _ in 0..reads {
        let (status, _) = httpload::send(h1, addr, &req).await?;
        if status != 200 {
            return Err(format!("GET {path} over HTTP/1.1: {status}"));
        }
    }
    Ok((LARGE * reads) as f64 / t.elapsed().as_secs_f64())
}

/// One round's figures.
#[derive(Default, Clone, Copy)]
struct Round {
    find_sha: f64,
    find_blake: f64,
    has_many: f64,
    read: f64,
    get_h2: f64,
    get_h1: f64,
}

/// The clients and sets every round uses.
struct Bench {
    addr: SocketAddr,
    cas: re::content_addressable_storage_client::ContentAddressableStorageClient<Channel>,
    bsc: bs::byte_stream_client::ByteStreamClient<Channel>,
    h2: H2,
    h1: httpload::Sender,
    store: Store,
    set: FindSet,
    resource: String,
    path: String,
    calls: usize,
    reads: usize,
}

impl Bench {
    /// One round; `flip` runs the library and HTTP sides first.
    async fn round(&mut self, flip: bool) -> BenchResult<Round> {
        let mut r = Round::default();
        for step in 0..2 {
            if (step == 0) == flip {
                r.has_many = time_has_many(&self.store, &self.set.lib, self.calls).await?;
                r.get_h2 = time_get_h2(&mut self.h2, self.addr, &self.path, self.reads).await?;
                r.get_h1 = time_get_h1(&mut self.h1, self.addr, &self.path, self.reads).await?;
            } else {
                r.find_sha = time_find(&mut self.cas, &self.set.sha, SHA256, self.calls).await?;
                r.find_blake =
                    time_find(&mut self.cas, &self.set.blake, BLAKE3, self.calls).await?;
                r.read = time_read(&mut self.bsc, &self.resource, self.reads).await?;
            }
        }
        Ok(r)
    }
}

/// Puts the 64 MiB entry under its SHA-256 name (HTTP `PUT
/// /cache/cc/cas/<sha256>`); its ByteStream resource name and HTTP path.
async fn fill_large(addr: SocketAddr) -> BenchResult<(String, String)> {
    let body = random_bytes(LARGE);
    let hash = sha256_hex(&body);
    let path = format!("/cache/{NS}/cas/{hash}");
    let req = Req {
        method: Method::PUT,
        path: path.clone(),
        body: Some(body),
        headers: vec![],
        class: 0,
        expect_len: None,
    };
    let mut s = httpload::connect(addr).await?;
    let (status, answer) = httpload::send(&mut s, addr, &req).await?;
    if status >= 300 {
        return Err(format!(
            "PUT {path}: {status} {}",
            String::from_utf8_lossy(&answer)
        ));
    }
    Ok((format!("{NS}/blobs/{hash}/{LARGE}"), path))
}

async fn setup(server: &Server, quick: bool, lib_dir: &Path) -> BenchResult<Bench> {
    let addr = server.bp.addr;
    let ch = Channel::from_shared(format!("http://{addr}"))
        .map_err(err)?
        .connect()
        .await
        .map_err(err)?;
    let limit = 64 << 20;
    let mut cas =
        re::content_addressable_storage_client::ContentAddressableStorageClient::new(ch.clone())
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
    let bsc = bs::byte_stream_client::ByteStreamClient::new(ch).max_decoding_message_size(limit);
    let store = composite_store(lib_dir).await?;
    let set = fill_small(&mut cas, &store).await?;
    let (resource, path) = fill_large(addr).await?;
    Ok(Bench {
        addr,
        cas,
        bsc,
        h2: http2(addr).await?,
        h1: httpload::connect(addr).await?,
        store,
        set,
        resource,
        path,
        calls: if quick { 3 } else { 10 },
        reads: if quick { 1 } else { 3 },
    })
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// `median (lowest round; all rounds)` of `f`, and whether the lowest
/// round meets `target`.
fn ratio(rounds: &[Round], f: impl Fn(&Round) -> f64) -> (f64, f64, String) {
    let v: Vec<f64> = rounds.iter().map(f).collect();
    let med = bench::table::median(&v).unwrap_or(f64::NAN);
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let all: Vec<String> = v.iter().map(|x| format!("{x:.2}")).collect();
    (med, lo, all.join(", "))
}

fn verdict(med: f64, lo: f64, target: f64) -> &'static str {
    if lo >= target {
        "**met**"
    } else if med >= target {
        "**not proven** (median met, lowest round not)"
    } else {
        "**missed**"
    }
}

/// Picks one round's ratio.
type Pick = fn(&Round) -> f64;

fn markdown(rounds: &[Round], load: (&str, &str), cpus: usize) -> String {
    use std::fmt::Write;
    let ms = |f: &dyn Fn(&Round) -> f64| {
        bench::table::median(&rounds.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN)
    };
    let mut s = String::new();
    let _ = writeln!(s, "| Figure | median of {} rounds |", rounds.len());
    let _ = writeln!(s, "|---|---:|");
    let rows: [(&str, f64); 6] = [
        (
            "library `has_many`, 10,000 digests (5,000 present)",
            ms(&|r| r.has_many) * 1e3,
        ),
        (
            "gRPC `FindMissingBlobs`, 10,000 SHA-256 digests",
            ms(&|r| r.find_sha) * 1e3,
        ),
        (
            "gRPC `FindMissingBlobs`, 10,000 BLAKE3 digests",
            ms(&|r| r.find_blake) * 1e3,
        ),
        (
            "ByteStream `Read`, 64 MiB (HTTP/2)",
            ms(&|r| r.read) / f64::from(1 << 20),
        ),
        (
            "HTTP GET, 64 MiB, HTTP/2",
            ms(&|r| r.get_h2) / f64::from(1 << 20),
        ),
        (
            "HTTP GET, 64 MiB, HTTP/1.1",
            ms(&|r| r.get_h1) / f64::from(1 << 20),
        ),
    ];
    for (i, (name, v)) in rows.iter().enumerate() {
        let unit = if i < 3 { "ms per call" } else { "MiB/s" };
        let _ = writeln!(s, "| {name} | {v:.1} {unit} |");
    }
    let _ = writeln!(s, "\n| Ratio | median | lowest round | rounds | target |");
    let _ = writeln!(s, "|---|---:|---:|---|---|");
    let ratios: [(&str, f64, Pick); 4] = [
        (
            "`FindMissingBlobs` (SHA-256) ÷ `has_many`, speed",
            0.5,
            |r| r.has_many / r.find_sha,
        ),
        (
            "`FindMissingBlobs` (BLAKE3) ÷ `has_many`, speed",
            0.5,
            |r| r.has_many / r.find_blake,
        ),
        ("ByteStream `Read` ÷ HTTP/2 GET, 64 MiB", 0.8, |r| {
            r.read / r.get_h2
        }),
        ("ByteStream `Read` ÷ HTTP/1.1 GET, 64 MiB", 0.8, |r| {
            r.read / r.get_h1
        }),
    ];
    for (name, target, f) in &ratios {
        let (med, lo, all) = ratio(rounds, f);
        let v = verdict(med, lo, *target);
        let _ = writeln!(
            s,
            "| {name} | {med:.2}× | {lo:.2}× | {all} | ≥ {target}×: {v} |"
        );
    }
    let _ = writeln!(
        s,
        "\nLoad average (1/5/15 min) before: {}, after: {} on {cpus} CPUs (a shared machine: other jobs were running).",
        load.0, load.1
    );
    s
}

async fn run(o: &Opts) -> BenchResult<String> {
    let load0 = load_average();
    let server = start(&o.blobpool).await?;
    let lib_dir = tempfile::Builder::new()
        .prefix("blobpool-bench-grpc-lib-")
        .tempdir()
        .map_err(err)?;
    let mut b = setup(&server, o.quick, lib_dir.path()).await?;
    let n = if o.quick { 3 } else { 7 };
    let mut rounds = Vec::new();
    for i in 0..n {
        let r = b.round(i % 2 == 1).await?;
        eprintln!(
            "bench-grpc: round {}: has_many {:.1} ms, FindMissingBlobs {:.1} / {:.1} ms, Read {:.0} MiB/s, GET h2 {:.0} / h1 {:.0} MiB/s",
            i + 1,
            r.has_many * 1e3,
            r.find_sha * 1e3,
            r.find_blake * 1e3,
            r.read / f64::from(1 << 20),
            r.get_h2 / f64::from(1 << 20),
            r.get_h1 / f64::from(1 << 20),
        );
        rounds.push(r);
    }
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    Ok(markdown(&rounds, (&load0, &load_average()), cpus))
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    match rt.block_on(run(&o)) {
        Ok(md) => {
            println!("{md}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench-grpc: {e}");
            ExitCode::FAILURE
        }
    }
}
