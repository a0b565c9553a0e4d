//! The OpenAPI step of `cargo xtask ci` (ADR-066): `openapi-spec-validator`
//! on docs/openapi.json, then Schemathesis against a live `blobpool serve`
//! (the dev binary the tests built) with a key of every scope, reading the
//! description from the server's own `/openapi.json`. Checks: no 5xx, every
//! status, content type and JSON body as described. A tool that cannot run
//! fails the step (`.ci/run` installs both with pip).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::{cargo, workspace_root};

/// Schemathesis' configuration. Opening upload sessions that nobody
/// finishes reaches the per-identity cap, answered `503 too_many_uploads`
/// with `Retry-After` by design (docs/SERVER.md): that 503 is expected.
const CONFIG: &str = r#"
[[operations]]
include-path = "/v1/uploads/{ns}"
include-method = "POST"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503"]
"#;

/// Test cases per operation and phase (about a minute on 2 cores).
const MAX_EXAMPLES: &str = "100";

/// Runs the step.
pub(crate) fn run() -> Result<(), String> {
    let root = workspace_root();
    let spec = root.join("docs").join("openapi.json");
    python(
        &workspace_root(),
        &["-m", "openapi_spec_validator", &spec.to_string_lossy()],
    )?;
    cargo(&["build", "--locked", "-p", "blobpool"])?;
    let dir = std::env::temp_dir().join(format!("blobpool-openapi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = fuzz(&root.join("target").join("debug").join("blobpool"), &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// Schemathesis against `blobpool serve` in `dir`.
fn fuzz(binary: &Path, dir: &Path) -> Result<(), String> {
    let out = Command::new(binary)
        .args(["key", "new", "--name", "fuzz"])
        .args(["--scope", "read", "--scope", "write"])
        .args(["--scope", "delete", "--scope", "admin"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let minted = String::from_utf8_lossy(&out.stdout);
    let key = minted
        .lines()
        .find_map(|l| l.strip_prefix("key: "))
        .ok_or_else(|| format!("blobpool key new printed no key: {minted}"))?;
    let snippet = &minted[minted.find("[[auth.keys]]").ok_or("no [[auth.keys]]")?..];
    let config = format!("data_dir = \"data\"\nlisten = \"127.0.0.1:0\"\n{snippet}");
    write(&dir.join("blobpool.toml"), &config)?;
    write(&dir.join("schemathesis.toml"), CONFIG)?;
    let mut server = Server(
        Command::new(binary)
            .args(["serve", "--config", "blobpool.toml"])
            .current_dir(dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run blobpool serve: {e}"))?,
    );
    let addr = server.address()?;
    let started = std::time::Instant::now();
    let auth = format!("Authorization: Bearer {key}");
    let schemathesis =
        "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())";
    // In the scratch directory: Schemathesis keeps its cache in
    // ./.schemathesis, which must not land in the source tree.
    python(dir, &[
        "-c",
        schemathesis,
        "--config-file",
        &dir.join("schemathesis.toml").to_string_lossy(),
        "run",
        &format!("http://{addr}/openapi.json"),
        "--header",
        &auth,
        "--checks",
        "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        "--max-examples",
        MAX_EXAMPLES,
        "--workers",
        "2",
        "--no-color",
    ])?;
    eprintln!("openapi: Schemathesis passed in {:.0?}", started.elapsed());
    server.still_running()
}

/// `blobpool serve`, killed when dropped.
struct Server(Child);

impl Server {
    /// The address from the `listening on http://ADDR` line; the rest of
    /// stderr goes on to ours.
    fn address(&mut self) -> Result<String, String> {
        let stderr = self.0.stderr.take().ok_or("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        for line in lines.by_ref() {
            let line = line.map_err(|e| format!("reading blobpool serve: {e}"))?;
            eprintln!("{line}");
            if let Some(addr) = line.strip_prefix("blobpool: listening on http://") {
                let addr = addr.trim().to_string();
                std::thread::spawn(move || {
                    lines.map_while(Result::ok).for_each(|l| eprintln!("{l}"))
                });
                return Ok(addr);
            }
        }
        Err("blobpool serve exited before listening".into())
    }

    /// Fails when the server died under the fuzzer.
    fn still_running(&mut self) -> Result<(), String> {
        match self.0.try_wait() {
            Ok(None) => Ok(()),
            other => Err(format!("blobpool serve died under Schemathesis: {other:?}")),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// `python3 ARGS` in `cwd`, failing on a non-zero exit or when it cannot run.
fn python(cwd: &Path, args: &[&str]) -> Result<(), String> {
    eprintln!("$ python3 {}", args.join(" "));
    let status = Command::new("python3")
        .args(args)
        .current_dir(cwd)
        .status()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "`python3 {}` failed ({status})",
            args[..2].join(" ")
        ))
    }
}
