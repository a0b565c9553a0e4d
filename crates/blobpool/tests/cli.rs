//! The `blobpool` binary: direct mode, server mode (against an in-process
//! server and against `blobpool serve`), errors and exit codes.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::*;

/// A command in `dir` with a clean environment: no inherited BLOBPOOL_*.
fn cmd(dir: &Path) -> Command {
    blobpool_in(dir)
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

/// A failed command: exit 1 and one stderr line naming `code`, followed
/// only by the `  caused by: …` lines of its cause chain.
fn fails_with(o: Output, code: &str) {
    assert_eq!(o.status.code(), Some(1), "stdout: {}", stdout(&o));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    assert!(!lines.is_empty(), "a message expected");
    assert!(
        lines[0].starts_with(&format!("blobpool: {code}: ")),
        "{err:?}"
    );
    for cause in &lines[1..] {
        assert!(
            cause.starts_with("  caused by: "),
            "only causes follow: {err:?}"
        );
    }
}

#[test]
fn a_media_failure_prints_its_cause_chain() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_file(d, "f", 10, 1);
    // A file where the default data directory belongs: opening the store
    // fails, with the operating system's error as the cause.
    std::fs::write(d.join("blobpool-data"), b"not a directory").unwrap();
    let o = run(cmd(d).args(["put", "f"]));
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "the error and its cause: {err:?}");
    assert!(lines[0].starts_with("blobpool: internal: "), "{err:?}");
    assert!(
        lines[0].contains("blobpool-data"),
        "names the path: {err:?}"
    );
    assert!(
        lines[0].ends_with(": already exists"),
        "names the kind: {err:?}"
    );
    assert!(
        lines[1].starts_with("  caused by: ") && lines[1].contains("os error"),
        "{err:?}"
    );
    // A local input that cannot be read is an `io` failure with its cause.
    let healthy = tempfile::tempdir().unwrap();
    let o = run(cmd(healthy.path()).args(["put", "no-such-file"]));
    let err = stderr(&o);
    assert!(err.starts_with("blobpool: io: "), "{err:?}");
    assert!(
        err.contains("\n  caused by: No such file or directory"),
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

/// A direct-mode get streams the engine's chunks (TUNING.md §response-chunks) and still
/// fails with `verification` on a corrupt entry: a file output is never
/// created, and nothing is committed.
#[test]
fn direct_mode_get_of_a_corrupt_entry_fails_and_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let len = 3u64 << 20;
    let data = write_file(d, "big", len, 17);
    let digest = ok(run(cmd(d).args(["put", "big"])));
    let stored = find_file_of_len(&d.join("blobpool-data/large"), len).expect("stored file");
    let mut bytes = std::fs::read(&stored).unwrap();
    assert_eq!(bytes, data);
    bytes[(len / 2) as usize] ^= 0x40;
    std::fs::write(&stored, &bytes).unwrap();
    fails_with(
        run(cmd(d).args(["get", &digest, "-o", "out.bin"])),
        "verification",
    );
    assert!(!d.join("out.bin").exists());
    assert!(part_files(d).is_empty(), "{:?}", part_files(d));
    fails_with(run(cmd(d).args(["get", &digest])), "verification");
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
    // Every get went through a bao stream (ADR-033): three entries, and
    // the get of an absent one is refused before any stream.
    assert_eq!(s.ops.metrics().bao_gets(), 3);
}

