//! Process-wide counters and their Prometheus text exposition (format
//! 0.0.4).
//!
//! Every family the server renders is declared once, in [`FAMILIES`]: its
//! name, type and help, and a function that reads its samples at scrape
//! time. [`Metrics::render`] writes the exposition from that table alone
//! (label values escaped, histogram buckets made cumulative), so adding a
//! metric is one table row, and no `# HELP`/`# TYPE` line is written by
//! hand. The engines' families (store-layers' `MetricsLayer`) are appended
//! as text by [`Metrics::set_extra`]; where a database's writes and reads
//! waited ([`DatabaseWaits`], ADR-073) comes from the function
//! [`Metrics::set_database_waits`] sets, rendered through the table.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

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
    sweeps_aborted: [AtomicU64; ABORT_CAUSES.len()],
    sweep_staged: AtomicU64,
    sweep_deleted: AtomicU64,
    sweep_rescued: AtomicU64,
    sweep_bytes_freed: AtomicU64,
    errors: [AtomicU64; ErrorCode::ALL.len()],
    /// The stored-inventory gauges (`crate::inventory`).
    pub(crate) inventory: crate::inventory::Inventory,
    /// Per cache namespace (ADR-048): lookups hit/missed, puts and their
    /// bytes, and the keys' usage as last read. Cache namespaces are
    /// configured, so the label set is bounded.
    cache: Mutex<BTreeMap<String, CacheCounters>>,
    /// Per gRPC method (ADR-071): lookups that found what they asked for
    /// and those that did not (hits, misses). The methods are the gRPC
    /// binding's constants, so the label set is bounded.
    grpc_lookups: Mutex<BTreeMap<&'static str, (u64, u64)>>,
    /// Request latency per route pattern and method (bounded labels: the
    /// routes are the server's patterns and configured base paths, the
    /// methods a fixed list).
    requests: Mutex<BTreeMap<(Cow<'static, str>, &'static str), Histogram>>,
    /// Extra exposition appended to the text (the engines' layer metrics).
    extra: std::sync::OnceLock<Box<dyn Fn() -> String + Send + Sync>>,
    /// Where the databases' writes and reads waited, read at scrape time.
    database_waits: std::sync::OnceLock<WaitsSource>,
    /// The git commit of the build, when the binary knows it.
    build_commit: std::sync::OnceLock<String>,
}

/// Reads [`DatabaseWaits`] at scrape time ([`Metrics::set_database_waits`]).
pub type WaitsSource = Box<dyn Fn() -> Vec<DatabaseWaits> + Send + Sync>;

/// A histogram an engine hands over at scrape time: the buckets' upper
/// bounds in seconds (ascending; a last `+Inf` bucket is implied), a count
/// per bucket (not cumulative; one more than the bounds, `+Inf` last), and
/// the sum of what was observed, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineHistogram {
    /// Upper bounds, seconds.
    pub bounds: Vec<f64>,
    /// Observations per bucket, `+Inf` last.
    pub counts: Vec<u64>,
    /// Sum of the observations, seconds.
    pub sum: f64,
}

/// Where one database's writes and reads waited (ADR-058, ADR-073): what
/// tells which wait a slow request spent its time in. `blobpool serve`
/// reads its SQLite engines'. A *foreground* write is a put, a reference
/// or cache-key write, a direct delete; a *bulk* one a sweep's chunk.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DatabaseWaits {
    /// The database (its file), the `database` label.
    pub database: String,
    /// Foreground writes: queued until their transaction began.
    pub write_queued: EngineHistogram,
    /// Of that, the part behind a bulk transaction.
    pub write_behind_bulk: EngineHistogram,
    /// Foreground writes: their own transaction, begin to commit.
    pub write_transaction: EngineHistogram,
    /// Of that, the `COMMIT` (the fsync).
    pub write_commit: EngineHistogram,
    /// Each bulk transaction (statements and commit).
    pub bulk_transaction: EngineHistogram,
    /// Reads run where they may wait: waiting for a free read connection.
    pub read_connection: EngineHistogram,
    /// Point reads not answered from memory on the calling thread: their
    /// whole time where they may wait.
    pub point_read: EngineHistogram,
    /// Writes of 10 ms or more from queued to answered.
    pub slow_writes: u64,
    /// Point reads answered on the calling thread from memory.
    pub reads_inline: u64,
    /// Reads run where they may wait (fallbacks, no free connection, scans).
    pub reads_waited: u64,
    /// Point reads tried inline that would have waited for the disk.
    pub point_read_fallbacks: u64,
}

