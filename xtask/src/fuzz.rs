//! `cargo xtask fuzz`: builds and runs the libFuzzer targets of `fuzz/`.
//!
//! - `cargo xtask fuzz --smoke`: every target for 10 s (CI; `--time S`
//!   changes it);
//! - `cargo xtask fuzz <target>... [--time S]`: the named targets, 300 s
//!   each by default; `--all` runs every target;
//! - `cargo xtask fuzz --list`: the target names.
//!
//! Each run starts from the committed seed corpus `fuzz/corpus/<target>/`
//! (read only) and keeps what it finds in `fuzz/target/corpus/<target>/`
//! (not committed, reused by the next run). A crash stops the run, leaves
//! its input in `fuzz/artifacts/<target>/` and prints how to reproduce it;
//! a crash becomes a regression test in the owning crate's tests.
//!
//! # Why not `cargo fuzz`
//!
//! CI has stable Rust only. `cargo fuzz` would have to be installed
//! (`cargo install cargo-fuzz`: a minute or two of compiling on every
//! clean machine, and a tool version to keep in step), and its defaults
//! (`-Zsanitizer=address`, `-Zbuild-std` when asked) need nightly or
//! `RUSTC_BOOTSTRAP=1`. What it does for `--sanitizer none` is small and
//! stable: build the fuzz crate in release for the host target with
//! SanitizerCoverage passes ([`SANCOV_FLAGS`], all stable `-C` options)
//! and `--cfg fuzzing`, then run the binaries, which link libFuzzer
//! through `libfuzzer-sys`. So this command does exactly that, with
//! nothing to install. The explicit `--target` keeps the flags off build
//! scripts and proc macros (they would not link against the coverage
//! callbacks). The crate stays laid out for cargo-fuzz, so on nightly
//! `cargo fuzz run <target>` works as well (with AddressSanitizer).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The RUSTFLAGS cargo-fuzz passes for `--sanitizer none`.
pub const SANCOV_FLAGS: &str = "-Cpasses=sancov-module \
    -Cllvm-args=-sanitizer-coverage-level=4 \
    -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
    -Cllvm-args=-sanitizer-coverage-pc-table \
    -Cllvm-args=-sanitizer-coverage-trace-compares \
    --cfg fuzzing";

/// Seconds per target of `--smoke`.
const SMOKE_SECONDS: u64 = 10;
/// Seconds per target of a named run.
const RUN_SECONDS: u64 = 300;

fn fuzz_dir() -> PathBuf {
    crate::workspace_root().join("fuzz")
}

/// The targets: the files of `fuzz/fuzz_targets/`, by name.
pub fn targets(fuzz: &Path) -> Result<Vec<String>, String> {
    let dir = fuzz.join("fuzz_targets");
    let mut out: Vec<String> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            (p.extension()? == "rs").then(|| p.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    out.sort();
    Ok(out)
}

fn host_triple() -> Result<String, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("cannot run {rustc}: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or_else(|| "`rustc -vV` names no host".to_string())
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
struct Plan {
    targets: Vec<String>,
    seconds: u64,
}

fn plan(args: &[String], all: &[String]) -> Result<Option<Plan>, String> {
    let usage = "usage: cargo xtask fuzz --smoke | --all | --list | <target>... [--time SECONDS]";
    let mut targets = Vec::new();
    let mut seconds = None;
    let mut smoke = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--smoke" => smoke = true,
            "--all" => targets.extend(all.iter().cloned()),
            "--list" => return Ok(None),
            "--time" => {
                let s = it.next().ok_or(usage)?;
                seconds = Some(s.parse().map_err(|_| format!("--time {s:?}: {usage}"))?);
            }
            t if all.iter().any(|x| x == t) => targets.push(t.to_string()),
            other => {
                return Err(format!(
                    "unknown fuzz target or flag {other:?}; {usage}; targets: {}",
                    all.join(", ")
                ))
            }
        }
    }
    if smoke && targets.is_empty() {
        targets.extend(all.iter().cloned());
    }
    if targets.is_empty() {
        return Err(usage.to_string());
    }
    targets.dedup();
    let seconds = seconds.unwrap_or(if smoke { SMOKE_SECONDS } else { RUN_SECONDS });
    Ok(Some(Plan { targets, seconds }))
}

/// Builds the instrumented targets once, returning their directory.
fn build(fuzz: &Path) -> Result<PathBuf, String> {
    let host = host_triple()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // Not `--locked`: a merge that adds a dependency to a crate under test
    // must not break the fuzz build (commit the updated fuzz/Cargo.lock).
    let args = ["build", "--release", "--bins", "--target", host.as_str()];
    eprintln!(
        "$ (cd fuzz && RUSTFLAGS=\"{SANCOV_FLAGS}\" cargo {})",
        args.join(" ")
    );
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(fuzz)
        .env("RUSTFLAGS", SANCOV_FLAGS)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("building the fuzz targets failed ({status})"));
    }
    Ok(fuzz.join("target").join(host).join("release"))
}

