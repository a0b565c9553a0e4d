//! The library part of the `blobpool` binary: the configuration
//! (`blobpool.toml`, the `BLOBPOOL_*` environment, the store flags) and the
//! sections it is made of, shared by the binary (`src/main.rs`) and by the
//! tools that exercise it from outside, such as the fuzz targets
//! (`fuzz/fuzz_targets/config.rs`).
//!
//! Everything else of the binary (the commands, the server, the client)
//! stays in the binary target.

pub mod config;
pub mod error;
pub mod gc;
pub mod security;
