//! `cargo xtask tidy` (alias `arch`): the invariants of
//! docs/ARCHITECTURE.md that a program can check, checked rather than only
//! written down. `cargo xtask ci` runs it first.
//!
//! From `cargo metadata --format-version 1 --no-deps` (so renamed,
//! target-specific and inherited dependencies count as cargo sees them):
//!
//! - `store-types` depends on no workspace crate;
//! - `store-gc`, `store-layers` and every engine crate (the crates
//!   `store-registry` registers, see [`engines`])
//!   depend on `store-types` only; the two PostgreSQL engines,
//!   `store-postgres` and `store-pglo`, may also use `store-pg`, their
//!   shared internals (not an engine), which depends on `store-types` only;
//! - `store-registry` depends on `store-types` and engine crates only
//!   (never `store-core`, `store-gc` or `store-ops`);
//! - `store-core` depends on `store-types` and `store-gc`, `store-ops` on
//!   those and `store-core`, `store-http` on those and `store-ops` (so
//!   `store-ops` never depends on its HTTP binding); none names an engine
//!   crate in any dependency table (dev-dependencies included) or in its
//!   sources;
//! - `store-grpc` (the gRPC binding) depends on those and `store-ops`
//!   too, never on `store-http` or an engine; its tests build a real
//!   store, so its dev-dependencies may name engines.
//!
//! These rules cover normal and build dependencies (engine crates' tests
//! may use what they like). A crate the rules name but the workspace does
//! not have yet is skipped; a workspace crate no rule names is not
//! restricted.
//!
//! From the sources and manifests of every workspace member:
//!
//! - no test is `#[ignore]`d (a test that does not run proves nothing;
//!   measurements are examples or benches) or `#[should_panic]` (a test
//!   asserts on the outcome it expects, message included);
//! - every member opts into the shared lints (`[lints] workspace = true`,
//!   read from its manifest: cargo metadata does not report lints), and
//!   the root manifest has `[workspace.lints]`;
//! - code comments (and the top-level docs) cite only ADRs that exist:
//!   `ADR-NNN` must have a file `docs/adr/ADR-NNN-*.md`, or be one of the
//!   earlier, upstream-only ADRs that `docs/adr/ADR-012-summary.md` lists
//!   under its heading "Earlier ADRs" (ADR-012 ruled over them).
//!
//! From the `src/` folder of every engine crate (docs/ENGINES.md, "The
//! rooms of an engine crate"):
//!
//! - it has `lib.rs`, `engine.rs` and `registration.rs`;
//! - every other top-level file is one of the rooms ([`ROOMS`]: `reader.rs`,
//!   `stage.rs`, `error.rs`, …) or one of the crate's own extras
//!   ([`room_extras`]), and every folder is `testing/` or `tests/`; so a
//!   `readers.rs` or an `errors.rs` fails, naming the room it should be.
//!
//! From the documents (README.md, docs/, docs/adr/, deploy/; `docs.rs`):
//!
//! - every repository path they name in backticks exists;
//! - docs/ENGINES.md's rooms table lists exactly the rooms above, and
//!   names every engine's extras.
//!
//! From the sources of every crate but the test and measurement ones
//! (`fns.rs`): no function outside tests spans more than 80 lines.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Workspace crates that are never engines, whatever depends on them.
const NOT_ENGINES: [&str; 11] = [
    "store-types",
    "store-gc",
    "store-core",
    "store-ops",
    "store-http",
    "store-grpc",
    "store-layers",
    "store-pg",
    "store-registry",
    "tests-contract",
    "blobpool",
];

