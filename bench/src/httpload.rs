//! One HTTP load generator for every server the suite drives (Blobpool,
//! nginx, the minimal hyper static-file server): `connections` clients,
//! each with its own keep-alive HTTP/1.1 connection (hyper's client
//! connection over a `TcpStream`), for a fixed time after a warm-up; every
//! response body is read to its end and its length checked; latencies go
//! into an HDR histogram per operation class. Failed requests are counted
//! and reported, and a client whose connection broke reconnects.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rand::SeedableRng;

use crate::fixtures::{err, BenchResult};
use crate::tail::Percentiles;

/// One request a client makes.
pub struct Req {
    /// GET or PUT.
    pub method: Method,
    /// Path and query.
    pub path: String,
    /// A PUT's body.
    pub body: Option<Bytes>,
    /// Extra headers.
    pub headers: Vec<(&'static str, String)>,
    /// Its operation class (index into the result's classes).
    pub class: usize,
    /// The response body's length, when known.
    pub expect_len: Option<u64>,
}

impl Req {
    /// A `GET path` (class 0) whose body is `expect_len` bytes, when given.
    pub fn get(path: &str, expect_len: Option<u64>) -> Req {
        Req {
            method: Method::GET,
            path: path.to_string(),
            body: None,
            headers: vec![],
            class: 0,
            expect_len,
        }
    }
}

/// Makes each client's next request.
pub type MakeReq = Arc<dyn Fn(&mut rand::rngs::StdRng) -> Req + Send + Sync>;

/// What one class of operations did in the timed window.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ClassResult {
    /// Latencies.
    pub latency: Percentiles,
    /// Response body bytes read.
    pub bytes: u64,
    /// Failed requests (transport errors, non-2xx, wrong lengths).
    pub errors: u64,
}

/// What a load run did.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LoadResult {
    /// Per class.
    pub classes: Vec<ClassResult>,
    /// Length of the timed window, seconds.
    pub secs: f64,
    /// First error seen, if any.
    pub first_error: Option<String>,
}

impl LoadResult {
    /// Successful operations of every class per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.classes.iter().map(|c| c.latency.count).sum::<u64>() as f64 / self.secs
    }

    /// Failed requests of every class.
    pub fn errors(&self) -> u64 {
        self.classes.iter().map(|c| c.errors).sum()
    }
}

/// A keep-alive HTTP/1.1 connection, as [`send`] takes.
pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Opens an HTTP/1.1 connection to `addr` (`TCP_NODELAY` on).
pub async fn connect(addr: SocketAddr) -> BenchResult<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(err)?;
    stream.set_nodelay(true).map_err(err)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(err)?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Sends `req` on `sender`; the response body's length, or why it failed.
pub async fn send(
    sender: &mut Sender,
    addr: SocketAddr,
    req: &Req,
) -> Result<(u16, Bytes), String> {
    let mut b = Request::builder()
        .method(req.method.clone())
        .uri(&req.path)
        .header("host", addr.to_string());
    for (k, v) in &req.headers {
        b = b.header(*k, v);
    }
    let body = Full::new(req.body.clone().unwrap_or_default());
    let request = b.body(body).map_err(err)?;
    sender.ready().await.map_err(err)?;
    let resp = sender.send_request(request).await.map_err(err)?;
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    // Small bodies are kept (the caller may parse them); large ones are
    // counted and dropped frame by frame.
    let mut kept = Vec::new();
    let mut len = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(err)?.into_data() {
            len += data.len() as u64;
            if kept.len() < 64 * 1024 {
                kept.extend_from_slice(&data[..data.len().min(64 * 1024 - kept.len())]);
            }
        }
    }
    if let Some(want) = req.expect_len {
        if len != want && status < 300 {
            return Err(format!(
                "{} {}: {len} bytes, expected {want}",
                req.method, req.path
            ));
        }
    }
    Ok((status, Bytes::from(kept)))
}

