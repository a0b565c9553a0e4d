//! Issue 39 item 3, "Configuration that fails closed", as `blobpool serve`
//! meets it: a configuration that would silently weaken the server, or
//! crash it after it said it was listening, is refused before anything is
//! served (exit 1, the setting named, no data touched); the explicit
//! opt-outs start with a warning; API keys over plain HTTP off loopback
//! are warned about.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::ServeChild;

fn cmd(dir: &Path) -> Command {
    let mut c = common::blobpool_in(dir);
    c.env("RUST_LOG", "info").env("RUST_BACKTRACE", "0");
    c
}

/// How a `serve` that should not start ended: its exit code (`None`: it
/// was still running after the grace period, and was killed) and stderr.
fn refused(mut c: Command) -> (Option<i32>, String) {
    let mut child = ServeChild(c.stderr(Stdio::piped()).spawn().unwrap());
    let mut stderr = child.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.0.kill();
            let _ = child.0.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (code, reader.join().unwrap())
}

/// Asserts that `c` is refused as a configuration error that names `want`,
/// before listening and without a panic.
fn assert_refused(c: Command, want: &[&str]) -> String {
    let (code, err) = refused(c);
    assert_eq!(code, Some(1), "a configuration error (exit 1): {err}");
    assert!(
        !err.contains("listening on"),
        "refused before listening: {err}"
    );
    assert!(!err.contains("panicked"), "no panic: {err}");
    for w in want {
        assert!(err.contains(w), "{w:?} in: {err}");
    }
    err
}

/// A running `serve`: its address and the stderr lines before it.
fn serve(mut c: Command) -> (ServeChild, String, Vec<String>) {
    let s = common::serve_lines(&mut c)
        .unwrap_or_else(|seen| panic!("serve prints its address:\n{seen}"));
    let addr = s.base.strip_prefix("http://").expect("plain HTTP");
    (s.child, addr.to_string(), s.startup)
}

/// The status line of `GET path` sent with `Host: host`.
fn status(addr: &str, path: &str, host: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    let _ = conn.read_to_string(&mut resp);
    resp.lines().next().unwrap_or_default().to_string()
}

fn write_config(dir: &Path, text: &str) {
    std::fs::write(dir.join("blobpool.toml"), text).unwrap();
}

fn key_entry() -> String {
    format!(
        "[[auth.keys]]\nname = \"ci\"\nhash = \"{}\"\nscopes = [\"read\"]\n",
        store_ops::auth::hash_key("bpk_fails_closed")
    )
}

/// `cors_origins = ["*"]` printed "listening" and then panicked in the
/// CORS layer (a crash loop under systemd): now a configuration error
/// naming the setting, from the file and from the variable.
#[test]
fn a_wildcard_cors_origin_is_a_configuration_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "[http]\ncors_origins = [\"*\"]\n");
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"]);
    assert_refused(c, &["[http]", "http.cors_origins \"*\"", "credentials"]);
    assert!(
        !dir.path().join("blobpool-data").exists(),
        "a refused server created no data"
    );

    let dir = tempfile::tempdir().unwrap();
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"])
        .env("BLOBPOOL_HTTP_CORS_ORIGINS", "https://ui.example.com, *");
    assert_refused(
        c,
        &[
            "environment BLOBPOOL_HTTP_CORS_ORIGINS",
            "http.cors_origins",
        ],
    );

    // A valid origin is served, and gets its CORS answer.
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        "[http]\ncors_origins = [\"https://ui.example.com\"]\n",
    );
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"]);
    let (_server, addr, _) = serve(c);
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        conn,
        "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://ui.example.com\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    let _ = conn.read_to_string(&mut resp);
    assert!(
        resp.to_ascii_lowercase()
            .contains("access-control-allow-origin: https://ui.example.com"),
        "{resp}"
    );
}

