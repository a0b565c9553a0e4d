//! The `BLOBPOOL_*` environment form of the server configuration
//! ([`Config::load`] under a set of variables, and
//! [`blobpool::config::check_environment`]): every variable the
//! configuration reads (each of [`SETTINGS`], the sections' keys too) and
//! any other name, with any values, over an empty file or one of a few
//! valid ones. (The `config` target fuzzes the file text; this one
//! reaches every variable quickly.) Checked:
//!
//! - no panic;
//! - errors are typed and name their source: over the empty file, a
//!   [`ConfigError::Value`] comes from a variable that is set
//!   (`Origin::Env` with its name; or a variable of the same section that
//!   a set one needs), never from the file or the default, and any
//!   error's message is one non-empty line;
//! - a loaded configuration describes itself, and the variables that are
//!   plain values land as given (`BLOBPOOL_LISTEN`, `BLOBPOOL_MAX_BLOB_SIZE`);
//! - `check_environment` refuses only a `BLOBPOOL_*` name that no setting
//!   reads, and names it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use blobpool::config::{
    check_environment, parse_size, Config, ConfigError, Origin, Setting, CLI_VARIABLES, SETTINGS,
};

/// The fuzzer's input: a file (by index) and variables.
#[derive(Arbitrary, Debug)]
pub struct Input {
    file: u8,
    vars: Vec<(Name, String)>,
}

#[derive(Arbitrary, Debug)]
enum Name {
    /// A variable the configuration reads, by index.
    Known(u8),
    /// `BLOBPOOL_` + this.
    Prefixed(String),
    /// Any name.
    Any(String),
}

/// Valid files the variables are laid over (the first is empty).
const FILES: &[&str] = &[
    "",
    "kv = \"mem://\"\n",
    "threshold = \"1KiB\"\nfleet = false\n\n[gc]\nunreferenced_namespaces = [\"tmp\"]\n\
     [gc.namespaces.cc]\npolicy = \"cache\"\nhttp_path = \"/ccache\"\n",
    "log_format = \"json\"\nmax_tokens = 10\n\n[limits]\nidle_timeout = \"60s\"\n",
];

fn scratch(i: usize) -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d =
            std::env::temp_dir().join(format!("blobpool-fuzz-config-env-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a scratch directory");
        for (i, text) in FILES.iter().enumerate() {
            std::fs::write(d.join(format!("{i}.toml")), text).expect("a scratch file");
        }
        d
    });
    dir.join(format!("{i}.toml"))
}

fn known() -> Vec<String> {
    SETTINGS.iter().map(Setting::env).collect()
}

/// Loads the input's variables over its file.
pub fn check(input: Input) {
    let known = known();
    let env: BTreeMap<String, String> = input
        .vars
        .into_iter()
        .map(|(n, v)| {
            let name = match n {
                Name::Known(i) => known[i as usize % known.len()].clone(),
                Name::Prefixed(s) => format!("BLOBPOOL_{s}"),
                Name::Any(s) => s,
            };
            (name, v)
        })
        .collect();
    let file = input.file as usize % FILES.len();
    let path = scratch(file);
    let lookup = |name: &str| env.get(name).cloned();
    match Config::load(Some(path.as_path()), &lookup) {
        Ok(cfg) => {
            assert!(!cfg.describe().is_empty(), "an empty description");
            if let Some(v) = env.get("BLOBPOOL_LISTEN") {
                assert_eq!(&cfg.listen, v, "BLOBPOOL_LISTEN");
            }
            if let Some(v) = env.get("BLOBPOOL_MAX_BLOB_SIZE") {
                assert_eq!(
                    Ok(cfg.max_blob_size),
                    parse_size(v),
                    "BLOBPOOL_MAX_BLOB_SIZE"
                );
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                !msg.is_empty() && !msg.contains('\n'),
                "not one line: {msg:?} ({e:?})"
            );
            match &e {
                ConfigError::Value { origin, key, .. } => {
                    assert!(
                        !key.is_empty() || matches!(origin, Origin::File(_)),
                        "{e:?}"
                    );
                    match origin {
                        Origin::Env(name) => {
                            assert!(known.contains(name), "{name}: {msg}");
                            // A variable that is not set is one a set
                            // variable of its section needs
                            // (`BLOBPOOL_TLS_CERT` with `BLOBPOOL_TLS_KEY`).
                            let section = name.splitn(3, '_').take(2).collect::<Vec<_>>().join("_");
                            assert!(
                                env.contains_key(name)
                                    || env.keys().any(|k| k.starts_with(&format!("{section}_"))),
                                "{name} is not set, nor any of its section: {msg}"
                            );
                        }
                        Origin::Flag(f) => panic!("no flags were given, but {f}: {msg}"),
                        Origin::File(_) | Origin::Default if file == 0 => panic!(
                            "the file is empty, so the bad value came from the \
                             environment, but the error says {origin}: {msg}"
                        ),
                        _ => {}
                    }
                }
                ConfigError::Setting { key, .. } => assert!(!key.is_empty(), "{e:?}"),
                ConfigError::Unreadable { .. } => panic!("the scratch file is readable: {e:?}"),
                other => panic!("an unknown error: {other:?}"),
            }
        }
    }

    match check_environment(env.keys().cloned()) {
        Ok(()) => {}
        Err(e) => match &e {
            ConfigError::Value {
                origin: Origin::Env(name),
                ..
            } => {
                assert!(env.contains_key(name), "{e}");
                assert!(name.starts_with("BLOBPOOL_"), "{e}");
                assert!(
                    !known.contains(name) && !CLI_VARIABLES.contains(&name.as_str()),
                    "a known variable refused: {e}"
                );
                // The message quotes the name as it is: one line for any
                // name without control characters (an environment name
                // with a newline is possible, but not from a shell
                // assignment; found by this target, reported, accepted).
                if !name.chars().any(char::is_control) {
                    assert!(!e.to_string().contains('\n'), "{e:?}");
                }
            }
            other => panic!("check_environment: {other:?}"),
        },
    }
}
