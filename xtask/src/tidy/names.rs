//! The code names the documents use exist in the code (ADR-063).
//!
//! A backticked span of README.md or docs/*.md is a code reference when it
//! is a path (`Type::member`, `crate::module::Item`, optionally called,
//! generic or a macro: `Store::builder()`, `Layered<E>`, `contract_suite!`)
//! or a bare type name (`BlobReader`), constant (`CHUNK_SIZE`) or call
//! (`gc_now()`). The check is
//! cheap and conservative, read from the workspace's text rather than
//! compiled:
//!
//! - a path whose first part is a crate of Cargo.lock (`tokio::spawn`),
//!   `std`, `core` or `alloc`, or a name the code uses but never defines
//!   (an imported type: `BytesMut::split_to`) is someone else's and not
//!   checked; nor is one of [`EXTERNAL`];
//! - every other path needs each part defined somewhere in the workspace's
//!   `.rs` files (crate, module or file, `fn`, type, trait, `const`,
//!   `static`, macro, `use … as` name, enum variant, field) — or is a log
//!   target the code names (`target: "blobpool::gc"`); and `Type::member`
//!   needs the member to be the type's own: a function, constant or type
//!   of one of its `impl` blocks (trait impls included) or of the trait's
//!   body, a variant, a field (so a method moved to another type is
//!   caught);
//! - a bare type name, constant or call needs the word somewhere in the
//!   code, out of
//!   comments (sources, SQL, scripts, manifests and unit files count).
//!
//! ADRs are records of their day and are not checked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Names of other projects or protocols the documents use in backticks:
/// HTTP headers, S3 operations, system calls, std types the code does not
/// use, and one method of `bytes::Bytes` (which shares its name with a
/// `BlobReader` variant).
const EXTERNAL: [&str; 9] = [
    "Allow",
    "Location",
    "ETag",
    "UploadPartCopy",
    "AbortIncompleteMultipartUpload",
    "openat2",
    "prctl",
    "Condvar",
    "Bytes::from_owner",
];

/// Environment variables the documents name: Blobpool's own are derived
/// from the settings table (tidy's settings check reads them), the others
/// belong to other tools.
const ENV_PREFIXES: [&str; 3] = ["BLOBPOOL_", "AWS_", "SCCACHE_"];

/// Where the code lives, and the files read for its words.
const CODE_DIRS: [&str; 8] = [
    "crates",
    "tests-contract",
    "xtask",
    "bench",
    "fuzz",
    "deploy",
    ".ci",
    ".github",
];
const CODE_EXTS: [&str; 10] = [
    "rs", "sql", "sh", "toml", "service", "conf", "yml", "yaml", "c", "py",
];

/// What the workspace defines and says.
#[derive(Default)]
pub(super) struct Vocabulary {
    /// Names defined in Rust: items, modules, files, fields, variants,
    /// crates.
    defs: BTreeSet<String>,
    /// What each type, enum or trait defines: its functions, constants and
    /// associated types (every `impl` and the trait's own body), variants,
    /// fields.
    members: BTreeMap<String, BTreeSet<String>>,
    /// Every identifier of the code outside comments, and file stems.
    words: BTreeSet<String>,
    /// Log targets the code names.
    targets: BTreeSet<String>,
    /// Crates of Cargo.lock that are not workspace members, and std's.
    external: BTreeSet<String>,
}

fn code_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(name.as_str(), "target" | "corpus" | "artifacts") {
                code_files(&p, out);
            }
        } else if p
            .extension()
            .is_some_and(|x| CODE_EXTS.iter().any(|c| x == *c))
        {
            out.push(p);
        }
    }
}

/// `line` without its `//` comment (a `//` inside a string stays).
fn uncommented(line: &str) -> &str {
    let mut in_str = false;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        if c == '"' && prev != '\\' {
            in_str = !in_str;
        } else if c == '/' && prev == '/' && !in_str {
            return &line[..i - 1];
        }
        prev = c;
    }
    line
}

