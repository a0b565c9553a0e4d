//! The metrics layer: per engine and operation, call counts, a latency
//! histogram and error counts by error variant; bytes read and written;
//! stages open. Plain atomics, read through [`MetricsLayer::snapshot`] and
//! rendered as Prometheus text by [`render_prometheus`] (ADR-028: no
//! metrics framework is pulled into the engines' dependency tree; a server
//! can serve the text or feed the snapshot to whatever it uses).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use store_types::{
    BlobReader, Error, JointStagedWrite, Key, PinIntent, PublishOutcome, Result, StagedWrite, Tier,
};

use crate::layer::{Call, EngineLayer, Next, Reply};
use crate::reader::{wrap_reader, ReadHook};
use crate::Op;

/// Upper bounds (seconds) of the latency histogram's buckets; a last,
/// implicit bucket takes everything slower (`+Inf`).
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The error variants counted, by the names [`error_variant`] gives.
pub const ERROR_VARIANTS: [&str; 14] = [
    "missing",
    "io",
    "verification",
    "key_invalid",
    "gc_refuse",
    "too_large",
    "length_mismatch",
    "invalid_range",
    "config",
    "backend",
    "instance_locked",
    "ref_conflict",
    "sweep_incomplete",
    "other",
];

/// The stable snake_case name of an error's variant (a metric label).
pub fn error_variant(e: &Error) -> &'static str {
    // `Variant { .. }` matches tuple and struct variants alike, so this
    // stays right when a variant's payload changes shape.
    match e {
        Error::Missing => "missing",
        Error::Io { .. } => "io",
        Error::Verification { .. } => "verification",
        Error::KeyInvalid { .. } => "key_invalid",
        Error::GcRefuse { .. } => "gc_refuse",
        Error::TooLarge { .. } => "too_large",
        Error::LengthMismatch { .. } => "length_mismatch",
        Error::InvalidRange { .. } => "invalid_range",
        Error::Config { .. } => "config",
        Error::Backend { .. } => "backend",
        Error::InstanceLocked { .. } => "instance_locked",
        Error::RefConflict { .. } => "ref_conflict",
        Error::SweepIncomplete { .. } => "sweep_incomplete",
        _ => "other",
    }
}

fn variant_index(e: &Error) -> usize {
    let name = error_variant(e);
    ERROR_VARIANTS
        .iter()
        .position(|v| *v == name)
        .unwrap_or(ERROR_VARIANTS.len() - 1)
}

#[derive(Default)]
struct OpStats {
    calls: AtomicU64,
    errors: [AtomicU64; ERROR_VARIANTS.len()],
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl OpStats {
    fn record(&self, elapsed: Duration, error: Option<&Error>) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let secs = elapsed.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|le| secs <= *le)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(
            elapsed.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
        if let Some(e) = error {
            self.errors[variant_index(e)].fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct EngineStats {
    engine: &'static str,
    tier: Option<Tier>,
    ops: [OpStats; Op::ALL.len()],
    bytes_read: AtomicU64,
    read_stream_errors: AtomicU64,
    bytes_written: AtomicU64,
    stages_open: AtomicI64,
}

/// Counts every operation of the engines it wraps.
///
/// Cheap to clone (the counters are shared): keep a clone to read
/// [`MetricsLayer::snapshot`] while the wrapped engines run. One layer may
/// wrap several engines (a [`crate::LayerStack`] wrapping the kv and the
/// large tier); it keeps their counts apart by engine kind and tier.
#[derive(Clone, Default)]
pub struct MetricsLayer {
    engines: Arc<RwLock<Vec<Arc<EngineStats>>>>,
}

impl std::fmt::Debug for MetricsLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsLayer").finish_non_exhaustive()
    }
}

impl MetricsLayer {
    /// A layer with no counts yet.
    pub fn new() -> Self {
        Self::default()
    }

