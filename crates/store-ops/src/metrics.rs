//! Process-wide counters and their Prometheus text exposition (format
//! 0.0.4, hand-written).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use store_core::{GcAbortCause, SweepReport};

use crate::error::ErrorCode;
use crate::tokens::TokenStats;

/// Counters of one [`crate::Ops`]. All monotonic; cheap to bump from any
/// task.
#[derive(Default)]
pub struct Metrics {
    puts: AtomicU64,
    puts_deduplicated: AtomicU64,
    put_bytes: AtomicU64,
    gets: AtomicU64,
    bao_gets: AtomicU64,
    get_bytes: AtomicU64,
    stats: AtomicU64,
    have_requests: AtomicU64,
    have_digests: AtomicU64,
    renewal_probes: AtomicU64,
    deletes: AtomicU64,
    sweeps: AtomicU64,
    sweeps_aborted: [AtomicU64; 4],
    sweep_staged: AtomicU64,
    sweep_deleted: AtomicU64,
    sweep_rescued: AtomicU64,
    sweep_bytes_freed: AtomicU64,
    errors: [AtomicU64; ErrorCode::ALL.len()],
    /// The stored-inventory gauges (`crate::admin`).
    pub(crate) inventory: crate::admin::Inventory,
    /// Per cache namespace (ADR-048): lookups hit/missed, puts and their
    /// bytes, and the keys' usage as last read. Cache namespaces are
    /// configured, so the label set is bounded.
    cache: std::sync::Mutex<std::collections::BTreeMap<String, CacheCounters>>,
    /// Request latency per route pattern and method (bounded labels).
    requests: std::sync::Mutex<std::collections::BTreeMap<(&'static str, &'static str), Histogram>>,
    /// Extra exposition appended to the text (the engines' layer metrics).
    extra: std::sync::OnceLock<Box<dyn Fn() -> String + Send + Sync>>,
}

/// Upper bounds (seconds) of the request-latency histogram's buckets.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One latency histogram: a count per bucket (not cumulative; `+Inf` last),
/// the sum and the count.
#[derive(Clone, Debug, Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i] += 1;
        self.sum += secs;
        self.count += 1;
    }
}

