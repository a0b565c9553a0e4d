//! `blobpool serve` as an operator meets it on a network (issue 12): it
//! refuses a non-loopback address without identities (unless told it is
//! insecure on purpose), enforces configured keys, answers only its own
//! `Host` names on loopback, logs JSON access lines, and never prints a
//! database password.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{blobpool_in as cmd, Serving};

const BIN: &str = env!("CARGO_BIN_EXE_blobpool");

/// A `blobpool serve` child, killed at the end of the test; its stderr
/// lines arrive on a channel.
fn serve(mut c: Command) -> Serving {
    common::serve_lines(&mut c).unwrap_or_else(|seen| panic!("serve prints its address:\n{seen}"))
}

#[test]
fn a_non_loopback_listen_without_identities_is_refused_before_touching_data() {
    let dir = tempfile::tempdir().unwrap();
    let out = cmd(dir.path())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("without authentication") && err.contains("--insecure-no-auth"),
        "{err}"
    );
    assert!(
        !dir.path().join("blobpool-data").exists(),
        "a refused server created no data"
    );
    // Insisting works (behind a proxy that authenticates).
    std::fs::write(
        dir.path().join("blobpool.toml"),
        "insecure_no_auth = true\n",
    )
    .unwrap();
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "0.0.0.0:0"])
        .env("RUST_LOG", "warn");
    let s = serve(c);
    assert!(
        s.startup.iter().any(|l| l.contains("auth: NONE")),
        "a startup warning: {:?}",
        s.startup
    );
}

#[tokio::test]
async fn configured_keys_are_enforced_and_requests_logged_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let key = store_ops::auth::generate_key();
    std::fs::write(
        dir.path().join("blobpool.toml"),
        format!(
            "log_format = \"json\"\n\
             [[auth.keys]]\nname = \"ci\"\nhash = \"{}\"\nscopes = [\"read\", \"write\"]\n",
            store_ops::auth::hash_key(&key)
        ),
    )
    .unwrap();
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    let s = serve(c);
    let http = reqwest::Client::new();
    let url = format!("{}/v1/blobs/docs", s.base);
    let anon = http.put(&url).body("x").send().await.unwrap();
    assert_eq!(anon.status(), 401);
    let ok = http
        .put(&url)
        .bearer_auth(&key)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 201);
    // Loopback without allowed_hosts: only loopback names are answered.
    let rebound = http
        .get(format!("{}/health", s.base))
        .header("host", "attacker.example")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 421);
    // The access lines are JSON with the identity.
    let mut identities = Vec::new();
    while identities.len() < 2 {
        let line = s
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("access lines");
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            panic!("a non-JSON log line: {line}");
        };
        if v["target"] == "blobpool::access" && v["fields"]["method"] == "PUT" {
            identities.push(v["fields"]["identity"].as_str().unwrap().to_string());
        }
    }
    assert_eq!(identities, ["anonymous", "ci"]);
}

#[test]
fn database_passwords_never_reach_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "postgres://blobpool_nobody:s3cretpw@127.0.0.1:5432/nope",
        "mysql://blobpool:s3cretpw@127.0.0.1/nope",
    ] {
        let out = cmd(dir.path())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("BLOBPOOL_KV", url)
            .env("RUST_LOG", "debug")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!all.contains("s3cretpw"), "{url}: {all}");
    }
}

/// Out of file descriptors: with a 64-descriptor limit, 150 idle
/// connections exhaust the server's table; it neither exits nor spins, and
/// once they close it serves again.
#[test]
fn running_out_of_file_descriptors_is_survived() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Command::new("sh");
    c.current_dir(dir.path())
        .args([
            "-c",
            &format!("ulimit -n 64 && exec {BIN} serve --listen 127.0.0.1:0"),
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("BLOBPOOL_") {
            c.env_remove(k);
        }
    }
    let s = serve(c);
    let addr = s.base.trim_start_matches("http://").to_string();
    let held: Vec<std::net::TcpStream> = (0..150)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    assert!(held.len() > 64, "only {} connections opened", held.len());
    std::thread::sleep(Duration::from_millis(500));
    let mut s = s;
    assert!(
        s.child.0.try_wait().unwrap().is_none(),
        "the server exited when it ran out of descriptors"
    );
    drop(held);
    // The server recovers: health answers within a few seconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(body) = get(&addr, "/health") {
            assert!(body.contains("\"status\":\"ok\""), "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no answer after the flood"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // It said why it could not accept (rate-limited), and did not spin.
    let mut saw = false;
    while let Ok(line) = s.lines.recv_timeout(Duration::from_millis(200)) {
        saw |= line.to_ascii_lowercase().contains("descriptor")
            || line.contains("EMFILE")
            || line.to_ascii_lowercase().contains("too many open files");
    }
    assert!(saw, "no accept-error line was logged");
}

/// A raw `GET path` answer body, `None` if the connection fails.
fn get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut resp = String::new();
    conn.read_to_string(&mut resp).ok()?;
    resp.split("\r\n\r\n").nth(1).map(str::to_string)
}

/// Issue 30: `serve` creates its data directory and files private by
/// default (umask 0077: directories 0700, files 0600); `umask` loosens the
/// files, never the data directory (created 0700 itself).
#[tokio::test]
async fn the_data_dir_and_its_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for (umask, file_mode) in [(None, 0o600), (Some("0022"), 0o644)] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cmd(dir.path());
        c.args(["serve", "--listen", "127.0.0.1:0"]);
        if let Some(u) = umask {
            std::fs::write(
                dir.path().join("blobpool.toml"),
                format!("umask = \"{u}\"\n"),
            )
            .unwrap();
        }
        let s = serve(c);
        // One resumable upload session, so the spool has files too.
        let r = reqwest::Client::new()
            .post(format!("{}/v1/uploads/docs", s.base))
            .header("content-type", "application/json")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        drop(s);
        let data = dir.path().join("blobpool-data");
        assert_eq!(mode(&data), 0o700, "data dir (umask {umask:?})");
        assert_eq!(
            mode(&data.join("kv.sqlite")),
            file_mode,
            "kv (umask {umask:?})"
        );
        let uploads = data.join("uploads");
        assert_eq!(
            mode(&uploads) & 0o077,
            if umask.is_none() { 0 } else { 0o055 }
        );
        for f in std::fs::read_dir(&uploads).unwrap().flatten() {
            assert_eq!(
                mode(&f.path()),
                file_mode,
                "{:?} (umask {umask:?})",
                f.path()
            );
        }
    }
}

/// A SIGHUP (a `systemctl reload`, a closed terminal) never stops a server
/// without `[tls]`: it logs that there is nothing to reload and serves on.
#[test]
fn sighup_without_tls_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"]);
    let mut s = serve(c);
    let addr = s.base.trim_start_matches("http://").to_string();
    // Serving (the accept loop and its SIGHUP handler are up).
    let body = get(&addr, "/health").expect("answering");
    assert!(body.contains("\"status\":\"ok\""), "{body}");
    let pid = s.child.0.id() as libc::pid_t;
    // SAFETY: sends a signal to the child this test spawned.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    let mut said = false;
    while let Ok(line) = s.lines.recv_timeout(Duration::from_secs(2)) {
        said |= line.contains("SIGHUP: nothing to reload");
        if said {
            break;
        }
    }
    assert!(said, "no SIGHUP line was logged");
    assert!(
        s.child.0.try_wait().unwrap().is_none(),
        "the server exited on SIGHUP"
    );
    let body = get(&addr, "/health").expect("still answering");
    assert!(body.contains("\"status\":\"ok\""), "{body}");
}