    fn stats(&self, engine: &'static str, tier: Option<Tier>) -> Arc<EngineStats> {
        let find = |v: &Vec<Arc<EngineStats>>| {
            v.iter()
                .find(|s| s.engine == engine && s.tier == tier)
                .cloned()
        };
        if let Some(s) = find(&self.engines.read().unwrap_or_else(|p| p.into_inner())) {
            return s;
        }
        let mut w = self.engines.write().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = find(&w) {
            return s;
        }
        let s = Arc::new(EngineStats {
            engine,
            tier,
            ops: Default::default(),
            bytes_read: AtomicU64::new(0),
            read_stream_errors: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            stages_open: AtomicI64::new(0),
        });
        w.push(s.clone());
        s
    }

    /// The counts so far, engines in the order they were first called.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let engines = self.engines.read().unwrap_or_else(|p| p.into_inner());
        MetricsSnapshot {
            engines: engines
                .iter()
                .map(|s| EngineSnapshot {
                    engine: s.engine,
                    tier: s.tier,
                    ops: Op::ALL
                        .iter()
                        .map(|op| {
                            let o = &s.ops[op.index()];
                            OpSnapshot {
                                op: *op,
                                calls: o.calls.load(Ordering::Relaxed),
                                errors: ERROR_VARIANTS
                                    .iter()
                                    .zip(&o.errors)
                                    .map(|(v, c)| (*v, c.load(Ordering::Relaxed)))
                                    .filter(|(_, c)| *c > 0)
                                    .collect(),
                                latency_buckets: o
                                    .buckets
                                    .iter()
                                    .map(|b| b.load(Ordering::Relaxed))
                                    .collect(),
                                latency_sum: Duration::from_nanos(
                                    o.sum_nanos.load(Ordering::Relaxed),
                                ),
                            }
                        })
                        .collect(),
                    bytes_read: s.bytes_read.load(Ordering::Relaxed),
                    read_stream_errors: s.read_stream_errors.load(Ordering::Relaxed),
                    bytes_written: s.bytes_written.load(Ordering::Relaxed),
                    stages_open: s.stages_open.load(Ordering::Relaxed),
                })
                .collect(),
        }
    }
}

/// Every engine's counts at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsSnapshot {
    /// One entry per wrapped engine (kind and tier).
    pub engines: Vec<EngineSnapshot>,
}

impl MetricsSnapshot {
    /// The counts of the engine of `kind` serving `tier`, if it was called.
    pub fn engine(&self, kind: &str, tier: Option<Tier>) -> Option<&EngineSnapshot> {
        self.engines
            .iter()
            .find(|e| e.engine == kind && e.tier == tier)
    }
}

/// One engine's counts.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSnapshot {
    /// The engine kind (`"sqlite"`, ...).
    pub engine: &'static str,
    /// The tier it serves, when known.
    pub tier: Option<Tier>,
    /// Per operation, in [`Op::ALL`] order (operations never called have
    /// zero counts).
    pub ops: Vec<OpSnapshot>,
    /// Bytes yielded by the readers this engine returned.
    pub bytes_read: u64,
    /// Reads whose stream failed after it was opened.
    pub read_stream_errors: u64,
    /// Bytes written into this engine's stages (successful writes).
    pub bytes_written: u64,
    /// Stages opened and not yet published, aborted or dropped.
    pub stages_open: i64,
}

impl EngineSnapshot {
    /// The counts of `op`.
    pub fn op(&self, op: Op) -> &OpSnapshot {
        &self.ops[op.index()]
    }
}

/// One operation's counts.
#[derive(Clone, Debug, PartialEq)]
pub struct OpSnapshot {
    /// The operation.
    pub op: Op,
    /// Calls completed (successes and errors).
    pub calls: u64,
    /// Errors by variant ([`error_variant`] names), only those seen.
    pub errors: Vec<(&'static str, u64)>,
    /// Calls per latency bucket (not cumulative): `LATENCY_BUCKETS[i]` is
    /// bucket `i`'s upper bound; the last bucket is `+Inf`.
    pub latency_buckets: Vec<u64>,
    /// The sum of all calls' latencies.
    pub latency_sum: Duration,
}

impl OpSnapshot {
    /// All errors, whatever their variant.
    pub fn error_total(&self) -> u64 {
        self.errors.iter().map(|(_, c)| c).sum()
    }