/// `code` with the insides of its string literals blanked, so their
/// braces and words do not count as code.
fn unquoted(code: &str) -> String {
    let (mut in_str, mut escaped) = (false, false);
    code.chars()
        .map(|c| {
            let quote = c == '"' && !escaped;
            escaped = in_str && c == '\\' && !escaped;
            if quote {
                in_str = !in_str;
                c
            } else if in_str {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// The identifiers and single punctuation characters of `code`.
fn tokens(code: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in code.char_indices() {
        let ident = c == '_' || c.is_ascii_alphanumeric();
        match (ident, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push(&code[s..i]);
                start = None;
            }
            _ => {}
        }
        if !ident && !c.is_whitespace() {
            out.push(&code[i..i + c.len_utf8()]);
        }
    }
    if let Some(s) = start {
        out.push(&code[s..]);
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.starts_with(|c: char| c == '_' || c.is_ascii_alphabetic())
}

/// The names Rust tokens define: items after their keyword, `use … as`
/// names, fields (a name before a single `:`) and enum variants; and
/// what each type or trait defines ([`owner`], [`body_names`]).
fn definitions(toks: &[&str], v: &mut Vocabulary) {
    const ITEMS: [&str; 10] = [
        "fn", "struct", "enum", "trait", "type", "const", "static", "mod", "union", "as",
    ];
    for (i, t) in toks.iter().enumerate() {
        let next = toks.get(i + 1).copied().unwrap_or("");
        let after = toks.get(i + 2).copied().unwrap_or("");
        if ITEMS.contains(t) && is_ident(next) {
            v.defs.insert(next.to_string());
        }
        if *t == "macro_rules" && next == "!" && is_ident(after) {
            v.defs.insert(after.to_string());
        }
        let single_colon = next == ":" && after != ":" && toks.get(i.wrapping_sub(1)) != Some(&":");
        if is_ident(t) && single_colon {
            v.defs.insert(t.to_string());
        }
        // An item `impl` follows an item's end or an attribute, never a
        // `:`, `->` or `(` (where `impl Trait` is a type).
        let prev = if i == 0 { "}" } else { toks[i - 1] };
        let item_impl = *t == "impl" && matches!(prev, "}" | ";" | "]" | "{" | "unsafe");
        if item_impl || matches!(*t, "trait" | "struct" | "enum" | "union") {
            if let Some((name, open)) = owner(&toks[i..]) {
                let names = body_names(t, &toks[i + open..]);
                if *t == "enum" {
                    v.defs.extend(names.iter().map(|n| n.to_string()));
                }
                v.members
                    .entry(name.to_string())
                    .or_default()
                    .extend(names.into_iter().map(str::to_string));
            }
        }
    }
}

/// The last name of the path that starts `toks` (`crate::x::Y<T>` → `Y`).
fn path_end<'a>(toks: &[&'a str]) -> Option<&'a str> {
    toks.iter()
        .take_while(|t| is_ident(t) || **t == ":")
        .filter(|t| is_ident(t))
        .last()
        .copied()
}

/// The type or trait the item at `toks[0]` (`impl`, `trait`, `struct`,
/// `enum`, `union`) defines names of, and where its body opens: `impl<…>
/// Trait for Type<…>` and `impl<…> Type<…>` both give `Type`.
fn owner<'a>(toks: &[&'a str]) -> Option<(&'a str, usize)> {
    let open = toks.iter().position(|t| *t == "{" || *t == ";")?;
    if toks[open] == ";" {
        return None;
    }
    let head = &toks[1..open];
    let name = if toks[0] != "impl" {
        head.first().copied().filter(|t| is_ident(t))?
    } else if let Some(f) = head
        .iter()
        .enumerate()
        .position(|(k, t)| *t == "for" && head.get(k + 1) != Some(&"<"))
    {
        path_end(&head[f + 1..])?
    } else {
        let mut depth = 0;
        let start = head.iter().position(|t| {
            match *t {
                "<" => depth += 1,
                ">" => depth -= 1,
                _ => {}
            }
            depth == 0 && is_ident(t)
        })?;
        path_end(&head[start..])?
    };
    Some((name, open))
}

/// The names a body (its tokens from the opening brace) defines at its top
/// level: an enum's variants, a struct's fields, an impl's or trait's
/// functions, constants and types.
fn body_names<'a>(kind: &str, body: &[&'a str]) -> Vec<&'a str> {
    let (mut braces, mut parens) = (0i32, 0i32);
    let mut out = Vec::new();
    for (j, t) in body.iter().enumerate() {
        match *t {
            "{" => braces += 1,
            "}" => braces -= 1,
            "(" | "[" => parens += 1,
            ")" | "]" => parens -= 1,
            _ => {}
        }
        if braces == 0 {
            break;
        }
        if braces != 1 || parens != 0 || j == 0 || !is_ident(t) {
            continue;
        }
        let (prev, next) = (body[j - 1], body.get(j + 1).copied().unwrap_or(""));
        let named = match kind {
            "enum" => {
                matches!(prev, "{" | "," | "]") && t.starts_with(|c: char| c.is_ascii_uppercase())
            }
            "struct" | "union" => {
                matches!(prev, "{" | "," | "pub" | ")")
                    && next == ":"
                    && body.get(j + 2) != Some(&":")
            }
            _ => matches!(prev, "fn" | "const" | "type"),
        };
        if named {
            out.push(*t);
        }
    }
    out
}

