//! Where the SQLite databases of this process waited, for `/metrics`
//! (ADR-058, ADR-073): store-sqlite's histograms in store-ops' terms.

use store_ops::{DatabaseWaits, EngineHistogram};

/// The waits of every SQLite database this process has open
/// (`store_sqlite::open_databases`: the kv engine of a default store).
pub(super) fn sqlite() -> Vec<DatabaseWaits> {
    store_sqlite::open_databases()
        .into_iter()
        .map(|d| {
            let h = &d.histograms;
            DatabaseWaits {
                database: d.path.display().to_string(),
                write_queued: histogram(&h.write_queued),
                write_behind_bulk: histogram(&h.write_behind_bulk),
                write_transaction: histogram(&h.write_transaction),
                write_commit: histogram(&h.write_commit),
                bulk_transaction: histogram(&h.bulk_transaction),
                read_connection: histogram(&h.read_connection),
                point_read: histogram(&h.point_read),
                slow_writes: d.slow_writes,
                reads_inline: d.read_path.inline,
                reads_waited: d.read_path.pooled,
                point_read_fallbacks: d.read_path.fell_back,
            }
        })
        .collect()
}

fn histogram(h: &store_sqlite::WaitHistogram) -> EngineHistogram {
    EngineHistogram {
        bounds: (store_sqlite::WAIT_BUCKETS_US.iter())
            .map(|us| *us as f64 / 1e6)
            .collect(),
        counts: h.counts.to_vec(),
        sum: h.sum_us as f64 / 1e6,
    }
}
