//! Real build tools against `blobpool serve` (issue 31, ADR-048): ccache
//! (Debian's package) over HTTP in each of its layouts, and sccache (its
//! WebDAV backend) building a small Rust crate. Each tool builds twice
//! with an empty local cache; the second build must be all remote hits,
//! asserted from the tool's own statistics.
//!
//! The tools must be installed (`.ci/run` installs them): `ccache` on
//! `PATH`; sccache with the `webdav` feature at `BLOBPOOL_TEST_SCCACHE`,
//! else `/opt/sccache-webdav/bin/sccache`. A missing tool fails the test,
//! naming what to install — it never passes by skipping.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::build_cache::{metrics, run};
use common::ServeChild;

/// The API key the tools send, as a Basic password (the server has
/// `[auth]` keys, so a tool without it gets nothing).
const KEY: &str = "bpk_build_cache_clients";
/// An `admin` key, for `/metrics`.
const ADMIN_KEY: &str = "bpk_build_cache_monitor";

/// `blobpool serve` with the cache namespaces `ccache` and `sccache`, and
/// one key ([`KEY`]); the child and its base URL.
fn serve(dir: &Path) -> (ServeChild, String) {
    common::build_cache::serve(
        dir,
        &[
            ("ccache", "max_bytes = \"1GiB\""),
            ("sccache", "max_age = \"30d\""),
        ],
        "",
        KEY,
        ADMIN_KEY,
    )
}

/// [`run`]'s standard output.
fn stdout(c: &mut Command) -> String {
    String::from_utf8_lossy(&run(c).stdout).into_owned()
}

/// A small C project: four translation units.
fn c_project(dir: &Path) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    (0..4)
        .map(|i| {
            let p = dir.join(format!("unit{i}.c"));
            std::fs::write(
                &p,
                format!(
                    "#include <stdio.h>\nint unit{i}(int x) {{ return x * {i} + {}; }}\n\
                     void print{i}(void) {{ printf(\"unit {i}\\n\"); }}\n",
                    i * 7
                ),
            )
            .unwrap();
            p
        })
        .collect()
}