/// Issue 15: `get --server` decodes a bao stream as it arrives, so a
/// corrupt entry fails with `verification` and a non-zero exit, and
/// stdout receives only bytes checked against the digest.
#[tokio::test(flavor = "multi_thread")]
async fn server_mode_get_is_a_verified_stream() {
    let s = start(Opts {
        threshold: 1024,
        ..Default::default()
    })
    .await;
    let base = s.base.clone();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    const G: u64 = 16 * 1024;
    let n = (1u64 << 20) + 4321;
    let data = bytes_of(n, 61);
    let (_t, digest) = s.put_ok("rot", data.clone()).await;
    let key = store_types::Key::parse("rot", &digest).unwrap();
    // A clean get (which also leaves the entry's outboard cached on the
    // server: this engine keeps none, ADR-032 §6).
    let (b, dg) = (base.clone(), digest.clone());
    let (dd, want) = (d.clone(), data.clone());
    tokio::task::spawn_blocking(move || {
        let o = run(cmd(&dd).args(["--server", &b, "get", &dg, "-n", "rot"]));
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(o.stdout, want, "stdout is the entry");
    })
    .await
    .unwrap();
    assert_eq!(s.ops.metrics().bao_gets(), 1);

    // Flip a byte in group 10: the server starts the stream and cuts it
    // there; the CLI writes the verified groups before it, then fails with
    // `verification` (the server confirms the corruption).
    let flip = 10 * G + 77;
    s.large.corrupt_byte_at(&key, flip).await.unwrap();
    let (b, dg, dd, want) = (base.clone(), digest.clone(), d.clone(), data.clone());
    tokio::task::spawn_blocking(move || {
        let o = run(cmd(&dd).args(["--server", &b, "get", &dg, "-n", "rot"]));
        assert!(
            o.stdout.len() as u64 <= flip / G * G,
            "{} bytes reached stdout, past the corrupt group's start",
            o.stdout.len()
        );
        assert_eq!(
            &o.stdout[..],
            &want[..o.stdout.len()],
            "only verified bytes"
        );
        fails_with(o, "verification");
        // Into a file: no file at all.
        let o = run(cmd(&dd).args(["--server", &b, "get", &dg, "-n", "rot", "-o", "out"]));
        fails_with(o, "verification");
        assert!(!dd.join("out").exists());
    })
    .await
    .unwrap();

    // An entry without a kept outboard (stored before outboards; over
    // 1 MiB, so that it had one to forget, TUNING.md §small-outboards), corrupt before the
    // server ever computed one: refused before the stream starts (its
    // outboard needs a verified whole read), nothing on stdout.
    let other = bytes_of(70 * G, 62);
    let (_t, od) = s.put_ok("rot", other).await;
    let okey = store_types::Key::parse("rot", &od).unwrap();
    s.large
        .forget_outboard(&okey)
        .expect("the local engine keeps the outboard beside the entry");
    s.large.corrupt_byte_at(&okey, 2 * G).await.unwrap();
    let (b, dd) = (base.clone(), d.clone());
    tokio::task::spawn_blocking(move || {
        let o = run(cmd(&dd).args(["--server", &b, "get", &od, "-n", "rot"]));
        assert!(o.stdout.is_empty());
        fails_with(o, "verification");
    })
    .await
    .unwrap();
}

