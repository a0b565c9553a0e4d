//! Fuzz target `names`: see [`blobpool_fuzz::names`].
#![no_main]

libfuzzer_sys::fuzz_target!(
    |input: blobpool_fuzz::names::Input| blobpool_fuzz::names::check(input)
);
