//! Real Bazel and Gradle against `blobpool serve` (issue 42 item 5,
//! ADR-072), the way `build_cache_clients.rs` runs ccache and sccache:
//! each tool builds twice with a clean local state between, and the
//! second build must be all remote hits by the tool's own output.
//!
//! - Bazel 2.1.0, the binary the npm registry ships
//!   (`@bazel/bazel-linux_x64`), builds a workspace of genrules only (it
//!   cannot fetch `rules_cc` here) with its default digest function,
//!   SHA-256, and no digest flag: over HTTP (`/cache/bazel`, `ac/` and
//!   `cas/`) and over gRPC (the Remote Execution API on the server's port,
//!   instance name `bazel`; Bazel 2.1 sends no key with some gRPC calls,
//!   so there the namespace is open to anonymous callers). Each round has
//!   a fresh output base, so the only cache is the remote; the second
//!   round's summary must read `N processes: N remote cache hit`. Bazel runs with `--batch` (no
//!   server process outlives a command, even a failing test's) and a
//!   proxy that goes nowhere, so it cannot download anything unnoticed;
//!   the repository cache must stay empty.
//! - Gradle from Debian (4.4.1, on the machine's Java 17) compiles a tiny
//!   Java project with its HTTP build cache (local cache off; not
//!   `--offline`, which turns the remote cache off too, but with no
//!   repository to resolve and a proxy that goes nowhere), a fresh
//!   `GRADLE_USER_HOME` and a clean build directory each round;
//!   the second round's `compileJava` must be `FROM-CACHE`.
//!
//! The tools must be installed (`.ci/run` installs them): Bazel at
//! `BLOBPOOL_TEST_BAZEL`, else `/opt/bazel-npm/node_modules/.bin/bazel`;
//! `gradle` on `PATH`. A missing tool fails the test, naming what to
//! install — it never passes by skipping.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::build_cache::{metrics, run};
use common::ServeChild;

/// The API key the tools send (Bearer for Bazel, Basic for Gradle).
const KEY: &str = "bpk_bazel_gradle_clients";
/// An `admin` key, for `/metrics`.
const ADMIN_KEY: &str = "bpk_bazel_gradle_monitor";

/// `blobpool serve` with the cache namespaces `bazel` and `gradle`, one
/// key ([`KEY`]) and the `anonymous` scopes (a TOML array's items); the
/// child and its base URL.
fn serve(dir: &Path, anonymous: &str) -> (ServeChild, String) {
    let bound = "max_bytes = \"1GiB\"";
    common::build_cache::serve(
        dir,
        &[("bazel", bound), ("gradle", bound)],
        anonymous,
        KEY,
        ADMIN_KEY,
    )
}

/// The value of one exact metric line (`name{labels}`), 0 when absent.
fn metric(m: &str, series: &str) -> f64 {
    m.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

// --- Bazel -------------------------------------------------------------------

fn bazel_bin() -> PathBuf {
    let p = std::env::var_os("BLOBPOOL_TEST_BAZEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/bazel-npm/node_modules/.bin/bazel"));
    assert!(
        p.exists(),
        "Bazel 2.1.0 is not at {} (npm install --prefix /opt/bazel-npm \
         @bazel/bazel-linux_x64@2.1.0, or set BLOBPOOL_TEST_BAZEL; .ci/run does it)",
        p.display()
    );
    p
}

/// The genrules: `PARTS` text parts from a source file, one output of
/// `seq 1 BIG` (5.4 MiB: more than one gRPC message, so ByteStream
/// streams it in chunks), and a bundle over all of them.
const PARTS: usize = 6;
const BIG: usize = 800_000;
/// The processes (genrules) one build runs.
const SPAWNS: usize = PARTS + 2;

/// A workspace of genrules only: no rules to fetch, no external
/// repository beyond the ones Bazel embeds.
fn workspace(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("WORKSPACE"), "workspace(name = \"bp_genrules\")\n").unwrap();
    std::fs::write(dir.join("input.txt"), "alpha\nbeta\ngamma\n").unwrap();
    let build = r#"[genrule(
    name = "part%d" % i,
    srcs = ["input.txt"],
    outs = ["part%d.txt" % i],
    cmd = "sed 's/^/%d: /' $< > $@ && seq 1 %d >> $@" % (i, 1000 * (i + 1)),
) for i in range(PARTS)]

genrule(
    name = "big",
    outs = ["big.txt"],
    cmd = "seq 1 BIG > $@",
)

