//! `bench-http [--quick] [--json OUT] [--blobpool PATH] [--static PATH]`:
//! Blobpool's HTTP server against an external anchor (issue 33).
//!
//! 1. **Anchor** (ADR-056): nginx (Debian's, `sendfile on`,
//!    `open_file_cache` on: Blobpool's own caches are hot, 1 worker) and
//!    `static-server` (a minimal hyper server, this crate) serve the same
//!    files — 1,000 of 4 KiB and of 1 KiB, 16 of 1 MiB, a few of 64 MiB —
//!    that `blobpool serve` (the embedded default store) holds, the 1 KiB
//!    ones also as `/cache/cc/k/{i}` keys. Every server is pinned to CPU 0
//!    (`taskset`); the load generator is `wrk` (Debian's), its own process
//!    pinned to CPU 1, picking a random file per request. Interleaved
//!    rounds: 4 KiB over 16 connections, 4 KiB with `Connection: close` (a
//!    fresh connection per GET, as ccache makes), `/cache` 1 KiB (and the
//!    same entries by digest) over 16, 1 MiB over 4, 64 MiB over 2.
//!    Reported per server: req/s, p50/p99, and server CPU per request: the
//!    process's (nginx's workers included, from `/proc/PID/stat`) plus
//!    CPU 0's softirq time (`/proc/stat`: the loopback's receive work).
//! 2. **Tail latency over HTTP**: 16 connections, 90 % GETs of 20,000 live
//!    4 KiB entries (namespace policy `keep`), 10 % PUTs of fresh ones;
//!    rounds alternate between no sweep and a sweep (`POST /v1/sweep`
//!    twice: mark, then the deletes, the delete window being zero) of
//!    100,000 garbage entries (policy `unreferenced`, their pin tokens
//!    expired) while the clients run. The run fails unless every garbage
//!    entry is deleted.
//!
//! Prints Markdown on stdout; `--json OUT` writes every round's figures.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::data::random_bytes;
use bench::fixtures::{err, BenchResult};
use bench::httpload::{self, ClassResult, LoadResult, MakeReq, Req};
use bench::serve::{free_port, require_built, Blobpool};
use bytes::Bytes;
use hyper::Method;
use rand::Rng;
use serde::Serialize;

const SMALL: usize = 4 * 1024;
const LARGE: usize = 64 << 20;
const TINY: usize = 1024;
const MEDIUM: usize = 1 << 20;
/// The CPU the servers run on; the generator runs on [`GEN_CPU`].
const SERVER_CPU: usize = 0;
const GEN_CPU: usize = 1;

struct Opts {
    quick: bool,
    only: Option<String>,
    json: Option<PathBuf>,
    blobpool: PathBuf,
    static_server: PathBuf,
}

fn parse() -> Result<Opts, String> {
    let exe = std::env::current_exe().map_err(err)?;
    let mut o = Opts {
        quick: false,
        only: None,
        json: None,
        blobpool: exe.with_file_name("blobpool"),
        static_server: exe.with_file_name("static-server"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--quick" => o.quick = true,
            // For profiles: one part only (`4k`, `64m` or `tail`).
            "--only" => o.only = Some(value()?), // 4k, 4k-close, cache-1k, 1m, 64m, tail
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--blobpool" => o.blobpool = PathBuf::from(value()?),
            "--static" => o.static_server = PathBuf::from(value()?),
            _ => return Err(format!("usage: bench-http [--quick] [--only 4k|4k-close|cache-1k|1m|64m|tail] [--json OUT] [--blobpool PATH] [--static PATH] (got {a:?})")),
        }
    }
    Ok(o)
}

/// The three servers and their files; stopped on drop.
struct Servers {
    /// Before `dir`: dropped (killed) before the directory goes.
    blobpool: Blobpool,
    dir: tempfile::TempDir,
    hyper: Child,
    nginx_pid: u32,
    bp: SocketAddr,
    hy: SocketAddr,
    ng: SocketAddr,
}

