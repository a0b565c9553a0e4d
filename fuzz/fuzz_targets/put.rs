//! Fuzz target `put`: see [`blobpool_fuzz::put`].
#![no_main]

libfuzzer_sys::fuzz_target!(|input: blobpool_fuzz::put::Input| blobpool_fuzz::put::check(input));