/// A server without bao streams (plain bytes whatever the `Accept`):
/// `get` falls back to hashing the plain body and checking it at the end.
#[tokio::test(flavor = "multi_thread")]
async fn server_mode_get_falls_back_to_plain_bytes() {
    use axum::routing::get;
    let good = bytes_of(100_000, 63);
    let digest = blake3::hash(&good).to_hex().to_string();
    let mut bad = good.clone();
    bad[50_000] ^= 1;
    let bad_digest = blake3::hash(b"claimed").to_hex().to_string();
    let (g, b) = (good.clone(), bad.clone());
    let (dg, bd) = (digest.clone(), bad_digest.clone());
    let app = axum::Router::new().route(
        "/v1/blobs/{ns}/{digest}",
        get(
            move |axum::extract::Path((_ns, d)): axum::extract::Path<(String, String)>| {
                let body = if d == dg { g.clone() } else { b.clone() };
                async move { ([("content-type", "application/octet-stream")], body) }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        ok(run(
            cmd(&d).args(["--server", &base, "get", &digest, "-o", "old"])
        ));
        assert_eq!(std::fs::read(d.join("old")).unwrap(), good);
        fails_with(
            run(cmd(&d).args(["--server", &base, "get", &bd, "-o", "wrong"])),
            "verification",
        );
        assert!(!d.join("wrong").exists());
    })
    .await
    .unwrap();
    server.abort();
}

#[test]
fn serve_binary_round_trip_and_sigterm_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (mut server, base) = serve_child(d);
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
        .args(["-TERM", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(s) = server.0.try_wait().unwrap() {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(code.success(), "{code:?}");
    assert!(d.join("blobpool-data/kv.sqlite").is_file());
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
    let (mut server, base) = serve_command(cmd(d).arg("serve").env("RUST_LOG", "warn"));
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
    let v: serde_json::Value =
        serde_json::from_str(&ok(run(cmd(d).args(["sweep", "--json"])))).unwrap();
    assert_eq!(v["total"]["staged"], 2, "{v}");
}

// ---- Issue 12: the CLI's security and robustness items ----

/// A usage error: exit 2 and one stderr line `blobpool: usage: …`
/// containing each of `words`.
fn usage_error(o: Output, words: &[&str]) {
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(o.stdout.is_empty(), "stdout: {}", stdout(&o));
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err:?}");
    assert!(lines[0].starts_with("blobpool: usage: "), "{err:?}");
    for w in words {
        assert!(err.contains(w), "{w:?} missing from {err:?}");
    }
}

#[test]
fn server_urls_are_checked_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let zero = "0".repeat(64);
    // No scheme: the fix is named.
    for url in ["127.0.0.1:7070", "localhost:7070", "ftp://h:1"] {
        usage_error(
            run(cmd(d).args(["--server", url, "has", &zero])),
            &["http://", "https://"],
        );
    }
    usage_error(
        run(cmd(d).args(["--server", "127.0.0.1:7070", "has", &zero])),
        &["https://127.0.0.1:7070"],
    );
    // Credentials in the URL are never used: --token is.
    usage_error(
        run(cmd(d).args(["--server", "https://u:pw@127.0.0.1:1", "has", &zero])),
        &["--token"],
    );
    // A token over plain HTTP to a non-loopback host (TEST-NET-1, never
    // reached: the refusal comes before any connection, so it is quick
    // even with long timeouts), from the flag or the environment.
    let started = std::time::Instant::now();
    for via_env in [false, true] {
        let mut c = cmd(d);
        c.args([
            "--server",
            "http://192.0.2.1:7070",
            "--connect-timeout",
            "5m",
        ]);
        if via_env {
            c.env("BLOBPOOL_TOKEN", "bpk_secret");
        } else {
            c.args(["--token", "bpk_secret"]);
        }
        let o = run(c.args(["get", &zero, "-o", "out"]));
        assert!(!stderr(&o).contains("bpk_secret"), "{}", stderr(&o));
        usage_error(o, &["192.0.2.1", "https://", "--allow-insecure-http"]);
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(!d.join("out").exists());
    // Bad flag values are clap's usage errors.
    for args in [
        &["--timeout", "soon", "sweep"][..],
        &["--connect-timeout", "5y", "sweep"][..],
        &["--client-cert", "c.pem", "sweep"][..],
        &["serve", "--log-format", "yaml"][..],
        &["key", "new", "--scope", "root"][..],
    ] {
        let o = run(cmd(d).args(args));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    usage_error(run(cmd(d).args(["release", "abc"])), &["--server"]);
}

#[test]
fn the_read_timeout_ends_a_silent_server() {
    let dir = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    // Accepts, reads the request, never answers.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    let started = std::time::Instant::now();
    let o = run(cmd(dir.path()).args([
        "--server",
        &base,
        "--timeout",
        "1s",
        "stat",
        &"0".repeat(64),
    ]));
    fails_with(o, "timeout");
    assert!(started.elapsed() < Duration::from_secs(20));
    // A put to a server that takes no data times out as well.
    write_file(dir.path(), "big", 32 << 20, 1);
    let started = std::time::Instant::now();
    let o = run(cmd(dir.path()).args(["--server", &base, "--timeout", "1s", "put", "big"]));
    fails_with(o, "timeout");
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// `--timeout` is an idle timeout: an upload longer than it that keeps
/// moving succeeds, and time spent waiting on a slow stdin is not the
/// server's silence.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_upload_that_keeps_moving_outlives_the_timeout() {
    let s = start(Opts::default()).await;
    let base = s.base.clone();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut child = cmd(&d)
            .args([
                "--server",
                &base,
                "--timeout",
                "1s",
                "put",
                "-",
                "--release",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut all = Vec::new();
        for i in 0..6u64 {
            let chunk = bytes_of(100_000, i);
            stdin.write_all(&chunk).unwrap();
            all.extend(chunk);
            std::thread::sleep(Duration::from_millis(500));
        }
        drop(stdin);
        let o = child.wait_with_output().unwrap();
        assert_eq!(ok(o), blake3::hash(&all).to_hex().as_str());
    })
    .await
    .unwrap();
}

/// The names in `d` that look like leftovers of a get.
fn part_files(d: &Path) -> Vec<String> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("blobpool-part"))
        .collect()
}

#[cfg(unix)]
#[test]
fn get_to_a_file_never_follows_planted_symlinks_and_fails_cleanly() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = write_file(d, "f", 200_000, 21);
    let digest = ok(run(cmd(d).args(["put", "f"])));
    // A victim outside the output directory, and symlinks to it under
    // the names a naive implementation would write to.
    let victim = d.join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let out_dir = d.join("out");
    std::fs::create_dir(&out_dir).unwrap();
    for name in [
        "blob.tmp",
        ".blob.tmp",
        "blob.part",
        ".blob.blobpool-part",
        "blob.blobpool-part",
        &format!(".blob.blobpool-part-{}", std::process::id()),
    ] {
        symlink(&victim, out_dir.join(name)).unwrap();
    }
    // The destination itself a symlink: replaced, not followed.
    symlink(&victim, out_dir.join("blob")).unwrap();
    ok(run(cmd(d).args(["get", &digest, "-o", "out/blob"])));
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let meta = std::fs::symlink_metadata(out_dir.join("blob")).unwrap();
    assert!(meta.file_type().is_file(), "the symlink was replaced");
    assert_eq!(std::fs::read(out_dir.join("blob")).unwrap(), data);
    assert_eq!(part_files(&out_dir).len(), 3, "only the planted ones");

    // A failed get (absent) leaves an existing FILE alone and no temp file.
    std::fs::write(d.join("keep"), b"old").unwrap();
    fails_with(
        run(cmd(d).args(["get", &"0".repeat(64), "-o", "keep"])),
        "missing",
    );
    assert_eq!(std::fs::read(d.join("keep")).unwrap(), b"old");
    assert!(part_files(d).is_empty());
    // An unverified get (corrupted large-tier file) too.
    let big = write_file(d, "big", 300_000, 22);
    let digest = ok(run(cmd(d).args(["put", "big"])));
    let stored = find_file_of_len(&d.join("blobpool-data/large"), big.len() as u64)
        .expect("the large-tier file");
    let mut bytes = std::fs::read(&stored).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&stored, &bytes).unwrap();
    fails_with(
        run(cmd(d).args(["get", &digest, "-o", "keep"])),
        "verification",
    );
    assert_eq!(std::fs::read(d.join("keep")).unwrap(), b"old");
    assert!(part_files(d).is_empty());
    // Into a directory that does not exist: an io error, nothing created.
    fails_with(
        run(cmd(d).args(["get", &"0".repeat(64), "-o", "nodir/x"])),
        "io",
    );
}

