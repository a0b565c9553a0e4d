//! Fuzz target `config_env`: see [`blobpool_fuzz::config_env`].
#![no_main]

libfuzzer_sys::fuzz_target!(|input: blobpool_fuzz::config_env::Input| {
    blobpool_fuzz::config_env::check(input)
});
