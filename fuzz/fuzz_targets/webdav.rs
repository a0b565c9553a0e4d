//! Fuzz target `webdav`: see [`blobpool_fuzz::webdav`].
#![no_main]

libfuzzer_sys::fuzz_target!(
    |input: blobpool_fuzz::webdav::Input| blobpool_fuzz::webdav::check(input)
);