fn find_file_of_len(dir: &Path, len: u64) -> Option<std::path::PathBuf> {
    for e in std::fs::read_dir(dir).ok()? {
        let p = e.ok()?.path();
        let m = std::fs::metadata(&p).ok()?;
        if m.is_dir() {
            if let Some(f) = find_file_of_len(&p, len) {
                return Some(f);
            }
        } else if m.len() == len {
            return Some(p);
        }
    }
    None
}

/// Runs `c` with stdout a pipe from which one byte is read (when
/// `read_one`) before it is closed; returns the exit code and stderr.
fn with_closed_stdout(c: &mut Command, read_one: bool) -> (Option<i32>, String) {
    use std::io::Read;
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    if read_one {
        let mut b = [0u8; 1];
        out.read_exact(&mut b).unwrap();
    }
    drop(out);
    let o = child.wait_with_output().unwrap();
    (o.status.code(), stderr(&o))
}

/// A pipe whose read end is already closed.
fn dead_pipe() -> std::io::PipeWriter {
    let (r, w) = std::io::pipe().unwrap();
    drop(r);
    w
}

#[test]
fn a_closed_stdout_ends_quietly_with_status_zero() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_file(d, "big", 4 << 20, 5);
    let digest = ok(run(cmd(d).args(["put", "big"])));
    // `blobpool get D | head -c 1`.
    let (code, err) = with_closed_stdout(cmd(d).args(["get", &digest]), true);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(err, "");
    for args in [
        &["get", &digest][..],
        &["has", &digest][..],
        &["stat", &digest][..],
        &["stat", &digest, "--json"][..],
        &["put", "big"][..],
    ] {
        let o = run(cmd(d).args(args).stdout(dead_pipe()));
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{args:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_put_shows_or_releases_its_pin_token() {
    let s = start(Opts::default()).await;
    let base = s.base.clone();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        // Text: stdout is the digest; stderr names the token and the
        // command that releases it.
        let data = write_file(&d, "a", 5000, 31);
        let o = run(cmd(&d).args(["--server", &base, "put", "a"]));
        let err = stderr(&o);
        let digest = ok(o);
        assert_eq!(digest, blake3::hash(&data).to_hex().as_str());
        let line = err.lines().find(|l| l.contains("pin token")).expect(&err);
        let token = line
            .split_whitespace()
            .nth(3)
            .expect("blobpool: pin token TOKEN …")
            .to_string();
        assert!(
            line.contains(&format!("--server {base} release {token}")),
            "{line}"
        );
        fails_with(
            run(cmd(&d).args(["--server", &base, "rm", &digest])),
            "gc_refuse",
        );
        assert_eq!(
            ok(run(cmd(&d).args(["--server", &base, "release", &token]))),
            format!("released {token}")
        );
        ok(run(cmd(&d).args(["--server", &base, "rm", &digest])));
        // --release: said on stderr (text) and in the JSON.
        let o = run(cmd(&d).args(["--server", &base, "put", "a", "--release"]));
        assert!(stderr(&o).contains("pin token released"), "{}", stderr(&o));
        assert_eq!(ok(o), digest);
        ok(run(cmd(&d).args(["--server", &base, "rm", &digest])));
        let v: serde_json::Value = serde_json::from_str(&ok(run(cmd(&d).args([
            "--server",
            &base,
            "put",
            "a",
            "--release",
            "--json",
        ]))))
        .unwrap();
        assert_eq!(keys(&v), set(&["namespace", "digest", "released"]));
        assert_eq!(v["released"], true);
        ok(run(cmd(&d).args(["--server", &base, "rm", &digest])));
        // The result cannot be printed (stdout closed): the token nobody
        // saw is released before the quiet exit.
        let o = run(cmd(&d)
            .args(["--server", &base, "put", "a"])
            .stdout(dead_pipe()));
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(stderr(&o), "");
        ok(run(cmd(&d).args(["--server", &base, "rm", &digest])));
        // Remote get into a closed pipe, too.
        write_file(&d, "big", 3 << 20, 32);
        let digest = ok(run(cmd(&d).args([
            "--server",
            &base,
            "put",
            "big",
            "--release",
        ])));
        let (code, err) =
            with_closed_stdout(cmd(&d).args(["--server", &base, "get", &digest]), true);
        assert_eq!(code, Some(0), "{err}");
        assert_eq!(err, "");
        // A token over plain HTTP to loopback is allowed.
        let o = run(cmd(&d).args(["--server", &base, "--token", "bpk_x", "has", &digest]));
        assert_ne!(o.status.code(), Some(2), "{}", stderr(&o));
    })
    .await
    .unwrap();
}

