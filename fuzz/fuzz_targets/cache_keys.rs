//! Fuzz target `cache_keys`: see [`blobpool_fuzz::cache_keys`].
#![no_main]

libfuzzer_sys::fuzz_target!(|input: blobpool_fuzz::cache_keys::Input| {
    blobpool_fuzz::cache_keys::check(input)
});
