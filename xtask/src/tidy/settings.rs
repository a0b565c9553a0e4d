//! docs/SERVER.md's settings table against the binary's (ADR-059): every
//! setting of crates/blobpool/src/config/settings.rs has a row, every row
//! names a setting, and each row states the setting's variable and starts
//! its default with the one the table states. A key of a section is
//! `gc.interval` in the table (or `interval` inside a `tls: TlsSection {`
//! block) and `[gc] interval` or `[[auth.keys]]` in a row.

use std::collections::BTreeMap;
use std::path::Path;

const TABLE: &str = "crates/blobpool/src/config/settings.rs";
const DOC: &str = "docs/SERVER.md";

/// The table's settings, key → default as stated: each entry's line is
/// `key: …` (or `gc.key: …`, or `key: …` in a `sec: Type {` block) and
/// its first string is the stated default.
fn declared(source: &str) -> BTreeMap<String, String> {
    let body = source.split_once("\nsettings! {").map_or("", |(_, b)| b);
    let mut section = None;
    body.lines()
        .filter_map(|line| {
            let line = line.trim();
            if line == "}" {
                section = None;
            }
            let (key, rest) = line.split_once(':')?;
            let keyish = |c: char| c.is_ascii_lowercase() || c == '_' || c == '.';
            if key.is_empty() || !key.chars().all(keyish) {
                return None;
            }
            if rest.ends_with('{') {
                section = Some(key.to_string());
                return None;
            }
            let key = section
                .as_ref()
                .map_or(key.to_string(), |s| format!("{s}.{key}"));
            Some((key, rest.split('"').nth(1)?.to_string()))
        })
        .collect()
}

/// The documented settings, key → (variable, default), from the rows of
/// the table under `### Configuration`.
fn documented(doc: &str) -> BTreeMap<String, (String, String)> {
    let section = doc.split_once("### Configuration").map_or("", |(_, s)| s);
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let key = match name.strip_prefix('[').and_then(|n| n.split_once("] ")) {
                Some((section, k)) => format!("{section}.{k}"),
                None => (name.strip_prefix("[[").and_then(|n| n.strip_suffix("]]")))
                    .unwrap_or(name)
                    .to_string(),
            };
            if !key
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.')
            {
                return None;
            }
            let env = cells.get(2)?.split('`').nth(1).unwrap_or("").to_string();
            let default = cells.get(3)?.replace(['`', '"'], "");
            Some((key, (env, default)))
        })
        .collect()
}

/// What disagrees between the table's `source` and the doc's text.
fn compare(source: &str, doc: &str) -> Vec<String> {
    let (declared, documented) = (declared(source), documented(doc));
    let mut bad = Vec::new();
    if declared.is_empty() {
        bad.push(format!("{TABLE}: no settings! table found"));
    }
    for (key, default) in &declared {
        let env = format!("BLOBPOOL_{}", key.replace('.', "_").to_ascii_uppercase());
        match documented.get(key) {
            None => bad.push(format!("{DOC}: setting `{key}` ({TABLE}) has no row")),
            Some((e, _)) if *e != env => bad.push(format!(
                "{DOC}: `{key}`'s variable is {env}, the row says {e:?}"
            )),
            Some((_, d)) if !d.starts_with(default.as_str()) => bad.push(format!(
                "{DOC}: `{key}`'s default is {default:?} ({TABLE}), the row says {d:?}"
            )),
            Some(_) => {}
        }
    }
    for key in documented.keys().filter(|k| !declared.contains_key(*k)) {
        bad.push(format!("{DOC}: row `{key}` is no setting of {TABLE}"));
    }
    bad
}

