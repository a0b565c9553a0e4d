//! `cargo xtask arch`: the architecture invariants of docs/ARCHITECTURE.md,
//! checked rather than only written down (run first by `cargo xtask ci`).
//!
//! - `store-types` depends on no workspace crate;
//! - `store-gc` and every engine crate depend on `store-types` only
//!   (`store-pglo` may also use `store-postgres`'s plumbing);
//! - `store-core` depends on `store-types` and `store-gc` only, and
//!   `store-ops` on those and `store-core`; neither names an engine crate
//!   in any dependency table (dev-dependencies included) or in its sources.

use std::path::{Path, PathBuf};

const ENGINES: [&str; 6] = [
    "store-mem",
    "store-sqlite",
    "store-local",
    "store-postgres",
    "store-pglo",
    "store-object",
];

/// The workspace crates a crate may depend on (normal and build
/// dependencies), and whether its dev-dependencies may name engines.
fn allowed(krate: &str) -> Option<(&'static [&'static str], bool)> {
    Some(match krate {
        "store-types" => (&[], true),
        "store-gc" => (&["store-types"], true),
        "store-pglo" => (&["store-types", "store-postgres"], true),
        e if ENGINES.contains(&e) => (&["store-types"], true),
        "store-core" => (&["store-types", "store-gc"], false),
        "store-ops" => (&["store-types", "store-core"], false),
        _ => return None,
    })
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// The workspace crates named in a dependency table.
fn workspace_deps(table: Option<&toml::Value>) -> Vec<String> {
    table
        .and_then(|t| t.as_table())
        .map(|t| {
            t.keys()
                .filter(|k| k.starts_with("store-"))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every violation, as a line.
pub fn violations(root: &Path) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    let crates = root.join("crates");
    let dirs = std::fs::read_dir(&crates).map_err(|e| format!("{}: {e}", crates.display()))?;
    let mut seen = 0;
    for d in dirs.flatten() {
        let name = d.file_name().to_string_lossy().to_string();
        let Some((ok, dev_may_name_engines)) = allowed(&name) else {
            continue;
        };
        seen += 1;
        let manifest = d.path().join("Cargo.toml");
        let text = std::fs::read_to_string(&manifest)
            .map_err(|e| format!("{}: {e}", manifest.display()))?;
        let doc: toml::Table =
            toml::from_str(&text).map_err(|e| format!("{}: {e}", manifest.display()))?;
        for table in ["dependencies", "build-dependencies"] {
            for dep in workspace_deps(doc.get(table)) {
                if !ok.contains(&dep.as_str()) {
                    bad.push(format!(
                        "{name} [{table}] names {dep}; it may name only {ok:?}"
                    ));
                }
            }
        }
        if !dev_may_name_engines {
            for dep in workspace_deps(doc.get("dev-dependencies")) {
                if ENGINES.contains(&dep.as_str()) {
                    bad.push(format!(
                        "{name} [dev-dependencies] names the engine {dep}: its engine-backed \
                         tests belong in tests-contract or crates/blobpool"
                    ));
                }
            }
            let mut files = Vec::new();
            rust_files(&d.path(), &mut files);
            for f in files {
                let src =
                    std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
                for engine in ENGINES {
                    let ident = engine.replace('-', "_");
                    let pats = [format!("{ident}::"), format!("use {ident}")];
                    if let Some(pat) = pats.iter().find(|p| src.contains(p.as_str())) {
                        bad.push(format!(
                            "{} names the engine crate {engine} (`{pat}`)",
                            f.strip_prefix(root).unwrap_or(&f).display()
                        ));
                    }
                }
            }
        }
    }
    if seen < 9 {
        return Err(format!(
            "found only {seen} of the crates the invariants cover under {}",
            crates.display()
        ));
    }
    Ok(bad)
}

/// Fails listing every violation.
pub fn check() -> Result<(), String> {
    let bad = violations(&workspace_root())?;
    if bad.is_empty() {
        eprintln!("xtask: architecture invariants hold");
        Ok(())
    } else {
        Err(format!(
            "architecture invariants broken (docs/ARCHITECTURE.md):\n  {}",
            bad.join("\n  ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_holds_its_invariants() {
        assert_eq!(violations(&workspace_root()).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_facade_naming_an_engine_is_caught() {
        let dir = tempfile_dir();
        let core = dir.join("crates/store-core/src");
        std::fs::create_dir_all(&core).unwrap();
        std::fs::write(
            dir.join("crates/store-core/Cargo.toml"),
            "[package]\nname = \"store-core\"\n[dependencies]\nstore-types = {}\nstore-sqlite = {}\n\
             [dev-dependencies]\nstore-mem = {}\n",
        )
        .unwrap();
        std::fs::write(core.join("lib.rs"), "use store_local::LocalEngine;\n").unwrap();
        for c in [
            "store-types",
            "store-gc",
            "store-mem",
            "store-sqlite",
            "store-local",
            "store-postgres",
            "store-pglo",
            "store-object",
        ] {
            let d = dir.join("crates").join(c);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("Cargo.toml"), format!("[package]\nname = \"{c}\"\n")).unwrap();
        }
        let bad = violations(&dir).unwrap();
        assert_eq!(bad.len(), 3, "{bad:#?}");
        assert!(
            bad[0].contains("store-core [dependencies] names store-sqlite"),
            "{bad:?}"
        );
        assert!(bad
            .iter()
            .any(|b| b.contains("[dev-dependencies] names the engine store-mem")));
        assert!(bad
            .iter()
            .any(|b| b.contains("names the engine crate store-local")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "xtask-arch-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