#[test]
fn key_new_prints_a_key_and_its_config_entry() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = ok(run(cmd(d).args([
        "key",
        "new",
        "--name",
        "ci \"bot\"",
        "--scope",
        "read",
        "--scope",
        "write:ci-*",
    ])));
    let (first, snippet) = out.split_once('\n').unwrap();
    let key = first.strip_prefix("key: ").expect(&out);
    assert!(key.starts_with("bpk_"), "{key}");
    let v: toml::Value = toml::from_str(snippet).expect(snippet);
    let entry = &v["auth"]["keys"][0];
    assert_eq!(entry["name"].as_str(), Some("ci \"bot\""));
    assert_eq!(
        entry["hash"].as_str(),
        Some(store_ops::auth::hash_key(key).as_str())
    );
    let scopes: Vec<&str> = entry["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(scopes, ["read", "write:ci-*"]);
    // Fresh each time; read-only and a derived name by default.
    let out2 = ok(run(cmd(d).args(["key", "new", "--json"])));
    let j: serde_json::Value = serde_json::from_str(&out2).unwrap();
    assert_ne!(j["key"].as_str(), Some(key));
    assert_eq!(j["scopes"], serde_json::json!(["read"]));
    assert!(j["name"].as_str().unwrap().starts_with("key-"));
    // `key hash` reads the key on stdin.
    let mut child = cmd(d)
        .args(["key", "hash"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{key}").unwrap();
    let line = ok(child.wait_with_output().unwrap());
    assert_eq!(
        line,
        format!("hash = \"{}\"", store_ops::auth::hash_key(key))
    );
    usage_error(run(cmd(d).args(["key", "hash"])), &["stdin"]);
}

/// A CA, a server certificate for localhost / 127.0.0.1 and a client
/// certificate (CN `alice`), as PEM files in `dir`.
fn write_pki(dir: &Path) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "blobpool CLI test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let ckey = KeyPair::generate().unwrap();
    let mut cparams = CertificateParams::new(vec!["alice.clients.example".to_string()]).unwrap();
    cparams.distinguished_name.push(DnType::CommonName, "alice");
    let ccert = cparams.signed_by(&ckey, &issuer).unwrap();
    for (name, pem) in [
        ("ca.pem", ca.pem()),
        ("cert.pem", cert.pem()),
        ("key.pem", key.serialize_pem()),
        ("client.pem", ccert.pem()),
        ("client-key.pem", ckey.serialize_pem()),
    ] {
        std::fs::write(dir.join(name), pem).unwrap();
    }
}

/// Starts `blobpool serve` in `d`; the child and its base URL.
fn serve_in(d: &Path) -> (ServeChild, String) {
    serve_child(d)
}

/// HTTPS with a private CA (--ca-cert), an API key from `key new`
/// (--token) and a client certificate (--client-cert/--client-key),
/// end to end against `blobpool serve`.
#[test]
fn https_with_a_token_and_a_client_certificate_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_pki(d);
    let out = ok(run(cmd(d).args([
        "key",
        "new",
        "--name",
        "ci",
        "--scope",
        "read",
        "--scope",
        "write:ci-*",
    ])));
    let (first, snippet) = out.split_once('\n').unwrap();
    let key = first.strip_prefix("key: ").unwrap().to_string();
    let p = |n: &str| d.join(n).display().to_string();
    std::fs::write(
        d.join("blobpool.toml"),
        format!(
            "window = 0\n{snippet}\n\
             [[auth.clients]]\nname = \"builder\"\nsubject = \"alice\"\nscopes = [\"read\"]\n\
             [tls]\ncert = {:?}\nkey = {:?}\nclient_ca = {:?}\nclient_auth = \"optional\"\n",
            p("cert.pem"),
            p("key.pem"),
            p("ca.pem"),
        ),
    )
    .unwrap();
    let (_server, base) = serve_in(d);
    assert!(base.starts_with("https://127.0.0.1:"), "{base}");
    let data = write_file(d, "f", 300_000, 41);
    let digest = blake3::hash(&data).to_hex().to_string();
    let ca = p("ca.pem");
    // Without the private CA: the certificate is not trusted (the
    // message says what to do).
    let o = run(cmd(d).args(["--server", &base, "--token", &key, "has", &digest]));
    let err = stderr(&o);
    fails_with(o, "http");
    assert!(err.contains("--ca-cert"), "{err}");
    // With it and the key: put, get, has in the key's namespaces.
    let with_key = |args: &[&str]| {
        let mut c = cmd(d);
        c.args(["--server", &base, "--ca-cert", &ca])
            .env("BLOBPOOL_TOKEN", &key)
            .args(args);
        run(&mut c)
    };
    assert_eq!(
        ok(with_key(&["put", "f", "-n", "ci-1", "--release"])),
        digest
    );
    ok(with_key(&["get", &digest, "-n", "ci-1", "-o", "f.out"]));
    assert_eq!(std::fs::read(d.join("f.out")).unwrap(), data);
    let o = with_key(&["put", "f", "-n", "ci-2"]);
    let token_note = stderr(&o);
    assert_eq!(ok(o), digest);
    let token = token_note.split_whitespace().nth(3).unwrap().to_string();
    assert_eq!(
        ok(with_key(&["release", &token])),
        format!("released {token}")
    );
    // Outside its grants: forbidden; a sweep needs admin.
    fails_with(with_key(&["put", "f", "-n", "other"]), "forbidden");
    fails_with(with_key(&["sweep"]), "forbidden");
    // No key, or a wrong one: unauthorized.
    let anon = |extra: &[&str]| {
        let mut c = cmd(d);
        c.args(["--server", &base, "--ca-cert", &ca])
            .args(extra)
            .args(["has", &digest, "-n", "ci-1"]);
        run(&mut c)
    };
    fails_with(anon(&[]), "unauthorized");
    fails_with(anon(&["--token", "bpk_wrong"]), "unauthorized");
    // The client certificate is the identity `builder` (read).
    let cc = p("client.pem");
    let ck = p("client-key.pem");
    assert_eq!(
        ok(anon(&["--client-cert", &cc, "--client-key", &ck])),
        format!("{digest}\tpresent")
    );
    // A key file that is not one: a config error naming the flags.
    let o = anon(&["--client-cert", &cc, "--client-key", &ca]);
    let err = stderr(&o);
    fails_with(o, "config");
    assert!(err.contains("--client-key"), "{err}");
}

