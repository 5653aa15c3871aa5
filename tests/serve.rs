//! `serve` as an SRE runs it: the real binary, JSON logs, /readyz, /metrics, gRPC health,
//! and a clean exit on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let end = Instant::now() + Duration::from_secs(20);
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