/// The `name = "…"` of a manifest's `[package]`.
fn package_name(manifest: &str) -> Option<&str> {
    let package = manifest.split("[package]").nth(1)?;
    let line = package
        .lines()
        .take_while(|l| !l.starts_with('['))
        .find(|l| l.trim_start().starts_with("name"))?;
    line.split('"').nth(1)
}

/// The vocabulary of the workspace under `root`.
pub(super) fn vocabulary(root: &Path) -> Vocabulary {
    let mut v = Vocabulary::default();
    let mut files = Vec::new();
    for dir in CODE_DIRS {
        code_files(&root.join(dir), &mut files);
    }
    files.sort();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let stem = f.file_stem().map(|s| s.to_string_lossy().into_owned());
        v.words.extend(stem.clone());
        let code: String = text
            .lines()
            .map(|l| format!("{}\n", uncommented(l)))
            .collect();
        let toks = tokens(&code);
        v.words
            .extend(toks.iter().filter(|t| is_ident(t)).map(|t| t.to_string()));
        match f.extension().and_then(|x| x.to_str()) {
            Some("rs") => {
                v.defs.extend(stem);
                definitions(&tokens(&unquoted(&code)), &mut v);
                for quoted in text.split("target: \"").skip(1) {
                    v.targets
                        .extend(quoted.split('"').next().map(str::to_string));
                }
            }
            Some("toml") => {
                if let Some(name) = package_name(&text) {
                    v.defs.insert(name.replace('-', "_"));
                }
            }
            _ => {}
        }
    }
    v.external = ["std", "core", "alloc"].map(String::from).into();
    if let Ok(lock) = std::fs::read_to_string(root.join("Cargo.lock")) {
        for line in lock.lines().filter_map(|l| l.strip_prefix("name = \"")) {
            let name = line.trim_end_matches('"').replace('-', "_");
            if !v.defs.contains(&name) {
                v.external.insert(name);
            }
        }
    }
    v
}

/// A code reference: the name it stands for and its parts.
#[derive(Debug, PartialEq)]
enum Reference<'a> {
    /// `A::b::C`, with its parts.
    Path(&'a str, Vec<&'a str>),
    /// `Type` or `call()`.
    Bare(&'a str),
}

/// The code reference `span` is, if it is one: a path or a bare type
/// name or call, optionally followed by `(…)`, `<…>` or `!`.
fn reference(span: &str) -> Option<Reference<'_>> {
    let end = span
        .find(|c: char| !(c == '_' || c == ':' || c.is_ascii_alphanumeric()))
        .unwrap_or(span.len());
    let (head, rest) = span.split_at(end);
    let tail_ok = rest.is_empty()
        || rest == "!"
        || (rest.starts_with('(') && rest.ends_with(')'))
        || (rest.starts_with('<') && rest.ends_with('>'));
    if !tail_ok || head.is_empty() {
        return None;
    }
    let parts: Vec<&str> = head.split("::").collect();
    if parts.len() > 1 {
        return parts
            .iter()
            .all(|p| is_ident(p))
            .then_some(Reference::Path(head, parts));
    }
    let camel = head.starts_with(|c: char| c.is_ascii_uppercase())
        && head.contains(|c: char| c.is_ascii_lowercase())
        && !head.contains('_');
    let call = rest.starts_with('(')
        && head.starts_with(|c: char| c.is_ascii_lowercase())
        && !head.contains(|c: char| c.is_ascii_uppercase());
    let constant = rest.is_empty()
        && head.contains('_')
        && head.starts_with(|c: char| c.is_ascii_uppercase())
        && !head.contains(|c: char| c.is_ascii_lowercase());
    (camel || call || constant).then_some(Reference::Bare(head))
}

impl Vocabulary {
    /// `None` when `r` is someone else's name; else whether it is wrong
    /// (the parts missing from the code).
    fn missing(&self, r: &Reference<'_>) -> Option<Vec<String>> {
        match r {
            Reference::Path(head, _) | Reference::Bare(head) if EXTERNAL.contains(head) => None,
            Reference::Bare(head) if ENV_PREFIXES.iter().any(|p| head.starts_with(p)) => None,
            Reference::Path(head, parts) => {
                let first = parts[0];
                let imported = !self.defs.contains(first) && self.words.contains(first);
                if self.external.contains(first) || imported {
                    return None;
                }
                if self.targets.contains(*head) {
                    return Some(Vec::new());
                }
                let mut missing: Vec<String> = parts
                    .iter()
                    .filter(|p| !self.defs.contains(**p))
                    .map(|p| p.to_string())
                    .collect();
                if missing.is_empty() {
                    // `Type::member`: the member must be the type's own (or
                    // its traits'), not merely defined somewhere.
                    for pair in parts.windows(2) {
                        let of = self.members.get(pair[0]);
                        if of.is_some_and(|m| !m.contains(pair[1])) {
                            missing.push(format!("{}::{}", pair[0], pair[1]));
                        }
                    }
                }
                Some(missing)
            }
            Reference::Bare(word) => Some(if self.words.contains(*word) {
                Vec::new()
            } else {
                vec![word.to_string()]
            }),
        }
    }
}

