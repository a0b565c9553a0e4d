//! `cargo xtask bench`: see docs/BENCHMARKS.md.

pub(crate) fn run(_args: &[String]) -> Result<(), String> {
    Err("the benchmark suite is not built yet".into())
}
