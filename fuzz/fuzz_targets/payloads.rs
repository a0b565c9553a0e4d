//! Fuzz target `payloads`: see [`blobpool_fuzz::payloads`].
#![no_main]

libfuzzer_sys::fuzz_target!(
    |input: blobpool_fuzz::payloads::Input| blobpool_fuzz::payloads::check(input)
);
