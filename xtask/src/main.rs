//! Project automation, run as `cargo xtask <command>`:
//!
//! - `ci`: `tidy`, the format check, clippy with `-D warnings`, the docs
//!   (rustdoc with `-D warnings`, private items included: the flows in
//!   module docs name items that must exist), every test of the workspace
//!   (PostgreSQL tests included: they fail, never skip, without a server at
//!   `DATABASE_URL`), the quickstart example, the Python client's tests
//!   (`pyclient`), `package` on the dev-profile binary, then `fuzz --smoke`.
//! - `package [--release]`: the Debian package and the container image,
//!   built and run; see `package.rs`.
//! - `pyclient`: the Python client's tests against the dev-profile
//!   `blobpool serve`; see `pyclient.rs`.
//! - `openapi`: docs/openapi.json validated, and Schemathesis against a
//!   live server; see `openapi.rs`.
//! - `tidy` (alias `arch`): the architecture invariants (who may depend on
//!   whom, the facade names no engine, no ignored tests, shared lints,
//!   ADR citations, the paths and code names the documents use); see
//!   `tidy.rs`.
//! - `fuzz --smoke | <target>... [--time S]`: the libFuzzer targets of
//!   `fuzz/`; see `fuzz.rs`.
//! - `soak`: the long runs CI bounds: the crash-model tests over many
//!   seeds, then every fuzz target for longer.
//! - `bench [--quick]`: the benchmark suite and its ratio table.
//! - `bench-skeptic [--quick] [--runs N] [--write]`: working-set reads,
//!   tail latency with a sweep and the HTTP anchor (issue 33, ADR-051).
//! - `bench-http [--quick] [--only CASE] [--json OUT]`: the HTTP anchor
//!   alone (wrk against Blobpool, nginx and a minimal hyper server;
//!   ADR-056).
//! - `bench-grpc [--quick]`: `FindMissingBlobs` against the library's
//!   `has_many`, and a 64 MiB ByteStream `Read` against an HTTP GET of the
//!   same entry, against one `blobpool serve` (issue 42, ADR-071).
//! - `bench-cache [--quick]`: the build-cache benchmarks (issue 31): a
//!   ccache rebuild through `blobpool serve` against a local-directory
//!   ccache, and HTTP GET/PUT against nginx (`bench/cache/run.sh`).
//! - `bench-bazel [--quick]`: Bazel 2.1.0's all-remote-hits rebuild
//!   through Blobpool over HTTP and gRPC against its local `--disk_cache`
//!   (issue 42, ADR-072; `bench/cache/bazel.sh`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod bench;
mod fuzz;
mod openapi;
mod package;
mod pyclient;
mod tidy;

const USAGE: &str = "usage: cargo xtask ci | tidy | arch | fuzz --smoke | fuzz <target>... [--time S] | package [--release] | openapi | pyclient | soak [--time S] | bench [--quick] [--runs N] | bench-cache [--quick] | bench-bazel [--quick] | bench-skeptic [--quick] [--runs N] [--write] | bench-http [--quick] [--only CASE] [--json OUT] | bench-grpc [--quick]";

/// `bench/cache/<script>` with the given arguments (`--quick`).
fn bench_cache(script: &str, args: &[String]) -> Result<(), String> {
    let script = workspace_root().join("bench").join("cache").join(script);
    let status = Command::new("bash")
        .arg(&script)
        .args(args)
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", script.display()))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some("bench-cache") => bench_cache("run.sh", &args[1..]),
        Some("bench-bazel") => bench_cache("bazel.sh", &args[1..]),
        Some("bench-skeptic") => bench::skeptic(&args[1..]),
        Some("bench-http") => bench::http(&args[1..]),
        Some("bench-grpc") => bench::grpc(&args[1..]),
        Some("tidy" | "arch") => tidy::check(),
        Some("fuzz") => fuzz::run(&args[1..]),
        Some("soak") => soak(&args[1..]),
        Some("package") => package::run(&args[1..]),
        Some("openapi") => openapi::run(),
        Some("pyclient") => pyclient::run(),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask's parent directory).
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// Runs `cargo` with `args`, failing on a non-zero exit.
pub(crate) fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_with(args, &[])
}