/// The engine crates: the workspace crates `store-registry` registers (its
/// dependencies, every table), so a new engine is one registry line and
/// tidy knows it. Crates of [`NOT_ENGINES`] never count (a registry
/// depending on one is a violation of its own rule).
pub fn engines(crates: &[Crate]) -> Vec<String> {
    let names: BTreeSet<&str> = crates.iter().map(|c| c.name.as_str()).collect();
    let Some(registry) = crates.iter().find(|c| c.name == "store-registry") else {
        return Vec::new();
    };
    let mut out: Vec<String> = registry
        .deps
        .iter()
        .map(|(d, _)| d.clone())
        .filter(|d| names.contains(d.as_str()) && !NOT_ENGINES.contains(&d.as_str()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// What a workspace crate may depend on.
struct Rule {
    /// The workspace crates its normal and build dependencies may name.
    allowed: Vec<String>,
    /// Whether it must name no engine anywhere: no dependency table
    /// (dev-dependencies included), no source file.
    names_no_engine: bool,
}

fn rule(krate: &str, engines: &[String]) -> Option<Rule> {
    let rule = |allowed: &[&str], names_no_engine| Rule {
        allowed: allowed.iter().map(|a| a.to_string()).collect(),
        names_no_engine,
    };
    let only = |allowed: &[&str]| rule(allowed, false);
    Some(match krate {
        "store-types" => only(&[]),
        "store-gc" | "store-layers" => only(&["store-types"]),
        "store-pg" => only(&["store-types"]),
        "store-registry" => {
            let mut allowed = only(&["store-types"]);
            allowed.allowed.extend(engines.iter().cloned());
            allowed
        }
        "store-core" => rule(&["store-types", "store-gc"], true),
        "store-ops" => rule(&["store-types", "store-gc", "store-core"], true),
        "store-http" => rule(
            &["store-types", "store-gc", "store-core", "store-ops"],
            true,
        ),
        "store-grpc" => only(&["store-types", "store-gc", "store-core", "store-ops"]),
        "store-postgres" | "store-pglo" => only(&["store-types", "store-pg"]),
        e if engines.iter().any(|n| n == e) => only(&["store-types"]),
        _ => return None,
    })
}

/// The crates the rules must find, or the check would check nothing.
const REQUIRED: [&str; 4] = ["store-types", "store-gc", "store-core", "store-ops"];

/// A dependency table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Normal,
    Dev,
    Build,
}

impl Kind {
    fn table(self) -> &'static str {
        match self {
            Kind::Normal => "[dependencies]",
            Kind::Dev => "[dev-dependencies]",
            Kind::Build => "[build-dependencies]",
        }
    }
}

/// A workspace member, as cargo metadata describes it.
#[derive(Debug)]
pub struct Crate {
    name: String,
    manifest: PathBuf,
    /// Every declared dependency: its package name (not its rename) and
    /// its table.
    deps: Vec<(String, Kind)>,
}

impl Crate {
    fn dir(&self) -> &Path {
        self.manifest.parent().unwrap_or(Path::new("."))
    }
}

/// The workspace members of `cargo metadata --format-version 1` output.
pub fn crates_from_metadata(json: &str) -> Result<Vec<Crate>, String> {
    let v: Value = serde_json::from_str(json).map_err(|e| format!("cargo metadata: {e}"))?;
    let members: BTreeSet<&str> = v["workspace_members"]
        .as_array()
        .ok_or("cargo metadata: no workspace_members")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut out = Vec::new();
    for p in v["packages"]
        .as_array()
        .ok_or("cargo metadata: no packages")?
    {
        if !p["id"].as_str().is_some_and(|id| members.contains(id)) {
            continue;
        }
        let field = |k: &str| {
            p[k].as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("cargo metadata: a package without {k}"))
        };
        let deps = p["dependencies"]
            .as_array()
            .map(|ds| {
                ds.iter()
                    .filter_map(|d| {
                        let kind = match d["kind"].as_str() {
                            None => Kind::Normal,
                            Some("dev") => Kind::Dev,
                            Some("build") => Kind::Build,
                            Some(_) => return None,
                        };
                        Some((d["name"].as_str()?.to_string(), kind))
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push(Crate {
            name: field("name")?,
            manifest: PathBuf::from(field("manifest_path")?),
            deps,
        });
    }
    Ok(out)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target" && n != "fuzz") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn shown(root: &Path, p: &Path) -> String {
    p.strip_prefix(root).unwrap_or(p).display().to_string()
}

/// Every file of `dir`'s tree whose name ends in `.rs`, with its text.
fn sources(dir: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            Ok((f, text))
        })
        .collect()
}

/// Who depends on whom, and the facade's sources.
fn dependency_violations(root: &Path, crates: &[Crate]) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    let names: BTreeSet<&str> = crates.iter().map(|c| c.name.as_str()).collect();
    for required in REQUIRED {
        if !names.contains(required) {
            return Err(format!(
                "cargo metadata lists no {required}: the architecture rules would check nothing"
            ));
        }
    }
    let engines = engines(crates);
    for c in crates {
        let Some(rule) = rule(&c.name, &engines) else {
            continue;
        };
        for (dep, kind) in &c.deps {
            if !names.contains(dep.as_str()) {
                continue;
            }
            if *kind != Kind::Dev && !rule.allowed.contains(dep) {
                bad.push(format!(
                    "{} {} names {dep}; it may name only {:?}",
                    c.name,
                    kind.table(),
                    rule.allowed
                ));
            } else if *kind == Kind::Dev && rule.names_no_engine && engines.contains(dep) {
                bad.push(format!(
                    "{} {} names the engine {dep}: its engine-backed tests belong in \
                     tests-contract or crates/blobpool",
                    c.name,
                    kind.table()
                ));
            }
        }
        if rule.names_no_engine {
            for (f, src) in sources(c.dir())? {
                for engine in &engines {
                    let ident = engine.replace('-', "_");
                    let pats = [
                        format!("{ident}::"),
                        format!("use {ident}"),
                        format!("extern crate {ident}"),
                    ];
                    if let Some(pat) = pats.iter().find(|p| src.contains(p.as_str())) {
                        bad.push(format!(
                            "{} names the engine crate {engine} (`{pat}`)",
                            shown(root, &f)
                        ));
                    }
                }
            }
        }
    }
    Ok(bad)
}

/// `#[ignore]`d and `#[should_panic]` tests.
fn ignore_violations(root: &Path, crates: &[Crate]) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    for c in crates {
        for (f, src) in sources(c.dir())? {
            for (i, line) in src.lines().enumerate() {
                let t = line.trim_start();
                let ignored = t.starts_with("#[ignore")
                    || (t.starts_with("#[cfg_attr") && t.contains("ignore"));
                if ignored {
                    bad.push(format!(
                        "{}:{}: an #[ignore]d test (run it, or make it an example or a bench)",
                        shown(root, &f),
                        i + 1
                    ));
                }
                if t.starts_with("#[should_panic") {
                    bad.push(format!(
                        "{}:{}: a #[should_panic] test (assert on the outcome: catch_unwind \
                         and check the message)",
                        shown(root, &f),
                        i + 1
                    ));
                }
            }
        }
    }
    Ok(bad)
}

