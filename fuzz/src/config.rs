//! The `blobpool` binary's configuration (`blobpool::config::Config`): a
//! `blobpool.toml` text under a set of `BLOBPOOL_*` variables loads, or
//! fails with a one-line message naming where the bad value came from;
//! it never panics, and a loaded configuration describes itself.
//!
//! The input is the file's text, optionally followed by a line `%%env`
//! and `NAME=value` lines (`NAME` without its `BLOBPOOL_` prefix, e.g.
//! `THRESHOLD=64KiB`): the environment the configuration is loaded under.
//!
//! `Config::load` reads a file (the text-only constructor is test-only),
//! so each input is written to one scratch file per process first.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use blobpool::config::Config;

/// The fuzzer's input: see the module docs.
pub type Input = String;

fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("blobpool-fuzz-config-{}.toml", std::process::id()))
    })
}

/// Loads `input` (see the module docs) as a configuration.
pub fn check(input: Input) {
    let (text, env_lines) = match input.split_once("\n%%env\n") {
        Some((t, e)) => (t, e),
        None => (input.as_str(), ""),
    };
    let env: HashMap<String, String> = env_lines
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (format!("BLOBPOOL_{}", k.trim()), v.to_string()))
        .collect();
    std::fs::write(scratch(), text).expect("the scratch config file is writable");
    match Config::load(Some(scratch()), &|name| env.get(name).cloned()) {
        Ok(cfg) => {
            let line = cfg.describe();
            assert!(!line.is_empty(), "an empty description");
        }
        Err(msg) => {
            assert!(!msg.to_string().is_empty(), "an empty error message");
        }
    }
}