/// [`cargo`] with extra environment variables.
fn cargo_with(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let shown: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("$ {}cargo {}", shown.concat(), args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

fn ci() -> Result<(), String> {
    tidy::check()?;
    cargo(&["fmt", "--all", "--", "--check"])?;
    // The fuzz crate is its own workspace: `--all` does not reach it.
    let fuzz_manifest = workspace_root().join("fuzz").join("Cargo.toml");
    let fuzz_manifest = fuzz_manifest.to_string_lossy();
    cargo(&["fmt", "--manifest-path", &fuzz_manifest, "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    // After clippy, whose dependency metadata rustdoc reuses: it then
    // documents the workspace crates alone (about a minute on 2 cores).
    cargo_with(
        &[
            "doc",
            "--workspace",
            "--no-deps",
            "--all-features",
            "--document-private-items",
        ],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    let tests = cargo_test(&["test", "--workspace", "--all-features", "--no-fail-fast"])?;
    // The README's library example is an `examples/` program: run it.
    cargo(&["run", "-p", "blobpool", "--example", "quickstart"])?;
    // The Python client against the binary the tests built (ADR-068).
    pyclient::run()?;
    // The .deb and the image from the binary the tests built (ADR-065).
    package::run(&[])?;
    // The API description, validated and fuzzed against a live server (ADR-066).
    openapi::run()?;
    fuzz::run(&["--smoke".to_string()])?;
    // Last, so that the end of the log says what ran.
    eprintln!("xtask: ci passed; `cargo test` ran {tests}");
    Ok(())
}

/// What `cargo test` reported: the sum of its `test result:` lines.
#[derive(Debug, Default, PartialEq)]
struct Tally {
    binaries: u64,
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Tally {
    /// Adds one line of `cargo test`'s output, if it is a `test result:`.
    fn add(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        self.binaries += 1;
        for part in rest.split([';', '.']) {
            let mut words = part.split_whitespace();
            let (Some(n), Some(what)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} test binaries: {} passed, {} failed, {} ignored",
            self.binaries, self.passed, self.failed, self.ignored
        )
    }
}

/// `cargo test ...`, its output passed through and tallied. A run that
/// reports no passing test fails: a test suite that did not run is not
/// a pass.
fn cargo_test(args: &[&str]) -> Result<Tally, String> {
    use std::io::BufRead;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("$ cargo {}", args.join(" "));
    let mut child = Command::new(&cargo)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    let mut tally = Tally::default();
    let out = child.stdout.take().expect("stdout is piped");
    for line in std::io::BufReader::new(out).lines() {
        let line = line.map_err(|e| format!("reading cargo's output: {e}"))?;
        println!("{line}");
        tally.add(&line);
    }
    let status = child.wait().map_err(|e| format!("cargo: {e}"))?;
    eprintln!("xtask: `cargo test` ran {tally}");
    if !status.success() {
        return Err(format!(
            "`cargo {}` failed ({status}); it ran {tally}",
            args.join(" ")
        ));
    }
    if tally.passed == 0 {
        return Err(format!("`cargo {}` ran no test", args.join(" ")));
    }
    Ok(tally)
}

/// Seeds per crash-model test in a soak (CI runs a bounded number).
const SOAK_CRASH_SEEDS: &str = "200";
/// Seconds per fuzz target in a soak.
const SOAK_FUZZ_SECONDS: &str = "300";

/// `cargo xtask soak [--time S]`: the crash-model suites (`tests/crash.rs`
/// of store-local, store-sqlite and the facade in tests-contract) with
/// `BLOBPOOL_CRASH_SEEDS=200` (or the value already in the environment;
/// SQLite's suite is the long one, about 35 s a seed on a busy 2-core
/// machine), then every fuzz target for `S` seconds (default 300).
fn soak(args: &[String]) -> Result<(), String> {
    let seconds = match args {
        [] => SOAK_FUZZ_SECONDS.to_string(),
        [flag, s] if flag == "--time" && s.parse::<u64>().is_ok() => s.clone(),
        _ => return Err("usage: cargo xtask soak [--time SECONDS]".into()),
    };
    cargo_with(
        &[
            "test",
            "-p",
            "store-local",
            "-p",
            "store-sqlite",
            "-p",
            "tests-contract",
            "--all-features",
            // The crash-model suites (each package's tests/crash.rs): a
            // name filter would miss the cases whose names lack "crash".
            "--test",
            "crash",
        ],
        &[(
            "BLOBPOOL_CRASH_SEEDS",
            &std::env::var("BLOBPOOL_CRASH_SEEDS").unwrap_or_else(|_| SOAK_CRASH_SEEDS.into()),
        )],
    )?;
    fuzz::run(&["--all".to_string(), "--time".to_string(), seconds])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tally_sums_the_test_result_lines() {
        let mut t = Tally::default();
        for line in [
            "running 3 tests",
            "test a ... ok",
            "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.50s",
            "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s",
        ] {
            t.add(line);
        }
        assert_eq!(
            t,
            Tally {
                binaries: 3,
                passed: 5,
                failed: 1,
                ignored: 1
            }
        );
        assert_eq!(
            t.to_string(),
            "3 test binaries: 5 passed, 1 failed, 1 ignored"
        );
    }
}
