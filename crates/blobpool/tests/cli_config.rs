//! The `blobpool` binary's configuration: human units, errors that name
//! where a bad value came from, `--data-dir`, `serve`'s store flags and
//! the one-line store description `serve` logs.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{blobpool_in as cmd, ServeChild};

fn run(c: &mut Command) -> Output {
    c.output().expect("the binary runs")
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
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A configuration error: exit 1 and one stderr line `blobpool: config:
/// <prefix>…`; returns the line.
fn config_error(o: Output, prefix: &str) -> String {
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err:?}");
    assert!(
        lines[0].starts_with(&format!("blobpool: config: {prefix}")),
        "{err:?}"
    );
    lines[0].to_string()
}

fn write(dir: &Path, name: &str, data: &[u8]) {
    std::fs::write(dir.join(name), data).unwrap();
}

/// Starts `blobpool serve ARGS --listen 127.0.0.1:0` with info logs and
/// returns it with the stderr lines printed before `listening on`.
fn serve(c: &mut Command, args: &[&str]) -> (ServeChild, Vec<String>) {
    let s = common::serve_lines(
        c.arg("serve")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info"),
    )
    .unwrap_or_else(|seen| panic!("serve ended before listening:\n{seen}"));
    (s.child, s.startup)
}

fn store_line(lines: &[String]) -> String {
    let found: Vec<&String> = lines.iter().filter(|l| l.contains(" store: ")).collect();
    assert_eq!(found.len(), 1, "one store line expected: {lines:#?}");
    let line = found[0];
    line[line.find("store: ").unwrap()..].to_string()
}

#[test]
fn data_dir_moves_the_default_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "big", &vec![7u8; 100_000]);
    write(d, "small", b"hello");
    let digest = ok(run(cmd(d).args(["--data-dir", "pool", "put", "big"])));
    ok(run(cmd(d).args(["--data-dir", "pool", "put", "small"])));
    assert!(d.join("pool/kv.sqlite").is_file());
    assert!(d.join("pool/large").is_dir());
    assert!(!d.join("blobpool-data").exists());
    // The environment and the config key find the same store.
    let stat = ok(run(cmd(d)
        .env("BLOBPOOL_DATA_DIR", "pool")
        .args(["stat", &digest, "--json"])));
    assert!(stat.contains("\"large\""), "{stat}");
    write(d, "blobpool.toml", b"data_dir = \"pool\"\n");
    ok(run(cmd(d).args(["has", &digest])));
    // The flag wins over the file.
    let o = run(cmd(d).args(["--data-dir", "other", "has", &digest]));
    assert!(ok(o).ends_with("absent"));
    assert!(d.join("other/kv.sqlite").is_file());
}

#[test]
fn data_dir_with_an_explicit_kv_is_an_error_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "blobpool.toml",
        b"# the kv\nkv = \"sqlite://kv.sqlite\"\n",
    );
    let line = config_error(
        run(cmd(d).args(["--data-dir", "pool", "ls"])),
        "flag --data-dir: data_dir has no effect because kv is set \
         (config file blobpool.toml:2:6: kv)",
    );
    assert!(line.contains("file://DIR/large"), "{line}");
    config_error(
        run(cmd(d).env("BLOBPOOL_DATA_DIR", "pool").args(["ls"])),
        "environment BLOBPOOL_DATA_DIR: data_dir has no effect",
    );
    assert!(!d.join("pool").exists());
}

#[test]
fn bad_values_name_their_file_line_env_variable_or_flag() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(d, "pool.toml", b"kv = \"mem://\"\nwindow = \"soon\"\n");
    config_error(
        run(cmd(d).args(["--config", "pool.toml", "sweep"])),
        "config file pool.toml:2:10: window: \"soon\"",
    );
    // toml's own errors, on one line with the place.
    write(d, "pool.toml", b"kv = \"mem://\"\nthreshhold = 5\n");
    config_error(
        run(cmd(d).args(["--config", "pool.toml", "sweep"])),
        "config file pool.toml:2:1: unknown field `threshhold`",
    );
    write(d, "pool.toml", b"kv = \"mem://\"\n");
    config_error(
        run(cmd(d)
            .env("BLOBPOOL_THRESHOLD", "lots")
            .args(["--config", "pool.toml", "sweep"])),
        "environment BLOBPOOL_THRESHOLD: \"lots\" is not a size",
    );
    config_error(
        run(cmd(d)
            .env("BLOBPOOL_KV", "redis://u:hunter2@h/0")
            .args(["sweep"])),
        "environment BLOBPOOL_KV: unsupported kv URL \"redis://u:***@h/0\"",
    );
    // A flag wins over the environment, and its error names it.
    config_error(
        run(cmd(d).env("BLOBPOOL_MODE", "kv-only").args([
            "serve",
            "--kv",
            "mem://",
            "--mode",
            "dual-tier",
        ])),
        "flag --mode: mode dual-tier needs a large tier, but kv is set (flag --kv)",
    );
    // serve's flags; checked before anything listens or opens.
    for (args, prefix) in [
        (
            &["--threshold", "big"][..],
            "flag --threshold: \"big\" is not a size",
        ),
        (&["--window", "forever"], "flag --window: \"forever\""),
        (
            &["--fleet=maybe"],
            "flag --fleet: \"maybe\": expected true or false",
        ),
        (&["--mode", "fast"], "flag --mode: unknown mode \"fast\""),
    ] {
        config_error(run(cmd(d).arg("serve").args(args)), prefix);
    }
}