impl Drop for Servers {
    fn drop(&mut self) {
        // The blobpool child goes with its field, after this (before `dir`).
        let _ = self.hyper.kill();
        let _ = self.hyper.wait();
        // SAFETY: sends SIGQUIT (graceful stop) to nginx's master.
        unsafe { libc::kill(self.nginx_pid as i32, libc::SIGQUIT) };
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The settings after [`Blobpool::start`]'s own (data, listen, logs).
const BLOBPOOL_SETTINGS: &str = r#"window = "0s"
token_ttl = "1s"
max_tokens = 1000000
max_tokens_per_identity = 1000000
[gc]
interval = "off"
[gc.namespaces.live]
policy = "keep"
[gc.namespaces.garbage]
policy = "unreferenced"
[gc.namespaces.cc]
policy = "cache"
"#;

fn nginx_config(dir: &Path, port: u16) -> BenchResult<String> {
    let user = |flag: &str| -> BenchResult<String> {
        let o = Command::new("id").arg(flag).output().map_err(err)?;
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    Ok(format!(
        "user {u} {g};\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 1024; }}\nhttp {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  keepalive_requests 1000000;\n\
         open_file_cache max=10000 inactive=60s;\n  open_file_cache_valid 60s;\n\
         server {{\n    listen 127.0.0.1:{port};\n    root {d}/www;\n  }}\n}}\n",
        u = user("-un")?,
        g = user("-gn")?,
        d = dir.display()
    ))
}

fn put(ns: &str, body: Bytes, class: usize) -> Req {
    Req {
        method: Method::PUT,
        path: format!("/v1/blobs/{ns}"),
        headers: vec![("content-type", "application/octet-stream".into())],
        body: Some(body),
        class,
        expect_len: None,
    }
}

/// PUTs `body` into `ns`; its digest.
async fn put_one(addr: SocketAddr, ns: &str, body: Bytes) -> BenchResult<String> {
    let mut s = httpload::connect(addr).await?;
    let (status, answer) = httpload::send(&mut s, addr, &put(ns, body, 0)).await?;
    if status >= 300 {
        return Err(format!(
            "PUT {ns}: {status} {}",
            String::from_utf8_lossy(&answer)
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&answer).map_err(err)?;
    Ok(v["digest"]
        .as_str()
        .ok_or("PUT answered no digest")?
        .to_string())
}

/// PUTs `n` fresh bodies of `size` into `ns` over 16 connections; their
/// digests.
async fn fill(addr: SocketAddr, ns: &str, n: usize, size: usize) -> BenchResult<Vec<String>> {
    let mut tasks = Vec::new();
    for t in 0..16 {
        let ns = ns.to_string();
        let count = n / 16 + usize::from(t < n % 16);
        tasks.push(tokio::spawn(async move {
            let mut s = httpload::connect(addr).await?;
            let mut out = Vec::with_capacity(count);
            for _ in 0..count {
                let (status, answer) =
                    httpload::send(&mut s, addr, &put(&ns, random_bytes(size), 0)).await?;
                if status >= 300 {
                    return Err(format!(
                        "PUT {ns}: {status} {}",
                        String::from_utf8_lossy(&answer)
                    ));
                }
                let v: serde_json::Value = serde_json::from_slice(&answer).map_err(err)?;
                out.push(v["digest"].as_str().ok_or("no digest")?.to_string());
            }
            Ok::<_, String>(out)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await.map_err(err)??);
    }
    Ok(all)
}

/// The digests Blobpool answered for each class's files, by file prefix.
type Digests = std::collections::BTreeMap<&'static str, Vec<String>>;

/// `taskset -c SERVER_CPU program`.
fn pinned(program: &Path) -> Command {
    let mut c = Command::new("taskset");
    c.arg("-c").arg(SERVER_CPU.to_string()).arg(program);
    c
}

async fn start(o: &Opts, small: usize, large: usize) -> BenchResult<(Servers, Digests)> {
    require_built(
        &[&o.blobpool, &o.static_server],
        "cargo build --release -p blobpool -p bench --bins",
    )?;
    let dir = tempfile::Builder::new()
        .prefix("blobpool-bench-http-")
        .tempdir()
        .map_err(err)?;
    let d = dir.path().to_path_buf();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(err)?;
    std::fs::create_dir_all(d.join("www/files")).map_err(err)?;
    let mut files = Vec::new();
    let medium = (small / 50).max(4);
    for (prefix, n, size) in [
        ("s", small, SMALL),
        ("t", small, TINY),
        ("m", medium, MEDIUM),
        ("l", large, LARGE),
    ] {
        for i in 0..n {
            let body = random_bytes(size);
            std::fs::write(d.join(format!("www/files/{prefix}-{i}")), &body).map_err(err)?;
            files.push((prefix, i, body));
        }
    }
    let ng_port = free_port()?;
    std::fs::write(d.join("nginx.conf"), nginx_config(&d, ng_port)?).map_err(err)?;
    let blobpool = Blobpool::start(pinned(&o.blobpool), &o.blobpool, &d, BLOBPOOL_SETTINGS)?;
    let mut hyper = pinned(&o.static_server)
        .arg("--root")
        .arg(d.join("www"))
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", o.static_server.display()))?;
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(hyper.stdout.take().ok_or("no stdout")?),
        &mut line,
    )
    .map_err(err)?;
    let hy: SocketAddr = line
        .trim()
        .trim_start_matches("listening ")
        .parse()
        .map_err(err)?;
    let status = pinned(Path::new("nginx"))
        .arg("-c")
        .arg(d.join("nginx.conf"))
        .arg("-p")
        .arg(&d)
        .arg("-e")
        .arg(d.join("nginx-error.log"))
        .status();
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            let mut b = hyper;
            let _ = (b.kill(), b.wait());
            return Err(format!("nginx: {e} (apt-get install nginx-light)"));
        }
    };
    if !status.success() {
        let mut b = hyper;
        let _ = (b.kill(), b.wait());
        return Err(format!(
            "nginx did not start: {}",
            std::fs::read_to_string(d.join("nginx-error.log")).unwrap_or_default()
        ));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let nginx_pid: u32 = std::fs::read_to_string(d.join("nginx.pid"))
        .map_err(err)?
        .trim()
        .parse()
        .map_err(err)?;
    let (bp, ng) = (blobpool.addr, SocketAddr::from(([127, 0, 0, 1], ng_port)));
    let servers = Servers {
        dir,
        blobpool,
        hyper,
        nginx_pid,
        bp,
        hy,
        ng,
    };
    eprintln!(
        "bench-http: pids blobpool={} nginx={} static-server={}",
        servers.blobpool.child.id(),
        servers.nginx_pid,
        servers.hyper.id()
    );
    servers.blobpool.wait().await?;
    let mut digests = Digests::new();
    for (prefix, i, body) in &files {
        let digest = put_one(bp, "anchor", body.clone()).await?;
        if *prefix == "t" {
            cache_put(bp, &format!("/cache/cc/k/{i}"), body.clone()).await?;
        }
        digests.entry(*prefix).or_default().push(digest);
    }
    // The three answer the same bytes.
    for (prefix, i, body) in files.iter().filter(|(_, i, _)| *i == 0) {
        let digest = &digests[prefix][*i];
        let fs_path = format!("/files/{prefix}-{i}");
        let mut paths = vec![
            (bp, format!("/v1/blobs/anchor/{digest}")),
            (ng, fs_path.clone()),
            (hy, fs_path),
        ];
        if *prefix == "t" {
            paths.push((bp, format!("/cache/cc/k/{i}")));
        }
        for (addr, path) in paths {
            let mut s = httpload::connect(addr).await?;
            let (status, got) =
                httpload::send(&mut s, addr, &Req::get(&path, Some(body.len() as u64))).await?;
            if status != 200 || got[..] != body[..got.len()] {
                return Err(format!("{addr}{path}: {status}, not the file's bytes"));
            }
        }
    }
    Ok((servers, digests))
}

/// `PUT` of a cache key.
async fn cache_put(addr: SocketAddr, path: &str, body: Bytes) -> BenchResult<()> {
    let mut s = httpload::connect(addr).await?;
    let req = Req {
        method: Method::PUT,
        path: path.to_string(),
        headers: vec![],
        body: Some(body),
        class: 0,
        expect_len: None,
    };
    let (status, answer) = httpload::send(&mut s, addr, &req).await?;
    if status >= 300 {
        return Err(format!(
            "PUT {path}: {status} {}",
            String::from_utf8_lossy(&answer)
        ));
    }
    Ok(())
}

#[derive(Serialize, Clone)]
struct ServerRound {
    ops: f64,
    p50_us: f64,
    p99_us: f64,
    /// The process's CPU (utime + stime, children included) plus the
    /// server CPU's softirq time, per request.
    cpu_us_per_req: f64,
    /// Of which softirq.
    softirq_us_per_req: f64,
}

#[derive(Serialize)]
struct AnchorRound {
    /// The first Blobpool row's and nginx's req/s (what `bench-skeptic`
    /// reads).
    blobpool_ops: f64,
    nginx_ops: f64,
    /// Blobpool first.
    servers: Vec<(String, ServerRound)>,
}

#[derive(Serialize)]
struct Anchor {
    size_name: String,
    /// `--only` name.
    key: String,
    connections: usize,
    window_secs: f64,
    /// Blobpool ÷ nginx req/s must reach this in every round.
    target: f64,
    rounds: Vec<AnchorRound>,
}

/// One GET class of the anchor.
struct Case {
    key: &'static str,
    name: &'static str,
    prefix: &'static str,
    conns: usize,
    close: bool,
    /// Blobpool is asked by cache key (`/cache/cc/k/{i}`).
    cache: bool,
    target: f64,
}

const CASES: [Case; 5] = [
    Case {
        key: "4k",
        name: "4 KiB",
        prefix: "s",
        conns: 16,
        close: false,
        cache: false,
        target: 0.7,
    },
    Case {
        key: "4k-close",
        name: "4 KiB, new connection each",
        prefix: "s",
        conns: 4,
        close: true,
        cache: false,
        target: 0.0,
    },
    Case {
        key: "cache-1k",
        name: "1 KiB `/cache`",
        prefix: "t",
        conns: 16,
        close: false,
        cache: true,
        target: 0.7,
    },
    Case {
        key: "1m",
        name: "1 MiB",
        prefix: "m",
        conns: 4,
        close: false,
        cache: false,
        target: 0.6,
    },
    Case {
        key: "64m",
        name: "64 MiB",
        prefix: "l",
        conns: 2,
        close: false,
        cache: false,
        target: 0.8,
    },
];

/// One round against one server: `wrk` pinned to [`GEN_CPU`], the
/// server's CPU and [`SERVER_CPU`]'s softirq read around it.
fn measure(run: &httpload::WrkRun<'_>, pid: u32) -> BenchResult<ServerRound> {
    let (c0, s0) = (
        httpload::cpu_secs(pid),
        httpload::softirq_secs(&[SERVER_CPU]),
    );
    let r = httpload::wrk(run)?;
    let (c1, s1) = (
        httpload::cpu_secs(pid),
        httpload::softirq_secs(&[SERVER_CPU]),
    );
    if r.errors > 0 {
        return Err(format!("{}: {} failed requests", run.addr, r.errors));
    }
    let n = r.requests as f64;
    Ok(ServerRound {
        ops: r.ops_per_sec(),
        p50_us: r.p50_us,
        p99_us: r.p99_us,
        cpu_us_per_req: ((c1 - c0) + (s1 - s0)) * 1e6 / n,
        softirq_us_per_req: (s1 - s0) * 1e6 / n,
    })
}

async fn anchor(
    s: &Servers,
    d: &Digests,
    quick: bool,
    only: Option<&str>,
) -> BenchResult<Vec<Anchor>> {
    let (rounds, window) = if quick { (2, 1.0) } else { (3, 2.0) };
    let mut out = Vec::new();
    for case in &CASES {
        if only.is_some_and(|o| o != case.key) {
            continue;
        }
        let digests = &d[case.prefix];
        let by_digest: Vec<String> = digests
            .iter()
            .map(|d| format!("/v1/blobs/anchor/{d}"))
            .collect();
        let files: Vec<String> = (0..digests.len())
            .map(|i| format!("/files/{}-{i}", case.prefix))
            .collect();
        let mut targets = vec![];
        if case.cache {
            let keys: Vec<String> = (0..digests.len())
                .map(|i| format!("/cache/cc/k/{i}"))
                .collect();
            targets.push(("Blobpool `/cache`", s.bp, s.blobpool.child.id(), keys));
            targets.push(("Blobpool by digest", s.bp, s.blobpool.child.id(), by_digest));
        } else {
            targets.push(("Blobpool", s.bp, s.blobpool.child.id(), by_digest));
        }
        targets.push(("nginx", s.ng, s.nginx_pid, files.clone()));
        targets.push(("hyper static", s.hy, s.hyper.id(), files));
        let mut rs = Vec::new();
        for r in 0..rounds {
            let mut got: Vec<Option<ServerRound>> = vec![None; targets.len()];
            for j in 0..targets.len() {
                let i = (r + j) % targets.len();
                let (_, addr, pid, paths) = &targets[i];
                let run = httpload::WrkRun {
                    addr: *addr,
                    paths,
                    conns: case.conns,
                    secs: window,
                    cpu: GEN_CPU,
                    close: case.close,
                    seed: (r * 10 + i) as u64,
                    scratch: s.dir.path(),
                };
                got[i] = Some(measure(&run, *pid)?);
            }
            let got: Vec<ServerRound> = got.into_iter().map(|g| g.expect("measured")).collect();
            let line: Vec<String> = targets
                .iter()
                .zip(&got)
                .map(|(t, g)| format!("{} {:.0}/s {:.1} µs CPU", t.0, g.ops, g.cpu_us_per_req))
                .collect();
            eprintln!(
                "bench-http: GET {} round {}: {}",
                case.name,
                r + 1,
                line.join(", ")
            );
            let nginx = targets.iter().position(|t| t.0 == "nginx").unwrap_or(1);
            rs.push(AnchorRound {
                blobpool_ops: got[0].ops,
                nginx_ops: got[nginx].ops,
                servers: targets.iter().map(|t| t.0.to_string()).zip(got).collect(),
            });
        }
        out.push(Anchor {
            size_name: case.name.into(),
            key: case.key.into(),
            connections: case.conns,
            window_secs: window,
            target: case.target,
            rounds: rs,
        });
    }
    Ok(out)
}

#[derive(Serialize)]
struct TailRound {
    sweep: bool,
    secs: f64,
    ops: f64,
    get: ClassResult,
    put: ClassResult,
    deleted: u64,
    sweep_secs: f64,
}

async fn sweep_once(addr: SocketAddr) -> BenchResult<serde_json::Value> {
    let mut s = httpload::connect(addr).await?;
    let req = Req {
        method: Method::POST,
        path: "/v1/sweep".into(),
        headers: vec![("content-type", "application/json".into())],
        body: Some(Bytes::from_static(b"{}")),
        class: 0,
        expect_len: None,
    };
    let (status, body) = httpload::send(&mut s, addr, &req).await?;
    if status != 200 {
        return Err(format!(
            "POST /v1/sweep: {status} {}",
            String::from_utf8_lossy(&body)
        ));
    }
    serde_json::from_slice(&body).map_err(err)
}

async fn tail_round(
    bp: SocketAddr,
    live: &Arc<Vec<String>>,
    garbage: usize,
    sweep: bool,
    window: Duration,
    seed: u64,
) -> BenchResult<TailRound> {
    if sweep {
        fill(bp, "garbage", garbage, 1024).await?;
        // Let the garbage's pin tokens expire (token_ttl = 1 s).
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    let live = live.clone();
    let make: MakeReq = Arc::new(move |rng: &mut rand::rngs::StdRng| {
        if rng.random_range(0..100) < 90 {
            let mut r = Req::get(
                &format!("/v1/blobs/live/{}", live[rng.random_range(0..live.len())]),
                Some(SMALL as u64),
            );
            r.class = 0;
            r
        } else {
            put("live", random_bytes(SMALL), 1)
        }
    });
    let stop = Arc::new(AtomicBool::new(false));
    let sweeper = sweep.then(|| {
        let stop = stop.clone();
        tokio::spawn(async move {
            let t = Instant::now();
            let r = async {
                let mark = sweep_once(bp).await?;
                let exec = sweep_once(bp).await?;
                Ok::<_, String>((mark, exec))
            }
            .await;
            stop.store(true, Ordering::Relaxed);
            r.map(|x| (x, t.elapsed().as_secs_f64()))
        })
    });
    let limit = if sweep {
        Duration::from_secs(600)
    } else {
        window
    };
    let r: LoadResult =
        httpload::drive(bp, 16, Duration::ZERO, limit, 2, make, seed, Some(stop)).await?;
    if r.errors() > 0 {
        return Err(format!(
            "mixed load: {} failed requests, first: {:?}",
            r.errors(),
            r.first_error
        ));
    }
    let (deleted, sweep_secs) = match sweeper {
        None => (0, 0.0),
        Some(t) => {
            let ((mark, exec), secs) = t.await.map_err(err)??;
            let staged = mark["namespaces"]["garbage"]["staged"]
                .as_u64()
                .unwrap_or(0);
            let deleted = mark["total"]["deleted"].as_u64().unwrap_or(0)
                + exec["total"]["deleted"].as_u64().unwrap_or(0);
            if staged != garbage as u64 || deleted < garbage as u64 {
                return Err(format!("the sweep staged {staged} and deleted {deleted} of {garbage} garbage entries: {mark} / {exec}"));
            }
            (deleted, secs)
        }
    };
    Ok(TailRound {
        sweep,
        secs: r.secs,
        ops: r.ops_per_sec(),
        get: r.classes[0].clone(),
        put: r.classes[1].clone(),
        deleted,
        sweep_secs,
    })
}

async fn tail(s: &Servers, quick: bool) -> BenchResult<Vec<TailRound>> {
    let (live_n, garbage, rounds, window) = if quick {
        (2_000, 10_000, 1, Duration::from_secs(1))
    } else {
        (20_000, 100_000, 2, Duration::from_secs(5))
    };
    let live = Arc::new(fill(s.bp, "live", live_n, SMALL).await?);
    let mut out = Vec::new();
    for r in 0..rounds {
        let order = if r % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for sweep in order {
            let t = tail_round(s.bp, &live, garbage, sweep, window, r as u64 + 7).await?;
            eprintln!(
                "bench-http: tail round {} sweep={sweep}: get p99 {} µs, put p99 {} µs, {:.1} s",
                r + 1,
                t.get.latency.p99_us,
                t.put.latency.p99_us,
                t.secs
            );
            out.push(t);
        }
    }
    Ok(out)
}

fn median(v: Vec<f64>) -> f64 {
    bench::table::median(&v).unwrap_or(f64::NAN)
}

/// `median (lowest–highest)` of the rounds' `f`.
fn spread(rounds: &[AnchorRound], f: impl Fn(&AnchorRound) -> f64) -> (f64, String) {
    let v: Vec<f64> = rounds.iter().map(f).collect();
    let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = v.iter().cloned().fold(0.0, f64::max);
    (lo, format!("{:.2}× ({:.2}–{:.2}×)", median(v), lo, hi))
}

fn anchor_markdown(s: &mut String, anchor: &[Anchor]) {
    use std::fmt::Write;
    let _ = writeln!(s, "| GET | Server | req/s (median; rounds) | p50 / p99 | server CPU per request (of which softirq) | Blobpool ÷ this, req/s | Blobpool ÷ this, CPU per request |");
    let _ = writeln!(s, "|---|---|---|---|---:|---|---|");
    for a in anchor {
        for k in 0..a.rounds[0].servers.len() {
            let name = &a.rounds[0].servers[k].0;
            let v: Vec<&ServerRound> = a.rounds.iter().map(|r| &r.servers[k].1).collect();
            let ops: Vec<f64> = v.iter().map(|x| x.ops).collect();
            let (_, ratio) = spread(&a.rounds, |r| r.servers[0].1.ops / r.servers[k].1.ops);
            let (_, cpu) = spread(&a.rounds, |r| {
                r.servers[0].1.cpu_us_per_req / r.servers[k].1.cpu_us_per_req
            });
            let _ = writeln!(
                s,
                "| {} × {} conns | {name} | {:.0} ({:.0}–{:.0}) | {:.0} / {:.0} µs | {:.1} µs ({:.1}) | {} | {} |",
                a.size_name,
                a.connections,
                median(ops.clone()),
                ops.iter().cloned().fold(f64::INFINITY, f64::min),
                ops.iter().cloned().fold(0.0, f64::max),
                median(v.iter().map(|x| x.p50_us).collect()),
                median(v.iter().map(|x| x.p99_us).collect()),
                median(v.iter().map(|x| x.cpu_us_per_req).collect()),
                median(v.iter().map(|x| x.softirq_us_per_req).collect()),
                if k == 0 { "—".to_string() } else { ratio },
                if k == 0 { "—".to_string() } else { cpu },
            );
        }
    }
    let _ = writeln!(s);
    for a in anchor.iter().filter(|a| a.target > 0.0) {
        let ng = a.rounds[0]
            .servers
            .iter()
            .position(|x| x.0 == "nginx")
            .unwrap_or(1);
        let (lo, text) = spread(&a.rounds, |r| r.servers[0].1.ops / r.servers[ng].1.ops);
        let med = median(
            a.rounds
                .iter()
                .map(|r| r.servers[0].1.ops / r.servers[ng].1.ops)
                .collect(),
        );
        let verdict = if lo >= a.target {
            "**met**"
        } else if med >= a.target {
            "**not proven**"
        } else {
            "**missed**"
        };
        let _ = writeln!(
            s,
            "- GET {}, Blobpool ÷ nginx req/s: {text} — target ≥ {}×: {verdict}",
            a.size_name, a.target
        );
        if a.key == "4k" {
            let cpu: Vec<f64> = a
                .rounds
                .iter()
                .map(|r| r.servers[0].1.cpu_us_per_req / r.servers[ng].1.cpu_us_per_req)
                .collect();
            let hi = cpu.iter().cloned().fold(0.0, f64::max);
            let (_, text) = spread(&a.rounds, |r| {
                r.servers[0].1.cpu_us_per_req / r.servers[ng].1.cpu_us_per_req
            });
            let verdict = if hi <= 1.5 {
                "**met**"
            } else if median(cpu) <= 1.5 {
                "**not proven**"
            } else {
                "**missed**"
            };
            let _ = writeln!(s, "- GET 4 KiB, server CPU per request, Blobpool ÷ nginx: {text} — target ≤ 1.5×: {verdict}");
        }
    }
}

fn markdown(anchor: &[Anchor], tail: &[TailRound]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    anchor_markdown(&mut s, anchor);
    let _ = writeln!(
        s,
        "\nMixed load over HTTP (16 connections, 90 % GETs of live 4 KiB entries, 10 % PUTs):\n"
    );
    let _ = writeln!(s, "| Round | Sweep | Window | ops/s | GET p50 / p99 / p999 | PUT p50 / p99 / p999 | Deleted (sweep time) |");
    let _ = writeln!(s, "|---|---|---:|---:|---|---|---|");
    for (i, t) in tail.iter().enumerate() {
        let (g, p) = (&t.get.latency, &t.put.latency);
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} s | {:.0} | {} / {} / {} µs | {} / {} / {} µs | {} |",
            i / 2 + 1,
            if t.sweep { "yes" } else { "no" },
            t.secs,
            t.ops,
            g.p50_us,
            g.p99_us,
            g.p999_us,
            p.p50_us,
            p.p99_us,
            p.p999_us,
            if t.sweep {
                format!("{} ({:.1} s)", t.deleted, t.sweep_secs)
            } else {
                "—".into()
            }
        );
    }
    s
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
    let result = rt.block_on(async {
        let (small, large) = if o.quick { (200, 2) } else { (1000, 4) };
        let (servers, digests) = start(&o, small, large).await?;
        let only = o.only.as_deref();
        let anchor = anchor(&servers, &digests, o.quick, only).await?;
        let tail = match only {
            None | Some("tail") => tail(&servers, o.quick).await?,
            _ => vec![],
        };
        let md = markdown(&anchor, &tail);
        println!("{md}");
        if let Some(p) = &o.json {
            let doc =
                serde_json::json!({ "anchor": anchor, "tail": tail, "dir": servers.dir.path() });
            std::fs::write(p, serde_json::to_string_pretty(&doc).map_err(err)?).map_err(err)?;
        }
        Ok::<_, String>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-http: {e}");
            ExitCode::FAILURE
        }
    }
}
