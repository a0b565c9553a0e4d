//! Blobpool's benchmark suite: the workloads, the machine's limits they are
//! compared with, the peers (`cacache`, iroh-blobs), and the timing loop.
//!
//! Three front ends share this library:
//!
//! - `cargo bench -p bench` (criterion, `benches/engines.rs` and
//!   `benches/limits.rs`): detailed per-engine figures;
//! - `cargo xtask bench [--quick] [--write]` runs the `bench-table` binary,
//!   which measures every figure *together with* its limits and its peer in
//!   interleaved rounds of the same process and prints one Markdown table of
//!   figures and ratios (see `docs/BENCHMARKS.md`);
//! - the `bench-mem` binary: peak memory of a 1 GiB put and get.
//!
//! On this kind of machine fsync-bound paths swing 8–13× with load (see
//! `shared/design/PERF-NOTES.md`), so only ratios measured in the same run
//! mean anything; absolute figures are context.

pub mod data;
pub mod fixtures;
pub mod httpload;
pub mod measure;
pub mod peer;
pub mod raw;
pub mod serve;
pub mod sweep;
pub mod sysinfo;
pub mod table;
pub mod tail;
pub mod workloads;
#[cfg(feature = "iroh")]
pub mod workset;
