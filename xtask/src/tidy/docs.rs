//! The checks of the documents: the paths they name exist, and
//! docs/ENGINES.md's table of rooms is the one tidy enforces.

use std::collections::BTreeSet;
use std::path::Path;

use super::{room_extras, ROOMS};

/// Where repository paths in the documents start.
const PATH_ROOTS: [&str; 8] = [
    "crates/",
    "docs/",
    "xtask/",
    "bench/",
    "tests-contract/",
    "deploy/",
    "fuzz/",
    ".ci/",
];

/// The text between backticks on each line of `text`, with its line.
pub(super) fn code_spans(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut parts = line.split('`');
        parts.next();
        while let (Some(code), Some(_)) = (parts.next(), parts.next()) {
            out.push((i + 1, code));
        }
    }
    out
}

/// Whether `span` is a concrete repository path (not a pattern such as
/// `crates/store-NAME` or `crates/*/src`).
fn concrete_path(span: &str) -> Option<&str> {
    let path = span.trim_end_matches(['/', '.', ',']);
    let rooted = PATH_ROOTS.iter().any(|r| path.starts_with(r));
    let pattern = path.contains(['*', '{', '<', ' ', '…'])
        || path
            .split(['/', '-', '_', '.'])
            .any(|seg| seg.len() > 1 && seg.chars().all(|c| c.is_ascii_uppercase()));
    (rooted && !pattern).then_some(path)
}

/// The Markdown documents: README.md and every `.md` under docs/ (ADRs
/// included) and deploy/.
fn documents(root: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![root.join("README.md")];
    for dir in ["docs", "docs/adr", "deploy"] {
        if let Ok(read) = std::fs::read_dir(root.join(dir)) {
            let mut md: Vec<_> = read
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "md"))
                .collect();
            md.sort();
            out.extend(md);
        }
    }
    out.into_iter().filter(|p| p.is_file()).collect()
}

/// Repository paths a document names (in backticks) that do not exist.
pub(super) fn path_violations(root: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for doc in documents(root) {
        let Ok(text) = std::fs::read_to_string(&doc) else {
            continue;
        };
        for (line, span) in code_spans(&text) {
            let Some(path) = concrete_path(span) else {
                continue;
            };
            let path = path.split(':').next().unwrap_or(path);
            if !root.join(path).exists() {
                bad.push(format!(
                    "{}:{line}: names `{path}`, which does not exist",
                    super::shown(root, &doc)
                ));
            }
        }
    }
    bad
}

/// docs/ENGINES.md's rooms table against [`ROOMS`], and every engine's
/// extras named there. Nothing to check without the document.
pub(super) fn rooms_violations(root: &Path, engines: &[String]) -> Vec<String> {
    let doc = root.join("docs").join("ENGINES.md");
    let Ok(text) = std::fs::read_to_string(&doc) else {
        return Vec::new();
    };
    let shown = super::shown(root, &doc);
    let documented: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|name| name.ends_with(".rs"))
        .collect();
    let enforced: BTreeSet<&str> = ROOMS.iter().copied().collect();
    let mut bad = Vec::new();
    for room in enforced.difference(&documented) {
        bad.push(format!(
            "{shown}: the rooms table lacks `{room}`, a room tidy allows"
        ));
    }
    for room in documented.difference(&enforced) {
        bad.push(format!(
            "{shown}: the rooms table has `{room}`, which tidy does not allow"
        ));
    }
    let spans: BTreeSet<&str> = code_spans(&text).into_iter().map(|(_, s)| s).collect();
    for engine in engines {
        for extra in room_extras(engine) {
            if !spans.contains(extra) {
                bad.push(format!(
                    "{shown}: {engine}'s extra `{extra}` (allowed by tidy) is not named"
                ));
            }
        }
    }
    bad
}