fn parse_toml(path: &Path) -> Result<toml::Table, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Members that do not share the workspace lints.
fn lint_violations(root: &Path, crates: &[Crate]) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    let manifest = parse_toml(&root.join("Cargo.toml"))?;
    let has_lints = manifest
        .get("workspace")
        .and_then(|w| w.get("lints"))
        .and_then(|l| l.as_table())
        .is_some_and(|l| !l.is_empty());
    if !has_lints {
        bad.push("Cargo.toml has no [workspace.lints]".to_string());
    }
    for c in crates {
        let m = parse_toml(&c.manifest)?;
        let shared = m
            .get("lints")
            .and_then(|l| l.get("workspace"))
            .and_then(|w| w.as_bool())
            == Some(true);
        if !shared {
            bad.push(format!(
                "{}: {} does not share the workspace lints (add `[lints]\\nworkspace = true`)",
                shown(root, &c.manifest),
                c.name
            ));
        }
    }
    Ok(bad)
}

/// The ADR numbers cited in `text` (`ADR-` and three digits).
fn adr_citations(text: &str) -> Vec<u16> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("ADR-") {
        let start = i + at + 4;
        let digits = &b[start..(start + 3).min(b.len())];
        if digits.len() == 3 && digits.iter().all(u8::is_ascii_digit) {
            let next_is_digit = b.get(start + 3).is_some_and(u8::is_ascii_digit);
            if !next_is_digit {
                out.push(text[start..start + 3].parse().expect("three digits"));
            }
        }
        i = start;
    }
    out
}

