//! `cargo xtask pyclient`: the Python client's tests (`clients/python`,
//! issue 43 item 5, ADR-068), pytest against the real `blobpool serve`.
//!
//! Builds the dev-profile `blobpool` binary (a no-op after the test step of
//! `ci`, which built it), then runs `python3 -m pytest` in `clients/python`
//! with `BLOBPOOL_BIN` naming the binary; the tests' fixture starts it on a
//! free loopback port with a temporary data directory and keys. The test
//! dependencies (`clients/python`'s `test` extra) must be installed:
//! `.ci/run` installs them when missing. `PYTHON` overrides `python3`.

use std::process::Command;

use crate::{cargo, workspace_root};

/// Runs `cargo xtask pyclient`.
pub(crate) fn run() -> Result<(), String> {
    cargo(&["build", "--locked", "-p", "blobpool"])?;
    let root = workspace_root();
    let binary = root.join("target").join("debug").join("blobpool");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let dir = root.join("clients").join("python");
    eprintln!("$ (cd {}; {python} -m pytest -q)", dir.display());
    let status = Command::new(&python)
        // No .pytest_cache nor __pycache__ left in the source tree.
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("BLOBPOOL_BIN", &binary)
        .current_dir(&dir)
        .status()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "the Python client's tests failed ({status}); their dependencies: \
             {python} -m pip install -e 'clients/python[test]'"
        ))
    }
}