/// The method label: the standard methods by name, anything else `other`.
fn method_label(m: &str) -> &'static str {
    match m {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "PUT" => "PUT",
        "POST" => "POST",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "MKCOL" => "MKCOL",
        "PROPFIND" => "PROPFIND",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

/// One cache metric family: name, type, help, and its samples (by
/// `result` label, empty for none).
type CacheFamily = (
    &'static str,
    &'static str,
    &'static str,
    fn(&CacheCounters) -> Vec<(&'static str, u64)>,
);

#[derive(Clone, Copy, Debug, Default)]
struct CacheCounters {
    hits: u64,
    misses: u64,
    puts: u64,
    put_bytes: u64,
    keys: u64,
    bytes: u64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn abort_label(i: usize) -> &'static str {
    [
        "protect_failed",
        "sweeper_lock",
        "no_liveness_sources",
        "other",
    ][i]
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("puts", &self.puts)
            .field("gets", &self.gets)
            .finish_non_exhaustive()
    }
}

impl Metrics {
    pub(crate) fn put(&self, bytes: u64, deduplicated: bool) {
        bump(&self.puts, 1);
        bump(&self.put_bytes, bytes);
        if deduplicated {
            bump(&self.puts_deduplicated, 1);
        }
    }

    pub(crate) fn get(&self) {
        bump(&self.gets, 1);
    }

    pub(crate) fn bao_get(&self) {
        bump(&self.bao_gets, 1);
    }

    /// Gets answered with a bao stream so far (ADR-033).
    pub fn bao_gets(&self) -> u64 {
        self.bao_gets.load(Ordering::Relaxed)
    }

    /// Bytes of a get response body actually handed to the transport.
    pub fn get_bytes(&self, n: u64) {
        bump(&self.get_bytes, n);
    }

    pub(crate) fn stat(&self) {
        bump(&self.stats, 1);
    }

    pub(crate) fn have(&self, digests: usize, renewal: bool) {
        bump(&self.have_requests, 1);
        bump(&self.have_digests, digests as u64);
        if renewal {
            bump(&self.renewal_probes, 1);
        }
    }

    pub(crate) fn delete(&self) {
        bump(&self.deletes, 1);
    }

    pub(crate) fn sweep(&self, r: &SweepReport) {
        bump(&self.sweeps, 1);
        if let Some(cause) = r.aborted {
            let i = match cause {
                GcAbortCause::ProtectFailed => 0,
                GcAbortCause::SweeperLock => 1,
                GcAbortCause::NoLivenessSources => 2,
                _ => 3,
            };
            bump(&self.sweeps_aborted[i], 1);
        }
        bump(&self.sweep_staged, r.total.staged);
        bump(&self.sweep_deleted, r.total.deleted);
        bump(&self.sweep_rescued, r.total.rescued);
        bump(&self.sweep_bytes_freed, r.total.bytes_freed);
    }

    /// Records one request's time to its response head, by route pattern
    /// (`/v1/blobs/{ns}/{digest}`, never the raw path) and method.
    pub(crate) fn request(&self, route: &'static str, method: &str, secs: f64) {
        let mut m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        m.entry((route, method_label(method)))
            .or_default()
            .observe(secs);
    }

    /// Requests timed so far for `route` and `method`.
    pub fn requests_timed(&self, route: &str, method: &str) -> u64 {
        let m = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        m.iter()
            .filter(|((r, me), _)| *r == route && *me == method)
            .map(|(_, h)| h.count)
            .sum()
    }

    /// Appends `f`'s text to every exposition (set once; later calls are
    /// ignored). `serve` renders the engines' layer metrics with it.
    pub fn set_extra(&self, f: Box<dyn Fn() -> String + Send + Sync>) {
        let _ = self.extra.set(f);
    }

    fn render_requests(&self, out: &mut String) {
        let m = self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let name = "blobpool_http_request_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from a request's arrival to its response head, by route pattern and method."
        );
        let _ = writeln!(out, "# TYPE {name} histogram");
        for ((route, method), h) in &m {
            let labels = format!("route=\"{route}\",method=\"{method}\"");
            let mut cum = 0;
            for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
                cum += h.buckets[i];
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
        }
        let _ = writeln!(
            out,
            "# HELP blobpool_build_info The running build (always 1)."
        );
        let _ = writeln!(out, "# TYPE blobpool_build_info gauge");
        let _ = writeln!(
            out,
            "blobpool_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
    }

    fn cache_entry(&self, ns: &str, f: impl FnOnce(&mut CacheCounters)) {
        let mut m = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        f(m.entry(ns.to_string()).or_default());
    }

    /// Counts one cache lookup in `ns` (a key's get or head).
    pub(crate) fn cache_lookup(&self, ns: &str, hit: bool) {
        self.cache_entry(ns, |c| if hit { c.hits += 1 } else { c.misses += 1 });
    }

    /// Counts one cache put of `bytes` in `ns`.
    pub(crate) fn cache_put(&self, ns: &str, bytes: u64) {
        self.cache_entry(ns, |c| {
            c.puts += 1;
            c.put_bytes += bytes;
        });
    }

    /// Sets the usage gauges of `ns` (read at scrape time).
    pub(crate) fn set_cache_usage(&self, ns: &str, keys: u64, bytes: u64) {
        self.cache_entry(ns, |c| {
            c.keys = keys;
            c.bytes = bytes;
        });
    }

    /// Cache lookups of `ns` so far: (hits, misses).
    pub fn cache_lookups(&self, ns: &str) -> (u64, u64) {
        let m = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        m.get(ns).map_or((0, 0), |c| (c.hits, c.misses))
    }

    fn render_cache(&self, out: &mut String) {
        let m = self.cache.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let families: [CacheFamily; 4] = [
            (
                "blobpool_cache_requests_total",
                "counter",
                "Cache key lookups (GET/HEAD /cache/...), by namespace and result.",
                |c| vec![("hit", c.hits), ("miss", c.misses)],
            ),
            (
                "blobpool_cache_puts_total",
                "counter",
                "Cache puts (keys recorded), by namespace.",
                |c| vec![("", c.puts)],
            ),
            (
                "blobpool_cache_put_bytes_total",
                "counter",
                "Bytes of cache puts, by namespace.",
                |c| vec![("", c.put_bytes)],
            ),
            (
                "blobpool_cache_bytes",
                "gauge",
                "Bytes the cache keys of a namespace hold (an entry two keys name counts twice).",
                |c| vec![("", c.bytes)],
            ),
        ];
        for (name, kind, help, values) in families {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (ns, c) in &m {
                for (result, v) in values(c) {
                    if result.is_empty() {
                        let _ = writeln!(out, "{name}{{namespace=\"{ns}\"}} {v}");
                    } else {
                        let _ =
                            writeln!(out, "{name}{{namespace=\"{ns}\",result=\"{result}\"}} {v}");
                    }
                }
            }
        }
        let _ = writeln!(out, "# HELP blobpool_cache_keys Cache keys of a namespace.");
        let _ = writeln!(out, "# TYPE blobpool_cache_keys gauge");
        for (ns, c) in &m {
            let _ = writeln!(out, "blobpool_cache_keys{{namespace=\"{ns}\"}} {}", c.keys);
        }
    }

    /// Counts one error answered with `code` (including errors raised by a
    /// transport binding, and failures in the middle of a streamed body).
    pub fn error(&self, code: ErrorCode) {
        bump(&self.errors[code.index()], 1);
    }

    /// Errors answered with `code` so far.
    pub fn errors(&self, code: ErrorCode) -> u64 {
        self.errors[code.index()].load(Ordering::Relaxed)
    }

    /// Renders the text exposition, with the token gauges.
    pub fn render(&self, tokens: &TokenStats) -> String {
        let mut out = String::with_capacity(4096);
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {v}");
        };
        counter("blobpool_puts_total", "Successful puts.", load(&self.puts));
        counter(
            "blobpool_puts_deduplicated_total",
            "Successful puts that found the entry already stored.",
            load(&self.puts_deduplicated),
        );
        counter(
            "blobpool_put_bytes_total",
            "Bytes accepted by successful puts.",
            load(&self.put_bytes),
        );
        counter(
            "blobpool_gets_total",
            "Get requests answered with content (whole or ranged).",
            load(&self.gets),
        );
        counter(
            "blobpool_bao_gets_total",
            "Get requests answered with a verified (bao) stream (also counted in blobpool_gets_total).",
            load(&self.bao_gets),
        );
        counter(
            "blobpool_get_bytes_total",
            "Content bytes handed to clients by gets.",
            load(&self.get_bytes),
        );
        counter(
            "blobpool_stats_total",
            "Stat (HEAD) requests answered.",
            load(&self.stats),
        );
        counter(
            "blobpool_have_requests_total",
            "Have requests answered (probes and renewals).",
            load(&self.have_requests),
        );
        counter(
            "blobpool_have_digests_total",
            "Digests asked about by have requests.",
            load(&self.have_digests),
        );
        counter(
            "blobpool_token_renewal_probes_total",
            "Have requests carrying a token.",
            load(&self.renewal_probes),
        );
        counter(
            "blobpool_deletes_total",
            "Successful direct deletes.",
            load(&self.deletes),
        );
        counter(
            "blobpool_sweeps_total",
            "Sweeps run (aborted ones included).",
            load(&self.sweeps),
        );
        counter(
            "blobpool_sweep_staged_total",
            "Candidates staged into the delete window by sweeps.",
            load(&self.sweep_staged),
        );
        counter(
            "blobpool_sweep_deleted_total",
            "Entries deleted by sweeps.",
            load(&self.sweep_deleted),
        );
        counter(
            "blobpool_sweep_rescued_total",
            "Staged candidates rescued by sweeps.",
            load(&self.sweep_rescued),
        );
        counter(
            "blobpool_sweep_bytes_freed_total",
            "Bytes freed by sweeps.",
            load(&self.sweep_bytes_freed),
        );
        counter(
            "blobpool_tokens_minted_total",
            "Pin tokens minted.",
            tokens.minted,
        );
        counter(
            "blobpool_tokens_renewed_total",
            "Pin tokens renewed.",
            tokens.renewed,
        );
        counter(
            "blobpool_tokens_released_total",
            "Pin tokens released.",
            tokens.released,
        );
        counter(
            "blobpool_tokens_expired_total",
            "Pin tokens expired.",
            tokens.expired,
        );
        counter(
            "blobpool_tokens_refused_total",
            "Puts refused at the pin-token cap (nothing stored, no token evicted).",
            tokens.refused,
        );

        let _ = writeln!(
            out,
            "# HELP blobpool_sweeps_aborted_total Sweeps that deliberately did nothing, by cause."
        );
        let _ = writeln!(out, "# TYPE blobpool_sweeps_aborted_total counter");
        for (i, c) in self.sweeps_aborted.iter().enumerate() {
            let _ = writeln!(
                out,
                "blobpool_sweeps_aborted_total{{cause=\"{}\"}} {}",
                abort_label(i),
                load(c)
            );
        }
        let _ = writeln!(
            out,
            "# HELP blobpool_errors_total Error answers, by stable code."
        );
        let _ = writeln!(out, "# TYPE blobpool_errors_total counter");
        for code in ErrorCode::ALL {
            let _ = writeln!(
                out,
                "blobpool_errors_total{{code=\"{}\"}} {}",
                code.as_str(),
                self.errors(code)
            );
        }
        let _ = writeln!(out, "# HELP blobpool_tokens Live pin tokens.");
        let _ = writeln!(out, "# TYPE blobpool_tokens gauge");
        let _ = writeln!(out, "blobpool_tokens {}", tokens.live);
        let _ = writeln!(
            out,
            "# HELP blobpool_tokens_reserved Pin-token slots held by puts in flight."
        );
        let _ = writeln!(out, "# TYPE blobpool_tokens_reserved gauge");
        let _ = writeln!(out, "blobpool_tokens_reserved {}", tokens.reserved);
        self.inventory.render(&mut out);
        self.render_cache(&mut out);
        self.render_requests(&mut out);
        if let Some(extra) = self.extra.get() {
            out.push_str(&extra());
        }
        out
    }
}
