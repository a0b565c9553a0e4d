//! The rules on fabricated workspaces: each test builds a small tree and
//! its `cargo metadata` JSON, then checks what tidy reports.

use serde_json::json;

use super::*;

/// The engine crates the test trees register (the real list is what
/// store-registry depends on).
const TEST_ENGINES: [&str; 7] = [
    "store-mem",
    "store-sqlite",
    "store-local",
    "store-postgres",
    "store-pglo",
    "store-object",
    "store-example",
];

/// A throwaway workspace root.
struct Tree(PathBuf);

impl Tree {
    fn new() -> Tree {
        let d = std::env::temp_dir().join(format!(
            "xtask-tidy-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let t = Tree(d);
        t.write(
            "Cargo.toml",
            "[workspace]\nmembers = []\n[workspace.lints.clippy]\ndbg_macro = \"deny\"\n",
        );
        t.write(
            "docs/adr/ADR-012-summary.md",
            "# ADR-012\n\n1. rulings\n\n## Earlier ADRs\n\n- ADR-005: the GC protocol.\n\n## Later\n\n- ADR-007: not a listed one.\n",
        );
        t.write("docs/adr/ADR-013-layout.md", "# ADR-013\n");
        t
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.0.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// Adds crate `name` (manifest sharing the lints, an empty lib.rs;
    /// an engine also the required engine.rs and registration.rs) and
    /// returns its metadata package.
    fn krate(&self, name: &str, deps: &[(&str, Option<&str>)]) -> Value {
        self.write(
            &format!("crates/{name}/Cargo.toml"),
            &format!("[package]\nname = \"{name}\"\n[lints]\nworkspace = true\n"),
        );
        self.write(&format!("crates/{name}/src/lib.rs"), "//! A crate.\n");
        if TEST_ENGINES.contains(&name) {
            for room in ["engine.rs", "registration.rs"] {
                self.write(&format!("crates/{name}/src/{room}"), "//! A room.\n");
            }
        }
        json!({
            "id": format!("path+file://{}#{name}", self.0.display()),
            "name": name,
            "manifest_path": self.0.join("crates").join(name).join("Cargo.toml"),
            "dependencies": deps.iter().map(|(d, kind)| json!({
                "name": d,
                "kind": kind,
                // Renames do not matter: the rules read package names.
                "rename": format!("renamed_{}", d.replace('-', "_")),
            })).collect::<Vec<_>>(),
        })
    }

    fn metadata(&self, packages: Vec<Value>) -> String {
        let ids: Vec<Value> = packages.iter().map(|p| p["id"].clone()).collect();
        json!({ "packages": packages, "workspace_members": ids }).to_string()
    }

    /// The seed workspace's crates, plus `extra`, plus (unless `extra` has
    /// one) a `store-registry` registering every engine of [`TEST_ENGINES`]
    /// (those the tree lacks do not count).
    fn standard(&self, extra: Vec<Value>) -> String {
        let has_registry = extra.iter().any(|p| p["name"] == "store-registry");
        let mut p = vec![
            self.krate("store-types", &[("serde", None)]),
            self.krate("store-gc", &[("store-types", None)]),
            self.krate("store-core", &[("store-types", None), ("store-gc", None)]),
            self.krate(
                "store-ops",
                &[
                    ("store-types", None),
                    ("store-core", None),
                    ("store-gc", None),
                ],
            ),
            self.krate("store-mem", &[("store-types", None)]),
            self.krate(
                "store-sqlite",
                &[("store-types", None), ("store-mem", Some("dev"))],
            ),
            self.krate("store-pg", &[("store-types", None), ("sqlx", None)]),
            self.krate(
                "store-postgres",
                &[("store-types", None), ("store-pg", None)],
            ),
            self.krate(
                "store-pglo",
                &[
                    ("store-types", None),
                    ("store-pg", None),
                    ("store-postgres", Some("dev")),
                ],
            ),
            self.krate("blobpool", &[("store-core", None), ("store-sqlite", None)]),
        ];
        p.extend(extra);
        if !has_registry {
            p.push(self.registry(&[]));
        }
        self.metadata(p)
    }

    /// A `store-registry` depending on store-types, every engine of
    /// [`TEST_ENGINES`] and `more`.
    fn registry(&self, more: &[(&str, Option<&str>)]) -> Value {
        let mut deps = vec![("store-types", None)];
        deps.extend(TEST_ENGINES.iter().map(|e| (*e, None)));
        deps.extend(more.iter().copied());
        self.krate("store-registry", &deps)
    }

    fn violations(&self, metadata: &str) -> Vec<String> {
        violations(&self.0, metadata).unwrap()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_workspace_keeping_the_rules_passes() {
    let t = Tree::new();
    let registry = t.krate(
        "store-registry",
        &[
            ("store-types", None),
            ("store-mem", None),
            ("store-pglo", None),
        ],
    );
    let layers = t.krate("store-layers", &[("store-types", None), ("tracing", None)]);
    assert_eq!(
        t.violations(&t.standard(vec![registry, layers])),
        Vec::<String>::new()
    );
}

#[test]
fn an_engine_depending_on_the_facade_is_caught() {
    let t = Tree::new();
    let example = t.krate(
        "store-example",
        &[
            ("store-types", None),
            ("store-core", None),
            ("store-gc", Some("build")),
        ],
    );
    let bad = t.violations(&t.standard(vec![example]));
    assert_eq!(
        bad,
        [
            "store-example [dependencies] names store-core; it may name only [\"store-types\"]",
            "store-example [build-dependencies] names store-gc; it may name only [\"store-types\"]",
        ]
    );
}

#[test]
fn only_the_postgresql_engines_share_their_internals() {
    let t = Tree::new();
    let types = t.krate("store-types", &[]);
    let gc = t.krate("store-gc", &[("store-types", None)]);
    let core = t.krate("store-core", &[("store-types", None)]);
    let ops = t.krate("store-ops", &[("store-types", None)]);
    // store-pg is shared internals, not a way for one engine to reach another.
    let pg = t.krate(
        "store-pg",
        &[("store-types", None), ("store-postgres", None)],
    );
    let postgres = t.krate(
        "store-postgres",
        &[("store-types", None), ("store-pg", None)],
    );
    // pg-lo's tests may use a postgres engine as their GC host; its code may not.
    let pglo = t.krate(
        "store-pglo",
        &[
            ("store-pg", None),
            ("store-postgres", None),
            ("store-postgres", Some("dev")),
        ],
    );
    let example = t.krate(
        "store-example",
        &[("store-types", None), ("store-pg", None)],
    );
    let crates = vec![
        types,
        gc,
        core,
        ops,
        pg,
        postgres,
        pglo,
        example,
        t.registry(&[]),
    ];
    let bad = t.violations(&t.metadata(crates));
    assert_eq!(
        bad,
        [
            "store-pg [dependencies] names store-postgres; it may name only [\"store-types\"]",
            "store-pglo [dependencies] names store-postgres; it may name only [\"store-types\", \"store-pg\"]",
            "store-example [dependencies] names store-pg; it may name only [\"store-types\"]",
        ]
    );
}

#[test]
fn the_registry_names_engines_but_never_the_facade() {
    let t = Tree::new();
    let registry = t.krate(
        "store-registry",
        &[
            ("store-types", None),
            ("store-mem", None),
            ("store-core", None),
        ],
    );
    let layers = t.krate(
        "store-layers",
        &[("store-types", None), ("store-mem", None)],
    );
    let bad = t.violations(&t.standard(vec![registry, layers]));
    assert_eq!(bad.len(), 2, "{bad:#?}");
    assert!(bad[0].starts_with("store-registry [dependencies] names store-core"));
    assert!(bad[1].starts_with("store-layers [dependencies] names store-mem"));
}

#[test]
fn a_facade_naming_an_engine_is_caught() {
    let t = Tree::new();
    let mut p = vec![
        t.krate("store-types", &[]),
        t.krate("store-gc", &[("store-types", None)]),
        t.krate(
            "store-core",
            &[
                ("store-types", None),
                ("store-gc", None),
                ("store-mem", Some("dev")),
            ],
        ),
        t.krate("store-ops", &[("store-core", None), ("store-sqlite", None)]),
        t.krate("store-mem", &[("store-types", None)]),
        t.krate("store-sqlite", &[("store-types", None)]),
        t.krate("store-local", &[("store-types", None)]),
    ];
    p.push(t.krate("store-object", &[("store-types", None)]));
    p.push(t.registry(&[]));
    t.write(
        "crates/store-core/src/put.rs",
        "use std::sync::Arc;\nuse store_local::LocalEngine;\n",
    );
    t.write(
        "crates/store-ops/tests/it.rs",
        "fn f() { let _ = store_object::ObjectEngine::new; }\n",
    );
    let bad = t.violations(&t.metadata(p));
    assert_eq!(bad.len(), 4, "{bad:#?}");
    assert!(bad[0].contains("store-core [dev-dependencies] names the engine store-mem"));
    assert!(bad[1].contains("crates/store-core/src/put.rs names the engine crate store-local"));
    assert!(bad[2].contains("store-ops [dependencies] names store-sqlite"));
    assert!(bad[3].contains("crates/store-ops/tests/it.rs names the engine crate store-object"));
}

/// The engine list is what the registry registers: a crate it does not
/// register is not held to the engine rules, and one it registers is.
#[test]
fn the_engines_are_what_the_registry_registers() {
    let t = Tree::new();
    let registry = t.krate(
        "store-registry",
        &[
            ("store-types", None),
            ("store-mem", None),
            ("store-new", Some("dev")),
        ],
    );
    let fresh = t.krate("store-new", &[("store-types", None), ("store-core", None)]);
    let bad = t.violations(&t.standard(vec![registry, fresh]));
    assert_eq!(
        bad,
        [
            "store-new [dependencies] names store-core; it may name only [\"store-types\"]",
            "crates/store-new/src has no engine.rs (every engine crate has lib.rs, engine.rs, registration.rs; docs/ENGINES.md)",
            "crates/store-new/src has no registration.rs (every engine crate has lib.rs, engine.rs, registration.rs; docs/ENGINES.md)",
        ]
    );
    let m = t.standard(vec![]);
    let crates = crates_from_metadata(&m).unwrap();
    assert!(engines(&crates).contains(&"store-sqlite".to_string()));
    assert!(!engines(&crates).contains(&"store-types".to_string()));
}

#[test]
fn a_workspace_without_the_facade_checks_nothing_and_says_so() {
    let t = Tree::new();
    let m = t.metadata(vec![t.krate("store-types", &[]), t.krate("store-mem", &[])]);
    let e = violations(&t.0, &m).unwrap_err();
    assert!(e.contains("lists no store-gc"), "{e}");
}

#[test]
fn ignored_tests_lints_and_unknown_adrs_are_caught() {
    let t = Tree::new();
    let m = t.standard(vec![]);
    // Written so that this file holds neither an attribute nor a
    // citation itself.
    let attr = format!("#[{}]", "ignore");
    let panics = format!("#[{}]", "should_panic");
    t.write(
        "crates/store-gc/src/lib.rs",
        &format!("#[test]\n{attr}\nfn slow() {{}}\n#[test]\n{panics}\nfn boom() {{}}\n"),
    );
    let slashes = "/".repeat(2);
    t.write(
        "crates/store-mem/src/lib.rs",
        &format!(
            "{slashes}! See ADR-{:03} and ADR-{:03} (ADR-{:03} §2).\nconst S: &str = \"ADR-{:03} in a string\";\n{slashes} ADR-{:03}\n",
            5, 13, 12, 1, 7
        ),
    );
    t.write("docs/ARCHITECTURE.md", &format!("Per ADR-{:03}.\n", 2));
    t.write(
        "crates/store-postgres/Cargo.toml",
        "[package]\nname = \"store-postgres\"\n",
    );
    let bad = t.violations(&m);
    assert_eq!(bad.len(), 5, "{bad:#?}");
    assert!(bad[0].starts_with("crates/store-gc/src/lib.rs:2: an #[ignore]d test"));
    assert!(bad[1].starts_with("crates/store-gc/src/lib.rs:5: a #[should_panic] test"));
    let bad: Vec<String> = [&bad[..1], &bad[2..]].concat();
    assert!(bad[1].contains("store-postgres does not share the workspace lints"));
    // ADR-005 is listed as an earlier ADR, 012 and 013 have files; 001 is
    // in a string, not a comment; 007 is listed outside "Earlier ADRs".
    assert!(bad[2].starts_with("crates/store-mem/src/lib.rs:3: cites ADR-007"));
    assert!(bad[3].starts_with("docs/ARCHITECTURE.md:1: cites ADR-002"));
}

#[test]
fn an_engine_straying_from_the_rooms_is_caught() {
    let t = Tree::new();
    let m = t.standard(vec![t.krate("store-object", &[("store-types", None)])]);
    // Rooms, extras and room folders pass.
    for ok in ["store-mem/src/reader.rs", "store-sqlite/src/sql.rs"] {
        t.write(&format!("crates/{ok}"), "//! A room.\n");
    }
    t.write("crates/store-object/src/testing/s3.rs", "//! A room.\n");
    t.write("crates/store-object/src/url.rs", "//! An extra.\n");
    assert_eq!(t.violations(&m), Vec::<String>::new());
    // Misnamed rooms, an unknown file, another engine's extra, a stray
    // folder and a missing registration.rs do not.
    for bad in [
        "store-sqlite/src/readers.rs",
        "store-postgres/src/errors.rs",
        "store-mem/src/helpers.rs",
        "store-mem/src/fsio.rs",
        "store-object/src/s3/mod.rs",
    ] {
        t.write(&format!("crates/{bad}"), "//! Astray.\n");
    }
    std::fs::remove_file(t.0.join("crates/store-pglo/src/registration.rs")).unwrap();
    let bad = t.violations(&m);
    assert_eq!(
        bad,
        [
            "crates/store-mem/src/fsio.rs: not a room of an engine crate (use a room of docs/ENGINES.md, or add it to store-mem's extras in xtask/src/tidy.rs)",
            "crates/store-mem/src/helpers.rs: not a room of an engine crate (use a room of docs/ENGINES.md, or add it to store-mem's extras in xtask/src/tidy.rs)",
            "crates/store-sqlite/src/readers.rs: not a room of an engine crate (the room is named reader.rs)",
            "crates/store-postgres/src/errors.rs: not a room of an engine crate (the room is named error.rs)",
            "crates/store-pglo/src has no registration.rs (every engine crate has lib.rs, engine.rs, registration.rs; docs/ENGINES.md)",
            "crates/store-object/src/s3/: not a room of an engine crate (use a room of docs/ENGINES.md, or add it to store-object's extras in xtask/src/tidy.rs)",
        ]
    );
}

#[test]
fn the_workspace_engines_keep_their_rooms() {
    let root = crate::workspace_root();
    let crates = crates_from_metadata(&metadata(&root).unwrap()).unwrap();
    assert!(crates.iter().any(|c| c.name == "store-object"));
    assert_eq!(
        room_violations(&root, &crates).unwrap(),
        Vec::<String>::new()
    );
}

#[test]
fn citations_are_adr_and_three_digits() {
    assert_eq!(
        adr_citations("ADR-012 §5, ADR-5, ADR-0123, (ADR-024)"),
        [12, 24]
    );
    assert_eq!(adr_citations("ADR-"), Vec::<u16>::new());
}

#[test]
fn the_workspace_keeps_its_dependency_rules() {
    // The other rules run as `cargo xtask tidy` (the first step of `cargo
    // xtask ci`); this one on every `cargo test -p xtask` as well.
    let root = crate::workspace_root();
    let crates = crates_from_metadata(&metadata(&root).unwrap()).unwrap();
    assert!(crates.iter().any(|c| c.name == "store-core"));
    assert_eq!(
        dependency_violations(&root, &crates).unwrap(),
        Vec::<String>::new()
    );
}

/// The documents name only paths that exist, and docs/ENGINES.md's rooms
/// table is the one tidy enforces.
#[test]
fn documents_name_existing_paths_and_the_enforced_rooms() {
    let t = Tree::new();
    let m = t.standard(vec![]);
    let table: String = ROOMS
        .iter()
        .filter(|r| **r != "crash.rs")
        .map(|r| format!("| `{r}` | … | … |\n"))
        .collect();
    let extras = "Extras: `batch.rs` `fence.rs` `fleet.rs` `policy.rs` `sql.rs` `cache.rs` \
                  `cache_tests.rs` `nowait.rs` `nowait_tests.rs` `vfs_forward.rs` `fsio.rs` \
                  `url.rs`.\n";
    t.write(
        "docs/ENGINES.md",
        &format!("{table}| `helpers.rs` | … | … |\n\n{extras}"),
    );
    t.write(
        "README.md",
        "See `crates/store-mem/src/lib.rs`, `crates/store-mem/src/gone.rs:12`, \
         `crates/store-NAME` and `crates/*/src`.\n",
    );
    assert_eq!(
        t.violations(&m),
        [
            "docs/ENGINES.md: the rooms table lacks `crash.rs`, a room tidy allows",
            "docs/ENGINES.md: the rooms table has `helpers.rs`, which tidy does not allow",
            "README.md:1: names `crates/store-mem/src/gone.rs`, which does not exist",
        ]
    );
    let table: String = ROOMS
        .iter()
        .map(|r| format!("| `{r}` | … | … |\n"))
        .collect();
    t.write("docs/ENGINES.md", &format!("{table}\n{extras}"));
    t.write("README.md", "See `crates/store-mem/src/lib.rs`.\n");
    assert_eq!(t.violations(&m), Vec::<String>::new());
}

/// A function over 80 lines is caught outside tests, with its line and
/// length; declarations, one-line bodies and test modules are not counted.
#[test]
fn long_functions_are_caught_outside_tests() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let src = format!(
        "trait T {{\n    fn declared(&self)\n        -> u8;\n}}\n\
         pub async fn short() {{}}\n\
         pub(crate) fn long() {{\n{}}}\n\
         impl S {{\n    fn fits(&self) {{\n{}    }}\n}}\n\
         #[cfg(test)]\nmod tests {{\n    fn huge() {{\n{}    }}\n}}\n",
        body(79),
        body(78),
        body(200)
    );
    assert_eq!(fns::long_fns(&src), [(6, "long".to_string(), 81)]);
}

/// The code names the documents use: paths need every part defined in the
/// workspace, bare names the word in its code; other projects' names pass
/// unchecked; ADRs are not read.
#[test]
fn documents_name_code_that_exists() {
    let t = Tree::new();
    let m = t.standard(vec![]);
    t.write(
        "crates/store-mem/src/reader.rs",
        "//! `fn gone` in a comment defines nothing.\n\
         pub enum BlobReader {\n    #[error(\"{x} (\")]\n    Bytes(Vec<u8>, Inline),\n    Chunks { rx: Rx },\n}\n\
         impl BlobReader {\n    pub fn from_bytes(b: &[u8]) -> Self { todo!() }\n}\n\
         pub struct Options { pub readers: usize }\n\
         pub use inner::Thing as s3_testing;\n\
         fn log() { tracing::info!(target: \"blobpool::gc\", \"sweep\"); }\n\
         fn uses(_: bytes::BytesMut) {}\n\
         pub const CHUNK_SIZE: usize = 1;\n\
         impl<T: Into<u8>> std::default::Default for crate::x::Options<T> {\n    fn default() -> Self { todo!() }\n}\n\
         pub fn f() -> impl Iterator<Item = u8> {\n    fn inner() {}\n    std::iter::empty()\n}\n",
    );
    t.write("Cargo.lock", "[[package]]\nname = \"tokio-util\"\n");
    t.write(
        "docs/TUNING.md",
        "`BlobReader::from_bytes()`, `BlobReader::Chunks`, `Options::readers`, \
         `store_mem::reader::BlobReader`, `store_mem::s3_testing`, `blobpool::gc`, \
         `Vec<u8>`, `BlobReader`, `log()`, `tokio_util::io::ReaderStream`, \
         `BytesMut::split_to`, `std::fs::File`, `ETag`, `max_age`, `a::b c`, `CHUNK_SIZE`,\n\
         `BLOBPOOL_FSYNC`, `Options::default()`.\n\
         Wrong: `BlobReader::in_memory`, `Engine::read_range_sized(key, &r)`,\n\
         `ChunkReader`, `gone()`, `BlobReader::Inline`, `blobpool::audit`, `GONE_MAX`,\n\
         `Options::from_bytes`, `BlobReader::readers`, `Iterator::inner`.\n",
    );
    t.write(
        "docs/adr/ADR-013-layout.md",
        "# ADR-013\n`BlobReader::in_memory`\n",
    );
    let bad: Vec<String> = t
        .violations(&m)
        .into_iter()
        .filter(|v| v.starts_with("docs/TUNING.md"))
        .collect();
    assert_eq!(
        bad,
        [
            "docs/TUNING.md:3: names `BlobReader::in_memory`, but the code has no `in_memory`",
            "docs/TUNING.md:3: names `Engine::read_range_sized(key, &r)`, but the code has no `Engine`, `read_range_sized`",
            "docs/TUNING.md:4: names `ChunkReader`, but the code has no `ChunkReader`",
            "docs/TUNING.md:4: names `gone()`, but the code has no `gone`",
            "docs/TUNING.md:4: names `BlobReader::Inline`, but the code has no `Inline`",
            "docs/TUNING.md:4: names `blobpool::audit`, but the code has no `audit`",
            "docs/TUNING.md:4: names `GONE_MAX`, but the code has no `GONE_MAX`",
            "docs/TUNING.md:5: names `Options::from_bytes`, but the code has no `Options::from_bytes`",
            "docs/TUNING.md:5: names `BlobReader::readers`, but the code has no `BlobReader::readers`",
        ]
    );
    // Eleven right, nine wrong; the others are not code references or
    // not ours (`Iterator` is std's: the code uses it, never defines it).
    assert_eq!(names::check(&t.0).0, 20);
}

/// The workspace's documents name only code that exists.
#[test]
fn the_workspace_documents_name_code_that_exists() {
    let (checked, bad) = names::check(&crate::workspace_root());
    assert!(checked > 300, "only {checked} code names found");
    assert_eq!(bad, Vec::<String>::new());
    let (rows, moved) = names::tuning_rows(&crate::workspace_root());
    assert!(
        rows > 50,
        "only {rows} constants found in TUNING.md's tables"
    );
    assert_eq!(moved, Vec::<String>::new());
}

/// TUNING.md's constant tables say where each constant lives: a row whose
/// file (or, with no file, crate) defines no such constant is caught.
#[test]
fn tuning_rows_name_where_their_constants_live() {
    let t = Tree::new();
    t.write(
        "crates/store-mem/src/reader.rs",
        "pub(crate) const CHUNK: usize = 1;\n// const GONE: usize = 2;\n",
    );
    t.write("crates/store-mem/src/sub/deep.rs", "static DEEP: u8 = 0;\n");
    t.write(
        "docs/TUNING.md",
        "| constant | where | value |\n|---|---|---|\n\
         | `CHUNK` | store-mem `reader.rs` | 1 |\n\
         | `CHUNK`, `DEEP` | store-mem | 1, 0 |\n\
         | `DEEP` | store-mem `sub/` | 0 |\n\
         | `GONE` | store-mem `reader.rs` | 2 |\n\
         | `CHUNK` | store-mem `lib.rs`, `reader.rs` | 1 |\n\
         | `CHUNK` | store-sqlite `reader.rs` | 1 |\n\
         | `window` | store-core `builder.rs` | 1 h |\n",
    );
    assert_eq!(
        names::tuning_rows(&t.0),
        (
            7,
            vec![
                "docs/TUNING.md:6: the table puts `GONE` in store-mem `reader.rs`, which defines no such constant".to_string(),
                "docs/TUNING.md:8: the table puts `CHUNK` in store-sqlite `reader.rs`, which defines no such constant".to_string(),
            ]
        )
    );
}
