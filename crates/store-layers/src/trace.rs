//! The tracing layer: one span per engine operation, closed by one event
//! with the result and duration (debug), or the error (warn).

use std::time::Instant;

use tracing::field::Empty;
use tracing::Instrument;

use crate::layer::{Call, EngineLayer, Next, Reply};
use crate::metrics::error_variant;

/// Emits, per operation, a `debug` span `engine_op` with fields `op`,
/// `engine`, `tier`, `ns`, `digest` (when the call addresses one), `count`
/// (digests of a batch), `offset`/`len` (writes and ranged reads), and
/// `result`/`elapsed_us` recorded when the call completes (shown by a
/// subscriber that logs span closes); inside it one event: `debug` with `result` and `elapsed_us` on
/// success, `warn` with the error, its variant and `elapsed_us` on
/// failure. Absent keys are answers, not errors (they log at debug).
///
/// Spans are created only when a subscriber wants them at their level, so
/// an unobserved layer costs a level check per call.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceLayer {
    _private: (),
}

impl TraceLayer {
    /// The tracing layer.
    pub fn new() -> Self {
        Self::default()
    }
}

fn describe(reply: &Reply) -> String {
    match reply {
        Reply::Meta(m) => match m {
            Some(m) => format!("size {}", m.size),
            None => "absent".into(),
        },
        Reply::Presence(v) => format!(
            "{} of {} present",
            v.iter().filter(|p| **p).count(),
            v.len()
        ),
        Reply::Read(r) => match r {
            Some(r) => format!(
                "entry of {} bytes, reader of {} bytes",
                r.size,
                r.reader.len()
            ),
            None => "absent".into(),
        },
        Reply::Freed(v) => format!(
            "{} of {} deleted",
            v.iter().filter(|f| f.is_some()).count(),
            v.len()
        ),
        Reply::Namespaces(v) => format!("{} namespaces", v.len()),
        Reply::Scan(v) => format!("{} entries", v.len()),
        Reply::Maintained(n) => format!("{n} removed"),
        Reply::Lock(l) => if l.is_some() { "locked" } else { "no lock" }.into(),
        Reply::Published(o) => format!("{o:?}"),
        Reply::Stage(_) => "stage opened".into(),
        Reply::Done => "ok".into(),
    }
}

impl EngineLayer for TraceLayer {
    fn around<'a>(&'a self, call: Call<'a>, next: Next<'a>) -> Next<'a> {
        let span = tracing::debug_span!(
            "engine_op",
            op = call.op.name(),
            engine = call.engine,
            tier = Empty,
            ns = Empty,
            digest = Empty,
            count = Empty,
            offset = Empty,
            len = Empty,
            result = Empty,
            elapsed_us = Empty,
        );
        if !span.is_disabled() {
            if let Some(t) = call.tier {
                span.record("tier", tracing::field::display(t));
            }
            if let Some(ns) = call.ns {
                span.record("ns", tracing::field::display(ns));
            }
            if let Some(d) = call.digest {
                span.record("digest", tracing::field::display(d));
            }
            if !call.digests.is_empty() {
                span.record("count", call.digests.len());
            }
            if call.offset != 0 || call.len != 0 {
                span.record("offset", call.offset);
                span.record("len", call.len);
            }
        }
        let recorder = span.clone();
        Box::pin(
            async move {
                let start = Instant::now();
                let result = next.await;
                let elapsed_us = start.elapsed().as_micros() as u64;
                if !recorder.is_disabled() {
                    recorder.record("elapsed_us", elapsed_us);
                    match &result {
                        Ok(reply) => recorder.record("result", describe(reply).as_str()),
                        Err(e) => recorder.record("result", error_variant(e)),
                    };
                }
                match &result {
                    Ok(reply) => {
                        if tracing::enabled!(tracing::Level::DEBUG) {
                            tracing::debug!(result = %describe(reply), elapsed_us, "engine op done");
                        }
                    }
                    Err(e) => tracing::warn!(
                        error = %store_types::Report::new(e),
                        variant = error_variant(e),
                        elapsed_us,
                        "engine op failed"
                    ),
                }
                result
            }
            .instrument(span),
        )
    }
}