/// Runs `connections` clients against `addr` for `warmup` (not recorded)
/// then `window` (recorded), or until `stop` is set.
#[allow(clippy::too_many_arguments)]
pub async fn drive(
    addr: SocketAddr,
    connections: usize,
    warmup: Duration,
    window: Duration,
    classes: usize,
    make: MakeReq,
    seed: u64,
    stop: Option<Arc<AtomicBool>>,
) -> BenchResult<LoadResult> {
    let start = Instant::now();
    let (record_from, stop_at) = (start + warmup, start + warmup + window);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let (make, stop) = (make.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ ((c as u64) << 20));
            let mut hist: Vec<Histogram<u64>> = (0..classes)
                .map(|_| Histogram::new(3).expect("histogram"))
                .collect();
            let mut out = vec![ClassResult::default(); classes];
            let mut first_error = None;
            let mut sender = connect(addr).await?;
            loop {
                let now = Instant::now();
                if now >= stop_at || stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
                    break;
                }
                let req = make(&mut rng);
                let t = Instant::now();
                let r = send(&mut sender, addr, &req).await;
                let us = t.elapsed().as_micros() as u64;
                let recording = t >= record_from;
                match r {
                    Ok((status, body)) if status < 300 => {
                        if recording {
                            hist[req.class].record(us.max(1)).map_err(err)?;
                            out[req.class].bytes += req.expect_len.unwrap_or(body.len() as u64);
                        }
                    }
                    Ok((status, body)) => {
                        out[req.class].errors += 1;
                        first_error.get_or_insert_with(|| {
                            format!(
                                "{} {}: {status} {}",
                                req.method,
                                req.path,
                                String::from_utf8_lossy(&body)
                            )
                        });
                    }
                    Err(e) => {
                        out[req.class].errors += 1;
                        first_error.get_or_insert(e);
                        sender = connect(addr).await?;
                    }
                }
            }
            for (o, h) in out.iter_mut().zip(&hist) {
                o.latency = Percentiles::of(h);
            }
            Ok::<_, String>((out, hist, first_error))
        }));
    }
    let mut merged: Vec<Histogram<u64>> = (0..classes)
        .map(|_| Histogram::new(3).expect("histogram"))
        .collect();
    let mut classes_out = vec![ClassResult::default(); classes];
    let mut first_error = None;
    for t in tasks {
        let (out, hist, fe) = t.await.map_err(err)??;
        for i in 0..classes {
            merged[i].add(&hist[i]).map_err(err)?;
            classes_out[i].bytes += out[i].bytes;
            classes_out[i].errors += out[i].errors;
        }
        if first_error.is_none() {
            first_error = fe;
        }
    }
    for (o, h) in classes_out.iter_mut().zip(&merged) {
        o.latency = Percentiles::of(h);
    }
    let secs = Instant::now()
        .saturating_duration_since(record_from)
        .as_secs_f64();
    Ok(LoadResult {
        classes: classes_out,
        secs: secs.min(window.as_secs_f64()).max(1e-3),
        first_error,
    })
}

/// CPU seconds (user + system) a process and its children-by-`ppid` have
/// used, from `/proc/PID/stat` (for nginx: the master and its workers).
pub fn cpu_secs(pid: u32) -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let mut pids = vec![pid];
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, _)) = stat_fields(p) {
                if ppid == pid {
                    pids.push(p);
                }
            }
        }
    }
    pids.iter()
        .filter_map(|p| stat_fields(*p))
        .map(|(_, t)| t as f64 / tick)
        .sum()
}

/// `(ppid, utime + stime)` of a process.
fn stat_fields(pid: u32) -> Option<(u32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&s)
}

/// Parses `/proc/PID/stat`: fields after the `)` that ends the command
/// name; ppid is the 4th field, utime and stime the 14th and 15th.
pub fn parse_stat(s: &str) -> Option<(u32, u64)> {
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ppid = f.get(1)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// CPU seconds this process has used (the load generator's own share).
pub fn self_cpu_secs() -> f64 {
    // SAFETY: `getrusage` fills a plain-data struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat_with_spaces_in_the_name() {
        let s = "1234 (nginx: worker) S 1200 1200 1200 0 -1 4194624 100 0 0 0 250 75 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat(s), Some((1200, 325)));
    }

    #[test]
    fn cpu_times_count_work_done() {
        let (proc0, self0) = (cpu_secs(std::process::id()), self_cpu_secs());
        // Burn at least 100 ms of CPU on this thread.
        let mut x = 0u64;
        while self_cpu_secs() - self0 < 0.1 {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
        // /proc counts in 10 ms ticks: at least 50 ms of the 100 ms show.
        let grown = cpu_secs(std::process::id()) - proc0;
        assert!(grown >= 0.05, "/proc saw {grown} s of a 100 ms burn");
    }
}

/// Seconds the CPUs in `cpus` spent in softirq so far (`/proc/stat`): the
/// loopback network's receive work, which no process is charged for.
pub fn softirq_secs(cpus: &[usize]) -> f64 {
    let tick = 100.0; // USER_HZ on Linux
    let Ok(s) = std::fs::read_to_string("/proc/stat") else {
        return 0.0;
    };
    s.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let cpu: usize = f.next()?.strip_prefix("cpu")?.parse().ok()?;
            // user nice system idle iowait irq softirq
            let softirq: u64 = f.nth(6)?.parse().ok()?;
            cpus.contains(&cpu).then_some(softirq)
        })
        .sum::<u64>() as f64
        / tick
}

