//! `cargo xtask bench [--quick] [--write] [--only a,b]`: builds the `bench`
//! crate's binaries in release mode and runs `bench-table`, which measures
//! the suite — every figure together with the machine's limits and the
//! `cacache` peer, interleaved in the same run — and prints one Markdown
//! table. `--write` also writes `docs/BENCHMARKS.md`. See that file.
//!
//! `--quick` keeps the run to a few minutes; the full run takes longer.
//! Detailed criterion figures: `cargo bench -p bench`.

use std::path::PathBuf;

use crate::workspace_root;
use std::process::Command;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut pass: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => pass.push(a.clone()),
            "--write" => {
                pass.push(a.clone());
                pass.push(
                    workspace_root()
                        .join("docs")
                        .join("BENCHMARKS.md")
                        .display()
                        .to_string(),
                );
            }
            "--runs" => {
                let n = it.next().ok_or("--runs needs a count")?;
                pass.push(a.clone());
                pass.push(n.clone());
            }
            "--only" => {
                let list = it.next().ok_or("--only needs a comma-separated list")?;
                pass.push(a.clone());
                pass.push(list.clone());
            }
            other => {
                return Err(format!(
                    "unknown bench argument {other:?}; usage: cargo xtask bench [--quick] [--runs N] [--write] [--only mem,local,sqlite,composite,postgres,pglo,sweep,cross,memory]"
                ))
            }
        }
    }
    crate::cargo(&["build", "--release", "-p", "bench", "--bins"])?;
    run_release_bin("bench-table", &pass)
}

/// Runs `target/release/NAME ARGS` from the workspace root.
fn run_release_bin(name: &str, args: &[String]) -> Result<(), String> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let exe = target.join("release").join(name);
    eprintln!("$ {} {}", exe.display(), args.join(" "));
    let status = Command::new(&exe)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{name} failed ({status})"))
    }
}

/// `cargo xtask bench-http [ARGS]`: builds `blobpool` and the bench
/// binaries and runs `bench-http ARGS` (the HTTP anchor against nginx and
/// a minimal hyper server, wrk pinned apart from the servers; needs
/// Debian's `wrk` and `nginx`; ADR-056).
pub(crate) fn http(args: &[String]) -> Result<(), String> {
    crate::cargo(&["build", "--release", "-p", "bench", "--bins"])?;
    crate::cargo(&["build", "--release", "-p", "blobpool"])?;
    run_release_bin("bench-http", args)
}

/// `cargo xtask bench-grpc [--quick]`: builds `blobpool` and the bench
/// binaries and runs `bench-grpc ARGS` (issue 42, ADR-071): against one
/// `blobpool serve`, `FindMissingBlobs` of 10,000 digests against the
/// library's `has_many`, and a 64 MiB ByteStream `Read` against an HTTP
/// GET of the same entry, in alternating rounds.
pub(crate) fn grpc(args: &[String]) -> Result<(), String> {
    crate::cargo(&["build", "--release", "-p", "bench", "--bins"])?;
    crate::cargo(&["build", "--release", "-p", "blobpool"])?;
    run_release_bin("bench-grpc", args)
}

/// `cargo xtask bench-skeptic [ARGS]`: builds the bench binaries and runs
/// `bench-skeptic all ARGS` (issue 33: working-set reads, tail latency
/// with a sweep, the HTTP anchor; three runs each by default). See
/// `bench/src/bin/bench_skeptic.rs` for the arguments and ADR-051.
pub(crate) fn skeptic(args: &[String]) -> Result<(), String> {
    crate::cargo(&["build", "--release", "-p", "bench", "--bins"])?;
    crate::cargo(&["build", "--release", "-p", "blobpool"])?;
    let mut pass = vec!["all".to_string()];
    pass.extend(args.iter().cloned());
    run_release_bin("bench-skeptic", &pass)
}
