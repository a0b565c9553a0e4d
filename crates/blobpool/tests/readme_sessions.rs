//! README.md's curl sessions, run as written (ADR-067): every `$ `
//! command of the README's `sh` blocks that use curl, in order, in one
//! `sh` against `blobpool serve` started in an empty directory, with a
//! `PATH` holding only the built binary, curl and the few POSIX tools the
//! sessions name (so a tool a fresh machine lacks, such as `b3sum`, fails
//! the test). Only the address differs: the README's
//! `http://127.0.0.1:7070` becomes the test server's. Each command's
//! output must match the lines the README prints under it, where `…`
//! stands for any text and `<64 hex>` for a digest.

mod common;

use std::path::Path;
use std::process::Command;

use common::ServeChild;

/// The tools a fresh machine has besides the binary and curl.
const TOOLS: &[&str] = &["sh", "curl", "echo", "head", "tail", "cut", "tee", "grep"];

/// One README command and the output the README shows for it.
struct Step {
    command: String,
    expected: Vec<String>,
}

/// The `$ ` commands (with `\` continuation lines) of the `sh` blocks
/// that use curl, and the lines under each.
fn sessions(readme: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    for block in readme.split("```sh\n").skip(1) {
        let block = block.split("```").next().unwrap();
        if !block.contains("$ ") || !block.contains("curl") {
            continue;
        }
        let mut lines = block.lines();
        while let Some(line) = lines.next() {
            if let Some(cmd) = line.strip_prefix("$ ") {
                let mut command = cmd.to_string();
                while command.ends_with('\\') {
                    command.push('\n');
                    command.push_str(lines.next().expect("a continued line"));
                }
                steps.push(Step {
                    command,
                    expected: Vec::new(),
                });
            } else {
                let step = steps.last_mut().expect("output follows a command");
                step.expected.push(line.to_string());
            }
        }
    }
    steps
}

/// Whether `line` matches `pattern` (`…`: any text, `<64 hex>`: a digest).
fn matches(pattern: &str, line: &str) -> bool {
    let Some((head, rest)) = pattern.split_once(['…', '<']) else {
        return pattern == line;
    };
    let Some(line) = line.strip_prefix(head) else {
        return false;
    };
    let wild = &pattern[head.len()..];
    if let Some(after) = wild.strip_prefix("<64 hex>") {
        let hex = line.len() >= 64 && line.as_bytes()[..64].iter().all(u8::is_ascii_hexdigit);
        return hex && matches(after, &line[64..]);
    }
    if !wild.starts_with('…') {
        // A literal `<`.
        return line.starts_with('<') && matches(rest, &line[1..]);
    }
    let after = &wild['…'.len_utf8()..];
    (0..=line.len())
        .filter(|&i| line.is_char_boundary(i))
        .any(|i| matches(after, &line[i..]))
}

/// `blobpool serve` on a free loopback port in `dir`, and its address.
fn serve(bin: &Path, dir: &Path) -> (ServeChild, String) {
    common::serve_command(
        Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .current_dir(dir)
            .env_clear()
            .env("BLOBPOOL_WINDOW", "0s"),
    )
}

/// `PATH` for the sessions: the binary, curl and [`TOOLS`], nothing else.
fn bare_path(root: &Path, bin: &Path) -> std::path::PathBuf {
    let dir = root.join("bin");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(bin, dir.join("blobpool")).unwrap();
    for tool in TOOLS {
        let found = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{tool} is installed"));
        std::os::unix::fs::symlink(found, dir.join(tool)).unwrap();
    }
    dir
}

#[test]
fn the_readme_curl_sessions_run_as_written() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let steps = sessions(&readme);
    assert!(steps.len() >= 15, "the README's sessions: {}", steps.len());
    assert!(steps.iter().any(|s| s.command.contains("uploads")));
    let bin = Path::new(env!("CARGO_BIN_EXE_blobpool"));
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("server");
    let work = root.path().join("work");
    std::fs::create_dir(&data).unwrap();
    std::fs::create_dir(&work).unwrap();
    let (_server, base) = serve(bin, &data);
    let mut script = String::new();
    for (i, step) in steps.iter().enumerate() {
        let command = step.command.replace("http://127.0.0.1:7070", &base);
        script.push_str(&format!("echo '@@@ {i}'\n{command}\n"));
    }
    script.push_str("echo '@@@ afterwards'\n");
    script.push_str(&AFTERWARDS.replace("BASE", &base));
    let out = Command::new(root.path().join("bin/sh").as_path())
        .args(["-ec", &script])
        .current_dir(&work)
        .env_clear()
        .env("PATH", bare_path(root.path(), bin))
        .output();
    let out = out.unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let (stdout, afterwards) = stdout.split_once("@@@ afterwards\n").unwrap();
    assert_eq!(afterwards, "docs 404\nisos 200\n", "{stderr}");
    let outputs: Vec<&str> = stdout.split("@@@ ").skip(1).collect();
    assert_eq!(outputs.len(), steps.len(), "{stdout}\n{stderr}");
    for (step, output) in steps.iter().zip(outputs) {
        let got: Vec<&str> = output.lines().skip(1).map(|l| l.trim_end()).collect();
        let ok = got.len() == step.expected.len()
            && got.iter().zip(&step.expected).all(|(g, e)| matches(e, g));
        assert!(
            ok,
            "$ {}\nexpected {:#?}\ngot {got:#?}",
            step.command, step.expected
        );
    }
}

/// What the README says of the sessions' namespaces holds: after its
/// reference `docs` is swept, `isos` is not. An entry without token or
/// reference goes from `docs` at the next sweeps (the server runs with a
/// zero delete window) and stays in `isos`.
const AFTERWARDS: &str = r#"
for ns in docs isos; do
  echo -n "no reference in $ns" | curl -s -X PUT --data-binary @- BASE/v1/blobs/$ns > $ns.json
  curl -s -f -X DELETE BASE/v1/tokens/$(cut -d'"' -f4 $ns.json)
done
for i in 1 2; do
  curl -s -f -o /dev/null -X POST -H 'content-type: application/json' -d '{}' BASE/v1/sweep
done
for ns in docs isos; do
  echo "$ns $(curl -s -o /dev/null -w '%{http_code}' BASE/v1/blobs/$ns/$(cut -d'"' -f8 $ns.json))"
done
"#;

#[test]
fn patterns_match_placeholders_only() {
    assert!(matches(
        "{\"token\":\"…\",\"d\":\"<64 hex>\"}",
        &format!("{{\"token\":\"ab\",\"d\":\"{}\"}}", "a".repeat(64))
    ));
    assert!(!matches("<64 hex>", &"g".repeat(64)));
    assert!(!matches("409", "500"));
    assert!(matches("a…b", "ab"));
    assert!(!matches("a…b", "abc"));
}
