//! `serve` as an SRE runs it: the real binary, JSON logs, /readyz, /metrics, gRPC health,
//! and a clean exit on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ca_asg_provider::clock::Instant;

#[path = "support/process.rs"]
mod process;

fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out[9..12].parse().unwrap();
    (code, out)
}

/// The child's JSON log lines, as they come (lines that are not JSON are skipped).
fn json_logs(child: &mut std::process::Child) -> mpsc::Receiver<serde_json::Value> {
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str(&line) {
                if tx.send(v).is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// Where the child serves /metrics, from its log line saying so.
fn metrics_addr(rx: &mpsc::Receiver<serde_json::Value>) -> SocketAddr {
    loop {
        let v = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("no 'serving /metrics' log line");
        if v["message"] == "serving /metrics, /healthz, /readyz" {
            break v["addr"].as_str().unwrap().parse().unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_json_gets_ready_answers_health_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"))
        .args(["serve", "--memory-cloud", "3:6", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let v: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
            if tx.send(v).is_err() {
                return;
            }
        }
    });
    let mut logs = Vec::new();
    let mut addr_of = |message: &str| -> SocketAddr {
        loop {
            let v = rx
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("no log line {message:?}; saw {logs:?}"));
            logs.push(v.clone());
            if v["message"] == message {
                return v["addr"].as_str().unwrap().parse().unwrap();
            }
        }
    };
    let metrics = addr_of("serving /metrics, /healthz, /readyz");
    let grpc = addr_of("serving externalgrpc CloudProvider");

    let end = Instant::now() + Duration::from_secs(20);
    while http_get(metrics, "/readyz").0 != 200 {
        assert!(Instant::now() < end, "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(http_get(metrics, "/healthz").0, 200);
    let (_, text) = http_get(metrics, "/metrics");
    assert!(text.contains("ca_asg_provider_node_groups 3"), "{text}");

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest { service: "".into() })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // The client stays connected, as CA's does: shutdown must still be prompt.
    let _connected = health;

    let end = sigterm(&child);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let rest: Vec<serde_json::Value> = rx.try_iter().collect();
            panic!("still running 20 s after SIGTERM; logs since: {rest:?}");
        }
        // Not a blocking sleep: the client's connection task must run to answer the
        // server's GOAWAY.
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status}");
    let rest: Vec<serde_json::Value> = rx.try_iter().collect();
    assert!(
        rest.iter().any(|v| v["message"] == "stopped"),
        "no 'stopped' log line: {rest:?}"
    );
}

/// `serve --listen unix:///path`, as in the chart's sidecar and bundled modes: the API
/// answers on the socket, `/readyz` goes through it (ready only while a client can
/// connect: removed under the service, the pod turns unready naming the socket), and
/// SIGTERM removes the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_a_socket_is_ready_through_it_and_removes_it_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("grpc.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"))
        .args(["serve", "--memory-cloud", "2:4"])
        .arg("--listen")
        .arg(format!("unix://{}", sock.display()))
        .args(["--metrics-listen", "127.0.0.1:0", "--log-format", "json"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let rx = json_logs(&mut child);
    let metrics = metrics_addr(&rx);
    let end = Instant::now() + Duration::from_secs(20);
    while http_get(metrics, "/readyz").0 != 200 {
        assert!(Instant::now() < end, "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let channel = ca_asg_provider::grpc::connect_unix(&sock).await.unwrap();
    let mut ca = ca_asg_provider::proto::cloud_provider_client::CloudProviderClient::new(channel);
    let groups = ca
        .node_groups(ca_asg_provider::proto::NodeGroupsRequest {})
        .await
        .unwrap()
        .into_inner()
        .node_groups;
    assert_eq!(groups.len(), 2);
    drop(ca);
    // The file removed under the running service: CA could not connect any more, and
    // the readiness probe says so.
    let moved = dir.path().join("moved.sock");
    std::fs::rename(&sock, &moved).unwrap();
    let (code, body) = http_get(metrics, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("grpc.sock") && body.contains("does not take connections"),
        "{body}"
    );
    std::fs::rename(&moved, &sock).unwrap();
    assert_eq!(http_get(metrics, "/readyz").0, 200);
    let end = sigterm(&child);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < end, "still running 20 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status}");
    assert!(!sock.exists(), "the socket file is removed at exit");
}

/// Sends SIGTERM to `child`, as the kubelet stops a pod; the time by which it must
/// have exited (20 s on).
fn sigterm(child: &std::process::Child) -> Instant {
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    Instant::now() + Duration::from_secs(20)
}

/// The environment of a pod that neither IRSA nor EKS Pod Identity reached: no
/// credentials anywhere the SDK's default chain looks, and no instance metadata service
/// (nothing leaves loopback).
fn without_credentials(cmd: &mut Command, home: &std::path::Path) {
    process::without_credentials(cmd, home);
    cmd.env("POD_NAMESPACE", "kube-system");
}

/// A pod without AWS credentials never becomes ready, and `/readyz` says why in plain
/// words: a credentials problem, and what to check for IRSA and for Pod Identity; not
/// a "transient" failure chain.
#[test]
fn readyz_names_missing_credentials() {
    // A closed local port: credentials are resolved before any request is sent.
    let (dir, cfg) = process::config_file("nodeGroups: [{name: web}]\naws: {region: eu-west-1, endpoint: \"http://127.0.0.1:9\", maxAttempts: 1}\nscaleIn: {enabled: false}\n");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"));
    cmd.args(["serve", "--config"])
        .arg(&cfg)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .args(["--log-format", "json"])
        .stderr(Stdio::piped())
        .stdout(Stdio::null());
    without_credentials(&mut cmd, dir.path());
    let mut child = cmd.spawn().unwrap();
    let rx = json_logs(&mut child);
    let metrics = metrics_addr(&rx);
    // Until the first refresh has failed, /readyz says "no refresh yet".
    let end = Instant::now() + Duration::from_secs(20);
    let (code, body) = loop {
        let (code, body) = http_get(metrics, "/readyz");
        if body.contains("credentials") || Instant::now() > end {
            break (code, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(code, 503, "{body}");
    for want in [
        "not ready: node groups not loaded",
        "no AWS credentials, a credentials problem (not a passing AWS failure)",
        "Neither IRSA nor EKS Pod Identity reached this pod",
        "eks.amazonaws.com/role-arn",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "eks-pod-identity-agent",
        "namespace kube-system",
    ] {
        assert!(
            body.contains(want),
            "{want:?} not in /readyz's body:\n{body}"
        );
    }
    assert!(!body.contains("transient"), "{body}");
}