/// An empty `allowed_hosts` answered any `Host` (the DNS rebinding check
/// off, silently — on loopback even the default names were dropped): now
/// refused; `["*"]` is the explicit way, which starts with a warning.
#[test]
fn an_empty_allowed_hosts_is_refused_and_star_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "[http]\nallowed_hosts = []\n");
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"]);
    assert_refused(c, &["[http]", "http.allowed_hosts is empty", "[\"*\"]"]);

    // The variable set but empty (`-e BLOBPOOL_HTTP_ALLOWED_HOSTS=$UNSET`).
    let dir = tempfile::tempdir().unwrap();
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"])
        .env("BLOBPOOL_HTTP_ALLOWED_HOSTS", "");
    assert_refused(
        c,
        &[
            "environment BLOBPOOL_HTTP_ALLOWED_HOSTS",
            "http.allowed_hosts is empty",
        ],
    );

    // The default on loopback answers only the loopback names.
    let dir = tempfile::tempdir().unwrap();
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"]);
    let (server, addr, startup) = serve(c);
    let s = status(&addr, "/health", "rebind.example");
    assert!(s.contains(" 421 "), "{s}");
    let s = status(&addr, "/health", "localhost");
    assert!(s.contains(" 200 "), "{s}");
    assert!(
        !startup.iter().any(|l| l.contains("WARN")),
        "no warning by default: {startup:#?}"
    );
    drop(server);

    // The opt-out: any Host, said at startup.
    for how in ["file", "env"] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cmd(dir.path());
        c.args(["serve", "--listen", "127.0.0.1:0"]);
        if how == "file" {
            write_config(dir.path(), "[http]\nallowed_hosts = [\"*\"]\n");
        } else {
            c.env("BLOBPOOL_HTTP_ALLOWED_HOSTS", "*");
        }
        let (_server, addr, startup) = serve(c);
        assert!(
            startup.iter().any(|l| l.contains("WARN")
                && l.contains("allowed_hosts = [\"*\"]")
                && l.contains("DNS rebinding")),
            "{how}: a startup warning: {startup:#?}"
        );
        assert!(
            status(&addr, "/health", "rebind.example").contains(" 200 "),
            "{how}: any Host answered"
        );
    }
}

/// Two cache namespaces whose `http_path`s overlap were accepted, and a
/// request under the inner path was served from one cache while the
/// other's clients addressed it: refused at load, naming both.
#[test]
fn overlapping_cache_paths_are_refused_naming_both_namespaces() {
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        "[gc.namespaces.bazel]\npolicy = \"cache\"\nhttp_path = \"/bazel\"\n\
         [gc.namespaces.inner]\npolicy = \"cache\"\nhttp_path = \"/bazel/x\"\n",
    );
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"]);
    assert_refused(
        c,
        &[
            "gc.namespaces.inner.http_path \"/bazel/x\" is under gc.namespaces.bazel.http_path \"/bazel\"",
        ],
    );
    let dir = tempfile::tempdir().unwrap();
    write_config(
        dir.path(),
        "[gc.namespaces.a]\npolicy = \"cache\"\nhttp_path = \"/same\"\n\
         [gc.namespaces.b]\npolicy = \"cache\"\nhttp_path = \"/same/\"\n",
    );
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"]);
    assert_refused(
        c,
        &["gc.namespaces.b.http_path", "gc.namespaces.a.http_path"],
    );
}

/// API keys on a non-loopback address without TLS (the container's
/// default) cross the network in clear text: a WARN line saying what is
/// exposed and how to fix it; none on loopback or with TLS.
#[test]
fn api_keys_over_plain_http_off_loopback_are_warned_about() {
    let warning = |startup: &[String]| {
        startup
            .iter()
            .find(|l| l.contains("WARN") && l.contains("plain HTTP"))
            .cloned()
    };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &key_entry());
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "0.0.0.0:0"]);
    let (server, _, startup) = serve(c);
    let line = warning(&startup).unwrap_or_else(|| panic!("a warning: {startup:#?}"));
    for w in [
        "clear text",
        "Authorization",
        "[tls]",
        "BLOBPOOL_TLS_CERT",
        "proxy",
    ] {
        assert!(line.contains(w), "{w:?} in {line}");
    }
    drop(server);

    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &key_entry());
    let mut c = cmd(dir.path());
    c.args(["serve", "--listen", "127.0.0.1:0"]);
    let (_server, _, startup) = serve(c);
    assert_eq!(warning(&startup), None, "loopback: {startup:#?}");
}
