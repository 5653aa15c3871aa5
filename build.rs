//! Compiles proto/externalgrpc.proto with protox (pure Rust), so no `protoc` is needed,
//! and names the build's source revision for `--version` and the `build_info` metric.
use std::path::Path;
use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/externalgrpc.proto");
    revision();
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

/// `CA_ASG_PROVIDER_REVISION` for the crate: the environment's when set (scripts/release.sh
/// sets it, `-dirty` included), else the checkout's commit (12 hex digits, read with the
/// local `git`, no network), else `unknown` (a source archive without .git, no git).
fn revision() {
    const VAR: &str = "CA_ASG_PROVIDER_REVISION";
    println!("cargo:rerun-if-env-changed={VAR}");
    let given = std::env::var(VAR).ok().filter(|v| !v.trim().is_empty());
    let revision = given.unwrap_or_else(|| {
        let git = |args: &[&str]| {
            Command::new("git")
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| String::from_utf8(o.stdout).ok())
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        // A new commit or checkout changes HEAD (or the branch it names): build again.
        if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
            let dir = Path::new(&dir);
            println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
            if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
                let common =
                    git(&["rev-parse", "--git-common-dir"]).map(|c| Path::new(&c).to_path_buf());
                let base = common.unwrap_or_else(|| dir.to_path_buf());
                let reference = base.join(&r);
                if reference.exists() {
                    println!("cargo:rerun-if-changed={}", reference.display());
                }
                let packed = base.join("packed-refs");
                if packed.exists() {
                    println!("cargo:rerun-if-changed={}", packed.display());
                }
            }
        }
        git(&["rev-parse", "--short=12", "HEAD"])
            .filter(|r| r.chars().all(|c| c.is_ascii_hexdigit()))
            .unwrap_or_else(|| "unknown".to_string())
    });
    println!("cargo:rustc-env={VAR}={revision}");
}