    /// The errors of one variant.
    pub fn errors_of(&self, variant: &str) -> u64 {
        self.errors
            .iter()
            .find(|(v, _)| *v == variant)
            .map_or(0, |(_, c)| *c)
    }
}

/// A per-engine series: name, type, help, value.
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&EngineSnapshot) -> i128,
);

/// Renders a snapshot in the Prometheus text exposition format (0.0.4):
/// `blobpool_engine_op_duration_seconds` (histogram),
/// `blobpool_engine_op_errors_total`, `blobpool_engine_read_bytes_total`,
/// `blobpool_engine_read_stream_errors_total`,
/// `blobpool_engine_written_bytes_total`, `blobpool_engine_stages_open`;
/// labelled `engine`, `tier` (`kv`, `large` or `unknown`) and `op`.
pub fn render_prometheus(snapshot: &MetricsSnapshot) -> String {
    let mut out = String::new();
    render_latencies(&mut out, snapshot);
    render_errors(&mut out, snapshot);
    render_counters(&mut out, snapshot);
    out
}

/// The `engine` and `tier` labels of `e`.
fn labels(e: &EngineSnapshot) -> String {
    format!(
        "engine=\"{}\",tier=\"{}\"",
        e.engine,
        e.tier.map_or("unknown".to_string(), |t| t.to_string())
    )
}

/// `blobpool_engine_op_duration_seconds`, per engine and operation called.
fn render_latencies(out: &mut String, snapshot: &MetricsSnapshot) {
    out.push_str("# HELP blobpool_engine_op_duration_seconds Engine operation latency.\n");
    out.push_str("# TYPE blobpool_engine_op_duration_seconds histogram\n");
    for e in &snapshot.engines {
        let l = labels(e);
        for o in e.ops.iter().filter(|o| o.calls > 0) {
            let mut cumulative = 0;
            for (i, count) in o.latency_buckets.iter().enumerate() {
                cumulative += count;
                let le = LATENCY_BUCKETS
                    .get(i)
                    .map_or("+Inf".to_string(), |b| b.to_string());
                let _ = writeln!(
                    out,
                    "blobpool_engine_op_duration_seconds_bucket{{{l},op=\"{}\",le=\"{le}\"}} {cumulative}",
                    o.op
                );
            }
            let _ = writeln!(
                out,
                "blobpool_engine_op_duration_seconds_sum{{{l},op=\"{}\"}} {}",
                o.op,
                o.latency_sum.as_secs_f64()
            );
            let _ = writeln!(
                out,
                "blobpool_engine_op_duration_seconds_count{{{l},op=\"{}\"}} {}",
                o.op, o.calls
            );
        }
    }
}

/// `blobpool_engine_op_errors_total`, per operation and error variant.
fn render_errors(out: &mut String, snapshot: &MetricsSnapshot) {
    out.push_str("# HELP blobpool_engine_op_errors_total Engine operation errors by variant.\n");
    out.push_str("# TYPE blobpool_engine_op_errors_total counter\n");
    for e in &snapshot.engines {
        let l = labels(e);
        for o in &e.ops {
            for (variant, count) in &o.errors {
                let _ = writeln!(
                    out,
                    "blobpool_engine_op_errors_total{{{l},op=\"{}\",error=\"{variant}\"}} {count}",
                    o.op
                );
            }
        }
    }
}

/// The byte counters and the open-stage gauge, per engine.
fn render_counters(out: &mut String, snapshot: &MetricsSnapshot) {
    let gauges: [Series; 4] = [
        (
            "blobpool_engine_read_bytes_total",
            "counter",
            "Bytes yielded by engine readers.",
            |e| e.bytes_read as i128,
        ),
        (
            "blobpool_engine_read_stream_errors_total",
            "counter",
            "Engine read streams that failed after opening.",
            |e| e.read_stream_errors as i128,
        ),
        (
            "blobpool_engine_written_bytes_total",
            "counter",
            "Bytes written into engine stages.",
            |e| e.bytes_written as i128,
        ),
        (
            "blobpool_engine_stages_open",
            "gauge",
            "Engine stages neither published, aborted nor dropped.",
            |e| e.stages_open as i128,
        ),
    ];
    for (name, kind, help, value) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for e in &snapshot.engines {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(e), value(e));
        }
    }
}