/// One run of `wrk` (an external load generator, its own process).
#[derive(Clone, Debug, serde::Serialize)]
pub struct WrkResult {
    pub requests: u64,
    pub secs: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Socket errors and non-2xx answers.
    pub errors: u64,
}

impl WrkResult {
    pub fn ops_per_sec(&self) -> f64 {
        self.requests as f64 / self.secs.max(1e-9)
    }
}

/// What `wrk` is asked to do: GETs of `paths` (drawn at random per
/// request) on `addr`, over `conns` connections for `secs`, pinned to
/// `cpu` with `taskset`; `close` sends `Connection: close` (a fresh
/// connection per request).
pub struct WrkRun<'a> {
    pub addr: std::net::SocketAddr,
    pub paths: &'a [String],
    pub conns: usize,
    pub secs: f64,
    pub cpu: usize,
    pub close: bool,
    pub seed: u64,
    pub scratch: &'a std::path::Path,
}

/// A `wrk` latency figure (`123.45us`, `1.20ms`, `2.00s`) in µs.
fn wrk_duration_us(s: &str) -> Option<f64> {
    let (num, mult) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * mult)
}

/// Reads `wrk --latency`'s report.
pub fn parse_wrk(out: &str, secs: f64) -> Option<WrkResult> {
    let mut r = WrkResult {
        requests: 0,
        secs,
        p50_us: 0.0,
        p99_us: 0.0,
        errors: 0,
    };
    for l in out.lines().map(str::trim) {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f.as_slice() {
            [n, "requests", "in", t, ..] => {
                r.requests = n.parse().ok()?;
                r.secs = t.trim_end_matches(',').strip_suffix('s')?.parse().ok()?;
            }
            ["50%", v] => r.p50_us = wrk_duration_us(v)?,
            ["99%", v] => r.p99_us = wrk_duration_us(v)?,
            ["Non-2xx", "or", "3xx", "responses:", n] => r.errors += n.parse::<u64>().ok()?,
            ["Socket", "errors:", rest @ ..] => {
                r.errors += rest
                    .iter()
                    .filter_map(|x| x.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>()
            }
            _ => {}
        }
    }
    (r.requests > 0).then_some(r)
}

/// Runs `wrk` once (see [`WrkRun`]).
pub fn wrk(run: &WrkRun<'_>) -> Result<WrkResult, String> {
    use std::fmt::Write as _;
    let mut lua = String::from("local paths = {\n");
    for p in run.paths {
        let _ = writeln!(lua, "  {p:?},");
    }
    let _ = write!(
        lua,
        "}}\nmath.randomseed({})\nrequest = function()\n  return wrk.format(\"GET\", paths[math.random(#paths)]{})\nend\n",
        run.seed,
        if run.close {
            ", {[\"Connection\"] = \"close\"}"
        } else {
            ""
        }
    );
    let script = run.scratch.join(format!("wrk-{}.lua", run.seed));
    std::fs::write(&script, lua).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("taskset")
        .args(["-c", &run.cpu.to_string(), "wrk", "--latency", "-t1"])
        .arg(format!("-c{}", run.conns))
        .arg(format!("-d{}s", run.secs))
        .arg("-s")
        .arg(&script)
        .arg(format!("http://{}", run.addr))
        .output()
        .map_err(|e| format!("wrk: {e} (apt-get install wrk)"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_wrk(&text, run.secs).ok_or_else(|| format!("wrk said: {text}"))
}

#[cfg(test)]
mod wrk_tests {
    use super::*;

    #[test]
    fn wrk_reports_are_read() {
        let out = "Running 2s test @ http://127.0.0.1:1\n  1 threads and 16 connections\n  Latency Distribution\n     50%  145.00us\n     75%  1.20ms\n     90%  2ms\n     99%    1.50ms\n  123456 requests in 2.00s, 500.00MB read\n  Socket errors: connect 0, read 2, write 0, timeout 1\n  Non-2xx or 3xx responses: 3\nRequests/sec:  61728.00\n";
        let r = parse_wrk(out, 2.0).unwrap();
        assert_eq!(r.requests, 123456);
        assert_eq!(r.p50_us, 145.0);
        assert_eq!(r.p99_us, 1500.0);
        assert_eq!(r.errors, 6);
        assert_eq!(r.secs, 2.0);
    }
}
