//! No function over [`MAX_FN_LINES`] lines outside tests: a function that
//! long does more than one job (issue 32). Counted on rustfmt'd sources
//! from the `fn` line to the closing brace at the same indentation.

use std::path::Path;

use super::{shown, sources, Crate};

/// The most lines a non-test function may span.
pub(super) const MAX_FN_LINES: usize = 80;

/// Crates that are test or measurement code as a whole.
const EXEMPT_CRATES: [&str; 3] = ["tests-contract", "bench", "xtask"];

/// Whether `path` (under a crate's folder) is test or example code.
fn is_test_source(path: &Path) -> bool {
    let s = path.to_string_lossy();
    s.contains("/tests/")
        || s.contains("/examples/")
        || s.contains("/benches/")
        || s.ends_with("/tests.rs")
        || s.ends_with("_tests.rs")
}

/// The name of the function declared on `line`, with its indentation.
fn fn_start(line: &str) -> Option<(&str, &str)> {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    let mut rest = body;
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    for prefix in ["const ", "async ", "unsafe "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some((indent, &name[..end]))
}

/// The functions of `src` longer than [`MAX_FN_LINES`]: (line, name,
/// length). Stops at the first `#[cfg(test)]` at the top level (test
/// modules close a file).
pub(super) fn long_fns(src: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = src.lines().collect();
    let end = lines
        .iter()
        .position(|l| l.starts_with("#[cfg(test)]"))
        .unwrap_or(lines.len());
    let mut out = Vec::new();
    for i in 0..end {
        let Some((indent, name)) = fn_start(lines[i]) else {
            continue;
        };
        // A declaration ends in `;` before any body opens.
        let Some(open) = (i..end).find(|&k| {
            let t = lines[k].trim_end();
            t.ends_with('{') || t.ends_with(';') || t.ends_with('}')
        }) else {
            continue;
        };
        if !lines[open].trim_end().ends_with('{') {
            continue;
        }
        let closing = format!("{indent}}}");
        if let Some(close) = (open..end).find(|&k| lines[k] == closing) {
            let len = close - i + 1;
            if len > MAX_FN_LINES {
                out.push((i + 1, name.to_string(), len));
            }
        }
    }
    out
}

/// Every non-test function over the limit in the workspace's crates.
pub(super) fn violations(root: &Path, crates: &[Crate]) -> Result<Vec<String>, String> {
    let mut bad = Vec::new();
    for c in crates
        .iter()
        .filter(|c| !EXEMPT_CRATES.contains(&c.name.as_str()))
    {
        for (f, src) in sources(c.dir())? {
            if is_test_source(&f) {
                continue;
            }
            for (line, name, len) in long_fns(&src) {
                bad.push(format!(
                    "{}:{line}: fn {name} is {len} lines (at most {MAX_FN_LINES} outside tests: split it into functions of one job)",
                    shown(root, &f)
                ));
            }
        }
    }
    Ok(bad)
}
