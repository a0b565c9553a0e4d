//! The `blobpool` binary: direct mode, server mode (against an in-process
//! server and against `blobpool serve`), errors and exit codes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_blobpool");

/// A command in `dir` with a clean environment: no inherited BLOBPOOL_*.
fn cmd(dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("BLOBPOOL_") {
            c.env_remove(k);
        }
    }
    c.stdin(Stdio::null());
    c
}

fn run(c: &mut Command) -> Output {
    c.output().expect("the binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        stderr(&o)
    );
    stdout(&o)
}

/// A failed command: exit 1 and exactly one stderr line naming `code`.
fn fails_with(o: Output, code: &str) {
    assert_eq!(o.status.code(), Some(1), "stdout: {}", stdout(&o));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err:?}");
    assert!(
        lines[0].starts_with(&format!("blobpool: {code}: ")),
        "{err:?}"
    );
}

fn write_file(dir: &Path, name: &str, len: u64, seed: u64) -> Vec<u8> {
    let data = bytes_of(len, seed);
    std::fs::write(dir.join(name), &data).unwrap();
    data
}

#[test]
fn direct_mode_put_get_round_trips_byte_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, len) in [("empty", 0u64), ("small", 100), ("big", 3 << 20)] {
        let data = write_file(d, name, len, len + 3);
        let digest = ok(run(cmd(d).args(["put", name])));
        assert_eq!(digest, blake3::hash(&data).to_hex().as_str());
        let out = format!("{name}.out");
        ok(run(cmd(d).args(["get", &digest, "-o", &out])));
        assert_eq!(std::fs::read(d.join(&out)).unwrap(), data, "{name}");
        // To stdout as well.
        let o = run(cmd(d).args(["get", &digest]));
        assert!(o.status.success());
        assert_eq!(o.stdout, data);
    }
    // The embedded default lives under ./blobpool-data.
    assert!(d.join("blobpool-data/kv.sqlite").is_file());
    assert!(d.join("blobpool-data/large").is_dir());
    // stat / has / --json.
    let data = write_file(d, "j", 5000, 1);
    let digest = blake3::hash(&data).to_hex().to_string();
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(cmd(d).args(["put", "j", "--json", "-n", "docs"])))).unwrap();
    assert_eq!(v["digest"], digest.as_str());
    assert_eq!(v["namespace"], "docs");
    assert_eq!(v["size"], 5000);
    assert_eq!(v["tier"], "kv");
    let v: serde_json::Value = serde_json::from_str(&ok(run(
        cmd(d).args(["stat", &digest, "-n", "docs", "--json"])
    )))
    .unwrap();
    assert_eq!(v["size"], 5000);
    let absent = blake3::hash(b"absent").to_hex().to_string();
    let text = ok(run(cmd(d).args(["has", &digest, &absent, "-n", "docs"])));
    assert_eq!(text, format!("{digest}\tpresent\n{absent}\tabsent"));
    fails_with(run(cmd(d).args(["stat", &digest])), "missing"); // other namespace
    ok(run(cmd(d).args(["rm", &digest, "-n", "docs"])));
    fails_with(run(cmd(d).args(["rm", &digest, "-n", "docs"])), "missing");
    // A sweep with no sources reports the abort.
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(cmd(d).args(["sweep", "--json"])))).unwrap();
    assert_eq!(v["aborted"], "no_liveness_sources");
}