/// The ADRs that may be cited: those with a file in docs/adr/, and the
/// earlier ones the ADR-012 summary lists.
fn citable_adrs(root: &Path) -> Result<BTreeSet<u16>, String> {
    let dir = root.join("docs").join("adr");
    let mut ok = BTreeSet::new();
    let mut summary = None;
    for e in std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        if let Some(n) = name
            .strip_prefix("ADR-")
            .and_then(|r| r.get(..3))
            .and_then(|d| d.parse::<u16>().ok())
        {
            ok.insert(n);
            if n == 12 {
                summary = Some(e.path());
            }
        }
    }
    if let Some(s) = summary {
        let text = std::fs::read_to_string(&s).map_err(|e| format!("{}: {e}", s.display()))?;
        let mut in_list = false;
        for line in text.lines() {
            if line.starts_with('#') {
                in_list = line.contains("Earlier ADRs");
            } else if in_list && line.trim_start().starts_with("- ") {
                ok.extend(adr_citations(line).first());
            }
        }
    }
    Ok(ok)
}

/// Citations of ADRs that do not exist, in code comments and the
/// top-level docs.
fn adr_violations(root: &Path, crates: &[Crate]) -> Result<Vec<String>, String> {
    let ok = citable_adrs(root)?;
    let mut bad = Vec::new();
    let mut check = |file: &Path, text: &str, comments_only: bool| {
        for (i, line) in text.lines().enumerate() {
            let cited = if comments_only {
                line.find("//").map(|at| &line[at..]).unwrap_or("")
            } else {
                line
            };
            for n in adr_citations(cited) {
                if !ok.contains(&n) {
                    bad.push(format!(
                        "{}:{}: cites ADR-{n:03}, which has no file in docs/adr/ and is not \
                         among the earlier ADRs listed in docs/adr/ADR-012-summary.md",
                        shown(root, file),
                        i + 1
                    ));
                }
            }
        }
    };
    for c in crates {
        for (f, src) in sources(c.dir())? {
            check(&f, &src, true);
        }
    }
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    docs.push(root.join("README.md"));
    docs.sort();
    for d in docs
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
    {
        if let Ok(text) = std::fs::read_to_string(d) {
            check(d, &text, false);
        }
    }
    Ok(bad)
}

/// The files every engine crate's `src/` has.
const ROOMS_REQUIRED: [&str; 3] = ["lib.rs", "engine.rs", "registration.rs"];

/// The top-level files an engine crate's `src/` may have, each where the
/// engine has the concern (docs/ENGINES.md, "The rooms of an engine
/// crate").
pub const ROOMS: [&str; 16] = [
    "lib.rs",
    "engine.rs",
    "registration.rs",
    "reader.rs",
    "stage.rs",
    "writer.rs",
    "error.rs",
    "testing.rs",
    "refs.rs",
    "cache_keys.rs",
    "window.rs",
    "instance_lock.rs",
    "seam.rs",
    "crash.rs",
    "schema.rs",
    "tests.rs",
];

/// The folders an engine crate's `src/` may have: submodules of its
/// `testing.rs` and `tests.rs` rooms.
const ROOM_DIRS: [&str; 2] = ["testing", "tests"];

/// The files of one engine beyond [`ROOMS`]: concerns only it has.
fn room_extras(krate: &str) -> &'static [&'static str] {
    match krate {
        "store-sqlite" => &[
            "sql.rs",
            "cache.rs",
            "cache_tests.rs",
            "nowait.rs",
            "nowait_tests.rs",
            "vfs_forward.rs",
        ],
        "store-local" => &["fsio.rs", "cache.rs", "stream.rs"],
        "store-postgres" => &["batch.rs", "fence.rs", "fleet.rs", "policy.rs"],
        "store-object" => &["url.rs"],
        _ => &[],
    }
}