/// A TCP proxy in front of a server: forwards each connection to
/// `upstream` (connecting anew for every client connection, so a server
/// restarted on the same address is reached again), passing the client's
/// bytes on at most `rate` bytes a second (`None`: at once) and recording
/// them. A connection whose either side ends is closed on both.
struct Proxy {
    base: String,
    sent: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: std::net::SocketAddr, rate: Option<u64>) -> Proxy {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = sent.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    // Refused (a server between lives): the client's
                    // connection is closed unanswered.
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = cr.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<_, std::io::Error>(());
                            }
                            log.lock().unwrap().extend_from_slice(&buf[..n]);
                            sw.write_all(&buf[..n]).await?;
                            if let Some(rate) = rate {
                                let secs = n as f64 / rate as f64;
                                tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                            }
                        }
                    };
                    let down = tokio::io::copy(&mut sr, &mut cw);
                    tokio::select! {
                        _ = up => {}
                        _ = down => {}
                    }
                });
            }
        });
        Proxy { base, sent, task }
    }

    /// How often `needle` occurs in what the clients sent.
    fn count(&self, needle: &str) -> usize {
        let sent = self.sent.lock().unwrap();
        sent.windows(needle.len())
            .filter(|w| *w == needle.as_bytes())
            .count()
    }

    /// Bytes the clients sent.
    fn sent_len(&self) -> usize {
        self.sent.lock().unwrap().len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The ids of the upload sessions spooled in a test server's directory.
fn spooled_sessions(s: &Server) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(s.dir.path().join("uploads")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".meta").map(str::to_string)
        })
        .collect()
}