#[test]
fn direct_mode_reads_config_file_and_environment() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("blobpool.toml"),
        "kv = \"sqlite://./pool/kv.db\"\nlarge = \"file://./pool/files\"\nthreshold = 100\nwindow = 0\n[gc]\nunreferenced_namespaces = [\"tmp\"]\n",
    )
    .unwrap();
    write_file(d, "f", 1000, 4);
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(cmd(d).args(["put", "f", "-n", "tmp", "--json"])))).unwrap();
    assert_eq!(v["tier"], "large");
    assert!(d.join("pool/kv.db").is_file());
    // The pin ended with the put's process: sweeps stage, then delete.
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(cmd(d).args(["sweep", "--json"])))).unwrap();
    assert_eq!(v["total"]["staged"], 1);
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(cmd(d).args(["sweep", "--json"])))).unwrap();
    assert_eq!(v["total"]["deleted"], 1);
    // The environment overrides the file.
    let o = run(cmd(d)
        .env("BLOBPOOL_KV", "mem://")
        .env("BLOBPOOL_LARGE", "none")
        .env("BLOBPOOL_GC_UNREFERENCED_NAMESPACES", "")
        .args(["put", "f", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&ok(o)).unwrap();
    assert_eq!(v["tier"], "kv");
    // Bad configuration: exit 1, one line.
    let o = run(cmd(d)
        .env("BLOBPOOL_MODE", "turbo")
        .args(["has", &"0".repeat(64)]));
    fails_with(o, "config");
    let o = run(cmd(d).args(["--config", "missing.toml", "sweep"]));
    fails_with(o, "config");
}

#[test]
fn errors_exit_non_zero_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fails_with(run(cmd(d).args(["get", "nothex"])), "key_invalid");
    fails_with(run(cmd(d).args(["stat", &"A".repeat(64)])), "key_invalid");
    fails_with(
        run(cmd(d).args(["has", &"0".repeat(64), "-n", "../etc"])),
        "key_invalid",
    );
    fails_with(run(cmd(d).args(["put", "no-such-file"])), "io");
    fails_with(run(cmd(d).args(["get", &"0".repeat(64)])), "missing");
    write_file(d, "f", 10, 1);
    let wrong = blake3::hash(b"other").to_hex().to_string();
    fails_with(
        run(cmd(d).args(["put", "f", "--expect", &wrong])),
        "verification",
    );
    // A get that fails leaves no output file.
    fails_with(
        run(cmd(d).args(["get", &"0".repeat(64), "-o", "out.bin"])),
        "missing",
    );
    assert!(!d.join("out.bin").exists());
    let leftovers: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("blobpool-part")
        })
        .collect();
    assert!(leftovers.is_empty());
    // Usage errors are clap's: exit 2.
    let o = run(cmd(d).args(["frobnicate"]));
    assert_eq!(o.status.code(), Some(2));
    // Unreachable server.
    fails_with(
        run(cmd(d).args(["--server", "http://127.0.0.1:9", "has", &"0".repeat(64)])),
        "http",
    );
}

#[test]
fn help_describes_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let help = ok(run(cmd(dir.path()).arg("--help")));
    for word in [
        "serve",
        "put",
        "get",
        "stat",
        "has",
        "rm",
        "sweep",
        "--server",
        "BLOBPOOL_",
    ] {
        assert!(help.contains(word), "{word} missing from --help");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn server_mode_round_trips_against_an_inprocess_server() {
    let s = start(Opts {
        threshold: 1024,
        ..Default::default()
    })
    .await;
    let base = s.base.clone();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    let result = tokio::task::spawn_blocking(move || {
        for (name, len) in [("empty", 0u64), ("small", 1000), ("big", 5 << 20)] {
            let data = write_file(&d, name, len, len + 11);
            let v: serde_json::Value = serde_json::from_str(&ok(run(
                cmd(&d).args(["--server", &base, "put", name, "--json", "-n", "cli"])
            )))
            .unwrap();
            assert_eq!(keys(&v), set(&["namespace", "digest", "token"]));
            let digest = v["digest"].as_str().unwrap().to_string();
            assert_eq!(digest, blake3::hash(&data).to_hex().as_str());
            let out = format!("{name}.out");
            ok(run(cmd(&d).args([
                "--server", &base, "get", &digest, "-n", "cli", "-o", &out,
            ])));
            assert_eq!(std::fs::read(d.join(&out)).unwrap(), data, "{name}");
            let st: serde_json::Value = serde_json::from_str(&ok(run(
                cmd(&d).args(["--server", &base, "stat", &digest, "-n", "cli", "--json"])
            )))
            .unwrap();
            assert_eq!(st["size"], len);
            assert_eq!(st["tier"], if len > 1024 { "large" } else { "kv" });
        }
        // stdin (chunked) put.
        let data = bytes_of(200_000, 3);
        let mut child = cmd(&d)
            .args(["--server", &base, "put", "-", "-n", "cli", "--release"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&data).unwrap();
        let o = child.wait_with_output().unwrap();
        let digest = ok(o);
        assert_eq!(digest, blake3::hash(&data).to_hex().as_str());
        // Released: rm succeeds; then missing.
        ok(run(
            cmd(&d).args(["--server", &base, "rm", &digest, "-n", "cli"])
        ));
        fails_with(
            run(cmd(&d).args(["--server", &base, "rm", &digest, "-n", "cli"])),
            "missing",
        );
        // Not released: the server refuses the delete.
        let small = write_file(&d, "pinned", 10, 1);
        let digest = ok(run(cmd(&d).args(["--server", &base, "put", "pinned"])));
        assert_eq!(digest, blake3::hash(&small).to_hex().as_str());
        fails_with(
            run(cmd(&d).args(["--server", &base, "rm", &digest])),
            "gc_refuse",
        );
        let text = ok(run(cmd(&d).args([
            "--server",
            &base,
            "has",
            &digest,
            &"0".repeat(64),
        ])));
        assert_eq!(
            text,
            format!("{digest}\tpresent\n{}\tabsent", "0".repeat(64))
        );
        fails_with(
            run(cmd(&d).args(["--server", &base, "get", &"0".repeat(64)])),
            "missing",
        );
        let v: serde_json::Value = serde_json::from_str(&ok(run(
            cmd(&d).args(["--server", &base, "sweep", "--json"])
        )))
        .unwrap();
        assert_eq!(v["aborted"], "no_liveness_sources");
    })
    .await;
    result.unwrap();
}

#[test]
fn serve_binary_round_trip_and_sigterm_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut server = cmd(d)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let base = loop {
        let line = lines.next().expect("serve prints its address").unwrap();
        if let Some(rest) = line.strip_prefix("blobpool: listening on ") {
            break rest.trim().to_string();
        }
    };
    let data = write_file(d, "f", 300_000, 8);
    let digest = ok(run(cmd(d).args(["--server", &base, "put", "f"])));
    ok(run(
        cmd(d).args(["--server", &base, "get", &digest, "-o", "f.out"])
    ));
    assert_eq!(std::fs::read(d.join("f.out")).unwrap(), data);
    fails_with(
        run(cmd(d).args(["--server", &base, "get", "bad"])),
        "key_invalid",
    );
    // SIGTERM: a graceful stop, exit 0.
    let status = Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code:?}");
    assert!(d.join("blobpool-data/kv.sqlite").is_file());
}