/// The room a common misnaming should be.
fn room_for(name: &str) -> Option<&'static str> {
    Some(match name {
        "readers.rs" | "read.rs" => "reader.rs",
        "errors.rs" | "err.rs" => "error.rs",
        "writers.rs" | "write.rs" => "writer.rs",
        "staged.rs" | "stages.rs" => "stage.rs",
        "registry.rs" => "registration.rs",
        "test.rs" => "tests.rs",
        _ => return None,
    })
}

/// Engine crates whose `src/` strays from the room names.
fn room_violations(root: &Path, crates: &[Crate]) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    let engines = engines(crates);
    for c in crates.iter().filter(|c| engines.contains(&c.name)) {
        let src = c.dir().join("src");
        let read = std::fs::read_dir(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        let mut entries = Vec::new();
        for entry in read {
            let entry = entry.map_err(|e| format!("{}: {e}", src.display()))?;
            let is_dir = entry
                .file_type()
                .map_err(|e| format!("{}: {e}", src.display()))?
                .is_dir();
            entries.push((entry.file_name().to_string_lossy().into_owned(), is_dir));
        }
        entries.sort();
        for need in ROOMS_REQUIRED {
            if !entries.iter().any(|(n, d)| n == need && !d) {
                bad.push(format!(
                    "{} has no {need} (every engine crate has {}; docs/ENGINES.md)",
                    shown(root, &src),
                    ROOMS_REQUIRED.join(", ")
                ));
            }
        }
        let extras = room_extras(&c.name);
        for (name, is_dir) in &entries {
            let allowed = if *is_dir {
                ROOM_DIRS.contains(&name.as_str())
            } else {
                ROOMS.contains(&name.as_str()) || extras.contains(&name.as_str())
            };
            if allowed {
                continue;
            }
            let hint = match room_for(name) {
                Some(room) => format!("the room is named {room}"),
                None => format!(
                    "use a room of docs/ENGINES.md, or add it to {}'s extras in xtask/src/tidy.rs",
                    c.name
                ),
            };
            bad.push(format!(
                "{}{}: not a room of an engine crate ({hint})",
                shown(root, &src.join(name)),
                if *is_dir { "/" } else { "" }
            ));
        }
    }
    Ok(bad)
}

/// Every violation under `root`, given its `cargo metadata` output.
pub fn violations(root: &Path, metadata: &str) -> Result<Vec<String>, String> {
    let crates = crates_from_metadata(metadata)?;
    let mut bad = dependency_violations(root, &crates)?;
    bad.extend(ignore_violations(root, &crates)?);
    bad.extend(lint_violations(root, &crates)?);
    bad.extend(adr_violations(root, &crates)?);
    bad.extend(room_violations(root, &crates)?);
    bad.extend(docs::rooms_violations(root, &engines(&crates)));
    bad.extend(docs::path_violations(root));
    bad.extend(settings::violations(root));
    bad.extend(names::violations(root));
    bad.extend(fns::violations(root, &crates)?);
    Ok(bad)
}

/// `cargo metadata --format-version 1 --no-deps` of the workspace.
fn metadata(root: &Path) -> Result<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--manifest-path",
        ])
        .arg(root.join("Cargo.toml"))
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("cargo metadata: {e}"))
}

/// Fails listing every violation.
pub fn check() -> Result<(), String> {
    let root = crate::workspace_root();
    let bad = violations(&root, &metadata(&root)?)?;
    if bad.is_empty() {
        eprintln!("xtask: tidy: the architecture invariants hold");
        Ok(())
    } else {
        Err(format!(
            "tidy: {} invariant(s) broken (docs/ARCHITECTURE.md, xtask/src/tidy.rs):\n  {}",
            bad.len(),
            bad.join("\n  ")
        ))
    }
}

mod docs;
mod fns;
mod names;
mod settings;
#[cfg(test)]
mod tests;
