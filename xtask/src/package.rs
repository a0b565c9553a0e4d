//! `cargo xtask package [--release]`: the Debian package and the container
//! image, built and run (issue 43, ADR-065).
//!
//! Builds the `blobpool` binary (dev profile, or `--release` for a real
//! release), then `deploy/build-deb.sh` (the `.deb`, checked by `lintian`),
//! `deploy/build-image.sh` (the package installed into an `mmdebstrap`
//! Debian root, made an image by buildah: an OCI archive and a `docker
//! load` archive) and
//! `deploy/check-image.sh` (the image run with `buildah run`: the package's
//! user, owners and modes, `/health`, the HEALTHCHECK, one put and one get,
//! `--version` naming HEAD's commit). The artifacts land in
//! `target/artifacts/`. CI runs it on the dev-profile binary its tests
//! built; a failure of any step fails it.

use std::path::Path;
use std::process::Command;

use crate::{cargo, workspace_root};

/// Runs `cargo xtask package [--release]`.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let profile = match args {
        [] => "debug",
        [flag] if flag == "--release" => "release",
        _ => return Err("usage: cargo xtask package [--release]".into()),
    };
    let mut build = vec!["build", "--locked", "-p", "blobpool"];
    if profile == "release" {
        build.push("--release");
    }
    // Before the build, whose build.rs records HEAD for --version.
    let head = git_head()?;
    cargo(&build)?;
    let root = workspace_root();
    let binary = root.join("target").join(profile).join("blobpool");
    let out = root.join("target").join("artifacts");
    let deploy = root.join("deploy");
    let deb = script(&deploy.join("build-deb.sh"), &[&binary, &out])?;
    // Debian's own package checks; its warnings (the 0640 config, no man
    // page, a Markdown changelog) are printed, its errors fail the step.
    eprintln!("$ lintian --fail-on error {deb}");
    let lintian = Command::new("lintian")
        .args(["--fail-on", "error", &deb])
        .status()
        .map_err(|e| format!("cannot run lintian: {e}"))?;
    if !lintian.success() {
        return Err(format!("lintian found errors in {deb} ({lintian})"));
    }
    let image = script(&deploy.join("build-image.sh"), &[Path::new(&deb), &out])?;
    script(
        &deploy.join("check-image.sh"),
        &[Path::new(&image), Path::new(&head)],
    )?;
    eprintln!("package: {deb}, {image} ({})", out.display());
    Ok(())
}

/// Runs a deploy script; its last line of output (the artifact's name).
fn script(path: &Path, args: &[&Path]) -> Result<String, String> {
    eprintln!(
        "$ {} {}",
        path.display(),
        args.iter()
            .map(|a| a.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = Command::new("bash")
        .arg(path)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", path.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprint!("{stdout}");
    if !out.status.success() {
        return Err(format!("{} failed ({})", path.display(), out.status));
    }
    stdout
        .lines()
        .last()
        .map(str::to_string)
        .ok_or_else(|| format!("{} printed nothing", path.display()))
}

/// HEAD's commit as `blobpool --version` names it (12 hex digits).
fn git_head() -> Result<String, String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(workspace_root())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err("git rev-parse HEAD failed".into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}
