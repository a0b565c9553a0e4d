//! `blobpool ref …` and `blobpool put --ref` (ADR-024), directly on the
//! store and against `blobpool serve`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_blobpool");

fn cmd(dir: &Path) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("BLOBPOOL_") {
            c.env_remove(k);
        }
    }
    c.stdin(Stdio::null()).arg("-q");
    c
}

fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

fn fails(o: Output, code: &str) {
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with(&format!("blobpool: {code}: ")), "{err}");
}

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Exercises the commands with `server` (`None`: direct mode).
fn exercise(dir: &Path, server: Option<&str>) {
    let run = |args: &[&str]| {
        let mut c = cmd(dir);
        if let Some(s) = server {
            c.args(["--server", s]);
        }
        c.args(args).output().unwrap()
    };
    std::fs::write(dir.join("a.txt"), b"alpha").unwrap();
    std::fs::write(dir.join("b.txt"), b"beta").unwrap();
    let a = ok(run(&["put", "a.txt", "-n", "docs", "--ref", "releases/a"]));
    let b = ok(run(&["put", "b.txt", "-n", "docs"]));
    assert_eq!(ok(run(&["ref", "get", "releases/a", "-n", "docs"])), a);
    // Compare and swap.
    fails(
        run(&["ref", "set", "releases/a", &b, "-n", "docs", "--create"]),
        "ref_conflict",
    );
    fails(
        run(&[
            "ref",
            "set",
            "releases/a",
            &b,
            "-n",
            "docs",
            "--if-match",
            &b,
        ]),
        "ref_conflict",
    );
    ok(run(&[
        "ref",
        "set",
        "releases/a",
        &b,
        "-n",
        "docs",
        "--if-match",
        &a,
    ]));
    ok(run(&[
        "ref",
        "set",
        "releases/b",
        &a,
        "-n",
        "docs",
        "--create",
    ]));
    ok(run(&["ref", "set", "other", &a, "-n", "docs"]));
    let listed = ok(run(&["ref", "ls", "-n", "docs", "--prefix", "releases/"]));
    assert_eq!(
        listed,
        format!("{b}  releases/a\n{a}  releases/b"),
        "{listed}"
    );
    let one = ok(run(&["ref", "ls", "-n", "docs", "--limit", "1", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(v["name"], "other");
    fails(
        run(&["ref", "set", "bad//name", &a, "-n", "docs"]),
        "key_invalid",
    );
    fails(
        run(&["ref", "set", "x", &"0".repeat(64), "-n", "docs"]),
        "missing",
    );
    ok(run(&["ref", "rm", "other", "-n", "docs"]));
    fails(run(&["ref", "get", "other", "-n", "docs"]), "missing");
}

#[test]
fn ref_commands_work_directly_on_the_store() {
    let dir = tempfile::tempdir().unwrap();
    exercise(dir.path(), None);
}

#[test]
fn ref_commands_and_put_ref_work_against_a_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = cmd(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Serve(child);
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines.next().expect("serve prints its address").unwrap();
        if let Some(rest) = line.strip_prefix("blobpool: listening on ") {
            break rest.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    exercise(dir.path(), Some(&base));
    // `put --ref` released its put's token; the plain put keeps one.
    let addr = base.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    write!(
        conn,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).unwrap();
    let body = resp.split("\r\n\r\n").nth(1).unwrap();
    let health: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(health["tokens"], 1, "{health}");
    drop(server);
}
