//! `blobpool ref …` and `blobpool put --ref` (ADR-024), directly on the
//! store and against `blobpool serve`.

mod common;

use std::path::Path;
use std::process::{Command, Output};

/// A quiet command in `dir` ([`common::blobpool_in`] with `-q`).
fn cmd(dir: &Path) -> Command {
    let mut c = common::blobpool_in(dir);
    c.arg("-q");
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
    let (server, base) = common::serve_command(
        cmd(dir.path())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn"),
    );
    exercise(dir.path(), Some(&base));
    // `put --ref` released its put's token; the plain put keeps one.
    let resp = common::plain_get(&base, "/health", None);
    let body = resp.split("\r\n\r\n").nth(1).unwrap();
    let health: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(health["tokens"], 1, "{health}");
    drop(server);
}