#[test]
fn human_units_work_in_the_file_and_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(
        d,
        "blobpool.toml",
        b"kv = \"sqlite://kv.sqlite\"\nthreshold = \"1KiB\"\nwindow = \"1h\"\npin_ttl = \"15m\"\n",
    );
    write(d, "ok", &[1u8; 1024]);
    write(d, "over", &[2u8; 1025]);
    ok(run(cmd(d).args(["put", "ok"])));
    // kv-only (kv set, large not): the threshold is the size limit.
    let o = run(cmd(d).args(["put", "over"]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let o = run(cmd(d)
        .env("BLOBPOOL_THRESHOLD", "2 KiB")
        .args(["put", "over"]));
    ok(o);
}

#[test]
fn serve_logs_the_store_shape_and_its_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Default: the embedded store under --data-dir.
    let (child, lines) = serve(cmd(d).args(["--data-dir", "pool"]), &[]);
    drop(child);
    assert_eq!(
        store_line(&lines),
        "store: kv sqlite pool/kv.sqlite, large file pool/large, dual-tier above 64 KiB, not fleet"
    );
    // kv alone: no large tier, said so.
    write(d, "blobpool.toml", b"threshold = 100\nwindow = 5\n");
    let (child, lines) = serve(
        cmd(d).env("BLOBPOOL_THRESHOLD", "200"),
        &["--kv", "sqlite://kv.sqlite", "--threshold", "2KiB"],
    );
    drop(child);
    assert_eq!(
        store_line(&lines),
        "store: kv sqlite kv.sqlite, no large tier: kv-only, blobs above 2 KiB are refused, \
         not fleet"
    );
    // Every store flag over the environment and the file.
    let (child, lines) = serve(
        cmd(d)
            .env("BLOBPOOL_LARGE", "none")
            .env("BLOBPOOL_MODE", "kv-only"),
        &[
            "--kv",
            "mem://",
            "--large",
            "mem://",
            "--mode",
            "dual-tier",
            "--threshold",
            "1MiB",
            "--window",
            "10m",
            "--max-blob-size",
            "4GiB",
            "--fleet=false",
        ],
    );
    drop(child);
    assert_eq!(
        store_line(&lines),
        "store: kv mem (in memory, lost on exit), large mem (in memory, lost on exit), \
         dual-tier above 1 MiB, not fleet"
    );
}

#[test]
fn help_lists_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let help = ok(run(cmd(dir.path()).args(["serve", "--help"])));
    for flag in [
        "--kv <URL>",
        "--large <URL>",
        "--mode <MODE>",
        "--threshold <SIZE>",
        "--fleet[=<BOOL>]",
        "--window <DURATION>",
        "--max-blob-size <SIZE>",
        "--data-dir <DIR>",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
    // --data-dir is global; the store flags are serve's own.
    let help = ok(run(cmd(dir.path()).args(["put", "--help"])));
    assert!(help.contains("--data-dir <DIR>"), "{help}");
    assert!(!help.contains("--threshold"), "{help}");
}

/// A `BLOBPOOL_*` variable no setting reads stops the binary with its
/// name and the nearest real one (issue 31); a section variable applies.
#[test]
fn unknown_environment_variables_are_refused_and_section_ones_apply() {
    let dir = tempfile::tempdir().unwrap();
    let o = run(cmd(dir.path())
        .env("BLOBPOOL_LIMIT_IDLE_TIMEOUT", "5s")
        .args(["--data-dir", "d", "ls"]));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(e.contains("environment BLOBPOOL_LIMIT_IDLE_TIMEOUT"), "{e}");
    assert!(e.contains("BLOBPOOL_LIMITS_IDLE_TIMEOUT"), "{e}");
    let o = run(cmd(dir.path())
        .env("BLOBPOOL_LIMITS_IDLE_TIMEOUT", "soon")
        .args(["--data-dir", "d", "serve"]));
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("environment BLOBPOOL_LIMITS_IDLE_TIMEOUT: limits.idle_timeout"),
        "{e}"
    );
}
