//! The load generator end to end: the real binary starts `serve --memory-cloud`, drives
//! it like CA and writes its report. Asserts counts (RPCs per loop, AWS calls in a
//! steady loop, drains ended), never times.

use std::process::Command;

#[test]
fn loadgen_drives_a_ca_loop_and_reports_zero_aws_calls_in_steady_state() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"))
        .args([
            "loadgen", "--nodes", "300", "--groups", "12", "--loops", "2",
        ])
        .args([
            "--connections",
            "4",
            "--concurrent-passes",
            "1",
            "--drain-nodes",
            "2",
        ])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "loadgen failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("NodeGroupForNode"), "{stdout}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // CA's loop: Refresh, NodeGroups, 2 NodeGroupForNode per node, 5 calls per group.
    assert_eq!(r["rpcs_per_loop"], 2 * 300 + 5 * 12 + 2);
    let sent: u64 = r["sequential"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(sent, 2 * (2 * 300 + 5 * 12 + 2), "two measured loops");
    assert_eq!(
        r["aws_calls_in_steady_loops"], 0,
        "a steady loop makes no AWS call"
    );
    assert_eq!(r["concurrent"]["calls"], 300);
    assert!(r["server_peak_rss_mib"].as_f64().unwrap() > 0.0);
    assert_eq!(
        r["drain_overhead"]["nodes"], 2,
        "both drained nodes were ended"
    );
}