/// Upper bounds (seconds) of the request-latency histogram's buckets; a
/// last bucket (`+Inf`) takes everything slower.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The `cause` labels of `blobpool_sweeps_aborted_total`, by index.
const ABORT_CAUSES: [&str; 4] = [
    "protect_failed",
    "sweeper_lock",
    "no_liveness_sources",
    "other",
];

/// One latency histogram over [`LATENCY_BUCKETS`]: a count per bucket (not
/// cumulative; `+Inf` last), the sum and the count.
#[derive(Clone, Debug, Default, PartialEq)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS.len() + 1],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        // A NaN (never produced by a clock) falls into +Inf, not a bucket.
        let i = LATENCY_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i] += 1;
        self.sum += secs;
        self.count += 1;
    }
}

/// The method label: the standard methods by name, anything else `other`
/// (clients choose methods; the label set must stay bounded).
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

#[derive(Clone, Copy, Debug, Default)]
struct CacheCounters {
    hits: u64,
    misses: u64,
    puts: u64,
    put_bytes: u64,
    keys: u64,
    bytes: u64,
    evicted_keys: u64,
    evicted_bytes: u64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// A metric family's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One sample's value.
#[derive(Clone, Debug)]
enum Value {
    Int(u64),
    Float(f64),
    /// Rendered as `_bucket{le}` (cumulative), `_sum` and `_count`.
    Histogram(Histogram),
    /// The same, over an engine's own bounds.
    Engine(EngineHistogram),
}

/// One sample: its labels (name, value) and value.
type Sample = (Vec<(&'static str, String)>, Value);

/// What a family's samples are read from at scrape time: the counters,
/// the token gauges, and consistent copies of the locked maps.
struct View<'a> {
    m: &'a Metrics,
    tokens: &'a TokenStats,
    cache: BTreeMap<String, CacheCounters>,
    requests: BTreeMap<(Cow<'static, str>, &'static str), Histogram>,
    inventory: Option<crate::inventory::InventorySample>,
    waits: Vec<DatabaseWaits>,
}

/// A metric family, declared once: name, type, help, and its samples.
pub(crate) struct Family {
    pub(crate) name: &'static str,
    pub(crate) kind: Kind,
    pub(crate) help: &'static str,
    samples: fn(&View<'_>) -> Vec<Sample>,
}

/// One unlabelled sample.
fn one(v: u64) -> Vec<Sample> {
    vec![(vec![], Value::Int(v))]
}

/// One sample per cache namespace, labelled `namespace`.
fn per_cache_ns(v: &View<'_>, f: fn(&CacheCounters) -> u64) -> Vec<Sample> {
    v.cache
        .iter()
        .map(|(ns, c)| (vec![("namespace", ns.clone())], Value::Int(f(c))))
        .collect()
}

/// One sample per stored-inventory row, labelled `namespace` and `tier`.
fn per_inventory_row(v: &View<'_>, f: fn(&store_core::TierStats) -> u64) -> Vec<Sample> {
    v.inventory
        .iter()
        .flat_map(|s| s.rows.iter())
        .map(|r| {
            (
                vec![
                    ("namespace", r.namespace.to_string()),
                    ("tier", r.tier.to_string()),
                ],
                Value::Int(f(r)),
            )
        })
        .collect()
}

/// One sample per database, labelled `database`.
fn per_database(v: &View<'_>, f: fn(&DatabaseWaits) -> Value) -> Vec<Sample> {
    v.waits
        .iter()
        .map(|w| (vec![("database", w.database.clone())], f(w)))
        .collect()
}

/// A histogram family of one [`DatabaseWaits`] field, per database.
macro_rules! waits {
    ($name:literal, $help:literal, $wait:ident) => {
        Family {
            name: $name,
            kind: Kind::Histogram,
            help: $help,
            samples: |v| per_database(v, |w| Value::Engine(w.$wait.clone())),
        }
    };
}

const fn counter(
    name: &'static str,
    help: &'static str,
    samples: fn(&View<'_>) -> Vec<Sample>,
) -> Family {
    Family {
        name,
        kind: Kind::Counter,
        help,
        samples,
    }
}

const fn gauge(
    name: &'static str,
    help: &'static str,
    samples: fn(&View<'_>) -> Vec<Sample>,
) -> Family {
    Family {
        name,
        kind: Kind::Gauge,
        help,
        samples,
    }
}

/// Every family `/metrics` renders (besides the engines' appended text),
/// in rendering order. docs/SERVER.md documents each (a test checks).
pub(crate) const FAMILIES: &[Family] = &[
    counter("blobpool_puts_total", "Successful puts.", |v| {
        one(load(&v.m.puts))
    }),
    counter(
        "blobpool_puts_deduplicated_total",
        "Successful puts that found the entry already stored.",
        |v| one(load(&v.m.puts_deduplicated)),
    ),
    counter(
        "blobpool_put_bytes_total",
        "Bytes accepted by successful puts.",
        |v| one(load(&v.m.put_bytes)),
    ),
    counter(
        "blobpool_gets_total",
        "Get requests answered with content (whole or ranged).",
        |v| one(load(&v.m.gets)),
    ),
    counter(
        "blobpool_bao_gets_total",
        "Get requests answered with a verified (bao) stream (also counted in blobpool_gets_total).",
        |v| one(load(&v.m.bao_gets)),
    ),
    counter(
        "blobpool_get_bytes_total",
        "Content bytes handed to clients by gets.",
        |v| one(load(&v.m.get_bytes)),
    ),
    counter(
        "blobpool_stats_total",
        "Stat (HEAD) requests answered.",
        |v| one(load(&v.m.stats)),
    ),
    counter(
        "blobpool_have_requests_total",
        "Have requests answered (probes and renewals).",
        |v| one(load(&v.m.have_requests)),
    ),
    counter(
        "blobpool_have_digests_total",
        "Digests asked about by have requests.",
        |v| one(load(&v.m.have_digests)),
    ),
    counter(
        "blobpool_token_renewal_probes_total",
        "Have requests carrying a token.",
        |v| one(load(&v.m.renewal_probes)),
    ),
    counter(
        "blobpool_deletes_total",
        "Successful direct deletes.",
        |v| one(load(&v.m.deletes)),
    ),
    counter(
        "blobpool_sweeps_total",
        "Sweeps run (aborted ones included).",
        |v| one(load(&v.m.sweeps)),
    ),
    counter(
        "blobpool_sweep_staged_total",
        "Candidates staged into the delete window by sweeps.",
        |v| one(load(&v.m.sweep_staged)),
    ),
    counter(
        "blobpool_sweep_deleted_total",
        "Entries deleted by sweeps.",
        |v| one(load(&v.m.sweep_deleted)),
    ),
    counter(
        "blobpool_sweep_rescued_total",
        "Staged candidates rescued by sweeps.",
        |v| one(load(&v.m.sweep_rescued)),
    ),
    counter(
        "blobpool_sweep_bytes_freed_total",
        "Bytes freed by sweeps.",
        |v| one(load(&v.m.sweep_bytes_freed)),
    ),
    counter("blobpool_tokens_minted_total", "Pin tokens minted.", |v| {
        one(v.tokens.minted)
    }),
    counter("blobpool_tokens_renewed_total", "Pin tokens renewed.", |v| {
        one(v.tokens.renewed)
    }),
    counter(
        "blobpool_tokens_released_total",
        "Pin tokens released.",
        |v| one(v.tokens.released),
    ),
    counter("blobpool_tokens_expired_total", "Pin tokens expired.", |v| {
        one(v.tokens.expired)
    }),
    counter(
        "blobpool_tokens_refused_total",
        "Puts refused at the pin-token cap (nothing stored, no token evicted).",
        |v| one(v.tokens.refused),
    ),
    counter(
        "blobpool_sweeps_aborted_total",
        "Sweeps that deliberately did nothing, by cause.",
        |v| {
            ABORT_CAUSES
                .iter()
                .zip(&v.m.sweeps_aborted)
                .map(|(cause, c)| (vec![("cause", cause.to_string())], Value::Int(load(c))))
                .collect()
        },
    ),
    counter(
        "blobpool_errors_total",
        "Error answers, by stable code.",
        |v| {
            ErrorCode::ALL
                .iter()
                .map(|code| {
                    (
                        vec![("code", code.as_str().to_string())],
                        Value::Int(v.m.errors(*code)),
                    )
                })
                .collect()
        },
    ),
    gauge("blobpool_tokens", "Live pin tokens.", |v| one(v.tokens.live)),
    gauge(
        "blobpool_tokens_reserved",
        "Pin-token slots held by puts in flight.",
        |v| one(v.tokens.reserved),
    ),
    gauge(
        "blobpool_stored_entries",
        "Entries stored, per namespace and tier (a snapshot, see blobpool_inventory_age_seconds).",
        |v| per_inventory_row(v, |r| r.entries),
    ),
    gauge(
        "blobpool_stored_bytes",
        "Content bytes stored, per namespace and tier (a snapshot, see blobpool_inventory_age_seconds).",
        |v| per_inventory_row(v, |r| r.bytes),
    ),
    gauge(
        "blobpool_inventory_age_seconds",
        "Age of the stored-inventory snapshot.",
        |v| {
            v.inventory
                .iter()
                .map(|s| (vec![], Value::Float((s.age_secs * 1000.0).round() / 1000.0)))
                .collect()
        },
    ),
    counter(
        "blobpool_cache_requests_total",
        "Cache key lookups (GET/HEAD /cache/...), by namespace and result.",
        |v| {
            v.cache
                .iter()
                .flat_map(|(ns, c)| {
                    [("hit", c.hits), ("miss", c.misses)].map(|(result, n)| {
                        (
                            vec![("namespace", ns.clone()), ("result", result.to_string())],
                            Value::Int(n),
                        )
                    })
                })
                .collect()
        },
    ),
    counter(
        "blobpool_grpc_cache_requests_total",
        "gRPC cache lookups (blobs and action results asked for), by method and result.",
        |v| {
            let m = v.m.grpc_lookups.lock().unwrap_or_else(|p| p.into_inner());
            m.iter()
                .flat_map(|(method, (hits, misses))| {
                    [("hit", *hits), ("miss", *misses)].map(|(result, n)| {
                        let labels = vec![("method", method.to_string()), ("result", result.to_string())];
                        (labels, Value::Int(n))
                    })
                })
                .collect()
        },
    ),
    counter(
        "blobpool_cache_puts_total",
        "Cache puts (keys recorded), by namespace.",
        |v| per_cache_ns(v, |c| c.puts),
    ),
    counter(
        "blobpool_cache_put_bytes_total",
        "Bytes of cache puts, by namespace.",
        |v| per_cache_ns(v, |c| c.put_bytes),
    ),
    gauge(
        "blobpool_cache_bytes",
        "Bytes the cache keys of a namespace hold (an entry two keys name counts twice).",
        |v| per_cache_ns(v, |c| c.bytes),
    ),
    gauge(
        "blobpool_cache_keys",
        "Cache keys of a namespace.",
        |v| per_cache_ns(v, |c| c.keys),
    ),
    counter(
        "blobpool_cache_evicted_keys_total",
        "Cache keys trims evicted (at write time and at sweeps), by namespace.",
        |v| per_cache_ns(v, |c| c.evicted_keys),
    ),
    counter(
        "blobpool_cache_evicted_bytes_total",
        "The sizes of the cache keys trims evicted, by namespace.",
        |v| per_cache_ns(v, |c| c.evicted_bytes),
    ),
    Family {
        name: "blobpool_http_request_duration_seconds",
        kind: Kind::Histogram,
        help: "Time from a request's arrival to its response head, by route pattern and method.",
        samples: |v| {
            v.requests
                .iter()
                .map(|((route, method), h)| {
                    (
                        vec![("route", route.to_string()), ("method", method.to_string())],
                        Value::Histogram(h.clone()),
                    )
                })
                .collect()
        },
    },
    waits!(
        "blobpool_sqlite_write_queued_seconds",
        "Foreground SQLite writes (puts, reference and cache-key writes, direct deletes): time queued until their transaction began, by database.",
        write_queued
    ),
    waits!(
        "blobpool_sqlite_write_behind_bulk_seconds",
        "Of a foreground write's time queued, the part behind a bulk (sweep) transaction, by database.",
        write_behind_bulk
    ),
    waits!(
        "blobpool_sqlite_write_transaction_seconds",
        "A foreground write's own transaction, begin to commit, by database.",
        write_transaction
    ),
    waits!(
        "blobpool_sqlite_write_commit_seconds",
        "Of a foreground write's transaction, the COMMIT (the fsync), by database.",
        write_commit
    ),
    waits!(
        "blobpool_sqlite_bulk_transaction_seconds",
        "Each bulk (sweep) transaction, statements and commit: what a foreground write may wait behind, by database.",
        bulk_transaction
    ),
    waits!(
        "blobpool_sqlite_read_connection_wait_seconds",
        "Reads run where they may wait: time waiting for a free read connection, by database.",
        read_connection
    ),
    waits!(
        "blobpool_sqlite_point_read_wait_seconds",
        "Point reads not answered from memory on the calling thread: their time where they may wait (connection, disk, hand-off), by database.",
        point_read
    ),
    counter(
        "blobpool_sqlite_slow_writes_total",
        "SQLite writes that took 10 ms or more from queued to answered, by database.",
        |v| per_database(v, |w| Value::Int(w.slow_writes)),
    ),
    counter(
        "blobpool_sqlite_reads_total",
        "SQLite reads, by database and path: inline (a point read answered from memory on the calling thread) or waited (run where it may wait).",
        |v| {
            v.waits
                .iter()
                .flat_map(|w| {
                    [("inline", w.reads_inline), ("waited", w.reads_waited)].map(|(path, n)| {
                        (
                            vec![("database", w.database.clone()), ("path", path.to_string())],
                            Value::Int(n),
                        )
                    })
                })
                .collect()
        },
    ),
    counter(
        "blobpool_sqlite_point_read_fallbacks_total",
        "SQLite point reads tried inline that would have waited for the disk and ran again where they may wait, by database.",
        |v| per_database(v, |w| Value::Int(w.point_read_fallbacks)),
    ),
    gauge(
        "blobpool_build_info",
        "The running build (always 1): its version, and its git commit when it was built from a git checkout.",
        |v| {
            let mut labels = vec![("version", env!("CARGO_PKG_VERSION").to_string())];
            if let Some(git) = v.m.build_commit.get() {
                labels.push(("git", git.clone()));
            }
            vec![(labels, Value::Int(1))]
        },
    ),
];

/// Escapes a label value (backslash, double quote, line feed).
fn escape_label(v: &str) -> Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return Cow::Borrowed(v);
    }
    let mut s = String::with_capacity(v.len() + 2);
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    Cow::Owned(s)
}

/// `{a="x",b="y"}` (with `extra` last), or nothing without labels.
fn label_set(labels: &[(&'static str, String)], extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    if let Some((k, v)) = extra {
        parts.push(format!("{k}=\"{}\"", escape_label(v)));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// Writes one family: its `# HELP` and `# TYPE` lines, then its samples.
fn write_family(out: &mut String, f: &Family, samples: &[Sample]) {
    let name = f.name;
    let _ = writeln!(out, "# HELP {name} {}", f.help);
    let _ = writeln!(out, "# TYPE {name} {}", f.kind.as_str());
    for (labels, value) in samples {
        match value {
            Value::Int(n) => {
                let _ = writeln!(out, "{name}{} {n}", label_set(labels, None));
            }
            Value::Float(x) => {
                let _ = writeln!(out, "{name}{} {x}", label_set(labels, None));
            }
            Value::Histogram(h) => {
                let b = (&LATENCY_BUCKETS[..], &h.buckets[..], h.sum);
                write_buckets(out, name, labels, b);
            }
            Value::Engine(h) => {
                write_buckets(out, name, labels, (&h.bounds, &h.counts, h.sum));
            }
        }
    }
}

/// A histogram's `_bucket{le}` lines (cumulative; `+Inf` is the count),
/// `_sum` and `_count`, from its bounds, per-bucket counts (`+Inf` last)
/// and sum.
fn write_buckets(
    out: &mut String,
    name: &str,
    labels: &[(&'static str, String)],
    (bounds, counts, sum): (&[f64], &[u64], f64),
) {
    let mut cumulative = 0;
    for (i, b) in bounds.iter().enumerate() {
        cumulative += counts.get(i).copied().unwrap_or(0);
        let le = b.to_string();
        let _ = writeln!(
            out,
            "{name}_bucket{} {cumulative}",
            label_set(labels, Some(("le", &le)))
        );
    }
    let count: u64 = counts.iter().sum();
    let _ = writeln!(
        out,
        "{name}_bucket{} {count}",
        label_set(labels, Some(("le", "+Inf")))
    );
    let _ = writeln!(out, "{name}_sum{} {sum}", label_set(labels, None));
    let _ = writeln!(out, "{name}_count{} {count}", label_set(labels, None));
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
        load(&self.bao_gets)
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
    /// (`/v1/blobs/{ns}/{digest}`, never the raw path: the caller passes a
    /// pattern of the server's or a configured base path) and method.
    pub fn request(&self, route: Cow<'static, str>, method: &str, secs: f64) {
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

    /// Reads the databases' waits from `f` at every scrape (set once;
    /// later calls are ignored). `serve` reads its SQLite engines' with it.
    pub fn set_database_waits(&self, f: WaitsSource) {
        let _ = self.database_waits.set(f);
    }

    /// Labels `blobpool_build_info` with the git commit the binary was
    /// built from (set once; later calls are ignored).
    pub fn set_build_commit(&self, git: &str) {
        let _ = self.build_commit.set(git.to_string());
    }

    fn cache_entry(&self, ns: &str, f: impl FnOnce(&mut CacheCounters)) {
        let mut m = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match m.get_mut(ns) {
            Some(c) => f(c),
            None => f(m.entry(ns.to_string()).or_default()),
        }
    }

    /// Counts one cache lookup in `ns` (a key's get or head):
    /// `blobpool_cache_requests_total{namespace, result="hit"|"miss"}`.
    pub(crate) fn cache_lookup(&self, ns: &str, hit: bool) {
        self.cache_entry(ns, |c| if hit { c.hits += 1 } else { c.misses += 1 });
    }

    /// Counts `hits` and `misses` of one call of gRPC `method` (its path):
    /// `blobpool_grpc_cache_requests_total{method, result}`.
    pub fn grpc_lookups(&self, method: &'static str, hits: u64, misses: u64) {
        let mut m = self.grpc_lookups.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(method).or_default();
        (e.0, e.1) = (e.0 + hits, e.1 + misses);
    }

    /// Counts one cache put of `bytes` in `ns`:
    /// `blobpool_cache_puts_total{namespace}` and
    /// `blobpool_cache_put_bytes_total{namespace}`.
    pub(crate) fn cache_put(&self, ns: &str, bytes: u64) {
        self.cache_entry(ns, |c| {
            c.puts += 1;
            c.put_bytes += bytes;
        });
    }

    /// Sets the usage gauges of `ns` (read at scrape time):
    /// `blobpool_cache_keys{namespace}` and `blobpool_cache_bytes{namespace}`.
    pub(crate) fn set_cache_usage(&self, ns: &str, keys: u64, bytes: u64) {
        self.cache_entry(ns, |c| {
            c.keys = keys;
            c.bytes = bytes;
        });
    }

    /// Sets what this node's trims evicted from `ns` since it started
    /// (`blobpool_cache_evicted_keys_total`, `_bytes_total`).
    pub(crate) fn set_cache_evicted(&self, ns: &str, keys: u64, bytes: u64) {
        self.cache_entry(ns, |c| (c.evicted_keys, c.evicted_bytes) = (keys, bytes));
    }

    /// Cache lookups of `ns` so far: (hits, misses).
    pub fn cache_lookups(&self, ns: &str) -> (u64, u64) {
        let m = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        m.get(ns).map_or((0, 0), |c| (c.hits, c.misses))
    }

    /// Counts one error answered with `code` (including errors raised by a
    /// transport binding, and failures in the middle of a streamed body).
    pub fn error(&self, code: ErrorCode) {
        bump(&self.errors[code.index()], 1);
    }

    /// Errors answered with `code` so far.
    pub fn errors(&self, code: ErrorCode) -> u64 {
        load(&self.errors[code.index()])
    }

    /// Renders the text exposition: every family of `FAMILIES`, with
    /// the token gauges, then the extra text ([`Metrics::set_extra`]).
    /// Asks the inventory refresher for a fresh snapshot (a scrape never
    /// waits for one).
    pub fn render(&self, tokens: &TokenStats) -> String {
        let view = View {
            m: self,
            tokens,
            cache: self.cache.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            requests: self
                .requests
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            inventory: self.inventory.sample(),
            waits: self.database_waits.get().map(|f| f()).unwrap_or_default(),
        };
        let mut out = String::with_capacity(8192);
        for f in FAMILIES {
            write_family(&mut out, f, &(f.samples)(&view));
        }
        if let Some(extra) = self.extra.get() {
            out.push_str(&extra());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(m: &Metrics) -> String {
        m.render(&TokenStats::default())
    }

    /// The lines of `text` that are samples of `family` (not its comments).
    fn samples<'a>(text: &'a str, family: &str) -> Vec<&'a str> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| {
                l.strip_prefix(family)
                    .is_some_and(|rest| rest.starts_with(['{', ' ', '_']))
            })
            .collect()
    }

    #[test]
    fn every_family_is_declared_once_and_rendered_with_its_type_and_help() {
        let mut names: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a family is declared twice");
        let text = render(&Metrics::default());
        for f in FAMILIES {
            assert!(f.name.starts_with("blobpool_"), "{}", f.name);
            assert!(!f.help.is_empty() && !f.help.contains('\n'), "{}", f.name);
            let help = format!("# HELP {} {}\n", f.name, f.help);
            let ty = format!("# TYPE {} {}\n", f.name, f.kind.as_str());
            assert_eq!(text.matches(&help).count(), 1, "{help}");
            assert_eq!(text.matches(&ty).count(), 1, "{ty}");
            if f.kind == Kind::Counter {
                assert!(f.name.ends_with("_total"), "counter {}", f.name);
            }
        }
        // Nothing but the declared families: every TYPE line is one of them.
        let typed = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(typed, FAMILIES.len());
    }

    #[test]
    fn counters_render_their_values_under_the_existing_names() {
        let m = Metrics::default();
        m.put(100, false);
        m.put(50, true);
        m.get();
        m.bao_get();
        m.get_bytes(7);
        m.stat();
        m.have(3, true);
        m.delete();
        m.error(ErrorCode::Missing);
        m.error(ErrorCode::Missing);
        let tokens = TokenStats {
            live: 4,
            reserved: 1,
            minted: 9,
            renewed: 2,
            released: 3,
            expired: 0,
            refused: 5,
        };
        let text = m.render(&tokens);
        for line in [
            "blobpool_puts_total 2",
            "blobpool_puts_deduplicated_total 1",
            "blobpool_put_bytes_total 150",
            "blobpool_gets_total 1",
            "blobpool_bao_gets_total 1",
            "blobpool_get_bytes_total 7",
            "blobpool_stats_total 1",
            "blobpool_have_requests_total 1",
            "blobpool_have_digests_total 3",
            "blobpool_token_renewal_probes_total 1",
            "blobpool_deletes_total 1",
            "blobpool_sweeps_total 0",
            "blobpool_tokens_minted_total 9",
            "blobpool_tokens_refused_total 5",
            "blobpool_tokens 4",
            "blobpool_tokens_reserved 1",
            "blobpool_errors_total{code=\"missing\"} 2",
            "blobpool_sweeps_aborted_total{cause=\"sweeper_lock\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert_eq!(
            samples(&text, "blobpool_errors_total").len(),
            ErrorCode::ALL.len()
        );
    }

    #[test]
    fn cache_counters_and_gauges_render_per_namespace() {
        let m = Metrics::default();
        // Nothing recorded: the families are announced, with no samples.
        let text = render(&m);
        assert!(text.contains("# TYPE blobpool_cache_requests_total counter\n"));
        assert!(samples(&text, "blobpool_cache_requests_total").is_empty());

        m.cache_lookup("ccache", true);
        m.cache_lookup("ccache", true);
        m.cache_lookup("ccache", false);
        m.cache_lookup("gradle", false);
        m.cache_put("ccache", 1000);
        m.cache_put("ccache", 24);
        m.set_cache_usage("ccache", 3, 4096);
        m.set_cache_usage("ccache", 2, 2048); // a gauge: replaced, not added
        assert_eq!(m.cache_lookups("ccache"), (2, 1));
        assert_eq!(m.cache_lookups("none"), (0, 0));
        let text = render(&m);
        assert_eq!(
            samples(&text, "blobpool_cache_requests_total"),
            [
                "blobpool_cache_requests_total{namespace=\"ccache\",result=\"hit\"} 2",
                "blobpool_cache_requests_total{namespace=\"ccache\",result=\"miss\"} 1",
                "blobpool_cache_requests_total{namespace=\"gradle\",result=\"hit\"} 0",
                "blobpool_cache_requests_total{namespace=\"gradle\",result=\"miss\"} 1",
            ]
        );
        assert_eq!(
            samples(&text, "blobpool_cache_puts_total"),
            [
                "blobpool_cache_puts_total{namespace=\"ccache\"} 2",
                "blobpool_cache_puts_total{namespace=\"gradle\"} 0",
            ]
        );
        assert_eq!(
            samples(&text, "blobpool_cache_put_bytes_total")[0],
            "blobpool_cache_put_bytes_total{namespace=\"ccache\"} 1024"
        );
        assert_eq!(
            samples(&text, "blobpool_cache_keys")[0],
            "blobpool_cache_keys{namespace=\"ccache\"} 2"
        );
        assert_eq!(
            samples(&text, "blobpool_cache_bytes")[0],
            "blobpool_cache_bytes{namespace=\"ccache\"} 2048"
        );
        assert!(text.contains("# TYPE blobpool_cache_keys gauge\n"));
        assert!(text.contains("# TYPE blobpool_cache_bytes gauge\n"));
    }

    #[test]
    fn request_latency_is_a_cumulative_histogram_per_route_and_method() {
        let m = Metrics::default();
        let route = "/v1/blobs/{ns}/{digest}";
        m.request(Cow::Borrowed(route), "GET", 0.0003); // first bucket
        m.request(Cow::Borrowed(route), "GET", 0.004); // le 0.005
        m.request(Cow::Borrowed(route), "GET", 0.005); // le 0.005: bounds are inclusive
        m.request(Cow::Borrowed(route), "GET", 30.0); // +Inf only
        m.request(Cow::Borrowed(route), "BREW", 0.1); // an unknown method
        m.request(Cow::Owned("/bazel/{key}".into()), "PUT", 0.2);
        assert_eq!(m.requests_timed(route, "GET"), 4);
        assert_eq!(m.requests_timed(route, "other"), 1);
        let text = render(&m);
        let family = "blobpool_http_request_duration_seconds";
        assert!(text.contains(&format!("# TYPE {family} histogram\n")));
        let get: Vec<&str> = samples(&text, family)
            .into_iter()
            .filter(|l| l.contains("route=\"/v1/blobs/{ns}/{digest}\",method=\"GET\""))
            .collect();
        // Every bucket, +Inf, sum and count.
        assert_eq!(get.len(), LATENCY_BUCKETS.len() + 3, "{get:#?}");
        let bucket = |le: &str| {
            let prefix = format!(
                "{family}_bucket{{route=\"/v1/blobs/{{ns}}/{{digest}}\",method=\"GET\",le=\"{le}\"}} "
            );
            get.iter()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("no bucket {le}: {get:#?}"))
                .to_string()
        };
        assert_eq!(bucket("0.0005"), "1");
        assert_eq!(bucket("0.0025"), "1");
        assert_eq!(bucket("0.005"), "3");
        assert_eq!(bucket("10"), "3");
        assert_eq!(bucket("+Inf"), "4");
        assert!(get.contains(
            &"blobpool_http_request_duration_seconds_count{route=\"/v1/blobs/{ns}/{digest}\",method=\"GET\"} 4"
        ));
        let sum: f64 = get
            .iter()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "{family}_sum{{route=\"/v1/blobs/{{ns}}/{{digest}}\",method=\"GET\"}} "
                ))
            })
            .unwrap()
            .parse()
            .unwrap();
        assert!((sum - 30.0093).abs() < 1e-9, "{sum}");
        assert!(text.contains(
            "blobpool_http_request_duration_seconds_count{route=\"/v1/blobs/{ns}/{digest}\",method=\"other\"} 1\n"
        ));
        assert!(text.contains(
            "blobpool_http_request_duration_seconds_count{route=\"/bazel/{key}\",method=\"PUT\"} 1\n"
        ));
    }

    #[test]
    fn database_waits_render_per_database_over_the_engines_bounds() {
        let m = Metrics::default();
        // No source: the families are announced, with no samples.
        let text = render(&m);
        let family = "blobpool_sqlite_write_queued_seconds";
        assert!(text.contains(&format!("# TYPE {family} histogram\n")));
        assert!(samples(&text, family).is_empty());
        let h = EngineHistogram {
            bounds: vec![0.001, 0.01],
            counts: vec![2, 0, 1],
            sum: 0.5,
        };
        m.set_database_waits(Box::new(move || {
            vec![DatabaseWaits {
                database: "/d/kv.sqlite".into(),
                write_queued: h.clone(),
                slow_writes: 3,
                reads_inline: 7,
                reads_waited: 2,
                point_read_fallbacks: 1,
                ..DatabaseWaits::default()
            }]
        }));
        let text = render(&m);
        let db = "database=\"/d/kv.sqlite\"";
        assert_eq!(
            samples(&text, family),
            [
                format!("{family}_bucket{{{db},le=\"0.001\"}} 2"),
                format!("{family}_bucket{{{db},le=\"0.01\"}} 2"),
                format!("{family}_bucket{{{db},le=\"+Inf\"}} 3"),
                format!("{family}_sum{{{db}}} 0.5"),
                format!("{family}_count{{{db}}} 3"),
            ]
        );
        for line in [
            format!("blobpool_sqlite_bulk_transaction_seconds_bucket{{{db},le=\"+Inf\"}} 0"),
            format!("blobpool_sqlite_bulk_transaction_seconds_count{{{db}}} 0"),
            format!("blobpool_sqlite_slow_writes_total{{{db}}} 3"),
            format!("blobpool_sqlite_reads_total{{{db},path=\"inline\"}} 7"),
            format!("blobpool_sqlite_reads_total{{{db},path=\"waited\"}} 2"),
            format!("blobpool_sqlite_point_read_fallbacks_total{{{db}}} 1"),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn build_info_is_one_with_the_version_and_the_commit_when_known() {
        let m = Metrics::default();
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            samples(&render(&m), "blobpool_build_info"),
            [format!("blobpool_build_info{{version=\"{version}\"}} 1")]
        );
        m.set_build_commit("0123456789ab");
        m.set_build_commit("ignored");
        assert_eq!(
            samples(&render(&m), "blobpool_build_info"),
            [format!(
                "blobpool_build_info{{version=\"{version}\",git=\"0123456789ab\"}} 1"
            )]
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label("plain"), "plain");
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let m = Metrics::default();
        m.cache_lookup("we\"ird", true);
        let text = render(&m);
        assert!(
            text.contains(
                "blobpool_cache_requests_total{namespace=\"we\\\"ird\",result=\"hit\"} 1\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_extra_text_is_appended_once() {
        let m = Metrics::default();
        m.set_extra(Box::new(|| {
            "# TYPE blobpool_engine_x gauge\nblobpool_engine_x 1\n".into()
        }));
        m.set_extra(Box::new(|| "ignored\n".into()));
        let text = render(&m);
        assert!(text.ends_with("# TYPE blobpool_engine_x gauge\nblobpool_engine_x 1\n"));
        assert!(!text.contains("ignored"));
    }
}
