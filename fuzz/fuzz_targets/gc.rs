//! Fuzz target `gc`: see [`blobpool_fuzz::gc`].
#![no_main]

libfuzzer_sys::fuzz_target!(|input: blobpool_fuzz::gc::Input| blobpool_fuzz::gc::check(input));
