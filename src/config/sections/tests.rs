//! The sections together: every problem of every section, in one order.

use crate::config::{resolve, ConfigError, FileConfig, Overrides};

/// Wrong in every section at once: each problem is reported, with its key, its value
/// and the same words, section by section in the order `resolve` lists them (the
/// refresh-against-CA check between the scale-in durations and its counts), as
/// before the sections had rooms of their own. The aws section and `metricsListen`
/// are checked here only.
#[test]
fn every_section_reports_its_problems_in_one_order() {
    let file = FileConfig::parse(
        r#"
listen: "nowhere"
metricsListen: "nor here"
tls: {cert: /nope/c, key: /nope/k, clientCA: /nope/ca}
aws: {region: eu-west-1, endpoint: "ftp://x", maxAttempts: 0}
refreshInterval: 5 parsecs
refreshWait: 10s
caCallTimeout: 1ms
launchFailureWindow: 1s
nodeGroups:
  - {name: a, minSize: 5, maxSize: 2}
  - {name: a}
  - {name: "", minSize: -1}
  - {name: b, minSize: -3, maxSize: -1}
autoDiscovery:
  - tags: ["=x"]
  - tags: ["k", ""]
templates:
  a: {taints: ["k=v:Sometimes", "=v:NoSchedule", "x"], maxPods: 0}
  b: {vmMemoryOverheadPercent: 75, maxPods: 2000}
  c: {vmMemoryOverheadPercent: -1}
scaleIn:
  enabled: false
  hookName: ""
  hookHeartbeatTimeout: 1s
  workloadDeadline: 1ms
  daemonSetDeadline: x
  volumeDetachDeadline: -1s
  evictionRetryInterval: 1ms
  maxConcurrentDrains: 0
  apiQps: -1
  apiBurst: 0
  lifecyclePollInterval: 10ms
  leaseName: ""
  leaseDuration: 1s
  nodeCriticalDaemonSets: ["=", "a=b"]
  sharedPodWatchFrom: 20000
interruption:
  queueUrl: "sqs://x"
  batchSize: 11
  concurrency: 0
  waitTime: 30s
  daemonSetShare: 100h
  maxReceives: 0
  safetyNetPollInterval: 1s
"#,
        "t.yaml",
    )
    .unwrap();
    let flags = Overrides {
        nodes: vec!["1:2".into(), "x:2:a".into(), "1:2:a".into(), "0:1:c".into()],
        auto_discovery: vec![
            "mig:x".into(),
            "asg:x".into(),
            "asg:tag=".into(),
            "asg:tag=k=v,j".into(),
        ],
        aws_endpoint: Some("nope".into()),
        ..Overrides::default()
    };
    let problems = match resolve(file, &flags, "t.yaml") {
        Err(ConfigError::Invalid { problems, .. }) => problems,
        other => panic!("expected problems, got {other:?}"),
    };
    let got: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        got,
        [
            r#"listen: "nowhere" is not an address like 127.0.0.1:8086 or unix:///var/run/ca-asg-provider/grpc.sock"#,
            r#"metricsListen: "nor here" is not an address like 0.0.0.0:8087"#,
            r#"tls.cert: /nope/c is not a readable file"#,
            r#"tls.key: /nope/k is not a readable file"#,
            r#"tls.clientCA: /nope/ca is not a readable file"#,
            r#"aws.endpoint: "nope" must start with http:// or https://"#,
            r#"aws.maxAttempts: 0 must be between 1 and 20"#,
            r#"refreshInterval: "5 parsecs": "5 parsecs": unknown unit " parsecs" (use ns, us, ms, s, m, h)"#,
            r#"caCallTimeout: "1ms" (1ms) is shorter than the minimum 500ms"#,
            r#"launchFailureWindow: "1s" (1s) is shorter than the minimum 10s"#,
            r#"scaleIn.hookHeartbeatTimeout: "1s" (1s) is shorter than the minimum 30s"#,
            r#"scaleIn.workloadDeadline: "1ms" (1ms) is shorter than the minimum 1s"#,
            r#"scaleIn.daemonSetDeadline: "x": "x" is not a duration like 90s, 1m30s or 500ms"#,
            r#"scaleIn.volumeDetachDeadline: "-1s": "-1s" is negative"#,
            r#"scaleIn.evictionRetryInterval: "1ms" (1ms) is shorter than the minimum 100ms"#,
            r#"scaleIn.lifecyclePollInterval: "10ms" (10ms) is shorter than the minimum 1s"#,
            r#"scaleIn.leaseDuration: "1s" (1s) is shorter than the minimum 2s"#,
            r#"scaleIn.nodeCriticalDaemonSets: "=": "=" is not a label key=value"#,
            r#"refreshWait: 10s must be shorter than caCallTimeout 5s (CA's grpc_timeout): CA would give up on Refresh and fail its loop"#,
            r#"scaleIn.maxConcurrentDrains: 0 must be between 1 and 10000"#,
            r#"scaleIn.sharedPodWatchFrom: 20000 must be between 0 (never) and 10000"#,
            r#"scaleIn.apiQps: -1 must be a positive number"#,
            r#"scaleIn.apiBurst: 0 must be at least 1"#,
            r#"scaleIn.leaseName: "" must be 1 to 253 characters"#,
            r#"scaleIn.hookName: "" must be 1 to 255 characters"#,
            r#"--nodes[0]: "1:2" is not min:max:name"#,
            r#"--nodes[1]: "x:2:a": min "x" is not a whole number"#,
            r#"nodeGroups[0]: minSize 5 is greater than maxSize 2 for group a"#,
            r#"nodeGroups[1]: group a is listed twice"#,
            r#"nodeGroups[2].name: must not be empty"#,
            r#"nodeGroups[3].minSize: -3 must not be negative"#,
            r#"nodeGroups[3].maxSize: -1 must not be negative"#,
            r#"--nodes[2]: group a is listed twice"#,
            r#"autoDiscovery[0].tags: tag term "=x" has an empty key"#,
            r#"autoDiscovery[1].tags: empty tag term in "k,""#,
            r#"--node-group-auto-discovery[0]: "mig:x": only the asg: discoverer is supported (asg:tag=...)"#,
            r#"--node-group-auto-discovery[1]: "asg:x": expected asg:tag=<key>[=<value>],..."#,
            r#"--node-group-auto-discovery[2]: "asg:tag=": empty tag term in """#,
            r#"templates.a.taints[0]: "k=v:Sometimes": effect "Sometimes" is not NoSchedule, PreferNoSchedule or NoExecute"#,
            r#"templates.a.taints[1]: "=v:NoSchedule": the taint key is empty"#,
            r#"templates.a.taints[2]: "x" is not key=value:Effect"#,
            r#"templates.a.maxPods: 0 must be between 1 and 1000"#,
            r#"templates.b.maxPods: 2000 must be between 1 and 1000"#,
            r#"templates.b.vmMemoryOverheadPercent: 75 must be a percent between 0 and 50 (7.5 means 7.5 %; Karpenter's fraction 0.075 is 7.5 here)"#,
            r#"templates.c.vmMemoryOverheadPercent: -1 must be a percent between 0 and 50 (7.5 means 7.5 %; Karpenter's fraction 0.075 is 7.5 here)"#,
            r#"interruption.waitTime: "30s" (30s) must be between 0ns and 20s"#,
            r#"interruption.daemonSetShare: "100h" (360000s) must be between 0ns and 110s"#,
            r#"interruption.safetyNetPollInterval: "1s" (1s) must be between 15s and 3600s"#,
            r#"interruption.queueUrl: "sqs://x" is not an SQS queue URL (https://sqs.<region>.amazonaws.com/<account>/<name>)"#,
            r#"interruption.batchSize: 11 must be between 1 and 10 (SQS's limit)"#,
            r#"interruption.concurrency: 0 must be between 1 and 100"#,
            r#"interruption.maxReceives: 0 must be at least 1"#,
            r#"interruption.queueUrl: queue mode drains nodes; it needs scaleIn.enabled: true"#,
        ]
    );
}