/// Runs one target for `seconds`.
fn run_one(fuzz: &Path, bin_dir: &Path, target: &str, seconds: u64) -> Result<(), String> {
    let seeds = fuzz.join("corpus").join(target);
    let work = fuzz.join("target").join("corpus").join(target);
    let artifacts = fuzz.join("artifacts").join(target);
    for d in [&work, &artifacts] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let exe = bin_dir.join(target);
    let mut args = vec![
        work.display().to_string(),
        format!("-max_total_time={seconds}"),
        // A slow input is a bug too (a pipeline stuck on a reader).
        "-timeout=30".to_string(),
        "-rss_limit_mb=2048".to_string(),
        format!("-artifact_prefix={}/", artifacts.display()),
        "-print_final_stats=1".to_string(),
    ];
    if seeds.is_dir() {
        args.insert(1, seeds.display().to_string());
    }
    // libFuzzer's progress lines go to a log: a CI log that ends in
    // thousands of them hides what ran before.
    let log_path = fuzz.join("target").join(format!("{target}.log"));
    let log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    eprintln!(
        "$ {} {} 2>{}",
        exe.display(),
        args.join(" "),
        log_path.display()
    );
    let status = Command::new(&exe)
        .args(&args)
        .stderr(log)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let stats: Vec<&str> = log.lines().filter(|l| l.starts_with("stat::")).collect();
    if status.success() {
        eprintln!("xtask: fuzz {target}: {}", stats.join(", "));
        Ok(())
    } else {
        let lines: Vec<&str> = log.lines().collect();
        eprintln!("{}", lines[lines.len().saturating_sub(80)..].join("\n"));
        Err(format!(
            "fuzz target {target} failed ({status}); its log is {}, its input is in {}; \
             reproduce with `{} <that file>`",
            log_path.display(),
            artifacts.display(),
            exe.display()
        ))
    }
}

/// `cargo xtask fuzz ...`.
pub fn run(args: &[String]) -> Result<(), String> {
    let fuzz = fuzz_dir();
    let all = targets(&fuzz)?;
    let Some(plan) = plan(args, &all)? else {
        println!("{}", all.join("\n"));
        return Ok(());
    };
    let started = std::time::Instant::now();
    let bins = build(&fuzz)?;
    let built = started.elapsed();
    for t in &plan.targets {
        run_one(&fuzz, &bins, t, plan.seconds)?;
    }
    eprintln!(
        "xtask: fuzzed {} target(s) for {} s each; build {:.0?}, total {:.0?}",
        plan.targets.len(),
        plan.seconds,
        built,
        started.elapsed()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_targets_are_the_fuzz_target_files() {
        let all = targets(&fuzz_dir()).unwrap();
        assert_eq!(
            all,
            strings(&[
                "auth_header",
                "cache_keys",
                "config",
                "config_env",
                "gc",
                "names",
                "payloads",
                "put",
                "range",
                "webdav"
            ])
        );
    }

    #[test]
    fn the_command_line_picks_targets_and_time() {
        let all = strings(&["a", "b"]);
        let p = |v: &[&str]| plan(&strings(v), &all);
        assert_eq!(
            p(&["--smoke"]).unwrap(),
            Some(Plan {
                targets: all.clone(),
                seconds: SMOKE_SECONDS
            })
        );
        assert_eq!(
            p(&["b", "--time", "7"]).unwrap(),
            Some(Plan {
                targets: strings(&["b"]),
                seconds: 7
            })
        );
        assert_eq!(
            p(&["--all"]).unwrap(),
            Some(Plan {
                targets: all.clone(),
                seconds: RUN_SECONDS
            })
        );
        assert_eq!(p(&["--list"]).unwrap(), None);
        assert!(p(&["c"]).unwrap_err().contains("unknown fuzz target"));
        assert!(p(&[]).is_err());
        assert!(p(&["a", "--time", "x"]).is_err());
    }

    #[test]
    fn every_target_has_a_seed_corpus() {
        let fuzz = fuzz_dir();
        for t in targets(&fuzz).unwrap() {
            let seeds = fuzz.join("corpus").join(&t);
            let n = std::fs::read_dir(&seeds).map(|d| d.count()).unwrap_or(0);
            assert!(n > 0, "{} is empty", seeds.display());
        }
    }
}