/// `ccache --print-stats` as counters.
fn ccache_stats(env: &[(&str, String)]) -> BTreeMap<String, u64> {
    let mut c = Command::new("ccache");
    c.envs(env.iter().map(|(k, v)| (*k, v)));
    stdout(c.arg("--print-stats"))
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once('\t')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

fn ccache_build(src: &[PathBuf], out: &Path, env: &[(&str, String)]) {
    std::fs::create_dir_all(out).unwrap();
    for s in src {
        let o = out.join(s.file_name().unwrap()).with_extension("o");
        let mut c = Command::new("ccache");
        c.envs(env.iter().map(|(k, v)| (*k, v)))
            .arg("gcc")
            .arg("-O2")
            .arg("-c")
            .arg(s)
            .arg("-o")
            .arg(&o);
        run(&mut c);
        assert!(o.exists());
    }
}

#[test]
fn ccache_second_build_is_all_remote_hits_in_every_layout() {
    let which = Command::new("ccache").arg("--version").output();
    assert!(
        which.is_ok_and(|o| o.status.success()),
        "ccache is not installed (apt-get install ccache; .ci/run does it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(dir.path());
    let src = c_project(&dir.path().join("src"));
    // Without the key the remote answers nothing but 401.
    let answer = common::plain_get(&base, "/cache/ccache/ab/cd", None);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    for layout in ["subdirs", "flat", "bazel"] {
        let with_key = base.replace("http://", &format!("http://builder:{KEY}@"));
        let url = format!("{with_key}/cache/ccache/{layout}|layout={layout}");
        for round in 0..2 {
            // A fresh local cache each round: only the remote can hit.
            let env = vec![
                (
                    "CCACHE_DIR",
                    dir.path()
                        .join(format!("ccache-{layout}-{round}"))
                        .display()
                        .to_string(),
                ),
                ("CCACHE_REMOTE_STORAGE", url.clone()),
                ("CCACHE_BASEDIR", dir.path().display().to_string()),
                ("CCACHE_NOHASHDIR", "true".to_string()),
            ];
            ccache_build(
                &src,
                &dir.path().join(format!("out-{layout}-{round}")),
                &env,
            );
            let st = ccache_stats(&env);
            let (hit, miss) = (st["remote_storage_hit"], st["remote_storage_miss"]);
            let errors = st.get("remote_storage_error").copied().unwrap_or(0);
            assert_eq!(errors, 0, "{layout} round {round}: {st:?}");
            if round == 0 {
                assert_eq!((hit, miss), (0, 4), "{layout}: first build misses: {st:?}");
            } else {
                assert_eq!((hit, miss), (4, 0), "{layout}: second build hits: {st:?}");
            }
        }
    }
    // The server counted the same (ccache looks up a manifest and a
    // result per compile: 3 layouts x 4 units x 2, hits in the second
    // round, misses in the first), and its request latency and the
    // engines' operations are on /metrics.
    let m = metrics(&base, ADMIN_KEY);
    for result in ["hit", "miss"] {
        let line =
            format!("blobpool_cache_requests_total{{namespace=\"ccache\",result=\"{result}\"}} 24");
        assert!(m.contains(&line), "{line}\n{m}");
    }
    assert!(
        m.contains("blobpool_http_request_duration_seconds_count{route=\"/cache/{ns}/{key}\",method=\"GET\"}"),
        "{m}"
    );
    assert!(
        m.contains("blobpool_engine_op_duration_seconds_count{"),
        "{m}"
    );
    assert!(m.contains("blobpool_build_info{version="), "{m}");
    assert!(
        m.contains("blobpool_cache_keys{namespace=\"ccache\"} "),
        "{m}"
    );
}

fn sccache_bin() -> PathBuf {
    let p = std::env::var_os("BLOBPOOL_TEST_SCCACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/sccache-webdav/bin/sccache"));
    assert!(
        p.exists(),
        "sccache with the webdav feature is not at {} (cargo install sccache --no-default-features \
         --features webdav --root /opt/sccache-webdav; .ci/run does it)",
        p.display()
    );
    p
}

#[test]
fn sccache_second_build_of_a_rust_crate_is_all_webdav_hits() {
    let sccache = sccache_bin();
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(dir.path());
    let krate = dir.path().join("hello");
    std::fs::create_dir_all(krate.join("src")).unwrap();
    std::fs::write(
        krate.join("Cargo.toml"),
        "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(
        krate.join("src/lib.rs"),
        "pub fn add(a: u64, b: u64) -> u64 { a + b }\n",
    )
    .unwrap();
    std::fs::write(
        krate.join("src/main.rs"),
        "fn main() { println!(\"{}\", hello::add(2, 3)); }\n",
    )
    .unwrap();
    // Its own sccache server (port and local dir), so parallel tests and
    // a developer's sccache are not touched.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let env = |_round: usize| -> Vec<(&'static str, String)> {
        vec![
            ("SCCACHE_WEBDAV_ENDPOINT", format!("{base}/cache/sccache")),
            ("SCCACHE_WEBDAV_USERNAME", "builder".to_string()),
            ("SCCACHE_WEBDAV_PASSWORD", KEY.to_string()),
            (
                "SCCACHE_DIR",
                dir.path().join("sccache-local").display().to_string(),
            ),
            ("SCCACHE_SERVER_PORT", port.to_string()),
            ("SCCACHE_IDLE_TIMEOUT", "0".to_string()),
            ("SCCACHE_LOG", "warn".to_string()),
            ("RUSTC_WRAPPER", sccache.display().to_string()),
            // One target directory, cleaned between builds: the same
            // compiler arguments, nothing left to reuse but the cache.
            (
                "CARGO_TARGET_DIR",
                dir.path().join("target").display().to_string(),
            ),
            ("CARGO_INCREMENTAL", "0".to_string()),
        ]
    };
    let stats = |round: usize| -> serde_json::Value {
        let out = stdout(Command::new(&sccache).envs(env(round)).args([
            "--show-stats",
            "--stats-format",
            "json",
        ]));
        serde_json::from_str(&out).unwrap()
    };
    let count = |v: &serde_json::Value, field: &str| -> u64 {
        v["stats"][field]["counts"]
            .as_object()
            .map(|m| m.values().filter_map(|x| x.as_u64()).sum())
            .unwrap_or(0)
    };
    for round in 0..2 {
        let _ = Command::new(&sccache)
            .envs(env(round))
            .arg("--stop-server")
            .output();
        run(Command::new(&sccache)
            .envs(env(round))
            .arg("--start-server"));
        let _ = Command::new("cargo")
            .envs(env(round))
            .args(["clean", "--quiet"])
            .current_dir(&krate)
            .output();
        run(Command::new("cargo")
            .envs(env(round))
            .args(["build", "--offline", "--quiet"])
            .current_dir(&krate));
        let st = stats(round);
        let _ = Command::new(&sccache)
            .envs(env(round))
            .arg("--stop-server")
            .output();
        let (hits, misses) = (count(&st, "cache_hits"), count(&st, "cache_misses"));
        let errors = st["stats"]["cache_errors"]["counts"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(|x| x.as_u64()).sum::<u64>());
        assert_eq!(errors, 0, "round {round}: {st}");
        assert_eq!(st["effective_cache_mode"], "ReadWrite", "{st}");
        assert_eq!(st["stats"]["cache_write_errors"], 0, "{st}");
        if round == 0 {
            assert!(misses >= 1 && hits == 0, "first build misses: {st}");
        } else {
            assert!(hits >= 1 && misses == 0, "second build hits: {st}");
        }
    }
}
