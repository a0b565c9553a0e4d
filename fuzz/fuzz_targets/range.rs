//! Fuzz target `range`: see [`blobpool_fuzz::range`].
#![no_main]

libfuzzer_sys::fuzz_target!(
    |input: blobpool_fuzz::range::Input| blobpool_fuzz::range::check(input)
);
