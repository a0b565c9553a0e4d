//! `bench-http [--quick] [--json OUT] [--blobpool PATH] [--static PATH]`:
//! Blobpool's HTTP server against an external anchor (issue 33).
//!
//! 1. **Anchor**: nginx (Debian's `nginx-light`, `sendfile on`, 2 workers)
//!    and `static-server` (a minimal hyper server, this crate) serve the
//!    same files — 1,000 of 4 KiB, a few of 64 MiB — that `blobpool serve`
//!    (the embedded default store) holds; the same load generator
//!    (`bench::httpload`) drives all three in interleaved rounds: 4 KiB
//!    GETs over 16 connections, 64 MiB GETs over 2. Reported per server:
//!    ops/s, p50/p99, server CPU per request (from `/proc`, nginx's
//!    workers included) and the generator's own CPU per request (it
//!    shares the two cores).
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

use bench::data::fill_random;
use bench::fixtures::{err, BenchResult};
use bench::httpload::{self, ClassResult, LoadResult, MakeReq, Req};
use bytes::Bytes;
use hyper::Method;
use rand::Rng;
use serde::Serialize;

const SMALL: usize = 4 * 1024;
const LARGE: usize = 64 << 20;

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
            "--only" => o.only = Some(value()?),
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--blobpool" => o.blobpool = PathBuf::from(value()?),
            "--static" => o.static_server = PathBuf::from(value()?),
            _ => return Err(format!("usage: bench-http [--quick] [--only 4k|64m|tail] [--json OUT] [--blobpool PATH] [--static PATH] (got {a:?})")),
        }
    }
    Ok(o)
}

fn free_port() -> BenchResult<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(err)?;
    Ok(l.local_addr().map_err(err)?.port())
}

/// The three servers and their files; stopped on drop.
struct Servers {
    dir: tempfile::TempDir,
    blobpool: Child,
    hyper: Child,
    nginx_pid: u32,
    bp: SocketAddr,
    hy: SocketAddr,
    ng: SocketAddr,
}