/// README.md and docs/*.md.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md")];
    if let Ok(read) = std::fs::read_dir(root.join("docs")) {
        let mut md: Vec<_> = read
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        md.sort();
        out.extend(md);
    }
    out.into_iter().filter(|p| p.is_file()).collect()
}

/// How many code references the documents make, and those naming what the
/// code does not have.
pub(super) fn check(root: &Path) -> (usize, Vec<String>) {
    let v = vocabulary(root);
    let (mut checked, mut bad) = (0, Vec::new());
    for doc in documents(root) {
        let Ok(text) = std::fs::read_to_string(&doc) else {
            continue;
        };
        for (line, span) in super::docs::code_spans(&text) {
            let Some(missing) = reference(span).and_then(|r| v.missing(&r)) else {
                continue;
            };
            checked += 1;
            if !missing.is_empty() {
                bad.push(format!(
                    "{}:{line}: names `{span}`, but the code has no `{}`",
                    super::shown(root, &doc),
                    missing.join("`, `")
                ));
            }
        }
    }
    (checked, bad)
}

/// Whether `file` (or, a folder, a `.rs` file under it) defines the
/// constant or static `name`.
fn defines_const(file: &Path, name: &str) -> bool {
    let mut files = Vec::new();
    if file.is_dir() {
        code_files(file, &mut files);
    } else {
        files.push(file.to_path_buf());
    }
    files.iter().any(|f| {
        let Ok(text) = std::fs::read_to_string(f) else {
            return false;
        };
        let code: String = text
            .lines()
            .map(|l| format!("{}\n", uncommented(l)))
            .collect();
        tokens(&code)
            .windows(2)
            .any(|w| matches!(w[0], "const" | "static") && w[1] == name)
    })
}

/// The rows of docs/TUNING.md's constant tables (`| `NAME`, `OTHER` |
/// crate `file.rs` | …`) whose constants the named files do not define:
/// a constant moved or renamed leaves its row behind. A row naming only a
/// crate is checked against the crate's sources; a row naming no crate
/// (a setting, a time) is not checked.
pub(super) fn tuning_rows(root: &Path) -> (usize, Vec<String>) {
    let doc = root.join("docs").join("TUNING.md");
    let Ok(text) = std::fs::read_to_string(&doc) else {
        return (0, Vec::new());
    };
    let (mut checked, mut bad) = (0, Vec::new());
    for (i, line) in text.lines().enumerate() {
        let cells: Vec<&str> = line.split('|').collect();
        if !line.starts_with("| `") || cells.len() < 4 {
            continue;
        }
        let names: Vec<&str> = super::docs::code_spans(cells[1])
            .into_iter()
            .map(|(_, s)| s)
            .filter(|s| {
                s.len() > 1
                    && s.chars()
                        .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            })
            .collect();
        let place = cells[2];
        let crates: Vec<&str> = place
            .split('`')
            .next()
            .unwrap_or("")
            .split([',', ' '])
            .filter(|c| c.starts_with("store-") || root.join("crates").join(c).is_dir())
            .collect();
        let files: Vec<&str> = super::docs::code_spans(place)
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        if crates.is_empty() {
            continue;
        }
        let homes: Vec<PathBuf> = crates
            .iter()
            .flat_map(|c| {
                let src = root.join("crates").join(c).join("src");
                if files.is_empty() {
                    vec![src]
                } else {
                    files.iter().map(|f| src.join(f)).collect()
                }
            })
            .collect();
        for name in names {
            checked += 1;
            if !homes.iter().any(|h| defines_const(h, name)) {
                bad.push(format!(
                    "{}:{}: the table puts `{name}` in {}, which defines no such constant",
                    super::shown(root, &doc),
                    i + 1,
                    place.trim()
                ));
            }
        }
    }
    (checked, bad)
}

/// The code references of the documents naming what the code lacks, and
/// TUNING.md's constants not where its tables say.
pub(super) fn violations(root: &Path) -> Vec<String> {
    let (checked, mut bad) = check(root);
    let (rows, moved) = tuning_rows(root);
    bad.extend(moved);
    eprintln!(
        "xtask: tidy: {checked} code names in README.md and docs/*.md checked, \
         and {rows} constants of TUNING.md's tables where they say"
    );
    bad
}
