//! A second gRPC stack for the tests: gRPC's C core (which the Python, C++, Ruby, PHP
//! and C# stacks share), as grpcio in the project's venv (`scripts/test.sh` installs
//! it). A generic client: raw bytes in and out, every channel setting at its default.

use std::path::{Path, PathBuf};

use prost::Message as _;

/// The project's Python, if it has grpcio. Without it the caller skips, saying why,
/// except under CI, where the test fails.
pub fn python() -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    let has = std::process::Command::new(&python)
        .args(["-c", "import grpc"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has {
        return Some(python);
    }
    let why = format!(
        "{} has no grpcio (scripts/test.sh installs it)",
        python.display()
    );
    if std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false") {
        panic!("{why}; under CI this test must run");
    }
    eprintln!("skipped: {why}");
    None
}

/// Three NodeGroups calls on one channel (the later ones index the first's headers)
/// and a GPULabel; prints each answer in hex, one a line. With three more arguments
/// (trusted CA, client key, client certificate: PEM files), over TLS.
const CLIENT: &str = r#"
import sys, grpc
target = sys.argv[1]
if len(sys.argv) > 2:
    root, key, chain = (open(p, "rb").read() for p in sys.argv[2:5])
    channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root, key, chain))
else:
    channel = grpc.insecure_channel(target)
service = "/clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider/"
with channel:
    for method in ["NodeGroups", "NodeGroups", "NodeGroups", "GPULabel"]:
        call = channel.unary_unary(service + method, request_serializer=None, response_deserializer=None)
        print(call(b"", timeout=20).hex())
"#;

/// What the server answered the client at `target` (`unix:///path` or `host:port`),
/// with mTLS when `tls` names the client's files: the node group IDs of each of the
/// three NodeGroups answers, and the GPU label.
pub async fn ask(
    python: &Path,
    target: &str,
    tls: Option<[&Path; 3]>,
) -> (Vec<Vec<String>>, String) {
    let mut cmd = tokio::process::Command::new(python);
    cmd.args(["-c", CLIENT, target]);
    for f in tls.iter().flatten() {
        cmd.arg(f);
    }
    let out = cmd.output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the grpcio client failed: {stderr}");
    let answers: Vec<Vec<u8>> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            (0..l.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect();
    assert_eq!(answers.len(), 4, "{answers:?}");
    let groups = answers[..3]
        .iter()
        .map(|a| {
            ca_asg_provider::proto::NodeGroupsResponse::decode(&a[..])
                .unwrap()
                .node_groups
                .into_iter()
                .map(|g| g.id)
                .collect()
        })
        .collect();
    let label = ca_asg_provider::proto::GpuLabelResponse::decode(&answers[3][..])
        .unwrap()
        .label;
    (groups, label)
}