/// The violations under `root` (none in a tree without the binary: the
/// tests' fixture workspaces).
pub fn violations(root: &Path) -> Vec<String> {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
    match root.join(TABLE).exists() {
        true => compare(&read(TABLE), &read(DOC)),
        false => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::{compare, declared, documented, DOC, TABLE};

    /// The repository's own table and document are found and agree.
    #[test]
    fn the_repository_agrees() {
        let root = crate::workspace_root();
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert!(declared(&read(TABLE)).len() > 20);
        assert!(documented(&read(DOC)).len() > 20);
        assert_eq!(compare(&read(TABLE), &read(DOC)), Vec::<String>::new());
    }

    const SOURCE: &str = "x\nsettings! {\n    plain {\n        /// Delete window.\n        \
        window: Duration = DEFAULT_WINDOW, \"1h\", Scalar::duration, flag;\n    }\n    section {\n        \
        gc.interval: \"15m\";\n    }\n    server {\n        /// `[auth]`.\n        auth: AuthSection {\n            \
        /// Keys.\n            #[serde(default)]\n            keys: Vec<KeyEntry>, \"none\", s::keys;\n        }\n        \
        limits: LimitsSection {\n            idle_timeout: Option<DurationValue>, \"60s\", s::duration;\n        }\n    }\n    \
        derived {\n        pub kv: EngineSpec,\n    }\n}\n";

    fn doc(rows: &str) -> String {
        format!("### Configuration\n\ntext\n\n| key | env | default | meaning |\n|---|---|---|---|\n{rows}\nafter\n")
    }

    #[test]
    fn agreeing_tables_pass_and_section_rows_are_skipped() {
        let rows = "| `window` | `BLOBPOOL_WINDOW` | `\"1h\"` | w |\n\
                    | `[gc] interval` | `BLOBPOOL_GC_INTERVAL` | `15m` | i |\n\
                    | `[[auth.keys]]` | `BLOBPOOL_AUTH_KEYS` (`name=hash=scope`) | none | k |\n\
                    | `[limits] idle_timeout` | `BLOBPOOL_LIMITS_IDLE_TIMEOUT` | `\"60s\"` | i |\n\
                    | `[gc.namespaces.NAME]`, `[[gc.liveness_tables]]` | | none | see GC |";
        assert_eq!(compare(SOURCE, &doc(rows)), Vec::<String>::new());
        let d = declared(SOURCE);
        assert_eq!(d.get("auth.keys").map(String::as_str), Some("none"));
        assert_eq!(
            d.get("limits.idle_timeout").map(String::as_str),
            Some("60s")
        );
        assert_eq!(d.len(), 4, "{d:?}");
    }

    #[test]
    fn missing_extra_and_wrong_rows_are_named() {
        let rows = "| `window` | `BLOBPOOL_WINDOWS` | `\"2h\"` | w |\n| `gone` | `BLOBPOOL_GONE` | `1` | g |";
        let bad = compare(SOURCE, &doc(rows)).join("\n");
        assert!(
            bad.contains("`gc.interval` (crates/blobpool/src/config/settings.rs) has no row"),
            "{bad}"
        );
        assert!(
            bad.contains("`window`'s variable is BLOBPOOL_WINDOW"),
            "{bad}"
        );
        assert!(bad.contains("row `gone` is no setting"), "{bad}");
        assert!(
            bad.contains(
                "`limits.idle_timeout` (crates/blobpool/src/config/settings.rs) has no row"
            ),
            "{bad}"
        );
        let rows = "| `window` | `BLOBPOOL_WINDOW` | `\"2h\"` | w |\n| `[gc] interval` | `BLOBPOOL_GC_INTERVAL` | `15m` | i |\n\
                    | `[[auth.keys]]` | `BLOBPOOL_AUTH_KEY` | none | k |\n\
                    | `[limits] idle_timeout` | `BLOBPOOL_LIMITS_IDLE_TIMEOUT` | 1m | i |";
        let bad = compare(SOURCE, &doc(rows)).join("\n");
        assert!(bad.contains("`window`'s default is \"1h\""), "{bad}");
        assert!(
            bad.contains("`auth.keys`'s variable is BLOBPOOL_AUTH_KEYS"),
            "{bad}"
        );
        assert!(
            bad.contains("`limits.idle_timeout`'s default is \"60s\""),
            "{bad}"
        );
    }
}