genrule(
    name = "bundle",
    srcs = [":part%d" % i for i in range(PARTS)] + [":big"],
    outs = ["bundle.txt"],
    cmd = "cat $(SRCS) | wc -c > $@ && cat $(SRCS) | cksum >> $@",
)
"#;
    let build = build
        .replace("PARTS", &PARTS.to_string())
        .replace("BIG", &BIG.to_string());
    std::fs::write(dir.join("BUILD"), build).unwrap();
}

/// One round's outcome: Bazel's summary line and the bundle it built.
struct Round {
    summary: String,
    stderr: String,
    bundle: String,
}

/// `bazel build //:bundle` in batch mode with a fresh output base
/// (`round`'s own), against `remote` (its flags).
fn bazel_build(dir: &Path, round: usize, remote: &[String]) -> Round {
    let ws = dir.join("ws");
    // The install base (the unpacked binary, ~140 MiB) is shared by every
    // run on the machine: Bazel keys it by its own checksum.
    let install = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bazel-2.1.0-install");
    let out = run(Command::new(bazel_bin())
        .current_dir(&ws)
        .env("HOME", dir)
        // Any download would go to a proxy that is not there.
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .arg("--batch")
        .arg("--nohome_rc")
        .arg("--nosystem_rc")
        .arg("--noworkspace_rc")
        .arg(format!("--install_base={}", install.display()))
        .arg(format!("--output_user_root={}", dir.join("root").display()))
        .arg(format!(
            "--output_base={}",
            dir.join(format!("base-{round}")).display()
        ))
        .args([
            "build",
            "--spawn_strategy=local",
            "--color=no",
            "--curses=no",
        ])
        .arg("--noshow_progress")
        .args(remote)
        .arg("//:bundle"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let summary = stderr
        .lines()
        .find_map(|l| {
            l.strip_prefix("INFO: ")?
                .contains(" processes: ")
                .then_some(l)
        })
        .unwrap_or_else(|| panic!("no process summary in Bazel's output:\n{stderr}"))
        .trim_start_matches("INFO: ")
        .to_string();
    let bundle = std::fs::read_to_string(ws.join("bazel-bin/bundle.txt")).unwrap();
    // Nothing was fetched: the repository cache holds no download.
    let repos = dir.join("root/cache/repos/v1/content_addressable");
    assert!(
        std::fs::read_dir(&repos).map_or(true, |mut d| d.next().is_none()),
        "Bazel downloaded into {}:\n{stderr}",
        repos.display()
    );
    Round {
        summary,
        stderr,
        bundle,
    }
}

/// Two builds against `remote` with a fresh output base each: the first
/// runs every genrule (no hit), the second is all remote cache hits and
/// builds the same bundle.
fn bazel_twice(dir: &Path, remote: &[String]) {
    workspace(&dir.join("ws"));
    let first = bazel_build(dir, 0, remote);
    assert!(
        first.summary.starts_with(&format!("{SPAWNS} processes: "))
            && !first.summary.contains("remote cache hit"),
        "the first build runs every genrule: {}\n{}",
        first.summary,
        first.stderr
    );
    // A build whose uploads failed still succeeds (Bazel warns); the
    // second round is the proof.
    let second = bazel_build(dir, 1, remote);
    assert_eq!(
        second.summary,
        format!("{SPAWNS} processes: {SPAWNS} remote cache hit."),
        "the second build is all remote cache hits:\n{}",
        second.stderr
    );
    assert_eq!(second.bundle, first.bundle);
    // Each part: the input's 17 bytes, "i: " on its 3 lines, the numbers.
    let total: usize = (0..PARTS)
        .map(|i| 17 + 3 * 3 + seq_len(1000 * (i + 1)))
        .sum();
    assert!(
        first
            .bundle
            .starts_with(&format!("{}\n", total + seq_len(BIG))),
        "{}",
        first.bundle
    );
}

/// The bytes `seq 1 n` prints.
fn seq_len(n: usize) -> usize {
    (1..=n).map(|k| k.to_string().len() + 1).sum()
}

#[test]
fn bazel_over_http_with_sha256_second_build_is_all_remote_hits() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(dir.path(), "");
    let remote = vec![
        format!("--remote_cache={base}/cache/bazel"),
        format!("--remote_header=Authorization=Bearer {KEY}"),
    ];
    bazel_twice(dir.path(), &remote);
    // The server saw the same: the second round's action-cache lookups
    // (one per genrule) all hit.
    let m = metrics(&base, ADMIN_KEY);
    let hits = metric(
        &m,
        "blobpool_cache_requests_total{namespace=\"bazel\",result=\"hit\"}",
    );
    assert!(hits >= SPAWNS as f64, "{m}");
}

/// Bazel 2.1 sends `--remote_header`'s metadata with neither
/// `GetCapabilities` nor ByteStream `Write` (a Bazel bug, fixed by
/// bazelbuild/bazel#10634 in a later release), so over gRPC it can only use a namespace that
/// anonymous callers may write: the server lets them read and write
/// `bazel` (nothing else). The other calls carry the key, which the
/// server must accept (a wrong key is refused, never anonymous). Keys
/// on every call are tested with store-grpc's own REAPI client.
#[test]
fn bazel_over_grpc_with_sha256_second_build_is_all_remote_hits() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(dir.path(), "\"read:bazel\", \"write:bazel\"");
    let remote = vec![
        format!("--remote_cache={}", base.replace("http://", "grpc://")),
        "--remote_instance_name=bazel".to_string(),
        format!("--remote_header=Authorization=Bearer {KEY}"),
    ];
    bazel_twice(dir.path(), &remote);
}

