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
//!   digests).
//!
//! Run them with `cargo xtask fuzz` (docs in `xtask/src/fuzz.rs`).

pub mod config;
pub mod names;
pub mod payloads;
pub mod put;
pub mod range;
