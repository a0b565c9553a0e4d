//! Fuzz target `auth_header`: see [`blobpool_fuzz::auth_header`].
#![no_main]

libfuzzer_sys::fuzz_target!(|input: blobpool_fuzz::auth_header::Input| {
    blobpool_fuzz::auth_header::check(input)
});
