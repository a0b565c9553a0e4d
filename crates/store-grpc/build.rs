//! Compiles the vendored Remote Execution API and ByteStream protos
//! (`proto/`) with protox (pure Rust: no `protoc`, nothing downloaded)
//! and generates the prost messages and tonic services and clients.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/build/bazel/remote/execution/v2/remote_execution.proto",
        "proto/google/bytestream/bytestream.proto",
    ];
    let fds = protox::compile(files, ["proto"])?;
    // The protos' comments are not Rust docs (their indented blocks would
    // run as doctests, their links are protobuf's): read them in proto/.
    let mut config = tonic_prost_build::Config::new();
    config.disable_comments(["."]);
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Clients over any transport (the tests use tonic's channel);
        // the library needs no `tonic::transport`.
        .build_transport(false)
        // `bytes` fields as `bytes::Bytes`: blob data moves without copies.
        .bytes(".")
        .compile_fds_with_config(fds, config)?;
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");
    Ok(())
}