impl EngineLayer for MetricsLayer {
    fn around<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> Next<'a> {
        let stats = self.stats(call.engine, call.tier);
        Box::pin(async move {
            let start = Instant::now();
            let result = next.await;
            let op = &stats.ops[call.op.index()];
            op.record(start.elapsed(), result.as_ref().err());
            let reply = result?;
            Ok(match reply {
                Reply::Read(Some(mut r)) => {
                    r.reader = count_bytes(r.reader, &stats);
                    Reply::Read(Some(r))
                }
                Reply::Stage(s) => Reply::Stage(s.map(
                    |inner| Box::new(CountedStage::new(inner, &stats)),
                    |inner| Box::new(CountedStage::new(inner, &stats)),
                )),
                Reply::Done if call.op == Op::Write => {
                    stats.bytes_written.fetch_add(call.len, Ordering::Relaxed);
                    Reply::Done
                }
                other => other,
            })
        })
    }
}

struct CountBytes {
    stats: Arc<EngineStats>,
}

/// Counts the bytes a reader yields. A body already in memory, or owned
/// chunks (TUNING.md §multi-core-hashing, §response-chunks), is counted whole up front and
/// passed through unwrapped, so observing it never costs the engines'
/// zero-copy read paths (a byte count is all this layer needs).
fn count_bytes(r: BlobReader, stats: &Arc<EngineStats>) -> BlobReader {
    if !matches!(r, BlobReader::Stream { .. }) {
        stats.bytes_read.fetch_add(r.len(), Ordering::Relaxed);
        return r;
    }
    wrap_reader(
        r,
        CountBytes {
            stats: stats.clone(),
        },
    )
}

impl ReadHook for CountBytes {
    fn after(&mut self, _offset: u64, outcome: std::result::Result<usize, &std::io::Error>) {
        match outcome {
            Ok(n) => {
                self.stats.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(_) => {
                self.stats
                    .read_stream_errors
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Counts one open stage in `stages_open` until dropped.
struct OpenStage(Arc<EngineStats>);

impl Drop for OpenStage {
    fn drop(&mut self) {
        self.0.stages_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stage counted in `stages_open` until it publishes, aborts or drops.
struct CountedStage<S: ?Sized> {
    inner: Box<S>,
    open: OpenStage,
}

impl<S: ?Sized> CountedStage<S> {
    /// `inner`, counted open from now on.
    fn new(inner: Box<S>, stats: &Arc<EngineStats>) -> Self {
        stats.stages_open.fetch_add(1, Ordering::Relaxed);
        CountedStage {
            inner,
            open: OpenStage(stats.clone()),
        }
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: StagedWrite + ?Sized> StagedWrite for CountedStage<S> {
    async fn set_outboard(&mut self, outboard: Bytes) -> Result<()> {
        self.inner.set_outboard(outboard).await
    }

    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.inner.write(chunk).await
    }

    async fn publish(self: Box<Self>, key: &Key) -> Result<PublishOutcome> {
        let CountedStage { inner, open } = *self;
        let outcome = inner.publish(key).await;
        drop(open);
        outcome
    }

    async fn abort(self: Box<Self>) -> Result<()> {
        let CountedStage { inner, open } = *self;
        let done = inner.abort().await;
        drop(open);
        done
    }
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: JointStagedWrite + ?Sized> JointStagedWrite for CountedStage<S> {
    async fn publish_pinned(self: Box<Self>, key: &Key, pin: &PinIntent) -> Result<PublishOutcome> {
        let CountedStage { inner, open } = *self;
        let outcome = inner.publish_pinned(key, pin).await;
        drop(open);
        outcome
    }
}