impl Drop for Servers {
    fn drop(&mut self) {
        let _ = self.blobpool.kill();
        let _ = self.hyper.kill();
        let _ = self.blobpool.wait();
        let _ = self.hyper.wait();
        // SAFETY: sends SIGQUIT (graceful stop) to nginx's master.
        unsafe { libc::kill(self.nginx_pid as i32, libc::SIGQUIT) };
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn blobpool_config(dir: &Path, port: u16) -> String {
    format!(
        r#"data_dir = "{d}/bp-data"
listen = "127.0.0.1:{port}"
log_format = "json"
window = "0s"
token_ttl = "1s"
max_tokens = 1000000
max_tokens_per_identity = 1000000
[gc]
interval = "off"
[gc.namespaces.live]
policy = "keep"
[gc.namespaces.garbage]
policy = "unreferenced"
"#,
        d = dir.display()
    )
}

fn nginx_config(dir: &Path, port: u16) -> BenchResult<String> {
    let user = |flag: &str| -> BenchResult<String> {
        let o = Command::new("id").arg(flag).output().map_err(err)?;
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    Ok(format!(
        "user {u} {g};\nworker_processes 2;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log warn;\n\
         events {{ worker_connections 1024; }}\nhttp {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  keepalive_requests 1000000;\n\
         server {{\n    listen 127.0.0.1:{port};\n    root {d}/www;\n  }}\n}}\n",
        u = user("-un")?,
        g = user("-gn")?,
        d = dir.display()
    ))
}

async fn wait_for(addr: SocketAddr, path: &str) -> BenchResult<()> {
    for _ in 0..100 {
        if let Ok(mut s) = connect(addr).await {
            if let Ok((200, _)) = httpload::send(&mut s, addr, &get(path, None)).await {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{addr}{path} never answered 200"))
}

async fn connect(
    addr: SocketAddr,
) -> BenchResult<hyper::client::conn::http1::SendRequest<http_body_util::Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(err)?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(err)?;
    tokio::spawn(conn);
    Ok(sender)
}

fn get(path: &str, len: Option<u64>) -> Req {
    Req {
        method: Method::GET,
        path: path.to_string(),
        body: None,
        headers: vec![],
        class: 0,
        expect_len: len,
    }
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

fn random_bytes(len: usize) -> Bytes {
    let mut v = vec![0u8; len];
    fill_random(&mut v, bench::data::unique());
    v[..8].copy_from_slice(&bench::data::unique().to_le_bytes());
    Bytes::from(v)
}

/// PUTs `body` into `ns`; its digest.
async fn put_one(addr: SocketAddr, ns: &str, body: Bytes) -> BenchResult<String> {
    let mut s = connect(addr).await?;
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
            let mut s = connect(addr).await?;
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

async fn start(
    o: &Opts,
    small: usize,
    large: usize,
) -> BenchResult<(Servers, Vec<String>, Vec<String>)> {
    for t in [&o.blobpool, &o.static_server] {
        if !t.exists() {
            return Err(format!(
                "{} is missing (cargo build --release -p blobpool -p bench --bins)",
                t.display()
            ));
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("blobpool-bench-http-")
        .tempdir()
        .map_err(err)?;
    let d = dir.path().to_path_buf();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(err)?;
    std::fs::create_dir_all(d.join("www/files")).map_err(err)?;
    let mut files = Vec::new();
    for (prefix, n, size) in [("s", small, SMALL), ("l", large, LARGE)] {
        for i in 0..n {
            let body = random_bytes(size);
            std::fs::write(d.join(format!("www/files/{prefix}-{i}")), &body).map_err(err)?;
            files.push((prefix, i, body));
        }
    }
    let (bp_port, ng_port) = (free_port()?, free_port()?);
    std::fs::write(d.join("blobpool.toml"), blobpool_config(&d, bp_port)).map_err(err)?;
    std::fs::write(d.join("nginx.conf"), nginx_config(&d, ng_port)?).map_err(err)?;
    let blobpool = Command::new(&o.blobpool)
        .arg("--config")
        .arg(d.join("blobpool.toml"))
        .arg("serve")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(d.join("blobpool.log")).map_err(err)?)
        .spawn()
        .map_err(|e| format!("{}: {e}", o.blobpool.display()))?;
    let mut hyper = Command::new(&o.static_server)
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
    let status = Command::new("nginx")
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
            let (mut a, mut b) = (blobpool, hyper);
            let _ = (a.kill(), b.kill(), a.wait(), b.wait());
            return Err(format!("nginx: {e} (apt-get install nginx-light)"));
        }
    };
    if !status.success() {
        let (mut a, mut b) = (blobpool, hyper);
        let _ = (a.kill(), b.kill(), a.wait(), b.wait());
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
    let (bp, ng) = (
        SocketAddr::from(([127, 0, 0, 1], bp_port)),
        SocketAddr::from(([127, 0, 0, 1], ng_port)),
    );
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
        servers.blobpool.id(),
        servers.nginx_pid,
        servers.hyper.id()
    );
    wait_for(bp, "/health").await?;
    let (mut small_digests, mut large_digests) = (Vec::new(), Vec::new());
    for (prefix, _, body) in &files {
        let digest = put_one(bp, "anchor", body.clone()).await?;
        if *prefix == "s" {
            small_digests.push(digest)
        } else {
            large_digests.push(digest)
        }
    }
    // The three answer the same bytes.
    for (prefix, i, body) in files.iter().filter(|(_, i, _)| *i == 0) {
        let digest = if *prefix == "s" {
            &small_digests[*i]
        } else {
            &large_digests[*i]
        };
        let fs_path = format!("/files/{prefix}-{i}");
        for (addr, path) in [
            (bp, format!("/v1/blobs/anchor/{digest}")),
            (ng, fs_path.clone()),
            (hy, fs_path),
        ] {
            let mut s = connect(addr).await?;
            let (status, got) =
                httpload::send(&mut s, addr, &get(&path, Some(body.len() as u64))).await?;
            if status != 200 || got[..] != body[..got.len()] {
                return Err(format!("{addr}{path}: {status}, not the file's bytes"));
            }
        }
    }
    Ok((servers, small_digests, large_digests))
}

#[derive(Serialize, Clone)]
struct ServerRound {
    ops: f64,
    p50_us: u64,
    p99_us: u64,
    cpu_us_per_req: f64,
    generator_cpu_us_per_req: f64,
}

#[derive(Serialize)]
struct AnchorRound {
    blobpool_ops: f64,
    nginx_ops: f64,
    hyper_ops: f64,
    servers: Vec<(String, ServerRound)>,
}

#[derive(Serialize)]
struct Anchor {
    size_name: String,
    connections: usize,
    window_secs: f64,
    rounds: Vec<AnchorRound>,
}

async fn measure(
    addr: SocketAddr,
    pid: u32,
    conns: usize,
    window: Duration,
    make: MakeReq,
    seed: u64,
) -> BenchResult<ServerRound> {
    let (c0, g0) = (httpload::cpu_secs(pid), httpload::self_cpu_secs());
    let warm = Duration::from_millis(300);
    let r = httpload::drive(addr, conns, warm, window, 1, make, seed, None).await?;
    let (c1, g1) = (httpload::cpu_secs(pid), httpload::self_cpu_secs());
    if r.errors() > 0 {
        return Err(format!(
            "{addr}: {} failed requests, first: {:?}",
            r.errors(),
            r.first_error
        ));
    }
    let total = r.ops_per_sec() * (r.secs + warm.as_secs_f64());
    Ok(ServerRound {
        ops: r.ops_per_sec(),
        p50_us: r.classes[0].latency.p50_us,
        p99_us: r.classes[0].latency.p99_us,
        cpu_us_per_req: (c1 - c0) * 1e6 / total,
        generator_cpu_us_per_req: (g1 - g0) * 1e6 / total,
    })
}

async fn anchor(
    s: &Servers,
    small: &[String],
    large: &[String],
    quick: bool,
    only: Option<&str>,
) -> BenchResult<Vec<Anchor>> {
    let (rounds, window) = if quick {
        (2, Duration::from_secs(1))
    } else {
        (3, Duration::from_secs(2))
    };
    let mut out = Vec::new();
    for (name, digests, size, conns) in [("4 KiB", small, SMALL, 16), ("64 MiB", large, LARGE, 2)] {
        if only.is_some_and(|o| o != if size == SMALL { "4k" } else { "64m" }) {
            continue;
        }
        let n = digests.len();
        let bp_paths: Arc<Vec<String>> = Arc::new(
            digests
                .iter()
                .map(|d| format!("/v1/blobs/anchor/{d}"))
                .collect(),
        );
        let prefix = if size == SMALL { "s" } else { "l" };
        let fs_paths: Arc<Vec<String>> =
            Arc::new((0..n).map(|i| format!("/files/{prefix}-{i}")).collect());
        let maker = |paths: Arc<Vec<String>>| -> MakeReq {
            Arc::new(move |rng: &mut rand::rngs::StdRng| {
                get(&paths[rng.random_range(0..paths.len())], Some(size as u64))
            })
        };
        let targets = [
            ("Blobpool", s.bp, s.blobpool.id(), maker(bp_paths.clone())),
            ("nginx", s.ng, s.nginx_pid, maker(fs_paths.clone())),
            ("hyper static", s.hy, s.hyper.id(), maker(fs_paths.clone())),
        ];
        let mut rs = Vec::new();
        for r in 0..rounds {
            let mut got: Vec<Option<ServerRound>> = vec![None; 3];
            for j in 0..3 {
                let i = (r + j) % 3;
                let (_, addr, pid, make) = &targets[i];
                got[i] = Some(measure(*addr, *pid, conns, window, make.clone(), r as u64).await?);
            }
            let got: Vec<ServerRound> = got.into_iter().map(|g| g.expect("measured")).collect();
            eprintln!(
                "bench-http: GET {name} round {}: Blobpool {:.0}/s, nginx {:.0}/s, hyper {:.0}/s",
                r + 1,
                got[0].ops,
                got[1].ops,
                got[2].ops
            );
            rs.push(AnchorRound {
                blobpool_ops: got[0].ops,
                nginx_ops: got[1].ops,
                hyper_ops: got[2].ops,
                servers: targets.iter().map(|t| t.0.to_string()).zip(got).collect(),
            });
        }
        out.push(Anchor {
            size_name: name.into(),
            connections: conns,
            window_secs: window.as_secs_f64(),
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
    let mut s = connect(addr).await?;
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
            let mut r = get(
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

fn markdown(anchor: &[Anchor], tail: &[TailRound]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let med = |v: Vec<f64>| bench::table::median(&v).unwrap_or(f64::NAN);
    let _ = writeln!(s, "| GET | Server | ops/s (median; rounds) | p50 / p99 | server CPU per request | generator CPU per request | Blobpool ÷ this |");
    let _ = writeln!(s, "|---|---|---|---|---:|---:|---:|");
    for a in anchor {
        for (k, name) in ["Blobpool", "nginx", "hyper static"].iter().enumerate() {
            let v: Vec<&ServerRound> = a.rounds.iter().map(|r| &r.servers[k].1).collect();
            let ops: Vec<f64> = v.iter().map(|x| x.ops).collect();
            let ratio = med(a
                .rounds
                .iter()
                .map(|r| r.blobpool_ops / r.servers[k].1.ops)
                .collect());
            let _ = writeln!(
                s,
                "| {} × {} conns | {name} | {:.0} ({:.0}–{:.0}) | {} / {} µs | {:.0} µs | {:.0} µs | {} |",
                a.size_name,
                a.connections,
                med(ops.clone()),
                ops.iter().cloned().fold(f64::INFINITY, f64::min),
                ops.iter().cloned().fold(0.0, f64::max),
                med(v.iter().map(|x| x.p50_us as f64).collect()),
                med(v.iter().map(|x| x.p99_us as f64).collect()),
                med(v.iter().map(|x| x.cpu_us_per_req).collect()),
                med(v.iter().map(|x| x.generator_cpu_us_per_req).collect()),
                if k == 0 { "—".to_string() } else { format!("{ratio:.2}×") },
            );
        }
    }
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
        let (servers, s_digests, l_digests) = start(&o, small, large).await?;
        let only = o.only.as_deref();
        let anchor = anchor(&servers, &s_digests, &l_digests, o.quick, only).await?;
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