/// The committed offset of session `id` in `ns`, as `HEAD` reports it.
async fn session_offset(s: &Server, ns: &str, id: &str) -> Option<u64> {
    let resp = s
        .http
        .head(s.url(&format!("/v1/uploads/{ns}/{id}")))
        .send()
        .await
        .ok()?;
    resp.headers()
        .get("upload-offset")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Issue 15: `put --server` of a file of 8 MiB or more goes through a
/// resumable upload session (open, chunks, finish with the digest), which
/// ends with the put; a smaller file is one plain put.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_put_goes_through_an_upload_session() {
    let s = start(Opts::default()).await;
    let proxy = Proxy::start(s.addr, None).await;
    let base = proxy.base.clone();
    let direct = s.base.clone();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    let digest = tokio::task::spawn_blocking(move || {
        let data = write_file(&d, "big", (9 << 20) + 123, 41);
        let digest = ok(run(
            cmd(&d).args(["--server", &base, "put", "big", "-n", "cli"])
        ));
        assert_eq!(digest, blake3::hash(&data).to_hex().as_str());
        ok(run(cmd(&d).args([
            "--server", &direct, "get", &digest, "-n", "cli", "-o", "big.out",
        ])));
        assert_eq!(std::fs::read(d.join("big.out")).unwrap(), data);
        // A wrong --expect is refused before anything is sent.
        let wrong = blake3::hash(b"other").to_hex().to_string();
        fails_with(
            run(cmd(&d).args(["--server", &base, "put", "big", "--expect", &wrong])),
            "verification",
        );
        digest
    })
    .await
    .unwrap();
    assert_eq!(proxy.count("POST /v1/uploads/cli HTTP/1.1"), 1);
    assert_eq!(proxy.count("PATCH /v1/uploads/cli/"), 2, "two 8 MiB chunks");
    assert_eq!(proxy.count(&format!("?digest={digest} HTTP/1.1")), 1);
    assert_eq!(proxy.count("PUT /v1/blobs/"), 0, "no plain put");
    assert_eq!(s.ops.uploads().sessions(), 0, "the session ended");
    assert!(spooled_sessions(&s).is_empty());
    // Below the threshold: a plain put.
    let base = proxy.base.clone();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        write_file(&d, "small", (8 << 20) - 1, 42);
        ok(run(
            cmd(&d).args(["--server", &base, "put", "small", "-n", "cli"])
        ));
    })
    .await
    .unwrap();
    assert_eq!(proxy.count("PUT /v1/blobs/cli HTTP/1.1"), 1);
    assert_eq!(proxy.count("POST /v1/uploads/"), 1, "no second session");
}