// --- Gradle ------------------------------------------------------------------

/// A tiny Java project whose settings point Gradle's HTTP build cache at
/// `url` (local cache off, push on, the key as Basic credentials).
fn java_project(dir: &Path, url: &str) {
    let src = dir.join("src/main/java/demo");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(dir.join("build.gradle"), "apply plugin: 'java'\n").unwrap();
    std::fs::write(
        dir.join("settings.gradle"),
        format!(
            "rootProject.name = 'demo'\n\
             buildCache {{\n  local {{ enabled = false }}\n  remote(HttpBuildCache) {{\n    \
             url = '{url}'\n    push = true\n    \
             credentials {{ username = 'builder'; password = '{KEY}' }}\n  }}\n}}\n"
        ),
    )
    .unwrap();
    std::fs::write(
        src.join("Greeting.java"),
        "package demo;\n\npublic final class Greeting {\n    \
         public static String of(String name) { return \"hello, \" + name; }\n}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("Main.java"),
        "package demo;\n\npublic final class Main {\n    \
         public static void main(String[] args) { System.out.println(Greeting.of(\"cache\")); }\n}\n",
    )
    .unwrap();
}

/// `gradle compileJava` with a fresh user home (`round`'s own) and no
/// build directory; Gradle's plain console output.
fn gradle_build(dir: &Path, round: usize) -> String {
    let project = dir.join("project");
    let _ = std::fs::remove_dir_all(project.join("build"));
    let _ = std::fs::remove_dir_all(project.join(".gradle"));
    let out = match Command::new("gradle")
        .current_dir(&project)
        .env("GRADLE_USER_HOME", dir.join(format!("gradle-home-{round}")))
        .env_remove("GRADLE_OPTS")
        .env_remove("JAVA_OPTS")
        // Not `--offline`: it turns the remote build cache off. The
        // project declares no repository, so nothing resolves; any
        // download would go to a proxy that is not there (the JVM's
        // default non-proxy hosts keep loopback direct).
        .args([
            "-Dhttp.proxyHost=127.0.0.1",
            "-Dhttp.proxyPort=9",
            "-Dhttps.proxyHost=127.0.0.1",
            "-Dhttps.proxyPort=9",
            "--no-daemon",
            "--build-cache",
            "--console=plain",
            "compileJava",
        ])
        .output()
    {
        Ok(out) => out,
        Err(e) => panic!("cannot run gradle ({e}): apt-get install gradle; .ci/run does it"),
    };
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "gradle failed ({}):\n{text}",
        out.status
    );
    assert!(
        project
            .join("build/classes/java/main/demo/Main.class")
            .exists(),
        "{text}"
    );
    text
}

#[test]
fn gradle_second_build_compile_java_is_from_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(dir.path(), "");
    java_project(
        &dir.path().join("project"),
        &format!("{base}/cache/gradle/"),
    );
    let first = gradle_build(dir.path(), 0);
    assert!(
        first.lines().any(|l| l.trim() == ":compileJava"),
        "the first build compiles:\n{first}"
    );
    let m = metrics(&base, ADMIN_KEY);
    let puts = metric(&m, "blobpool_cache_puts_total{namespace=\"gradle\"}");
    assert!(
        puts >= 1.0,
        "the first build stored its outputs:\n{first}\n{m}"
    );
    let second = gradle_build(dir.path(), 1);
    assert!(
        second
            .lines()
            .any(|l| l.trim() == ":compileJava FROM-CACHE"),
        "the second build's compileJava comes from the remote cache:\n{second}"
    );
    for text in [&first, &second] {
        assert!(
            !text.contains("Could not")
                && !text.contains("disabled")
                && !text.contains("no build caches"),
            "Gradle reported a build-cache failure:\n{text}"
        );
    }
}
