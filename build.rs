//! Compiles proto/externalgrpc.proto with protox (pure Rust), so no `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/externalgrpc.proto");
    let fds = protox::compile(["proto/externalgrpc.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost's codec, but NodeGroupForNode skips the Node's labels (src/proto/codec.rs).
        .codec_path("crate::proto::codec::LeanCodec")
        // The template Node is built once and served many times: Bytes clones are free.
        .bytes(".clusterautoscaler.cloudprovider.v1.externalgrpc.NodeGroupTemplateNodeInfoResponse")
        .compile_fds(fds)?;
    Ok(())
}
