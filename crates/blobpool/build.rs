//! Records the git commit the binary is built from, for
//! `blobpool_build_info{git}` on `/metrics` and `blobpool --version`
//! (`BUILD_VERSION`: `0.1.0 (commit 0123456789ab)`). Built without git or
//! outside a checkout (a source tarball; the container build, whose context
//! leaves `.git` out) it records `BLOBPOOL_BUILD_COMMIT` if that is set (hex
//! digits), else nothing, and never fails: `BUILD_GIT_COMMIT` is then empty
//! and `BUILD_VERSION` the crate's version alone.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `git -C dir ARGS`'s trimmed output, if it ran and succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Reruns this script when `path` (a file of the git directory) changes;
/// only existing files (a missing one would rerun it on every build).
fn watch(dir: &Path, git_path: &str) {
    if let Some(p) = git(dir, &["rev-parse", "--git-path", git_path]) {
        let p = dir.join(p);
        if p.exists() {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    // Outside a checkout (the Dockerfile's context has no .git), the
    // builder may say which commit it is: BLOBPOOL_BUILD_COMMIT.
    println!("cargo:rerun-if-env-changed=BLOBPOOL_BUILD_COMMIT");
    let from_git = git(&dir, &["rev-parse", "--short=12", "HEAD"]);
    let commit = from_git
        .clone()
        .or_else(|| std::env::var("BLOBPOOL_BUILD_COMMIT").ok())
        .filter(|c| c.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_default();
    if from_git.is_some() {
        // A new commit or checkout moves HEAD or the branch it names.
        watch(&dir, "HEAD");
        if let Some(branch) = git(&dir, &["symbolic-ref", "-q", "HEAD"]) {
            watch(&dir, &branch);
        }
        watch(&dir, "packed-refs");
    } else if let Some(git) = dir.ancestors().map(|a| a.join(".git")).find(|g| g.exists()) {
        // In a checkout where git failed (a ref being rewritten, a lock
        // held): run again once the checkout moves, instead of keeping
        // the empty commit for good.
        let head = git.join("HEAD");
        let watched = if head.exists() { head } else { git };
        println!("cargo:rerun-if-changed={}", watched.display());
    }
    println!("cargo:rustc-env=BUILD_GIT_COMMIT={commit}");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let version = match commit.as_str() {
        "" => version,
        c => format!("{version} (commit {c})"),
    };
    println!("cargo:rustc-env=BUILD_VERSION={version}");
}