/// A `blobpool serve` child, killed if the test ends early.
struct ServeChild(std::process::Child);

impl Drop for ServeChild {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Issue 11, item 4: a direct-mode command on the data a running server
/// holds is a second, undeclared instance that cannot see the server's
/// pins. It is refused (naming the server and suggesting `--server`), and
/// the blob the server pins stays served.
#[test]
fn direct_mode_refuses_the_data_of_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A free port, so the config (and the suggestion) names the server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        d.join("blobpool.toml"),
        format!(
            "listen = \"127.0.0.1:{port}\"\nwindow = 0\nthreshold = 1000\n\
             [gc]\nunreferenced_namespaces = [\"tmp\"]\n"
        ),
    )
    .unwrap();
    let mut child = cmd(d)
        .arg("serve")
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut server = ServeChild(child);
    let base = loop {
        let line = lines.next().expect("serve prints its address").unwrap();
        if let Some(rest) = line.strip_prefix("blobpool: listening on ") {
            break rest.trim().to_string();
        }
    };
    assert_eq!(base, format!("http://127.0.0.1:{port}"));
    // Put over HTTP (one small, one large), keeping the pin tokens.
    let mut digests = Vec::new();
    for (name, len) in [("small", 100u64), ("big", 300_000)] {
        let data = write_file(d, name, len, len);
        let v: serde_json::Value = serde_json::from_str(&ok(run(
            cmd(d).args(["--server", &base, "put", name, "-n", "tmp", "--json"])
        )))
        .unwrap();
        assert!(v["token"].is_string(), "the token is kept: {v}");
        digests.push((name, v["digest"].as_str().unwrap().to_string(), data));
    }
    // Direct mode on the same configuration: refused, twice, naming the
    // server's pid and suggesting --server.
    let holder = format!("(pid {} ", server.0.id());
    let suggestion = format!("--server http://127.0.0.1:{port}");
    for args in [
        &["sweep"][..],
        &["sweep"][..],
        &["rm", &digests[0].1, "-n", "tmp"][..],
        &["has", &digests[1].1, "-n", "tmp"][..],
    ] {
        let o = run(cmd(d).args(args));
        let err = stderr(&o);
        fails_with(o, "locked");
        assert!(err.contains("blobpool-data/kv.sqlite"), "{err}");
        assert!(
            err.contains("is in use by another Blobpool instance"),
            "{err}"
        );
        assert!(err.contains(&holder), "{err}");
        assert!(err.contains(&suggestion), "{err}");
    }
    // The server still serves both (GET 200, verified bytes).
    for (name, digest, data) in &digests {
        let out = format!("{name}.out");
        ok(run(cmd(d).args([
            "--server", &base, "get", digest, "-n", "tmp", "-o", &out,
        ])));
        assert_eq!(&std::fs::read(d.join(&out)).unwrap(), data, "{name}");
    }
    // Once the server is gone, direct mode opens the data again (its pins
    // went with it: the sweep stages the entries).
    let status = Command::new("kill")
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server.0.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(lines);
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(cmd(d).args(["sweep", "--json"])))).unwrap();
    assert_eq!(v["total"]["staged"], 2, "{v}");
}