/// Issue 15: the server is restarted (requests in flight cut, as in a
/// crash) while `put --server` uploads; the CLI asks for the committed
/// offset, resumes there and succeeds, sending the bytes the server had
/// committed only once.
#[tokio::test(flavor = "multi_thread")]
async fn a_put_resumes_after_the_server_restarts_mid_upload() {
    fn opts() -> Opts {
        let mut o = Opts::default();
        o.http.limits.drain_timeout = Duration::from_millis(1);
        o
    }
    const LEN: u64 = 40 << 20;
    let s = start(opts()).await;
    // 16 MiB/s: the upload takes about 2.5 s, the restart happens in it.
    let proxy = Proxy::start(s.addr, Some(16 << 20)).await;
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    let data = write_file(&d, "big", LEN, 43);
    let child = cmd(&d)
        .args(["--server", &proxy.base, "put", "big", "-n", "cli", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the server has committed part of the upload.
    let mut committed = 0;
    let started = std::time::Instant::now();
    while committed == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no chunk committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some(id) = spooled_sessions(&s).first() {
            committed = session_offset(&s, "cli", id).await.unwrap_or(0);
        }
    }
    assert!(committed < LEN, "restarted before the upload ended");
    // Restart while a chunk is in flight, not between two chunks: a restart
    // in the gap is seamless (the client reconnects to the new server and
    // never sees an interruption), which is not what this test is about.
    // The proxy has forwarded 1 MiB of the next chunk; at 16 MiB/s the
    // remaining 7 MiB take about 0.4 s, far longer than the restart's cut.
    while (proxy.sent_len() as u64) < committed + (1 << 20) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the next chunk never started"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let s = s.restart_at_same_addr(opts()).await;
    let o = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let err = stderr(&o);
    let v: serde_json::Value = serde_json::from_str(&ok(o)).unwrap();
    assert_eq!(v["digest"], blake3::hash(&data).to_hex().as_str());
    assert!(err.contains("upload interrupted"), "{err}");
    assert!(err.contains("resuming in"), "{err}");
    // Stored right, by the restarted server, and the session is over.
    let resp = s
        .get(&format!("/v1/blobs/cli/{}", v["digest"].as_str().unwrap()))
        .await;
    assert_eq!(resp.status(), 200);
    assert!(resp.bytes().await.unwrap() == data);
    assert_eq!(s.ops.uploads().sessions(), 0);
    assert!(spooled_sessions(&s).is_empty());
    // Resumed, not started over: what was committed before the restart
    // was not sent again (at most the chunk the restart cut was).
    let sent = proxy.sent_len() as u64;
    assert!(sent >= LEN, "{sent}");
    assert!(sent < LEN + (8 << 20) + (1 << 20), "sent {sent} for {LEN}");
    assert_eq!(proxy.count("POST /v1/uploads/"), 1, "one session");
    assert!(
        proxy.count("HEAD /v1/uploads/cli/") >= 1,
        "asked for the offset"
    );
}

/// Issue 15: a server without upload sessions (disabled, or older) gets
/// the plain streaming put.
#[tokio::test(flavor = "multi_thread")]
async fn a_large_put_falls_back_to_a_plain_put_without_upload_sessions() {
    let s = start(Opts {
        uploads: false,
        ..Opts::default()
    })
    .await;
    let proxy = Proxy::start(s.addr, None).await;
    let base = proxy.base.clone();
    let direct = s.base.clone();
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    tokio::task::spawn_blocking(move || {
        let data = write_file(&d, "big", (9 << 20) + 5, 44);
        let digest = ok(run(cmd(&d).args([
            "--server",
            &base,
            "put",
            "big",
            "--release",
        ])));
        assert_eq!(digest, blake3::hash(&data).to_hex().as_str());
        ok(run(cmd(&d).args([
            "--server", &direct, "get", &digest, "-o", "big.out",
        ])));
        assert_eq!(std::fs::read(d.join("big.out")).unwrap(), data);
    })
    .await
    .unwrap();
    assert_eq!(proxy.count("POST /v1/uploads/"), 1, "asked once");
    assert_eq!(proxy.count("PATCH "), 0);
    assert_eq!(
        proxy.count("PUT /v1/blobs/default HTTP/1.1"),
        1,
        "the plain put"
    );
}

/// `get --range START-END`: directly (verified by chunk group) and against
/// a server (a bao stream decoded as it arrives); a range over a flipped
/// byte fails with `verification` and writes nothing, a range away from it
/// is served.
#[tokio::test(flavor = "multi_thread")]
async fn get_range_is_verified_directly_and_over_a_server() {
    const G: u64 = 16 * 1024;
    // Over 1 MiB, so that the entry keeps its outboard (TUNING.md §small-outboards) and a
    // range away from the flip is served by a fresh server.
    let data = bytes_of(70 * G + 99, 64);
    // Directly, on the default store in the working directory.
    let work = tempfile::tempdir().unwrap();
    let d = work.path().to_path_buf();
    std::fs::write(d.join("f"), &data).unwrap();
    let (dd, want) = (d.clone(), data.clone());
    tokio::task::spawn_blocking(move || {
        let digest = ok(run(cmd(&dd).args(["put", "f"])));
        let o = run(cmd(&dd).args(["get", &digest, "--range", "100000-100099"]));
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(o.stdout, &want[100_000..100_100]);
        // A malformed range is a usage error (clap's exit code 2).
        let o = run(cmd(&dd).args(["get", &digest, "--range", "9-3"]));
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("START-END"), "{}", stderr(&o));
    })
    .await
    .unwrap();

    // Against a server.
    let s = start(Opts::default()).await;
    let (_t, digest) = s.put_ok("rng", data.clone()).await;
    let key = store_types::Key::parse("rng", &digest).unwrap();
    let flip = 12 * G + 500;
    s.large.corrupt_byte_at(&key, flip).await.unwrap();
    let (b, dd, want) = (s.base.clone(), d.clone(), data.clone());
    tokio::task::spawn_blocking(move || {
        let args = |r: &str| {
            let mut c = cmd(&dd);
            c.args(["--server", &b, "get", &digest, "-n", "rng", "--range", r]);
            c
        };
        let o = run(&mut args(&format!("{}-{}", 3 * G + 1, 5 * G)));
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(o.stdout, &want[(3 * G + 1) as usize..=(5 * G) as usize]);
        let o = run(&mut args(&format!("{}-{}", flip - 10, flip + 10)));
        assert!(o.stdout.is_empty(), "no byte of a corrupt group");
        fails_with(o, "verification");
        fails_with(
            run(&mut args(&format!("{}-{}", 80 * G, 81 * G))),
            "invalid_range",
        );
    })
    .await
    .unwrap();
}
