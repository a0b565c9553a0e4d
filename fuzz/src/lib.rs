//! The checks behind Blobpool's fuzz targets (issue 14), one module per
//! target; each `fuzz_targets/<name>.rs` is one line calling
//! `<name>::check`. Every check panics (and so reports a crash to
//! libFuzzer) when the code under test disagrees with a model of what it
//! should do, not only when it panics itself.
//!
//! - [`names`]: `Digest`, `Namespace` and `RefName` accept exactly their
//!   documented grammars and print what they parsed;
//! - [`range`]: `Range` headers: parsed ranges print and re-parse, and
//!   resolve within the entry, start before end;
//! - [`payloads`]: the `blobs/have` and `blobs/put` JSON payloads and the
//!   `refs` PUT body: what parses re-serialises to an equal value;
//! - [`config`]: the binary's configuration (a `blobpool.toml` text plus
//!   `BLOBPOOL_*` variables) loads or fails with a message, never panics;
//! - [`put`]: the put pipeline of `store_core::Store` over `store-mem`
//!   engines against a model (modes, chunking, declared lengths, expected
//!   digests);
//! - [`cache_keys`]: build-cache keys (`/cache/{ns}/{key}`, `cas/<digest>`)
//!   and base paths (`http_path`) accept exactly their grammars and
//!   round-trip;
//! - [`webdav`]: the cache routes (WebDAV methods, paths, `Depth`,
//!   `Range`, `If-None-Match`, `Content-Length`, credentials, bodies)
//!   through the real axum router over `store-mem`, against a model;
//! - [`auth_header`]: `Authorization: Bearer`/`Basic` parsing: passwords
//!   round-trip, malformed headers are rejected, never misread;
//! - [`config_env`]: the `BLOBPOOL_*` environment form of the
//!   configuration: no panic, typed one-line errors naming the variable;
//! - [`gc`]: puts, pins, references, cache keys, deletes, sweeps and clock
//!   moves through `store_core::Store` over fault- and retry-layered
//!   `store-mem` engines: no protected entry is ever lost, and a sweep
//!   deletes and stages exactly what the delete window's rules predict.
//!
//! Run them with `cargo xtask fuzz` (docs in `xtask/src/fuzz.rs`).

pub mod auth_header;
pub mod cache_keys;
pub mod config;
pub mod config_env;
pub mod gc;
pub mod names;
pub mod payloads;
pub mod put;
pub mod range;
pub mod webdav;
