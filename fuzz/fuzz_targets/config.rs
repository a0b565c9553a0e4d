//! Fuzz target `config`: see [`blobpool_fuzz::config`].
#![no_main]

libfuzzer_sys::fuzz_target!(
    |input: blobpool_fuzz::config::Input| blobpool_fuzz::config::check(input)
);
