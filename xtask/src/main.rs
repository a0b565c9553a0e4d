//! Project automation, run as `cargo xtask <command>`:
//!
//! - `ci`: format check, clippy with `-D warnings`, then every test of the
//!   workspace (PostgreSQL tests included: they fail, never skip, without
//!   a server at `DATABASE_URL`).
//! - `bench [--quick]`: the benchmark suite and its ratio table.
//! - `arch`: the architecture invariants (who may depend on whom; the
//!   facade and the ops layer name no engine); `ci` runs it first.

use std::process::{Command, ExitCode};

mod arch;
mod bench;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("ci") => ci(),
        Some("bench") => bench::run(&args[1..]),
        Some("arch") => arch::check(),
        _ => {
            eprintln!("usage: cargo xtask ci | bench [--quick] | arch");
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

/// Runs `cargo` with `args`, failing on a non-zero exit.
pub(crate) fn cargo(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

fn ci() -> Result<(), String> {
    arch::check()?;
    cargo(&["fmt", "--all", "--", "--check"])?;
    cargo(&[
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ])?;
    cargo(&["test", "--workspace", "--all-features", "--no-fail-fast"])?;
    // The README's library example is an `examples/` program: run it.
    cargo(&["run", "-p", "blobpool", "--example", "quickstart"])?;
    Ok(())
}
